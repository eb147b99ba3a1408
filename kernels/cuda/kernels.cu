// CUDA kernels (see kernels.h). Simple, correct kernels first: one thread per
// output element or per row, block reductions where a row is long; the matmuls
// (most of the FLOPs) go to cuBLAS.

#include "kernels/cuda/kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace ptc::kernels::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kMaxRank = 8;
cudaStream_t S(void *stream) { return static_cast<cudaStream_t>(stream); }
unsigned blocksFor(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>((n + kThreads - 1) / kThreads, 1));
}
int64_t product(const Shape &s) {
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
Dims rowMajor(const Shape &s) {
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

__device__ void recordError(ErrorRecord *err, int kind, int64_t id, int64_t where, int64_t limit) {
  if (atomicCAS(&err->kind, 0, -1) == 0) {
    err->id = id;
    err->where = where;
    err->limit = limit;
    __threadfence();
    atomicExch(&err->kind, kind);
  }
}

// ---- Elementwise ---------------------------------------------------------------
struct BroadcastShape {
  int rank;
  int64_t out[kMaxRank], aStride[kMaxRank], bStride[kMaxRank];
};

template <typename Op>
__global__ void binaryKernel(const float *a, const float *b, float *out, int64_t n,
                             BroadcastShape s, Op op) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, ai = 0, bi = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      int64_t c = rest % s.out[d];
      rest /= s.out[d];
      ai += c * s.aStride[d];
      bi += c * s.bStride[d];
    }
    out[i] = op(a[ai], b[bi]);
  }
}

struct AddOp { __device__ float operator()(float x, float y) const { return x + y; } };
struct SubOp { __device__ float operator()(float x, float y) const { return x - y; } };
struct MulOp { __device__ float operator()(float x, float y) const { return x * y; } };
struct DivOp { __device__ float operator()(float x, float y) const { return x / y; } };
struct FirstOp { __device__ float operator()(float x, float) const { return x; } };

BroadcastShape broadcastShape(const Shape &as, const Shape &bs, const Shape &os) {
  BroadcastShape s{};
  s.rank = static_cast<int>(os.size());
  auto strides = [&](const Shape &shape, int64_t *st) {
    int64_t acc = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
      int sd = d - (s.rank - static_cast<int>(shape.size()));
      int64_t size = sd >= 0 ? shape[static_cast<size_t>(sd)] : 1;
      st[d] = size == 1 ? 0 : acc;
      acc *= size;
    }
  };
  for (int d = 0; d < s.rank; ++d)
    s.out[d] = os[static_cast<size_t>(d)];
  strides(as, s.aStride);
  strides(bs, s.bStride);
  return s;
}

__device__ float normalCdf(float x) { return 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }

__global__ void scaleKernel(const float *in, float *out, int64_t n, float f) {
  PTC_GRID_LOOP(i, n) { out[i] = in[i] * f; }
}

// One case per entry of PTC_UNARY_FUNCTIONS (kernels/common/elementwise.h).
__device__ float activation(UnaryFunction fn, float x) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return x * normalCdf(x);
  case UnaryFunction::Relu:
    return x > 0.0f ? x : 0.0f;
  case UnaryFunction::Silu:
    return x / (1.0f + expf(-x));
  case UnaryFunction::Rsqrt:
    return rsqrtf(x);
  case UnaryFunction::Exp:
    return expf(x);
  case UnaryFunction::Log:
    return logf(x);
  case UnaryFunction::Sign:
    return static_cast<float>((x > 0.0f) - (x < 0.0f));
  }
  return 0.0f;
}

__device__ float activationGrad(UnaryFunction fn, float x, float g) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return g * (normalCdf(x) + x * 0.39894228040143268f * expf(-0.5f * x * x));
  case UnaryFunction::Relu:
    return x > 0.0f ? g : 0.0f;
  case UnaryFunction::Silu: {
    float s = 1.0f / (1.0f + expf(-x));
    return g * s * (1.0f + x * (1.0f - s));
  }
  case UnaryFunction::Rsqrt: {
    float r = rsqrtf(x);
    return -0.5f * g * r * r * r;
  }
  case UnaryFunction::Exp:
    return g * expf(x);
  case UnaryFunction::Log:
    return g / x;
  case UnaryFunction::Sign:
    return 0.0f;
  }
  return 0.0f;
}

__global__ void unaryKernel(UnaryFunction fn, const float *in, float *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = activation(fn, in[i]); }
}

__global__ void unaryGradKernel(UnaryFunction fn, const float *x, const float *g, float *out,
                                int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = activationGrad(fn, x[i], g[i]); }
}

__device__ float loadFloat(const void *in, int type, int64_t i) {
  if (type == 1)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(in)[i]);
  if (type == 2)
    return __half2float(static_cast<const __half *>(in)[i]);
  return static_cast<const float *>(in)[i];
}

__global__ void convertKernel(const void *in, int from, void *out, int to, int64_t n) {
  PTC_GRID_LOOP(i, n) {
    float x = loadFloat(in, from, i);
    if (to == 1)
      static_cast<__nv_bfloat16 *>(out)[i] = __float2bfloat16_rn(x);
    else if (to == 2)
      static_cast<__half *>(out)[i] = __float2half_rn(x);
    else
      static_cast<float *>(out)[i] = x;
  }
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
__device__ float blockSum(float v) { return blockReduce(v, 0.0f, SumOp{}); }
__device__ float blockMax(float v) { return blockReduce(v, -INFINITY, MaxOp{}); }

/// Block-wide max of a row and the sum of exp(x - max) over it.
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

// ---- LayerNorm -----------------------------------------------------------------
/// Mean and 1/sqrt(var + eps) of one row (two passes), for every thread of the block.
__device__ void rowStats(const float *row, int64_t cols, float eps, float &mean, float &rstd) {
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += row[c];
  mean = blockSum(s) / static_cast<float>(cols);
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    q += (row[c] - mean) * (row[c] - mean);
  rstd = rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
__global__ void layerNormKernel(const float *x, const float *w, const float *b, float *out,
                                int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = (row[c] - mean) * rstd * w[c] + b[c];
}

/// One block per row: dx = rstd (g w - mean(g w) - xhat mean(g w xhat)).
__global__ void layerNormGradRowKernel(const float *x, const float *w, const float *g, float *dx,
                                       int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  float sd = 0.0f, sdx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float d = gr[c] * w[c];
    sd += d;
    sdx += d * (row[c] - mean) * rstd;
  }
  float mD = blockSum(sd) / static_cast<float>(cols);
  float mDX = blockSum(sdx) / static_cast<float>(cols);
  float *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = rstd * (gr[c] * w[c] - mD - (row[c] - mean) * rstd * mDX);
}

/// Per row: mean and rstd into stats[2 * row + {0, 1}].
__global__ void layerNormStatsKernel(const float *x, int64_t cols, float eps, float *stats) {
  float mean, rstd;
  rowStats(x + blockIdx.x * cols, cols, eps, mean, rstd);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rstd;
  }
}

