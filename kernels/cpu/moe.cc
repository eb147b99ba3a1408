// CPU kernels: top-k routing, slot assignment, dispatch and combine (+ gradients).
#include "kernels/cpu/internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;

namespace {
void softmaxRow(const float *x, int64_t n, float *p) {
  float mx = *std::max_element(x, x + n), sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    p[e] = std::exp(x[e] - mx);
    sum += p[e];
  }
  for (int64_t e = 0; e < n; ++e)
    p[e] /= sum;
}

/// Where every assignment a = (g, t, j) goes in the [experts, groups,
/// capacity] buffers: slot[a] = g * capacity + s (-1 when dropped), so that
/// the buffer row is indices[a] * groups * capacity + slot[a]. Within a group
/// the assignments are visited choice-major (every token's first choice,
/// then every second choice), as GShard and Switch fill capacity.
KernelResult assignSlots(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                         int64_t experts, int64_t capacity, std::vector<int64_t> &slot) {
  slot.assign(static_cast<size_t>(groups * tokens * k), -1);
  std::vector<int64_t> used(static_cast<size_t>(experts));
  for (int64_t g = 0; g < groups; ++g) {
    std::fill(used.begin(), used.end(), 0);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t i = (g * tokens + t) * k + j;
        int32_t e = indices[i];
        if (e < 0 || e >= experts)
          return KernelResult::error("expert index ", e, " of token ", i / k, " is outside [0, ",
                                     experts, ")");
        if (used[e] < capacity)
          slot[i] = g * capacity + used[e]++;
      }
  }
  return KernelResult::ok();
}
} // namespace

static void topKGate(const float *logits, const float *bias, int64_t tokens, int64_t experts, int64_t k,
              bool normalize, float *weights, int32_t *indices) {
#pragma omp parallel
  {
    std::vector<float> p(experts);
    std::vector<bool> taken(experts);
#pragma omp for
    for (int64_t t = 0; t < tokens; ++t) {
      softmaxRow(logits + t * experts, experts, p.data());
      std::fill(taken.begin(), taken.end(), false);
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        auto score = [&](int64_t e) { return bias ? p[e] + bias[e] : p[e]; };
        for (int64_t e = 0; e < experts; ++e)
          if (!taken[e] && (best < 0 || score(e) > score(best)))
            best = e;
        taken[best] = true;
        weights[t * k + j] = p[best];
        indices[t * k + j] = static_cast<int32_t>(best);
        sum += p[best];
      }
      if (normalize)
        for (int64_t j = 0; j < k; ++j)
          weights[t * k + j] /= sum;
    }
  }
}

static KernelResult topKGateGrad(const float *logits, const int32_t *indices, const float *gw,
                    int64_t tokens, int64_t experts, int64_t k, bool normalize, float *out) {
  for (int64_t i = 0; i < tokens * k; ++i)
    if (indices[i] < 0 || indices[i] >= experts)
      return badId("expert index", indices[i], i, experts);
  std::vector<float> p(experts), dp(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    softmaxRow(logits + t * experts, experts, p.data());
    std::fill(dp.begin(), dp.end(), 0.0f);
    const int32_t *idx = indices + t * k;
    const float *g = gw + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      sum += p[idx[j]];
    if (normalize) {
      float c = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        c += g[j] * p[idx[j]] / sum;
      for (int64_t j = 0; j < k; ++j)
        dp[idx[j]] += (g[j] - c) / sum;
    } else {
      for (int64_t j = 0; j < k; ++j)
        dp[idx[j]] += g[j];
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < experts; ++e)
      dot += p[e] * dp[e];
    for (int64_t e = 0; e < experts; ++e)
      out[t * experts + e] = p[e] * (dp[e] - dot);
  }
  return KernelResult::ok();
}

KernelResult expertLoad(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                        int64_t experts, float *out) {
  std::fill(out, out + groups * experts, 0.0f);
  const float share = 1.0f / static_cast<float>(tokens * k);
  for (int64_t i = 0; i < groups * tokens * k; ++i) {
    int32_t e = indices[i];
    if (e < 0 || e >= experts)
      return KernelResult::error("expert index ", e, " of token ", i / k, " is outside [0, ",
                                 experts, ")");
    out[(i / (tokens * k)) * experts + e] += share;
  }
  return KernelResult::ok();
}

