// What the CUDA kernel files share (not part of kernels.h's interface):
// launch sizes, shapes and strides passed by value, grid-stride loops, error
// records, block- and warp-wide reductions. The kernels are simple, correct
// ones first: one thread per output element or per row, block reductions
// where a row is long; the matmuls (most of the FLOPs) go to cuBLAS. One file
// per op family (elementwise.cu, normalization.cu, attention.cu, ...), as
// kernels/cpu/.
#ifndef PTC_KERNELS_CUDA_INTERNAL_CUH
#define PTC_KERNELS_CUDA_INTERNAL_CUH

#include "kernels/cuda/kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace ptc::kernels::cuda {
namespace {
// ---- Kernel entries: the call's launch context ------------------------------------
inline const LaunchContext &context(const KernelCall &c) {
  return *static_cast<const LaunchContext *>(c.backend);
}
inline void *streamOf(const KernelCall &c) { return context(c).stream; }
/// Scratch device memory for this call, or null.
inline void *scratch(const KernelCall &c, int64_t bytes) {
  const LaunchContext &ctx = context(c);
  return ctx.scratch(ctx.owner, bytes);
}
inline KernelResult scratchFailure(const KernelCall &c, int64_t bytes) {
  return KernelResult::error("cannot allocate ", bytes, " bytes of scratch for ",
                             opKindName(c.op));
}
/// The shape kernels take shapes of rank <= 8 (Dims).
inline KernelResult rankAtMost8(const Shape &s, const char *what) {
  if (s.size() > 8)
    return KernelResult::error(what, " on a rank-", s.size(),
                               " tensor (the CUDA kernels take rank <= 8)");
  return KernelResult::ok();
}
inline KernelResult attentionShapeSupported(const TensorView &q) {
  if (q.rank() != 4 || q.dim(3) > kMaxAttentionDim)
    return KernelResult::error("causal attention with head dimension ",
                               q.rank() == 0 ? 0 : q.dim(-1), " (the CUDA kernel takes at most ",
                               kMaxAttentionDim, ")");
  return KernelResult::ok();
}

constexpr int kThreads = 256;
constexpr int kMaxRank = 8;
inline cudaStream_t S(void *stream) { return static_cast<cudaStream_t>(stream); }
inline unsigned blocksFor(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>((n + kThreads - 1) / kThreads, 1));
}
inline int64_t product(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// Sizes and strides of up to 8 dimensions, passed to kernels by value.
struct Dims {
  int rank = 0;
  int64_t size[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};
};
inline Dims rowMajor(const Shape &s) {
  Dims d;
  d.rank = static_cast<int>(s.size());
  int64_t acc = 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    d.size[i] = s[static_cast<size_t>(i)];
    d.stride[i] = acc;
    acc *= s[static_cast<size_t>(i)];
  }
  return d;
}

#define PTC_GRID_LOOP(i, n)                                                                       \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);           \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__device__ inline void recordError(ErrorRecord *err, int kind, int64_t id, int64_t where, int64_t limit) {
  if (atomicCAS(&err->kind, 0, -1) == 0) {
    err->id = id;
    err->where = where;
    err->limit = limit;
    __threadfence();
    atomicExch(&err->kind, kind);
  }
}

/// A grid for grid-stride loops: enough blocks to fill the GPU, not more.
inline unsigned gridFor(int64_t n) { return std::min<unsigned>(blocksFor(n), 4096u); }

/// Blocks for one warp per row (4 warps a block), capped for grid-stride loops.
inline unsigned warpBlocksFor(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((rows + 3) / 4, 1), 65536));
}

// ---- Reductions inside a block -----------------------------------------------------
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
/// Element i of f32, bf16 or f16 storage (`type`: a FloatType's value) as
/// f32, and an f32 stored there (narrow types rounded to nearest even).
__device__ inline float loadFloat(const void *p, int type, int64_t i) {
  if (type == 1)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
  if (type == 2)
    return __half2float(static_cast<const __half *>(p)[i]);
  return static_cast<const float *>(p)[i];
}
__device__ inline void storeFloat(void *p, int type, int64_t i, float x) {
  if (type == 1)
    static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x);
  else if (type == 2)
    static_cast<__half *>(p)[i] = __float2half_rn(x);
  else
    static_cast<float *>(p)[i] = x;
}