/// dw, db: blocks of 32 columns x 8 row groups, reduced in shared memory.
__global__ void layerNormGradColumnsKernel(const float *x, const float *g, const float *stats,
                                           float *dw, float *db, int64_t rows, int64_t cols) {
  __shared__ float sw[8][33], sb[8][33];
  int64_t c = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 8) {
      float xhat = (x[r * cols + c] - stats[2 * r]) * stats[2 * r + 1];
      aw += g[r * cols + c] * xhat;
      ab += g[r * cols + c];
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < 8; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    dw[c] = tw;
    db[c] = tb;
  }
}

// ---- RMSNorm and rotary embeddings ------------------------------------------------
/// 1/sqrt(mean(x^2) + eps) of one row, for every thread of the block.
__device__ float rowRstd(const float *row, int64_t cols, float eps) {
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    q += row[c] * row[c];
  return rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
__global__ void rmsNormKernel(const float *x, const float *w, float *out, int64_t cols,
                              float eps) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = row[c] * rstd * w[c];
}

/// One block per row: dx = rstd (g w - x rstd^2 mean(g w x)); rstd into stats[row].
__global__ void rmsNormGradRowKernel(const float *x, const float *w, const float *g, float *dx,
                                     float *stats, int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  float d = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    d += gr[c] * w[c] * row[c];
  float k = rstd * rstd * blockSum(d) / static_cast<float>(cols);
  float *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = rstd * (gr[c] * w[c] - row[c] * k);
  if (threadIdx.x == 0)
    stats[blockIdx.x] = rstd;
}

/// dw = sum over rows of g x rstd: blocks of 32 columns x 8 row groups.
__global__ void rmsNormGradColumnsKernel(const float *x, const float *g, const float *stats,
                                         float *dw, int64_t rows, int64_t cols) {
  __shared__ float sw[8][33];
  int64_t c = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 8)
      aw += g[r * cols + c] * x[r * cols + c] * stats[r];
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f;
    for (int y = 0; y < 8; ++y)
      tw += sw[y][threadIdx.x];
    dw[c] = tw;
  }
}

/// One thread per (head row, frequency) pair; angles in f32 as Hugging Face.
__global__ void rotaryKernel(const float *x, float *out, int64_t bh, int64_t seq, int64_t dim,
                             double theta, bool inverse) {
  int64_t half = dim / 2;
  PTC_GRID_LOOP(t, bh * seq * half) {
    int64_t i = t % half, rowIndex = t / half, p = rowIndex % seq;
    float invFreq = static_cast<float>(1.0 / pow(theta, static_cast<double>(2 * i) /
                                                            static_cast<double>(dim)));
    float angle = static_cast<float>(p) * invFreq;
    float c = cosf(angle), sn = inverse ? -sinf(angle) : sinf(angle);
    const float *xr = x + rowIndex * dim;
    float *yr = out + rowIndex * dim;
    float a = xr[i], b = xr[i + half];
    yr[i] = a * c - b * sn;
    yr[i + half] = b * c + a * sn;
  }
}

// ---- Softmax ---------------------------------------------------------------------
__global__ void softmaxLastKernel(const float *x, float *out, int64_t cols) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float m;
  float inv = 1.0f / rowExpSum(row, cols, m);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = expf(row[c] - m) * inv;
}

/// Softmax along a middle axis: one thread per (outer, inner) pair.
__global__ void softmaxStridedKernel(const float *x, float *out, int64_t outer, int64_t n,
                                     int64_t inner) {
  PTC_GRID_LOOP(t, outer * inner) {
    int64_t base = (t / inner) * n * inner + t % inner;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      m = fmaxf(m, x[base + j * inner]);
    for (int64_t j = 0; j < n; ++j)
      s += expf(x[base + j * inner] - m);
    for (int64_t j = 0; j < n; ++j)
      out[base + j * inner] = expf(x[base + j * inner] - m) / s;
  }
}

__global__ void softmaxGradLastKernel(const float *y, const float *g, float *out, int64_t cols) {
  const float *yr = y + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float d = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    d += yr[c] * gr[c];
  float dot = blockSum(d);
  float *o = out + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = yr[c] * (gr[c] - dot);
}

__global__ void softmaxGradStridedKernel(const float *y, const float *g, float *out,
                                         int64_t outer, int64_t n, int64_t inner) {
  PTC_GRID_LOOP(t, outer * inner) {
    int64_t base = (t / inner) * n * inner + t % inner;
    float dot = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      dot += y[base + j * inner] * g[base + j * inner];
    for (int64_t j = 0; j < n; ++j)
      out[base + j * inner] = y[base + j * inner] * (g[base + j * inner] - dot);
  }
}

// ---- Causal attention ------------------------------------------------------------
// One warp per query (or key) row: each lane holds dims lane, lane + 32, ...
// (up to 8 of them: dim <= 256), dot products are warp sums, key and value
// rows are read coalesced. Online softmax, so no seq x seq buffer.
constexpr int kAttentionLanes = 32, kAttentionPerLane = kMaxAttentionDim / kAttentionLanes;

__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Warps of this grid, and this warp's index and lane.
struct WarpIndex {
  int64_t warp, warps;
  int lane;
};
__device__ WarpIndex warpIndex() {
  return {(blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kAttentionLanes,
          static_cast<int64_t>(gridDim.x) * blockDim.x / kAttentionLanes,
          static_cast<int>(threadIdx.x % kAttentionLanes)};
}

/// Loads row `r` (dim floats) into this lane's slots.
__device__ void loadRow(const float *r, int64_t dim, int lane, float *x) {
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    x[t] = d < dim ? r[d] : 0.0f;
  }
}
__device__ float rowDot(const float *x, const float *r, int64_t dim, int lane) {
  float s = 0.0f;
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    if (d < dim)
      s += x[t] * r[d];
  }
  return warpSum(s);
}

/// Online softmax of query row `row` over keys 0..row: acc = sum_j p_j v_j
/// (unnormalized), m = max logit, l = sum_j p_j.
__device__ void attendRow(const float *qi, const float *kh, const float *vh, int64_t row,
                          int64_t dim, int lane, float scale, float *acc, float &m, float &l) {
  m = -INFINITY;
  l = 0.0f;
  for (int64_t j = 0; j <= row; ++j) {
    float s = rowDot(qi, kh + j * dim, dim, lane) * scale;
    float mNew = fmaxf(m, s), correction = expf(m - mNew), p = expf(s - mNew);
    l = l * correction + p;
    for (int t = 0; t < kAttentionPerLane; ++t) {
      int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
      acc[t] = acc[t] * correction + (d < dim ? p * vh[j * dim + d] : 0.0f);
    }
    m = mNew;
  }
}

/// The key/value head (flat over batch) that query head `head` (flat) reads.
__device__ int64_t kvHeadOf(int64_t head, int64_t heads, int64_t kvHeads) {
  return (head / heads) * kvHeads + (head % heads) / (heads / kvHeads);
}

