// CPU kernels: causal attention, forward and backward, as blocked matrix
// products. Each head is processed in blocks of query rows: the block's
// scores against the keys it may see are one register-blocked product, the
// softmax runs on the block, and the outputs (or, backward, the gradients)
// are products again. Memory per thread is one block of scores (kQueryBlock
// rows x the sequence) and a few per-head copies (sequence x head dim), never
// sequence x sequence; every head's result is computed the same way whatever
// the thread count (deterministic).
#include "kernels/cpu/attention_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;
using namespace attention_tiles;

namespace {
/// Where the rows of a flat head (batch entry * heads + head) lie: heads-major
/// [batch, heads, seq, dim] (a head's rows back to back) or seq-major [batch,
/// seq, heads, dim] (the projections' layout: a head's rows heads * dim apart).
struct HeadRows {
  int64_t heads, s, d;
  bool seqMajor;
  /// Seq-major only: the distance between consecutive positions when the
  /// heads are a column block of wider rows (a fused QKV projection's), 0
  /// for rows of exactly heads * d.
  int64_t rowStride = 0;
  /// The distance between a head's consecutive rows.
  int64_t ld() const { return seqMajor ? (rowStride ? rowStride : heads * d) : d; }
  /// Row `row` of flat head `h`.
  int64_t at(int64_t h, int64_t row = 0) const {
    return seqMajor ? (h / heads) * s * ld() + (h % heads) * d + row * ld() : (h * s + row) * d;
  }
};

/// The flat kv head (batch entry * kvHeads + kv head) flat query head h reads,
/// and the m-th flat query head of kv head kvh (grouped-query attention: each
/// kv head serves heads / kvHeads consecutive query heads).
inline int64_t kvHeadOf(int64_t h, int64_t heads, int64_t kvHeads) {
  return (h / heads) * kvHeads + (h % heads) / (heads / kvHeads);
}
inline int64_t queryHeadOf(int64_t kvh, int64_t m, int64_t heads, int64_t kvHeads) {
  return (kvh / kvHeads) * heads + (kvh % kvHeads) * (heads / kvHeads) + m;
}

/// Rows of f32 values `ld` apart (a head's, or a dense copy of them).
template <typename F> struct Rows {
  F *p;
  int64_t ld;
  F *row(int64_t r) const { return p + r * ld; }
};

/// Rows [row0, row0 + rows) of flat head h as f32: the storage itself (f32,
/// either layout: the products take the rows' distance), or widened into
/// `buffer` (bf16) -- per head inside the kernels, where the executor would
/// otherwise widen whole tensors (the same numbers: bf16 widens exactly).
inline Rows<const float> rowsOf(const float *base, const HeadRows &L, int64_t h, int64_t row0,
                                int64_t, std::vector<float> &) {
  return {base + L.at(h, row0), L.ld()};
}
inline Rows<const float> rowsOf(const uint16_t *base, const HeadRows &L, int64_t h,
                                int64_t row0, int64_t rows, std::vector<float> &buffer) {
  buffer.resize(static_cast<size_t>(rows * L.d));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t *src = base + L.at(h, row0 + r);
    float *dst = buffer.data() + r * L.d;
#pragma omp simd
    for (int64_t c = 0; c < L.d; ++c)
      dst[c] = bf16ToF32(src[c]);
  }
  return {buffer.data(), L.d};
}
/// The same rows back to back (ld = d) for the products that read them as B
/// (a row per step of the sum): the f32 rows of a fused projection lie
/// 3 x heads x dim floats apart, a stride that maps a head's rows to a few
/// cache sets (at hidden 256, 3 KiB: 4 of an L1's 64), so such rows are
/// copied first (the same numbers). bf16 rows are widened into a dense buffer
/// anyway.
inline Rows<const float> denseRowsOf(const float *base, const HeadRows &L, int64_t h,
                                     int64_t row0, int64_t rows, std::vector<float> &buffer) {
  if (L.ld() == L.d)
    return {base + L.at(h, row0), L.d};
  buffer.resize(static_cast<size_t>(rows * L.d));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(buffer.data() + r * L.d, base + L.at(h, row0 + r),
                sizeof(float) * static_cast<size_t>(L.d));
  return {buffer.data(), L.d};
}
inline Rows<const float> denseRowsOf(const uint16_t *base, const HeadRows &L, int64_t h,
                                     int64_t row0, int64_t rows, std::vector<float> &buffer) {
  return rowsOf(base, L, h, row0, rows, buffer);
}
/// Where an f32 result for those rows is computed: the storage itself (f32
/// rows back to back) or `buffer` (strided f32 rows, as in denseRowsOf,
/// copied into place by storeRows; bf16, rounded into place).
inline Rows<float> resultRows(float *base, const HeadRows &L, int64_t h, int64_t row0,
                              int64_t rows, std::vector<float> &buffer) {
  if (L.ld() == L.d)
    return {base + L.at(h, row0), L.d};
  // Strided rows (see denseRowsOf): computed back to back, then copied.
  buffer.resize(static_cast<size_t>(rows * L.d));
  return {buffer.data(), L.d};
}
inline Rows<float> resultRows(uint16_t *, const HeadRows &L, int64_t, int64_t, int64_t rows,
                              std::vector<float> &buffer) {
  buffer.resize(static_cast<size_t>(rows * L.d));
  return {buffer.data(), L.d};
}
/// Puts rows computed by resultRows in place: nothing for f32 computed
/// there, copied from the dense buffer for strided f32 rows, each rounded
/// once for bf16.
inline void storeRows(Rows<float> rows, float *base, const HeadRows &L, int64_t h, int64_t row0,
                      int64_t count) {
  if (rows.p == base + L.at(h, row0))
    return;
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(base + L.at(h, row0 + r), rows.row(r), sizeof(float) * static_cast<size_t>(L.d));
}
inline void storeRows(Rows<float> rows, uint16_t *base, const HeadRows &L, int64_t h,
                      int64_t row0, int64_t count) {
  for (int64_t r = 0; r < count; ++r) {
    uint16_t *dst = base + L.at(h, row0 + r);
    const float *src = rows.row(r);
#pragma omp simd
    for (int64_t c = 0; c < L.d; ++c)
      dst[c] = f32ToBf16(src[c]);
  }
}
/// Zeroes rows (the gradients dk and dv accumulate into).
inline void zeroRows(Rows<float> rows, int64_t count, int64_t d) {
  for (int64_t r = 0; r < count; ++r)
    std::fill(rows.row(r), rows.row(r) + d, 0.0f);
}

