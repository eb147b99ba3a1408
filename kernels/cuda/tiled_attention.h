// Causal attention on CUDA cores, tiled: the kernel bodies of the f32 plans'
// attention (and of bf16 / f16 calls cuDNN's fused attention refuses, read
// and written in their stored type with f32 math), forward and backward, and
// of ring attention's f32 blocks (a block of queries against a block of keys,
// causal or whole, continuing the rows' online softmax and adding to the
// gradients).
//
// A block of 8 warps takes 32 query rows (or, for the keys' gradients, 32 key
// rows) of one head; the other side's rows pass through shared memory 32 at a
// time, each lane of a warp scoring one of them against the warp's row: a
// tile's 32 scores come from one dot product per lane, not a warp reduction
// per key, and each tile read from global memory serves 32 rows. Online
// softmax (no seq x seq buffer), the softmax statistics (log-sum-exp) written
// by the forward and read by the backward, no atomics: dq by query tiles, dk
// and dv by key tiles, so a step is bitwise repeatable.
//
// The bodies are templates over the threads that run them (`Threads`: the
// thread, lane, warp and block indices, block and warp barriers, warp
// shuffles) and the stored element type (`Io`: load / store as f32), so that
// attention.cu runs them as CUDA kernels and the unit tests run the same code
// on the CPU (test/unit/SimtEmulator.h: a block's threads as host threads),
// against the CPU backend's attention. This header includes no CUDA header.
#ifndef PTC_KERNELS_CUDA_TILED_ATTENTION_H
#define PTC_KERNELS_CUDA_TILED_ATTENTION_H

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define PTC_SIMT __device__ __forceinline__
#define PTC_SIMT_AND_HOST __host__ __device__ __forceinline__
#define PTC_UNROLL _Pragma("unroll")
#else
#define PTC_UNROLL
#define PTC_SIMT inline
#define PTC_SIMT_AND_HOST inline
#endif
// Loops over a warp's rows and a lane's slots are unrolled: their arrays stay
// in registers.

