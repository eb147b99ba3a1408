// CUDA kernels (see kernels.h).

#include "kernels/cuda/kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <mutex>

namespace ptc::kernels::cuda {

namespace {
constexpr int kThreads = 256;
cudaStream_t S(void *stream) { return static_cast<cudaStream_t>(stream); }
unsigned blocksFor(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

struct BroadcastShape {
  int rank;
  int64_t out[8], aStride[8], bStride[8];
};

template <typename Op>
__global__ void binaryKernel(const float *a, const float *b, float *out, int64_t n,
                             BroadcastShape s, Op op) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n)
    return;
  int64_t rest = i, ai = 0, bi = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t c = rest % s.out[d];
    rest /= s.out[d];
    ai += c * s.aStride[d];
    bi += c * s.bStride[d];
  }
  out[i] = op(a[ai], b[bi]);
}

struct AddOp { __device__ float operator()(float x, float y) const { return x + y; } };
struct SubOp { __device__ float operator()(float x, float y) const { return x - y; } };
struct MulOp { __device__ float operator()(float x, float y) const { return x * y; } };
struct DivOp { __device__ float operator()(float x, float y) const { return x / y; } };

__global__ void scaleKernel(const float *in, float *out, int64_t n, float f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = in[i] * f;
}

__global__ void geluKernel(const float *in, float *out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = 0.5f * in[i] * (1.0f + erff(in[i] * 0.70710678118654752f));
}

__global__ void geluGradKernel(const float *x, const float *g, float *out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n)
    return;
  float v = x[i];
  float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
  float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
  out[i] = g[i] * (cdf + v * pdf);
}

__global__ void reluKernel(const float *in, float *out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

struct SumOp {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct MaxOp {
  __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};

/// Block-wide reduction of one float per thread (blockDim.x a multiple of 32,
/// <= 1024); every thread gets the result.
template <typename Op> __device__ float blockReduce(float v, float identity, Op op) {
  __shared__ float partial[32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1)
    v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0)
    partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[lane] : identity;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1)
      v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  if (threadIdx.x == 0)
    total = v;
  __syncthreads();
  return total;
}
__device__ float blockSum(float v) { return blockReduce(v, 0.0f, SumOp{}); }
__device__ float blockMax(float v) { return blockReduce(v, -INFINITY, MaxOp{}); }

/// Block-wide max of a row and the sum of exp(x - max) over it (softmax
/// normalizer); every thread gets both.
__device__ float rowExpSum(const float *row, int64_t cols, float &max) {
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = fmaxf(m, row[c]);
  max = blockMax(m);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += expf(row[c] - max);
  return blockSum(s);
}

/// One block per row.
__global__ void layerNormKernel(const float *x, const float *w, const float *b, float *out,
                                int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += row[c];
  float mean = blockSum(s) / static_cast<float>(cols);
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    q += (row[c] - mean) * (row[c] - mean);
  float rstd = rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = (row[c] - mean) * rstd * w[c] + b[c];
}

__global__ void softmaxKernel(const float *x, float *out, int64_t cols) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float m;
  float inv = 1.0f / rowExpSum(row, cols, m);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = expf(row[c] - m) * inv;
}

/// One block per row: adds this row's loss / rows into *loss.
__global__ void crossEntropyKernel(const float *logits, const int32_t *targets, int64_t rows,
                                   int64_t classes, float *loss, int *bad) {
  const float *row = logits + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  float m;
  float s = rowExpSum(row, classes, m);
  if (threadIdx.x == 0) {
    if (t < 0 || t >= classes) {
      *bad = 1;
      return;
    }
    atomicAdd(loss, (logf(s) + m - row[t]) / static_cast<float>(rows));
  }
}

__global__ void crossEntropyGradKernel(const float *logits, const int32_t *targets, const float *g,
                                       int64_t rows, int64_t classes, float *out) {
  const float *row = logits + blockIdx.x * classes;
  float *o = out + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  float m;
  float s = rowExpSum(row, classes, m);
  float scale = *g / static_cast<float>(rows), inv = scale / s;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    o[c] = expf(row[c] - m) * inv - (c == t ? scale : 0.0f);
}

