// CPU kernels against naive references (the fused and strided paths).

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/padded_product.h"

#include "test/unit/TestUtil.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace ptc::kernels::cpu;

namespace {
using ptc::test::randomVector;

/// A host vector as a kernel's f32 view.
ptc::kernels::TensorView view(std::vector<float> &v, const Shape &shape) {
  return {v.data(), ptc::kernels::DType::F32, &shape, static_cast<int64_t>(v.size())};
}

/// Runs `op` through the CPU kernel table, as the executor calls it.
KernelResult runKernel(ptc::kernels::OpKind op, std::vector<ptc::kernels::TensorView> in,
                       std::vector<ptc::kernels::TensorView> out, std::vector<int64_t> ints = {},
                       std::vector<double> floats = {}, UnaryFunction fn = {}) {
  ptc::kernels::KernelCall call = ptc::kernels::makeKernelCall(op, in, out, ints, floats);
  call.function = fn;
  const ptc::kernels::KernelEntry &entry = kernelTable()[op];
  EXPECT_TRUE(entry.run && entry.accepts(call)) << ptc::kernels::opKindName(op);
  return entry.run(call);
}

/// A host vector of bf16 bits as a kernel's bf16 view.
ptc::kernels::TensorView bf(std::vector<uint16_t> &v, const Shape &shape) {
  return {v.data(), ptc::kernels::DType::BF16, &shape, static_cast<int64_t>(v.size())};
}

/// `v` rounded to bf16: the bits in `b16`, their exact f32 values returned.
std::vector<float> roundToBf16(std::vector<float> v, std::vector<uint16_t> &b16) {
  b16.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    b16[i] = f32ToBf16(v[i]);
    v[i] = bf16ToF32(b16[i]);
  }
  return v;
}

/// Runs `body` once with each f32 GEMM choice (F32Gemm) built, restoring the
/// process's choice after: every one is tested on every CPU, whichever is its default.
template <typename Body> void forEachF32Gemm(Body body) {
  const F32Gemm chosen = f32Gemm();
  for (F32Gemm library : {F32Gemm::OneDnn, F32Gemm::OpenBlas, F32Gemm::Mixed}) {
    if (!f32GemmBuilt(library))
      continue;
    SCOPED_TRACE(f32GemmName(library));
    setF32Gemm(library);
    body();
  }
  setF32Gemm(chosen);
}

void expectNear(const std::vector<float> &a, const std::vector<float> &b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol) << "at " << i;
}

TEST(Kernels, MatmulAllTransposesSharedAndBatched) {
  forEachF32Gemm([] {
  const int64_t B = 3, M = 4, K = 5, N = 6;
  for (bool shared : {true, false})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        auto a = randomVector(B * M * K, 1), b = randomVector((shared ? 1 : B) * K * N, 2);
        std::vector<float> out(B * M * N), ref(B * M * N, 0.0f);
        Shape as = ta ? Shape{B, K, M} : Shape{B, M, K};
        Shape bs = shared ? (tb ? Shape{N, K} : Shape{K, N}) : (tb ? Shape{B, N, K} : Shape{B, K, N});
        matmul(a.data(), as, b.data(), bs, out.data(), ta, tb);
        for (int64_t x = 0; x < B; ++x)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              float s = 0;
              for (int64_t k = 0; k < K; ++k) {
                float av = ta ? a[x * M * K + k * M + i] : a[x * M * K + i * K + k];
                int64_t bo = shared ? 0 : x * K * N;
                float bv = tb ? b[bo + j * K + k] : b[bo + k * N + j];
                s += av * bv;
              }
              ref[x * M * N + i * N + j] = s;
            }
        expectNear(out, ref, 1e-4f);
      }
  });
}

// Each element of a product is one library call's sum over the whole K, and
// the threads' blocks start where the libraries' tiles of the whole product
// start, so the result does not depend on how many threads split the product,
// bitwise, with either library: rows and columns that leave partial blocks
// and tiles, each transpose, a batched product, a small one (on one thread),
// long rows, columns and sums.
// The CUDA backend's plan for products with a size that is not a multiple of 8
// (kernels/cuda/padded_product.h), run here with plain loops: zero-padded
// copies of B and of A's chunks, products into padded C chunks, C's rows
// copied out. Every transpose, odd and even sizes, chunks of 8 rows up to the
// whole product: C equals the direct product, and every element of C is
// written (NaN poison), none outside it.
TEST(Kernels, PaddedProductPlanEqualsTheDirectProduct) {
  using namespace ptc::kernels::cuda;
  std::mt19937 gen(12);
  std::uniform_int_distribution<int> size(1, 70);
  std::uniform_int_distribution<int> small(-3, 3);
  int planned = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t m = size(gen), n = size(gen), k = size(gen);
    const bool transA = trial % 2, transB = (trial / 2) % 2;
    // Chunks of 8, 16, 24 or 32 rows (a last chunk of fewer rows, padded), or one.
    const int64_t chunk = (trial % 5 == 0) ? 1 << 20
                                           : (trial % 4 + 1) * 8 * (roundUp8(k) + roundUp8(n));
    auto plan = paddedProductFor(m, n, k, transA, transB, chunk);
    if (!plan) {
      EXPECT_TRUE(m % 8 == 0 && n % 8 == 0 && k % 8 == 0);
      continue;
    }
    ++planned;
    // Small integers: every sum is exact in float, whatever the order.
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    for (float &x : a)
      x = static_cast<float>(small(gen));
    for (float &x : b)
      x = static_cast<float>(small(gen));
    auto at = [&](int64_t i, int64_t kk) { return transA ? a[kk * m + i] : a[i * k + kk]; };
    auto bt = [&](int64_t kk, int64_t j) { return transB ? b[j * k + kk] : b[kk * n + j]; };
    const float poison = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> c(static_cast<size_t>(m * n + 16), poison);
    // Scratch starts as garbage (NaN): the plan must zero what it reads as padding.
    std::vector<float> pa(static_cast<size_t>(plan->aElems), poison),
        pb(static_cast<size_t>(plan->bElems), poison), pc(static_cast<size_t>(plan->cElems), poison);
    struct Ops {
      std::vector<float> *bufs[6];
      const PaddedProduct *p;
      float &at(ProductBuffer buf, int64_t i) {
        auto &v = *bufs[static_cast<int>(buf)];
        EXPECT_TRUE(i >= 0 && static_cast<size_t>(i) < v.size())
            << "buffer " << static_cast<int>(buf) << " index " << i << " of " << v.size();
        static float dummy;
        return i >= 0 && static_cast<size_t>(i) < v.size() ? v[static_cast<size_t>(i)] : dummy;
      }
      bool zero(ProductBuffer buf, int64_t elems) {
        for (int64_t i = 0; i < elems; ++i)
          at(buf, i) = 0.0f;
        return true;
      }
      bool copy(ProductBuffer dst, int64_t dOff, int64_t dPitch, ProductBuffer src, int64_t sOff,
                int64_t sPitch, int64_t width, int64_t height) {
        EXPECT_LE(width, dPitch);
        EXPECT_LE(width, sPitch);
        for (int64_t r = 0; r < height; ++r)
          for (int64_t x = 0; x < width; ++x)
            at(dst, dOff + r * dPitch + x) = at(src, sOff + r * sPitch + x);
        return true;
      }
      bool gemm(const ProductChunk &ch) {
        EXPECT_EQ(ch.mc % 8, 0);
        EXPECT_EQ(ch.gemmN % 8, 0);
        EXPECT_EQ(ch.gemmK % 8, 0);
        EXPECT_EQ(ch.lda % 8, 0);
        EXPECT_EQ(ch.ldb % 8, 0);
        EXPECT_EQ(ch.ldc % 8, 0);
        for (int64_t i = 0; i < ch.mc; ++i)
          for (int64_t j = 0; j < ch.gemmN; ++j) {
            float sum = 0.0f;
            for (int64_t kk = 0; kk < ch.gemmK; ++kk)
              sum += at(ch.a, ch.aOffset + (p->transA ? kk * ch.lda + i : i * ch.lda + kk)) *
                     at(ch.b, p->transB ? j * ch.ldb + kk : kk * ch.ldb + j);
            at(ch.c, ch.cOffset + i * ch.ldc + j) = sum;
          }
        return true;
      }
    } ops{{&a, &b, &c, &pa, &pb, &pc}, &*plan};
    ASSERT_TRUE(runPaddedProduct(*plan, ops));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float want = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk)
          want += at(i, kk) * bt(kk, j);
        ASSERT_EQ(c[static_cast<size_t>(i * n + j)], want)
            << "m " << m << " n " << n << " k " << k << " transA " << transA << " transB "
            << transB << " chunk " << chunk << " at " << i << ", " << j;
      }
    for (size_t i = static_cast<size_t>(m * n); i < c.size(); ++i)
      ASSERT_TRUE(std::isnan(c[i])) << "wrote past C";
  }
  EXPECT_GT(planned, 250);
}

TEST(Kernels, MatmulIsBitwiseTheSameOnOneAndTwoThreads) {
#ifdef _OPENMP
  struct Case {
    Shape as, bs;
    bool ta, tb;
  };
  auto elements = [](const Shape &shape) {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  };
  forEachF32Gemm([&] {
    for (Case c : {Case{{301, 97}, {97, 131}, false, false}, Case{{2, 77, 150}, {90, 150}, false, true},
                   Case{{260, 133}, {260, 70}, true, false}, Case{{133, 260}, {70, 133}, true, true},
                   Case{{1, 300, 61}, {1, 61, 29}, false, false}, Case{{40, 50}, {50, 60}, false, false},
                   // Large enough for the libraries to block M, N and K themselves.
                   Case{{1100, 1024}, {1024, 200}, false, false}, Case{{1024, 1100}, {1024, 150}, true, false},
                   Case{{200, 1024}, {1100, 1024}, false, true}}) {
      const size_t r = c.as.size(), rb = c.bs.size();
      const int64_t m = c.ta ? c.as[r - 1] : c.as[r - 2];
      const int64_t n = c.tb ? c.bs[rb - 2] : c.bs[rb - 1];
      const int64_t batch = r == 3 ? c.as[0] : 1;
      auto a = randomVector(elements(c.as), 11), b = randomVector(elements(c.bs), 12);
      std::vector<std::vector<float>> out;
      const int before = omp_get_max_threads();
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        out.emplace_back(static_cast<size_t>(batch * m * n));
        matmul(a.data(), c.as, b.data(), c.bs, out.back().data(), c.ta, c.tb);
      }
      omp_set_num_threads(before);
      for (size_t i = 0; i < out[0].size(); ++i)
        ASSERT_EQ(out[0][i], out[1][i]) << "m " << m << ", n " << n << (c.ta ? " TA" : "")
                                        << (c.tb ? " TB" : "") << " at " << i;
    }
  });
#else
  GTEST_SKIP() << "built without OpenMP: one thread only";
#endif
}

// Matmul's optional bias (ptc-fuse-matmul-bias) is added to every row of
// every batch entry: f32 on each path (one GEMM over shared-weight rows, a
// batched product, an empty contraction), bf16 through oneDNN's bias argument
// (in the f32 accumulator, rounded once) where the CPU has bf16.
TEST(Kernels, MatmulBiasIsAddedToEveryRow) {
  struct Case {
    Shape as, bs;
    bool ta, tb;
  };
  for (Case c : {Case{{4, 16, 24}, {40, 24}, false, true}, Case{{3, 24, 16}, {3, 24, 40}, true, false},
                 Case{{2, 5, 0}, {0, 7}, false, false}}) {
    const size_t r = c.as.size(), rb = c.bs.size();
    const int64_t m = c.ta ? c.as[r - 1] : c.as[r - 2], k = c.ta ? c.as[r - 2] : c.as[r - 1];
    const int64_t n = c.tb ? c.bs[rb - 2] : c.bs[rb - 1];
    const int64_t batch = c.as[0], bBatch = rb == 2 ? 1 : batch;
    auto a = randomVector(batch * m * k, 5), b = randomVector(bBatch * k * n, 6);
    auto bias = randomVector(n, 7);
    Shape os{batch, m, n}, biasShape{n};
    // The reference from the values bf16 holds exactly (used for both types).
    std::vector<uint16_t> a16, b16, bias16;
    a = roundToBf16(a, a16);
    b = roundToBf16(b, b16);
    bias = roundToBf16(bias, bias16);
    std::vector<double> ref(batch * m * n);
    for (int64_t x = 0; x < batch; ++x)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double sum = bias[j];
          for (int64_t p = 0; p < k; ++p) {
            const float av = c.ta ? a[(x * k + p) * m + i] : a[(x * m + i) * k + p];
            const int64_t bo = rb == 2 ? 0 : x * k * n;
            const float bv = c.tb ? b[bo + j * k + p] : b[bo + p * n + j];
            sum += static_cast<double>(av) * bv;
          }
          ref[(x * m + i) * n + j] = sum;
        }
    forEachF32Gemm([&] {
      std::vector<float> out(batch * m * n, -1.0f);
      ASSERT_TRUE(runKernel(ptc::kernels::OpKind::Matmul,
                            {view(a, c.as), view(b, c.bs), view(bias, biasShape)}, {view(out, os)},
                            {c.ta, c.tb})
                      .isOk());
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], ref[i], 1e-4) << "f32, k " << k << " at " << i;
    });
    std::vector<float> out(batch * m * n);
    if (!nativeBf16() || k == 0)
      continue; // the executor widens these bf16 matmuls to the f32 kernel above
    std::vector<uint16_t> out16(out.size());
    ASSERT_TRUE(runKernel(ptc::kernels::OpKind::Matmul,
                          {bf(a16, c.as), bf(b16, c.bs), bf(bias16, biasShape)}, {bf(out16, os)},
                          {c.ta, c.tb})
                    .isOk());
    for (size_t i = 0; i < out16.size(); ++i)
      ASSERT_NEAR(bf16ToF32(out16[i]), ref[i], std::abs(ref[i]) * (1.0 / 128) + 1e-6)
          << "bf16, k " << k << " at " << i;
  }
}

