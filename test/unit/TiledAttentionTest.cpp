// The CUDA backend's tiled attention (kernels/cuda/tiled_attention.h), its
// kernel bodies run on the host by the SIMT emulator, against the CPU
// backend's attention: forward, log-sum-exp, the backward recomputing the
// forward or given its saved statistics, per-head, seq-major and fused
// projection layouts, grouped-query heads, head dims up to 256, sequences
// that are not a multiple of the 32-row tiles, packed documents, bf16
// storage, and a grid smaller than the work (the grid-stride loops); and ring
// attention's blocks (causal or whole, keys fewer or more than the queries,
// first keys per row) against the CPU's block kernels.

#include "kernels/common/types.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/tiled_attention.h"

#include "test/unit/SimtEmulator.h"
#include "test/unit/TestUtil.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace {
namespace tiled = ptc::kernels::cuda::tiled;
using ptc::test::randomVector;
using ptc::test::SimtThread;

struct F32Io {
  using Elem = float;
  static float load(const float *p) { return *p; }
  static void store(float *p, float x) { *p = x; }
};
struct Bf16Io {
  using Elem = uint16_t;
  static float load(const uint16_t *p) { return ptc::kernels::bf16ToF32(*p); }
  static void store(uint16_t *p, float x) { *p = ptc::kernels::f32ToBf16(x); }
};

/// The three passes, each as a grid of `grid` emulated blocks.
template <class Io>
void forward(const tiled::Problem<typename Io::Elem> &a, int64_t grid) {
  tiled::withSlots(a.dim, [&](auto slots) {
    ptc::test::emulateGrid(grid, tiled::kThreads, tiled::forwardSharedBytes(a.dim),
                           [&](const SimtThread &t, float *shared) {
                             tiled::forward<decltype(slots)::value, Io>(t, a, shared);
                           });
  });
}
template <class Io>
void backward(const tiled::Problem<typename Io::Elem> &a, int64_t grid) {
  tiled::withSlots(a.dim, [&](auto slots) {
    constexpr int kSlots = decltype(slots)::value;
    const int64_t bytes = tiled::backwardSharedBytes(a.dim);
    ptc::test::emulateGrid(grid, tiled::kThreads, bytes, [&](const SimtThread &t, float *shared) {
      tiled::backwardQuery<kSlots, Io>(t, a, shared);
    });
    ptc::test::emulateGrid(grid, tiled::kThreads, bytes, [&](const SimtThread &t, float *shared) {
      tiled::backwardKeys<kSlots, Io>(t, a, shared);
    });
  });
}

/// The largest difference relative to the reference's largest magnitude.
double relativeError(const std::vector<float> &got, const std::vector<float> &want) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    largest = std::max(largest, std::fabs(double(want[i])));
  }
  return worst / largest;
}

enum class Layout { PerHead, SeqMajor, FusedProjection };

struct Case {
  int64_t B, H, KV, S, D;
  Layout layout;
  bool documents;
  int64_t grid; // emulated blocks (fewer than the work: grid-stride loops)
};

std::string describe(const Case &c) {
  const char *layouts[] = {"per-head", "seq-major", "fused projection"};
  return "B " + std::to_string(c.B) + " H " + std::to_string(c.H) + "/" + std::to_string(c.KV) +
         " S " + std::to_string(c.S) + " D " + std::to_string(c.D) + " " +
         layouts[static_cast<int>(c.layout)] + (c.documents ? " documents" : "");
}

/// Packed documents: lengths 1, 2, 3, ... (a short first document, documents
/// across the 32-row tiles), restarted per batch entry at a different length.
std::vector<int32_t> documentPositions(int64_t B, int64_t S) {
  std::vector<int32_t> positions(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b) {
    int64_t length = 1 + 7 * b, at = 0;
    for (int64_t i = 0; i < S; ++i) {
      if (at == length) {
        at = 0;
        length += 9;
      }
      positions[static_cast<size_t>(b * S + i)] = static_cast<int32_t>(at++);
    }
  }
  return positions;
}