/// rowDots[r] = g_(i0 + r) . o_(i0 + r) for the rows of one query block.
inline void rowDotsOf(const Rows<const float> &g, const Rows<const float> &o, int64_t i0,
                      int64_t rows, int64_t d, float *rowDots) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *gr = g.row(i0 + r), *orow = o.row(i0 + r);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < d; ++c)
      sum += gr[c] * orow[c];
    rowDots[r] = sum;
  }
}

/// shape: [batch, heads, seq, dim] of the query whatever the storage's layout
/// (seqMajor: [batch, seq, heads, dim]); keys and values have kvHeads heads.
template <typename T>
void causalAttentionOf(const T *q, const T *k, const T *v, T *out, const Shape &shape,
                       int64_t kvHeads, float scale, bool seqMajor, int64_t qkvStride,
                       const int32_t *positions, float *lse) {
  int64_t heads = shape[1], bh = shape[0] * heads, s = shape[2], d = shape[3];
  int64_t blocks = (s + kQueryBlock - 1) / kQueryBlock;
  const HeadRows qL{heads, s, d, seqMajor, qkvStride}, kvL{kvHeads, s, d, seqMajor, qkvStride},
      oL{heads, s, d, seqMajor};
#pragma omp parallel
  {
    std::vector<float> kt(static_cast<size_t>(s * d)), p(static_cast<size_t>(kQueryBlock * s));
    std::vector<float> kRows, vRows, qRows, oRows; // bf16 heads and blocks widened
    Rows<const float> vh{nullptr, d};
    int64_t transposed = -1; // the kv head kt and vh hold
#pragma omp for collapse(2) schedule(static)
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t kvh = kvHeadOf(h, heads, kvHeads);
        if (kvh != transposed) {
          const Rows<const float> kh = rowsOf(k, kvL, kvh, 0, s, kRows);
          transposeInto(kh.p, s, d, kt.data(), kh.ld);
          vh = denseRowsOf(v, kvL, kvh, 0, s, vRows);
          transposed = kvh;
        }
        int64_t i0 = blk * kQueryBlock, rows = std::min(kQueryBlock, s - i0);
        // Packed documents: the keys from the block's earliest document start.
        const KeyWindow w = keyWindow(positions ? positions + (h / heads) * s : nullptr, i0, rows);
        const int64_t at = i0 - w.first, keys = at + rows;
        const Rows<const float> qb = rowsOf(q, qL, h, i0, rows, qRows);
        probabilities(qb.p, qb.ld, kt.data() + w.first, s, d, at, rows, scale, p.data(),
                      positions ? w.los() : nullptr, lse ? lse + h * s + i0 : nullptr);
        const Rows<float> o = resultRows(out, oL, h, i0, rows, oRows);
        productNN(p.data(), keys, vh.row(w.first), vh.ld, o.p, o.ld, rows, d, keys,
                  /*accumulate=*/false, Causal::kSumEnd, at);
        storeRows(o, out, oL, h, i0, rows);
      }
  }
}