// Matmul's optional second output (ptc.matmul_bias_grad) is lhs summed over
// its contracted dimension: with a transposed lhs (a weight gradient's
// upstream gradient) bit for bit what ReduceSum over its rows gives, which
// it replaces, next to the same product; f32, and bf16 where the CPU has it.
TEST(Kernels, MatmulBiasGradientIsTheReduceSumItReplaces) {
  using ptc::kernels::OpKind;
  const int64_t k = 300, m = 48, n = 20;
  const Shape as{k, m}, bs{k, n}, os{m, n}, sumShape{m};
  std::vector<uint16_t> a16, b16;
  auto a = roundToBf16(randomVector(k * m, 11), a16), b = roundToBf16(randomVector(k * n, 12), b16);
  std::vector<float> product(m * n), fused(m * n), sums(m), fusedSums(m, -1.0f);
  ASSERT_TRUE(runKernel(OpKind::Matmul, {view(a, as), view(b, bs)}, {view(product, os)}, {1, 0})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::ReduceSum, {view(a, as)}, {view(sums, sumShape)}, {0}).isOk());
  ASSERT_TRUE(runKernel(OpKind::Matmul, {view(a, as), view(b, bs)},
                        {view(fused, os), view(fusedSums, sumShape)}, {1, 0})
                  .isOk());
  EXPECT_EQ(fused, product);
  EXPECT_EQ(fusedSums, sums);
  // Not transposed: lhs [m, k]'s row sums.
  const Shape rowMajor{m, k}, rs{k, n};
  std::vector<float> rowSums(m), fusedRowSums(m);
  std::vector<float> b2 = randomVector(k * n, 13), out(m * n);
  ASSERT_TRUE(runKernel(OpKind::ReduceSum, {view(a, rowMajor)}, {view(rowSums, sumShape)}, {1})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::Matmul, {view(a, rowMajor), view(b2, rs)},
                        {view(out, os), view(fusedRowSums, sumShape)}, {0, 0})
                  .isOk());
  EXPECT_EQ(fusedRowSums, rowSums);
  if (!nativeBf16())
    return; // the executor widens these bf16 matmuls to the f32 kernel above
  std::vector<uint16_t> product16(m * n), fused16(m * n), sums16(m), fusedSums16(m);
  ASSERT_TRUE(
      runKernel(OpKind::Matmul, {bf(a16, as), bf(b16, bs)}, {bf(product16, os)}, {1, 0}).isOk());
  ASSERT_TRUE(runKernel(OpKind::ReduceSum, {bf(a16, as)}, {bf(sums16, sumShape)}, {0}).isOk());
  ASSERT_TRUE(runKernel(OpKind::Matmul, {bf(a16, as), bf(b16, bs)},
                        {bf(fused16, os), bf(fusedSums16, sumShape)}, {1, 0})
                  .isOk());
  EXPECT_EQ(fused16, product16);
  EXPECT_EQ(fusedSums16, sums16);
}

// A transposed left operand whose rows are a multiple of 512 floats apart
// (the weight gradient of a layer 512 wide) is copied into unaligned rows
// first, in slices when K is long: every slice must still be the product.
TEST(Kernels, MatmulTransposedLhsOnConflictingRowsMatchesReference) {
  struct Case {
    int64_t k, m, n;
  };
  // One slice; four slices of 128 columns (K * 128 = the 4 MiB limit).
  // (The copy is oneDNN's path: OpenBLAS packs A itself; both tested.)
  forEachF32Gemm([] {
  for (Case c : {Case{256, 512, 24}, Case{8192, 512, 8}}) {
    auto a = randomVector(c.k * c.m, 3), b = randomVector(c.k * c.n, 4);
    std::vector<float> out(c.m * c.n);
    matmul(a.data(), Shape{c.k, c.m}, b.data(), Shape{c.k, c.n}, out.data(), /*transA=*/true,
           /*transB=*/false);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < c.k; ++p)
          s += static_cast<double>(a[p * c.m + i]) * b[p * c.n + j];
        ASSERT_NEAR(out[i * c.n + j], s, 1e-3) << "K " << c.k << " at " << i << ", " << j;
      }
  }
  });
}

TEST(Kernels, CausalAttentionMatchesDenseSoftmax) {
  const int64_t B = 2, H = 2, S = 7, D = 4;
  auto q = randomVector(B * H * S * D, 3), k = randomVector(B * H * S * D, 4),
       v = randomVector(B * H * S * D, 5);
  std::vector<float> out(q.size()), ref(q.size(), 0.0f);
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  causalAttention(q.data(), k.data(), v.data(), out.data(), {B, H, S, D}, H, scale);
  for (int64_t h = 0; h < B * H; ++h)
    for (int64_t i = 0; i < S; ++i) {
      std::vector<float> s(S, -INFINITY);
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        float dot = 0;
        for (int64_t c = 0; c < D; ++c)
          dot += q[(h * S + i) * D + c] * k[(h * S + j) * D + c];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= i; ++j)
        sum += std::exp(s[j] - mx);
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t c = 0; c < D; ++c)
          ref[(h * S + i) * D + c] += std::exp(s[j] - mx) / sum * v[(h * S + j) * D + c];
    }
  expectNear(out, ref, 1e-5f);
}

// Packed documents: attention over a sequence of documents with their
// positions equals each document's own causal attention (forward and every
// gradient; grouped-query heads, seq-major layout, documents crossing the
// kernels' 32-row query blocks), and positions 0, 1, .. (one document) give the
// plain causal kernel's numbers bitwise.
TEST(Kernels, PackedDocumentsAttendWithinTheirDocument) {
  const int64_t B = 2, H = 4, KV = 2, S = 80, D = 8;
  // Document lengths per batch entry (summing to S).
  const std::vector<std::vector<int64_t>> docs = {{5, 40, 1, 34}, {80}};
  std::vector<int32_t> positions(B * S);
  for (int64_t b = 0; b < B; ++b) {
    int64_t i = 0;
    for (int64_t len : docs[b])
      for (int64_t p = 0; p < len; ++p)
        positions[b * S + i++] = static_cast<int32_t>(p);
  }
  ASSERT_TRUE(checkDocumentPositions(positions.data(), B, S).isOk());
  for (bool seqMajor : {false, true}) {
    auto q = randomVector(B * H * S * D, 41), k = randomVector(B * KV * S * D, 42),
         v = randomVector(B * KV * S * D, 43), g = randomVector(B * H * S * D, 44);
    const float scale = 0.35f;
    // Element (b, h, t, c) of a [B, heads, S, D] tensor in the layout.
    auto at = [&](int64_t b, int64_t heads, int64_t h, int64_t t, int64_t c) {
      return seqMajor ? ((b * S + t) * heads + h) * D + c : ((b * heads + h) * S + t) * D + c;
    };
    std::vector<float> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    causalAttention(q.data(), k.data(), v.data(), out.data(), {B, H, S, D}, KV, scale, seqMajor,
                    0, positions.data());
    causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(), dk.data(), dv.data(),
                        {B, H, S, D}, KV, scale, seqMajor, 0, positions.data());
    for (int64_t b = 0; b < B; ++b) {
      int64_t start = 0;
      for (int64_t len : docs[b]) {
        // The document alone: [1, heads, len, D], heads-major.
        auto cut = [&](const std::vector<float> &x, int64_t heads) {
          std::vector<float> y(heads * len * D);
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t t = 0; t < len; ++t)
              for (int64_t c = 0; c < D; ++c)
                y[(h * len + t) * D + c] = x[at(b, heads, h, start + t, c)];
          return y;
        };
        auto dq1 = cut(q, H), dk1 = cut(k, KV), dv1 = cut(v, KV);
        auto q1 = cut(q, H), k1 = cut(k, KV), v1 = cut(v, KV), g1 = cut(g, H);
        std::vector<float> o1(q1.size());
        causalAttention(q1.data(), k1.data(), v1.data(), o1.data(), {1, H, len, D}, KV, scale);
        causalAttentionGrad(q1.data(), k1.data(), v1.data(), g1.data(), dq1.data(), dk1.data(),
                            dv1.data(), {1, H, len, D}, KV, scale);
        expectNear(cut(out, H), o1, 1e-5f);
        expectNear(cut(dq, H), dq1, 1e-5f);
        expectNear(cut(dk, KV), dk1, 1e-5f);
        expectNear(cut(dv, KV), dv1, 1e-5f);
        start += len;
      }
    }
    // One document per sequence: the plain causal kernel's numbers, bitwise.
    std::vector<int32_t> counting(B * S);
    for (int64_t x = 0; x < B * S; ++x)
      counting[x] = static_cast<int32_t>(x % S);
    std::vector<float> plain(q.size()), counted(q.size()), pdq(q.size()), cdq(q.size()),
        pdk(k.size()), cdk(k.size()), pdv(v.size()), cdv(v.size());
    causalAttention(q.data(), k.data(), v.data(), plain.data(), {B, H, S, D}, KV, scale, seqMajor);
    causalAttention(q.data(), k.data(), v.data(), counted.data(), {B, H, S, D}, KV, scale,
                    seqMajor, 0, counting.data());
    causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), pdq.data(), pdk.data(),
                        pdv.data(), {B, H, S, D}, KV, scale, seqMajor);
    causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), cdq.data(), cdk.data(),
                        cdv.data(), {B, H, S, D}, KV, scale, seqMajor, 0, counting.data());
    EXPECT_EQ(plain, counted);
    EXPECT_EQ(pdq, cdq);
    EXPECT_EQ(pdk, cdk);
    EXPECT_EQ(pdv, cdv);
  }
  // A position past its token's index is refused.
  positions[3] = 4;
  EXPECT_FALSE(checkDocumentPositions(positions.data(), B, S).isOk());
}

// Grouped-query attention equals multi-head attention on kv heads repeated
// for their query heads; its kv gradients are the sums over those heads.
TEST(Kernels, GroupedQueryAttentionIsRepeatedKvHeads) {
  const int64_t B = 2, H = 6, KV = 2, S = 9, D = 8, G = H / KV;
  auto q = randomVector(B * H * S * D, 31), k = randomVector(B * KV * S * D, 32),
       v = randomVector(B * KV * S * D, 33), g = randomVector(B * H * S * D, 34);
  std::vector<float> kr(q.size()), vr(q.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < S * D; ++x) {
        kr[(b * H + h) * S * D + x] = k[(b * KV + h / G) * S * D + x];
        vr[(b * H + h) * S * D + x] = v[(b * KV + h / G) * S * D + x];
      }
  float scale = 0.3f;
  std::vector<float> out(q.size()), ref(q.size());
  causalAttention(q.data(), k.data(), v.data(), out.data(), {B, H, S, D}, KV, scale);
  causalAttention(q.data(), kr.data(), vr.data(), ref.data(), {B, H, S, D}, H, scale);
  expectNear(out, ref, 1e-6f);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), rdq(q.size()), rdk(q.size()),
      rdv(q.size());
  causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(), dk.data(), dv.data(),
                      {B, H, S, D}, KV, scale);
  causalAttentionGrad(q.data(), kr.data(), vr.data(), g.data(), rdq.data(), rdk.data(),
                      rdv.data(), {B, H, S, D}, H, scale);
  expectNear(dq, rdq, 1e-6f);
  std::vector<float> sk(k.size(), 0.0f), sv(v.size(), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < S * D; ++x) {
        sk[(b * KV + h / G) * S * D + x] += rdk[(b * H + h) * S * D + x];
        sv[(b * KV + h / G) * S * D + x] += rdv[(b * H + h) * S * D + x];
      }
  expectNear(dk, sk, 1e-5f);
  expectNear(dv, sv, 1e-5f);
}

// Forward and gradient against a double-precision reference on shapes that
// exercise the blocked paths' edges: sequences and head sizes that are not
// multiples of the 16 x 16 transposes, the 8-row register blocks or the
// 32-row query blocks, and grouped kv heads.
/// Causal attention and its gradient in double: o, dq, dk, dv of q [B, H, S, D],
/// k / v [B, KV, S, D] and the output's gradient g.
struct AttentionReference {
  std::vector<double> o, dq, dk, dv, lse; // lse [B, H, S]: the rows' log-sum-exp
};
AttentionReference attentionReference(const std::vector<float> &q, const std::vector<float> &k,
                                      const std::vector<float> &v, const std::vector<float> &g,
                                      int64_t B, int64_t H, int64_t KV, int64_t S, int64_t D,
                                      double scale) {
  AttentionReference r{std::vector<double>(q.size()), std::vector<double>(q.size()),
                       std::vector<double>(k.size()), std::vector<double>(k.size()),
                       std::vector<double>(static_cast<size_t>(B * H * S))};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qo = (b * H + h) * S * D, ko = (b * KV + h / (H / KV)) * S * D;
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double mx = -INFINITY, sum = 0, delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c)
            dot += double(q[qo + i * D + c]) * k[ko + j * D + c];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j <= i; ++j)
          sum += p[j] = std::exp(p[j] - mx);
        r.lse[(b * H + h) * S + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          p[j] /= sum;
          for (int64_t c = 0; c < D; ++c) {
            r.o[qo + i * D + c] += p[j] * v[ko + j * D + c];
            dp[j] += double(g[qo + i * D + c]) * v[ko + j * D + c];
          }
          delta += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int64_t c = 0; c < D; ++c) {
            r.dq[qo + i * D + c] += ds * k[ko + j * D + c];
            r.dk[ko + j * D + c] += ds * q[qo + i * D + c];
            r.dv[ko + j * D + c] += p[j] * g[qo + i * D + c];
          }
        }
      }
    }
  return r;
}