namespace ptc::kernels::cuda::tiled {

/// Rows per tile (one per lane), warps per block, rows per warp.
constexpr int kTile = 32, kWarps = 8, kThreads = kWarps * 32, kRowsPerWarp = kTile / kWarps;

/// Where row `row` of head `head` of batch entry `batch` starts: element
/// strides (per-head [b, h, s, d], seq-major [b, s, h, d], or the column
/// blocks of a fused projection [b, s, width]).
struct HeadLayout {
  int64_t batch, head, row;
};

/// One attention call. Stored-type tensors: q, dq in `qLayout`; k, v, dk, dv
/// in `kvLayout`; the forward's result `out`, the incoming gradient `g` and
/// the forward's saved result `savedO` in `oLayout`. f32: `lse` ([batch,
/// heads, seq], the forward's log-sum-exp, may be null), `savedLse` (the
/// forward's, given to the backward with `savedO`; else the backward
/// recomputes them), `stats` (backward scratch: 2 floats per query row).
/// `positions` ([batch, seq], packed documents) or null.
/// `seq` query rows see `keys` key rows: with `causal`, key j is visible to
/// query i for j <= i only (the same positions). Ring blocks: `firstKeys`
/// ([batch, seq], packed documents: each query row's first key in the block,
/// clamped to what it sees) instead of positions; given `rowMax` and
/// `rowSum`, the forward continues each row's online softmax from them and
/// `out` (unnormalized) and writes them back; with `accumulate`, the backward
/// (given the saved statistics) adds to dq, dk and dv.
template <typename E> struct Problem {
  const E *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *savedO = nullptr;
  E *out = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *lse = nullptr, *stats = nullptr, *rowMax = nullptr, *rowSum = nullptr;
  const float *savedLse = nullptr;
  const int32_t *positions = nullptr, *firstKeys = nullptr;
  HeadLayout qLayout{}, kvLayout{}, oLayout{};
  int64_t batch = 0, heads = 0, kvHeads = 0, seq = 0, keys = 0, dim = 0;
  float scale = 1.0f;
  bool causal = true, accumulate = false;
};

/// Shared memory rows are `pitch` floats apart (odd: the lanes' reads of
/// different rows fall in different banks).
PTC_SIMT_AND_HOST int64_t pitch(int64_t dim) { return dim | 1; }
/// Shared memory a pass's block uses, in bytes: tiles of 32 rows (the
/// forward: q, k, v; the backward passes: q, k, v, g), each warp's 32
/// probabilities (and score gradients), the key pass's 32 query statistics.
inline int64_t forwardSharedBytes(int64_t dim) {
  return (3 * kTile * pitch(dim) + kWarps * kTile) * 4;
}
inline int64_t backwardSharedBytes(int64_t dim) {
  return (4 * kTile * pitch(dim) + 2 * kWarps * kTile + 3 * kTile) * 4;
}
/// The largest head dimension (a lane holds 8 slots of a row: dims lane,
/// lane + 32, ...).
constexpr int64_t kMaxDim = 256;
/// `fn(std::integral_constant<int, kSlots>{})` with the fewest slots that
/// hold a row of `dim` (1, 2, 4 or 8): the bodies' first template argument.
template <class Fn> auto withSlots(int64_t dim, Fn fn) {
  if (dim <= 32)
    return fn(std::integral_constant<int, 1>{});
  if (dim <= 64)
    return fn(std::integral_constant<int, 2>{});
  if (dim <= 128)
    return fn(std::integral_constant<int, 4>{});
  return fn(std::integral_constant<int, 8>{});
}

/// The key/value head (flat over batch) that query head `head` (flat) reads.
PTC_SIMT int64_t kvHeadOf(int64_t head, int64_t heads, int64_t kvHeads) {
  return (head / heads) * kvHeads + (head % heads) / (heads / kvHeads);
}
/// Where row `row` of flat head `flat` (batch entry * heads + head) starts.
PTC_SIMT int64_t rowAt(const HeadLayout &l, int64_t flat, int64_t heads, int64_t row) {
  return (flat / heads) * l.batch + (flat % heads) * l.head + row * l.row;
}
/// The first key query `row` of batch entry `b` attends: 0, or with packed
/// documents its document's first token (clamped to [0, row]).
PTC_SIMT int64_t firstKey(const int32_t *positions, int64_t b, int64_t row, int64_t seq) {
  if (!positions)
    return 0;
  const int64_t first = row - positions[b * seq + row];
  return first < 0 ? 0 : first > row ? row : first;
}

/// The first key query row `i` of batch entry `b` sees: from the document
/// positions, or a ring block's first keys (clamped to the keys it sees).
template <typename E> PTC_SIMT int64_t firstKeyOf(const Problem<E> &a, int64_t b, int64_t i) {
  if (!a.firstKeys)
    return firstKey(a.positions, b, i, a.seq);
  const int64_t n = a.causal && i + 1 < a.keys ? i + 1 : a.keys, f = a.firstKeys[b * a.seq + i];
  return f < 0 ? 0 : f > n ? n : f;
}
/// Whether query row i sees key j (its first key `start`).
template <typename E>
PTC_SIMT bool sees(const Problem<E> &a, int64_t i, int64_t j, int64_t start) {
  return j < a.keys && (!a.causal || j <= i) && j >= start;
}
/// The key rows a query tile from row i0 (`rows` of them) may see end here.
template <typename E> PTC_SIMT int64_t keyEnd(const Problem<E> &a, int64_t i0, int64_t rows) {
  return a.causal && i0 + rows < a.keys ? i0 + rows : a.keys;
}

template <class Threads> PTC_SIMT float warpSum(const Threads &t, float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += t.shflXor(v, o);
  return v;
}
template <class Threads> PTC_SIMT float warpMax(const Threads &t, float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, t.shflXor(v, o));
  return v;
}

/// Rows first .. first + count - 1 (of 32) of one head into a shared tile as
/// f32, the rest zero; the block's threads read consecutive elements.
template <class Io, class Threads>
PTC_SIMT void loadTile(const Threads &t, const typename Io::Elem *head, int64_t rowStride,
                       int64_t first, int64_t count, int64_t dim, float *tile) {
  const int64_t ld = pitch(dim);
  for (int64_t e = t.thread(); e < kTile * dim; e += kThreads) {
    const int64_t r = e / dim, d = e % dim;
    tile[r * ld + d] = r < count ? Io::load(head + (first + r) * rowStride + d) : 0.0f;
  }
}

/// Dot product of two shared rows.
PTC_SIMT float dot(const float *a, const float *b, int64_t dim) {
  float s = 0.0f;
  for (int64_t d = 0; d < dim; ++d)
    s += a[d] * b[d];
  return s;
}