__global__ void causalAttentionKernel(const float *q, const float *k, const float *v, float *out,
                                      int64_t bh, int64_t heads, int64_t kvHeads, int64_t seq,
                                      int64_t dim, float scale) {
  WarpIndex w = warpIndex();
  for (int64_t i = w.warp; i < bh * seq; i += w.warps) {
    int64_t head = i / seq, row = i % seq, kvh = kvHeadOf(head, heads, kvHeads);
    const float *kh = k + kvh * seq * dim, *vh = v + kvh * seq * dim;
    float qi[kAttentionPerLane], acc[kAttentionPerLane] = {};
    loadRow(q + i * dim, dim, w.lane, qi);
    float m, l;
    attendRow(qi, kh, vh, row, dim, w.lane, scale, acc, m, l);
    for (int t = 0; t < kAttentionPerLane; ++t) {
      int64_t d = w.lane + static_cast<int64_t>(t) * kAttentionLanes;
      if (d < dim)
        out[i * dim + d] = acc[t] / l;
    }
  }
}

/// Backward, pass 1: one warp per query row i: the row's softmax statistics
/// (max m_i, normalizer l_i), D_i = g_i . o_i and dq_i.
/// stats[3 * row + {0, 1, 2}] = m_i, l_i, D_i for pass 2.
__global__ void causalAttentionGradQKernel(const float *q, const float *k, const float *v,
                                           const float *g, float *dq, float *stats, int64_t bh,
                                           int64_t heads, int64_t kvHeads, int64_t seq,
                                           int64_t dim, float scale) {
  WarpIndex w = warpIndex();
  for (int64_t i = w.warp; i < bh * seq; i += w.warps) {
    int64_t head = i / seq, row = i % seq, kvh = kvHeadOf(head, heads, kvHeads);
    const float *kh = k + kvh * seq * dim, *vh = v + kvh * seq * dim;
    float qi[kAttentionPerLane], gi[kAttentionPerLane], o[kAttentionPerLane] = {},
        dqi[kAttentionPerLane] = {};
    loadRow(q + i * dim, dim, w.lane, qi);
    loadRow(g + i * dim, dim, w.lane, gi);
    float m, l;
    attendRow(qi, kh, vh, row, dim, w.lane, scale, o, m, l);
    float part = 0.0f; // D_i = sum_j p_j (g_i . v_j) = g_i . o_i
    for (int t = 0; t < kAttentionPerLane; ++t)
      part += gi[t] * o[t] / l;
    float D = warpSum(part);
    for (int64_t j = 0; j <= row; ++j) {
      float s = rowDot(qi, kh + j * dim, dim, w.lane);
      float dp = rowDot(gi, vh + j * dim, dim, w.lane);
      float ds = expf(s * scale - m) / l * (dp - D) * scale;
      for (int t = 0; t < kAttentionPerLane; ++t) {
        int64_t d = w.lane + static_cast<int64_t>(t) * kAttentionLanes;
        if (d < dim)
          dqi[t] += ds * kh[j * dim + d];
      }
    }
    for (int t = 0; t < kAttentionPerLane; ++t) {
      int64_t d = w.lane + static_cast<int64_t>(t) * kAttentionLanes;
      if (d < dim)
        dq[i * dim + d] = dqi[t];
    }
    if (w.lane == 0) {
      stats[3 * i] = m;
      stats[3 * i + 1] = l;
      stats[3 * i + 2] = D;
    }
  }
}

/// Backward, pass 2: one warp per key row j of a kv head: dk_j and dv_j over
/// the queries i >= j of every query head it serves (no atomics, deterministic).
__global__ void causalAttentionGradKVKernel(const float *q, const float *k, const float *v,
                                            const float *g, const float *stats, float *dk,
                                            float *dv, int64_t bkv, int64_t heads,
                                            int64_t kvHeads, int64_t seq, int64_t dim,
                                            float scale) {
  WarpIndex w = warpIndex();
  int64_t group = heads / kvHeads;
  for (int64_t jj = w.warp; jj < bkv * seq; jj += w.warps) {
    int64_t kvh = jj / seq, j = jj % seq;
    float kj[kAttentionPerLane], vj[kAttentionPerLane], dkj[kAttentionPerLane] = {},
        dvj[kAttentionPerLane] = {};
    loadRow(k + jj * dim, dim, w.lane, kj);
    loadRow(v + jj * dim, dim, w.lane, vj);
    for (int64_t m = 0; m < group; ++m) {
      int64_t head = (kvh / kvHeads) * heads + (kvh % kvHeads) * group + m;
      const float *qh = q + head * seq * dim, *gh = g + head * seq * dim;
      const float *st = stats + 3 * head * seq;
      for (int64_t i = j; i < seq; ++i) {
        const float *qi = qh + i * dim, *gi = gh + i * dim;
        float s = rowDot(kj, qi, dim, w.lane);
        float dp = rowDot(vj, gi, dim, w.lane);
        float p = expf(s * scale - st[3 * i]) / st[3 * i + 1];
        float ds = p * (dp - st[3 * i + 2]) * scale;
        for (int t = 0; t < kAttentionPerLane; ++t) {
          int64_t d = w.lane + static_cast<int64_t>(t) * kAttentionLanes;
          if (d < dim) {
            dvj[t] += p * gi[d];
            dkj[t] += ds * qi[d];
          }
        }
      }
    }
    for (int t = 0; t < kAttentionPerLane; ++t) {
      int64_t d = w.lane + static_cast<int64_t>(t) * kAttentionLanes;
      if (d < dim) {
        dk[jj * dim + d] = dkj[t];
        dv[jj * dim + d] = dvj[t];
      }
    }
  }
}

/// Blocks for one warp per row (4 warps a block), capped for grid-stride loops.
unsigned warpBlocksFor(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((rows + 3) / 4, 1), 65536));
}

// ---- Embedding and cross-entropy -----------------------------------------------------
__global__ void embeddingKernel(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                                int64_t n, float *out, int64_t offset, int64_t total,
                                ErrorRecord *err) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t t = i / dim, id = ids[t];
    if ((id < 0 || id >= total) && i % dim == 0)
      recordError(err, kBadEmbeddingId, id, t, total);
    int64_t r = id - offset;
    out[i] = r >= 0 && r < rows ? table[r * dim + i % dim] : 0.0f;
  }
}

__global__ void embeddingGradKernel(const int32_t *ids, int64_t n, const float *g, float *dtable,
                                    int64_t rows, int64_t dim, int64_t offset, int64_t total,
                                    ErrorRecord *err) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t t = i / dim, id = ids[t];
    if (id < 0 || id >= total) {
      if (i % dim == 0)
        recordError(err, kBadEmbeddingId, id, t, total);
      continue;
    }
    int64_t r = id - offset;
    if (r >= 0 && r < rows)
      atomicAdd(&dtable[r * dim + i % dim], g[i]);
  }
}