/// The largest error of `got` against `want`, relative to want's largest magnitude.
template <typename T>
double relativeError(const std::vector<T> &got, const std::vector<double> &want,
                     double (*value)(T) = nullptr) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = value ? value(got[i]) : static_cast<double>(got[i]);
    worst = std::max(worst, std::fabs(x - want[i]));
    largest = std::max(largest, std::fabs(want[i]));
  }
  return worst / largest;
}

struct AttentionCase {
  int64_t B, H, S, D, KV;
};
// Heads of 3 to 128 (Llama's), sequences across several query blocks and
// not a multiple of them: partial register blocks in rows and columns.
const AttentionCase kAttentionCases[] = {{1, 2, 40, 24, 1}, {2, 4, 37, 48, 2}, {1, 1, 16, 16, 1},
                                         {1, 2, 5, 3, 2},   {1, 2, 70, 64, 1}, {2, 2, 33, 17, 1},
                                         {1, 4, 101, 128, 2}};

TEST(Kernels, CausalAttentionAndGradientMatchDoubleReferenceOnOddShapes) {
  for (AttentionCase t : kAttentionCases) {
    SCOPED_TRACE("S " + std::to_string(t.S) + " D " + std::to_string(t.D));
    const size_t nq = t.B * t.H * t.S * t.D, nk = t.B * t.KV * t.S * t.D;
    auto q = randomVector(nq, 41), k = randomVector(nk, 42), v = randomVector(nk, 43),
         g = randomVector(nq, 44);
    std::vector<float> o(nq), dq(nq), dk(nk), dv(nk);
    const float scale = 1.0f / std::sqrt(static_cast<float>(t.D));
    const Shape shape{t.B, t.H, t.S, t.D};
    causalAttention(q.data(), k.data(), v.data(), o.data(), shape, t.KV, scale);
    causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(), dk.data(), dv.data(),
                        shape, t.KV, scale);
    auto ref = attentionReference(q, k, v, g, t.B, t.H, t.KV, t.S, t.D, scale);
    EXPECT_LT(relativeError(o, ref.o), 2e-6) << "output";
    EXPECT_LT(relativeError(dq, ref.dq), 2e-6) << "dq";
    EXPECT_LT(relativeError(dk, ref.dk), 2e-6) << "dk";
    EXPECT_LT(relativeError(dv, ref.dv), 2e-6) << "dv";
  }
}

TEST(Kernels, RmsNormMatchesDefinition) {
  const int64_t R = 5, C = 12;
  auto x = randomVector(R * C, 41), w = randomVector(C, 42);
  std::vector<float> y(x.size()), ref(x.size());
  const Shape xs{R, C}, ws{C};
  ASSERT_TRUE(runKernel(ptc::kernels::OpKind::RmsNorm, {view(x, xs), view(w, ws)}, {view(y, xs)},
                        {}, {1e-5})
                  .isOk());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c)
      ss += double(x[r * C + c]) * x[r * C + c];
    double rstd = 1.0 / std::sqrt(ss / C + 1e-5);
    for (int64_t c = 0; c < C; ++c)
      ref[r * C + c] = static_cast<float>(x[r * C + c] * rstd * w[c]);
  }
  expectNear(y, ref, 1e-5f);
}

// LayerNorm and RMSNorm, forward and gradient, against their definitions in
// double on a row count that is not a multiple of the kernels' row block (8)
// and large enough for the kernels to split it over threads.
TEST(Kernels, NormalizationsAndGradientsMatchDefinitionOverRowBlocks) {
  using ptc::kernels::OpKind;
  const int64_t R = 701, C = 24;
  const Shape xs{R, C}, ws{C};
  auto x = randomVector(R * C, 61), w = randomVector(C, 62), b = randomVector(C, 63),
       g = randomVector(R * C, 64);
  std::vector<float> y(R * C), dx(R * C), dw(C), db(C);
  std::vector<double> yRef(R * C), dxRef(R * C), dwRef(C, 0.0), dbRef(C, 0.0);
  auto expectAll = [](const std::vector<float> &got, const std::vector<double> &want,
                      const char *what) {
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1.0 + std::fabs(want[i]))) << what << " at " << i;
  };
  ASSERT_TRUE(runKernel(OpKind::LayerNorm, {view(x, xs), view(w, ws), view(b, ws)}, {view(y, xs)},
                        {}, {1e-5})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::LayerNormGrad, {view(x, xs), view(w, ws), view(g, xs)},
                        {view(dx, xs), view(dw, ws), view(db, ws)}, {}, {1e-5})
                  .isOk());
  for (int64_t r = 0; r < R; ++r) {
    const float *xr = &x[r * C], *gr = &g[r * C];
    double mean = 0, var = 0, mD = 0, mDX = 0;
    for (int64_t c = 0; c < C; ++c)
      mean += xr[c];
    mean /= C;
    for (int64_t c = 0; c < C; ++c)
      var += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + 1e-5);
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (xr[c] - mean) * rstd;
      yRef[r * C + c] = xh * w[c] + b[c];
      mD += double(gr[c]) * w[c] / C;
      mDX += double(gr[c]) * w[c] * xh / C;
      dwRef[c] += gr[c] * xh;
      dbRef[c] += gr[c];
    }
    for (int64_t c = 0; c < C; ++c)
      dxRef[r * C + c] = rstd * (double(gr[c]) * w[c] - mD - (xr[c] - mean) * rstd * mDX);
  }
  expectAll(y, yRef, "layer norm");
  expectAll(dx, dxRef, "layer norm input gradient");
  expectAll(dw, dwRef, "layer norm weight gradient");
  expectAll(db, dbRef, "layer norm bias gradient");

  ASSERT_TRUE(
      runKernel(OpKind::RmsNorm, {view(x, xs), view(w, ws)}, {view(y, xs)}, {}, {1e-5}).isOk());
  ASSERT_TRUE(runKernel(OpKind::RmsNormGrad, {view(x, xs), view(w, ws), view(g, xs)},
                        {view(dx, xs), view(dw, ws)}, {}, {1e-5})
                  .isOk());
  std::fill(dwRef.begin(), dwRef.end(), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const float *xr = &x[r * C], *gr = &g[r * C];
    double ss = 0, dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      ss += double(xr[c]) * xr[c];
      dot += double(gr[c]) * w[c] * xr[c];
    }
    const double rstd = 1.0 / std::sqrt(ss / C + 1e-5);
    for (int64_t c = 0; c < C; ++c) {
      yRef[r * C + c] = xr[c] * rstd * w[c];
      dxRef[r * C + c] = rstd * (double(gr[c]) * w[c] - xr[c] * rstd * rstd * dot / C);
      dwRef[c] += gr[c] * xr[c] * rstd;
    }
  }
  expectAll(y, yRef, "RMS norm");
  expectAll(dx, dxRef, "RMS norm input gradient");
  expectAll(dw, dwRef, "RMS norm weight gradient");
}

// Philox4x32-10 against Random123's known-answer vectors (kat_vectors).
TEST(Kernels, PhiloxMatchesRandom123KnownAnswers) {
  using ptc::kernels::philox4x32;
  auto expect = [](ptc::kernels::Philox4x32 got, std::array<uint32_t, 4> want) {
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got.v[i], want[static_cast<size_t>(i)]) << "word " << i;
  };
  expect(philox4x32(0, 0, 0, 0, 0, 0), {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  const uint32_t f = 0xffffffffu;
  expect(philox4x32(f, f, f, f, f, f), {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  expect(philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u),
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

namespace {
/// A Dropout call as the executor makes it: the instruction's integers, this
/// device's mesh coordinates and sizes, the random context.
KernelResult runDropout(std::vector<float> &x, const Shape &shape, std::vector<float> &y, double p,
                        std::vector<int64_t> ints, const std::vector<int64_t> &coords,
                        const std::vector<int64_t> &sizes,
                        const ptc::kernels::RandomContext &random) {
  std::vector<ptc::kernels::TensorView> in = {view(x, shape)}, out = {view(y, shape)};
  std::vector<double> floats = {p};
  ptc::kernels::KernelCall call =
      ptc::kernels::makeKernelCall(ptc::kernels::OpKind::Dropout, in, out, ints, floats);
  call.meshCoords = coords.data();
  call.meshSizes = sizes.data();
  call.random = &random;
  return kernelTable()[ptc::kernels::OpKind::Dropout].run(call);
}
/// The integers of an unsplit input of `rank` dimensions.
std::vector<int64_t> wholeDims(int64_t stream, size_t rank) {
  std::vector<int64_t> ints = {stream};
  for (size_t d = 0; d < rank; ++d)
    ints.insert(ints.end(), {1, 0});
  return ints;
}
} // namespace

// Dropout keeps 1 - p of the elements (a binomial count within 5 standard
// deviations), scales them by exactly 1 / (1 - p), draws the same mask for the
// same (seed, step, stream) and other masks when one of them changes, and is
// the identity outside training.
TEST(Kernels, DropoutKeepsOneMinusPScaledAndIsKeyedBySeedStepAndStream) {
  const Shape shape = {64, 1000};
  const int64_t n = 64000;
  const double p = 0.1;
  std::vector<float> x(n, 1.0f), y(n), again(n);
  ptc::kernels::RandomContext random;
  random.seed = 1337;
  random.step = 7;
  ASSERT_TRUE(runDropout(x, shape, y, p, wholeDims(3, 2), {}, {}, random).isOk());
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t dropped = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || v == scale) << v;
    dropped += v == 0.0f;
  }
  const double sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 5 * sigma);
  ASSERT_TRUE(runDropout(x, shape, again, p, wholeDims(3, 2), {}, {}, random).isOk());
  EXPECT_EQ(y, again);
  auto agreement = [&](const std::vector<float> &a, const std::vector<float> &b) {
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i)
      same += a[static_cast<size_t>(i)] == b[static_cast<size_t>(i)];
    return static_cast<double>(same) / n;
  };
  // Independent masks agree on (1-p)^2 + p^2 = 0.82 of the elements.
  ptc::kernels::RandomContext other = random;
  other.step = 8;
  ASSERT_TRUE(runDropout(x, shape, again, p, wholeDims(3, 2), {}, {}, other).isOk());
  EXPECT_NEAR(agreement(y, again), 0.82, 0.01) << "another step";
  ASSERT_TRUE(runDropout(x, shape, again, p, wholeDims(4, 2), {}, {}, random).isOk());
  EXPECT_NEAR(agreement(y, again), 0.82, 0.01) << "another stream";
  other = random;
  other.seed = 1338;
  ASSERT_TRUE(runDropout(x, shape, again, p, wholeDims(3, 2), {}, {}, other).isOk());
  EXPECT_NEAR(agreement(y, again), 0.82, 0.01) << "another seed";
  other = random;
  other.training = false;
  std::vector<float> r = randomVector(n, 5);
  ASSERT_TRUE(runDropout(r, shape, again, p, wholeDims(3, 2), {}, {}, other).isOk());
  EXPECT_EQ(again, r);
}

// Each device of a split draws its elements' masks by their global indices:
// the local results of every coordinate are the whole tensor's result at the
// places the split gives them (a blocked split over one axis, as context
// parallelism's chunks, and a plain split over two axes, major first), and a
// micro-batch's rows are those the data loader deals it (micro-batch m of
// data-parallel part r: rows r * B / dp + m * b..).
TEST(Kernels, DropoutOfEveryShardEqualsTheWholeTensorAtItsPlace) {
  const Shape whole = {8, 12, 6};
  std::vector<float> x = randomVector(8 * 12 * 6, 9), y(x.size());
  ptc::kernels::RandomContext random;
  random.seed = 42;
  random.step = 3;
  ASSERT_TRUE(runDropout(x, whole, y, 0.5, wholeDims(1, 3), {}, {}, random).isOk());
  auto at = [&](const std::vector<float> &v, int64_t i, int64_t j, int64_t k) {
    return v[static_cast<size_t>((i * 12 + j) * 6 + k)];
  };
  // Mesh (a: 2, b: 3, c: 2): dimension 1 (12) as 2 blocks over a, dimension
  // 2 (6) over the compound (b, c), b major; dimension 0 whole.
  const std::vector<int64_t> sizes = {2, 3, 2};
  for (int64_t ca = 0; ca < 2; ++ca)
    for (int64_t cb = 0; cb < 3; ++cb)
      for (int64_t cc = 0; cc < 2; ++cc) {
        const Shape local = {8, 6, 1};
        std::vector<float> lx(48), ly(48);
        auto wholeJ = [&](int64_t j) { return (j / 3) * 6 + ca * 3 + j % 3; }; // 2 blocks of 3
        const int64_t k0 = cb * 2 + cc;                                        // (b, c) major b
        for (int64_t i = 0; i < 8; ++i)
          for (int64_t j = 0; j < 6; ++j)
            lx[static_cast<size_t>(i * 6 + j)] = at(x, i, wholeJ(j), k0);
        ASSERT_TRUE(runDropout(lx, local, ly, 0.5, {1, 1, 0, 2, 1, 0, 1, 2, 1, 2}, {ca, cb, cc},
                               sizes, random)
                        .isOk());
        for (int64_t i = 0; i < 8; ++i)
          for (int64_t j = 0; j < 6; ++j)
            ASSERT_EQ(ly[static_cast<size_t>(i * 6 + j)], at(y, i, wholeJ(j), k0))
                << "device (" << ca << ", " << cb << ", " << cc << ") element " << i << ", " << j;
      }
  // Micro-batches: 2 data-parallel parts x 2 micro-batches of 2 rows each.
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t m = 0; m < 2; ++m) {
      const Shape local = {2, 12, 6};
      std::vector<float> lx(144), ly(144);
      std::copy(x.begin() + (r * 4 + m * 2) * 72, x.begin() + (r * 4 + m * 2 + 2) * 72, lx.begin());
      ptc::kernels::RandomContext mb = random;
      mb.microbatch = m;
      mb.microbatches = 2;
      mb.dataParts = 2;
      ASSERT_TRUE(
          runDropout(lx, local, ly, 0.5, {1, 1, 1, 0, 1, 0, 1, 0}, {r}, {2}, mb).isOk());
      for (int64_t e = 0; e < 144; ++e)
        ASSERT_EQ(ly[static_cast<size_t>(e)], y[static_cast<size_t>((r * 4 + m * 2) * 72 + e)])
            << "part " << r << ", micro-batch " << m << ", element " << e;
    }
}