__global__ void embeddingKernel(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                                int64_t n, float *out) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim)
    return;
  int64_t r = ids[i / dim];
  out[i] = r >= 0 && r < rows ? table[r * dim + i % dim] : 0.0f;
}

/// One thread per (batch x head, query row): online softmax over the keys up
/// to the row (no seq x seq buffer); dim <= 256.
__global__ void causalAttentionKernel(const float *q, const float *k, const float *v, float *out,
                                      int64_t bh, int64_t seq, int64_t dim, float scale) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= bh * seq)
    return;
  int64_t head = i / seq, row = i % seq;
  const float *qi = q + i * dim;
  const float *kh = k + head * seq * dim, *vh = v + head * seq * dim;
  float acc[256];
  for (int64_t d = 0; d < dim; ++d)
    acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j <= row; ++j) {
    float s = 0.0f;
    for (int64_t d = 0; d < dim; ++d)
      s += qi[d] * kh[j * dim + d];
    s *= scale;
    float mNew = fmaxf(m, s), correction = expf(m - mNew), p = expf(s - mNew);
    l = l * correction + p;
    for (int64_t d = 0; d < dim; ++d)
      acc[d] = acc[d] * correction + p * vh[j * dim + d];
    m = mNew;
  }
  for (int64_t d = 0; d < dim; ++d)
    out[i * dim + d] = acc[d] / l;
}

__global__ void adamwKernel(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                            float b1, float b2, float eps, float wd, float c1, float c2) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n)
    return;
  float x = p[i] * (1.0f - lr * wd);
  float mi = b1 * m[i] + (1.0f - b1) * g[i];
  float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
  m[i] = mi;
  v[i] = vi;
  p[i] = x - lr / c1 * mi / (sqrtf(vi) / sqrtf(c2) + eps);
}

__device__ float loadFloat(const void *in, int type, int64_t i) {
  if (type == 1)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(in)[i]);
  if (type == 2)
    return __half2float(static_cast<const __half *>(in)[i]);
  return static_cast<const float *>(in)[i];
}

__global__ void convertKernel(const void *in, int from, void *out, int to, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n)
    return;
  float x = loadFloat(in, from, i);
  if (to == 1)
    static_cast<__nv_bfloat16 *>(out)[i] = __float2bfloat16_rn(x);
  else if (to == 2)
    static_cast<__half *>(out)[i] = __float2half_rn(x);
  else
    static_cast<float *>(out)[i] = x;
}

cublasHandle_t handle() {
  static cublasHandle_t h = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { cublasCreate(&h); });
  return h;
}
} // namespace

bool gpuAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Status check(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    return error(StatusCode::kInternal, what, ": CUDA error ", cudaGetErrorString(e));
  return Status::ok();
}

void *deviceAlloc(int64_t bytes) {
  void *p = nullptr;
  if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess)
    return nullptr;
  return p;
}
void deviceFree(void *p) { cudaFree(p); }
void copyToDevice(void *dst, const void *src, int64_t bytes) {
  cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice);
}
void copyToHost(void *dst, const void *src, int64_t bytes) {
  cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost);
}
void synchronize() { cudaDeviceSynchronize(); }

