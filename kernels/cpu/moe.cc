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

/// Slot of every assignment (t, j) in its expert's buffer, or -1 when dropped.
KernelResult assignSlots(const int32_t *indices, int64_t tokens, int64_t k, int64_t experts,
                         int64_t capacity, std::vector<int64_t> &slot) {
  slot.assign(static_cast<size_t>(tokens * k), 0);
  std::vector<int64_t> used(experts, 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = indices[i];
    if (e < 0 || e >= experts)
      return KernelResult::error("expert index ", e, " of token ", i / k, " is outside [0, ",
                             experts, ")");
    slot[i] = used[e] < capacity ? used[e]++ : -1;
  }
  return KernelResult::ok();
}
} // namespace

void topKGate(const float *logits, int64_t tokens, int64_t experts, int64_t k, bool normalize,
              float *weights, int32_t *indices) {
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
        for (int64_t e = 0; e < experts; ++e)
          if (!taken[e] && (best < 0 || p[e] > p[best]))
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

KernelResult topKGateGrad(const float *logits, const int32_t *indices, const float *gw,
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

KernelResult moeDispatch(const float *x, const int32_t *indices, int64_t tokens, int64_t k,
                   int64_t dim, int64_t experts, int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + experts * capacity * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0)
      std::memcpy(out + (indices[i] * capacity + slots[i]) * dim, x + (i / k) * dim,
                  sizeof(float) * static_cast<size_t>(dim));
  return KernelResult::ok();
}

KernelResult moeDispatchGrad(const float *g, const int32_t *indices, int64_t tokens, int64_t k,
                       int64_t dim, int64_t experts, int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + tokens * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = g + (indices[i] * capacity + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += src[c];
    }
  return KernelResult::ok();
}

KernelResult moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                  int64_t tokens, int64_t k, int64_t dim, int64_t experts, int64_t capacity,
                  float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + tokens * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = expertOut + (indices[i] * capacity + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      float w = weights[i];
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += w * src[c];
    }
  return KernelResult::ok();
}

KernelResult moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                      const float *g, int64_t tokens, int64_t k, int64_t dim, int64_t experts,
                      int64_t capacity, float *dExpertOut, float *dWeights) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(dExpertOut, dExpertOut + experts * capacity * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i) {
    dWeights[i] = 0.0f;
    if (slots[i] < 0)
      continue;
    int64_t off = (indices[i] * capacity + slots[i]) * dim;
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

} // namespace ptc::kernels::cpu