// Rotary: HF's rotate_half convention at position p, and the inverse undoes it.
TEST(Kernels, RotaryRotatesHalvesAndInverts) {
  const int64_t S = 5, D = 8;
  auto x = randomVector(2 * S * D, 51);
  std::vector<float> y(x.size()), back(x.size());
  rotary(x.data(), y.data(), {1, 2, S, D}, 10000.0, false);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t p = 0; p < S; ++p)
      for (int64_t i = 0; i < D / 2; ++i) {
        double a = p * std::pow(10000.0, -2.0 * i / D);
        const float *xr = &x[(h * S + p) * D];
        EXPECT_NEAR(y[(h * S + p) * D + i], xr[i] * std::cos(a) - xr[i + D / 2] * std::sin(a), 1e-5);
        EXPECT_NEAR(y[(h * S + p) * D + i + D / 2], xr[i + D / 2] * std::cos(a) + xr[i] * std::sin(a), 1e-5);
      }
  rotary(y.data(), back.data(), {1, 2, S, D}, 10000.0, true);
  expectNear(back, x, 1e-5f);
}

/// Decode's attention: a prompt over empty caches, then one token at a time,
/// each equals causal attention over the whole sequence (grouped-query heads);
/// the caches hold the keys and values at their positions.
TEST(Kernels, CachedAttentionPrefillThenOneTokenEqualsCausalAttention) {
  const int64_t B = 2, A = 4, KV = 2, S = 9, D = 8, C = 12, P = 5;
  auto q = randomVector(B * A * S * D, 61), k = randomVector(B * KV * S * D, 62),
       v = randomVector(B * KV * S * D, 63);
  std::vector<float> want(q.size());
  Shape full{B, A, S, D}, fullKv{B, KV, S, D};
  ASSERT_TRUE(runKernel(ptc::kernels::OpKind::CausalAttention,
                        {view(q, full), view(k, fullKv), view(v, fullKv)}, {view(want, full)}, {},
                        {0.3})
                  .isOk());
  // Rows [from, from + n) of every (batch, head) of a [B, heads, S, D] tensor.
  auto rows = [&](const std::vector<float> &x, int64_t heads, int64_t from, int64_t n) {
    std::vector<float> out;
    for (int64_t bh = 0; bh < B * heads; ++bh)
      out.insert(out.end(), x.begin() + (bh * S + from) * D, x.begin() + (bh * S + from + n) * D);
    return out;
  };
  std::vector<float> kc(B * KV * C * D, 0.0f), vc(kc.size(), 0.0f);
  Shape cache{B, KV, C, D};
  auto call = [&](int64_t from, int64_t n) {
    auto qs = rows(q, A, from, n), ks = rows(k, KV, from, n), vs = rows(v, KV, from, n);
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        pos.push_back(static_cast<int32_t>(from + t));
    Shape qShape{B, A, n, D}, kvShape{B, KV, n, D}, posShape{B, n};
    std::vector<float> out(qs.size());
    ptc::kernels::TensorView posView{pos.data(), ptc::kernels::DType::I32, &posShape,
                                     static_cast<int64_t>(pos.size())};
    // The caches are written in place, as a plan runs it.
    EXPECT_TRUE(runKernel(ptc::kernels::OpKind::CachedAttention,
                          {view(qs, qShape), view(ks, kvShape), view(vs, kvShape),
                           view(kc, cache), view(vc, cache), posView},
                          {view(out, qShape), view(kc, cache), view(vc, cache)}, {}, {0.3})
                    .isOk());
    expectNear(out, rows(want, A, from, n), 1e-5f);
  };
  call(0, P);
  for (int64_t t = P; t < S; ++t)
    call(t, 1);
  for (int64_t bh = 0; bh < B * KV; ++bh)
    for (int64_t p = 0; p < C; ++p)
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(kc[(bh * C + p) * D + d], p < S ? k[(bh * S + p) * D + d] : 0.0f);
  // A position outside the cache is an error naming it.
  Shape one{1, A, 1, D}, oneKv{1, KV, 1, D}, oneCache{1, KV, C, D}, onePos{1, 1};
  std::vector<float> q1(A * D), k1(KV * D), c1(KV * C * D), o1(A * D);
  int32_t bad = static_cast<int32_t>(C);
  ptc::kernels::TensorView badPos{&bad, ptc::kernels::DType::I32, &onePos, 1};
  KernelResult r = runKernel(ptc::kernels::OpKind::CachedAttention,
                             {view(q1, one), view(k1, oneKv), view(k1, oneKv), view(c1, oneCache),
                              view(c1, oneCache), badPos},
                             {view(o1, one), view(c1, oneCache), view(c1, oneCache)}, {}, {0.3});
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.message().find("position 12 at position 0 is outside [0, 12)"), std::string::npos)
      << r.message();
}

/// Rotary at given positions: at 0..S-1 it is ptc.rotary; each row rotates
/// by its own position.
TEST(Kernels, RotaryAtPositionsEqualsRotaryOfTheSequence) {
  const int64_t S = 6, D = 8;
  auto x = randomVector(2 * 3 * S * D, 71);
  std::vector<float> want(x.size()), got(x.size());
  rotary(x.data(), want.data(), {2, 3, S, D}, 10000.0, false);
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t p = 0; p < S; ++p)
      pos.push_back(static_cast<int32_t>(p));
  Shape xs{2, 3, S, D}, ps{2, S};
  ptc::kernels::TensorView posView{pos.data(), ptc::kernels::DType::I32, &ps, 2 * S};
  ASSERT_TRUE(runKernel(ptc::kernels::OpKind::RotaryAt, {view(x, xs), posView}, {view(got, xs)},
                        {}, {10000.0})
                  .isOk());
  expectNear(got, want, 0.0f);
  // One token at position 4 of batch row 1: row 4 of the sequence's rotation.
  std::vector<float> row(x.begin() + (1 * 3 * S + 4) * D, x.begin() + (1 * 3 * S + 5) * D), one(D);
  int32_t four = 4;
  Shape rs{1, 1, 1, D}, ones{1, 1};
  ptc::kernels::TensorView fourView{&four, ptc::kernels::DType::I32, &ones, 1};
  ASSERT_TRUE(runKernel(ptc::kernels::OpKind::RotaryAt, {view(row, rs), fourView}, {view(one, rs)},
                        {}, {10000.0})
                  .isOk());
  expectNear(one, std::vector<float>(want.begin() + (1 * 3 * S + 4) * D,
                                     want.begin() + (1 * 3 * S + 5) * D),
             0.0f);
}

TEST(Kernels, TransposeAndSliceAndConcat) {
  std::vector<float> a(2 * 3 * 4);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(i);
  std::vector<float> t(a.size());
  transpose(a.data(), {2, 3, 4}, t.data(), {2, 0, 1}, sizeof(float)); // -> [4, 2, 3]
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_EQ(t[1], 4.0f);  // [0][0][1] = a[0][1][0]
  EXPECT_EQ(t[3], 12.0f); // [0][1][0] = a[1][0][0]
  EXPECT_EQ(t[6], 1.0f);  // [1][0][0] = a[0][0][1]
  std::vector<float> s(2 * 2 * 2);
  sliceCopy(a.data(), {2, 3, 4}, s.data(), {2, 2, 2}, {0, 1, 2}, sizeof(float), true);
  EXPECT_EQ(s, (std::vector<float>{6, 7, 10, 11, 18, 19, 22, 23}));
  std::vector<float> c(2 * 5);
  std::vector<float> x{1, 2, 3, 4}, y{5, 6, 7, 8, 9, 10};
  concat({x.data(), y.data()}, {{2, 2}, {2, 3}}, c.data(), 1, sizeof(float));
  EXPECT_EQ(c, (std::vector<float>{1, 2, 5, 6, 7, 3, 4, 8, 9, 10}));
}

TEST(Kernels, ReductionsOverLeadingAndTrailingAxes) {
  std::vector<float> a(2 * 3 * 4);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(i);
  std::vector<float> sum(4), mx(2 * 3), mean(3);
  reduce(ReduceOp::Sum, a.data(), {2, 3, 4}, {0, 1}, sum.data());
  EXPECT_EQ(sum, (std::vector<float>{60, 66, 72, 78}));
  reduce(ReduceOp::Max, a.data(), {2, 3, 4}, {2}, mx.data());
  EXPECT_EQ(mx, (std::vector<float>{3, 7, 11, 15, 19, 23}));
  reduce(ReduceOp::Mean, a.data(), {2, 3, 4}, {0, 2}, mean.data());
  EXPECT_EQ(mean, (std::vector<float>{7.5f, 11.5f, 15.5f}));
}

TEST(Kernels, CrossEntropyRejectsTargetOutOfRange) {
  std::vector<float> logits(2 * 3, 0.0f);
  std::vector<int32_t> targets{1, 3};
  float loss;
  ptc::kernels::KernelResult s = crossEntropy(logits.data(), targets.data(), 2, 3, &loss);
  EXPECT_EQ(s.message(), "target 3 at position 1 is outside [0, 3)");
  targets[1] = 2;
  ASSERT_TRUE(crossEntropy(logits.data(), targets.data(), 2, 3, &loss).isOk());
  EXPECT_NEAR(loss, std::log(3.0f), 1e-6f);
}

TEST(Kernels, MoeDispatchDropsBeyondCapacity) {
  // 3 tokens, top-1, all to expert 0 with capacity 2: token 2 is dropped.
  std::vector<float> x{1, 2, 3};
  std::vector<int32_t> e{0, 0, 0};
  std::vector<float> buf(2 * 2 * 1), y(3);
  ASSERT_TRUE(moeDispatch(x.data(), e.data(), 1, 3, 1, 1, 2, 2, buf.data()).isOk());
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 0, 0}));
  std::vector<float> w{0.5f, 1.0f, 1.0f};
  ASSERT_TRUE(moeCombine(buf.data(), w.data(), e.data(), 1, 3, 1, 1, 2, 2, y.data()).isOk());
  EXPECT_EQ(y, (std::vector<float>{0.5f, 2.0f, 0.0f}));
  e[1] = 5;
  EXPECT_FALSE(moeDispatch(x.data(), e.data(), 1, 3, 1, 1, 2, 2, buf.data()).isOk());
}

TEST(Kernels, MoeSlotsAreFilledChoiceMajorPerGroup) {
  // Two groups of 2 tokens, top-2 over 2 experts, capacity 1 per group:
  // every first choice wins a slot before any second choice does.
  // Group 0: token 0 -> (1, 0), token 1 -> (0, 1). Group 1: both (0, 1).
  std::vector<float> x{10, 20, 30, 40};
  std::vector<int32_t> e{1, 0, 0, 1, 0, 1, 0, 1};
  std::vector<float> buf(2 * 2 * 1 * 1);
  ASSERT_TRUE(moeDispatch(x.data(), e.data(), 2, 2, 2, 1, 2, 1, buf.data()).isOk());
  // [expert][group]: expert 0 holds token 1 (group 0) and token 0 of group 1
  // (30); expert 1 holds token 0 (group 0) and, in group 1, nobody's first
  // choice, so token 0's second choice (30) takes it.
  EXPECT_EQ(buf, (std::vector<float>{20, 30, 10, 30}));
  std::vector<float> load(4);
  ASSERT_TRUE(expertLoad(e.data(), 2, 2, 2, 2, load.data()).isOk());
  EXPECT_EQ(load, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
  std::vector<float> w(8, 1.0f), y(4);
  ASSERT_TRUE(moeCombine(buf.data(), w.data(), e.data(), 2, 2, 2, 1, 2, 1, y.data()).isOk());
  // Group 1's token 1 lost both choices: its output is zero.
  EXPECT_EQ(y, (std::vector<float>{10, 20, 60, 0}));
}
} // namespace

