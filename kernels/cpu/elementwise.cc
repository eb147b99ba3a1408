// CPU activations (kernels/common/elementwise.h lists them): one forward and
// one gradient loop per function, written to vectorize; `unary` /
// `unaryGrad` dispatch on the function the plan names.
#include "kernels/cpu/kernels.h"

#include <cmath>

namespace ptc::kernels::cpu {

namespace {
/// Phi(x) = 0.5 * (1 + erf(x / sqrt(2))) with erf from Abramowitz & Stegun
/// 7.1.26 (absolute error below 1.5e-7); `gauss` receives exp(-x^2 / 2).
/// Branch-free, so the loops that call it vectorize (libmvec expf).
inline float normalCdf(float x, float &gauss) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  gauss = std::exp(-0.5f * x * x);
  const float erfAbs = 1.0f - poly * gauss;
  return 0.5f + 0.5f * std::copysign(erfAbs, x);
}
} // namespace

void gelu(const float *in, float *out, int64_t n) {
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float gauss;
    out[i] = in[i] * normalCdf(in[i], gauss);
  }
}

void geluGrad(const float *x, const float *g, float *out, int64_t n) {
  const float invSqrt2Pi = 0.39894228040143268f;
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float gauss;
    float cdf = normalCdf(x[i], gauss);
    out[i] = g[i] * (cdf + x[i] * invSqrt2Pi * gauss);
  }
}

void relu(const float *in, float *out, int64_t n) {
#pragma omp parallel for simd if (n > 32768)
  for (int64_t i = 0; i < n; ++i)
    out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void reluGrad(const float *x, const float *g, float *out, int64_t n) {
#pragma omp parallel for simd if (n > 32768)
  for (int64_t i = 0; i < n; ++i)
    out[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

void silu(const float *in, float *out, int64_t n) {
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i)
    out[i] = in[i] / (1.0f + std::exp(-in[i]));
}

void siluGrad(const float *x, const float *g, float *out, int64_t n) {
  // d/dx x * sigmoid(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-x[i]));
    out[i] = g[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

namespace {
/// out[i] = f(in[i]) and out[i] = g[i] * df(x[i]): the loops of the
/// functions without a public entry point (the lambdas inline, the loops vectorize).
template <typename F> void mapForward(const float *in, float *out, int64_t n, F f) {
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i)
    out[i] = f(in[i]);
}
template <typename F>
void mapBackward(const float *x, const float *g, float *out, int64_t n, F df) {
#pragma omp parallel for simd if (n > 16384)
  for (int64_t i = 0; i < n; ++i)
    out[i] = g[i] * df(x[i]);
}
float rsqrtOf(float v) { return 1.0f / std::sqrt(v); }
// d/dx x^(-1/2) = -x^(-3/2) / 2.
float rsqrtSlope(float v) {
  float r = 1.0f / std::sqrt(v);
  return -0.5f * r * r * r;
}
float expOf(float v) { return std::exp(v); }
float logOf(float v) { return std::log(v); }
float logSlope(float v) { return 1.0f / v; }
float signOf(float v) { return std::isnan(v) ? v : static_cast<float>((v > 0.0f) - (v < 0.0f)); }
float zeroSlope(float) { return 0.0f; }
} // namespace

void unary(UnaryFunction fn, const float *in, float *out, int64_t n) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return gelu(in, out, n);
  case UnaryFunction::Relu:
    return relu(in, out, n);
  case UnaryFunction::Silu:
    return silu(in, out, n);
  case UnaryFunction::Rsqrt:
    return mapForward(in, out, n, rsqrtOf);
  case UnaryFunction::Exp:
    return mapForward(in, out, n, expOf);
  case UnaryFunction::Log:
    return mapForward(in, out, n, logOf);
  case UnaryFunction::Sign:
    return mapForward(in, out, n, signOf);
  }
}

void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return geluGrad(x, g, out, n);
  case UnaryFunction::Relu:
    return reluGrad(x, g, out, n);
  case UnaryFunction::Silu:
    return siluGrad(x, g, out, n);
  case UnaryFunction::Rsqrt:
    return mapBackward(x, g, out, n, rsqrtSlope);
  case UnaryFunction::Exp:
    return mapBackward(x, g, out, n, expOf);
  case UnaryFunction::Log:
    return mapBackward(x, g, out, n, logSlope);
  case UnaryFunction::Sign:
    return mapBackward(x, g, out, n, zeroSlope);
  }
}

void addElementwiseKernels(KernelTable &t) {
  t.add(OpKind::Unary, [](const KernelCall &c) {
    unary(c.function, c.input(0).f32(), c.output(0).f32(), c.input(0).elements);
    return KernelResult::ok();
  });
  t.add(OpKind::UnaryGrad, [](const KernelCall &c) {
    unaryGrad(c.function, c.input(0).f32(), c.input(1).f32(), c.output(0).f32(),
              c.input(0).elements);
    return KernelResult::ok();
  });
}

} // namespace ptc::kernels::cpu
