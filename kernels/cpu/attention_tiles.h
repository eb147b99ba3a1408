// The CPU attention kernels' building blocks (internal to kernels/cpu):
// register-blocked products of f32 tiles with causal limits (AVX-512 or
// AVX2 + FMA), tile transposes, a block of query rows made probabilities
// (softmax) and the scores' gradients, and the key window of a block of
// packed documents. Shared by the heads' kernels (attention.cc) and ring
// attention's blocks (attention_blocks.cc).
#pragma once

#include "kernels/cpu/internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace ptc::kernels::cpu::attention_tiles {
using namespace internal;

constexpr int64_t kQueryBlock = 32;
/// A row of scores is made probabilities (softmaxRows) and score gradients
/// (scoreGradients) in whole vectors of this many keys up to its causal
/// limit, and zero after: the columns a causal product must compute.
constexpr int64_t kScoreLanes = 16;

inline int64_t paddedKeys(int64_t visible, int64_t keys) {
  return std::min(keys, (visible + kScoreLanes - 1) / kScoreLanes * kScoreLanes);
}

/// What the causal mask leaves of a product over a query block whose first
/// row is row `diagonal` of the sequence (products with one operand or the
/// result indexed by the block's query rows and the other by keys); per
/// register block of rows [i, i + r):
enum class Causal {
  /// every column and every term of the sum;
  kNone,
  /// C's row i + x (query diagonal + i + x) sees the keys (columns) up to
  /// diagonal + i + x: the columns from paddedKeys(diagonal + i + r) on are
  /// not computed (their scores are not read; the probabilities and score
  /// gradients there are set to zero);
  kColumns,
  /// A's row i + x is zero after column diagonal + i + x (probabilities or
  /// score gradients times keys or values): the sum ends at diagonal + i + r;
  kSumEnd,
  /// A(i + x, p) is P[p][i + x] (probabilities or score gradients transposed,
  /// times the block's queries or incoming gradients), zero for queries p <
  /// i + x - diagonal: the sum starts at i - diagonal.
  kSumStart,
};

#ifdef __AVX512F__
// Register block of the products: up to 8 rows x 2 vectors of accumulators
// (16 of the 32 registers), written straight into C (masked at the right
// edge), so that a short inner dimension (the head size) is not dominated by
// a copy-out.
constexpr int64_t kRows = 8, kCols = 32;

/// The lanes of a 16-column vector that hold some of `cols` columns.
inline __mmask16 columnMask(int64_t cols) {
  return cols >= 16 ? __mmask16(0xffff) : cols <= 0 ? __mmask16(0) : __mmask16((1u << cols) - 1u);
}

/// C's R rows (+)= a block's accumulators (two vectors a row, masked by m0, m1).
template <int R>
inline void storeBlock(__m512 (&acc)[R][2], float *c, int64_t ldc, __mmask16 m0, __mmask16 m1,
                       bool accumulate) {
  for (int r = 0; r < R; ++r) {
    float *cr = c + r * ldc;
    if (accumulate) {
      acc[r][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), acc[r][0]);
      acc[r][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), acc[r][1]);
    }
    _mm512_mask_storeu_ps(cr, m0, acc[r][0]);
    _mm512_mask_storeu_ps(cr + 16, m1, acc[r][1]);
  }
}

/// C[R rows][cols] (+)= sum_p A(r, p) * B[p][0..cols) for cols <= 32, where
/// A(r, p) is a[r * rowStride + p * colStride] (rows of A, or of A^T).
template <int R>
inline void blockRows(const float *a, int64_t rowStride, int64_t colStride, const float *b,
                      int64_t ldb, float *c, int64_t ldc, int64_t k, int64_t cols,
                      bool accumulate) {
  const __mmask16 m0 = columnMask(cols), m1 = columnMask(cols - 16);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r)
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if (m1 != 0) {
    for (int64_t p = 0; p < k; ++p) {
      const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);
      const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * rowStride + p * colStride]);
        acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
      }
    }
  } else {
    for (int64_t p = 0; p < k; ++p) {
      const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);
      for (int r = 0; r < R; ++r)
        acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * rowStride + p * colStride]), b0, acc[r][0]);
    }
  }
  storeBlock<R>(acc, c, ldc, m0, m1, accumulate);
}

#elif defined(__AVX2__) && defined(__FMA__)
// Register block of the products with AVX2: up to 6 rows x 2 vectors of 8
// accumulators (12 of the 16 registers, the other 3 for B's two vectors and
// A's broadcast), written straight into C (masked at the right edge). The
// plain loop below ran the bench's attention (ptc-bench-kernels, AMD EPYC,
// one core) at 2.6-2.9 GFLOP/s, these blocks at 36-50.
constexpr int64_t kRows = 6, kCols = 16;