/// One case: the tiled kernels' forward (result and log-sum-exp) and both
/// backward forms against the CPU backend's f32 kernels on the same layout.
/// `Io` is the stored type: bf16 inputs are the f32 ones rounded, and the
/// results are compared with a bound for one rounding of each.
template <class Io> void checkCase(const Case &c) {
  using E = typename Io::Elem;
  SCOPED_TRACE(describe(c));
  const int64_t B = c.B, H = c.H, KV = c.KV, S = c.S, D = c.D;
  const bool fused = c.layout == Layout::FusedProjection,
             seqMajor = c.layout != Layout::PerHead;
  // Fused: one [B, S, width] tensor, q then k then v columns.
  const int64_t width = (H + 2 * KV) * D, kOffset = H * D, vOffset = (H + KV) * D;
  const size_t nq = B * H * S * D, nkv = B * KV * S * D, nqkv = B * S * width;
  auto qkv = randomVector(nqkv, 51), q = randomVector(nq, 52), k = randomVector(nkv, 53),
       v = randomVector(nkv, 54), g = randomVector(nq, 55);
  auto round = [](std::vector<float> &x) {
    if (sizeof(E) == 2)
      for (float &f : x)
        f = ptc::kernels::bf16ToF32(ptc::kernels::f32ToBf16(f));
  };
  for (auto *x : {&qkv, &q, &k, &v, &g})
    round(*x);
  const std::vector<int32_t> positions = c.documents ? documentPositions(B, S) : std::vector<int32_t>{};
  const int32_t *pos = c.documents ? positions.data() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // The CPU backend's numbers.
  const ptc::kernels::Shape shape{B, H, S, D};
  std::vector<float> out(nq), lse(B * H * S), dq(fused ? nqkv : nq), dk(nkv), dv(nkv);
  if (fused) {
    ptc::kernels::cpu::causalAttention(qkv.data(), qkv.data() + kOffset, qkv.data() + vOffset,
                                       out.data(), shape, KV, scale, true, width, pos, lse.data());
    ptc::kernels::cpu::causalAttentionGrad(qkv.data(), qkv.data() + kOffset,
                                           qkv.data() + vOffset, g.data(), dq.data(),
                                           dq.data() + kOffset, dq.data() + vOffset, shape, KV,
                                           scale, true, width, pos);
  } else {
    ptc::kernels::cpu::causalAttention(q.data(), k.data(), v.data(), out.data(), shape, KV, scale,
                                       seqMajor, 0, pos, lse.data());
    ptc::kernels::cpu::causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(),
                                           dk.data(), dv.data(), shape, KV, scale, seqMajor, 0,
                                           pos);
  }

  // The same inputs in the stored type.
  auto stored = [](const std::vector<float> &x) {
    std::vector<E> y(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      Io::store(&y[i], x[i]);
    return y;
  };
  auto widened = [](const std::vector<E> &x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      y[i] = Io::load(&x[i]);
    return y;
  };
  const std::vector<E> sqkv = stored(qkv), sq = stored(q), sk = stored(k), sv = stored(v),
                       sg = stored(g), sOut = stored(out);
  tiled::Problem<E> a;
  a.batch = B;
  a.heads = H;
  a.kvHeads = KV;
  a.seq = a.keys = S;
  a.dim = D;
  a.scale = scale;
  a.positions = pos;
  const tiled::HeadLayout perHead{H * S * D, S * D, D}, kvPerHead{KV * S * D, S * D, D},
      heads{S * H * D, D, H * D}, kvHeads{S * KV * D, D, KV * D}, columns{S * width, D, width};
  a.qLayout = fused ? columns : seqMajor ? heads : perHead;
  a.kvLayout = fused ? columns : seqMajor ? kvHeads : kvPerHead;
  a.oLayout = seqMajor ? heads : perHead;
  a.q = fused ? sqkv.data() : sq.data();
  a.k = fused ? sqkv.data() + kOffset : sk.data();
  a.v = fused ? sqkv.data() + vOffset : sv.data();
  a.g = sg.data();
  const double bound = sizeof(E) == 2 ? 1.2e-2 : 2e-5;

  std::vector<E> tOut(nq);
  std::vector<float> tLse(B * H * S, NAN);
  a.out = tOut.data();
  a.lse = tLse.data();
  forward<Io>(a, c.grid);
  EXPECT_LT(relativeError(widened(tOut), out), bound) << "forward";
  EXPECT_LT(relativeError(tLse, lse), 2e-5) << "log-sum-exp";

  // Backward, recomputing the forward, then given the CPU forward's result
  // and statistics (the same numbers but for rounding).
  for (bool saved : {false, true}) {
    SCOPED_TRACE(saved ? "saved statistics" : "recomputed statistics");
    std::vector<E> tdq(dq.size()), tdk(nkv), tdv(nkv);
    std::vector<float> stats(2 * B * H * S, NAN);
    a.dq = tdq.data();
    a.dk = fused ? tdq.data() + kOffset : tdk.data();
    a.dv = fused ? tdq.data() + vOffset : tdv.data();
    a.stats = stats.data();
    a.savedO = saved ? sOut.data() : nullptr;
    a.savedLse = saved ? lse.data() : nullptr;
    backward<Io>(a, c.grid);
    if (fused) {
      // Every column of the gradient is written: q's, k's and v's blocks.
      EXPECT_LT(relativeError(widened(tdq), dq), bound) << "dqkv";
    } else {
      EXPECT_LT(relativeError(widened(tdq), dq), bound) << "dq";
      EXPECT_LT(relativeError(widened(tdk), dk), bound) << "dk";
      EXPECT_LT(relativeError(widened(tdv), dv), bound) << "dv";
    }
  }
}

