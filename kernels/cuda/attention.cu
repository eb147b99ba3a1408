// CUDA kernels: softmax and causal attention (see kernels.h).

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/tiled_attention.h"

#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

namespace ptc::kernels::cuda {
namespace {
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
template <typename T> __device__ void loadRow(const T *r, int64_t dim, int lane, float *x) {
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    x[t] = d < dim ? toFloat(r[d]) : 0.0f;
  }
}
template <typename T> __device__ float rowDot(const float *x, const T *r, int64_t dim, int lane) {
  float s = 0.0f;
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    if (d < dim)
      s += x[t] * toFloat(r[d]);
  }
  return warpSum(s);
}

/// x += a * r in this lane's slots of a row.
template <typename T>
__device__ void addScaledRow(float *x, float a, const T *r, int64_t dim, int lane) {
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    if (d < dim)
      x[t] += a * toFloat(r[d]);
  }
}
/// Writes this lane's slots of a row.
template <typename T> __device__ void storeSlots(const float *x, int64_t dim, int lane, T *out) {
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    if (d < dim)
      out[d] = fromFloat<T>(x[t]);
  }
}

/// The online softmax of a query row continued over keys 0..n-1: acc = sum_j
/// p_j v_j (unnormalized), m = max logit, l = sum_j p_j.
/// Key and value rows lie `ld` floats apart.
template <typename T>
__device__ void attendKeys(const float *qi, const T *kh, const T *vh, int64_t n,
                           int64_t dim, int64_t ld, int lane, float scale, float *acc, float &m,
                           float &l) {
  for (int64_t j = 0; j < n; ++j) {
    float s = rowDot(qi, kh + j * ld, dim, lane) * scale;
    float mNew = fmaxf(m, s), correction = expf(m - mNew), p = expf(s - mNew);
    l = l * correction + p;
    for (int t = 0; t < kAttentionPerLane; ++t) {
      int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
      acc[t] = acc[t] * correction + (d < dim ? p * toFloat(vh[j * ld + d]) : 0.0f);
    }
    m = mNew;
  }
}

/// Online softmax of query row `row` over keys 0..row.
template <typename T>
__device__ void attendRow(const float *qi, const T *kh, const T *vh, int64_t row,
                          int64_t dim, int64_t ld, int lane, float scale, float *acc, float &m,
                          float &l) {
  m = -INFINITY;
  l = 0.0f;
  attendKeys(qi, kh, vh, row + 1, dim, ld, lane, scale, acc, m, l);
}

/// Writes this lane's slots of a row's normalized output: acc / l.
template <typename T>
__device__ void storeRow(const float *acc, float l, int64_t dim, int lane, T *out) {
  for (int t = 0; t < kAttentionPerLane; ++t) {
    int64_t d = lane + static_cast<int64_t>(t) * kAttentionLanes;
    if (d < dim)
      out[d] = fromFloat<T>(acc[t] / l);
  }
}

using tiled::kvHeadOf;

/// Row `row` of flat head `head` (batch entry * heads + head): in a [batch,
/// heads, seq, dim] tensor, or a seq-major [batch, seq, heads, dim] one.
__device__ int64_t headRow(int64_t head, int64_t row, int64_t heads, int64_t seq, int64_t dim,
                           bool seqMajor) {
  return seqMajor ? (((head / heads) * seq + row) * heads + head % heads) * dim
                  : (head * seq + row) * dim;
}

using tiled::firstKey; // the first key a query row attends (packed documents)

/// With `lse`, each row's log-sum-exp of its scaled scores goes to lse[i]
/// ([batch, heads, seq]: the statistics the gradient reads when saved).
__global__ void causalAttentionKernel(const float *q, const float *k, const float *v, float *out,
                                      int64_t bh, int64_t heads, int64_t kvHeads, int64_t seq,
                                      int64_t dim, float scale, bool seqMajor,
                                      const int32_t *positions, float *lse) {
  WarpIndex w = warpIndex();
  const int64_t ldkv = seqMajor ? kvHeads * dim : dim;
  for (int64_t i = w.warp; i < bh * seq; i += w.warps) {
    int64_t head = i / seq, row = i % seq, kvh = kvHeadOf(head, heads, kvHeads);
    const int64_t kv0 = headRow(kvh, 0, kvHeads, seq, dim, seqMajor);
    const int64_t qRow = headRow(head, row, heads, seq, dim, seqMajor);
    const int64_t first = firstKey(positions, head / heads, row, seq);
    const float *kh = k + kv0 + first * ldkv, *vh = v + kv0 + first * ldkv;
    float qi[kAttentionPerLane], acc[kAttentionPerLane] = {};
    loadRow(q + qRow, dim, w.lane, qi);
    float m, l;
    attendRow(qi, kh, vh, row - first, dim, ldkv, w.lane, scale, acc, m, l);
    storeRow(acc, l, dim, w.lane, out + qRow);
    if (lse && w.lane == 0)
      lse[i] = m + logf(l);
  }
}