template <typename T>
void causalAttentionGradOf(const T *q, const T *k, const T *v, const T *g, T *dq, T *dk, T *dv,
                           const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                           int64_t qkvStride, const int32_t *positions, const T *out,
                           const float *lse) {
  int64_t heads = shape[1], s = shape[2], d = shape[3];
  int64_t group = heads / kvHeads, bkv = shape[0] * kvHeads;
  const HeadRows qL{heads, s, d, seqMajor, qkvStride}, kvL{kvHeads, s, d, seqMajor, qkvStride},
      gL{heads, s, d, seqMajor};
#pragma omp parallel
  {
    std::vector<float> kt(static_cast<size_t>(s * d)), vt(static_cast<size_t>(s * d));
    std::vector<float> p(static_cast<size_t>(kQueryBlock * s)), dp(p.size());
    std::vector<float> kRows, vRows, qRows, gRows, oRows, dqRows, dkRows, dvRows; // bf16 widened
    float rowDots[kQueryBlock];
    // One kv head per iteration: the query heads it serves and their query
    // blocks accumulate into its dk and dv in a fixed order (deterministic).
#pragma omp for schedule(static)
    for (int64_t kvh = 0; kvh < bkv; ++kvh) {
      // K, Q and G are read as B by dQ, dK and dV: dense.
      const Rows<const float> kh = denseRowsOf(k, kvL, kvh, 0, s, kRows);
      const Rows<const float> vh = rowsOf(v, kvL, kvh, 0, s, vRows);
      const Rows<float> dkh = resultRows(dk, kvL, kvh, 0, s, dkRows);
      const Rows<float> dvh = resultRows(dv, kvL, kvh, 0, s, dvRows);
      zeroRows(dkh, s, d);
      zeroRows(dvh, s, d);
      transposeInto(kh.p, s, d, kt.data(), kh.ld);
      transposeInto(vh.p, s, d, vt.data(), vh.ld);
      for (int64_t m = 0; m < group; ++m) {
        int64_t h = queryHeadOf(kvh, m, heads, kvHeads);
        const Rows<const float> qh = denseRowsOf(q, qL, h, 0, s, qRows);
        const Rows<const float> gh = denseRowsOf(g, gL, h, 0, s, gRows);
        // The forward's statistics saved: its result gives rowsum(P dP) = g . o.
        const Rows<const float> oh =
            lse ? rowsOf(out, gL, h, 0, s, oRows) : Rows<const float>{nullptr, d};
        const Rows<float> dqh = resultRows(dq, qL, h, 0, s, dqRows);
        for (int64_t i0 = 0; i0 < s; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, s - i0);
          // Packed documents: the keys from the block's earliest document
          // start, as in the forward pass.
          const KeyWindow w =
              keyWindow(positions ? positions + (kvh / kvHeads) * s : nullptr, i0, rows);
          const int64_t at = i0 - w.first, keys = at + rows, k0 = w.first;
          probabilities(qh.row(i0), qh.ld, kt.data() + k0, s, d, at, rows, scale, p.data(),
                        positions ? w.los() : nullptr, nullptr, lse ? lse + h * s + i0 : nullptr);
          if (lse)
            rowDotsOf(gh, oh, i0, rows, d, rowDots);
          // dP = G V^T; dS = P (dP - rowsum(P dP)) * scale (zero where P is).
          // (Each product leaves out what the causal mask zeroes.)
          productNN(gh.row(i0), gh.ld, vt.data() + k0, s, dp.data(), keys, rows, keys, d, false,
                    Causal::kColumns, at);
          scoreGradients(p.data(), dp.data(), at, rows, scale, lse ? rowDots : nullptr);
          // dV += P^T G, dQ = dS K, dK += dS^T Q.
          productTNAccumulate(p.data(), keys, gh.row(i0), gh.ld, dvh.row(k0), dvh.ld, keys, d,
                              rows, Causal::kSumStart, at);
          productNN(dp.data(), keys, kh.row(k0), kh.ld, dqh.row(i0), dqh.ld, rows, d, keys, false,
                    Causal::kSumEnd, at);
          productTNAccumulate(dp.data(), keys, qh.row(i0), qh.ld, dkh.row(k0), dkh.ld, keys, d,
                              rows, Causal::kSumStart, at);
        }
        storeRows(dqh, dq, qL, h, 0, s);
      }
      storeRows(dkh, dk, kvL, kvh, 0, s);
      storeRows(dvh, dv, kvL, kvh, 0, s);
    }
  }
}
} // namespace

#if defined(__AVX512F__) && defined(__clang__)
// ---- bf16 heads on AVX512-BF16: the products as bf16 dot products
// (vdpbf16ps: pairs of bf16 multiplied exactly, summed in f32), twice the
// f32 FMA rate. The scores, the softmax and the gradient of the scores stay
// f32; the probabilities and the scores' gradient are rounded to bf16 for
// the products that take them (as PyTorch's bf16 autocast and FlashAttention
// do), and each result is rounded once. Operands are packed per head or per
// query block into 32-bit pairs: along the inner dimension for the left one,
// and, for the right one, row pairs interleaved (oneDNN's "VNNI" layout).
#define PTC_BF16_KERNEL __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512dq,avx512f")))
#define PTC_HAVE_BF16_ATTENTION 1
namespace {
inline uint16_t toBf16(uint16_t x) { return x; }
inline uint16_t toBf16(float x) { return f32ToBf16(x); }
inline uint32_t pairOf(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}

/// dst[r][p] = (src[r][2p], src[r][2p + 1]) for rows x cols (0 past cols):
/// [rows][(cols + 1) / 2] pairs along each row.
template <typename T>
void pairColumns(const T *src, int64_t rows, int64_t cols, int64_t ld, uint32_t *dst) {
  const int64_t pairs = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const T *sr = src + r * ld;
    uint32_t *dr = dst + r * pairs;
    const int64_t whole = cols / 2;
#pragma omp simd
    for (int64_t p = 0; p < whole; ++p)
      dr[p] = pairOf(toBf16(sr[2 * p]), toBf16(sr[2 * p + 1]));
    if (whole < pairs)
      dr[whole] = pairOf(toBf16(sr[cols - 1]), 0);
  }
}