TEST(TiledAttention, MatchesTheCpuKernelsInF32) {
  const Case cases[] = {
      {1, 2, 1, 40, 24, Layout::PerHead, false, 3},   // 2 query tiles, one partial; GQA 2:1
      {2, 4, 2, 37, 48, Layout::SeqMajor, false, 5},  // seq-major, 2 slots a lane
      {1, 2, 2, 5, 3, Layout::PerHead, false, 1},     // fewer rows than a warp's lanes
      {1, 2, 1, 70, 80, Layout::FusedProjection, false, 4}, // in place in qkv, 3 tiles
      {1, 2, 1, 33, 256, Layout::SeqMajor, false, 2}, // the largest head dim: 8 slots
      {2, 4, 2, 75, 16, Layout::PerHead, true, 6},    // packed documents across tiles
      {1, 4, 1, 64, 32, Layout::FusedProjection, true, 3},
  };
  for (const Case &c : cases)
    checkCase<F32Io>(c);
}

TEST(TiledAttention, ReadsAndWritesBf16Storage) {
  const Case cases[] = {
      {1, 4, 2, 45, 64, Layout::FusedProjection, true, 3},
      {1, 2, 1, 40, 96, Layout::SeqMajor, false, 2},
  };
  for (const Case &c : cases)
    checkCase<Bf16Io>(c);
}

struct BlockCase {
  int64_t B, H, KV, rows, keys, D;
  bool causal, documents;
};