/// Backward, pass 1: one warp per query row i: the row's softmax statistics
/// (max m_i, normalizer l_i), D_i = g_i . o_i and dq_i.
/// stats[3 * row + {0, 1, 2}] = m_i, l_i, D_i for pass 2. With the forward's
/// saved result `savedO` (g's layout) and log-sum-exp `savedLse`, m_i is the
/// latter, l_i 1 and D_i = g_i . o_i: no forward pass over the keys.
__global__ void causalAttentionGradQKernel(const float *q, const float *k, const float *v,
                                           const float *g, float *dq, float *stats, int64_t bh,
                                           int64_t heads, int64_t kvHeads, int64_t seq,
                                           int64_t dim, float scale, bool seqMajor,
                                           const int32_t *positions, const float *savedO,
                                           const float *savedLse) {
  WarpIndex w = warpIndex();
  const int64_t ldkv = seqMajor ? kvHeads * dim : dim;
  for (int64_t i = w.warp; i < bh * seq; i += w.warps) {
    int64_t head = i / seq, row = i % seq, kvh = kvHeadOf(head, heads, kvHeads);
    const int64_t kv0 = headRow(kvh, 0, kvHeads, seq, dim, seqMajor);
    const int64_t qRow = headRow(head, row, heads, seq, dim, seqMajor);
    const int64_t first = firstKey(positions, head / heads, row, seq);
    const float *kh = k + kv0 + first * ldkv, *vh = v + kv0 + first * ldkv;
    float qi[kAttentionPerLane], gi[kAttentionPerLane], o[kAttentionPerLane] = {},
        dqi[kAttentionPerLane] = {};
    loadRow(q + qRow, dim, w.lane, qi);
    loadRow(g + qRow, dim, w.lane, gi);
    float m, l;
    if (savedLse) {
      loadRow(savedO + qRow, dim, w.lane, o);
      m = savedLse[i];
      l = 1.0f;
    } else {
      attendRow(qi, kh, vh, row - first, dim, ldkv, w.lane, scale, o, m, l);
    }
    float part = 0.0f; // D_i = sum_j p_j (g_i . v_j) = g_i . o_i
    for (int t = 0; t < kAttentionPerLane; ++t)
      part += gi[t] * o[t] / l;
    float D = warpSum(part);
    for (int64_t j = 0; j <= row - first; ++j) {
      float s = rowDot(qi, kh + j * ldkv, dim, w.lane);
      float dp = rowDot(gi, vh + j * ldkv, dim, w.lane);
      float ds = expf(s * scale - m) / l * (dp - D) * scale;
      addScaledRow(dqi, ds, kh + j * ldkv, dim, w.lane);
    }
    storeSlots(dqi, dim, w.lane, dq + qRow);
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
                                            float scale, bool seqMajor,
                                            const int32_t *positions) {
  WarpIndex w = warpIndex();
  int64_t group = heads / kvHeads;
  const int64_t ldq = seqMajor ? heads * dim : dim;
  for (int64_t jj = w.warp; jj < bkv * seq; jj += w.warps) {
    int64_t kvh = jj / seq, j = jj % seq;
    const int64_t kvRow = headRow(kvh, j, kvHeads, seq, dim, seqMajor);
    float kj[kAttentionPerLane], vj[kAttentionPerLane], dkj[kAttentionPerLane] = {},
        dvj[kAttentionPerLane] = {};
    loadRow(k + kvRow, dim, w.lane, kj);
    loadRow(v + kvRow, dim, w.lane, vj);
    for (int64_t m = 0; m < group; ++m) {
      int64_t head = (kvh / kvHeads) * heads + (kvh % kvHeads) * group + m;
      const int64_t q0 = headRow(head, 0, heads, seq, dim, seqMajor);
      const float *qh = q + q0, *gh = g + q0;
      const float *st = stats + 3 * head * seq;
      for (int64_t i = j; i < seq; ++i) {
        if (firstKey(positions, kvh / kvHeads, i, seq) > j)
          continue; // key j is in an earlier document than query i
        const float *qi = qh + i * ldq, *gi = gh + i * ldq;
        float s = rowDot(kj, qi, dim, w.lane);
        float dp = rowDot(vj, gi, dim, w.lane);
        float p = expf(s * scale - st[3 * i]) / st[3 * i + 1];
        float ds = p * (dp - st[3 * i + 2]) * scale;
        addScaledRow(dvj, p, gi, dim, w.lane);
        addScaledRow(dkj, ds, qi, dim, w.lane);
      }
    }
    storeSlots(dkj, dim, w.lane, dk + kvRow);
    storeSlots(dvj, dim, w.lane, dv + kvRow);
  }
}

// ---- Ring attention blocks (context parallelism) -----------------------------------
/// The first key of a ring block that query `row` of batch entry `b` sees:
/// 0, or with packed documents firstKey[b * sq + row] clamped to [0, n].
__device__ int64_t blockFirstKey(const int32_t *firstKey, int64_t b, int64_t row, int64_t sq,
                                 int64_t n) {
  if (!firstKey)
    return 0;
  const int64_t lo = firstKey[b * sq + row];
  return lo < 0 ? 0 : lo > n ? n : lo;
}

/// One block of keys / values into the online softmax of the query rows: one
/// warp per query row (b, head, i) of q [B, H, sq, D], keys j of the block it
/// may see (j <= i when `causal`), acc (unnormalized), rowMax and rowSum
/// updated in place (kernels/cpu's attentionBlock).
__global__ void attentionBlockKernel(const float *q, const float *k, const float *v, int64_t bh,
                                     int64_t heads, int64_t kvHeads, int64_t sq, int64_t keys,
                                     int64_t dim, float scale, bool causal, float *acc,
                                     float *rowMax, float *rowSum, const int32_t *firstKey) {
  WarpIndex w = warpIndex();
  for (int64_t i = w.warp; i < bh * sq; i += w.warps) {
    int64_t head = i / sq, row = i % sq, kvh = kvHeadOf(head, heads, kvHeads);
    const int64_t n = causal ? (row + 1 < keys ? row + 1 : keys) : keys;
    const int64_t lo = blockFirstKey(firstKey, head / heads, row, sq, n);
    if (lo >= n)
      continue; // the row's document starts after this block
    const float *kh = k + (kvh * keys + lo) * dim, *vh = v + (kvh * keys + lo) * dim;
    float qi[kAttentionPerLane], a[kAttentionPerLane];
    loadRow(q + i * dim, dim, w.lane, qi);
    loadRow(acc + i * dim, dim, w.lane, a);
    float m = rowMax[i], l = rowSum[i];
    attendKeys(qi, kh, vh, n - lo, dim, dim, w.lane, scale, a, m, l);
    storeSlots(a, dim, w.lane, acc + i * dim);
    __syncwarp();
    if (w.lane == 0) {
      rowMax[i] = m;
      rowSum[i] = l;
    }
  }
}

/// The block's probability p_ij and score gradient ds_ij from the rows'
/// log-sum-exp over every block (kernels/cpu's attentionBlockGrad).
__device__ void blockGradTerms(float s, float dp, float lse, float delta, float scale, float &p,
                               float &ds) {
  p = expf(fminf(s * scale - lse, 0.0f));
  ds = p * (dp - delta) * scale;
}

/// Its gradient, pass 1: one warp per query row adds the block's share to dq.
__global__ void attentionBlockGradQKernel(const float *q, const float *k, const float *v,
                                          const float *o, const float *g, const float *lse,
                                          int64_t bh, int64_t heads, int64_t kvHeads, int64_t sq,
                                          int64_t keys, int64_t dim, float scale, bool causal,
                                          float *dq, const int32_t *firstKey) {
  WarpIndex w = warpIndex();
  for (int64_t i = w.warp; i < bh * sq; i += w.warps) {
    int64_t head = i / sq, row = i % sq, kvh = kvHeadOf(head, heads, kvHeads);
    const float *kh = k + kvh * keys * dim, *vh = v + kvh * keys * dim;
    const int64_t n = causal ? (row + 1 < keys ? row + 1 : keys) : keys;
    const int64_t lo = blockFirstKey(firstKey, head / heads, row, sq, n);
    float qi[kAttentionPerLane], gi[kAttentionPerLane], dqi[kAttentionPerLane];
    loadRow(q + i * dim, dim, w.lane, qi);
    loadRow(g + i * dim, dim, w.lane, gi);
    loadRow(dq + i * dim, dim, w.lane, dqi);
    const float delta = rowDot(gi, o + i * dim, dim, w.lane);
    for (int64_t j = lo; j < n; ++j) {
      float p, ds;
      blockGradTerms(rowDot(qi, kh + j * dim, dim, w.lane), rowDot(gi, vh + j * dim, dim, w.lane),
                     lse[i], delta, scale, p, ds);
      addScaledRow(dqi, ds, kh + j * dim, dim, w.lane);
    }
    storeSlots(dqi, dim, w.lane, dq + i * dim);
  }
}

/// Pass 2: one warp per key row j of a kv head adds the block's share to dk_j
/// and dv_j over the query rows that see it (i >= j when `causal`) of every
/// query head it serves (no atomics, deterministic).
__global__ void attentionBlockGradKVKernel(const float *q, const float *k, const float *v,
                                           const float *o, const float *g, const float *lse,
                                           int64_t bkv, int64_t heads, int64_t kvHeads,
                                           int64_t sq, int64_t keys, int64_t dim, float scale,
                                           bool causal, float *dk, float *dv,
                                           const int32_t *firstKey) {
  WarpIndex w = warpIndex();
  const int64_t group = heads / kvHeads;
  for (int64_t jj = w.warp; jj < bkv * keys; jj += w.warps) {
    int64_t kvh = jj / keys, j = jj % keys;
    float kj[kAttentionPerLane], vj[kAttentionPerLane], dkj[kAttentionPerLane],
        dvj[kAttentionPerLane];
    loadRow(k + jj * dim, dim, w.lane, kj);
    loadRow(v + jj * dim, dim, w.lane, vj);
    loadRow(dk + jj * dim, dim, w.lane, dkj);
    loadRow(dv + jj * dim, dim, w.lane, dvj);
    for (int64_t h = 0; h < group; ++h) {
      int64_t head = (kvh / kvHeads) * heads + (kvh % kvHeads) * group + h;
      for (int64_t i = causal ? j : 0; i < sq; ++i) {
        if (blockFirstKey(firstKey, head / heads, i, sq, keys) > j)
          continue; // key j precedes query i's document
        const int64_t r = head * sq + i;
        const float *qi = q + r * dim, *gi = g + r * dim;
        float gs[kAttentionPerLane];
        loadRow(gi, dim, w.lane, gs);
        const float delta = rowDot(gs, o + r * dim, dim, w.lane); // g_i . o_i
        float p, ds;
        blockGradTerms(rowDot(kj, qi, dim, w.lane), rowDot(vj, gi, dim, w.lane), lse[r], delta,
                       scale, p, ds);
        addScaledRow(dvj, p, gi, dim, w.lane);
        addScaledRow(dkj, ds, qi, dim, w.lane);
      }
    }
    storeSlots(dkj, dim, w.lane, dk + jj * dim);
    storeSlots(dvj, dim, w.lane, dv + jj * dim);
  }
}

// ---- Attention over a key/value cache (decode plans) -------------------------------
/// Writes the new tokens' keys and values at their positions: one thread per
/// element of k / v [batch, kvHeads, tokens, dim].
template <typename T>
__global__ void cacheWriteKernel(const T *k, const T *v, T *kc, T *vc,
                                 const int32_t *pos, int64_t batch, int64_t kvHeads,
                                 int64_t tokens, int64_t context, int64_t dim, ErrorRecord *err) {
  PTC_GRID_LOOP(i, batch * kvHeads * tokens * dim) {
    int64_t d = i % dim, t = (i / dim) % tokens, h = (i / (dim * tokens)) % kvHeads,
            b = i / (dim * tokens * kvHeads);
    int64_t p = pos[b * tokens + t];
    if (p < 0 || p >= context) {
      if (d == 0 && h == 0)
        recordError(err, kBadPosition, p, b * tokens + t, context);
      continue;
    }
    int64_t row = ((b * kvHeads + h) * context + p) * dim + d;
    kc[row] = k[i];
    vc[row] = v[i];
  }
}

/// One warp per query row (b, head, t): online softmax over cache rows
/// 0..positions[b, t].
template <typename T>
__global__ void cachedAttentionKernel(const T *q, const T *kc, const T *vc,
                                      const int32_t *pos, T *out, int64_t batch,
                                      int64_t heads, int64_t kvHeads, int64_t tokens,
                                      int64_t context, int64_t dim, float scale) {
  WarpIndex w = warpIndex();
  for (int64_t i = w.warp; i < batch * heads * tokens; i += w.warps) {
    int64_t head = i / tokens, t = i % tokens, b = head / heads;
    int64_t p = pos[b * tokens + t];
    if (p < 0 || p >= context)
      continue; // recorded by cacheWriteKernel
    int64_t kvh = kvHeadOf(head, heads, kvHeads);
    const T *kh = kc + kvh * context * dim, *vh = vc + kvh * context * dim;
    float qi[kAttentionPerLane], acc[kAttentionPerLane] = {};
    loadRow(q + i * dim, dim, w.lane, qi);
    float m, l;
    attendRow(qi, kh, vh, p, dim, dim, w.lane, scale, acc, m, l);
    storeRow(acc, l, dim, w.lane, out + i * dim);
  }
}

} // namespace

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


