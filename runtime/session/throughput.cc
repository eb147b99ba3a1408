#include "runtime/session/throughput.h"

#include <algorithm>
#include <array>
#include <chrono>

namespace ptc {

std::optional<FloatType> planMatmulLowPrecision(const LoadedPlan &plan) {
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    if (inst->op() != plan::OpCode::Matmul || inst->outputs()->size() == 0)
      continue;
    plan::DType t = plan.tensor(inst->outputs()->Get(0)).dtype;
    if (t == plan::DType::BF16)
      return FloatType::BF16;
    if (t == plan::DType::F16)
      return FloatType::F16;
  }
  return std::nullopt;
}

FloatType matmulComputeType(const LoadedPlan &plan, const Device &device) {
  std::optional<FloatType> low = planMatmulLowPrecision(plan);
  return low && !device.lowPrecisionMatmul(*low).empty() ? *low : FloatType::F32;
}

StatusOr<PeakRate> measureMatmulPeak(Device &device, FloatType type, int64_t n, double seconds) {
  const int64_t bytes = n * n * (type == FloatType::F32 ? 4 : 2);
  void *buffers[3] = {nullptr, nullptr, nullptr};
  auto releaseAll = [&] {
    for (void *p : buffers)
      if (p)
        device.release(p);
  };
  for (void *&p : buffers) {
    auto allocated = device.allocate(bytes);
    if (!allocated.isOk()) {
      releaseAll();
      return allocated.status();
    }
    p = *allocated;
    if (Status s = device.zero(p, bytes); !s.isOk()) {
      releaseAll();
      return s;
    }
  }
  // The device's Matmul kernel, as a plan's instruction calls it.
  const Shape shape{n, n};
  const kernels::DType dtype = type == FloatType::F32    ? kernels::DType::F32
                               : type == FloatType::BF16 ? kernels::DType::BF16
                                                         : kernels::DType::F16;
  kernels::TensorView in[2], out[1];
  for (int i = 0; i < 2; ++i)
    in[i] = {buffers[i], dtype, &shape, n * n};
  out[0] = {buffers[2], dtype, &shape, n * n};
  const std::array<int64_t, 2> noTranspose = {0, 0};
  const std::array<double, 0> noFloats{};
  kernels::KernelCall call =
      kernels::makeKernelCall(kernels::OpKind::Matmul, in, out, noTranspose, noFloats);
  const kernels::KernelEntry &entry = device.kernelTable()[kernels::OpKind::Matmul];
  if (!entry.run || !entry.accepts(call)) {
    releaseAll();
    return error(StatusCode::kUnimplemented, "no ", type == FloatType::F32 ? "f32" : "native low-precision",
                 " matmul on ", device.describe());
  }
  auto once = [&]() -> Status { return device.launch(call); };
  Status s = once(); // warm-up: primitive creation, first-touch pages
  if (s.isOk())
    s = device.synchronize();
  // The best run: a peak, not an average over whatever else the node does.
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  int64_t runs = 0;
  double elapsed = 0.0, best = 0.0;
  while (s.isOk() && (runs < 3 || elapsed < seconds)) {
    auto t0 = Clock::now();
    s = once();
    if (s.isOk())
      s = device.synchronize();
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    best = runs++ == 0 ? t : std::min(best, t);
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  releaseAll();
  if (!s.isOk())
    return s;
  PeakRate peak;
  peak.tflops = 2.0 * static_cast<double>(n) * n * n / best / 1e12;
  peak.what = std::string(type == FloatType::F32 ? "f32" : type == FloatType::BF16 ? "bf16" : "f16") +
              " matmul " + std::to_string(n) + "^3, best of " + std::to_string(runs) + " runs";
  return peak;
}

} // namespace ptc