/// dst[p][j] = (src[2p][j], src[2p + 1][j]) for rows x cols (0 past rows):
/// [(rows + 1) / 2][cols] pairs down each column.
template <typename T>
void pairRows(const T *src, int64_t rows, int64_t cols, int64_t ld, uint32_t *dst) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const T *r0 = src + 2 * p * ld;
    uint32_t *dr = dst + p * cols;
    if (2 * p + 1 < rows) {
      const T *r1 = r0 + ld;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dr[j] = pairOf(toBf16(r0[j]), toBf16(r1[j]));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j)
        dr[j] = pairOf(toBf16(r0[j]), 0);
    }
  }
}

/// C[R rows][cols] (+)= sum_p A(r, p) . B[p][0..cols) for cols <= 32, where
/// A(r, p) = a[r * rowStride + p * colStride] and B's rows are pairs.
template <int R>
PTC_BF16_KERNEL inline void pairBlockRows(const uint32_t *a, int64_t rowStride,
                                          int64_t colStride, const uint32_t *b, int64_t ldb,
                                          float *c, int64_t ldc, int64_t kp, int64_t cols,
                                          bool accumulate) {
  const __mmask16 m0 = columnMask(cols), m1 = columnMask(cols - 16);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r)
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b + p * ldb);
    const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + p * ldb + 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh av =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * rowStride + p * colStride]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      if (m1 != 0)
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  storeBlock<R>(acc, c, ldc, m0, m1, accumulate);
}

template <int R = kRows>
PTC_BF16_KERNEL inline void pairBlockOf(int64_t rows, const uint32_t *a, int64_t rowStride,
                                        int64_t colStride, const uint32_t *b, int64_t ldb,
                                        float *c, int64_t ldc, int64_t kp, int64_t cols,
                                        bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R)
      return pairBlockOf<R - 1>(rows, a, rowStride, colStride, b, ldb, c, ldc, kp, cols,
                                accumulate);
  }
  pairBlockRows<R>(a, rowStride, colStride, b, ldb, c, ldc, kp, cols, accumulate);
}

/// C[m][n] (+)= A * B over kp pairs: A(r, p) = a[r * rowStride + p * colStride],
/// B [kp][n] pairs with row stride ldb.
PTC_BF16_KERNEL void pairProduct(const uint32_t *a, int64_t rowStride, int64_t colStride,
                                 const uint32_t *b, int64_t ldb, float *c, int64_t ldc,
                                 int64_t m, int64_t n, int64_t kp, bool accumulate) {
  for (int64_t i = 0; i < m; i += kRows)
    for (int64_t j = 0; j < n; j += kCols)
      pairBlockOf(std::min(kRows, m - i), a + i * rowStride, rowStride, colStride, b + j, ldb,
                  c + i * ldc + j, ldc, kp, std::min(kCols, n - j), accumulate);
}

/// A head's [s][d] rows (`ld` apart) as the right operand of a product with
/// its transpose (Q K^T, G V^T): [(d + 1) / 2][s] pairs of each row's columns.
void pairTransposed(const uint16_t *head, int64_t s, int64_t d, int64_t ld,
                    std::vector<uint32_t> &scratch, uint32_t *out) {
  const int64_t dp = (d + 1) / 2;
  scratch.resize(static_cast<size_t>(s * dp));
  pairColumns(head, s, d, ld, scratch.data());
  transposeInto(scratch.data(), s, dp, out);
}

void causalAttentionBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out,
                         const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                         int64_t qkvStride, const int32_t *positions, float *lse) {
  int64_t heads = shape[1], bh = shape[0] * heads, s = shape[2], d = shape[3];
  int64_t dp = (d + 1) / 2, sp = (s + 1) / 2;
  int64_t blocks = (s + kQueryBlock - 1) / kQueryBlock;
  const HeadRows qL{heads, s, d, seqMajor, qkvStride}, kvL{kvHeads, s, d, seqMajor, qkvStride},
      oL{heads, s, d, seqMajor};
#pragma omp parallel
  {
    std::vector<uint32_t> kt(static_cast<size_t>(dp * s)), vp(static_cast<size_t>(sp * d));
    std::vector<uint32_t> qp(static_cast<size_t>(kQueryBlock * dp));
    std::vector<uint32_t> pp(static_cast<size_t>(kQueryBlock * sp));
    std::vector<uint32_t> scratch;
    std::vector<float> p(static_cast<size_t>(kQueryBlock * s));
    std::vector<float> o(static_cast<size_t>(kQueryBlock * d));
    int64_t packed = -1; // the kv head kt and vp hold
#pragma omp for collapse(2) schedule(static)
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t kvh = kvHeadOf(h, heads, kvHeads);
        if (kvh != packed) {
          pairTransposed(k + kvL.at(kvh), s, d, kvL.ld(), scratch, kt.data());
          pairRows(v + kvL.at(kvh), s, d, kvL.ld(), vp.data());
          packed = kvh;
        }
        const int64_t i0 = blk * kQueryBlock, rows = std::min(kQueryBlock, s - i0);
        // Packed documents: the keys from the block's earliest document
        // start (an even key: keys go in pairs), as causalAttentionOf.
        const KeyWindow w =
            evenKeyWindow(positions ? positions + (h / heads) * s : nullptr, i0, rows);
        const int64_t at = i0 - w.first, keys = at + rows, kp = (keys + 1) / 2;
        pairColumns(q + qL.at(h, i0), rows, d, qL.ld(), qp.data());
        pairProduct(qp.data(), dp, 1, kt.data() + w.first, s, p.data(), keys, rows, keys, dp,
                    false);
        softmaxRows(p.data(), at, rows, scale, positions ? w.los() : nullptr,
                    lse ? lse + h * s + i0 : nullptr);
        // Pairs of keys: an odd last pair (keys == s, odd) meets the zero row
        // pairRows put past the last value (elsewhere a zero probability).
        pairColumns(p.data(), rows, keys, keys, pp.data());
        pairProduct(pp.data(), kp, 1, vp.data() + (w.first / 2) * d, d, o.data(), d, rows, d, kp,
                    false);
        storeRows(Rows<float>{o.data(), d}, out, oL, h, i0, rows);
      }
  }
}

void causalAttentionGradBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                             const uint16_t *g, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                             int64_t qkvStride, const int32_t *positions, const uint16_t *out,
                             const float *lse) {
  int64_t heads = shape[1], s = shape[2], d = shape[3];
  int64_t group = heads / kvHeads, bkv = shape[0] * kvHeads, dp = (d + 1) / 2, sp = (s + 1) / 2;
  const HeadRows qL{heads, s, d, seqMajor, qkvStride}, kvL{kvHeads, s, d, seqMajor, qkvStride},
      gL{heads, s, d, seqMajor};
  const int64_t qld = qL.ld(), kvld = kvL.ld(), gld = gL.ld();
  constexpr int64_t kBlockPairs = (kQueryBlock + 1) / 2;
#pragma omp parallel
  {
    std::vector<uint32_t> kt(static_cast<size_t>(dp * s)), vt(kt.size());
    std::vector<uint32_t> kr(static_cast<size_t>(sp * d));
    std::vector<uint32_t> qc(static_cast<size_t>(kQueryBlock * dp)), gc(qc.size());
    std::vector<uint32_t> qr(static_cast<size_t>(kBlockPairs * d)), gr(qr.size());
    std::vector<uint32_t> pr(static_cast<size_t>(kBlockPairs * s)), dsr(pr.size());
    std::vector<uint32_t> dsc(static_cast<size_t>(kQueryBlock * sp)), scratch;
    std::vector<float> p(static_cast<size_t>(kQueryBlock * s)), dp_(p.size());
    std::vector<float> dkh(static_cast<size_t>(s * d)), dvh(dkh.size());
    std::vector<float> dqb(static_cast<size_t>(kQueryBlock * d)), gRows, oRows;
    float rowDots[kQueryBlock];
#pragma omp for schedule(static)
    for (int64_t kvh = 0; kvh < bkv; ++kvh) {
      const uint16_t *kh = k + kvL.at(kvh), *vh = v + kvL.at(kvh);
      std::fill(dkh.begin(), dkh.end(), 0.0f);
      std::fill(dvh.begin(), dvh.end(), 0.0f);
      pairTransposed(kh, s, d, kvld, scratch, kt.data());
      pairTransposed(vh, s, d, kvld, scratch, vt.data());
      pairRows(kh, s, d, kvld, kr.data());
      for (int64_t m = 0; m < group; ++m) {
        int64_t h = queryHeadOf(kvh, m, heads, kvHeads);
        const uint16_t *qh = q + qL.at(h), *gh = g + gL.at(h);
        for (int64_t i0 = 0; i0 < s; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, s - i0);
          // Packed documents: the keys from the block's earliest (even)
          // document start, as in the forward pass.
          const KeyWindow w =
              evenKeyWindow(positions ? positions + (kvh / kvHeads) * s : nullptr, i0, rows);
          const int64_t k0 = w.first, at = i0 - k0, keys = at + rows;
          int64_t kp = (keys + 1) / 2, rp = (rows + 1) / 2;
          pairColumns(qh + i0 * qld, rows, d, qld, qc.data());
          pairColumns(gh + i0 * gld, rows, d, gld, gc.data());
          pairProduct(qc.data(), dp, 1, kt.data() + k0, s, p.data(), keys, rows, keys, dp, false);
          if (lse) {
            // The forward's statistics and result saved (causalAttentionGradOf).
            probabilitiesFromStats(p.data(), at, rows, scale, lse + h * s + i0,
                                   positions ? w.los() : nullptr);
            rowDotsOf(rowsOf(g, gL, h, i0, rows, gRows), rowsOf(out, gL, h, i0, rows, oRows), 0,
                      rows, d, rowDots);
          } else {
            softmaxRows(p.data(), at, rows, scale, positions ? w.los() : nullptr);
          }
          // dP = G V^T; dS = P (dP - rowsum(P dP)) * scale (zero where P is).
          pairProduct(gc.data(), dp, 1, vt.data() + k0, s, dp_.data(), keys, rows, keys, dp,
                      false);
          scoreGradients(p.data(), dp_.data(), at, rows, scale, lse ? rowDots : nullptr);
          // dV += P^T G, dK += dS^T Q (pairs of query rows), dQ = dS K (pairs of keys).
          pairRows(p.data(), rows, keys, keys, pr.data());
          pairRows(dp_.data(), rows, keys, keys, dsr.data());
          pairRows(gh + i0 * gld, rows, d, gld, gr.data());
          pairRows(qh + i0 * qld, rows, d, qld, qr.data());
          pairProduct(pr.data(), 1, keys, gr.data(), d, dvh.data() + k0 * d, d, keys, d, rp, true);
          pairProduct(dsr.data(), 1, keys, qr.data(), d, dkh.data() + k0 * d, d, keys, d, rp,
                      true);
          pairColumns(dp_.data(), rows, keys, keys, dsc.data());
          pairProduct(dsc.data(), kp, 1, kr.data() + (k0 / 2) * d, d, dqb.data(), d, rows, d, kp,
                      false);
          storeRows(Rows<float>{dqb.data(), d}, dq, qL, h, i0, rows);
        }
      }
      storeRows(Rows<float>{dkh.data(), d}, dk, kvL, kvh, 0, s);
      storeRows(Rows<float>{dvh.data(), d}, dv, kvL, kvh, 0, s);
    }
  }
}
} // namespace
#endif

