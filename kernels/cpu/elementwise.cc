// CPU activations (kernels/common/elementwise.h lists them): one forward and
// one gradient per function, in loops written to vectorize; `unary` /
// `unaryGrad` and the gated activations (f(gate) * up) dispatch on the
// function the plan names.
#include "kernels/cpu/internal.h"

#include <cmath>

namespace ptc::kernels::cpu {

namespace {
/// Phi(x) = 0.5 * (1 + erf(x / sqrt(2))) with erf from Abramowitz & Stegun
/// 7.1.26 (absolute error below 1.5e-7); `gauss` receives exp(-x^2 / 2).
/// Branch-free and inline (exp of a non-positive argument), so the loops
/// that call it vectorize whole.
inline float normalCdf(float x, float &gauss) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  gauss = internal::expNonPositive(-0.5f * x * x);
  const float erfAbs = 1.0f - poly * gauss;
  return 0.5f + 0.5f * std::copysign(erfAbs, x);
}

/// 1 / (1 + exp(-x)) from e = exp(-|x|) <= 1 (1 / (1 + e), or e / (1 + e)
/// for x < 0): the inline exp of a non-positive argument, so that the loops
/// calling it vectorize whole (libm's expf left the bf16 loops' calls
/// scalar: SiLU on 1024 x 688 bf16 took 336 us on one core, f32 232 us), and
/// no overflow for large |x|.
inline float sigmoid(float x) {
  const float e = internal::expNonPositive(-std::fabs(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}
} // namespace

namespace {
/// out[i] = f(in[i]) and out[i] = df(x[i], g[i]) (the gradient g * f'(x)) on
/// f32 or bf16 storage (T), in f32 registers: one rounding per bf16 result,
/// as widening the tensors would give, without the copies.
template <typename T, typename F> void mapForward(const T *in, T *out, int64_t n, F f) {
  internal::vectorLoop(n, 16384,
                       [&](int64_t i) { internal::storeAs(out, i, f(internal::loadAs(in, i))); });
}
template <typename T, typename F>
void mapBackward(const T *x, const T *g, T *out, int64_t n, F df) {
  internal::vectorLoop(n, 16384, [&](int64_t i) {
    internal::storeAs(out, i, df(internal::loadAs(x, i), internal::loadAs(g, i)));
  });
}

/// Calls body(f, df) with the activation's forward f(x) and gradient
/// df(x, g) = g * f'(x), each once for every kernel that uses them (the
/// activations, and gated activations f(gate) * up).
template <typename Body> void withFunction(UnaryFunction fn, Body body) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return body(
        [](float x) {
          float gauss;
          return x * normalCdf(x, gauss);
        },
        [](float v, float gv) {
          float gauss;
          float cdf = normalCdf(v, gauss);
          return gv * (cdf + v * 0.39894228040143268f * gauss);
        });
  case UnaryFunction::GeluTanh:
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    // d/dx = s + x s (1 - s) 2 u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    return body([](float x) { return x * sigmoid(1.5957691216057308f * (x + 0.044715f * x * x * x)); },
                [](float v, float gv) {
                  const float s = sigmoid(1.5957691216057308f * (v + 0.044715f * v * v * v));
                  const float du2 = 1.5957691216057308f * (1.0f + 0.134145f * v * v);
                  return gv * (s + v * s * (1.0f - s) * du2);
                });
  case UnaryFunction::Tanh:
    // libm's tanh (exact near 0, where 2 sigmoid(2x) - 1 cancels); d/dx = 1 - tanh^2.
    return body([](float x) { return std::tanh(x); },
                [](float v, float gv) {
                  const float t = std::tanh(v);
                  return gv * (1.0f - t * t);
                });
  case UnaryFunction::Relu:
    return body([](float x) { return x > 0.0f ? x : 0.0f; },
                [](float v, float gv) { return v > 0.0f ? gv : 0.0f; });
  case UnaryFunction::Silu:
    // x * sigmoid(x); d/dx = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
    return body([](float x) { return x * sigmoid(x); },
                [](float v, float gv) {
                  float s = sigmoid(v);
                  return gv * s * (1.0f + v * (1.0f - s));
                });
  case UnaryFunction::Rsqrt:
    // d/dx x^(-1/2) = -x^(-3/2) / 2.
    return body([](float x) { return 1.0f / std::sqrt(x); },
                [](float v, float gv) {
                  float r = 1.0f / std::sqrt(v);
                  return gv * (-0.5f * r * r * r);
                });
  case UnaryFunction::Exp:
    return body([](float x) { return std::exp(x); },
                [](float v, float gv) { return gv * std::exp(v); });
  case UnaryFunction::Log:
    return body([](float x) { return std::log(x); },
                [](float v, float gv) { return gv * (1.0f / v); });
  case UnaryFunction::Sign:
    return body(
        [](float x) {
          return std::isnan(x) ? x : static_cast<float>((x > 0.0f) - (x < 0.0f));
        },
        [](float, float gv) { return gv * 0.0f; });
  }
}