/// The key tiles the block's query tile (rows i0 .. of flat head `head`)
/// sees, from the tile of its earliest first key `lo`: each loaded into `ks`
/// and `vs` (block barriers around the loads), then `row(rr, r, i, j)` for
/// each of this warp's rows that sees a key of it (the whole warp skips the
/// others): `rr` the warp's row, `r` the tile's, `i` the query's index, `j`
/// this lane's key.
template <class Io, class Threads, class Row>
PTC_SIMT void forKeyTiles(const Threads &t, const Problem<typename Io::Elem> &a, int64_t head,
                          int64_t i0, int64_t lo, const int64_t *start, float *ks, float *vs,
                          Row &&row) {
  const int64_t kvh = kvHeadOf(head, a.heads, a.kvHeads);
  const typename Io::Elem *kh = a.k + rowAt(a.kvLayout, kvh, a.kvHeads, 0),
                          *vh = a.v + rowAt(a.kvLayout, kvh, a.kvHeads, 0);
  const int64_t rows = i0 + kTile < a.seq ? kTile : a.seq - i0, end = keyEnd(a, i0, rows);
  for (int64_t j0 = lo - lo % kTile; j0 < end; j0 += kTile) {
    const int64_t keys = j0 + kTile < a.keys ? kTile : a.keys - j0;
    t.sync(); // every warp is done with the previous tiles
    loadTile<Io>(t, kh, a.kvLayout.row, j0, keys, a.dim, ks);
    loadTile<Io>(t, vh, a.kvLayout.row, j0, keys, a.dim, vs);
    t.sync();
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = t.warp() * kRowsPerWarp + rr;
      const int64_t i = i0 + r, j = j0 + t.lane();
      if (i >= a.seq || (a.causal && j0 > i) || j0 + kTile <= start[rr])
        continue;
      row(rr, r, i, j);
    }
  }
}

/// The online softmax of this warp's query rows of the block's tile (i0 ..)
/// over the key tiles from `lo` on: m (max score), l (normalizer) and acc
/// (unnormalized output, this lane's slots) per row. `qs` holds the query
/// tile; `ks`, `vs` are loaded here tile by tile; `ps` is the warp's 32
/// probabilities.
template <int kSlots, class Io, class Threads>
PTC_SIMT void attendTiles(const Threads &t, const Problem<typename Io::Elem> &a, int64_t head,
                          int64_t i0, int64_t lo, const int64_t *start, const float *qs,
                          float *ks, float *vs, float *ps, float (&m)[kRowsPerWarp],
                          float (&l)[kRowsPerWarp], float (&acc)[kRowsPerWarp][kSlots]) {
  const int lane = t.lane(), warp = t.warp();
  const int64_t ld = pitch(a.dim);
  PTC_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    // A ring block continues the row's softmax (and its output) so far.
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    const bool carried = a.rowMax && i < a.seq;
    const int64_t row = head * a.seq + i;
    m[rr] = carried ? a.rowMax[row] : -INFINITY;
    l[rr] = carried ? a.rowSum[row] : 0.0f;
    const typename Io::Elem *o = carried ? a.out + rowAt(a.oLayout, head, a.heads, i) : nullptr;
    PTC_UNROLL
    for (int s = 0; s < kSlots; ++s) {
      const int64_t d = lane + 32 * s;
      acc[rr][s] = o && d < a.dim ? Io::load(o + d) : 0.0f;
    }
  }
  forKeyTiles<Io>(t, a, head, i0, lo, start, ks, vs, [&](int rr, int r, int64_t i, int64_t j) {
    const bool visible = sees(a, i, j, start[rr]);
    const float s = visible ? dot(qs + r * ld, ks + lane * ld, a.dim) * a.scale : -INFINITY;
    const float tileMax = warpMax(t, s);
    if (tileMax == -INFINITY)
      return;
    const float mNew = fmaxf(m[rr], tileMax), correction = expf(m[rr] - mNew);
    const float p = visible ? expf(s - mNew) : 0.0f;
    l[rr] = l[rr] * correction + warpSum(t, p);
    ps[lane] = p;
    t.syncWarp();
    PTC_UNROLL
    for (int sl = 0; sl < kSlots; ++sl) {
      const int64_t d = lane + 32 * sl;
      float x = acc[rr][sl] * correction;
      if (d < a.dim)
        for (int jj = 0; jj < kTile; ++jj)
          x += ps[jj] * vs[jj * ld + d];
      acc[rr][sl] = x;
    }
    t.syncWarp(); // ps is rewritten by the next row
    m[rr] = mNew;
  });
}

