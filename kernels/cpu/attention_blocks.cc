// CPU kernels: ring attention's blocks (context parallelism). One block of
// queries against one block of keys and values, accumulated by the online-
// softmax rule (forward), and its gradient from the global row statistics;
// the executor's ring composer (runtime/exec) passes the blocks around.
#include "kernels/cpu/attention_tiles.h"

#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;
using namespace attention_tiles;

/// Ring attention's blocks (context parallelism): queries [batch, heads, sq, d]
/// against one block of keys / values [batch, kvHeads, sk, d], accumulated by
/// the online-softmax rule into acc [batch, heads, sq, d] and the rows'
/// running maximum and sum [batch, heads, sq]. `causal`: the blocks hold the
/// same positions (key j visible to query i when j <= i). The scores and the
/// weighted values are register-blocked products, as in causalAttention.
void attentionBlock(const float *q, const float *k, const float *v, const Shape &qShape,
                    int64_t kvHeads, int64_t keys, double scaleArg, bool causal, float *acc,
                    float *rowMax, float *rowSum, const int32_t *firstKey) {
  const int64_t batch = qShape[0], heads = qShape[1], sq = qShape[2], d = qShape[3];
  const int64_t group = heads / kvHeads;
  const float scale = static_cast<float>(scaleArg);
#pragma omp parallel
  {
    std::vector<float> kT(static_cast<size_t>(d * keys)), sc(static_cast<size_t>(sq * keys));
#pragma omp for collapse(2)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        const float *kh = k + (b * kvHeads + h / group) * keys * d;
        const float *vh = v + (b * kvHeads + h / group) * keys * d;
        const int64_t first = (b * heads + h) * sq;
        transposeInto(kh, keys, d, kT.data());
        productNN(q + first * d, d, kT.data(), keys, sc.data(), keys, sq, keys, d, false);
        for (int64_t i = 0; i < sq; ++i) {
          float *si = sc.data() + i * keys, *ai = acc + (first + i) * d;
          const int64_t n = causal ? std::min(keys, i + 1) : keys;
          // Packed documents: the row sees the block's keys from firstKey on
          // (none when its document starts after the block).
          const int64_t lo = firstKey ? std::clamp<int64_t>(firstKey[b * sq + i], 0, n) : 0;
          if (lo >= n) {
            std::fill(si, si + keys, 0.0f);
            continue;
          }
          float mx = rowMax[first + i];
          for (int64_t j = lo; j < n; ++j)
            mx = std::max(mx, si[j] * scale);
          const float correction = expNonPositive(rowMax[first + i] - mx);
          float sum = 0.0f;
          std::fill(si, si + lo, 0.0f);
#pragma omp simd reduction(+ : sum)
          for (int64_t j = lo; j < n; ++j) {
            si[j] = expNonPositive(si[j] * scale - mx);
            sum += si[j];
          }
          for (int64_t j = n; j < keys; ++j)
            si[j] = 0.0f;
          rowSum[first + i] = rowSum[first + i] * correction + sum;
          rowMax[first + i] = mx;
#pragma omp simd
          for (int64_t c = 0; c < d; ++c)
            ai[c] *= correction;
        }
        productNN(sc.data(), keys, vh, d, acc + first * d, d, sq, d, keys, true);
      }
  }
}

