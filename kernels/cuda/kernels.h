// CUDA kernels: the GPU counterparts of kernels/cpu, one entry point per op
// kind, on device pointers and a CUDA stream (passed as void* so that callers
// need no CUDA headers). Math in f32. Checked against the CPU kernels by
// test/unit/CudaKernelsTest.cpp on a machine with a GPU.
//
// Status: a first set (elementwise, LayerNorm, softmax, cross-entropy,
// embedding, causal attention, AdamW, conversions, cuBLAS matmuls); the
// executor does not call them yet (issue 6).
#ifndef PTC_KERNELS_CUDA_KERNELS_H
#define PTC_KERNELS_CUDA_KERNELS_H

#include "runtime/base/status.h"

#include <cstdint>
#include <vector>

namespace ptc::kernels::cuda {

/// Whether this process sees a GPU.
bool gpuAvailable();
/// The last CUDA error, as a Status naming `what`.
Status check(const char *what);

void *deviceAlloc(int64_t bytes);
void deviceFree(void *p);
void copyToDevice(void *dst, const void *src, int64_t bytes);
void copyToHost(void *dst, const void *src, int64_t bytes);
void synchronize();

/// out = a (op) b with numpy broadcasting of a and b to out's shape (rank <= 8).
enum class Binary { Add, Sub, Mul, Div };
void binary(Binary kind, const float *a, const std::vector<int64_t> &as, const float *b,
            const std::vector<int64_t> &bs, float *out, const std::vector<int64_t> &os,
            void *stream);
void scale(const float *in, float *out, int64_t n, float factor, void *stream);
void gelu(const float *in, float *out, int64_t n, void *stream);
void geluGrad(const float *x, const float *g, float *out, int64_t n, void *stream);
void relu(const float *in, float *out, int64_t n, void *stream);

/// Rows of `cols` elements.
void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps, void *stream);
void softmaxLastAxis(const float *x, float *out, int64_t rows, int64_t cols, void *stream);
/// Mean cross-entropy into *loss (device scalar); ids outside [0, classes) count as errors in
/// *badTarget (device int, set to 1).
void crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, int *badTarget, void *stream);
void crossEntropyGrad(const float *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, float *out, void *stream);
void embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n,
               float *out, void *stream);
/// q, k, v, out: [batch, heads, seq, dim], causal, no seq x seq buffer;
/// head dimensions up to 256.
Status causalAttention(const float *q, const float *k, const float *v, float *out, int64_t bh,
                       int64_t seq, int64_t dim, float scale, void *stream);

struct AdamW {
  float lr, beta1, beta2, eps, weightDecay;
};
void adamwUpdate(float *param, const float *grad, float *m, float *v, float step,
                 const AdamW &hp, int64_t n, void *stream);

enum class FloatType { F32, BF16, F16 };
void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream);

/// cuBLAS: for each of `batch` problems, C[M,N] = op(A) op(B) in row-major,
/// op(A) = A [M,K] or A^T (A stored [K,M]), op(B) = B [K,N] or B^T (B stored
/// [N,K]); a stride of 0 shares that operand over the batch.
Status matmul(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
              int64_t k, bool transA, bool transB, int64_t strideA, int64_t strideB,
              int64_t strideC, void *stream);

} // namespace ptc::kernels::cuda

#endif // PTC_KERNELS_CUDA_KERNELS_H