/// The earliest first key of the block's query rows i0 .. (every thread
/// computes the same; 0 without documents).
template <typename E> PTC_SIMT int64_t tileFirstKey(const Problem<E> &a, int64_t b, int64_t i0) {
  if (!a.positions && !a.firstKeys)
    return 0;
  int64_t lo = a.keys;
  for (int64_t i = i0; i < i0 + kTile && i < a.seq; ++i) {
    const int64_t f = firstKeyOf(a, b, i);
    lo = f < lo ? f : lo;
  }
  return lo;
}

/// Forward: each row's normalized output, and its log-sum-exp into `lse`.
template <int kSlots, class Io, class Threads>
PTC_SIMT void forward(const Threads &t, const Problem<typename Io::Elem> &a, float *shared) {
  const int64_t ld = pitch(a.dim), tiles = (a.seq + kTile - 1) / kTile;
  float *qs = shared, *ks = qs + kTile * ld, *vs = ks + kTile * ld,
        *ps = vs + kTile * ld + t.warp() * kTile;
  const int lane = t.lane(), warp = t.warp();
  for (int64_t item = t.block(); item < a.batch * a.heads * tiles; item += t.blocks()) {
    const int64_t head = item / tiles, i0 = item % tiles * kTile, b = head / a.heads;
    const int64_t rows = i0 + kTile < a.seq ? kTile : a.seq - i0;
    t.sync(); // the previous item's tiles are read
    loadTile<Io>(t, a.q + rowAt(a.qLayout, head, a.heads, 0), a.qLayout.row, i0, rows, a.dim, qs);
    int64_t start[kRowsPerWarp];
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      start[rr] = i < a.seq ? firstKeyOf(a, b, i) : 0;
    }
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kSlots];
    attendTiles<kSlots, Io>(t, a, head, i0, tileFirstKey(a, b, i0), start, qs, ks, vs, ps, m, l,
                            acc);
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      if (i >= a.seq)
        continue;
      typename Io::Elem *o = a.out + rowAt(a.oLayout, head, a.heads, i);
      // A ring block: the continued state, unnormalized; else the result.
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl)
        if (const int64_t d = lane + 32 * sl; d < a.dim)
          Io::store(o + d, a.rowMax ? acc[rr][sl] : acc[rr][sl] / l[rr]);
      if (lane == 0 && a.rowMax) {
        a.rowMax[head * a.seq + i] = m[rr];
        a.rowSum[head * a.seq + i] = l[rr];
      } else if (lane == 0 && a.lse) {
        a.lse[head * a.seq + i] = m[rr] + logf(l[rr]);
      }
    }
  }
}