// Mixed precision storage: bf16 rounds to nearest even, keeps NaN and
// infinities; f16 round-trips the values it can represent.
TEST(Kernels, ConvertFloatRoundsToNearestEven) {
  using k = ptc::kernels::cpu::FloatType;
  const float in[] = {1.0f, 1.0f + 0x1.0p-8f, 1.0f + 0x1.8p-8f, -2.5f, 65504.0f,
                      std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  const int n = sizeof in / sizeof in[0];
  uint16_t bf16[n];
  float back[n];
  ptc::kernels::cpu::convertFloat(in, k::F32, bf16, k::BF16, n);
  ptc::kernels::cpu::convertFloat(bf16, k::BF16, back, k::F32, n);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);                 // halfway: ties to the even mantissa
  EXPECT_EQ(back[2], 1.0f + 0x1.0p-7f);     // above halfway: rounds up
  EXPECT_EQ(back[3], -2.5f);
  EXPECT_EQ(back[4], 65536.0f);             // 8 mantissa bits
  EXPECT_TRUE(std::isinf(back[5]));
  EXPECT_TRUE(std::isnan(back[6]));
  uint16_t f16[n];
  ptc::kernels::cpu::convertFloat(in, k::F32, f16, k::F16, n);
  ptc::kernels::cpu::convertFloat(f16, k::F16, back, k::F32, n);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 0x1.0p-8f);     // f16 has 10 mantissa bits
  EXPECT_EQ(back[3], -2.5f);
  EXPECT_EQ(back[4], 65504.0f);             // the largest f16
  EXPECT_TRUE(std::isnan(back[6]));
}

TEST(Kernels, ActivationsMatchClosedFormsAndTheirGradientsFiniteDifferences) {
  std::vector<float> xAll;
  for (int i = -40; i <= 40; ++i)
    xAll.push_back(0.15f * static_cast<float>(i) + 0.01f); // no point exactly at ReLU's kink
  const size_t n = xAll.size();
  auto closedForm = [](ptc::kernels::UnaryFunction fn, float v) -> double {
    double d = v;
    switch (fn) {
    case ptc::kernels::UnaryFunction::Gelu:
      return 0.5 * d * (1.0 + std::erf(d / std::sqrt(2.0)));
    case ptc::kernels::UnaryFunction::GeluTanh: // PyTorch's approximate='tanh'
      return 0.5 * d * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (d + 0.044715 * d * d * d)));
    case ptc::kernels::UnaryFunction::Tanh:
      return std::tanh(d);
    case ptc::kernels::UnaryFunction::Relu:
      return d > 0 ? d : 0.0;
    case ptc::kernels::UnaryFunction::Silu:
      return d / (1.0 + std::exp(-d));
    case ptc::kernels::UnaryFunction::Rsqrt:
      return 1.0 / std::sqrt(d);
    case ptc::kernels::UnaryFunction::Exp:
      return std::exp(d);
    case ptc::kernels::UnaryFunction::Log:
      return std::log(d);
    case ptc::kernels::UnaryFunction::Sign:
      return (d > 0) - (d < 0);
    }
    return 0.0;
  };
  using UF = ptc::kernels::UnaryFunction;
  for (auto fn : {UF::Gelu, UF::GeluTanh, UF::Tanh, UF::Relu, UF::Silu, UF::Rsqrt, UF::Exp, UF::Log,
                  UF::Sign}) {
    SCOPED_TRACE(ptc::kernels::unaryFunctionName(fn));
    // rsqrt and log are defined on positive inputs: |x| + 0.5 in [0.51, 6.51].
    std::vector<float> x(xAll);
    if (fn == UF::Rsqrt || fn == UF::Log)
      for (float &v : x)
        v = std::fabs(v) + 0.5f;
    if (fn == UF::Sign) // away from the step at 0 (sign(0) = 0 is checked below)
      for (float &v : x)
        v = std::copysign(std::fabs(v) + 0.5f, v);
    std::vector<float> y(n), g(n, 1.0f), dx(n), up(n), down(n), xu(x), xd(x);
    unary(fn, x.data(), y.data(), static_cast<int64_t>(n));
    unaryGrad(fn, x.data(), g.data(), dx.data(), static_cast<int64_t>(n));
    const float eps = 1e-2f;
    for (size_t i = 0; i < n; ++i) {
      xu[i] += eps;
      xd[i] -= eps;
    }
    unary(fn, xu.data(), up.data(), static_cast<int64_t>(n));
    unary(fn, xd.data(), down.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], closedForm(fn, x[i]), 1e-6 + 1e-6 * std::fabs(y[i])) << "x = " << x[i];
      double fd = (static_cast<double>(up[i]) - down[i]) / (2.0 * eps);
      EXPECT_NEAR(dx[i], fd, 2e-3 + 2e-4 * std::fabs(dx[i])) << "x = " << x[i];
    }
  }
  float zero = 0.0f, signOfZero = 1.0f;
  unary(UF::Sign, &zero, &signOfZero, 1);
  EXPECT_EQ(signOfZero, 0.0f);
  // The plan's names resolve to the same functions.
  EXPECT_EQ(ptc::kernels::lookupUnaryFunction("silu"), ptc::kernels::UnaryFunction::Silu);
  EXPECT_FALSE(ptc::kernels::lookupUnaryFunction("swish").has_value());
}

// A gated activation f(gate) * up and its gradient (GatedUnary / GatedUnaryGrad,
// ptc.swiglu for silu): f32 results bitwise the activation and multiplications
// they replace (dgate = f'(gate) * (g * up), dup = g * f(gate)) for the
// activations computed inline (exp and log call libm, whose vector and scalar
// forms may differ in the last bit between two loops: within 2 ulp there);
// bf16 ones the f32 result on the widened inputs rounded once; threaded (over
// the kernels' grain) and not.
TEST(Kernels, GatedActivationsAreTheirCompositionInOnePass) {
  using ptc::kernels::OpKind;
  using UF = UnaryFunction;
  for (int64_t n : {int64_t{37}, int64_t{40000}}) {
    const Shape s{n};
    auto gate = randomVector(n, 91), up = randomVector(n, 92), g = randomVector(n, 93);
    for (float &v : gate)
      v *= 4.0f;
    for (UF fn : {UF::Gelu, UF::GeluTanh, UF::Tanh, UF::Relu, UF::Silu, UF::Rsqrt, UF::Exp, UF::Log,
                  UF::Sign}) {
      SCOPED_TRACE(std::string(ptc::kernels::unaryFunctionName(fn)) + " n " + std::to_string(n));
      std::vector<float> x(gate);
      if (fn == UF::Rsqrt || fn == UF::Log)
        for (float &v : x)
          v = std::fabs(v) + 0.5f;
      std::vector<float> h(n), dgate(n), dup(n), f(n), gu(n), df(n);
      ASSERT_TRUE(
          runKernel(OpKind::GatedUnary, {view(x, s), view(up, s)}, {view(h, s)}, {}, {}, fn)
              .isOk());
      ASSERT_TRUE(runKernel(OpKind::GatedUnaryGrad, {view(x, s), view(up, s), view(g, s)},
                            {view(dgate, s), view(dup, s)}, {}, {}, fn)
                      .isOk());
      ASSERT_TRUE(runKernel(OpKind::Unary, {view(x, s)}, {view(f, s)}, {}, {}, fn).isOk());
      for (int64_t i = 0; i < n; ++i)
        gu[i] = g[i] * up[i];
      ASSERT_TRUE(
          runKernel(OpKind::UnaryGrad, {view(x, s), view(gu, s)}, {view(df, s)}, {}, {}, fn)
              .isOk());
      const bool libm = fn == UF::Exp || fn == UF::Log || fn == UF::Tanh;
      auto expectSame = [&](float got, float want, const char *what, int64_t i) {
        if (libm)
          ASSERT_NEAR(got, want, 2.5e-7f * std::fabs(want)) << what << " at " << i;
        else
          ASSERT_EQ(got, want) << what << " at " << i;
      };
      for (int64_t i = 0; i < n; ++i) {
        expectSame(h[i], f[i] * up[i], "result", i);
        expectSame(dgate[i], df[i], "gate gradient", i);
        expectSame(dup[i], g[i] * f[i], "up gradient", i);
      }
      std::vector<uint16_t> x16, up16, g16, h16(n), dgate16(n), dup16(n);
      auto xw = roundToBf16(x, x16), upw = roundToBf16(up, up16), gw = roundToBf16(g, g16);
      ASSERT_TRUE(runKernel(OpKind::GatedUnary, {bf(x16, s), bf(up16, s)}, {bf(h16, s)}, {}, {},
                            fn)
                      .isOk());
      ASSERT_TRUE(runKernel(OpKind::GatedUnaryGrad, {bf(x16, s), bf(up16, s), bf(g16, s)},
                            {bf(dgate16, s), bf(dup16, s)}, {}, {}, fn)
                      .isOk());
      ASSERT_TRUE(
          runKernel(OpKind::GatedUnary, {view(xw, s), view(upw, s)}, {view(h, s)}, {}, {}, fn)
              .isOk());
      ASSERT_TRUE(runKernel(OpKind::GatedUnaryGrad, {view(xw, s), view(upw, s), view(gw, s)},
                            {view(dgate, s), view(dup, s)}, {}, {}, fn)
                      .isOk());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(h16[i], f32ToBf16(h[i])) << "bf16 result at " << i;
        ASSERT_EQ(dgate16[i], f32ToBf16(dgate[i])) << "bf16 gate gradient at " << i;
        ASSERT_EQ(dup16[i], f32ToBf16(dup[i])) << "bf16 up gradient at " << i;
      }
    }
  }
  // SiLU far out on both sides (its exp of -|x| neither overflows nor loses
  // the tiny negative tail).
  std::vector<float> x{-100.0f, -30.0f, -10.0f, 10.0f, 30.0f, 100.0f}, y(x.size());
  unary(UF::Silu, x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = x[i] / (1.0 + std::exp(-static_cast<double>(x[i])));
    EXPECT_NEAR(y[i], want, 1e-6 * std::fabs(want) + 1e-30) << "silu(" << x[i] << ")";
  }
}

// Arithmetic and activations on bf16 storage compute in f32 and round once:
// bitwise the f32 kernel on the widened inputs, rounded (what the executor's
// widening gave before these kernels took bf16).
TEST(Kernels, Bf16ArithmeticAndActivationsRoundOnceLikeWidening) {
  using ptc::kernels::DType;
  using ptc::kernels::OpKind;
  const Shape as{4, 3, 8}, bs{8};
  auto a = randomVector(96, 61), b = randomVector(8, 62);
  std::vector<uint16_t> a16(a.size()), b16(b.size()), out16(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    a16[i] = f32ToBf16(a[i]);
  for (size_t i = 0; i < b.size(); ++i)
    b16[i] = f32ToBf16(b[i]);
  std::vector<float> aw(a.size()), bw(b.size()), ref(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    aw[i] = bf16ToF32(a16[i]);
  for (size_t i = 0; i < b.size(); ++i)
    bw[i] = bf16ToF32(b16[i]);
  auto expectRounded = [&](const char *what) {
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_EQ(out16[i], f32ToBf16(ref[i])) << what << " at " << i;
  };
  ASSERT_TRUE(runKernel(OpKind::Mul, {bf(a16, as), bf(b16, bs)}, {bf(out16, as)}).isOk());
  ASSERT_TRUE(runKernel(OpKind::Mul, {view(aw, as), view(bw, bs)}, {view(ref, as)}).isOk());
  expectRounded("mul");
  for (UnaryFunction fn : {UnaryFunction::Gelu, UnaryFunction::Silu}) {
    ASSERT_TRUE(runKernel(OpKind::Unary, {bf(a16, as)}, {bf(out16, as)}, {}, {}, fn).isOk());
    ASSERT_TRUE(runKernel(OpKind::Unary, {view(aw, as)}, {view(ref, as)}, {}, {}, fn).isOk());
    expectRounded("activation");
    ASSERT_TRUE(
        runKernel(OpKind::UnaryGrad, {bf(a16, as), bf(a16, as)}, {bf(out16, as)}, {}, {}, fn)
            .isOk());
    ASSERT_TRUE(
        runKernel(OpKind::UnaryGrad, {view(aw, as), view(aw, as)}, {view(ref, as)}, {}, {}, fn)
            .isOk());
    expectRounded("activation gradient");
  }
}

// bf16 activations compute in f32 and round each result once: every result
// must be f32ToBf16's rounding of the f32 kernel's value, on every bf16 bit
// pattern as input (denormal, NaN, infinite results among them; a NaN's
// payload may differ between the f32 and bf16 loops, its being NaN may not),
// over a length that leaves partial vectors and splits over the threads.
// (AVX512-BF16's conversion would flush the denormals: this is what keeps
// it from replacing the software rounding unchecked.)
TEST(Kernels, Bf16ActivationsRoundEveryValueLikeSoftware) {
  using ptc::kernels::OpKind;
  const int64_t n = 3 * 65536 + 7;
  const Shape shape{n};
  std::vector<uint16_t> x16(n), g16(n), out16(n), out16b(n);
  std::vector<float> x(n), g(n), ref(n), refb(n);
  for (int64_t i = 0; i < n; ++i) {
    x16[i] = static_cast<uint16_t>(i * 40503u); // every pattern, shuffled
    g16[i] = static_cast<uint16_t>(i);
    x[i] = bf16ToF32(x16[i]);
    g[i] = bf16ToF32(g16[i]);
  }
  auto expectRounded = [&](const std::vector<uint16_t> &got, const std::vector<float> &want,
                           const char *what) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(want[i]))
        ASSERT_TRUE(std::isnan(bf16ToF32(got[i]))) << what << " at " << i;
      else
        ASSERT_EQ(got[i], f32ToBf16(want[i])) << what << " at " << i << " (x bits " << x16[i] << ")";
    }
  };
  for (UnaryFunction fn : {UnaryFunction::Relu, UnaryFunction::Gelu, UnaryFunction::Silu}) {
    ASSERT_TRUE(runKernel(OpKind::Unary, {bf(x16, shape)}, {bf(out16, shape)}, {}, {}, fn).isOk());
    ASSERT_TRUE(runKernel(OpKind::Unary, {view(x, shape)}, {view(ref, shape)}, {}, {}, fn).isOk());
    expectRounded(out16, ref, "activation");
    ASSERT_TRUE(runKernel(OpKind::UnaryGrad, {bf(x16, shape), bf(g16, shape)}, {bf(out16, shape)},
                          {}, {}, fn)
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::UnaryGrad, {view(x, shape), view(g, shape)}, {view(ref, shape)},
                          {}, {}, fn)
                    .isOk());
    expectRounded(out16, ref, "activation gradient");
    ASSERT_TRUE(runKernel(OpKind::GatedUnary, {bf(x16, shape), bf(g16, shape)}, {bf(out16, shape)},
                          {}, {}, fn)
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::GatedUnary, {view(x, shape), view(g, shape)}, {view(ref, shape)},
                          {}, {}, fn)
                    .isOk());
    expectRounded(out16, ref, "gated activation");
    ASSERT_TRUE(runKernel(OpKind::GatedUnaryGrad, {bf(x16, shape), bf(g16, shape), bf(x16, shape)},
                          {bf(out16, shape), bf(out16b, shape)}, {}, {}, fn)
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::GatedUnaryGrad, {view(x, shape), view(g, shape), view(x, shape)},
                          {view(ref, shape), view(refb, shape)}, {}, {}, fn)
                    .isOk());
    expectRounded(out16, ref, "gated gate gradient");
    expectRounded(out16b, refb, "gated up gradient");
  }
}