/// One block per row: adds this row's loss / rows into *loss (zeroed first).
__global__ void crossEntropyKernel(const float *logits, const int32_t *targets, int64_t rows,
                                   int64_t classes, float *loss, ErrorRecord *err) {
  const float *row = logits + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  float m;
  float s = rowExpSum(row, classes, m);
  if (threadIdx.x == 0) {
    if (t < 0 || t >= classes) {
      recordError(err, kBadTarget, t, blockIdx.x, classes);
      return;
    }
    atomicAdd(loss, (logf(s) + m - row[t]) / static_cast<float>(rows));
  }
}

__global__ void crossEntropyGradKernel(const float *logits, const int32_t *targets, const float *g,
                                       int64_t rows, int64_t classes, float *out,
                                       ErrorRecord *err) {
  const float *row = logits + blockIdx.x * classes;
  float *o = out + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  if (threadIdx.x == 0 && (t < 0 || t >= classes))
    recordError(err, kBadTarget, t, blockIdx.x, classes);
  float m;
  float s = rowExpSum(row, classes, m);
  float scale = *g / static_cast<float>(rows), inv = scale / s;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    o[c] = expf(row[c] - m) * inv - (c == t ? scale : 0.0f);
}

__global__ void rowMaxKernel(const float *x, int64_t cols, float *out) {
  const float *row = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = fmaxf(m, row[c]);
  m = blockMax(m);
  if (threadIdx.x == 0)
    out[blockIdx.x] = m;
}

__global__ void rowSumExpKernel(const float *x, int64_t cols, const float *max, float *out) {
  const float *row = x + blockIdx.x * cols;
  float s = 0.0f, m = max[blockIdx.x];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += expf(row[c] - m);
  s = blockSum(s);
  if (threadIdx.x == 0)
    out[blockIdx.x] = s;
}

__global__ void targetLogitKernel(const float *x, const int32_t *targets, int64_t rows,
                                  int64_t classes, int64_t offset, int64_t total, float *out,
                                  ErrorRecord *err) {
  PTC_GRID_LOOP(r, rows) {
    int64_t t = targets[r];
    if (t < 0 || t >= total)
      recordError(err, kBadTarget, t, r, total);
    int64_t c = t - offset;
    out[r] = c >= 0 && c < classes ? x[r * classes + c] : 0.0f;
  }
}

__global__ void lossFromPartsKernel(const float *max, const float *sum, const float *target,
                                    int64_t rows, float *loss) {
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    s += logf(sum[r]) + max[r] - target[r];
  s = blockSum(s);
  if (threadIdx.x == 0)
    *loss = s / static_cast<float>(rows);
}

__global__ void vocabParallelGradKernel(const float *x, const int32_t *targets, const float *g,
                                        const float *max, const float *sum, int64_t rows,
                                        int64_t classes, int64_t offset, int64_t total,
                                        float *out, ErrorRecord *err) {
  int64_t r = blockIdx.x;
  int64_t t = targets[r];
  if (threadIdx.x == 0 && (t < 0 || t >= total))
    recordError(err, kBadTarget, t, r, total);
  float scale = *g / static_cast<float>(rows), inv = scale / sum[r], m = max[r];
  int64_t local = t - offset;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    out[r * classes + c] = expf(x[r * classes + c] - m) * inv - (c == local ? scale : 0.0f);
}

// ---- Layout ------------------------------------------------------------------------
template <typename T>
__global__ void transposeKernel(const T *in, T *out, int64_t n, Dims outShape, Dims inStride) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, src = 0;
    for (int d = outShape.rank - 1; d >= 0; --d) {
      src += (rest % outShape.size[d]) * inStride.stride[d];
      rest /= outShape.size[d];
    }
    out[i] = in[src];
  }
}

template <typename T>
__global__ void copyBoxKernel(const T *src, T *dst, int64_t n, Dims box, Dims srcStride,
                              Dims dstStride, int64_t srcBase, int64_t dstBase) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, s = srcBase, d = dstBase;
    for (int k = box.rank - 1; k >= 0; --k) {
      int64_t c = rest % box.size[k];
      rest /= box.size[k];
      s += c * srcStride.stride[k];
      d += c * dstStride.stride[k];
    }
    dst[d] = src[s];
  }
}

/// Reduction: `kept` enumerates the output, `red` the reduced positions (both
/// with input strides).
__global__ void reduceKernel(int op, const float *in, float *out, int64_t outN, Dims kept,
                             Dims red, int64_t count) {
  PTC_GRID_LOOP(o, outN) {
    int64_t rest = o, base = 0;
    for (int d = kept.rank - 1; d >= 0; --d) {
      base += (rest % kept.size[d]) * kept.stride[d];
      rest /= kept.size[d];
    }
    float acc = op == 2 ? -INFINITY : 0.0f;
    for (int64_t r = 0; r < count; ++r) {
      int64_t rr = r, off = base;
      for (int d = red.rank - 1; d >= 0; --d) {
        off += (rr % red.size[d]) * red.stride[d];
        rr /= red.size[d];
      }
      acc = op == 2 ? fmaxf(acc, in[off]) : acc + in[off];
    }
    out[o] = op == 1 ? acc / static_cast<float>(count) : acc;
  }
}

/// d max: g split evenly over the positions that hold the maximum.
__global__ void reduceMaxGradKernel(const float *in, const float *g, float *out, int64_t outN,
                                    Dims kept, Dims red, int64_t count) {
  PTC_GRID_LOOP(o, outN) {
    int64_t rest = o, base = 0;
    for (int d = kept.rank - 1; d >= 0; --d) {
      base += (rest % kept.size[d]) * kept.stride[d];
      rest /= kept.size[d];
    }
    auto offset = [&](int64_t r) {
      int64_t off = base;
      for (int d = red.rank - 1; d >= 0; --d) {
        off += (r % red.size[d]) * red.stride[d];
        r /= red.size[d];
      }
      return off;
    };
    float mx = -INFINITY;
    for (int64_t r = 0; r < count; ++r)
      mx = fmaxf(mx, in[offset(r)]);
    float ties = 0.0f;
    for (int64_t r = 0; r < count; ++r)
      ties += in[offset(r)] == mx ? 1.0f : 0.0f;
    for (int64_t r = 0; r < count; ++r) {
      int64_t off = offset(r);
      out[off] = in[off] == mx ? g[o] / ties : 0.0f;
    }
  }
}

// ---- Mixture of experts ----------------------------------------------------------
__device__ void softmaxStats(const float *x, int64_t n, float &max, float &sum) {
  max = -INFINITY;
  for (int64_t e = 0; e < n; ++e)
    max = fmaxf(max, x[e]);
  sum = 0.0f;
  for (int64_t e = 0; e < n; ++e)
    sum += expf(x[e] - max);
}