/// The gradient of one block: with the rows' log-sum-exp `lse` and the
/// attention output `o` (both of all blocks), adds the block's share to dq
/// and to the block's dk, dv (products as in causalAttentionGrad).
void attentionBlockGrad(const float *q, const float *k, const float *v, const float *o,
                        const float *g, const float *lse, const Shape &qShape, int64_t kvHeads,
                        int64_t keys, double scaleArg, bool causal, float *dq, float *dk,
                        float *dv, const int32_t *firstKey) {
  const int64_t batch = qShape[0], heads = qShape[1], sq = qShape[2], d = qShape[3];
  const int64_t group = heads / kvHeads;
  const float scale = static_cast<float>(scaleArg);
  // One kv head (and its query heads) per task: dk, dv are its own.
#pragma omp parallel
  {
    std::vector<float> kT(static_cast<size_t>(d * keys)), vT(static_cast<size_t>(d * keys)),
        p(static_cast<size_t>(sq * keys)), dp(static_cast<size_t>(sq * keys));
#pragma omp for collapse(2)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t kvh = 0; kvh < kvHeads; ++kvh) {
        const float *kh = k + (b * kvHeads + kvh) * keys * d, *vh = v + (b * kvHeads + kvh) * keys * d;
        float *dkh = dk + (b * kvHeads + kvh) * keys * d, *dvh = dv + (b * kvHeads + kvh) * keys * d;
        transposeInto(kh, keys, d, kT.data());
        transposeInto(vh, keys, d, vT.data());
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          const int64_t first = (b * heads + h) * sq;
          const float *qh = q + first * d, *gh = g + first * d, *oh = o + first * d;
          productNN(qh, d, kT.data(), keys, p.data(), keys, sq, keys, d, false);
          productNN(gh, d, vT.data(), keys, dp.data(), keys, sq, keys, d, false);
          for (int64_t i = 0; i < sq; ++i) {
            float *pi = p.data() + i * keys, *dpi = dp.data() + i * keys;
            float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
            for (int64_t c = 0; c < d; ++c)
              delta += gh[i * d + c] * oh[i * d + c];
            const int64_t n = causal ? std::min(keys, i + 1) : keys;
            const int64_t lo = firstKey ? std::clamp<int64_t>(firstKey[b * sq + i], 0, n) : 0;
            const float l = lse[first + i];
            for (int64_t j = 0; j < lo; ++j)
              pi[j] = dpi[j] = 0.0f;
#pragma omp simd
            for (int64_t j = lo; j < n; ++j) {
              pi[j] = expNonPositive(std::min(pi[j] * scale - l, 0.0f));
              dpi[j] = pi[j] * (dpi[j] - delta) * scale;
            }
            for (int64_t j = n; j < keys; ++j)
              pi[j] = dpi[j] = 0.0f;
          }
          // dq += dS K, dk += dS^T Q, dv += P^T G.
          productNN(dp.data(), keys, kh, d, dq + first * d, d, sq, d, keys, true);
          productTNAccumulate(dp.data(), keys, qh, d, dkh, d, keys, d, sq);
          productTNAccumulate(p.data(), keys, gh, d, dvh, d, keys, d, sq);
        }
      }
  }
}

void addAttentionBlockKernels(KernelTable &t) {
  // Ring attention's blocks (kernel_call.h): the optional last input is the
  // rows' first keys.
  t.add(OpKind::AttentionBlock, [](const KernelCall &c) {
    const TensorView &q = c.input(0), &k = c.input(1);
    attentionBlock(q.f32(), k.f32(), c.input(2).f32(), *q.shape, k.dim(1), k.dim(2), c.attr(attr::AttentionBlock::scale),
                   c.attr(attr::AttentionBlock::causal) != 0, c.output(0).f32(), c.output(1).f32(), c.output(2).f32(),
                   c.numInputs > 3 ? c.input(3).i32() : nullptr);
    return KernelResult::ok();
  });
  t.add(OpKind::AttentionBlockGrad, [](const KernelCall &c) {
    const TensorView &q = c.input(0), &k = c.input(1);
    attentionBlockGrad(q.f32(), k.f32(), c.input(2).f32(), c.input(3).f32(), c.input(4).f32(),
                       c.input(5).f32(), *q.shape, k.dim(1), k.dim(2), c.attr(attr::AttentionBlock::scale),
                       c.attr(attr::AttentionBlock::causal) != 0, c.output(0).f32(), c.output(1).f32(),
                       c.output(2).f32(), c.numInputs > 6 ? c.input(6).i32() : nullptr);
    return KernelResult::ok();
  });
}

} // namespace ptc::kernels::cpu
