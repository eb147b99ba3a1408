// CPU kernels: AdamW and SGD updates, sums of squares and clipping, loss
// scaling's unscale and the non-finite check.
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
template <typename Grad>
void adamwLoop(const float *param, Grad grad, const float *m, const float *v, float step,
               const AdamW &hp, int64_t n, float *outParam, float *outM, float *outV) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  const float stepSize = static_cast<float>(hp.lr / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weightDecay;
  vectorLoop(n, 32768, [&](int64_t i) {
    float g = grad(i);
    float mi = m[i] + (g - m[i]) * (1.0f - hp.beta1); // lerp, as torch
    float vi = v[i] * hp.beta2 + (1.0f - hp.beta2) * g * g;
    float denom = std::sqrt(vi) / bc2Sqrt + hp.eps;
    float p = param[i] * decay;
    outParam[i] = p - stepSize * mi / denom;
    outM[i] = mi;
    outV[i] = vi;
  });
}

template <typename Grad>
void sgdLoop(const float *param, Grad grad, const float *buf, float lr, float momentum,
             float weightDecay, int64_t n, float *outParam, float *outBuf) {
  vectorLoop(n, 32768, [&](int64_t i) {
    float g = grad(i) + weightDecay * param[i];
    float b = momentum * buf[i] + g;
    outBuf[i] = b;
    outParam[i] = param[i] - lr * b;
  });
}
} // namespace

void adamwUpdate(const float *param, const float *grad, const float *m, const float *v, float step,
                 const AdamW &hp, int64_t n, float *outParam, float *outM, float *outV) {
  adamwLoop(param, [grad](int64_t i) { return grad[i]; }, m, v, step, hp, n, outParam, outM, outV);
}

void sgdUpdate(const float *param, const float *grad, const float *buf, float lr, float momentum,
               float weightDecay, int64_t n, float *outParam, float *outBuf) {
  sgdLoop(param, [grad](int64_t i) { return grad[i]; }, buf, lr, momentum, weightDecay, n,
          outParam, outBuf);
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

namespace {
AdamW adamWOf(const KernelCall &c) {
  auto f = [&](const FloatAttr &a) { return static_cast<float>(c.attr(a)); };
  return AdamW{f(attr::AdamWUpdate::lr), f(attr::AdamWUpdate::beta1), f(attr::AdamWUpdate::beta2),
               f(attr::AdamWUpdate::eps), f(attr::AdamWUpdate::weight_decay)};
}
/// The skip flag of an update (dynamic loss scaling), if it has one and it is set.
bool skipped(const KernelCall &c) {
  const UpdateInputs layout = updateInputs(c);
  return layout.skip >= 0 && *c.input(static_cast<size_t>(layout.skip)).f32() != 0.0f;
}
/// Outputs [0, n) get inputs `from` (an update skipped on overflow).
void keepInputs(const KernelCall &c, std::initializer_list<size_t> from) {
  size_t o = 0;
  for (size_t i : from) {
    const TensorView &in = c.input(i), &out = c.output(o++);
    if (in.data != out.data)
      std::memcpy(out.data, in.data, static_cast<size_t>(in.bytes()));
  }
}
/// An update's working copy (the output after the parameter and state,
/// ptc-keep-working-copies), if it has one: the new parameter rounded to bf16,
/// or copied where the executor widened the copy (f16: rounded back after).
void writeWorkingCopy(const KernelCall &c, size_t at) {
  if (c.numOutputs <= at)
    return;
  const float *p = c.output(0).f32();
  const TensorView &copy = c.output(at);
  if (copy.dtype == DType::BF16) {
    auto *out = static_cast<uint16_t *>(copy.data);
    vectorLoop(copy.elements, 32768, [&](int64_t i) { out[i] = f32ToBf16(p[i]); });
  } else {
    std::memcpy(copy.data, p, static_cast<size_t>(copy.elements) * 4);
  }
}
/// An update the CPU runs as stored: f32 but for a bf16 gradient and a bf16
/// working copy (anything else arrives widened).
bool updateTypes(const KernelCall &c, size_t state) {
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.in[i].dtype != DType::F32 && !(i == 1 && c.in[i].dtype == DType::BF16))
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.out[i].dtype != DType::F32 && !(i == state && c.out[i].dtype == DType::BF16))
      return false;
  return true;
}
/// `loop(grad)` with the update's gradient read as stored: f32, or bf16
/// widened as read (the type chosen once per call, not per element).
template <typename Loop> void withGradient(const KernelCall &c, Loop loop) {
  const void *g = c.input(1).data;
  if (c.input(1).dtype == DType::BF16)
    loop([g](int64_t i) { return bf16ToF32(static_cast<const uint16_t *>(g)[i]); });
  else
    loop([g](int64_t i) { return static_cast<const float *>(g)[i]; });
}
} // namespace