void causalAttention(const float *q, const float *k, const float *v, float *out,
                     const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                     int64_t qkvStride, const int32_t *positions, float *lse) {
  causalAttentionOf(q, k, v, out, shape, kvHeads, scale, seqMajor, qkvStride, positions, lse);
}

void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, const Shape &shape, int64_t kvHeads,
                         float scale, bool seqMajor, int64_t qkvStride,
                         const int32_t *positions, const float *out, const float *lse) {
  causalAttentionGradOf(q, k, v, g, dq, dk, dv, shape, kvHeads, scale, seqMajor, qkvStride,
                        positions, out, lse);
}

void causalAttention(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out,
                     const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                     int64_t qkvStride, const int32_t *positions, float *lse) {
#ifdef PTC_HAVE_BF16_ATTENTION
  if (nativeBf16())
    return causalAttentionBf16(q, k, v, out, shape, kvHeads, scale, seqMajor, qkvStride,
                               positions, lse);
#endif
  causalAttentionOf(q, k, v, out, shape, kvHeads, scale, seqMajor, qkvStride, positions, lse);
}

void causalAttentionGrad(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                         const uint16_t *g, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                         const Shape &shape, int64_t kvHeads, float scale, bool seqMajor,
                         int64_t qkvStride, const int32_t *positions, const uint16_t *out,
                         const float *lse) {
#ifdef PTC_HAVE_BF16_ATTENTION
  if (nativeBf16())
    return causalAttentionGradBf16(q, k, v, g, dq, dk, dv, shape, kvHeads, scale, seqMajor,
                                   qkvStride, positions, out, lse);
#endif
  causalAttentionGradOf(q, k, v, g, dq, dk, dv, shape, kvHeads, scale, seqMajor, qkvStride,
                        positions, out, lse);
}

KernelResult checkDocumentPositions(const int32_t *positions, int64_t batch, int64_t seq) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i)
      if (const int32_t p = positions[b * seq + i]; p < 0 || p > i)
        return KernelResult::error("document position ", p, " of token ", i, " (batch entry ", b,
                                   ") is outside [0, ", i, "]: a token's position in its "
                                   "document cannot exceed its index in the sequence");
  return KernelResult::ok();
}