void causalAttention(const float *q, const float *k, const float *v, float *out, int64_t batch,
                     int64_t heads, int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                     bool seqMajor, void *stream, const int32_t *positions, float *lse) {
  int64_t bh = batch * heads;
  causalAttentionKernel<<<warpBlocksFor(bh * seq), 128, 0, S(stream)>>>(
      q, k, v, out, bh, heads, kvHeads, seq, dim, scale, seqMajor, positions, lse);
}

void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, int64_t batch, int64_t heads,
                         int64_t kvHeads, int64_t seq, int64_t dim, float scale,
                         bool seqMajor, float *rowStats, void *stream,
                         const int32_t *positions, const float *savedO, const float *savedLse) {
  int64_t bh = batch * heads, bkv = batch * kvHeads;
  causalAttentionGradQKernel<<<warpBlocksFor(bh * seq), 128, 0, S(stream)>>>(
      q, k, v, g, dq, rowStats, bh, heads, kvHeads, seq, dim, scale, seqMajor, positions, savedO,
      savedLse);
  causalAttentionGradKVKernel<<<warpBlocksFor(bkv * seq), 128, 0, S(stream)>>>(
      q, k, v, g, rowStats, dk, dv, bkv, heads, kvHeads, seq, dim, scale, seqMajor, positions);
}

void attentionBlock(const float *q, const float *k, const float *v, int64_t batch,
                    int64_t heads, int64_t kvHeads, int64_t sq, int64_t keys, int64_t dim,
                    float scale, bool causal, float *acc, float *rowMax, float *rowSum,
                    void *stream, const int32_t *firstKey) {
  int64_t bh = batch * heads;
  if (bh * sq == 0)
    return;
  attentionBlockKernel<<<warpBlocksFor(bh * sq), 128, 0, S(stream)>>>(
      q, k, v, bh, heads, kvHeads, sq, keys, dim, scale, causal, acc, rowMax, rowSum, firstKey);
}

void attentionBlockGrad(const float *q, const float *k, const float *v, const float *o,
                        const float *g, const float *lse, int64_t batch, int64_t heads,
                        int64_t kvHeads, int64_t sq, int64_t keys, int64_t dim, float scale,
                        bool causal, float *dq, float *dk, float *dv, void *stream,
                        const int32_t *firstKey) {
  int64_t bh = batch * heads, bkv = batch * kvHeads;
  if (bh * sq == 0 || bkv * keys == 0)
    return;
  attentionBlockGradQKernel<<<warpBlocksFor(bh * sq), 128, 0, S(stream)>>>(
      q, k, v, o, g, lse, bh, heads, kvHeads, sq, keys, dim, scale, causal, dq, firstKey);
  attentionBlockGradKVKernel<<<warpBlocksFor(bkv * keys), 128, 0, S(stream)>>>(
      q, k, v, o, g, lse, bkv, heads, kvHeads, sq, keys, dim, scale, causal, dk, dv, firstKey);
}

namespace {
/// The dense column blocks of a fused projection: q [rows, qCols], k and v
/// [rows, kvCols], `elements` in all.
struct FusedBlocks {
  int64_t rows, qCols, kvCols, elements;
};
FusedBlocks fusedBlocks(const FusedQkvDims &f) {
  const AttentionDims &a = f.dims;
  const int64_t rows = a.batch * a.seq, qCols = a.heads * a.dim, kvCols = a.kvHeads * a.dim;
  return {rows, qCols, kvCols, rows * (qCols + 2 * kvCols)};
}

/// Between qkv [rows, width] and its dense column blocks q [rows, heads * dim],
/// k and v [rows, kvHeads * dim]: out of qkv (`toBlocks`) or back into it.
KernelResult copyColumns(float *qkvIn, const FusedQkvDims &f, float *q, float *k, float *v,
                         bool toBlocks, const KernelCall &c) {
  const AttentionDims &a = f.dims;
  const size_t rows = static_cast<size_t>(a.batch * a.seq), pitch = static_cast<size_t>(f.width) * 4;
  const int64_t offsets[3] = {0, f.kOffset, f.vOffset};
  const int64_t cols[3] = {a.heads * a.dim, a.kvHeads * a.dim, a.kvHeads * a.dim};
  float *blocks[3] = {q, k, v};
  for (int i = 0; i < 3; ++i) {
    const size_t width = static_cast<size_t>(cols[i]) * 4;
    float *column = qkvIn + offsets[i];
    cudaError_t e =
        toBlocks ? cudaMemcpy2DAsync(blocks[i], width, column, pitch, width, rows,
                                     cudaMemcpyDeviceToDevice, S(streamOf(c)))
                 : cudaMemcpy2DAsync(column, pitch, blocks[i], width, width, rows,
                                     cudaMemcpyDeviceToDevice, S(streamOf(c)));
    if (e != cudaSuccess)
      return KernelResult::error("copying the fused projection's column blocks: ",
                                 cudaGetErrorString(e));
  }
  return KernelResult::ok();
}
} // namespace