template <typename T> void unaryOf(UnaryFunction fn, const T *in, T *out, int64_t n) {
  withFunction(fn, [&](auto f, auto) { mapForward(in, out, n, f); });
}

template <typename T>
void unaryGradOf(UnaryFunction fn, const T *x, const T *g, T *out, int64_t n) {
  withFunction(fn, [&](auto, auto df) { mapBackward(x, g, out, n, df); });
}

/// out = f(gate) * up, and its gradient: dgate = df(gate, g * up), dup =
/// g * f(gate) -- one pass each, f(gate) recomputed in the gradient (the
/// products in the order the unfused activation and multiplications take,
/// so f32 results are bitwise theirs; bf16 ones are rounded once).
template <typename T>
void gatedOf(UnaryFunction fn, const T *gate, const T *up, T *out, int64_t n) {
  withFunction(fn, [&](auto f, auto) {
    internal::vectorLoop(n, 16384, [&](int64_t i) {
      internal::storeAs(out, i, f(internal::loadAs(gate, i)) * internal::loadAs(up, i));
    });
  });
}
template <typename T>
void gatedGradOf(UnaryFunction fn, const T *gate, const T *up, const T *g, T *dgate, T *dup,
                 int64_t n) {
  withFunction(fn, [&](auto f, auto df) {
    internal::vectorLoop(n, 16384, [&](int64_t i) {
      const float x = internal::loadAs(gate, i), gv = internal::loadAs(g, i);
      internal::storeAs(dgate, i, df(x, gv * internal::loadAs(up, i)));
      internal::storeAs(dup, i, gv * f(x));
    });
  });
}

} // namespace

void unary(UnaryFunction fn, const float *in, float *out, int64_t n) {
  unaryOf(fn, in, out, n);
}

void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n) {
  unaryGradOf(fn, x, g, out, n);
}

void addElementwiseKernels(KernelTable &t) {
  // Activations compute natively on bf16 storage (f32 math).
  using internal::as;
  // Dropout: each element's mask from its global index (kernels/common/dropout.h).
  t.add(
      OpKind::Dropout,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0);
        if (c.random && !c.random->training) {
          copy(in.data, c.output(0).data, in.bytes());
          return KernelResult::ok();
        }
        DropoutMask mask;
        if (!c.random || !dropoutMask(*in.shape, c.attr(attr::Dropout::stream),
                                      c.attr(attr::Dropout::layout), c.attr(attr::Dropout::p),
                                      c.meshCoords, c.meshSizes, *c.random, mask))
          return KernelResult::error("Dropout: no random context or integers that fit its input");
        return internal::onStorage(c, [&](auto t) {
          using T = decltype(t);
          const T *x = as<T>(in);
          T *y = as<T>(c.output(0));
          internal::vectorLoop(in.elements, 4096, [&](int64_t i) {
            internal::storeAs(y, i, internal::loadAs(x, i) * mask.factor(i));
          });
        });
      },
      internal::f32OrBf16);
  t.add(
      OpKind::Unary,
      [](const KernelCall &c) {
        return internal::onStorage(c, [&](auto t) {
          using T = decltype(t);
          unaryOf(c.function, as<T>(c.input(0)), as<T>(c.output(0)), c.input(0).elements);
        });
      },
      internal::f32OrBf16);
  t.add(
      OpKind::UnaryGrad,
      [](const KernelCall &c) {
        return internal::onStorage(c, [&](auto t) {
          using T = decltype(t);
          unaryGradOf(c.function, as<T>(c.input(0)), as<T>(c.input(1)), as<T>(c.output(0)),
                      c.input(0).elements);
        });
      },
      internal::f32OrBf16);
  t.add(
      OpKind::GatedUnary,
      [](const KernelCall &c) {
        return internal::onStorage(c, [&](auto t) {
          using T = decltype(t);
          gatedOf(c.function, as<T>(c.input(0)), as<T>(c.input(1)), as<T>(c.output(0)),
                  c.input(0).elements);
        });
      },
      internal::f32OrBf16);
  t.add(
      OpKind::GatedUnaryGrad,
      [](const KernelCall &c) {
        return internal::onStorage(c, [&](auto t) {
          using T = decltype(t);
          gatedGradOf(c.function, as<T>(c.input(0)), as<T>(c.input(1)), as<T>(c.input(2)),
                      as<T>(c.output(0)), as<T>(c.output(1)), c.input(0).elements);
        });
      },
      internal::f32OrBf16);
}

} // namespace ptc::kernels::cpu
