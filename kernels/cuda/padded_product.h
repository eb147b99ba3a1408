// A 16-bit row-major product C[m, n] = op(A)[m, k] op(B)[k, n] whose m, n or k
// is not a multiple of 8 (an LM head over a vocabulary of 50257) runs on
// cuBLAS's slow kernels: 90-150 TFLOP/s on an H200 where aligned shapes run at
// ~700. Such a product runs instead on zero-padded copies: B once, as B' with
// k and n rounded up to multiples of 8; then, chunk by chunk of C's rows, A's
// rows (or columns, transposed) as A' with k rounded up, the product into C'
// with n rounded up, and C's rows copied out of C'. The padding is zeros, so
// each element of C is the same sum of products as in one GEMM (f32
// accumulation, one rounding).
//
// This header plans the copies and products (host code, no CUDA) so that the
// indexing is tested on any machine (test/unit/KernelsTest.cpp runs the plan
// with plain loops); matmul.cu runs it with cudaMemcpy2DAsync and cuBLAS.
#ifndef PTC_KERNELS_CUDA_PADDED_PRODUCT_H
#define PTC_KERNELS_CUDA_PADDED_PRODUCT_H

#include <algorithm>
#include <cstdint>
#include <optional>

namespace ptc::kernels::cuda {

inline constexpr int64_t kProductAlignment = 8; // 16-bit elements in 16 bytes
inline int64_t roundUp8(int64_t x) {
  return (x + kProductAlignment - 1) / kProductAlignment * kProductAlignment;
}

/// The buffers of a padded product: the operands and their padded copies in scratch.
enum class ProductBuffer { A, B, C, PaddedA, PaddedB, PaddedC };

struct PaddedProduct {
  int64_t m, n, k;
  bool transA, transB;
  int64_t kP, nP;    // k and n rounded up to multiples of 8
  bool padB;         // B runs as B' ([kP, nP], or [nP, kP] transposed)
  int64_t chunkRows; // C's rows per chunk (a multiple of 8)
  // Scratch, in elements: B', A' ([chunkRows, kP], or [kP, chunkRows]
  // transposed: a fixed leading dimension, so its zero padding stays zero) and
  // C' ([chunkRows, nP]).
  int64_t bElems, aElems, cElems;
};

/// The padded plan of a product, or nothing when m, n and k are all
/// multiples of 8 (cuBLAS runs it as it is). `chunkElements` bounds A' + C'.
inline std::optional<PaddedProduct> paddedProductFor(int64_t m, int64_t n, int64_t k, bool transA,
                                                     bool transB, int64_t chunkElements) {
  if (m % kProductAlignment == 0 && n % kProductAlignment == 0 && k % kProductAlignment == 0)
    return std::nullopt;
  PaddedProduct p{};
  p.m = m;
  p.n = n;
  p.k = k;
  p.transA = transA;
  p.transB = transB;
  p.kP = roundUp8(k);
  p.nP = roundUp8(n);
  p.padB = p.kP != k || p.nP != n;
  p.chunkRows = std::max<int64_t>(chunkElements / (p.kP + p.nP) / kProductAlignment *
                                      kProductAlignment,
                                  kProductAlignment);
  p.chunkRows = std::min(p.chunkRows, roundUp8(m));
  p.bElems = p.padB ? p.kP * p.nP : 0;
  p.aElems = p.chunkRows * p.kP;
  p.cElems = p.chunkRows * p.nP;
  return p;
}

/// What a chunk of C's rows [r0, r0 + rows) needs: A through A' or in
/// place, C through C' or in place, each operand's offset (elements) and
/// leading dimension, and the product's sizes (mc rows, padded to 8).
struct ProductChunk {
  int64_t r0, rows, mc;
  bool copyA, viaC;
  ProductBuffer a, b, c;
  int64_t aOffset, cOffset, lda, ldb, ldc;
  int64_t gemmN, gemmK;
};

inline ProductChunk productChunk(const PaddedProduct &p, int64_t r0) {
  ProductChunk c{};
  c.r0 = r0;
  c.rows = std::min(p.chunkRows, p.m - r0);
  c.mc = roundUp8(c.rows);
  // A in place needs aligned rows (k, or m when transposed) and whole rows of
  // padding to read (a last chunk of fewer rows would read past A's end).
  const int64_t lda = p.transA ? p.m : p.k;
  c.copyA = p.kP != p.k || lda % kProductAlignment != 0 || c.mc != c.rows;
  c.a = c.copyA ? ProductBuffer::PaddedA : ProductBuffer::A;
  c.aOffset = c.copyA ? 0 : (p.transA ? r0 : r0 * p.k);
  c.lda = c.copyA ? (p.transA ? p.chunkRows : p.kP) : lda;
  c.b = p.padB ? ProductBuffer::PaddedB : ProductBuffer::B;
  c.gemmN = p.padB ? p.nP : p.n;
  c.gemmK = p.padB ? p.kP : p.k;
  c.ldb = p.transB ? c.gemmK : c.gemmN;
  c.viaC = p.nP != p.n || c.mc != c.rows;
  c.c = c.viaC ? ProductBuffer::PaddedC : ProductBuffer::C;
  c.cOffset = c.viaC ? 0 : r0 * p.n;
  c.ldc = c.viaC ? p.nP : p.n;
  return c;
}

/// Runs the plan with `ops`: zero(buffer, elements), copy(dst, dstOffset,
/// dstPitch, src, srcOffset, srcPitch, width, height) of `height` rows of
/// `width` elements, and gemm(chunk) (C[mc, gemmN] = op(A) op(B) over
/// gemmK, on the chunk's buffers). Stops at the first op that returns
/// false.
template <typename Ops> bool runPaddedProduct(const PaddedProduct &p, Ops &ops) {
  using B = ProductBuffer;
  if (p.padB) {
    // B' [kP, nP] (or [nP, kP]): zeros, then B's rows.
    const int64_t rows = p.transB ? p.n : p.k, cols = p.transB ? p.k : p.n;
    const int64_t pitch = p.transB ? p.kP : p.nP;
    if (!ops.zero(B::PaddedB, p.bElems) || !ops.copy(B::PaddedB, 0, pitch, B::B, 0, cols, cols, rows))
      return false;
  }
  // A' starts as zeros: its padding (columns k..kP, or rows k..kP transposed)
  // is never written after.
  if (!ops.zero(B::PaddedA, p.aElems))
    return false;
  for (int64_t r0 = 0; r0 < p.m; r0 += p.chunkRows) {
    const ProductChunk c = productChunk(p, r0);
    if (c.copyA) {
      const bool ok = p.transA
                          // columns r0.. of A [k, m] into A' [kP, chunkRows]
                          ? ops.copy(B::PaddedA, 0, p.chunkRows, B::A, r0, p.m, c.rows, p.k)
                          // rows r0.. of A [m, k] into A' [chunkRows, kP]
                          : ops.copy(B::PaddedA, 0, p.kP, B::A, r0 * p.k, p.k, p.k, c.rows);
      if (!ok)
        return false;
    }
    if (!ops.gemm(c))
      return false;
    if (c.viaC && !ops.copy(B::C, r0 * p.n, p.n, B::PaddedC, 0, p.nP, p.n, c.rows))
      return false;
  }
  return true;
}

} // namespace ptc::kernels::cuda

#endif // PTC_KERNELS_CUDA_PADDED_PRODUCT_H