/// Backward, query side: per query row its log-sum-exp (saved, or the
/// forward's recomputed), D = g . o and dq = sum_j dS_ij k_j; `stats` gets
/// (log-sum-exp, D) per row for the key side.
template <int kSlots, class Io, class Threads>
PTC_SIMT void backwardQuery(const Threads &t, const Problem<typename Io::Elem> &a,
                            float *shared) {
  using E = typename Io::Elem;
  const int64_t ld = pitch(a.dim), tiles = (a.seq + kTile - 1) / kTile;
  float *qs = shared, *ks = qs + kTile * ld, *vs = ks + kTile * ld, *gs = vs + kTile * ld,
        *ps = gs + kTile * ld + t.warp() * kTile;
  const int lane = t.lane(), warp = t.warp();
  for (int64_t item = t.block(); item < a.batch * a.heads * tiles; item += t.blocks()) {
    const int64_t head = item / tiles, i0 = item % tiles * kTile, b = head / a.heads;
    const int64_t rows = i0 + kTile < a.seq ? kTile : a.seq - i0;
    t.sync();
    loadTile<Io>(t, a.q + rowAt(a.qLayout, head, a.heads, 0), a.qLayout.row, i0, rows, a.dim, qs);
    loadTile<Io>(t, a.g + rowAt(a.oLayout, head, a.heads, 0), a.oLayout.row, i0, rows, a.dim, gs);
    t.sync();
    int64_t start[kRowsPerWarp];
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      start[rr] = i < a.seq ? firstKeyOf(a, b, i) : 0;
    }
    const int64_t lo = tileFirstKey(a, b, i0);
    // Each row's log-sum-exp and D = g . o.
    float lse[kRowsPerWarp], rowD[kRowsPerWarp];
    if (a.savedLse) {
      PTC_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp * kRowsPerWarp + rr;
        const int64_t i = i0 + r;
        lse[rr] = 0.0f;
        rowD[rr] = 0.0f;
        if (i >= a.seq)
          continue;
        const E *o = a.savedO + rowAt(a.oLayout, head, a.heads, i);
        float part = 0.0f;
        PTC_UNROLL
        for (int sl = 0; sl < kSlots; ++sl)
          if (const int64_t d = lane + 32 * sl; d < a.dim)
            part += gs[r * ld + d] * Io::load(o + d);
        lse[rr] = a.savedLse[head * a.seq + i];
        rowD[rr] = warpSum(t, part);
      }
    } else {
      float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kSlots];
      attendTiles<kSlots, Io>(t, a, head, i0, lo, start, qs, ks, vs, ps, m, l, acc);
      PTC_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp * kRowsPerWarp + rr;
        lse[rr] = 0.0f;
        rowD[rr] = 0.0f;
        if (i0 + r >= a.seq)
          continue;
        float part = 0.0f;
        PTC_UNROLL
        for (int sl = 0; sl < kSlots; ++sl)
          if (const int64_t d = lane + 32 * sl; d < a.dim)
            part += gs[r * ld + d] * (acc[rr][sl] / l[rr]);
        lse[rr] = m[rr] + logf(l[rr]);
        rowD[rr] = warpSum(t, part);
      }
    }
    // dq_i = sum_j p_ij (dp_ij - D_i) scale k_j over the key tiles.
    float dq[kRowsPerWarp][kSlots];
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr)
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl)
        dq[rr][sl] = 0.0f;
    forKeyTiles<Io>(t, a, head, i0, lo, start, ks, vs, [&](int rr, int r, int64_t i, int64_t j) {
      float ds = 0.0f;
      if (sees(a, i, j, start[rr])) {
        const float s = dot(qs + r * ld, ks + lane * ld, a.dim) * a.scale;
        const float dp = dot(gs + r * ld, vs + lane * ld, a.dim);
        ds = expf(s - lse[rr]) * (dp - rowD[rr]) * a.scale;
      }
      ps[lane] = ds;
      t.syncWarp();
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl) {
        const int64_t d = lane + 32 * sl;
        if (d < a.dim)
          for (int jj = 0; jj < kTile; ++jj)
            dq[rr][sl] += ps[jj] * ks[jj * ld + d];
      }
      t.syncWarp();
    });
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      if (i >= a.seq)
        continue;
      E *out = a.dq + rowAt(a.qLayout, head, a.heads, i);
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl)
        if (const int64_t d = lane + 32 * sl; d < a.dim)
          Io::store(out + d, a.accumulate ? Io::load(out + d) + dq[rr][sl] : dq[rr][sl]);
      if (lane == 0) {
        a.stats[2 * (head * a.seq + i)] = lse[rr];
        a.stats[2 * (head * a.seq + i) + 1] = rowD[rr];
      }
    }
  }
}