/// One thread per token: the k experts of largest p (+ bias) (lowest index on ties).
__global__ void topKGateKernel(const float *logits, const float *bias, int64_t tokens,
                               int64_t experts, int64_t k, bool normalize, float *weights,
                               int32_t *indices) {
  PTC_GRID_LOOP(t, tokens) {
    const float *x = logits + t * experts;
    float mx, sum;
    softmaxStats(x, experts, mx, sum);
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      float bestP = 0.0f, bestScore = 0.0f;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i)
          taken |= indices[t * k + i] == e;
        float p = expf(x[e] - mx) / sum;
        float score = bias ? p + bias[e] : p;
        if (!taken && (best < 0 || score > bestScore)) {
          best = e;
          bestP = p;
          bestScore = score;
        }
      }
      indices[t * k + j] = static_cast<int32_t>(best);
      weights[t * k + j] = bestP;
      total += bestP;
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j)
        weights[t * k + j] /= total;
  }
}

__global__ void topKGateGradKernel(const float *logits, const int32_t *indices, const float *gw,
                                   int64_t tokens, int64_t experts, int64_t k, bool normalize,
                                   float *out, ErrorRecord *err) {
  PTC_GRID_LOOP(t, tokens) {
    const float *x = logits + t * experts;
    const int32_t *idx = indices + t * k;
    const float *g = gw + t * k;
    bool ok = true;
    for (int64_t j = 0; j < k; ++j)
      if (idx[j] < 0 || idx[j] >= experts) {
        recordError(err, kBadExpert, idx[j], t * k + j, experts);
        ok = false;
      }
    if (!ok)
      continue;
    float mx, sum;
    softmaxStats(x, experts, mx, sum);
    auto p = [&](int64_t e) { return expf(x[e] - mx) / sum; };
    float chosen = 0.0f, c = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      chosen += p(idx[j]);
    if (normalize)
      for (int64_t j = 0; j < k; ++j)
        c += g[j] * p(idx[j]) / chosen;
    // dp_e is non-zero only on the chosen experts.
    auto dp = [&](int64_t e) {
      float d = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        if (idx[j] == e)
          d += normalize ? (g[j] - c) / chosen : g[j];
      return d;
    };
    float dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      bool first = true;
      for (int64_t i = 0; i < j; ++i)
        first &= idx[i] != idx[j];
      if (first)
        dot += p(idx[j]) * dp(idx[j]);
    }
    for (int64_t e = 0; e < experts; ++e)
      out[t * experts + e] = p(e) * (dp(e) - dot);
  }
}

/// One thread per (group, expert), scanning the group's assignments
/// choice-major (as the CPU): slot = group * capacity + s, or -1 when dropped.
__global__ void assignSlotsKernel(const int32_t *indices, int64_t groups, int64_t tokens,
                                  int64_t k, int64_t experts, int64_t capacity, int32_t *slots,
                                  ErrorRecord *err) {
  PTC_GRID_LOOP(ge, groups * experts) {
    int64_t g = ge / experts, e = ge % experts, used = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t i = (g * tokens + t) * k + j;
        int32_t x = indices[i];
        if (x == e)
          slots[i] = used < capacity ? static_cast<int32_t>(g * capacity + used++) : -1;
        else if (e == 0 && (x < 0 || x >= experts)) {
          recordError(err, kBadExpert, x, i, experts);
          slots[i] = -1;
        }
      }
  }
}

/// One thread per (group, expert): counts the group's assignments to it.
__global__ void expertLoadKernel(const int32_t *indices, int64_t groups, int64_t tokens,
                                 int64_t k, int64_t experts, float *out, ErrorRecord *err) {
  PTC_GRID_LOOP(ge, groups * experts) {
    int64_t g = ge / experts, e = ge % experts, count = 0;
    for (int64_t i = g * tokens * k; i < (g + 1) * tokens * k; ++i) {
      int32_t x = indices[i];
      count += x == e;
      if (e == 0 && (x < 0 || x >= experts))
        recordError(err, kBadExpert, x, i, experts);
    }
    out[ge] = static_cast<float>(count) / static_cast<float>(tokens * k);
  }
}

__global__ void moeDispatchKernel(const float *x, const int32_t *indices, const int32_t *slots,
                                  int64_t n, int64_t k, int64_t dim, int64_t capacity,
                                  float *out) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t a = i / dim, c = i % dim;
    if (slots[a] >= 0)
      out[(indices[a] * capacity + slots[a]) * dim + c] = x[(a / k) * dim + c];
  }
}

__global__ void moeGatherKernel(const float *src, const float *weights, const int32_t *indices,
                                const int32_t *slots, int64_t tokens, int64_t k, int64_t dim,
                                int64_t capacity, float *out) {
  PTC_GRID_LOOP(i, tokens * dim) {
    int64_t t = i / dim, c = i % dim;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t a = t * k + j;
      if (slots[a] >= 0)
        acc += (weights ? weights[a] : 1.0f) * src[(indices[a] * capacity + slots[a]) * dim + c];
    }
    out[i] = acc;
  }
}

__global__ void moeCombineGradKernel(const float *expertOut, const float *weights,
                                     const int32_t *indices, const int32_t *slots, const float *g,
                                     int64_t n, int64_t k, int64_t dim, int64_t capacity,
                                     float *dExpertOut, float *dWeights) {
  PTC_GRID_LOOP(a, n) {
    float dot = 0.0f;
    if (slots[a] >= 0) {
      int64_t off = (indices[a] * capacity + slots[a]) * dim;
      const float *gt = g + (a / k) * dim;
      for (int64_t c = 0; c < dim; ++c) {
        dExpertOut[off + c] = weights[a] * gt[c];
        dot += gt[c] * expertOut[off + c];
      }
    }
    dWeights[a] = dot;
  }
}

// ---- Optimizer ---------------------------------------------------------------------
/// AdamW's per-step coefficients (bias corrections from the device step count,
/// in double as the CPU computes them) and one element's update, torch's order.
struct AdamWStep {
  float stepSize, bc2Sqrt, decay, b1, b2, eps;
  bool keep; // the loss-scaling skip flag: outputs get the inputs
};
__device__ AdamWStep adamwStep(const float *step, float lr, float b1, float b2, float eps,
                               float wd, const float *skip) {
  double t = static_cast<double>(*step);
  return {static_cast<float>(lr / (1.0 - pow(static_cast<double>(b1), t))),
          static_cast<float>(sqrt(1.0 - pow(static_cast<double>(b2), t))), 1.0f - lr * wd, b1,
          b2, eps, skip && *skip != 0.0f};
}
__device__ void adamwElement(const AdamWStep &c, const float *param, const float *grad,
                             const float *m, const float *v, float *outP, float *outM,
                             float *outV, int64_t i) {
  if (c.keep) {
    outP[i] = param[i];
    outM[i] = m[i];
    outV[i] = v[i];
    return;
  }
  float g = grad[i];
  float mi = m[i] + (g - m[i]) * (1.0f - c.b1);
  float vi = v[i] * c.b2 + (1.0f - c.b2) * g * g;
  float denom = sqrtf(vi) / c.bc2Sqrt + c.eps;
  outP[i] = param[i] * c.decay - c.stepSize * mi / denom;
  outM[i] = mi;
  outV[i] = vi;
}