/// The lanes of an 8-column vector that hold some of `cols` columns.
inline __m256i columnMask(int64_t cols) {
  const int n = static_cast<int>(std::clamp<int64_t>(cols, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// C[R rows][cols] (+)= sum_p A(r, p) * B[p][0..cols) for cols <= 16, where
/// A(r, p) is a[r * rowStride + p * colStride] (rows of A, or of A^T).
template <int R>
inline void blockRows(const float *a, int64_t rowStride, int64_t colStride, const float *b,
                      int64_t ldb, float *c, int64_t ldc, int64_t k, int64_t cols,
                      bool accumulate) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r)
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  // Whole blocks load unmasked; an edge block masks both vectors (the second
  // all-zero where cols <= 8: its accumulators stay 0 and are not stored).
  const bool full = cols == kCols;
  const __m256i m0 = columnMask(cols), m1 = columnMask(cols - 8);
  for (int64_t p = 0; p < k; ++p) {
    const float *bp = b + p * ldb;
    const __m256 b0 = full ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, m0);
    const __m256 b1 = full ? _mm256_loadu_ps(bp + 8) : _mm256_maskload_ps(bp + 8, m1);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * rowStride + p * colStride);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float *cr = c + r * ldc;
    if (full) {
      if (accumulate) {
        acc[r][0] = _mm256_add_ps(_mm256_loadu_ps(cr), acc[r][0]);
        acc[r][1] = _mm256_add_ps(_mm256_loadu_ps(cr + 8), acc[r][1]);
      }
      _mm256_storeu_ps(cr, acc[r][0]);
      _mm256_storeu_ps(cr + 8, acc[r][1]);
      continue;
    }
    if (accumulate) {
      acc[r][0] = _mm256_add_ps(_mm256_maskload_ps(cr, m0), acc[r][0]);
      acc[r][1] = _mm256_add_ps(_mm256_maskload_ps(cr + 8, m1), acc[r][1]);
    }
    _mm256_maskstore_ps(cr, m0, acc[r][0]);
    _mm256_maskstore_ps(cr + 8, m1, acc[r][1]);
  }
}

#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
template <int R = kRows>
inline void blockOf(int64_t rows, const float *a, int64_t rowStride, int64_t colStride,
                    const float *b, int64_t ldb, float *c, int64_t ldc, int64_t k, int64_t cols,
                    bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R)
      return blockOf<R - 1>(rows, a, rowStride, colStride, b, ldb, c, ldc, k, cols, accumulate);
  }
  blockRows<R>(a, rowStride, colStride, b, ldb, c, ldc, k, cols, accumulate);
}