namespace {
// ---- bf16 / f16 attention on cuDNN ---------------------------------------------------
bool isAttentionGrad(OpKind op) {
  return op == OpKind::CausalAttentionGrad || op == OpKind::CausalAttentionQkvGrad;
}
bool isFusedQkv(OpKind op) {
  return op == OpKind::CausalAttentionQkv || op == OpKind::CausalAttentionQkvGrad;
}

/// A fused-projection call's [batch, seq, heads, dim] view: the forward's
/// result, the backward's incoming gradient (it gives heads and head size).
const TensorView &headsView(const KernelCall &c) {
  return c.op == OpKind::CausalAttentionQkv ? c.output(0) : c.input(1);
}

/// The cuDNN problem of a CausalAttention(Grad) or CausalAttentionQkv(Grad)
/// call: its sizes and the strides its layout gives q, k, v and o (the
/// forward's result, the backward's incoming gradient).
cudnn::AttentionProblem attentionProblemOf(const KernelCall &c) {
  const FloatType type = floatTypeOf(c.input(0).dtype);
  if (isFusedQkv(c.op)) {
    const FusedQkvDims f = fusedQkvDims(c.input(0), headsView(c));
    const AttentionDims &a = f.dims;
    const cudnn::HeadStrides column{a.seq * f.width, a.dim, f.width};
    const cudnn::HeadStrides o{a.seq * a.heads * a.dim, a.dim, a.heads * a.dim};
    return {type, a.batch, a.heads, a.kvHeads, a.seq, a.dim, column, column, column, o};
  }
  const AttentionDims a = attentionDims(c);
  auto strides = [&](int64_t heads) {
    return a.seqMajor ? cudnn::HeadStrides{a.seq * heads * a.dim, a.dim, heads * a.dim}
                      : cudnn::HeadStrides{heads * a.seq * a.dim, a.seq * a.dim, a.dim};
  };
  const cudnn::HeadStrides q = strides(a.heads), kv = strides(a.kvHeads);
  return {type, a.batch, a.heads, a.kvHeads, a.seq, a.dim, q, kv, kv, q};
}

/// The call's tensors: q, k, v, then o (forward) or the incoming gradient and
/// dq, dk, dv (backward), in place in the fused projection where it is one.
/// `stats`: the forward's row statistics (written by a forward that has them,
/// read with `savedO` by a gradient given them), else null.
struct AttentionPointers {
  const void *q, *k, *v, *g;
  void *o, *dq, *dk, *dv;
  const void *savedO;
  float *stats;
};
AttentionPointers attentionPointersOf(const KernelCall &c) {
  AttentionPointers p{};
  if (const SavedAttentionStats saved = savedAttentionStats(c)) {
    p.savedO = saved.result->data;
    p.stats = const_cast<float *>(saved.lse);
  } else {
    p.stats = attentionStatsOutput(c);
  }
  const int64_t bytes = dtypeBytes(c.input(0).dtype);
  if (isFusedQkv(c.op)) {
    const FusedQkvDims f = fusedQkvDims(c.input(0), headsView(c));
    const char *qkv = static_cast<const char *>(c.input(0).data);
    p.q = qkv;
    p.k = qkv + f.kOffset * bytes;
    p.v = qkv + f.vOffset * bytes;
    if (c.op == OpKind::CausalAttentionQkv) {
      p.o = c.output(0).data;
    } else {
      p.g = c.input(1).data;
      char *d = static_cast<char *>(c.output(0).data);
      p.dq = d;
      p.dk = d + f.kOffset * bytes;
      p.dv = d + f.vOffset * bytes;
    }
    return p;
  }
  p.q = c.input(0).data;
  p.k = c.input(1).data;
  p.v = c.input(2).data;
  if (c.op == OpKind::CausalAttention) {
    p.o = c.output(0).data;
  } else {
    p.g = c.input(3).data;
    p.dq = c.output(0).data;
    p.dk = c.output(1).data;
    p.dv = c.output(2).data;
  }
  return p;
}

/// Why the call's operands do not fit one attention problem in their stored
/// type (empty when they do): one element type (the f32 statistics aside), a
/// rank-4 query view.
std::string operandRefusal(const KernelCall &c) {
  const DType type = c.input(0).dtype;
  // The row statistics are f32 whatever the operands' type.
  const float *savedLse = savedAttentionStats(c).lse;
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.input(i).dtype != type && c.input(i).data != savedLse &&
        c.input(i).data != documentPositions(c))
      return "operands of different element types";
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.output(i).dtype != type && c.output(i).data != attentionStatsOutput(c))
      return "operands of different element types";
  if (const TensorView &heads = isFusedQkv(c.op) ? headsView(c) : c.input(0); heads.rank() != 4)
    return "a rank-" + std::to_string(heads.rank()) + " query";
  return {};
}

/// Why cuDNN cannot take this low-precision call (empty when it can): the
/// views' types and alignment, then cuDNN's own answer for the problem.
std::string cudnnRefusal(const KernelCall &c) {
  // Packed documents would take cuDNN's ragged (THD) offsets per document;
  // until they are wired, the tiled kernels apply the document mask.
  if (documentPositions(c))
    return "document positions (packed documents) are not wired to cuDNN's ragged layout yet";
  if (std::string why = operandRefusal(c); !why.empty())
    return why;
  const AttentionPointers p = attentionPointersOf(c);
  for (const void *ptr : {p.q, p.k, p.v, p.g, static_cast<const void *>(p.o),
                          static_cast<const void *>(p.dq), static_cast<const void *>(p.dk),
                          static_cast<const void *>(p.dv), p.savedO,
                          static_cast<const void *>(p.stats)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return "a tensor not aligned to 16 bytes";
  return cudnn::supports(attentionProblemOf(c), isAttentionGrad(c.op));
}

/// "Op [d0, d1, ...]": a call's op and its first input's shape (messages).
std::string callText(const KernelCall &c) {
  std::ostringstream text;
  text << opKindName(c.op) << " [";
  for (size_t i = 0; i < c.input(0).rank(); ++i)
    text << (i ? ", " : "") << c.input(0).dim(static_cast<int>(i));
  text << "]";
  return text.str();
}

/// Prints `message` on stderr the first time it comes (a fallback is named
/// once per op and shape, not per call).
void sayOnce(const std::string &message) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(message).second)
    std::fprintf(stderr, "%s\n", message.c_str());
}