// ---- Element types: kernels templated on the stored type ---------------------------
/// f32 math on f32, bf16 or f16 storage (narrow results rounded to nearest even).
__device__ inline float toFloat(float x) { return x; }
__device__ inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float toFloat(__half x) { return __half2float(x); }
template <typename T> __device__ inline T fromFloat(float x);
template <> __device__ inline float fromFloat<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ inline __half fromFloat<__half>(float x) { return __float2half_rn(x); }

/// Whether every view of the call (inputs and outputs) has one float type,
/// the inputs from `idsFrom` on aside (i32 ids or positions): the entries
/// templated on it take f32, bf16 and f16 natively.
inline bool oneFloatType(const KernelCall &c, size_t idsFrom) {
  const DType t = c.numInputs ? c.input(0).dtype : c.output(0).dtype;
  if (t == DType::I32)
    return false;
  for (size_t i = 0; i < c.numInputs; ++i)
    if (i < idsFrom ? c.input(i).dtype != t : c.input(i).dtype != DType::I32)
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.output(i).dtype != t)
      return false;
  return true;
}
inline bool oneFloatType(const KernelCall &c) { return oneFloatType(c, c.numInputs); }

/// Calls `f(T{})` with T the C++ type of `t` (float, __nv_bfloat16, __half).
template <typename F> auto withFloatType(DType t, F &&f) {
  if (t == DType::BF16)
    return f(__nv_bfloat16{});
  if (t == DType::F16)
    return f(__half{});
  return f(float{});
}

/// The views of a typed entry's call as T (its one float type).
template <typename T> const T *inputAs(const KernelCall &c, size_t i) {
  return static_cast<const T *>(c.input(i).data);
}
template <typename T> T *outputAs(const KernelCall &c, size_t i) {
  return static_cast<T *>(c.output(i).data);
}
/// An elementwise typed entry: `launch(T{}, n)` with the call's type and its
/// first input's element count, unless that is zero.
template <typename F> KernelResult launchTyped(const KernelCall &c, F &&launch) {
  const int64_t n = c.input(0).elements;
  if (n > 0)
    withFloatType(c.input(0).dtype, [&](auto tag) {
      launch(tag, n);
      return 0;
    });
  return KernelResult::ok();
}

__device__ inline float blockSum(float v) { return blockReduce(v, 0.0f, SumOp{}); }

/// *out = scale * sum of x[0, n): one block (launch with 1024 threads), a
/// fixed summation order (partial sums, row losses: no atomics).
__global__ void orderedSumKernel(const float *x, int64_t n, float scale, float *out) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s += x[i];
  s = blockSum(s);
  if (threadIdx.x == 0)
    *out = s * scale;
}
__device__ inline float blockMax(float v) { return blockReduce(v, -INFINITY, MaxOp{}); }

/// Block-wide max of a row and the sum of exp(x - max) over it.
template <typename T>
__device__ inline float rowExpSum(const T *row, int64_t cols, float &max) {
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = fmaxf(m, toFloat(row[c]));
  max = blockMax(m);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += expf(toFloat(row[c]) - max);
  return blockSum(s);
}

} // namespace

// ---- Reductions the layout family defines and others use ----------------------------
/// A reduction of f32 `in` over `axes` (one thread per result).
void reduce(ReduceOp op, const float *in, const Shape &is, const Shape &axes, float *out,
            void *stream);
/// The same on f32, bf16 or f16 storage (`type`; f32 sums, one rounding).
void reduce(ReduceOp op, const void *in, DType type, const Shape &is, const Shape &axes,
            void *out, void *stream);
/// `in` viewed as [rows, elements / rows]: its column sums times `scale`
/// into `out` of its type (f32, bf16, f16), in two deterministic passes (a
/// bias gradient: ReduceSum over leading axes, a Matmul's second output).
KernelResult columnSums(const KernelCall &c, const TensorView &in, int64_t rows,
                        const TensorView &out, float scale = 1.0f);

} // namespace ptc::kernels::cuda

#endif // PTC_KERNELS_CUDA_INTERNAL_CUH