// Causal attention and its gradient on bf16 storage. With bf16 instructions
// (nativeBf16: AVX512-BF16) the products are bf16 dot products, the
// probabilities and the scores' gradient rounded to bf16 for them: within
// bf16's rounding of a double reference on every odd shape. Without them
// (ONEDNN_MAX_CPU_ISA=AVX2 runs this test too) the heads are widened: bitwise
// the f32 kernel on the widened inputs, each result rounded once.
// Packed documents in bf16 (the bf16 dot-product kernels where the CPU has
// them, else the widening ones): each document as if alone, within bf16's
// rounding, and positions 0, 1, .. bitwise the plain causal kernel.
TEST(Kernels, Bf16PackedDocumentsAttendWithinTheirDocument) {
  const int64_t H = 4, KV = 2, S = 75, D = 16;
  const std::vector<int64_t> docs = {7, 33, 1, 34}; // odd starts: keys go in pairs there
  std::vector<int32_t> positions(S), counting(S);
  for (int64_t i = 0, at = 0; at < static_cast<int64_t>(docs.size()); ++at)
    for (int64_t p = 0; p < docs[at]; ++p, ++i)
      positions[i] = static_cast<int32_t>(p);
  for (int64_t i = 0; i < S; ++i)
    counting[i] = static_cast<int32_t>(i);
  std::vector<uint16_t> q16, k16, v16, g16;
  roundToBf16(randomVector(H * S * D, 91), q16);
  roundToBf16(randomVector(KV * S * D, 92), k16);
  roundToBf16(randomVector(KV * S * D, 93), v16);
  roundToBf16(randomVector(H * S * D, 94), g16);
  const float scale = 0.25f;
  auto run = [&](const int32_t *pos, std::vector<uint16_t> &o, std::vector<uint16_t> &dq,
                 std::vector<uint16_t> &dk, std::vector<uint16_t> &dv) {
    o.assign(q16.size(), 0), dq.assign(q16.size(), 0), dk.assign(k16.size(), 0);
    dv.assign(v16.size(), 0);
    causalAttention(q16.data(), k16.data(), v16.data(), o.data(), {1, H, S, D}, KV, scale, false,
                    0, pos);
    causalAttentionGrad(q16.data(), k16.data(), v16.data(), g16.data(), dq.data(), dk.data(),
                        dv.data(), {1, H, S, D}, KV, scale, false, 0, pos);
  };
  std::vector<uint16_t> o, dq, dk, dv, po, pdq, pdk, pdv;
  run(positions.data(), o, dq, dk, dv);
  // Each document alone (its rows of every head, copied out).
  int64_t start = 0;
  for (int64_t len : docs) {
    auto cut = [&](const std::vector<uint16_t> &x, int64_t heads) {
      std::vector<uint16_t> y(heads * len * D);
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(x.begin() + (h * S + start) * D, len * D, y.begin() + h * len * D);
      return y;
    };
    auto q1 = cut(q16, H), k1 = cut(k16, KV), v1 = cut(v16, KV), g1 = cut(g16, H);
    std::vector<uint16_t> o1(q1.size()), dq1(q1.size()), dk1(k1.size()), dv1(v1.size());
    causalAttention(q1.data(), k1.data(), v1.data(), o1.data(), {1, H, len, D}, KV, scale);
    causalAttentionGrad(q1.data(), k1.data(), v1.data(), g1.data(), dq1.data(), dk1.data(),
                        dv1.data(), {1, H, len, D}, KV, scale);
    for (auto [got, want, what] : {std::tuple{cut(o, H), o1, "output"}, {cut(dq, H), dq1, "dq"},
                                   {cut(dk, KV), dk1, "dk"}, {cut(dv, KV), dv1, "dv"}}) {
      double err = 0, norm = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double a = bf16ToF32(got[i]), b = bf16ToF32(want[i]);
        err += (a - b) * (a - b);
        norm += b * b;
      }
      EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), 1e-2)
          << what << " of the document at " << start << " (" << len << " tokens)";
    }
    start += len;
  }
  std::vector<uint16_t> co, cdq, cdk, cdv;
  run(counting.data(), co, cdq, cdk, cdv);
  run(nullptr, po, pdq, pdk, pdv);
  EXPECT_EQ(co, po);
  EXPECT_EQ(cdq, pdq);
  EXPECT_EQ(cdk, pdk);
  EXPECT_EQ(cdv, pdv);
}

TEST(Kernels, Bf16CausalAttentionMatchesReferenceNativeOrWidened) {
  using ptc::kernels::OpKind;
  for (AttentionCase t : kAttentionCases) {
    SCOPED_TRACE("S " + std::to_string(t.S) + " D " + std::to_string(t.D) +
                 (nativeBf16() ? " (bf16 dot products)" : " (widened)"));
    const Shape qs{t.B, t.H, t.S, t.D}, ks{t.B, t.KV, t.S, t.D};
    const size_t nq = t.B * t.H * t.S * t.D, nk = t.B * t.KV * t.S * t.D;
    std::vector<uint16_t> q16, k16, v16, g16;
    auto q = roundToBf16(randomVector(nq, 81), q16), k = roundToBf16(randomVector(nk, 82), k16),
         v = roundToBf16(randomVector(nk, 83), v16), g = roundToBf16(randomVector(nq, 84), g16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(t.D));
    std::vector<uint16_t> o16(nq), dq16(nq), dk16(nk), dv16(nk);
    ASSERT_TRUE(runKernel(OpKind::CausalAttention, {bf(q16, qs), bf(k16, ks), bf(v16, ks)},
                          {bf(o16, qs)}, {}, {scale})
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {bf(q16, qs), bf(k16, ks), bf(v16, ks), bf(g16, qs)},
                          {bf(dq16, qs), bf(dk16, ks), bf(dv16, ks)}, {}, {scale})
                    .isOk());
    if (nativeBf16()) {
      auto ref = attentionReference(q, k, v, g, t.B, t.H, t.KV, t.S, t.D, scale);
      double (*widen)(uint16_t) = [](uint16_t x) { return static_cast<double>(bf16ToF32(x)); };
      // bf16 keeps 8 bits: each rounding is within 2^-9 relative; a few of
      // them (probabilities, scores' gradient, result) add up below 1%.
      EXPECT_LT(relativeError(o16, ref.o, widen), 1e-2) << "output";
      EXPECT_LT(relativeError(dq16, ref.dq, widen), 1e-2) << "dq";
      EXPECT_LT(relativeError(dk16, ref.dk, widen), 1e-2) << "dk";
      EXPECT_LT(relativeError(dv16, ref.dv, widen), 1e-2) << "dv";
      continue;
    }
    auto expectRounded = [](const std::vector<uint16_t> &got, const std::vector<float> &want,
                            const char *what) {
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], f32ToBf16(want[i])) << what << " at " << i;
    };
    std::vector<float> o(nq), dq(nq), dk(nk), dv(nk);
    ASSERT_TRUE(runKernel(OpKind::CausalAttention, {view(q, qs), view(k, ks), view(v, ks)},
                          {view(o, qs)}, {}, {scale})
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {view(q, qs), view(k, ks), view(v, ks), view(g, qs)},
                          {view(dq, qs), view(dk, ks), view(dv, ks)}, {}, {scale})
                    .isOk());
    expectRounded(o16, o, "output");
    expectRounded(dq16, dq, "dq");
    expectRounded(dk16, dk, "dk");
    expectRounded(dv16, dv, "dv");
  }
}

/// [b][x][y][d] -> [b][y][x][d] (heads-major <-> seq-major).
template <typename T>
std::vector<T> swapMiddle(const std::vector<T> &in, int64_t b, int64_t x, int64_t y, int64_t d) {
  std::vector<T> out(in.size());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < x; ++j)
      for (int64_t k = 0; k < y; ++k)
        for (int64_t c = 0; c < d; ++c)
          out[((i * y + k) * x + j) * d + c] = in[((i * x + j) * y + k) * d + c];
  return out;
}

/// Attention and its gradient through the kernel table with every tensor
/// seq-major ([batch, seq, heads, head_dim], the integer seq_major = 1) are
/// bitwise the heads-major results transposed, and so are those read from
/// and written into a fused projection: the same arithmetic, read and written
/// in place (ptc-fold-attention-layout relies on it).
template <typename T>
void expectSeqMajorAttentionBitwise(std::vector<T> q, std::vector<T> k, std::vector<T> v,
                                    std::vector<T> g, const AttentionCase &t,
                                    ptc::kernels::TensorView (*wrap)(std::vector<T> &,
                                                                      const Shape &)) {
  using ptc::kernels::OpKind;
  const Shape qs{t.B, t.H, t.S, t.D}, ks{t.B, t.KV, t.S, t.D};
  const Shape qsm{t.B, t.S, t.H, t.D}, ksm{t.B, t.S, t.KV, t.D};
  const double scale = 1.0 / std::sqrt(static_cast<double>(t.D));
  // Forward and gradient of one layout: {output, dq, dk, dv}.
  auto attend = [&](std::vector<T> &q, std::vector<T> &k, std::vector<T> &v, std::vector<T> &g,
                    const Shape &qs, const Shape &ks, std::vector<int64_t> ints) {
    std::vector<std::vector<T>> r{std::vector<T>(q.size()), std::vector<T>(q.size()),
                                  std::vector<T>(k.size()), std::vector<T>(k.size())};
    EXPECT_TRUE(runKernel(OpKind::CausalAttention, {wrap(q, qs), wrap(k, ks), wrap(v, ks)},
                          {wrap(r[0], qs)}, ints, {scale})
                    .isOk());
    EXPECT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {wrap(q, qs), wrap(k, ks), wrap(v, ks), wrap(g, qs)},
                          {wrap(r[1], qs), wrap(r[2], ks), wrap(r[3], ks)}, ints, {scale})
                    .isOk());
    return r;
  };
  auto heads = attend(q, k, v, g, qs, ks, {});
  auto qm = swapMiddle(q, t.B, t.H, t.S, t.D), km = swapMiddle(k, t.B, t.KV, t.S, t.D),
       vm = swapMiddle(v, t.B, t.KV, t.S, t.D), gm = swapMiddle(g, t.B, t.H, t.S, t.D);
  auto seq = attend(qm, km, vm, gm, qsm, ksm, {1});
  EXPECT_TRUE(swapMiddle(seq[0], t.B, t.S, t.H, t.D) == heads[0]) << "output";
  EXPECT_TRUE(swapMiddle(seq[1], t.B, t.S, t.H, t.D) == heads[1]) << "dq";
  EXPECT_TRUE(swapMiddle(seq[2], t.B, t.S, t.KV, t.D) == heads[2]) << "dk";
  EXPECT_TRUE(swapMiddle(seq[3], t.B, t.S, t.KV, t.D) == heads[3]) << "dv";
  // The fused projection's layout (CausalAttentionQkv(Grad)): q, k and v as
  // column blocks of one [batch, seq, (heads + 2 kv_heads) * head_dim]
  // tensor, the gradients written into such a tensor: bitwise seq-major's.
  const int64_t qc = t.H * t.D, kc = t.KV * t.D, width = qc + 2 * kc, rows = t.B * t.S;
  std::vector<T> qkv(static_cast<size_t>(rows * width)), out(qm.size()), dqkv(qkv.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(qm.begin() + r * qc, qc, qkv.begin() + r * width);
    std::copy_n(km.begin() + r * kc, kc, qkv.begin() + r * width + qc);
    std::copy_n(vm.begin() + r * kc, kc, qkv.begin() + r * width + qc + kc);
  }
  const Shape fs{t.B, t.S, width};
  EXPECT_TRUE(
      runKernel(OpKind::CausalAttentionQkv, {wrap(qkv, fs)}, {wrap(out, qsm)}, {}, {scale}).isOk());
  EXPECT_TRUE(runKernel(OpKind::CausalAttentionQkvGrad, {wrap(qkv, fs), wrap(gm, qsm)},
                        {wrap(dqkv, fs)}, {}, {scale})
                  .isOk());
  EXPECT_TRUE(out == seq[0]) << "fused output";
  std::vector<T> dq(seq[1].size()), dk(seq[2].size()), dv(seq[3].size());
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(dqkv.begin() + r * width, qc, dq.begin() + r * qc);
    std::copy_n(dqkv.begin() + r * width + qc, kc, dk.begin() + r * kc);
    std::copy_n(dqkv.begin() + r * width + qc + kc, kc, dv.begin() + r * kc);
  }
  EXPECT_TRUE(dq == seq[1]) << "fused dq";
  EXPECT_TRUE(dk == seq[2]) << "fused dk";
  EXPECT_TRUE(dv == seq[3]) << "fused dv";
}

