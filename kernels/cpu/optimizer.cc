// CPU kernels: AdamW and SGD updates, sums of squares and clipping.
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

void adamwUpdate(const float *param, const float *grad, const float *m, const float *v, float step,
                 const AdamW &hp, int64_t n, float *outParam, float *outM, float *outV) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  const float stepSize = static_cast<float>(hp.lr / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weightDecay;
  vectorLoop(n, 32768, [&](int64_t i) {
    float g = grad[i];
    float mi = m[i] + (g - m[i]) * (1.0f - hp.beta1); // lerp, as torch
    float vi = v[i] * hp.beta2 + (1.0f - hp.beta2) * g * g;
    float denom = std::sqrt(vi) / bc2Sqrt + hp.eps;
    float p = param[i] * decay;
    outParam[i] = p - stepSize * mi / denom;
    outM[i] = mi;
    outV[i] = vi;
  });
}

void sgdUpdate(const float *param, const float *grad, const float *buf, float lr, float momentum,
               float weightDecay, int64_t n, float *outParam, float *outBuf) {
  vectorLoop(n, 32768, [&](int64_t i) {
    float g = grad[i] + weightDecay * param[i];
    float b = momentum * buf[i] + g;
    outBuf[i] = b;
    outParam[i] = param[i] - lr * b;
  });
}

double sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes) {
  double total = 0.0;
  for (size_t t = 0; t < grads.size(); ++t) {
    const float *g = grads[t];
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) if (sizes[t] > 32768)
    for (int64_t i = 0; i < sizes[t]; ++i)
      s += static_cast<double>(g[i]) * g[i];
    total += s;
  }
  return total;
}

namespace {
template <typename Bits>
bool anyWithExponentAllOnes(const void *data, int64_t count, Bits mask) {
  const Bits *x = static_cast<const Bits *>(data);
  int bad = 0;
#pragma omp parallel for reduction(| : bad) if (count > 32768)
  for (int64_t i = 0; i < count; ++i)
    bad |= (x[i] & mask) == mask;
  return bad != 0;
}
} // namespace

bool anyNonfinite(const std::vector<const void *> &tensors, const std::vector<int64_t> &sizes,
                  const std::vector<FloatType> &types) {
  for (size_t t = 0; t < tensors.size(); ++t) {
    bool bad = types[t] == FloatType::F32
                   ? anyWithExponentAllOnes<uint32_t>(tensors[t], sizes[t], 0x7f800000u)
                   : anyWithExponentAllOnes<uint16_t>(
                         tensors[t], sizes[t],
                         static_cast<uint16_t>(types[t] == FloatType::BF16 ? 0x7f80u : 0x7c00u));
    if (bad)
      return true;
  }
  return false;
}

float clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                 const std::vector<float *> &outs, float maxNorm, double sumSquares) {
  float norm = static_cast<float>(std::sqrt(sumSquares));
  float coef = std::min(1.0f, maxNorm / (norm + 1e-6f));
  for (size_t t = 0; t < grads.size(); ++t)
    scale(grads[t], outs[t], sizes[t], coef);
  return norm;
}

} // namespace ptc::kernels::cpu