// ---- Causal attention on CUDA cores, tiled (tiled_attention.h) ----------------------
/// CUDA's threads as tiled_attention.h's bodies ask for them.
struct CudaThreads {
  __device__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ int lane() const { return static_cast<int>(threadIdx.x) & 31; }
  __device__ int warp() const { return static_cast<int>(threadIdx.x) >> 5; }
  __device__ int64_t block() const { return blockIdx.x; }
  __device__ int64_t blocks() const { return gridDim.x; }
  __device__ void sync() const { __syncthreads(); }
  __device__ void syncWarp() const { __syncwarp(); }
  __device__ float shflXor(float v, int mask) const {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
};
/// f32 math on f32, bf16 or f16 storage.
template <typename T> struct CudaIo {
  using Elem = T;
  __device__ static float load(const T *p) { return toFloat(*p); }
  __device__ static void store(T *p, float x) { *p = fromFloat<T>(x); }
};

template <int kSlots, typename T>
__global__ void __launch_bounds__(tiled::kThreads) tiledForwardKernel(const tiled::Problem<T> a) {
  extern __shared__ float shared[];
  tiled::forward<kSlots, CudaIo<T>>(CudaThreads{}, a, shared);
}
template <int kSlots, typename T>
__global__ void __launch_bounds__(tiled::kThreads)
    tiledQueryGradKernel(const tiled::Problem<T> a) {
  extern __shared__ float shared[];
  tiled::backwardQuery<kSlots, CudaIo<T>>(CudaThreads{}, a, shared);
}
template <int kSlots, typename T>
__global__ void __launch_bounds__(tiled::kThreads) tiledKeyGradKernel(const tiled::Problem<T> a) {
  extern __shared__ float shared[];
  tiled::backwardKeys<kSlots, CudaIo<T>>(CudaThreads{}, a, shared);
}

/// The shared memory the tiled kernels' blocks take for head dimension `dim`.
int64_t tiledSharedBytes(int64_t dim) {
  return std::max(tiled::forwardSharedBytes(dim), tiled::backwardSharedBytes(dim));
}
/// Why the tiled kernels cannot run head dimension `dim` on the current
/// device (empty when they can): its blocks' shared memory limit (opt-in).
std::string tiledRefusal(int64_t dim) {
  if (dim < 1 || dim > tiled::kMaxDim)
    return "head dimension " + std::to_string(dim) + " (the tiled kernels take 1 to " +
           std::to_string(tiled::kMaxDim) + ")";
  // Without a device (a kernel coverage report from the plan alone), what the
  // built architectures (sm_80 and later: 163 KiB a block) give.
  int device = 0, limit = 163 * 1024;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return "the GPU's shared memory per block is unknown";
  if (tiledSharedBytes(dim) > limit)
    return std::to_string(tiledSharedBytes(dim)) + " bytes of shared memory a block (this GPU's "
           "limit is " + std::to_string(limit) + ")";
  return {};
}

/// The call as the tiled kernels' problem: its views in place (the fused
/// projection's column blocks too), in their stored type T.
template <typename T> tiled::Problem<T> tiledProblemOf(const KernelCall &c) {
  const AttentionPointers p = attentionPointersOf(c);
  tiled::Problem<T> a;
  AttentionDims d{};
  if (isFusedQkv(c.op)) {
    const FusedQkvDims f = fusedQkvDims(c.input(0), headsView(c));
    d = f.dims;
    a.qLayout = a.kvLayout = {d.seq * f.width, d.dim, f.width};
    a.oLayout = {d.seq * d.heads * d.dim, d.dim, d.heads * d.dim};
  } else {
    d = attentionDims(c);
    auto layout = [&](int64_t heads) {
      return d.seqMajor ? tiled::HeadLayout{d.seq * heads * d.dim, d.dim, heads * d.dim}
                        : tiled::HeadLayout{heads * d.seq * d.dim, d.seq * d.dim, d.dim};
    };
    a.qLayout = a.oLayout = layout(d.heads);
    a.kvLayout = layout(d.kvHeads);
  }
  a.batch = d.batch;
  a.heads = d.heads;
  a.kvHeads = d.kvHeads;
  a.seq = a.keys = d.seq;
  a.dim = d.dim;
  a.scale = static_cast<float>(attentionScale(c));
  a.positions = documentPositions(c);
  a.q = static_cast<const T *>(p.q);
  a.k = static_cast<const T *>(p.k);
  a.v = static_cast<const T *>(p.v);
  a.g = static_cast<const T *>(p.g);
  a.out = static_cast<T *>(p.o);
  a.dq = static_cast<T *>(p.dq);
  a.dk = static_cast<T *>(p.dk);
  a.dv = static_cast<T *>(p.dv);
  if (isAttentionGrad(c.op)) {
    a.savedO = static_cast<const T *>(p.savedO);
    a.savedLse = p.savedO ? p.stats : nullptr;
  } else {
    a.lse = p.stats;
  }
  return a;
}

/// Launches one tiled kernel over `items` (32-row tiles of a head), its
/// dynamic shared memory allowed past the default 48 KiB first.
template <typename T>
KernelResult launchTiled(void (*kernel)(tiled::Problem<T>), const tiled::Problem<T> &a,
                         int64_t items, int64_t sharedBytes, const KernelCall &c,
                         const char *what) {
  if (items == 0)
    return KernelResult::ok();
  if (sharedBytes > 48 * 1024)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(sharedBytes));
        e != cudaSuccess)
      return KernelResult::error(callText(c), ": the tiled attention ", what, ": ", sharedBytes,
                                 " bytes of shared memory: ", cudaGetErrorString(e));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(items, 1 << 20));
  kernel<<<grid, tiled::kThreads, static_cast<size_t>(sharedBytes), S(streamOf(c))>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return KernelResult::error(callText(c), ": launching the tiled attention ", what, ": ",
                               cudaGetErrorString(e));
  return KernelResult::ok();
}

/// The tiled kernels on `a`: the forward, or the backward's query then key
/// pass (`grad`), with the backward's row statistics in kernel scratch.
template <typename T>
KernelResult launchTiledPasses(tiled::Problem<T> a, bool grad, const KernelCall &c) {
  const int64_t queryItems = a.batch * a.heads * ((a.seq + tiled::kTile - 1) / tiled::kTile),
                keyItems = a.batch * a.kvHeads * ((a.keys + tiled::kTile - 1) / tiled::kTile);
  if (!grad)
    return tiled::withSlots(a.dim, [&](auto slots) {
      return launchTiled(tiledForwardKernel<decltype(slots)::value, T>, a, queryItems,
                         tiled::forwardSharedBytes(a.dim), c, "forward");
    });
  const int64_t bytes = 2 * a.batch * a.heads * a.seq * 4; // (log-sum-exp, D) per row
  a.stats = static_cast<float *>(scratch(c, bytes));
  if (!a.stats)
    return scratchFailure(c, bytes);
  return tiled::withSlots(a.dim, [&](auto slots) {
    constexpr int kSlots = decltype(slots)::value;
    const int64_t shared = tiled::backwardSharedBytes(a.dim);
    if (KernelResult r = launchTiled(tiledQueryGradKernel<kSlots, T>, a, queryItems, shared, c,
                                     "backward (queries)");
        !r.isOk())
      return r;
    return launchTiled(tiledKeyGradKernel<kSlots, T>, a, keyItems, shared, c, "backward (keys)");
  });
}

/// A causal attention call (any of the four ops) on the tiled kernels, in
/// its stored type.
KernelResult runTiledAttention(const KernelCall &c) {
  return withFloatType(c.input(0).dtype, [&](auto tag) {
    return launchTiledPasses(tiledProblemOf<decltype(tag)>(c), isAttentionGrad(c.op), c);
  });
}

/// A ring attention block (f32, kernel_call.h's AttentionBlock(Grad)) on the
/// tiled kernels: the forward continues the rows' online softmax in acc,
/// rowMax, rowSum; the gradient, from the rows' global result and
/// log-sum-exp, adds to dq, dk and dv.
KernelResult runTiledBlock(const KernelCall &c, bool grad) {
  const TensorView &q = c.input(0), &k = c.input(1);
  tiled::Problem<float> a;
  a.batch = q.dim(0);
  a.heads = q.dim(1);
  a.kvHeads = k.dim(1);
  a.seq = q.dim(2);
  a.keys = k.dim(2);
  a.dim = q.dim(3);
  a.scale = static_cast<float>(c.attr(attr::AttentionBlock::scale));
  a.causal = c.attr(attr::AttentionBlock::causal) != 0;
  a.qLayout = a.oLayout = {a.heads * a.seq * a.dim, a.seq * a.dim, a.dim};
  a.kvLayout = {a.kvHeads * a.keys * a.dim, a.keys * a.dim, a.dim};
  a.q = q.f32();
  a.k = k.f32();
  a.v = c.input(2).f32();
  if (!grad) {
    a.out = c.output(0).f32();
    a.rowMax = c.output(1).f32();
    a.rowSum = c.output(2).f32();
    a.firstKeys = c.numInputs > 3 ? c.input(3).i32() : nullptr;
  } else {
    a.savedO = c.input(3).f32();
    a.g = c.input(4).f32();
    a.savedLse = c.input(5).f32();
    a.dq = c.output(0).f32();
    a.dk = c.output(1).f32();
    a.dv = c.output(2).f32();
    a.accumulate = true;
    a.firstKeys = c.numInputs > 6 ? c.input(6).i32() : nullptr;
  }
  return launchTiledPasses(a, grad, c);
}

/// Whether a ring block (f32, off cuDNN) runs on the tiled kernels: a
/// [batch, heads, rows, dim] block they take on this GPU (else the warp
/// kernels, said once).
bool blockTiled(const KernelCall &c) {
  if (c.input(0).rank() != 4 || c.input(1).rank() != 4)
    return false;
  const std::string why = tiledRefusal(c.input(0).dim(3));
  if (why.empty())
    return true;
  if (c.input(0).dim(3) <= tiled::kMaxDim)
    sayOnce("ptc: ring attention's " + callText(c) + ": the tiled attention kernels cannot take "
            "it (" + why + "); it runs on the f32 warp kernels instead (slow)");
  return false;
}

/// The head dimension of an attention call (any of the four ops).
int64_t headDimOf(const KernelCall &c) {
  const TensorView &heads = isFusedQkv(c.op) ? headsView(c) : c.input(0);
  return heads.rank() == 4 ? heads.dim(3) : 0;
}