TEST(Kernels, CausalAttentionSeqMajorIsBitwiseHeadsMajor) {
  for (AttentionCase t : kAttentionCases) {
    SCOPED_TRACE("S " + std::to_string(t.S) + " D " + std::to_string(t.D));
    const size_t nq = t.B * t.H * t.S * t.D, nk = t.B * t.KV * t.S * t.D;
    expectSeqMajorAttentionBitwise(randomVector(nq, 91), randomVector(nk, 92),
                                   randomVector(nk, 93), randomVector(nq, 94), t, view);
  }
}

// The forward's row statistics saved for the backward pass
// (ptc-save-attention-stats): the forward writes each row's log-sum-exp (its
// result unchanged, bitwise), and the gradient given the result and those
// statistics matches the double reference as the recomputing one does, in
// every layout (heads-major, seq-major, the fused projection's) bitwise alike;
// document positions still mask (all-counting positions: bitwise the plain
// call); bf16 close to the recomputing bf16 gradient.
TEST(Kernels, SavedAttentionStatisticsGiveTheGradient) {
  using ptc::kernels::OpKind;
  for (AttentionCase t : kAttentionCases) {
    SCOPED_TRACE("S " + std::to_string(t.S) + " D " + std::to_string(t.D));
    const size_t nq = t.B * t.H * t.S * t.D, nk = t.B * t.KV * t.S * t.D,
                 nr = t.B * t.H * t.S;
    auto q = randomVector(nq, 141), k = randomVector(nk, 142), v = randomVector(nk, 143),
         g = randomVector(nq, 144);
    const double scale = 1.0 / std::sqrt(static_cast<double>(t.D));
    const Shape qs{t.B, t.H, t.S, t.D}, ks{t.B, t.KV, t.S, t.D}, rs{t.B, t.H, t.S};
    const auto ref = attentionReference(q, k, v, g, t.B, t.H, t.KV, t.S, t.D, scale);
    std::vector<float> plain(nq), o(nq), lse(nr), dq(nq), dk(nk), dv(nk);
    ASSERT_TRUE(runKernel(OpKind::CausalAttention, {view(q, qs), view(k, ks), view(v, ks)},
                          {view(plain, qs)}, {}, {scale})
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::CausalAttention, {view(q, qs), view(k, ks), view(v, ks)},
                          {view(o, qs), view(lse, rs)}, {}, {scale})
                    .isOk());
    EXPECT_TRUE(o == plain) << "the result with statistics written";
    EXPECT_LT(relativeError(lse, ref.lse), 1e-6) << "lse";
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {view(q, qs), view(k, ks), view(v, ks), view(g, qs), view(o, qs),
                           view(lse, rs)},
                          {view(dq, qs), view(dk, ks), view(dv, ks)}, {}, {scale})
                    .isOk());
    EXPECT_LT(relativeError(dq, ref.dq), 2e-6) << "dq";
    EXPECT_LT(relativeError(dk, ref.dk), 2e-6) << "dk";
    EXPECT_LT(relativeError(dv, ref.dv), 2e-6) << "dv";
    // The gradient reads the statistics (no recomputation): raised by log 2,
    // every probability halves, and so does dv.
    std::vector<float> raised(lse), hdq(nq), hdk(nk), hdv(nk);
    for (float &x : raised)
      x += std::log(2.0f);
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {view(q, qs), view(k, ks), view(v, ks), view(g, qs), view(o, qs),
                           view(raised, rs)},
                          {view(hdq, qs), view(hdk, ks), view(hdv, ks)}, {}, {scale})
                    .isOk());
    std::vector<double> halfDv(ref.dv);
    for (double &x : halfDv)
      x /= 2;
    EXPECT_LT(relativeError(hdv, halfDv), 2e-6) << "dv from raised statistics";

    // Counting positions (one document per sequence): bitwise the plain call.
    std::vector<int32_t> counting(static_cast<size_t>(t.B * t.S));
    for (size_t x = 0; x < counting.size(); ++x)
      counting[x] = static_cast<int32_t>(x % static_cast<size_t>(t.S));
    const Shape ps{t.B, t.S};
    ptc::kernels::TensorView pos{counting.data(), ptc::kernels::DType::I32, &ps,
                                 static_cast<int64_t>(counting.size())};
    std::vector<float> pdq(nq), pdk(nk), pdv(nk);
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {view(q, qs), view(k, ks), view(v, ks), view(g, qs), view(o, qs),
                           view(lse, rs), pos},
                          {view(pdq, qs), view(pdk, ks), view(pdv, ks)}, {}, {scale})
                    .isOk());
    EXPECT_TRUE(pdq == dq && pdk == dk && pdv == dv) << "with counting positions";

    // The fused projection's layout: the same statistics and gradients.
    const Shape qsm{t.B, t.S, t.H, t.D};
    auto qm = swapMiddle(q, t.B, t.H, t.S, t.D), km = swapMiddle(k, t.B, t.KV, t.S, t.D),
         vm = swapMiddle(v, t.B, t.KV, t.S, t.D), gm = swapMiddle(g, t.B, t.H, t.S, t.D);
    const int64_t qc = t.H * t.D, kc = t.KV * t.D, width = qc + 2 * kc, rows = t.B * t.S;
    std::vector<float> qkv(static_cast<size_t>(rows * width)), fo(nq), flse(nr),
        dqkv(qkv.size());
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(qm.begin() + r * qc, qc, qkv.begin() + r * width);
      std::copy_n(km.begin() + r * kc, kc, qkv.begin() + r * width + qc);
      std::copy_n(vm.begin() + r * kc, kc, qkv.begin() + r * width + qc + kc);
    }
    const Shape fs{t.B, t.S, width};
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionQkv, {view(qkv, fs)},
                          {view(fo, qsm), view(flse, rs)}, {}, {scale})
                    .isOk());
    EXPECT_TRUE(flse == lse) << "fused lse";
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionQkvGrad,
                          {view(qkv, fs), view(gm, qsm), view(fo, qsm), view(flse, rs)},
                          {view(dqkv, fs)}, {}, {scale})
                    .isOk());
    std::vector<float> fdq(nq);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(dqkv.begin() + r * width, qc, fdq.begin() + r * qc);
    EXPECT_TRUE(swapMiddle(fdq, t.B, t.S, t.H, t.D) == dq) << "fused dq";

    // bf16 storage: close to the recomputing bf16 gradient.
    std::vector<uint16_t> q16, k16, v16, g16, o16(nq), r16(nq), dq16(nq), dk16(nk), dv16(nk),
        rq16(nq), rk16(nk), rv16(nk);
    roundToBf16(q, q16);
    roundToBf16(k, k16);
    roundToBf16(v, v16);
    roundToBf16(g, g16);
    std::vector<float> lse16(nr);
    ASSERT_TRUE(runKernel(OpKind::CausalAttention, {bf(q16, qs), bf(k16, ks), bf(v16, ks)},
                          {bf(o16, qs), view(lse16, rs)}, {}, {scale})
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {bf(q16, qs), bf(k16, ks), bf(v16, ks), bf(g16, qs), bf(o16, qs),
                           view(lse16, rs)},
                          {bf(dq16, qs), bf(dk16, ks), bf(dv16, ks)}, {}, {scale})
                    .isOk());
    ASSERT_TRUE(runKernel(OpKind::CausalAttentionGrad,
                          {bf(q16, qs), bf(k16, ks), bf(v16, ks), bf(g16, qs)},
                          {bf(rq16, qs), bf(rk16, ks), bf(rv16, ks)}, {}, {scale})
                    .isOk());
    auto widen = [](const std::vector<uint16_t> &x) {
      std::vector<double> y(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        y[i] = bf16ToF32(x[i]);
      return y;
    };
    auto value = [](uint16_t x) { return static_cast<double>(bf16ToF32(x)); };
    EXPECT_LT(relativeError(dq16, widen(rq16), +value), 2e-2) << "bf16 dq";
    EXPECT_LT(relativeError(dk16, widen(rk16), +value), 2e-2) << "bf16 dk";
    EXPECT_LT(relativeError(dv16, widen(rv16), +value), 2e-2) << "bf16 dv";
  }
}

// The same on bf16 storage: the bf16 dot products where the CPU has them, the
// widened heads under ONEDNN_MAX_CPU_ISA=AVX2.
TEST(Kernels, Bf16CausalAttentionSeqMajorIsBitwiseHeadsMajor) {
  for (AttentionCase t : kAttentionCases) {
    SCOPED_TRACE("S " + std::to_string(t.S) + " D " + std::to_string(t.D) +
                 (nativeBf16() ? " (bf16 dot products)" : " (widened)"));
    const size_t nq = t.B * t.H * t.S * t.D, nk = t.B * t.KV * t.S * t.D;
    std::vector<uint16_t> q16, k16, v16, g16;
    roundToBf16(randomVector(nq, 95), q16);
    roundToBf16(randomVector(nk, 96), k16);
    roundToBf16(randomVector(nk, 97), v16);
    roundToBf16(randomVector(nq, 98), g16);
    expectSeqMajorAttentionBitwise(q16, k16, v16, g16, t, bf);
  }
}

// Sums, means and maxima on bf16 storage (f32 sums inside the kernel):
// bitwise the f32 kernel on the widened input, rounded once. The shapes take
// every path: the bias gradient's register sums (a 128-column last dimension
// kept, leading dimensions reduced), a ragged column block, an inner axis
// reduced with the last one kept, and the last dimension reduced.
TEST(Kernels, Bf16ReductionsAreWidenedF32RoundedOnce) {
  using ptc::kernels::DType;
  using ptc::kernels::OpKind;
  struct Case { Shape in; std::vector<int64_t> axes; Shape out; };
  for (const Case &t : {Case{{3, 5, 128}, {0, 1}, {128}}, Case{{7, 70}, {0}, {70}},
                        Case{{4, 6, 9}, {1}, {4, 9}}, Case{{6, 33}, {1}, {6}}}) {
    int64_t n = 1, m = 1;
    for (int64_t d : t.in)
      n *= d;
    for (int64_t d : t.out)
      m *= d;
    std::vector<uint16_t> x16, o16(m);
    auto x = roundToBf16(randomVector(n, 91), x16);
    std::vector<float> o(m);
    for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax}) {
      ASSERT_TRUE(runKernel(op, {bf(x16, t.in)}, {bf(o16, t.out)}, t.axes).isOk());
      ASSERT_TRUE(runKernel(op, {view(x, t.in)}, {view(o, t.out)}, t.axes).isOk());
      for (int64_t i = 0; i < m; ++i)
        ASSERT_EQ(o16[i], f32ToBf16(o[i])) << ptc::kernels::opKindName(op) << " at " << i;
    }
  }
}

