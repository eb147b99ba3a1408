// ptc-bench-kernels: the CPU kernels other than GEMMs on the bench
// configuration's shapes (the step-time benchmark's GPT: batch 8, seq 128,
// hidden 256, 8 heads, 4 x hidden MLP), one line per kernel: the best time of
// `repeats` runs and its rate (GFLOP/s for attention, GB/s moved for the
// memory-bound ones). What `ptc-run --profile` attributes to non-GEMM op kinds,
// kernel by kernel, without the executor.
//   ptc-bench-kernels [threads=0 (all cores)] [batch=8] [seq=128] [hidden=256]
//                     [heads=8] [repeats=20]

#include "bench/best_seconds.h"
#include "kernels/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {
using ptc::bench::bestSeconds;
using namespace ptc::kernels::cpu;


std::vector<float> randomValues(size_t n, unsigned seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(gen);
  return v;
}

void report(const char *what, double seconds, double amount, const char *unit) {
  std::printf("%-48s %9.1f us  %8.1f %s\n", what, seconds * 1e6, amount / seconds / 1e9, unit);
}
} // namespace

int main(int argc, char **argv) {
  auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const int threads = static_cast<int>(arg(1, 0));
  const int64_t B = arg(2, 8), S = arg(3, 128), H = arg(4, 256), A = arg(5, 8);
  const int repeats = static_cast<int>(arg(6, 20));
  if (threads < 0 || B < 1 || S < 1 || H < 1 || A < 1 || H % A != 0 || repeats < 1) {
    std::fprintf(stderr, "usage: ptc-bench-kernels [threads (0: all)] [batch] [seq] [hidden] "
                         "[heads (dividing hidden)] [repeats]\n");
    return 2;
  }
  if (threads > 0)
    omp_set_num_threads(threads);
  const int64_t D = H / A, tokens = B * S, mlp = 4 * H;
  std::printf("kernels on batch %lld, seq %lld, hidden %lld, %lld heads, %d threads (best of %d)\n",
              static_cast<long long>(B), static_cast<long long>(S), static_cast<long long>(H),
              static_cast<long long>(A), omp_get_max_threads(), repeats);

  // Causal attention, one layer: model FLOPs of the causal half (QK^T and PV
  // forward; five products backward, the scores recomputed).
  const size_t n = static_cast<size_t>(B * A * S * D);
  auto q = randomValues(n, 1), k = randomValues(n, 2), v = randomValues(n, 3), g = randomValues(n, 4);
  std::vector<float> o(n), dq(n), dk(n), dv(n);
  const Shape shape{B, A, S, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const double causal = 2.0 * B * A * D * (S * (S + 1) / 2.0);
  report("causal attention", bestSeconds(repeats, [&] {
           causalAttention(q.data(), k.data(), v.data(), o.data(), shape, A, scale);
         }), 2 * causal, "GFLOP/s");
  report("causal attention gradient", bestSeconds(repeats, [&] {
           causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(), dk.data(),
                               dv.data(), shape, A, scale);
         }), 5 * causal, "GFLOP/s");
  // Given the forward's result and row statistics (ptc-save-attention-stats,
  // what a compiled plan runs): no softmax reductions in the backward pass.
  std::vector<float> lse(static_cast<size_t>(B * A * S));
  causalAttention(q.data(), k.data(), v.data(), o.data(), shape, A, scale, false, 0, nullptr,
                  lse.data());
  report("causal attention gradient, saved statistics", bestSeconds(repeats, [&] {
           causalAttentionGrad(q.data(), k.data(), v.data(), g.data(), dq.data(), dk.data(),
                               dv.data(), shape, A, scale, false, 0, nullptr, o.data(),
                               lse.data());
         }), 5 * causal, "GFLOP/s");

  // The same in the layout a GPT step runs it in (ptc-fold-attention-layout):
  // q, k and v read in place from the fused QKV projection [batch, seq, 3 x
  // hidden], the output and its gradient [batch, seq, heads, dim].
  std::vector<float> qkv(3 * n), dqkv(3 * n);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < H; ++c) {
      const int64_t b = t / S, pos = t % S, head = c / D, col = c % D;
      const size_t from = static_cast<size_t>(((b * A + head) * S + pos) * D + col);
      qkv[static_cast<size_t>(t * 3 * H + c)] = q[from];
      qkv[static_cast<size_t>(t * 3 * H + H + c)] = k[from];
      qkv[static_cast<size_t>(t * 3 * H + 2 * H + c)] = v[from];
    }
  report("causal attention, fused QKV layout", bestSeconds(repeats, [&] {
           causalAttention(qkv.data(), qkv.data() + H, qkv.data() + 2 * H, o.data(), shape, A,
                           scale, /*seqMajor=*/true, 3 * H);
         }), 2 * causal, "GFLOP/s");
  report("causal attention gradient, fused QKV layout", bestSeconds(repeats, [&] {
           causalAttentionGrad(qkv.data(), qkv.data() + H, qkv.data() + 2 * H, g.data(),
                               dqkv.data(), dqkv.data() + H, dqkv.data() + 2 * H, shape, A,
                               scale, /*seqMajor=*/true, 3 * H);
         }), 5 * causal, "GFLOP/s");

  // The same on bf16 storage (bf16 dot products where the CPU has them).
  auto bits = [](const std::vector<float> &x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      b[i] = ptc::kernels::f32ToBf16(x[i]);
    return b;
  };
  auto q16 = bits(q), k16 = bits(k), v16 = bits(v), g16 = bits(g);
  std::vector<uint16_t> o16(n), dq16(n), dk16(n), dv16(n);
  const char *kind = nativeBf16() ? "bf16 dot products" : "widened to f32";
  std::string fwd = std::string("causal attention, bf16 (") + kind + ")";
  report(fwd.c_str(), bestSeconds(repeats, [&] {
           causalAttention(q16.data(), k16.data(), v16.data(), o16.data(), shape, A, scale);
         }), 2 * causal, "GFLOP/s");
  report("causal attention gradient, bf16", bestSeconds(repeats, [&] {
           causalAttentionGrad(q16.data(), k16.data(), v16.data(), g16.data(), dq16.data(),
                               dk16.data(), dv16.data(), shape, A, scale);
         }), 5 * causal, "GFLOP/s");

  // The MLP's activation and its gradient on [tokens, 4 hidden].
  const size_t m = static_cast<size_t>(tokens * mlp);
  auto x = randomValues(m, 5, 2.0f), gy = randomValues(m, 6);
  std::vector<float> y(m), dx(m);
  report("gelu", bestSeconds(repeats, [&] { unary(UnaryFunction::Gelu, x.data(), y.data(), m); }),
         8.0 * m, "GB/s");
  report("gelu gradient", bestSeconds(repeats, [&] {
           unaryGrad(UnaryFunction::Gelu, x.data(), gy.data(), dx.data(), m);
         }), 12.0 * m, "GB/s");

  // Bias add and bias gradient on [batch, seq, 4 hidden].
  const Shape act{B, S, mlp}, bias{mlp};
  report("bias add", bestSeconds(repeats, [&] {
           binary(BinaryOp::Add, x.data(), act, gy.data(), bias, y.data(), act);
         }), 8.0 * m, "GB/s");
  std::vector<float> db(static_cast<size_t>(mlp));
  report("bias gradient (sum over tokens)", bestSeconds(repeats, [&] {
           reduce(ReduceOp::Sum, x.data(), act, {0, 1}, db.data());
         }), 4.0 * m, "GB/s");

  // Splitting heads: [batch, seq, heads, dim] -> [batch, heads, seq, dim].
  report("head transpose", bestSeconds(repeats, [&] {
           transpose(q.data(), Shape{B, S, A, D}, o.data(), {0, 2, 1, 3}, sizeof(float));
         }), 8.0 * n, "GB/s");

  // The loss on [tokens, 256 classes].
  const int64_t classes = 256;
  auto logits = randomValues(static_cast<size_t>(tokens * classes), 7, 3.0f);
  std::vector<int32_t> targets(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i)
    targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % classes);
  float loss = 0;
  report("cross entropy", bestSeconds(repeats, [&] {
           (void)crossEntropy(logits.data(), targets.data(), tokens, classes, &loss);
         }), 4.0 * tokens * classes, "GB/s");

  // The loss and its gradient over a large vocabulary (8192 classes) as the
  // plan runs them: two calls (CrossEntropy, CrossEntropyGrad), or one
  // (CrossEntropyGrad with the loss as its second output:
  // ptc-fuse-cross-entropy-grad). GB/s of the logits read once and the
  // gradient written once.
  {
    using ptc::kernels::DType;
    using ptc::kernels::OpKind;
    const int64_t vocab = 8192;
    auto big = randomValues(static_cast<size_t>(tokens * vocab), 11, 3.0f);
    std::vector<float> grad(big.size()), seed{1.0f}, bigLoss(1);
    std::vector<int32_t> bigTargets(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i)
      bigTargets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % vocab);
    const Shape ls{tokens, vocab}, ts{tokens}, scalar{};
    const ptc::kernels::TensorView vl{big.data(), DType::F32, &ls, tokens * vocab},
        vt{bigTargets.data(), DType::I32, &ts, tokens}, vs{seed.data(), DType::F32, &scalar, 1},
        vg{grad.data(), DType::F32, &ls, tokens * vocab},
        vloss{bigLoss.data(), DType::F32, &scalar, 1};
    const std::vector<int64_t> noInts;
    const std::vector<double> noFloats;
    auto call = [&](OpKind op, std::vector<ptc::kernels::TensorView> in,
                    std::vector<ptc::kernels::TensorView> out) {
      const ptc::kernels::KernelCall c = ptc::kernels::makeKernelCall(op, in, out, noInts, noFloats);
      (void)kernelTable()[op].run(c);
    };
    const double bytes = 8.0 * static_cast<double>(tokens * vocab);
    report("cross entropy + gradient, 8192 classes (2 calls)", bestSeconds(repeats, [&] {
             call(OpKind::CrossEntropy, {vl, vt}, {vloss});
             call(OpKind::CrossEntropyGrad, {vl, vt, vs}, {vg});
           }), bytes, "GB/s");
    report("cross entropy with gradient, 8192 classes (1 call)", bestSeconds(repeats, [&] {
             call(OpKind::CrossEntropyGrad, {vl, vt, vs}, {vg, vloss});
           }), bytes, "GB/s");
  }

  // AdamW over one [4 hidden, hidden] weight: reads parameter, gradient and
  // both moments, writes parameter and moments.
  const size_t w = static_cast<size_t>(mlp * H);
  auto p = randomValues(w, 8), gr = randomValues(w, 9), m1 = randomValues(w, 10, 0.1f);
  std::vector<float> v1(w, 0.01f), po(w), mo(w), vo(w);
  const AdamW hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  report("adamw update", bestSeconds(repeats, [&] {
           adamwUpdate(p.data(), gr.data(), m1.data(), v1.data(), 10.0f, hp, static_cast<int64_t>(w),
                       po.data(), mo.data(), vo.data());
         }), 28.0 * w, "GB/s");
  return 0;
}