void addOptimizerKernels(KernelTable &t) {
  // (param, grad, exp_avg, exp_avg_sq, step[, skip][, lr]) -> (param, exp_avg, exp_avg_sq[,
  // working copy]).
  t.add(
      OpKind::AdamWUpdate,
      [](const KernelCall &c) {
        if (skipped(c))
          keepInputs(c, {0, 2, 3});
        else
          withGradient(c, [&](auto grad) {
            adamwLoop(c.input(0).f32(), grad, c.input(2).f32(), c.input(3).f32(),
                      *c.input(4).f32(), adamWOf(c), c.input(0).elements, c.output(0).f32(),
                      c.output(1).f32(), c.output(2).f32());
          });
        writeWorkingCopy(c, 3);
        return KernelResult::ok();
      },
      [](const KernelCall &c) { return updateTypes(c, 3); });
  // (param, grad, momentum[, skip][, lr]) -> (param, momentum[, working copy]).
  t.add(
      OpKind::SgdUpdate,
      [](const KernelCall &c) {
        if (skipped(c))
          keepInputs(c, {0, 2});
        else
          withGradient(c, [&](auto grad) {
            sgdLoop(c.input(0).f32(), grad, c.input(2).f32(),
                    static_cast<float>(c.attr(attr::SgdUpdate::lr)),
                    static_cast<float>(c.attr(attr::SgdUpdate::momentum)),
                    static_cast<float>(c.attr(attr::SgdUpdate::weight_decay)),
                    c.input(0).elements, c.output(0).f32(), c.output(1).f32());
          });
        writeWorkingCopy(c, 2);
        return KernelResult::ok();
      },
      [](const KernelCall &c) { return updateTypes(c, 2); });
  t.add(OpKind::SumOfSquares, [](const KernelCall &c) {
    *c.output(0).f32() = static_cast<float>(sumOfSquares(
        viewPointers<const float *>(c.in, c.numInputs), viewSizes(c.in, c.numInputs)));
    return KernelResult::ok();
  });
  t.add(OpKind::ClipByNorm, [](const KernelCall &c) {
    const size_t n = c.numInputs - 1;
    const double sumSquares = *c.input(n).f32(); // the norm may be its memory
    *c.output(n).f32() = clipByNorm(viewPointers<const float *>(c.in, n), viewSizes(c.in, n),
                                    viewPointers<float *>(c.out, n),
                                    static_cast<float>(c.attr(attr::ClipByNorm::max_norm)), sumSquares);
    return KernelResult::ok();
  });
  // (gradients..., scale) -> (gradients / scale, 0 where not finite..., found).
  t.add(OpKind::UnscaleGrads, [](const KernelCall &c) {
    const size_t n = c.numInputs - 1;
    const float inv = 1.0f / *c.input(n).f32();
    int bad = 0;
    for (size_t t = 0; t < n; ++t) {
      const float *g = c.input(t).f32();
      float *u = c.output(t).f32();
      const int64_t count = c.input(t).elements;
#pragma omp parallel for reduction(| : bad) if (count > 32768)
      for (int64_t i = 0; i < count; ++i) {
        const bool finite = std::isfinite(g[i]);
        bad |= !finite;
        u[i] = finite ? g[i] * inv : 0.0f;
      }
    }
    *c.output(n).f32() = bad ? 1.0f : 0.0f;
    return KernelResult::ok();
  });
  // Each tensor read in its own float type.
  t.add(
      OpKind::AnyNonfinite,
      [](const KernelCall &c) {
        const size_t n = c.numInputs;
        const bool found = anyNonfinite(viewPointers<const void *>(c.in, n), viewSizes(c.in, n),
                                        viewFloatTypes(c.in, n));
        *c.output(0).f32() = found ? 1.0f : 0.0f;
        return KernelResult::ok();
      },
      anyTypes);
}

} // namespace ptc::kernels::cpu