namespace {
/// Attention of new tokens over a key/value cache (decode plans): q [b, heads,
/// t, d], k / v [b, kvHeads, t, d], caches [b, kvHeads, context, d] (the new
/// ones in `kcOut` / `vcOut`, which may be the old ones), positions [b, t].
KernelResult cachedAttention(const TensorView &q, const TensorView &k, const TensorView &v,
                             const TensorView &kcIn, const TensorView &vcIn, const int32_t *pos,
                             const TensorView &out, const TensorView &kcOut,
                             const TensorView &vcOut, double scaleAttr) {
  const int64_t batch = q.dim(0), heads = q.dim(1), tokens = q.dim(2), d = q.dim(3);
  const int64_t kvHeads = k.dim(1), context = kcIn.dim(2), group = heads / kvHeads;
  for (int64_t i = 0; i < batch * tokens; ++i)
    if (pos[i] < 0 || pos[i] >= context)
      return badId("position", pos[i], i, context);
  if (kcOut.data != kcIn.data)
    std::memcpy(kcOut.data, kcIn.data, static_cast<size_t>(kcIn.bytes()));
  if (vcOut.data != vcIn.data)
    std::memcpy(vcOut.data, vcIn.data, static_cast<size_t>(vcIn.bytes()));
  float *kc = kcOut.f32(), *vc = vcOut.f32();
  const float *kn = k.f32(), *vn = v.f32();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < kvHeads; ++h)
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t row = ((b * kvHeads + h) * context + pos[b * tokens + t]) * d;
        int64_t src = ((b * kvHeads + h) * tokens + t) * d;
        std::memcpy(kc + row, kn + src, sizeof(float) * static_cast<size_t>(d));
        std::memcpy(vc + row, vn + src, sizeof(float) * static_cast<size_t>(d));
      }
  const float scale = static_cast<float>(scaleAttr);
  const float *qd = q.f32();
  float *y = out.f32();
#pragma omp parallel if (batch * heads * tokens * context * d > 65536)
  {
    std::vector<float> w(static_cast<size_t>(context));
#pragma omp for collapse(2)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / group;
        const float *kh = kc + (b * kvHeads + g) * context * d;
        const float *vh = vc + (b * kvHeads + g) * context * d;
        for (int64_t t = 0; t < tokens; ++t) {
          const float *qr = qd + ((b * heads + h) * tokens + t) * d;
          float *yr = y + ((b * heads + h) * tokens + t) * d;
          const int64_t keys = pos[b * tokens + t] + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < keys; ++j) {
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t c = 0; c < d; ++c)
              s += qr[c] * kh[j * d + c];
            w[static_cast<size_t>(j)] = s * scale;
            mx = std::max(mx, w[static_cast<size_t>(j)]);
          }
          float sum = 0.0f;
          for (int64_t j = 0; j < keys; ++j) {
            w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx);
            sum += w[static_cast<size_t>(j)];
          }
          std::fill(yr, yr + d, 0.0f);
          for (int64_t j = 0; j < keys; ++j) {
            const float p = w[static_cast<size_t>(j)] / sum;
#pragma omp simd
            for (int64_t c = 0; c < d; ++c)
              yr[c] += p * vh[j * d + c];
          }
        }
      }
  }
  return KernelResult::ok();
}
} // namespace

namespace {
/// A view's data as the element type `like` points to (f32 or bf16 bits).
inline float *storage(const TensorView &v, const float *) { return v.f32(); }
inline uint16_t *storage(const TensorView &v, const uint16_t *) {
  return static_cast<uint16_t *>(v.data);
}

/// Runs body(qkv's data, its dims, the query's [batch, heads, seq, dim] shape,
/// the scale) on the fused projection's element type; `heads` is the
/// [batch, seq, heads, dim] result or gradient.
template <typename Body>
KernelResult onFusedQkv(const KernelCall &c, const TensorView &qkv, const TensorView &heads,
                        Body body) {
  const FusedQkvDims f = fusedQkvDims(qkv, heads);
  const Shape shape{f.dims.batch, f.dims.heads, f.dims.seq, f.dims.dim};
  const auto scale = static_cast<float>(c.attr(attr::ScaledAttention::scale));
  if (qkv.dtype == DType::BF16)
    body(static_cast<const uint16_t *>(qkv.data), f, shape, scale);
  else
    body(static_cast<const float *>(qkv.f32()), f, shape, scale);
  return KernelResult::ok();
}

/// The causal attention entries' element types: f32OrBf16WithIds, but for
/// the row statistics (a forward's second output, a gradient's input after
/// the saved result), which are f32 whatever the operands' type.
bool attentionTypes(const KernelCall &c) {
  const DType t = c.output(0).dtype;
  if (t != DType::F32 && t != DType::BF16)
    return false;
  const size_t statsInput = hasSavedAttentionStats(c.op, c.numInputs)
                                ? attentionBaseInputs(c.op) + 1
                                : c.numInputs;
  for (size_t i = 0; i < c.numInputs; ++i) {
    const DType want = i == statsInput ? DType::F32 : t;
    if (c.in[i].dtype != want && c.in[i].dtype != DType::I32)
      return false;
  }
  for (size_t i = 0; i < c.numOutputs; ++i) {
    const bool stats = i == 1 && (c.op == OpKind::CausalAttention ||
                                  c.op == OpKind::CausalAttentionQkv);
    if (c.out[i].dtype != (stats ? DType::F32 : t))
      return false;
  }
  return true;
}
} // namespace