/// How an attention call runs: cuDNN's fused attention (bf16 / f16 it
/// takes), the tiled kernels in the call's stored type (f32, and bf16 / f16
/// that cuDNN refuses: packed documents, a head size or alignment it does not
/// take), the f32 warp kernels (where the tiled kernels' shared memory
/// exceeds the GPU's), or widened to f32 by the runtime (then one of those).
/// Each fallback is said once per op and shape, with why.
enum class AttentionRoute { Cudnn, Tiled, Warp, Widened };
AttentionRoute attentionRoute(const KernelCall &c) {
  const std::string tiledWhy = tiledRefusal(headDimOf(c));
  if (onlyF32(c)) {
    // (A head no kernel takes: the warp entry's shape check names it.)
    if (const int64_t dim = headDimOf(c); tiledWhy.empty() || dim < 1 || dim > tiled::kMaxDim)
      return tiledWhy.empty() ? AttentionRoute::Tiled : AttentionRoute::Warp;
    sayOnce("ptc: " + callText(c) + " f32: the tiled attention kernels cannot take it (" +
            tiledWhy + "); it runs on the f32 warp kernels instead (slow)");
    return AttentionRoute::Warp;
  }
  const std::string why = cudnnRefusal(c);
  if (why.empty())
    return AttentionRoute::Cudnn;
  const char *type = c.input(0).dtype == DType::BF16 ? " bf16" : " f16";
  const std::string operandWhy = operandRefusal(c);
  if (tiledWhy.empty() && operandWhy.empty()) {
    sayOnce("ptc: " + callText(c) + type + ": cuDNN fused attention refused it (" + why +
            "); it runs on the tiled CUDA-core kernels (f32 math on the" + type +
            " storage, no tensor cores) instead");
    return AttentionRoute::Tiled;
  }
  sayOnce("ptc: " + callText(c) + type + ": cuDNN fused attention refused it (" + why +
          ") and the tiled kernels too (" + (operandWhy.empty() ? tiledWhy : operandWhy) +
          "); it runs widened to f32 instead (slow)");
  return AttentionRoute::Widened;
}

/// The attention entries' element types: what attentionRoute runs natively.
bool acceptsAttention(const KernelCall &c) {
  return attentionRoute(c) != AttentionRoute::Widened;
}

KernelResult runCudnnAttention(const KernelCall &c);

/// Runs an attention call on cuDNN or the tiled kernels as attentionRoute
/// says; nothing when it takes the f32 warp kernels (the entry's own code).
std::optional<KernelResult> runRouted(const KernelCall &c) {
  switch (attentionRoute(c)) {
  case AttentionRoute::Cudnn:
    return runCudnnAttention(c);
  case AttentionRoute::Tiled:
    return runTiledAttention(c);
  case AttentionRoute::Widened:
    return KernelResult::error(callText(c), ": the CUDA attention kernels do not take its "
                                            "operands as stored (the runtime widens them)");
  case AttentionRoute::Warp:
    break;
  }
  return std::nullopt;
}

// ---- Ring attention's blocks on cuDNN -------------------------------------------------
// The ring carries its blocks in f32; in a bf16 / f16 plan (the call's
// `storage`) they hold values of that type, so a block runs on cuDNN's fused
// attention over narrowed copies (exact for q, k, v and the incoming
// gradient; the forward's result rounded as the plan stores it), and its
// output is merged into the f32 accumulators by the online-softmax rule.

/// f32 -> bf16 / f16 (`type`: a FloatType's value), rounded to nearest even.
__global__ void narrowKernel(const float *x, void *y, int type, int64_t n) {
  PTC_GRID_LOOP(i, n) storeFloat(y, type, i, x[i]);
}
/// acc = acc * exp(mx - m') + o * exp(lse - m') with m' = max(mx, lse), per
/// row of `dim` elements: a block's normalized output and log-sum-exp merged
/// into the unnormalized accumulator (mx and sum follow in mergeRowsKernel).
__global__ void mergeOutputKernel(const void *o, int type, const float *lse, const float *mx,
                                  float *acc, int64_t n, int64_t dim) {
  PTC_GRID_LOOP(i, n) {
    const int64_t r = i / dim;
    const float m = fmaxf(mx[r], lse[r]);
    acc[i] = acc[i] * expf(mx[r] - m) + loadFloat(o, type, i) * expf(lse[r] - m);
  }
}
/// sum = sum * exp(mx - m') + exp(lse - m'), mx = m', per row.
__global__ void mergeRowsKernel(const float *lse, float *mx, float *sum, int64_t rows) {
  PTC_GRID_LOOP(r, rows) {
    const float m = fmaxf(mx[r], lse[r]);
    sum[r] = sum[r] * expf(mx[r] - m) + expf(lse[r] - m);
    mx[r] = m;
  }
}
/// acc += x (x of `type`).
__global__ void accumulateKernel(const void *x, int type, float *acc, int64_t n) {
  PTC_GRID_LOOP(i, n) acc[i] += loadFloat(x, type, i);
}

/// A block call's cuDNN problem: packed [batch, heads, len, dim] parts in the
/// plan's storage type, causal on the diagonal.
cudnn::AttentionProblem blockProblemOf(const KernelCall &c) {
  const TensorView &q = c.input(0), &k = c.input(1);
  const int64_t b = q.dim(0), h = q.dim(1), hk = k.dim(1), len = q.dim(2), d = q.dim(3);
  const FloatType type =
      c.attr(attr::AttentionBlock::storage) == static_cast<int64_t>(DType::F16) ? FloatType::F16
                                                                                : FloatType::BF16;
  const cudnn::HeadStrides qs{h * len * d, len * d, d}, kvs{hk * len * d, len * d, d};
  cudnn::AttentionProblem p{type, b, h, hk, len, d, qs, kvs, kvs, qs};
  p.causal = c.attr(attr::AttentionBlock::causal) != 0;
  return p;
}

/// Whether a ring block runs on cuDNN: a plan stored in bf16 / f16, no
/// document mask (the rows' first keys), and cuDNN taking the problem (else
/// it says once why, and the f32 tiled kernels run it).
bool blockOnCudnn(const KernelCall &c, bool grad) {
  const int64_t storage = c.attr(attr::AttentionBlock::storage);
  if (storage != static_cast<int64_t>(DType::BF16) && storage != static_cast<int64_t>(DType::F16))
    return false;
  std::string why;
  if (c.numInputs > (grad ? 6u : 3u))
    why = "packed documents (each row's first key) are not wired to cuDNN";
  else if (c.input(0).rank() != 4 || c.input(1).rank() != 4)
    why = "a block that is not [batch, heads, rows, dim]";
  else
    why = cudnn::supports(blockProblemOf(c), grad);
  if (why.empty())
    return true;
  sayOnce("ptc: ring attention's " + callText(c) +
          (c.attr(attr::AttentionBlock::causal) ? " causal" : "") +
          ": cuDNN fused attention refused it (" + why +
          "); it runs on the f32 tiled CUDA-core kernels instead");
  return false;
}

/// Scratch carved in 256-byte aligned pieces.
struct Carver {
  char *next;
  void *take(int64_t bytes) {
    void *p = next;
    next += (bytes + 255) / 256 * 256;
    return p;
  }
};
int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

/// A ring block forward on cuDNN: (q, k, v) -> (acc, mx, sum) merged.
KernelResult runCudnnBlock(const KernelCall &c) {
  const cudnn::AttentionProblem p = blockProblemOf(c);
  const int64_t qn = c.input(0).elements, kvn = c.input(1).elements, rows = qn / p.dim;
  const int type = static_cast<int>(p.type);
  const int64_t bytes = 2 * aligned(qn * 2) + 2 * aligned(kvn * 2) + aligned(rows * 4) +
                        cudnn::forwardScratchBytes(p, /*stats=*/true);
  void *work = scratch(c, bytes);
  if (!work)
    return scratchFailure(c, bytes);
  Carver carve{static_cast<char *>(work)};
  void *q = carve.take(qn * 2), *k = carve.take(kvn * 2), *v = carve.take(kvn * 2),
       *o = carve.take(qn * 2);
  auto *lse = static_cast<float *>(carve.take(rows * 4));
  cudaStream_t stream = S(streamOf(c));
  narrowKernel<<<gridFor(qn), kThreads, 0, stream>>>(c.input(0).f32(), q, type, qn);
  narrowKernel<<<gridFor(kvn), kThreads, 0, stream>>>(c.input(1).f32(), k, type, kvn);
  narrowKernel<<<gridFor(kvn), kThreads, 0, stream>>>(c.input(2).f32(), v, type, kvn);
  if (KernelResult r = cudnn::forward(p, q, k, v, o, lse, attentionScale(c), carve.next,
                                      streamOf(c));
      !r.isOk())
    return r;
  float *acc = c.output(0).f32(), *mx = c.output(1).f32(), *sum = c.output(2).f32();
  mergeOutputKernel<<<gridFor(qn), kThreads, 0, stream>>>(o, type, lse, mx, acc, qn, p.dim);
  mergeRowsKernel<<<gridFor(rows), kThreads, 0, stream>>>(lse, mx, sum, rows);
  return KernelResult::ok();
}