KernelResult moeDispatch(const float *x, const int32_t *indices, int64_t groups, int64_t tokens,
                         int64_t k, int64_t dim, int64_t experts, int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, groups, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  const int64_t stride = groups * capacity; // rows per expert
  std::fill(out, out + experts * stride * dim, 0.0f);
  for (int64_t i = 0; i < groups * tokens * k; ++i)
    if (slots[i] >= 0)
      std::memcpy(out + (indices[i] * stride + slots[i]) * dim, x + (i / k) * dim,
                  sizeof(float) * static_cast<size_t>(dim));
  return KernelResult::ok();
}

static KernelResult moeDispatchGrad(const float *g, const int32_t *indices, int64_t groups,
                             int64_t tokens, int64_t k, int64_t dim, int64_t experts,
                             int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, groups, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  const int64_t stride = groups * capacity;
  std::fill(out, out + groups * tokens * dim, 0.0f);
  for (int64_t i = 0; i < groups * tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = g + (indices[i] * stride + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += src[c];
    }
  return KernelResult::ok();
}

KernelResult moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                        int64_t groups, int64_t tokens, int64_t k, int64_t dim, int64_t experts,
                        int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, groups, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  const int64_t stride = groups * capacity;
  std::fill(out, out + groups * tokens * dim, 0.0f);
  for (int64_t i = 0; i < groups * tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = expertOut + (indices[i] * stride + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      float w = weights[i];
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += w * src[c];
    }
  return KernelResult::ok();
}

static KernelResult moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                            const float *g, int64_t groups, int64_t tokens, int64_t k,
                            int64_t dim, int64_t experts, int64_t capacity, float *dExpertOut,
                            float *dWeights) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, groups, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  const int64_t stride = groups * capacity;
  std::fill(dExpertOut, dExpertOut + experts * stride * dim, 0.0f);
  for (int64_t i = 0; i < groups * tokens * k; ++i) {
    dWeights[i] = 0.0f;
    if (slots[i] < 0)
      continue;
    int64_t off = (indices[i] * stride + slots[i]) * dim;
    const float *gt = g + (i / k) * dim;
    float dot = 0.0f;
    for (int64_t c = 0; c < dim; ++c) {
      dExpertOut[off + c] = weights[i] * gt[c];
      dot += gt[c] * expertOut[off + c];
    }
    dWeights[i] = dot;
  }
  return KernelResult::ok();
}

void addMoeKernels(KernelTable &t) {
  t.add(OpKind::TopKGate, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    const float *bias = c.numInputs > 1 ? c.input(1).f32() : nullptr;
    topKGate(logits.f32(), bias, logits.rows(), logits.dim(-1), c.attr(attr::TopKGate::k),
             c.attr(attr::TopKGate::normalize) != 0,
             c.output(0).f32(), c.output(1).i32());
    return KernelResult::ok();
  });
  t.add(OpKind::TopKGateGrad, [](const KernelCall &c) {
    const TensorView &logits = c.input(0), &indices = c.input(1);
    return topKGateGrad(logits.f32(), indices.i32(), c.input(2).f32(), logits.rows(),
                        logits.dim(-1), indices.dim(-1), c.attr(attr::TopKGateGrad::normalize) != 0,
                        c.output(0).f32());
  });
  t.add(OpKind::ExpertLoad, [](const KernelCall &c) {
    // indices [groups, tokens, k] (or [tokens, k]) -> load [groups, experts].
    const TensorView &indices = c.input(0);
    return expertLoad(indices.i32(), indices.rank() == 3 ? indices.dim(0) : 1, indices.dim(-2),
                      indices.dim(-1), c.output(0).dim(-1), c.output(0).f32());
  });
  t.add(OpKind::MoeDispatch, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(1), c.output(0));
    return moeDispatch(c.input(0).f32(), c.input(1).i32(), m.groups, m.tokens, m.k, m.dim,
                       m.experts, m.capacity, c.output(0).f32());
  });
  t.add(OpKind::MoeDispatchGrad, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(1), c.input(0));
    return moeDispatchGrad(c.input(0).f32(), c.input(1).i32(), m.groups, m.tokens, m.k, m.dim,
                           m.experts, m.capacity, c.output(0).f32());
  });
  t.add(OpKind::MoeCombine, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(2), c.input(0));
    return moeCombine(c.input(0).f32(), c.input(1).f32(), c.input(2).i32(), m.groups, m.tokens,
                      m.k, m.dim, m.experts, m.capacity, c.output(0).f32());
  });
  t.add(OpKind::MoeCombineGrad, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(2), c.input(0));
    return moeCombineGrad(c.input(0).f32(), c.input(1).f32(), c.input(2).i32(), c.input(3).f32(),
                          m.groups, m.tokens, m.k, m.dim, m.experts, m.capacity,
                          c.output(0).f32(), c.output(1).f32());
  });
}

} // namespace ptc::kernels::cpu