/// C[m][n] (+)= A * B[k][n] with A(r, p) = a[r * rowStride + p * colStride]:
/// A [m][k] row-major is (lda, 1), A^T of a row-major [k][m] is (1, lda).
/// `accumulate` adds to C instead of overwriting it. `causal` leaves out
/// what the mask zeroes (Causal): the terms left out are zeros times finite
/// values, so every computed element is bitwise what the whole sum gives.
inline void product(const float *a, int64_t rowStride, int64_t colStride, const float *b, int64_t ldb,
             float *c, int64_t ldc, int64_t m, int64_t n, int64_t k, bool accumulate,
             Causal causal = Causal::kNone, int64_t diagonal = 0) {
  for (int64_t i = 0; i < m; i += kRows) {
    const int64_t rows = std::min(kRows, m - i);
    int64_t columns = n, k0 = 0, k1 = k;
    if (causal == Causal::kColumns)
      columns = paddedKeys(diagonal + i + rows, n);
    else if (causal == Causal::kSumEnd)
      k1 = std::min(k, diagonal + i + rows);
    else if (causal == Causal::kSumStart)
      k0 = std::clamp<int64_t>(i - diagonal, 0, k);
    if (k1 <= k0) { // an empty sum
      if (!accumulate)
        for (int64_t r = 0; r < rows; ++r)
          std::fill(c + (i + r) * ldc, c + (i + r) * ldc + columns, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < columns; j += kCols)
      blockOf(rows, a + i * rowStride + k0 * colStride, rowStride, colStride, b + k0 * ldb + j,
              ldb, c + i * ldc + j, ldc, k1 - k0, std::min(kCols, columns - j), accumulate);
  }
}
#else
/// C[m][n] (+)= A * B[k][n] with A(r, p) = a[r * rowStride + p * colStride]:
/// A [m][k] row-major is (lda, 1), A^T of a row-major [k][m] is (1, lda).
/// `accumulate` adds to C instead of overwriting it. Register blocks of
/// 4 rows x 16 columns. Computes the whole product whatever `causal` says
/// (what the mask leaves is within it).
inline void product(const float *a, int64_t rowStride, int64_t colStride, const float *b, int64_t ldb,
             float *c, int64_t ldc, int64_t m, int64_t n, int64_t k, bool accumulate,
             Causal = Causal::kNone, int64_t = 0) {
  constexpr int64_t kRows = 4, kCols = 16;
  for (int64_t i = 0; i < m; i += kRows) {
    int64_t rows = std::min(kRows, m - i);
    const float *ai = a + i * rowStride;
    for (int64_t j = 0; j < n; j += kCols) {
      int64_t cols = std::min(kCols, n - j);
      float acc[kRows][kCols] = {};
      for (int64_t p = 0; p < k; ++p)
        for (int64_t r = 0; r < rows; ++r) {
          float av = ai[r * rowStride + p * colStride];
#pragma omp simd
          for (int64_t x = 0; x < kCols; ++x)
            acc[r][x] += av * (x < cols ? b[p * ldb + j + x] : 0.0f);
        }
      for (int64_t r = 0; r < rows; ++r) {
        float *cr = c + (i + r) * ldc + j;
        for (int64_t x = 0; x < cols; ++x)
          cr[x] = accumulate ? cr[x] + acc[r][x] : acc[r][x];
      }
    }
  }
}
#endif

/// C[m][n] (+)= A[m][k] B[k][n].
inline void productNN(const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
               int64_t m, int64_t n, int64_t k, bool accumulate, Causal causal = Causal::kNone,
               int64_t diagonal = 0) {
  product(a, lda, 1, b, ldb, c, ldc, m, n, k, accumulate, causal, diagonal);
}

/// C[m][n] += A^T B with A [k][m] and B [k][n] row-major.
inline void productTNAccumulate(const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                         int64_t ldc, int64_t m, int64_t n, int64_t k,
                         Causal causal = Causal::kNone, int64_t diagonal = 0) {
  product(a, 1, lda, b, ldb, c, ldc, m, n, k, /*accumulate=*/true, causal, diagonal);
}

#ifdef __AVX512F__
/// out[c][r] = in[r][c] for a kTile x kTile block, 16 x 16: 32-bit and 64-bit
/// unpacks within 128-bit lanes, then two rounds of lane shuffles (no scalar moves).
constexpr int64_t kTile = 16;
inline void transposeTile(const float *in, int64_t ldi, float *out, int64_t ldo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = _mm512_loadu_ps(in + i * ldi);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  // r[g + m]: in each 128-bit lane l, column 4 l + m of rows g .. g + 3.
  for (int g = 0; g < 16; g += 4) {
    r[g] = lo(t[g], t[g + 2]);
    r[g + 1] = hi(t[g], t[g + 2]);
    r[g + 2] = lo(t[g + 1], t[g + 3]);
    r[g + 3] = hi(t[g + 1], t[g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 v0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);
    const __m512 w0 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
    const __m512 w1 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
    _mm512_storeu_ps(out + m * ldo, _mm512_shuffle_f32x4(v0, w0, 0x88));
    _mm512_storeu_ps(out + (4 + m) * ldo, _mm512_shuffle_f32x4(v0, w0, 0xDD));
    _mm512_storeu_ps(out + (8 + m) * ldo, _mm512_shuffle_f32x4(v1, w1, 0x88));
    _mm512_storeu_ps(out + (12 + m) * ldo, _mm512_shuffle_f32x4(v1, w1, 0xDD));
  }
}
#elif defined(__AVX2__)
/// out[c][r] = in[r][c] for a kTile x kTile block, 8 x 8: unpacks and shuffles
/// within 128-bit lanes, then the lanes exchanged.
constexpr int64_t kTile = 8;
inline void transposeTile(const float *in, int64_t ldi, float *out, int64_t ldo) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm256_loadu_ps(in + i * ldi);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  // r[g + m]: in each 128-bit lane l, column 4 l + m of rows g .. g + 3.
  for (int g = 0; g < 8; g += 4) {
    r[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    r[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    r[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    r[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    _mm256_storeu_ps(out + m * ldo, _mm256_permute2f128_ps(r[m], r[4 + m], 0x20));
    _mm256_storeu_ps(out + (4 + m) * ldo, _mm256_permute2f128_ps(r[m], r[4 + m], 0x31));
  }
}
#endif

/// out [d][s] = in [s][d] transposed (16 x 16 register blocks with AVX-512, 8 x 8 with AVX2),
/// in's rows `ld` apart (default d: back to back). 32-bit elements: floats,
/// or pairs of bf16 (moved, never computed on).
template <typename T>
inline void transposeInto(const T *in, int64_t s, int64_t d, T *out, int64_t ld = -1) {
  static_assert(sizeof(T) == 4, "register blocks of 32-bit elements");
  if (ld < 0)
    ld = d;
  int64_t i0 = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  int64_t c0 = 0;
  for (; i0 + kTile <= s; i0 += kTile)
    for (c0 = 0; c0 + kTile <= d; c0 += kTile)
      transposeTile(reinterpret_cast<const float *>(in + i0 * ld + c0), ld,
                    reinterpret_cast<float *>(out + c0 * s + i0), s);
  // The columns right of the last whole block, for the rows done above.
  for (int64_t i = 0; i < i0; ++i)
    for (int64_t c = c0; c < d; ++c)
      out[c * s + i] = in[i * ld + c];
#endif
  for (int64_t i = i0; i < s; ++i)
    for (int64_t c = 0; c < d; ++c)
      out[c * s + i] = in[i * ld + c];
}

/// The scores p [rows][i0 + rows] of query rows [i0, i0 + rows) made
/// probabilities in place: softmax(scale * p[r][j]) over the keys j <= i0 + r,
/// 0 after; with `lo` (packed documents), over lo[r] <= j <= i0 + r only, 0
/// before. One query block: rows <= kQueryBlock. With `lse`, each row's
/// log-sum-exp of its scaled scores goes to lse[r] (the row statistics the
/// backward pass reads instead of recomputing them).
inline void softmaxRows(float *p, int64_t i0, int64_t rows, float scale, const int32_t *lo = nullptr,
                        float *lse = nullptr) {
  // Phase by phase over the block's rows: each row's maximum, sum and
  // reciprocal are short dependent chains (a sum's lanes added in order, a
  // division), which overlap across rows when no row waits on its own.
  const int64_t keys = i0 + rows;
  float mx[kQueryBlock], inv[kQueryBlock];
  int32_t padded[kQueryBlock];
  for (int64_t r = 0; r < rows; ++r) {
    // Scaling is monotonic, so max(scale * x) is scale * max(x) exactly.
    const int64_t seen = i0 + r + 1, first = lo ? lo[r] : 0;
    mx[r] = maxOf(p + r * keys + first, seen - first) * scale;
    // Whole vectors up to the causal limit (a scalar exp per leftover key
    // cost more than the vectors), masked to zero past it.
    padded[r] = static_cast<int32_t>(paddedKeys(seen, keys));
  }
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * keys;
    const float m = mx[r];
    // 32-bit indices: a 64-bit compare would halve the vectors' width.
    // Keys before the document's first (packed documents) are masked too:
    // their exponent, of a score that may exceed the row's maximum, is
    // discarded. (One loop for both: a plain causal row computes exactly
    // what it did without documents.)
    const int32_t visible = static_cast<int32_t>(i0 + r + 1), n = padded[r],
                  first = lo ? lo[r] : 0;
#pragma omp simd
    for (int32_t c = 0; c < n; ++c) {
      float e = expNonPositive(pr[c] * scale - m);
      pr[c] = c < visible && c >= first ? e : 0.0f;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float *pr = p + r * keys;
    const int32_t n = padded[r];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int32_t c = 0; c < n; ++c)
      sum += pr[c];
    inv[r] = sum;
  }
  if (lse)
    for (int64_t r = 0; r < rows; ++r)
      lse[r] = mx[r] + std::log(inv[r]);
  for (int64_t r = 0; r < rows; ++r)
    inv[r] = 1.0f / inv[r];
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * keys;
    const float f = inv[r];
    const int32_t n = padded[r];
#pragma omp simd
    for (int32_t c = 0; c < n; ++c)
      pr[c] *= f;
    std::fill(pr + n, pr + keys, 0.0f);
  }
}

/// The scores p [rows][i0 + rows] made probabilities from the forward's row
/// statistics: exp(scale * p[r][j] - lse[r]) over the visible keys (softmaxRows'
/// mask), 0 elsewhere; no maximum, sum or division (lse[r] is at least the
/// row's largest scaled score, so every exponent is at most 0).
inline void probabilitiesFromStats(float *p, int64_t i0, int64_t rows, float scale,
                                   const float *lse, const int32_t *lo = nullptr) {
  const int64_t keys = i0 + rows;
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * keys;
    const float m = lse[r];
    const int32_t visible = static_cast<int32_t>(i0 + r + 1),
                  n = static_cast<int32_t>(paddedKeys(i0 + r + 1, keys)), first = lo ? lo[r] : 0;
#pragma omp simd
    for (int32_t c = 0; c < n; ++c) {
      float e = expNonPositive(std::min(pr[c] * scale - m, 0.0f));
      pr[c] = c < visible && c >= first ? e : 0.0f;
    }
    std::fill(pr + n, pr + keys, 0.0f);
  }
}

/// dS = P (dP - rowsum(P dP)) * scale in place of dP for query rows [i0, i0 +
/// rows) (rows <= kQueryBlock) of `keys` = i0 + rows columns: the row sums
/// first, so that their chains overlap. Each row up to its paddedKeys (P is
/// zero after its causal limit, dP need not be computed past paddedKeys:
/// Causal::kColumns), zero after.
/// With `rowDots` (the forward's result saved: rowsum(P dP) = dO . O), the
/// row sums are rowDots[r].
inline void scoreGradients(const float *p, float *dp, int64_t i0, int64_t rows, float scale,
                           const float *rowDots = nullptr) {
  const int64_t keys = i0 + rows;
  float t[kQueryBlock];
  for (int64_t r = 0; r < rows && rowDots; ++r)
    t[r] = rowDots[r];
  for (int64_t r = 0; r < rows && !rowDots; ++r) {
    const float *pr = p + r * keys, *dpr = dp + r * keys;
    const int64_t n = paddedKeys(i0 + r + 1, keys);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j)
      sum += pr[j] * dpr[j];
    t[r] = sum;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float *pr = p + r * keys;
    float *dpr = dp + r * keys;
    const int64_t n = paddedKeys(i0 + r + 1, keys);
    const float tr = t[r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      dpr[j] = pr[j] * (dpr[j] - tr) * scale;
    std::fill(dpr + n, dpr + keys, 0.0f);
  }
}

/// The probabilities of query rows [i0, i0 + rows) of one head (`qRows`, row
/// i0 first): p[r][j] for the keys j <= i0 + r (0 after), `keys` = i0 + rows
/// columns, from the transposed keys kt [d][s].
/// With `lse`, the rows' log-sum-exp is written there (the forward pass); with
/// `savedLse`, the probabilities come from it (a backward pass given the
/// forward's statistics).
inline void probabilities(const float *qRows, int64_t ldq, const float *kt, int64_t s, int64_t d,
                          int64_t i0, int64_t rows, float scale, float *p,
                          const int32_t *lo = nullptr, float *lse = nullptr,
                          const float *savedLse = nullptr) {
  int64_t keys = i0 + rows;
  productNN(qRows, ldq, kt, s, p, keys, rows, keys, d, /*accumulate=*/false, Causal::kColumns, i0);
  if (savedLse)
    probabilitiesFromStats(p, i0, rows, scale, savedLse, lo);
  else
    softmaxRows(p, i0, rows, scale, lo, lse);
}

/// The keys a query block [i0, i0 + rows) of one batch entry attends
/// (packed documents): from `first`, the earliest start of its rows'
/// documents (their rows' starts, relative to it, in lo); without positions,
/// from key 0. The block is then computed as the block i0 - first of a
/// sequence that starts at key `first`: what precedes it is never read.
struct KeyWindow {
  int64_t first = 0;
  int32_t lo[kQueryBlock] = {};
  const int32_t *los() const { return lo; }
};
inline KeyWindow keyWindow(const int32_t *positions, int64_t i0, int64_t rows) {
  KeyWindow w;
  if (!positions)
    return w;
  int64_t first = i0;
  for (int64_t r = 0; r < rows; ++r)
    first = std::min<int64_t>(first, i0 + r - positions[i0 + r]);
  w.first = first;
  for (int64_t r = 0; r < rows; ++r)
    w.lo[r] = static_cast<int32_t>(i0 + r - positions[i0 + r] - first);
  return w;
}
/// keyWindow from an even key (the bf16 kernels take keys in pairs).
inline KeyWindow evenKeyWindow(const int32_t *positions, int64_t i0, int64_t rows) {
  KeyWindow w = keyWindow(positions, i0, rows);
  if (w.first % 2 != 0) {
    --w.first;
    for (int64_t r = 0; r < rows; ++r)
      ++w.lo[r];
  }
  return w;
}

} // namespace ptc::kernels::cpu::attention_tiles