/// A ring block's gradient on cuDNN: (q, k, v, o, g, lse) -> dq, dk, dv added
/// to, from the rows' global result and log-sum-exp (cuDNN's deterministic
/// backward alone).
KernelResult runCudnnBlockGrad(const KernelCall &c) {
  const cudnn::AttentionProblem p = blockProblemOf(c);
  const int64_t qn = c.input(0).elements, kvn = c.input(1).elements;
  const int type = static_cast<int>(p.type);
  const int64_t bytes = 4 * aligned(qn * 2) + 4 * aligned(kvn * 2) +
                        cudnn::backwardScratchBytes(p, /*stats=*/true);
  void *work = scratch(c, bytes);
  if (!work)
    return scratchFailure(c, bytes);
  Carver carve{static_cast<char *>(work)};
  void *q = carve.take(qn * 2), *k = carve.take(kvn * 2), *v = carve.take(kvn * 2),
       *o = carve.take(qn * 2), *g = carve.take(qn * 2), *dq = carve.take(qn * 2),
       *dk = carve.take(kvn * 2), *dv = carve.take(kvn * 2);
  cudaStream_t stream = S(streamOf(c));
  for (auto [from, to, n] : {std::tuple{c.input(0).f32(), q, qn}, {c.input(1).f32(), k, kvn},
                             {c.input(2).f32(), v, kvn}, {c.input(3).f32(), o, qn},
                             {c.input(4).f32(), g, qn}})
    narrowKernel<<<gridFor(n), kThreads, 0, stream>>>(from, to, type, n);
  if (KernelResult r = cudnn::backward(p, q, k, v, o, c.input(5).f32(), g, dq, dk, dv,
                                       attentionScale(c), carve.next, streamOf(c));
      !r.isOk())
    return r;
  for (auto [from, to, n] : {std::tuple{dq, c.output(0).f32(), qn}, {dk, c.output(1).f32(), kvn},
                             {dv, c.output(2).f32(), kvn}})
    accumulateKernel<<<gridFor(n), kThreads, 0, stream>>>(from, type, to, n);
  return KernelResult::ok();
}

/// A bf16 / f16 attention call on cuDNN.
KernelResult runCudnnAttention(const KernelCall &c) {
  const cudnn::AttentionProblem problem = attentionProblemOf(c);
  const AttentionPointers p = attentionPointersOf(c);
  const bool grad = isAttentionGrad(c.op), stats = p.stats != nullptr;
  const int64_t bytes = grad ? cudnn::backwardScratchBytes(problem, stats)
                             : cudnn::forwardScratchBytes(problem, stats);
  void *work = scratch(c, bytes);
  if (!work)
    return scratchFailure(c, bytes);
  if (grad)
    return cudnn::backward(problem, p.q, p.k, p.v, p.savedO, p.stats, p.g, p.dq, p.dk, p.dv,
                           attentionScale(c), work, streamOf(c));
  return cudnn::forward(problem, p.q, p.k, p.v, p.o, p.stats, attentionScale(c), work,
                        streamOf(c));
}
} // namespace

namespace {
/// Whether a CachedAttention call is a prefill from position 0: several
/// tokens, each batch entry's at positions 0, 1, ... (read from the device:
/// one small copy and stream synchronization per layer of a prefill call,
/// none per decoded token).
bool prefillFromZero(const KernelCall &c) {
  const int64_t batch = c.input(0).dim(0), tokens = c.input(0).dim(2);
  if (tokens < 2)
    return false;
  std::vector<int32_t> pos(static_cast<size_t>(batch * tokens));
  if (cudaMemcpyAsync(pos.data(), c.input(5).data, pos.size() * 4, cudaMemcpyDeviceToHost,
                      S(streamOf(c))) != cudaSuccess ||
      cudaStreamSynchronize(S(streamOf(c))) != cudaSuccess)
    return false;
  for (size_t i = 0; i < pos.size(); ++i)
    if (pos[i] != static_cast<int32_t>(i % static_cast<size_t>(tokens)))
      return false;
  return true;
}

/// A prefill from position 0 reads exactly its own keys and values from the
/// cache: it is causal attention over q, k, v [batch, (kv)heads, tokens,
/// dim], run as a CausalAttention call (cuDNN's fused kernels on the tensor
/// cores in bf16 / f16, the tiled kernels in f32). Nothing when neither takes
/// it (the warp kernel over the cache runs it).
std::optional<KernelResult> runPrefill(const KernelCall &c) {
  if (!prefillFromZero(c))
    return std::nullopt;
  const TensorView in[3] = {c.input(0), c.input(1), c.input(2)};
  TensorView out[1] = {c.output(0)};
  const double floats[1] = {attentionScale(c)};
  const int64_t ints[1] = {0}; // seq_major = 0: [batch, heads, tokens, dim]
  KernelCall causal = makeKernelCall(OpKind::CausalAttention, in, out, ints, floats);
  causal.backend = c.backend;
  const AttentionRoute route = attentionRoute(causal);
  if (route == AttentionRoute::Cudnn)
    return runCudnnAttention(causal);
  if (route == AttentionRoute::Tiled)
    return runTiledAttention(causal);
  return std::nullopt;
}
} // namespace

std::string attentionLibrary() {
  return cudnn::libraryDescription() +
         " for bf16 / f16, tiled CUDA-core kernels for f32 and what cuDNN refuses";
}