__global__ void adamwKernel(const float *param, const float *grad, const float *m, const float *v,
                            const float *step, int64_t n, float lr, float b1, float b2, float eps,
                            float wd, const float *skip, float *outP, float *outM, float *outV) {
  AdamWStep c = adamwStep(step, lr, b1, b2, eps, wd, skip);
  PTC_GRID_LOOP(i, n) adamwElement(c, param, grad, m, v, outP, outM, outV, i);
}

/// One thread per element of the concatenated tensors; the tensor is found by
/// binary search over the prefix offsets.
__global__ void adamwManyKernel(const AdamWTensor *table, int count, int64_t total,
                                const float *step, float lr, float b1, float b2, float eps,
                                float wd, const float *skip) {
  AdamWStep c = adamwStep(step, lr, b1, b2, eps, wd, skip);
  PTC_GRID_LOOP(e, total) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (table[mid].offset <= e)
        lo = mid;
      else
        hi = mid - 1;
    }
    const AdamWTensor &x = table[lo];
    adamwElement(c, x.param, x.grad, x.m, x.v, x.outParam, x.outM, x.outV, e - x.offset);
  }
}

__global__ void sgdKernel(const float *param, const float *grad, const float *buf, float lr,
                          float momentum, float wd, int64_t n, const float *skip, float *outP,
                          float *outB) {
  bool keep = skip && *skip != 0.0f;
  PTC_GRID_LOOP(i, n) {
    if (keep) {
      outP[i] = param[i];
      outB[i] = buf[i];
      continue;
    }
    float g = grad[i] + wd * param[i];
    float b = momentum * buf[i] + g;
    outB[i] = b;
    outP[i] = param[i] - lr * b;
  }
}

__global__ void sumSquaresKernel(const float *x, int64_t n, float *out) {
  float s = 0.0f;
  PTC_GRID_LOOP(i, n) s += x[i] * x[i];
  s = blockSum(s);
  if (threadIdx.x == 0)
    atomicAdd(out, s);
}

__global__ void clipKernel(const float *g, float *out, int64_t n, float maxNorm,
                           const float *sumSquares) {
  float coef = fminf(1.0f, maxNorm / (sqrtf(*sumSquares) + 1e-6f));
  PTC_GRID_LOOP(i, n) out[i] = g[i] * coef;
}

__global__ void normKernel(const float *sumSquares, float *norm) { *norm = sqrtf(*sumSquares); }

__global__ void unscaleKernel(const float *g, float *out, int64_t n, const float *scale,
                              float *found) {
  float inv = 1.0f / *scale;
  bool bad = false;
  PTC_GRID_LOOP(i, n) {
    bool finite = isfinite(g[i]);
    bad |= !finite;
    out[i] = finite ? g[i] * inv : 0.0f;
  }
  if (bad)
    *found = 1.0f;
}

/// A grid for grid-stride loops: enough blocks to fill the GPU, not more.
unsigned gridFor(int64_t n) { return std::min<unsigned>(blocksFor(n), 4096u); }
} // namespace

std::string describe(const ErrorRecord &e) {
  const char *what = e.kind == kBadEmbeddingId ? "embedding index"
                     : e.kind == kBadTarget    ? "target"
                                               : "expert index";
  return std::string(what) + " " + std::to_string(e.id) + " at position " +
         std::to_string(e.where) + " is outside [0, " + std::to_string(e.limit) + ")";
}

void binary(Binary op, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os, void *stream) {
  BroadcastShape s = broadcastShape(as, bs, os);
  int64_t n = product(os);
  unsigned grid = gridFor(n);
  switch (op) {
  case Binary::Add:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, AddOp{});
    break;
  case Binary::Sub:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, SubOp{});
    break;
  case Binary::Mul:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, MulOp{});
    break;
  case Binary::Div:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, DivOp{});
    break;
  }
}

void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os, void *stream) {
  BroadcastShape s = broadcastShape(is, is, os);
  int64_t n = product(os);
  binaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, in, out, n, s, FirstOp{});
}

void scale(const float *in, float *out, int64_t n, float factor, void *stream) {
  scaleKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, out, n, factor);
}

void unary(UnaryFunction fn, const float *in, float *out, int64_t n, void *stream) {
  unaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(fn, in, out, n);
}

void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n,
               void *stream) {
  unaryGradKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(fn, x, g, out, n);
}

void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream) {
  convertKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, static_cast<int>(from), out,
                                                        static_cast<int>(to), n);
}

void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps, void *stream) {
  if (rows > 0)
    layerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, b, out, cols,
                                                                             eps);
}

void layerNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                   float *db, int64_t rows, int64_t cols, float eps, float *rowStats,
                   void *stream) {
  if (rows == 0)
    return;
  layerNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, g, dx,
                                                                                  cols, eps);
  layerNormStatsKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, cols, eps,
                                                                                rowStats);
  layerNormGradColumnsKernel<<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0,
                               S(stream)>>>(x, g, rowStats, dw, db, rows, cols);
}

namespace {
/// A softmax axis as (rows, axis length, inner stride): rows = outer x inner.
struct SoftmaxAxis {
  int64_t rows, n, inner;
};
SoftmaxAxis softmaxAxis(const Shape &shape, int64_t axis) {
  int64_t n = shape[static_cast<size_t>(axis)], inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    inner *= shape[d];
  return {n ? product(shape) / n : 0, n, inner};
}
} // namespace

void softmax(const float *x, float *out, const Shape &shape, int64_t axis, void *stream) {
  SoftmaxAxis a = softmaxAxis(shape, axis);
  if (a.rows == 0)
    return;
  if (a.inner == 1)
    softmaxLastKernel<<<static_cast<unsigned>(a.rows), kThreads, 0, S(stream)>>>(x, out, a.n);
  else
    softmaxStridedKernel<<<gridFor(a.rows), kThreads, 0, S(stream)>>>(x, out, a.rows / a.inner,
                                                                       a.n, a.inner);
}

void softmaxGrad(const float *y, const float *g, float *out, const Shape &shape, int64_t axis,
                 void *stream) {
  SoftmaxAxis a = softmaxAxis(shape, axis);
  if (a.rows == 0)
    return;
  if (a.inner == 1)
    softmaxGradLastKernel<<<static_cast<unsigned>(a.rows), kThreads, 0, S(stream)>>>(y, g, out,
                                                                                     a.n);
  else
    softmaxGradStridedKernel<<<gridFor(a.rows), kThreads, 0, S(stream)>>>(
        y, g, out, a.rows / a.inner, a.n, a.inner);
}

void rmsNorm(const float *x, const float *w, float *out, int64_t rows, int64_t cols, float eps,
             void *stream) {
  if (rows > 0)
    rmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, out, cols, eps);
}

void rmsNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                 int64_t rows, int64_t cols, float eps, float *rowStats, void *stream) {
  if (rows == 0)
    return;
  rmsNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      x, w, g, dx, rowStats, cols, eps);
  rmsNormGradColumnsKernel<<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0,
                             S(stream)>>>(x, g, rowStats, dw, rows, cols);
}