void binary(Binary kind, const float *a, const std::vector<int64_t> &as, const float *b,
            const std::vector<int64_t> &bs, float *out, const std::vector<int64_t> &os,
            void *stream) {
  BroadcastShape s{};
  s.rank = static_cast<int>(os.size());
  int64_t n = 1;
  auto strides = [&](const std::vector<int64_t> &shape, int64_t *st) {
    int64_t acc = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
      int sd = d - (s.rank - static_cast<int>(shape.size()));
      int64_t size = sd >= 0 ? shape[static_cast<size_t>(sd)] : 1;
      st[d] = size == 1 ? 0 : acc;
      acc *= size;
    }
  };
  for (int d = 0; d < s.rank; ++d) {
    s.out[d] = os[static_cast<size_t>(d)];
    n *= os[static_cast<size_t>(d)];
  }
  strides(as, s.aStride);
  strides(bs, s.bStride);
  switch (kind) {
  case Binary::Add:
    binaryKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(a, b, out, n, s, AddOp{});
    break;
  case Binary::Sub:
    binaryKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(a, b, out, n, s, SubOp{});
    break;
  case Binary::Mul:
    binaryKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(a, b, out, n, s, MulOp{});
    break;
  case Binary::Div:
    binaryKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(a, b, out, n, s, DivOp{});
    break;
  }
}

void scale(const float *in, float *out, int64_t n, float factor, void *stream) {
  scaleKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(in, out, n, factor);
}
void gelu(const float *in, float *out, int64_t n, void *stream) {
  geluKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(in, out, n);
}
void geluGrad(const float *x, const float *g, float *out, int64_t n, void *stream) {
  geluGradKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(x, g, out, n);
}
void relu(const float *in, float *out, int64_t n, void *stream) {
  reluKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(in, out, n);
}
void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps, void *stream) {
  layerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, b, out, cols, eps);
}
void softmaxLastAxis(const float *x, float *out, int64_t rows, int64_t cols, void *stream) {
  softmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, out, cols);
}
void crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, int *badTarget, void *stream) {
  cudaMemsetAsync(loss, 0, sizeof(float), S(stream));
  crossEntropyKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      logits, targets, rows, classes, loss, badTarget);
}
void crossEntropyGrad(const float *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, float *out, void *stream) {
  crossEntropyGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      logits, targets, g, rows, classes, out);
}
void embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n,
               float *out, void *stream) {
  embeddingKernel<<<blocksFor(n * dim), kThreads, 0, S(stream)>>>(table, rows, dim, ids, n, out);
}
Status causalAttention(const float *q, const float *k, const float *v, float *out, int64_t bh,
                       int64_t seq, int64_t dim, float scale, void *stream) {
  if (dim > 256)
    return error(StatusCode::kUnimplemented, "causal attention with head dimension ", dim,
                 " (at most 256)");
  causalAttentionKernel<<<blocksFor(bh * seq), kThreads, 0, S(stream)>>>(q, k, v, out, bh, seq,
                                                                          dim, scale);
  return Status::ok();
}
void adamwUpdate(float *param, const float *grad, float *m, float *v, float step,
                 const AdamW &hp, int64_t n, void *stream) {
  float c1 = 1.0f - std::pow(hp.beta1, step), c2 = 1.0f - std::pow(hp.beta2, step);
  adamwKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(param, grad, m, v, n, hp.lr, hp.beta1,
                                                         hp.beta2, hp.eps, hp.weightDecay, c1, c2);
}
void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream) {
  convertKernel<<<blocksFor(n), kThreads, 0, S(stream)>>>(in, static_cast<int>(from), out,
                                                          static_cast<int>(to), n);
}

Status matmul(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
              int64_t k, bool transA, bool transB, int64_t strideA, int64_t strideB,
              int64_t strideC, void *stream) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasHandle_t h = handle();
  cublasSetStream(h, S(stream));
  const float one = 1.0f, zero = 0.0f;
  cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ldb = static_cast<int>(transB ? k : n), lda = static_cast<int>(transA ? m : k);
  cublasStatus_t st = cublasSgemmStridedBatched(
      h, opB, opA, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b, ldb,
      strideB, a, lda, strideA, &zero, c, static_cast<int>(n), strideC, static_cast<int>(batch));
  if (st != CUBLAS_STATUS_SUCCESS)
    return error(StatusCode::kInternal, "cublasSgemmStridedBatched failed with status ",
                 static_cast<int>(st));
  return Status::ok();
}

} // namespace ptc::kernels::cuda
