// CPU kernels: causal attention, forward and backward.
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
/// Normalized causal attention probabilities of query row `i` into `p[0..i]`.
inline void attentionRow(const float *q, const float *k, int64_t i, int64_t d, float scale,
                         float *p) {
  const float *qi = q + i * d;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= i; ++j) {
    const float *kj = k + j * d;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < d; ++c)
      s += qi[c] * kj[c];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  float inv = 1.0f / sum;
  for (int64_t j = 0; j <= i; ++j)
    p[j] *= inv;
}
} // namespace

void causalAttention(const float *q, const float *k, const float *v, float *out,
                     const Shape &shape, int64_t kvHeads, float scale) {
  int64_t heads = shape[1], bh = shape[0] * heads, s = shape[2], d = shape[3];
  int64_t group = heads / kvHeads;
#pragma omp parallel
  {
    std::vector<float> p(s);
#pragma omp for collapse(2)
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t i = 0; i < s; ++i) {
        // Query head h of batch entry h / heads reads kv head (h % heads) / group.
        int64_t kvh = (h / heads) * kvHeads + (h % heads) / group;
        const float *qh = q + h * s * d, *kh = k + kvh * s * d, *vh = v + kvh * s * d;
        attentionRow(qh, kh, i, d, scale, p.data());
        float *o = out + h * s * d + i * d;
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float *vj = vh + j * d;
          float pj = p[j];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c)
            o[c] += pj * vj[c];
        }
      }
  }
}

void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, const Shape &shape, int64_t kvHeads,
                         float scale) {
  int64_t heads = shape[1], s = shape[2], d = shape[3];
  int64_t group = heads / kvHeads, bkv = shape[0] * kvHeads;
#pragma omp parallel
  {
    std::vector<float> p(s), dp(s);
    // One kv head per iteration: the query heads it serves accumulate into
    // its dk and dv in a fixed order (deterministic, no atomics).
#pragma omp for
    for (int64_t kvh = 0; kvh < bkv; ++kvh) {
      const float *kh = k + kvh * s * d, *vh = v + kvh * s * d;
      float *dkh = dk + kvh * s * d, *dvh = dv + kvh * s * d;
      std::fill(dkh, dkh + s * d, 0.0f);
      std::fill(dvh, dvh + s * d, 0.0f);
      for (int64_t m = 0; m < group; ++m) {
        int64_t h = (kvh / kvHeads) * heads + (kvh % kvHeads) * group + m;
        const float *qh = q + h * s * d, *gh = g + h * s * d;
        float *dqh = dq + h * s * d;
        for (int64_t i = 0; i < s; ++i) {
          attentionRow(qh, kh, i, d, scale, p.data());
          const float *gi = gh + i * d;
          float t = 0.0f;
          for (int64_t j = 0; j <= i; ++j) {
            const float *vj = vh + j * d;
            float *dvj = dvh + j * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < d; ++c) {
              dot += gi[c] * vj[c];
              dvj[c] += p[j] * gi[c];
            }
            dp[j] = dot;
            t += p[j] * dot;
          }
          float *dqi = dqh + i * d;
          std::fill(dqi, dqi + d, 0.0f);
          const float *qi = qh + i * d;
          for (int64_t j = 0; j <= i; ++j) {
            float ds = p[j] * (dp[j] - t) * scale;
            const float *kj = kh + j * d;
            float *dkj = dkh + j * d;
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) {
              dqi[c] += ds * kj[c];
              dkj[c] += ds * qi[c];
            }
          }
        }
      }
    }
  }
}

} // namespace ptc::kernels::cpu