/// Backward, key side: per key row j of a key/value head, dv_j = sum_i p_ij
/// g_i and dk_j = sum_i dS_ij q_i over the query rows i >= j of every query
/// head it serves (grouped-query attention: heads / kvHeads of them), from
/// the query side's statistics.
template <int kSlots, class Io, class Threads>
PTC_SIMT void backwardKeys(const Threads &t, const Problem<typename Io::Elem> &a,
                           float *shared) {
  using E = typename Io::Elem;
  const int64_t ld = pitch(a.dim), tiles = (a.keys + kTile - 1) / kTile,
                group = a.heads / a.kvHeads;
  float *ks = shared, *vs = ks + kTile * ld, *qs = vs + kTile * ld, *gs = qs + kTile * ld,
        *warpPart = gs + kTile * ld, *ps = warpPart + t.warp() * 2 * kTile, *dss = ps + kTile,
        *rowLse = warpPart + 2 * kWarps * kTile, *rowD = rowLse + kTile;
  auto *rowStart = reinterpret_cast<int32_t *>(rowD + kTile); // the rows' first keys
  const int lane = t.lane(), warp = t.warp();
  for (int64_t item = t.block(); item < a.batch * a.kvHeads * tiles; item += t.blocks()) {
    const int64_t kvh = item / tiles, j0 = item % tiles * kTile, b = kvh / a.kvHeads;
    const int64_t keys = j0 + kTile < a.keys ? kTile : a.keys - j0;
    t.sync();
    loadTile<Io>(t, a.k + rowAt(a.kvLayout, kvh, a.kvHeads, 0), a.kvLayout.row, j0, keys, a.dim, ks);
    loadTile<Io>(t, a.v + rowAt(a.kvLayout, kvh, a.kvHeads, 0), a.kvLayout.row, j0, keys, a.dim, vs);
    float dk[kRowsPerWarp][kSlots], dv[kRowsPerWarp][kSlots];
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr)
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl)
        dk[rr][sl] = dv[rr][sl] = 0.0f;
    for (int64_t gi = 0; gi < group; ++gi) {
      const int64_t head = b * a.heads + (kvh % a.kvHeads) * group + gi;
      for (int64_t i0 = a.causal ? j0 : 0; i0 < a.seq; i0 += kTile) {
        const int64_t rows = i0 + kTile < a.seq ? kTile : a.seq - i0;
        t.sync();
        loadTile<Io>(t, a.q + rowAt(a.qLayout, head, a.heads, 0), a.qLayout.row, i0, rows, a.dim, qs);
        loadTile<Io>(t, a.g + rowAt(a.oLayout, head, a.heads, 0), a.oLayout.row, i0, rows, a.dim, gs);
        if (t.thread() < kTile) {
          const int64_t i = i0 + t.thread();
          const bool row = i < a.seq;
          rowLse[t.thread()] = row ? a.stats[2 * (head * a.seq + i)] : 0.0f;
          rowD[t.thread()] = row ? a.stats[2 * (head * a.seq + i) + 1] : 0.0f;
          rowStart[t.thread()] = static_cast<int32_t>(row ? firstKeyOf(a, b, i) : a.keys);
        }
        t.sync();
        // Packed documents: past the key tile's document ends, no row sees it
        // (every thread reads the same starts: the block skips together).
        if (a.positions || a.firstKeys) {
          int32_t earliest = rowStart[0];
          for (int r = 1; r < kTile; ++r)
            earliest = rowStart[r] < earliest ? rowStart[r] : earliest;
          if (earliest > j0 + keys - 1)
            continue;
        }
        PTC_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          const int r = warp * kRowsPerWarp + rr;
          const int64_t j = j0 + r, i = i0 + lane;
          if (j >= a.keys || (a.causal && i0 + kTile <= j))
            continue;
          float p = 0.0f, ds = 0.0f;
          if (i < a.seq && sees(a, i, j, rowStart[lane])) {
            const float s = dot(ks + r * ld, qs + lane * ld, a.dim) * a.scale;
            const float dp = dot(vs + r * ld, gs + lane * ld, a.dim);
            p = expf(s - rowLse[lane]);
            ds = p * (dp - rowD[lane]) * a.scale;
          }
          if (warpMax(t, p) == 0.0f)
            continue; // no query of this tile sees key j
          ps[lane] = p;
          dss[lane] = ds;
          t.syncWarp();
          PTC_UNROLL
          for (int sl = 0; sl < kSlots; ++sl) {
            const int64_t d = lane + 32 * sl;
            if (d >= a.dim)
              continue;
            float x = dv[rr][sl], y = dk[rr][sl];
            for (int ii = 0; ii < kTile; ++ii) {
              x += ps[ii] * gs[ii * ld + d];
              y += dss[ii] * qs[ii * ld + d];
            }
            dv[rr][sl] = x;
            dk[rr][sl] = y;
          }
          t.syncWarp();
        }
      }
    }
    PTC_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t j = j0 + warp * kRowsPerWarp + rr;
      if (j >= a.keys)
        continue;
      E *dkRow = a.dk + rowAt(a.kvLayout, kvh, a.kvHeads, j),
        *dvRow = a.dv + rowAt(a.kvLayout, kvh, a.kvHeads, j);
      PTC_UNROLL
      for (int sl = 0; sl < kSlots; ++sl)
        if (const int64_t d = lane + 32 * sl; d < a.dim) {
          Io::store(dkRow + d, a.accumulate ? Io::load(dkRow + d) + dk[rr][sl] : dk[rr][sl]);
          Io::store(dvRow + d, a.accumulate ? Io::load(dvRow + d) + dv[rr][sl] : dv[rr][sl]);
        }
    }
  }
}

} // namespace ptc::kernels::cuda::tiled

#endif // PTC_KERNELS_CUDA_TILED_ATTENTION_H