void rotary(const float *x, float *out, int64_t bh, int64_t seq, int64_t dim, double theta,
            bool inverse, void *stream) {
  int64_t n = bh * seq * (dim / 2);
  if (n > 0)
    rotaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(x, out, bh, seq, dim, theta, inverse);
}

void causalAttention(const float *q, const float *k, const float *v, float *out, int64_t batch,
                     int64_t heads, int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                     void *stream) {
  int64_t bh = batch * heads;
  causalAttentionKernel<<<warpBlocksFor(bh * seq), 128, 0, S(stream)>>>(
      q, k, v, out, bh, heads, kvHeads, seq, dim, scale);
}

void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, int64_t batch, int64_t heads,
                         int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                         float *rowStats, void *stream) {
  int64_t bh = batch * heads, bkv = batch * kvHeads;
  causalAttentionGradQKernel<<<warpBlocksFor(bh * seq), 128, 0, S(stream)>>>(
      q, k, v, g, dq, rowStats, bh, heads, kvHeads, seq, dim, scale);
  causalAttentionGradKVKernel<<<warpBlocksFor(bkv * seq), 128, 0, S(stream)>>>(
      q, k, v, g, rowStats, dk, dv, bkv, heads, kvHeads, seq, dim, scale);
}

void embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n,
               float *out, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
               void *stream) {
  embeddingKernel<<<gridFor(n * dim), kThreads, 0, S(stream)>>>(table, rows, dim, ids, n, out,
                                                                rowOffset, totalRows, err);
}

void embeddingGrad(const int32_t *ids, int64_t n, const float *g, float *dtable, int64_t rows,
                   int64_t dim, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
                   void *stream) {
  cudaMemsetAsync(dtable, 0, static_cast<size_t>(rows * dim) * sizeof(float), S(stream));
  embeddingGradKernel<<<gridFor(n * dim), kThreads, 0, S(stream)>>>(ids, n, g, dtable, rows, dim,
                                                                    rowOffset, totalRows, err);
}

void crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, ErrorRecord *err, void *stream) {
  cudaMemsetAsync(loss, 0, sizeof(float), S(stream));
  if (rows > 0)
    crossEntropyKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, rows, classes, loss, err);
}

void crossEntropyGrad(const float *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, float *out, ErrorRecord *err, void *stream) {
  if (rows > 0)
    crossEntropyGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, g, rows, classes, out, err);
}

void rowMax(const float *logits, int64_t rows, int64_t classes, float *out, void *stream) {
  if (rows > 0)
    rowMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, out);
}

void rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max, float *out,
               void *stream) {
  if (rows > 0)
    rowSumExpKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, max,
                                                                             out);
}

void targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                 int64_t offset, int64_t total, float *out, ErrorRecord *err, void *stream) {
  targetLogitKernel<<<gridFor(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, classes,
                                                               offset, total, out, err);
}

void lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                   float *loss, void *stream) {
  lossFromPartsKernel<<<1, 1024, 0, S(stream)>>>(max, sumExp, target, rows, loss);
}

void vocabParallelGrad(const float *logits, const int32_t *targets, const float *g,
                       const float *max, const float *sumExp, int64_t rows, int64_t classes,
                       int64_t offset, int64_t total, float *out, ErrorRecord *err,
                       void *stream) {
  if (rows > 0)
    vocabParallelGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, g, max, sumExp, rows, classes, offset, total, out, err);
}

namespace {
template <typename T>
void launchTranspose(const void *in, void *out, int64_t n, const Dims &os, const Dims &st,
                     void *stream) {
  transposeKernel<T><<<gridFor(n), kThreads, 0, S(stream)>>>(static_cast<const T *>(in),
                                                            static_cast<T *>(out), n, os, st);
}
template <typename T>
void launchCopyBox(const void *src, void *dst, int64_t n, const Dims &box, const Dims &ss,
                   const Dims &ds, int64_t s0, int64_t d0, void *stream) {
  copyBoxKernel<T><<<gridFor(n), kThreads, 0, S(stream)>>>(
      static_cast<const T *>(src), static_cast<T *>(dst), n, box, ss, ds, s0, d0);
}
} // namespace

void transpose(const void *in, const Shape &is, void *out, const Shape &perm, int64_t elemBytes,
               void *stream) {
  int64_t n = product(is);
  if (n == 0)
    return;
  Dims inDims = rowMajor(is), os, st;
  os.rank = st.rank = inDims.rank;
  for (int i = 0; i < inDims.rank; ++i) {
    os.size[i] = inDims.size[perm[static_cast<size_t>(i)]];
    st.stride[i] = inDims.stride[perm[static_cast<size_t>(i)]];
  }
  switch (elemBytes) {
  case 1:
    launchTranspose<uint8_t>(in, out, n, os, st, stream);
    break;
  case 2:
    launchTranspose<uint16_t>(in, out, n, os, st, stream);
    break;
  case 8:
    launchTranspose<uint64_t>(in, out, n, os, st, stream);
    break;
  default:
    launchTranspose<uint32_t>(in, out, n, os, st, stream);
    break;
  }
}

void copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
             const Shape &dstShape, const Shape &dstOffsets, const Shape &box, int64_t elemBytes,
             void *stream) {
  int64_t n = product(box);
  if (n == 0)
    return;
  Dims b = rowMajor(box), ss = rowMajor(srcShape), ds = rowMajor(dstShape);
  int64_t s0 = 0, d0 = 0;
  for (size_t i = 0; i < box.size(); ++i) {
    s0 += srcOffsets[i] * ss.stride[i];
    d0 += dstOffsets[i] * ds.stride[i];
  }
  switch (elemBytes) {
  case 1:
    launchCopyBox<uint8_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  case 2:
    launchCopyBox<uint16_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  case 8:
    launchCopyBox<uint64_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  default:
    launchCopyBox<uint32_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  }
}

namespace {
/// Splits the input dims into kept (output order) and reduced ones.
void splitAxes(const Shape &is, const Shape &axes, Dims &kept, Dims &red, int64_t &outN,
               int64_t &count) {
  Dims in = rowMajor(is);
  outN = count = 1;
  for (int d = 0; d < in.rank; ++d) {
    bool reduced = false;
    for (int64_t a : axes)
      reduced |= a == d;
    Dims &to = reduced ? red : kept;
    to.size[to.rank] = in.size[d];
    to.stride[to.rank] = in.stride[d];
    ++to.rank;
    (reduced ? count : outN) *= in.size[d];
  }
}
} // namespace

void reduce(Reduce op, const float *in, const Shape &is, const Shape &axes, float *out,
            void *stream) {
  Dims kept, red;
  int64_t outN, count;
  splitAxes(is, axes, kept, red, outN, count);
  reduceKernel<<<gridFor(outN), kThreads, 0, S(stream)>>>(static_cast<int>(op), in, out, outN,
                                                          kept, red, count);
}