void addAttentionKernels(KernelTable &t) {
  // q [batch, heads, seq, dim]; k, v [batch, kvHeads, seq, dim] (with the
  // optional integer seq_major = 1: [batch, seq, heads, dim] and [batch, seq,
  // kvHeads, dim], read and written in place). f32: f32 products. bf16: bf16
  // dot products where the CPU has them (nativeBf16), else the heads widened
  // to f32 per head.
  t.add(
      OpKind::CausalAttention,
      [](const KernelCall &c) {
        const TensorView &q = c.input(0);
        const AttentionDims a = attentionDims(c);
        const Shape shape{a.batch, a.heads, a.seq, a.dim};
        const auto scale = static_cast<float>(c.attr(attr::Attention::scale));
        const int32_t *positions = documentPositions(c);
        if (positions)
          if (KernelResult r = checkDocumentPositions(positions, a.batch, a.seq); !r.isOk())
            return r;
        float *lse = attentionStatsOutput(c);
        if (q.dtype == DType::BF16)
          causalAttention(bf16In(q), bf16In(c.input(1)), bf16In(c.input(2)), bf16Out(c.output(0)),
                          shape, a.kvHeads, scale, a.seqMajor, 0, positions, lse);
        else
          causalAttention(q.f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(), shape,
                          a.kvHeads, scale, a.seqMajor, 0, positions, lse);
        return KernelResult::ok();
      },
      attentionTypes);
  t.add(
      OpKind::CausalAttentionGrad,
      [](const KernelCall &c) {
        const TensorView &q = c.input(0);
        const AttentionDims a = attentionDims(c);
        const Shape shape{a.batch, a.heads, a.seq, a.dim};
        const auto scale = static_cast<float>(c.attr(attr::Attention::scale));
        const int32_t *positions = documentPositions(c);
        if (positions)
          if (KernelResult r = checkDocumentPositions(positions, a.batch, a.seq); !r.isOk())
            return r;
        const SavedAttentionStats saved = savedAttentionStats(c);
        if (q.dtype == DType::BF16)
          causalAttentionGrad(bf16In(q), bf16In(c.input(1)), bf16In(c.input(2)),
                              bf16In(c.input(3)), bf16Out(c.output(0)), bf16Out(c.output(1)),
                              bf16Out(c.output(2)), shape, a.kvHeads, scale, a.seqMajor, 0,
                              positions, saved ? bf16In(*saved.result) : nullptr, saved.lse);
        else
          causalAttentionGrad(q.f32(), c.input(1).f32(), c.input(2).f32(), c.input(3).f32(),
                              c.output(0).f32(), c.output(1).f32(), c.output(2).f32(), shape,
                              a.kvHeads, scale, a.seqMajor, 0, positions,
                              saved ? saved.result->f32() : nullptr, saved.lse);
        return KernelResult::ok();
      },
      attentionTypes);
  // The fused projection's layout: q, k, v (and their gradients) are column
  // blocks of qkv [batch, seq, width], read and written in place.
  t.add(
      OpKind::CausalAttentionQkv,
      [](const KernelCall &c) {
        const TensorView &qkv = c.input(0), &out = c.output(0);
        const int32_t *positions = documentPositions(c);
        if (positions)
          if (KernelResult r = checkDocumentPositions(positions, qkv.dim(0), qkv.dim(1));
              !r.isOk())
            return r;
        return onFusedQkv(c, qkv, out, [&](auto *p, const FusedQkvDims &f, const Shape &shape,
                                           float scale) {
          causalAttention(p, p + f.kOffset, p + f.vOffset, storage(out, p), shape,
                          f.dims.kvHeads, scale, true, f.width, positions,
                          attentionStatsOutput(c));
        });
      },
      attentionTypes);
  t.add(
      OpKind::CausalAttentionQkvGrad,
      [](const KernelCall &c) {
        const TensorView &qkv = c.input(0), &g = c.input(1);
        const int32_t *positions = documentPositions(c);
        if (positions)
          if (KernelResult r = checkDocumentPositions(positions, qkv.dim(0), qkv.dim(1));
              !r.isOk())
            return r;
        return onFusedQkv(c, qkv, g, [&](auto *p, const FusedQkvDims &f, const Shape &shape,
                                         float scale) {
          auto *d = storage(c.output(0), p);
          const SavedAttentionStats saved = savedAttentionStats(c);
          causalAttentionGrad(p, p + f.kOffset, p + f.vOffset, storage(g, p), d, d + f.kOffset,
                              d + f.vOffset, shape, f.dims.kvHeads, scale, true, f.width,
                              positions, saved ? storage(*saved.result, p) : nullptr, saved.lse);
        });
      },
      attentionTypes);
  // Decode plans: q [batch, heads, tokens, dim], k / v [batch, kvHeads, tokens,
  // dim], caches [batch, kvHeads, context, dim], positions [batch, tokens].
  t.add(OpKind::CachedAttention, [](const KernelCall &c) {
    return cachedAttention(c.input(0), c.input(1), c.input(2), c.input(3), c.input(4),
                           c.input(5).i32(), c.output(0), c.output(1), c.output(2),
                           c.attr(attr::ScaledAttention::scale));
  });
}

} // namespace ptc::kernels::cpu