void addAttentionKernels(KernelTable &t) {
  // Ring attention's blocks (kernel_call.h): the optional last input is the
  // rows' first keys.
  // In a bf16 / f16 plan, cuDNN's fused attention where it takes the block;
  // else the f32 tiled kernels (the warp kernels where their shared memory
  // does not fit the GPU).
  t.add(OpKind::AttentionBlock, [](const KernelCall &c) {
    if (blockOnCudnn(c, /*grad=*/false))
      return runCudnnBlock(c);
    if (blockTiled(c))
      return runTiledBlock(c, /*grad=*/false);
    const TensorView &q = c.input(0), &k = c.input(1);
    if (KernelResult r = attentionShapeSupported(q); !r.isOk())
      return r;
    attentionBlock(q.f32(), k.f32(), c.input(2).f32(), q.dim(0), q.dim(1), k.dim(1), q.dim(2),
                   k.dim(2), q.dim(3), c.attr(attr::AttentionBlock::scale), c.attr(attr::AttentionBlock::causal) != 0, c.output(0).f32(),
                   c.output(1).f32(), c.output(2).f32(), streamOf(c),
                   c.numInputs > 3 ? c.input(3).i32() : nullptr);
    return KernelResult::ok();
  });
  t.add(OpKind::AttentionBlockGrad, [](const KernelCall &c) {
    if (blockOnCudnn(c, /*grad=*/true))
      return runCudnnBlockGrad(c);
    if (blockTiled(c))
      return runTiledBlock(c, /*grad=*/true);
    const TensorView &q = c.input(0), &k = c.input(1);
    if (KernelResult r = attentionShapeSupported(q); !r.isOk())
      return r;
    attentionBlockGrad(q.f32(), k.f32(), c.input(2).f32(), c.input(3).f32(), c.input(4).f32(),
                       c.input(5).f32(), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                       q.dim(3), c.attr(attr::AttentionBlock::scale), c.attr(attr::AttentionBlock::causal) != 0, c.output(0).f32(),
                       c.output(1).f32(), c.output(2).f32(), streamOf(c),
                       c.numInputs > 6 ? c.input(6).i32() : nullptr);
    return KernelResult::ok();
  });
  t.add(OpKind::Softmax, [](const KernelCall &c) {
    softmax(c.input(0).f32(), c.output(0).f32(), *c.input(0).shape, c.attr(attr::Axis::axis),
            streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::SoftmaxGrad, [](const KernelCall &c) {
    softmaxGrad(c.input(0).f32(), c.input(1).f32(), c.output(0).f32(), *c.input(0).shape,
                c.attr(attr::Axis::axis), streamOf(c));
    return KernelResult::ok();
  });
  // q [batch, heads, seq, dim], k / v [batch, kvHeads, seq, dim]; with the
  // optional integer seq_major = 1, [batch, seq, heads (kvHeads), dim].
  // attentionRoute picks the kernels: cuDNN's fused attention (bf16 / f16 on
  // the views in place), the tiled kernels (f32, and bf16 / f16 cuDNN
  // refuses, on the views in place), else the f32 warp kernels below.
  t.add(OpKind::CausalAttention, [](const KernelCall &c) {
    if (std::optional<KernelResult> routed = runRouted(c))
      return *routed;
    const TensorView &q = c.input(0);
    if (KernelResult r = attentionShapeSupported(q); !r.isOk())
      return r;
    const AttentionDims a = attentionDims(c);
    causalAttention(q.f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(), a.batch,
                    a.heads, a.kvHeads, a.seq, a.dim, attentionScale(c), a.seqMajor, streamOf(c),
                    documentPositions(c), attentionStatsOutput(c));
    return KernelResult::ok();
  }, acceptsAttention);
  t.add(OpKind::CausalAttentionGrad, [](const KernelCall &c) {
    if (std::optional<KernelResult> routed = runRouted(c))
      return *routed;
    const TensorView &q = c.input(0);
    if (KernelResult r = attentionShapeSupported(q); !r.isOk())
      return r;
    const AttentionDims a = attentionDims(c);
    const int64_t bytes = 3 * a.batch * a.heads * a.seq * 4;
    auto *stats = static_cast<float *>(scratch(c, bytes));
    if (!stats)
      return scratchFailure(c, bytes);
    const SavedAttentionStats saved = savedAttentionStats(c);
    causalAttentionGrad(q.f32(), c.input(1).f32(), c.input(2).f32(), c.input(3).f32(),
                        c.output(0).f32(), c.output(1).f32(), c.output(2).f32(), a.batch, a.heads,
                        a.kvHeads, a.seq, a.dim, attentionScale(c), a.seqMajor, stats, streamOf(c),
                        documentPositions(c), saved ? saved.result->f32() : nullptr, saved.lse);
    return KernelResult::ok();
  }, acceptsAttention);
  // The fused projection's layout (qkv [batch, seq, width]): cuDNN and the
  // tiled kernels read the column blocks in place (and write the gradients
  // into theirs); for the warp kernels they are copied out to seq-major q,
  // k, v in scratch (and the gradients back in).
  t.add(OpKind::CausalAttentionQkv, [](const KernelCall &c) {
    if (std::optional<KernelResult> routed = runRouted(c))
      return *routed;
    const TensorView &qkv = c.input(0);
    // The result [batch, seq, heads, dim] carries the head size.
    if (KernelResult r = attentionShapeSupported(c.output(0)); !r.isOk())
      return r;
    const FusedQkvDims f = fusedQkvDims(qkv, c.output(0));
    const AttentionDims &a = f.dims;
    const FusedBlocks b = fusedBlocks(f);
    const int64_t bytes = b.elements * 4;
    auto *q = static_cast<float *>(scratch(c, bytes));
    if (!q)
      return scratchFailure(c, bytes);
    float *k = q + b.rows * b.qCols, *v = k + b.rows * b.kvCols;
    if (KernelResult r = copyColumns(qkv.f32(), f, q, k, v, true, c); !r.isOk())
      return r;
    causalAttention(q, k, v, c.output(0).f32(), a.batch, a.heads, a.kvHeads, a.seq, a.dim,
                    attentionScale(c), true, streamOf(c), documentPositions(c),
                    attentionStatsOutput(c));
    return KernelResult::ok();
  }, acceptsAttention);
  t.add(OpKind::CausalAttentionQkvGrad, [](const KernelCall &c) {
    if (std::optional<KernelResult> routed = runRouted(c))
      return *routed;
    const TensorView &qkv = c.input(0);
    // The incoming gradient [batch, seq, heads, dim] carries the head size.
    if (KernelResult r = attentionShapeSupported(c.input(1)); !r.isOk())
      return r;
    const FusedQkvDims f = fusedQkvDims(qkv, c.input(1));
    const AttentionDims &a = f.dims;
    const FusedBlocks b = fusedBlocks(f);
    const int64_t stats = 3 * a.batch * a.heads * a.seq, bytes = (2 * b.elements + stats) * 4;
    auto *q = static_cast<float *>(scratch(c, bytes));
    if (!q)
      return scratchFailure(c, bytes);
    float *k = q + b.rows * b.qCols, *v = k + b.rows * b.kvCols, *dq = q + b.elements;
    float *dk = dq + b.rows * b.qCols, *dv = dk + b.rows * b.kvCols, *rowStats = dq + b.elements;
    if (KernelResult r = copyColumns(qkv.f32(), f, q, k, v, true, c); !r.isOk())
      return r;
    const SavedAttentionStats saved = savedAttentionStats(c);
    causalAttentionGrad(q, k, v, c.input(1).f32(), dq, dk, dv, a.batch, a.heads, a.kvHeads,
                        a.seq, a.dim, attentionScale(c), true, rowStats, streamOf(c),
                        documentPositions(c), saved ? saved.result->f32() : nullptr, saved.lse);
    return copyColumns(c.output(0).f32(), f, dq, dk, dv, false, c);
  }, acceptsAttention);
  // Decode plans: q [batch, heads, tokens, dim], k / v [batch, kvHeads, tokens,
  // dim], caches [batch, kvHeads, context, dim] (outputs 1, 2; in place of
  // inputs 3, 4 in a plan), positions [batch, tokens]. The new keys and values
  // are written into the caches; a prefill from position 0 is then causal
  // attention over them (runPrefill: cuDNN's tensor cores in bf16 / f16);
  // else one warp per query row over the cache (no tensor cores), on the
  // stored type: bf16 caches are read as bf16.
  t.add(OpKind::CachedAttention, [](const KernelCall &c) {
    const TensorView &q = c.input(0), &k = c.input(1), &kcIn = c.input(3);
    if (KernelResult r = attentionShapeSupported(q); !r.isOk())
      return r;
    const TensorView &kc = c.output(1), &vc = c.output(2);
    for (auto [from, to] : {std::pair{&kcIn, &kc}, std::pair{&c.input(4), &vc}})
      if (from->data != to->data)
        cudaMemcpyAsync(to->data, from->data, static_cast<size_t>(from->bytes()),
                        cudaMemcpyDeviceToDevice, S(streamOf(c)));
    const int64_t batch = q.dim(0), kvHeads = k.dim(1), tokens = q.dim(2), dim = q.dim(3),
                  positions = kcIn.dim(2);
    const int32_t *pos = c.input(5).i32();
    withFloatType(q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (int64_t n = batch * kvHeads * tokens * dim; n > 0)
        cacheWriteKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
            inputAs<T>(c, 1), inputAs<T>(c, 2), outputAs<T>(c, 1), outputAs<T>(c, 2), pos, batch,
            kvHeads, tokens, positions, dim, context(c).err);
      return 0;
    });
    if (std::optional<KernelResult> prefilled = runPrefill(c))
      return *prefilled;
    withFloatType(q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (int64_t rows = batch * q.dim(1) * tokens; rows > 0)
        cachedAttentionKernel<<<warpBlocksFor(rows), 4 * kAttentionLanes, 0, S(streamOf(c))>>>(
            inputAs<T>(c, 0), outputAs<T>(c, 1), outputAs<T>(c, 2), pos, outputAs<T>(c, 0),
            batch, q.dim(1), kvHeads, tokens, positions, dim, static_cast<float>(attentionScale(c)));
      return 0;
    });
    return KernelResult::ok();
  }, [](const KernelCall &c) {
    // f32, bf16 or f16 queries, keys, values and caches (one type; the caches
    // are read in it, never widened whole), i32 positions (input 5).
    return oneFloatType(c, 5);
  });
}
} // namespace ptc::kernels::cuda