// Rotary on the seq-major layout [batch, seq, heads, dim] (ints: inverse, no
// mesh axis, seq_major) is bitwise the heads-major rotation between head
// transposes, f32 and bf16, both ways; with a mesh axis, the block's
// positions start at its coordinate times the local sequence in either layout.
TEST(Kernels, SeqMajorRotaryIsTheHeadsMajorOneBetweenTransposes) {
  using ptc::kernels::OpKind;
  const int64_t B = 2, S = 24, H = 3, D = 16;
  const Shape sm{B, S, H, D}, hm{B, H, S, D};
  auto swap = [&](const auto &in, bool toHeadsMajor) {
    auto out = in;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t smi = ((b * S + s) * H + h) * D + d, hmi = ((b * H + h) * S + s) * D + d;
            if (toHeadsMajor)
              out[hmi] = in[smi];
            else
              out[smi] = in[hmi];
          }
    return out;
  };
  std::vector<uint16_t> x16;
  auto x = roundToBf16(randomVector(B * S * H * D, 61), x16);
  for (int64_t inverse : {0, 1}) {
    std::vector<float> y(x.size()), viaHeads(x.size());
    auto xh = swap(x, true);
    ASSERT_TRUE(runKernel(OpKind::Rotary, {view(x, sm)}, {view(y, sm)}, {inverse, -1, 1}, {500.0})
                    .isOk());
    ASSERT_TRUE(
        runKernel(OpKind::Rotary, {view(xh, hm)}, {view(viaHeads, hm)}, {inverse}, {500.0}).isOk());
    EXPECT_EQ(y, swap(viaHeads, false)) << "f32, inverse " << inverse;
    std::vector<uint16_t> y16(x.size()), viaHeads16(x.size());
    auto xh16 = swap(x16, true);
    ASSERT_TRUE(
        runKernel(OpKind::Rotary, {bf(x16, sm)}, {bf(y16, sm)}, {inverse, -1, 1}, {500.0}).isOk());
    ASSERT_TRUE(
        runKernel(OpKind::Rotary, {bf(xh16, hm)}, {bf(viaHeads16, hm)}, {inverse}, {500.0}).isOk());
    EXPECT_EQ(y16, swap(viaHeads16, false)) << "bf16, inverse " << inverse;
  }
  // Block 1 of a 2-way axis (runKernel's call has no mesh: set one).
  std::vector<float> y(x.size()), viaHeads(x.size());
  auto xh = swap(x, true);
  for (auto [shape, in, out, ints] :
       {std::tuple{&sm, &x, &y, std::vector<int64_t>{0, 0, 1}},
        std::tuple{&hm, &xh, &viaHeads, std::vector<int64_t>{0, 0}}}) {
    std::vector<ptc::kernels::TensorView> vin{view(*in, *shape)}, vout{view(*out, *shape)};
    std::vector<double> floats{500.0};
    ptc::kernels::KernelCall call =
        ptc::kernels::makeKernelCall(OpKind::Rotary, vin, vout, ints, floats);
    const int64_t coords[1] = {1}, sizes[1] = {2};
    call.meshCoords = coords;
    call.meshSizes = sizes;
    EXPECT_EQ(ptc::kernels::rotaryFirstPosition(call), S);
    ASSERT_TRUE(kernelTable()[OpKind::Rotary].run(call).isOk());
  }
  EXPECT_EQ(y, swap(viaHeads, false)) << "the second block of the sequence";
  // RotaryAt (ints: inverse, seq_major) at positions [batch, tokens] likewise.
  std::vector<int32_t> positions(B * S);
  for (int64_t i = 0; i < B * S; ++i)
    positions[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 11);
  const Shape ps{B, S};
  ptc::kernels::TensorView pv{positions.data(), ptc::kernels::DType::I32, &ps, B * S};
  for (int64_t inverse : {0, 1}) {
    std::vector<uint16_t> y16(x.size()), viaHeads16(x.size());
    auto xh16 = swap(x16, true);
    ASSERT_TRUE(runKernel(OpKind::RotaryAt, {bf(x16, sm), pv}, {bf(y16, sm)}, {inverse, 1}, {500.0})
                    .isOk());
    ASSERT_TRUE(
        runKernel(OpKind::RotaryAt, {bf(xh16, hm), pv}, {bf(viaHeads16, hm)}, {inverse}, {500.0})
            .isOk());
    EXPECT_EQ(y16, swap(viaHeads16, false)) << "rotary_at, inverse " << inverse;
  }
}

// The loss over bf16 logits (ptc-fuse-loss-widening's form): the f32 loss
// of the widened logits exactly, and the gradient the f32 gradient rounded
// once (bitwise what widening the logits and converting the gradient gave),
// on rows large enough for the kernels to split them over threads. The
// gradient with the loss too (its optional second output) gives both bitwise.
TEST(Kernels, Bf16CrossEntropyIsWidenedF32RoundedOnce) {
  using ptc::kernels::DType;
  using ptc::kernels::OpKind;
  const int64_t rows = 96, classes = 257;
  const Shape ls{2, rows / 2, classes}, ts{2, rows / 2}, scalar{};
  std::vector<uint16_t> l16;
  auto logits = roundToBf16(randomVector(rows * classes, 17), l16);
  for (float &v : logits)
    v *= 4.0f; // exact in bf16: a power of two
  for (uint16_t &b : l16)
    b = f32ToBf16(bf16ToF32(b) * 4.0f);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = static_cast<int32_t>((r * 37) % classes);
  ptc::kernels::TensorView t{targets.data(), DType::I32, &ts, rows};
  std::vector<float> loss16(1), loss(1), seed{0.75f};
  ASSERT_TRUE(runKernel(OpKind::CrossEntropy, {bf(l16, ls), t}, {view(loss16, scalar)}).isOk());
  ASSERT_TRUE(runKernel(OpKind::CrossEntropy, {view(logits, ls), t}, {view(loss, scalar)}).isOk());
  EXPECT_EQ(loss16[0], loss[0]);
  std::vector<uint16_t> g16(logits.size());
  std::vector<float> g(logits.size());
  ASSERT_TRUE(runKernel(OpKind::CrossEntropyGrad, {bf(l16, ls), t, view(seed, scalar)},
                        {bf(g16, ls)})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::CrossEntropyGrad, {view(logits, ls), t, view(seed, scalar)},
                        {view(g, ls)})
                  .isOk());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_EQ(g16[i], f32ToBf16(g[i])) << "gradient at " << i;
  // The gradient with the loss as its second output (ptc.cross_entropy_with_grad):
  // bitwise the two calls' loss and gradient, f32 and bf16 logits.
  std::vector<float> fusedLoss(1), fusedLoss16(1), fusedG(logits.size());
  std::vector<uint16_t> fusedG16(logits.size());
  ASSERT_TRUE(runKernel(OpKind::CrossEntropyGrad, {view(logits, ls), t, view(seed, scalar)},
                        {view(fusedG, ls), view(fusedLoss, scalar)})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::CrossEntropyGrad, {bf(l16, ls), t, view(seed, scalar)},
                        {bf(fusedG16, ls), view(fusedLoss16, scalar)})
                  .isOk());
  EXPECT_EQ(fusedLoss[0], loss[0]);
  EXPECT_EQ(fusedLoss16[0], loss16[0]);
  EXPECT_TRUE(fusedG == g) << "f32 gradient";
  EXPECT_TRUE(fusedG16 == g16) << "bf16 gradient";
  // A bf16 loss (or its gradient's seed) is not computed natively: the
  // executor widens that call.
  std::vector<uint16_t> lossBits(1);
  std::vector<ptc::kernels::TensorView> in{bf(l16, ls), t}, out{bf(lossBits, scalar)};
  std::vector<int64_t> ints;
  std::vector<double> floats;
  ptc::kernels::KernelCall call =
      ptc::kernels::makeKernelCall(OpKind::CrossEntropy, in, out, ints, floats);
  EXPECT_FALSE(kernelTable()[OpKind::CrossEntropy].accepts(call));
}

// The vocabulary-parallel loss's pieces on a rank's block of bf16 logits
// (ptc-fuse-loss-widening under tp): bitwise the f32 pieces on the widened
// block, the gradient the f32 gradient rounded once; a block of classes
// [257, 514) of 514, so that some targets are another rank's.
TEST(Kernels, Bf16VocabParallelPiecesAreWidenedF32RoundedOnce) {
  using ptc::kernels::DType;
  using ptc::kernels::OpKind;
  const int64_t rows = 96, classes = 257, first = 257, total = 514;
  const Shape ls{2, rows / 2, classes}, rs{rows}, scalar{1};
  std::vector<uint16_t> l16;
  auto logits = roundToBf16(randomVector(rows * classes, 23), l16);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = static_cast<int32_t>((r * 41) % total);
  ptc::kernels::TensorView t{targets.data(), DType::I32, &rs, rows};
  const std::vector<int64_t> block{first, total};
  std::vector<float> mx(rows), mx16(rows), sum(rows), sum16(rows), tl(rows), tl16(rows);
  ASSERT_TRUE(runKernel(OpKind::RowMax, {view(logits, ls)}, {view(mx, rs)}).isOk());
  ASSERT_TRUE(runKernel(OpKind::RowMax, {bf(l16, ls)}, {view(mx16, rs)}).isOk());
  EXPECT_TRUE(mx16 == mx);
  ASSERT_TRUE(
      runKernel(OpKind::RowSumExp, {view(logits, ls), view(mx, rs)}, {view(sum, rs)}).isOk());
  ASSERT_TRUE(
      runKernel(OpKind::RowSumExp, {bf(l16, ls), view(mx, rs)}, {view(sum16, rs)}).isOk());
  EXPECT_TRUE(sum16 == sum);
  ASSERT_TRUE(
      runKernel(OpKind::TargetLogit, {view(logits, ls), t}, {view(tl, rs)}, block).isOk());
  ASSERT_TRUE(runKernel(OpKind::TargetLogit, {bf(l16, ls), t}, {view(tl16, rs)}, block).isOk());
  EXPECT_TRUE(tl16 == tl);
  int held = 0;
  for (int64_t r = 0; r < rows; ++r)
    held += targets[r] >= first;
  EXPECT_GT(held, 0);
  EXPECT_LT(held, rows);
  std::vector<float> seed{0.75f}, g(logits.size());
  std::vector<uint16_t> g16(logits.size());
  ASSERT_TRUE(runKernel(OpKind::VocabParallelGrad,
                        {view(logits, ls), t, view(seed, scalar), view(mx, rs), view(sum, rs)},
                        {view(g, ls)}, block)
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::VocabParallelGrad,
                        {bf(l16, ls), t, view(seed, scalar), view(mx, rs), view(sum, rs)},
                        {bf(g16, ls)}, block)
                  .isOk());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_EQ(g16[i], f32ToBf16(g[i])) << "gradient at " << i;
  // A gradient in another type than the logits' is not taken natively.
  std::vector<ptc::kernels::TensorView> in{bf(l16, ls), t, view(seed, scalar), view(mx, rs),
                                           view(sum, rs)},
      out{view(g, ls)};
  std::vector<int64_t> ints = block;
  std::vector<double> floats;
  EXPECT_FALSE(kernelTable()[OpKind::VocabParallelGrad].accepts(
      ptc::kernels::makeKernelCall(OpKind::VocabParallelGrad, in, out, ints, floats)));
}

// Rotary on bf16 storage: each result is the f32 rotation of the widened
// input rounded once (bitwise what widening the tensor gives), forward and
// inverse, on a tensor large enough for the kernel to split it over threads.
TEST(Kernels, Bf16RotaryIsWidenedF32RoundedOnce) {
  using ptc::kernels::OpKind;
  const Shape xs{2, 4, 64, 32};
  std::vector<uint16_t> x16;
  auto x = roundToBf16(randomVector(2 * 4 * 64 * 32, 81), x16);
  for (int64_t inverse : {0, 1}) {
    std::vector<uint16_t> y16(x.size());
    std::vector<float> y(x.size());
    ASSERT_TRUE(runKernel(OpKind::Rotary, {bf(x16, xs)}, {bf(y16, xs)}, {inverse}, {10000.0})
                    .isOk());
    ASSERT_TRUE(
        runKernel(OpKind::Rotary, {view(x, xs)}, {view(y, xs)}, {inverse}, {10000.0}).isOk());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(y16[i], f32ToBf16(y[i])) << "inverse " << inverse << " at " << i;
  }
}

// LayerNorm and RMSNorm (and their gradients) on bf16 storage: f32 statistics
// and sums, so each result is within one bf16 rounding of the f32 kernel on
// the widened inputs (the sums may group differently: not bitwise).
TEST(Kernels, Bf16NormalizationsMatchWidenedF32) {
  using ptc::kernels::DType;
  using ptc::kernels::OpKind;
  const int64_t R = 9, C = 40;
  const Shape xs{R, C}, ws{C};
  std::vector<uint16_t> x16, w16, b16, g16;
  auto x = roundToBf16(randomVector(R * C, 71), x16), w = roundToBf16(randomVector(C, 72), w16),
       b = roundToBf16(randomVector(C, 73), b16), g = roundToBf16(randomVector(R * C, 74), g16);
  // Within one bf16 step (2^-7 relative) of the f32 result, or 1e-3 near zero.
  auto expectClose = [](const std::vector<uint16_t> &got, const std::vector<float> &want,
                        const char *what) {
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(bf16ToF32(got[i]), want[i], std::fabs(want[i]) / 128.0f + 1e-3f)
          << what << " at " << i;
  };
  std::vector<uint16_t> y16(R * C), dx16(R * C), dw16(C), db16(C);
  std::vector<float> y(R * C), dx(R * C), dw(C), db(C);
  ASSERT_TRUE(runKernel(OpKind::LayerNorm, {bf(x16, xs), bf(w16, ws), bf(b16, ws)},
                        {bf(y16, xs)}, {}, {1e-5})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::LayerNorm, {view(x, xs), view(w, ws), view(b, ws)}, {view(y, xs)},
                        {}, {1e-5})
                  .isOk());
  expectClose(y16, y, "layer norm");
  ASSERT_TRUE(runKernel(OpKind::LayerNormGrad, {bf(x16, xs), bf(w16, ws), bf(g16, xs)},
                        {bf(dx16, xs), bf(dw16, ws), bf(db16, ws)}, {}, {1e-5})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::LayerNormGrad, {view(x, xs), view(w, ws), view(g, xs)},
                        {view(dx, xs), view(dw, ws), view(db, ws)}, {}, {1e-5})
                  .isOk());
  expectClose(dx16, dx, "layer norm input gradient");
  expectClose(dw16, dw, "layer norm weight gradient");
  expectClose(db16, db, "layer norm bias gradient");
  ASSERT_TRUE(
      runKernel(OpKind::RmsNorm, {bf(x16, xs), bf(w16, ws)}, {bf(y16, xs)}, {}, {1e-5}).isOk());
  ASSERT_TRUE(
      runKernel(OpKind::RmsNorm, {view(x, xs), view(w, ws)}, {view(y, xs)}, {}, {1e-5}).isOk());
  expectClose(y16, y, "RMS norm");
  ASSERT_TRUE(runKernel(OpKind::RmsNormGrad, {bf(x16, xs), bf(w16, ws), bf(g16, xs)},
                        {bf(dx16, xs), bf(dw16, ws)}, {}, {1e-5})
                  .isOk());
  ASSERT_TRUE(runKernel(OpKind::RmsNormGrad, {view(x, xs), view(w, ws), view(g, xs)},
                        {view(dx, xs), view(dw, ws)}, {}, {1e-5})
                  .isOk());
  expectClose(dx16, dx, "RMS norm input gradient");
  expectClose(dw16, dw, "RMS norm weight gradient");
}