/// One ring block: the forward continuing a state that an earlier block left
/// (acc, row max, row sum), then the gradient adding to earlier gradients,
/// against the CPU's attentionBlock / attentionBlockGrad.
void checkBlock(const BlockCase &c) {
  SCOPED_TRACE("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + "/" +
               std::to_string(c.KV) + " rows " + std::to_string(c.rows) + " keys " +
               std::to_string(c.keys) + " D " + std::to_string(c.D) +
               (c.causal ? " causal" : " whole") + (c.documents ? " documents" : ""));
  const int64_t B = c.B, H = c.H, KV = c.KV, R = c.rows, K = c.keys, D = c.D;
  const size_t nq = B * H * R * D, nkv = B * KV * K * D, nrows = B * H * R;
  auto q = randomVector(nq, 61), k = randomVector(nkv, 62), v = randomVector(nkv, 63),
       k0 = randomVector(nkv, 64), v0 = randomVector(nkv, 65), g = randomVector(nq, 66),
       o = randomVector(nq, 67);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ptc::kernels::Shape qShape{B, H, R, D};
  // Each row's first key: before, inside and past the block (clamped by both).
  std::vector<int32_t> first(static_cast<size_t>(B * R));
  for (size_t i = 0; i < first.size(); ++i)
    first[i] = static_cast<int32_t>(static_cast<int64_t>(i * 7 % (K + 6)) - 3);
  const int32_t *firstKeys = c.documents ? first.data() : nullptr;

  // The state an earlier whole block of other keys left.
  std::vector<float> acc(nq, 0.0f), mx(nrows, -INFINITY), sum(nrows, 0.0f);
  ptc::kernels::cpu::attentionBlock(q.data(), k0.data(), v0.data(), qShape, KV, K, scale, false,
                                    acc.data(), mx.data(), sum.data());
  std::vector<float> tAcc = acc, tMx = mx, tSum = sum;
  ptc::kernels::cpu::attentionBlock(q.data(), k.data(), v.data(), qShape, KV, K, scale, c.causal,
                                    acc.data(), mx.data(), sum.data(), firstKeys);
  tiled::Problem<float> a;
  a.batch = B;
  a.heads = H;
  a.kvHeads = KV;
  a.seq = R;
  a.keys = K;
  a.dim = D;
  a.scale = scale;
  a.causal = c.causal;
  a.firstKeys = firstKeys;
  a.qLayout = a.oLayout = {H * R * D, R * D, D};
  a.kvLayout = {KV * K * D, K * D, D};
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = tAcc.data();
  a.rowMax = tMx.data();
  a.rowSum = tSum.data();
  forward<F32Io>(a, 3);
  EXPECT_LT(relativeError(tAcc, acc), 2e-5) << "acc";
  EXPECT_LT(relativeError(tMx, mx), 2e-6) << "row max";
  EXPECT_LT(relativeError(tSum, sum), 2e-5) << "row sum";

  // The gradient from the rows' (here: the state's) log-sum-exp, added to
  // earlier gradients.
  std::vector<float> lse(nrows);
  for (size_t i = 0; i < nrows; ++i)
    lse[i] = mx[i] + std::log(sum[i]);
  auto dq = randomVector(nq, 68), dk = randomVector(nkv, 69), dv = randomVector(nkv, 70);
  std::vector<float> tdq = dq, tdk = dk, tdv = dv, stats(2 * nrows, NAN);
  ptc::kernels::cpu::attentionBlockGrad(q.data(), k.data(), v.data(), o.data(), g.data(),
                                        lse.data(), qShape, KV, K, scale, c.causal, dq.data(),
                                        dk.data(), dv.data(), firstKeys);
  tiled::Problem<float> b = a;
  b.out = nullptr;
  b.rowMax = b.rowSum = nullptr;
  b.g = g.data();
  b.savedO = o.data();
  b.savedLse = lse.data();
  b.dq = tdq.data();
  b.dk = tdk.data();
  b.dv = tdv.data();
  b.stats = stats.data();
  b.accumulate = true;
  backward<F32Io>(b, 4);
  EXPECT_LT(relativeError(tdq, dq), 2e-5) << "dq";
  EXPECT_LT(relativeError(tdk, dk), 2e-5) << "dk";
  EXPECT_LT(relativeError(tdv, dv), 2e-5) << "dv";
}

TEST(TiledAttention, RingBlocksMatchTheCpuBlockKernels) {
  const BlockCase cases[] = {
      {1, 2, 1, 40, 40, 24, true, false},  // the diagonal pair
      {2, 4, 2, 37, 37, 48, false, false}, // an earlier pair: every key visible
      {1, 2, 2, 33, 70, 16, false, true},  // more keys than rows, first keys per row
      {1, 4, 2, 45, 45, 64, true, true},
      {1, 2, 1, 20, 9, 80, false, false},  // fewer keys than a tile
  };
  for (const BlockCase &c : cases)
    checkBlock(c);
}

} // namespace
