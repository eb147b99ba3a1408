// The CUDA backend's tiled attention (kernels/cuda/tiled_attention.h), its
// kernel bodies run on the host by the SIMT emulator, against the CPU
// backend's attention: forward, log-sum-exp, the backward recomputing the
// forward or given its saved statistics, per-head, seq-major and fused
// projection layouts, grouped-query heads, head dims up to 256, sequences
// that are not a multiple of the 32-row tiles, packed documents, bf16
// storage, and a grid smaller than the work (the grid-stride loops).

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
  a.seq = S;
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

} // namespace