void reduceMaxGrad(const float *in, const Shape &is, const Shape &axes, const float *g,
                   float *out, void *stream) {
  Dims kept, red;
  int64_t outN, count;
  splitAxes(is, axes, kept, red, outN, count);
  reduceMaxGradKernel<<<gridFor(outN), kThreads, 0, S(stream)>>>(in, g, out, outN, kept, red,
                                                                 count);
}

void topKGate(const float *logits, const float *bias, int64_t tokens, int64_t experts, int64_t k,
              bool normalize, float *weights, int32_t *indices, void *stream) {
  topKGateKernel<<<gridFor(tokens), kThreads, 0, S(stream)>>>(logits, bias, tokens, experts, k,
                                                              normalize, weights, indices);
}

void topKGateGrad(const float *logits, const int32_t *indices, const float *gw, int64_t tokens,
                  int64_t experts, int64_t k, bool normalize, float *out, ErrorRecord *err,
                  void *stream) {
  topKGateGradKernel<<<gridFor(tokens), kThreads, 0, S(stream)>>>(logits, indices, gw, tokens,
                                                                  experts, k, normalize, out, err);
}

void assignSlots(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                 int64_t experts, int64_t capacity, int32_t *slots, ErrorRecord *err,
                 void *stream) {
  assignSlotsKernel<<<gridFor(groups * experts), kThreads, 0, S(stream)>>>(
      indices, groups, tokens, k, experts, capacity, slots, err);
}

void expertLoad(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                int64_t experts, float *out, ErrorRecord *err, void *stream) {
  expertLoadKernel<<<gridFor(groups * experts), kThreads, 0, S(stream)>>>(indices, groups, tokens,
                                                                         k, experts, out, err);
}

void moeDispatch(const float *x, const int32_t *indices, const int32_t *slots, int64_t tokens,
                 int64_t k, int64_t dim, int64_t experts, int64_t capacity, float *out,
                 void *stream) {
  cudaMemsetAsync(out, 0, static_cast<size_t>(experts * capacity * dim) * sizeof(float),
                  S(stream));
  moeDispatchKernel<<<gridFor(tokens * k * dim), kThreads, 0, S(stream)>>>(
      x, indices, slots, tokens * k, k, dim, capacity, out);
}

void moeDispatchGrad(const float *g, const int32_t *indices, const int32_t *slots,
                     int64_t tokens, int64_t k, int64_t dim, int64_t capacity, float *out,
                     void *stream) {
  moeGatherKernel<<<gridFor(tokens * dim), kThreads, 0, S(stream)>>>(
      g, nullptr, indices, slots, tokens, k, dim, capacity, out);
}

void moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                const int32_t *slots, int64_t tokens, int64_t k, int64_t dim, int64_t capacity,
                float *out, void *stream) {
  moeGatherKernel<<<gridFor(tokens * dim), kThreads, 0, S(stream)>>>(
      expertOut, weights, indices, slots, tokens, k, dim, capacity, out);
}

void moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                    const int32_t *slots, const float *g, int64_t tokens, int64_t k, int64_t dim,
                    int64_t experts, int64_t capacity, float *dExpertOut, float *dWeights,
                    void *stream) {
  cudaMemsetAsync(dExpertOut, 0, static_cast<size_t>(experts * capacity * dim) * sizeof(float),
                  S(stream));
  moeCombineGradKernel<<<gridFor(tokens * k), kThreads, 0, S(stream)>>>(
      expertOut, weights, indices, slots, g, tokens * k, k, dim, capacity, dExpertOut, dWeights);
}

void adamwUpdate(const float *param, const float *grad, const float *m, const float *v,
                 const float *step, const AdamW &hp, int64_t n, const float *skip,
                 float *outParam, float *outM, float *outV, void *stream) {
  adamwKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(param, grad, m, v, step, n, hp.lr, hp.beta1,
                                                      hp.beta2, hp.eps, hp.weightDecay, skip,
                                                      outParam, outM, outV);
}

void adamwUpdateMany(const AdamWTensor *table, int count, int64_t total, const float *step,
                     const AdamW &hp, const float *skip, void *stream) {
  if (total > 0)
    adamwManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(
        table, count, total, step, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weightDecay, skip);
}

void sgdUpdate(const float *param, const float *grad, const float *buf, float lr,
               float momentum, float weightDecay, int64_t n, const float *skip, float *outParam,
               float *outBuf, void *stream) {
  sgdKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(param, grad, buf, lr, momentum, weightDecay, n,
                                                    skip, outParam, outBuf);
}

void sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                  float *out, void *stream) {
  cudaMemsetAsync(out, 0, sizeof(float), S(stream));
  for (size_t t = 0; t < grads.size(); ++t)
    if (sizes[t] > 0)
      sumSquaresKernel<<<std::min<unsigned>(gridFor(sizes[t]), 1024u), kThreads, 0, S(stream)>>>(
          grads[t], sizes[t], out);
}

void clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                const std::vector<float *> &outs, float maxNorm, const float *sumSquares,
                float *norm, void *stream) {
  for (size_t t = 0; t < grads.size(); ++t)
    clipKernel<<<gridFor(sizes[t]), kThreads, 0, S(stream)>>>(grads[t], outs[t], sizes[t], maxNorm,
                                                              sumSquares);
  // After every scale (norm may be the sum-of-squares scalar itself).
  normKernel<<<1, 1, 0, S(stream)>>>(sumSquares, norm);
}

void unscale(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
             const std::vector<float *> &outs, const float *scale, float *found, void *stream) {
  // `found` may alias nothing read here; cleared first, set by any block that sees inf / nan.
  cudaMemsetAsync(found, 0, sizeof(float), S(stream));
  for (size_t t = 0; t < grads.size(); ++t)
    unscaleKernel<<<gridFor(sizes[t]), kThreads, 0, S(stream)>>>(grads[t], outs[t], sizes[t],
                                                                 scale, found);
}

int matmul(void *cublasHandle, const void *a, const Shape &as, const void *b, const Shape &bs,
           void *out, bool transA, bool transB, FloatType type, bool allowTf32, void *stream) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < r; ++d)
    batch *= as[d];
  bool shared = rb == 2;
  auto h = static_cast<cublasHandle_t>(cublasHandle);
  cublasSetStream(h, S(stream));
  cudaDataType_t dt = type == FloatType::BF16 ? CUDA_R_16BF
                      : type == FloatType::F16 ? CUDA_R_16F
                                               : CUDA_R_32F;
  cublasComputeType_t ct = type == FloatType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                               : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ldb = static_cast<int>(transB ? k : n), lda = static_cast<int>(transA ? m : k);
  if (shared && !transA) {
    // Every batch row shares B: one GEMM over batch * m rows.
    m *= batch;
    batch = 1;
  }
  cublasStatus_t st = cublasGemmStridedBatchedEx(
      h, opB, opA, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b, dt, ldb,
      shared ? 0 : k * n, a, dt, lda, m * k, &zero, out, dt, static_cast<int>(n), m * n,
      static_cast<int>(batch), ct, CUBLAS_GEMM_DEFAULT);
  return static_cast<int>(st);
}

} // namespace ptc::kernels::cuda
