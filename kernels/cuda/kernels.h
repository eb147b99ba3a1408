// CUDA kernels: the GPU counterparts of kernels/cpu, one entry point per op
// kind, on device pointers, enqueued on a CUDA stream (passed as void* so that
// callers need no CUDA headers). Math in f32 (matmuls: cuBLAS, f32 or bf16
// inputs with f32 accumulation). Kernels that check ids (embedding, targets,
// expert indices) record the first bad id in `err` (a device ErrorRecord) instead of
// failing: the device reports it at its next synchronize().
//
// Used by runtime/device/cuda_device.cc; checked against the CPU device by
// test/unit/DeviceConformanceTest.cpp on a machine with a GPU.
#ifndef PTC_KERNELS_CUDA_KERNELS_H
#define PTC_KERNELS_CUDA_KERNELS_H

#include "kernels/common/elementwise.h"
#include "kernels/common/types.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ptc::kernels::cuda {

using kernels::FloatType;
using kernels::Shape;
using kernels::UnaryFunction;

/// What a kernel found wrong, written once (the first error wins).
struct ErrorRecord {
  int kind;       // 0: none; ErrorKind otherwise
  int64_t id;     // the bad value
  int64_t where;  // its position
  int64_t limit;  // the valid range is [0, limit)
};
enum ErrorKind { kNoError = 0, kBadEmbeddingId = 1, kBadTarget = 2, kBadExpert = 3 };
/// "embedding index 70000 at position 12 is outside [0, 65536)".
std::string describe(const ErrorRecord &e);

enum class Binary { Add, Sub, Mul, Div };
enum class Reduce { Sum, Mean, Max };

// ---- Elementwise ------------------------------------------------------------
/// out = a (op) b with numpy broadcasting of a and b to out's shape (rank <= 8).
void binary(Binary op, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os, void *stream);
void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os, void *stream);
void scale(const float *in, float *out, int64_t n, float factor, void *stream);
/// An activation (kernels/common/elementwise.h) and its gradient.
void unary(UnaryFunction fn, const float *in, float *out, int64_t n, void *stream);
void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n,
               void *stream);
void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream);

// ---- Normalization, softmax, attention --------------------------------------
void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps, void *stream);
/// `rowStats`: scratch for 2 x rows floats.
void layerNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                   float *db, int64_t rows, int64_t cols, float eps, float *rowStats,
                   void *stream);
void softmax(const float *x, float *out, const Shape &shape, int64_t axis, void *stream);
void softmaxGrad(const float *y, const float *g, float *out, const Shape &shape, int64_t axis,
                 void *stream);
void rmsNorm(const float *x, const float *w, float *out, int64_t rows, int64_t cols, float eps,
             void *stream);
/// `rowStats`: scratch for rows floats.
void rmsNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                 int64_t rows, int64_t cols, float eps, float *rowStats, void *stream);
/// Rotary embedding of bh x seq rows of dim (rotate_half convention).
void rotary(const float *x, float *out, int64_t bh, int64_t seq, int64_t dim, double theta,
            bool inverse, void *stream);
/// q, out: [batch, heads, seq, dim]; k, v: [batch, kvHeads, seq, dim] (kvHeads
/// dividing heads: grouped-query attention); causal, flash-attention style:
/// one pass of online softmax per query, no seq x seq buffer. dim <= 256.
void causalAttention(const float *q, const float *k, const float *v, float *out, int64_t batch,
                     int64_t heads, int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                     void *stream);
/// The backward pass, recomputing the probabilities (no seq x seq buffer):
/// dq per query row, then dk, dv per key row over the query heads it serves
/// (no atomics). `rowStats`: scratch for 3 x batch x heads x seq floats.
void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, int64_t batch, int64_t heads,
                         int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                         float *rowStats, void *stream);
constexpr int64_t kMaxAttentionDim = 256;

// ---- Embedding and cross-entropy ---------------------------------------------
void embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n,
               float *out, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
               void *stream);
void embeddingGrad(const int32_t *ids, int64_t n, const float *g, float *dtable, int64_t rows,
                   int64_t dim, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
                   void *stream);
void crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, ErrorRecord *err, void *stream);
void crossEntropyGrad(const float *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, float *out, ErrorRecord *err, void *stream);
void rowMax(const float *logits, int64_t rows, int64_t classes, float *out, void *stream);
void rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max, float *out,
               void *stream);
void targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                 int64_t offset, int64_t total, float *out, ErrorRecord *err, void *stream);
void lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                   float *loss, void *stream);
void vocabParallelGrad(const float *logits, const int32_t *targets, const float *g,
                       const float *max, const float *sumExp, int64_t rows, int64_t classes,
                       int64_t offset, int64_t total, float *out, ErrorRecord *err,
                       void *stream);

// ---- Layout -------------------------------------------------------------------
void transpose(const void *in, const Shape &is, void *out, const Shape &perm, int64_t elemBytes,
               void *stream);
void copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
             const Shape &dstShape, const Shape &dstOffsets, const Shape &box, int64_t elemBytes,
             void *stream);
void reduce(Reduce op, const float *in, const Shape &is, const Shape &axes, float *out,
            void *stream);
void reduceMaxGrad(const float *in, const Shape &is, const Shape &axes, const float *g,
                   float *out, void *stream);

// ---- Mixture of experts -------------------------------------------------------
void topKGate(const float *logits, const float *bias, int64_t tokens, int64_t experts, int64_t k,
              bool normalize, float *weights, int32_t *indices, void *stream);
void topKGateGrad(const float *logits, const int32_t *indices, const float *gw, int64_t tokens,
                  int64_t experts, int64_t k, bool normalize, float *out, ErrorRecord *err,
                  void *stream);
/// Slot of every assignment in its expert's [groups * capacity] rows
/// (group * capacity + s; -1: dropped), choice-major within each group as
/// the CPU assigns them; `slots` holds groups * tokens * k ints.
void assignSlots(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                 int64_t experts, int64_t capacity, int32_t *slots, ErrorRecord *err,
                 void *stream);
/// Per group, the fraction of its tokens * k assignments routed to each
/// expert: out [groups, experts].
void expertLoad(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                int64_t experts, float *out, ErrorRecord *err, void *stream);
void moeDispatch(const float *x, const int32_t *indices, const int32_t *slots, int64_t tokens,
                 int64_t k, int64_t dim, int64_t experts, int64_t capacity, float *out,
                 void *stream);
void moeDispatchGrad(const float *g, const int32_t *indices, const int32_t *slots,
                     int64_t tokens, int64_t k, int64_t dim, int64_t capacity, float *out,
                     void *stream);
void moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                const int32_t *slots, int64_t tokens, int64_t k, int64_t dim, int64_t capacity,
                float *out, void *stream);
void moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                    const int32_t *slots, const float *g, int64_t tokens, int64_t k, int64_t dim,
                    int64_t experts, int64_t capacity, float *dExpertOut, float *dWeights,
                    void *stream);

// ---- Optimizer and gradient norms ---------------------------------------------
struct AdamW {
  float lr, beta1, beta2, eps, weightDecay;
};
/// `step` and `skip` (nullable) are device scalars.
void adamwUpdate(const float *param, const float *grad, const float *m, const float *v,
                 const float *step, const AdamW &hp, int64_t n, const float *skip,
                 float *outParam, float *outM, float *outV, void *stream);
/// Multi-tensor AdamW: `table` (device memory) holds `count` descriptors;
/// one launch covers every element of every tensor.
struct AdamWTensor {
  const float *param, *grad, *m, *v;
  float *outParam, *outM, *outV;
  int64_t n, offset; // offset: elements before this tensor (prefix sum)
};
void adamwUpdateMany(const AdamWTensor *table, int count, int64_t total, const float *step,
                     const AdamW &hp, const float *skip, void *stream);
void sgdUpdate(const float *param, const float *grad, const float *buf, float lr,
               float momentum, float weightDecay, int64_t n, const float *skip, float *outParam,
               float *outBuf, void *stream);
/// *out = sum of squares over all tensors (device scalar).
void sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                  float *out, void *stream);
void clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                const std::vector<float *> &outs, float maxNorm, const float *sumSquares,
                float *norm, void *stream);
void unscale(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
             const std::vector<float *> &outs, const float *scale, float *found, void *stream);

// ---- Matmul (cuBLAS) ------------------------------------------------------------
/// out[..., m, n] = op(a)[..., m, k] op(b)[..., k, n]; b rank 2 (shared) or
/// batched like a. `type`: the element type of a, b and out (f32 or bf16;
/// accumulation in f32). `allowTf32`: f32 inputs may use TF32 tensor cores.
/// Returns a cuBLAS status (0: success).
int matmul(void *cublasHandle, const void *a, const Shape &as, const void *b, const Shape &bs,
           void *out, bool transA, bool transB, FloatType type, bool allowTf32, void *stream);

} // namespace ptc::kernels::cuda

#endif // PTC_KERNELS_CUDA_KERNELS_H
