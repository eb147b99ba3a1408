// Model FLOPs utilisation: the plan's model FLOPs per step over the step time,
// against the device's peak matmul rate, given (--peak-tflops) or measured
// here once per run with the device's own matmul kernel.
#ifndef PTC_RUNTIME_SESSION_THROUGHPUT_H
#define PTC_RUNTIME_SESSION_THROUGHPUT_H

#include "runtime/base/status.h"
#include "runtime/device/device.h"
#include "runtime/plan/plan_loader.h"

#include <optional>
#include <string>

namespace ptc {

struct PeakRate {
  double tflops = 0.0;
  std::string what; ///< "bf16 matmul 2048^3, measured" or "given"
};

/// The low-precision type (BF16 / F16) the plan's matmuls compute in, if any.
std::optional<FloatType> planMatmulLowPrecision(const LoadedPlan &plan);

/// The element type of the plan's matmuls that the device computes natively:
/// BF16 / F16 when the plan computes in it and `device` has the kernel, else F32.
FloatType matmulComputeType(const LoadedPlan &plan, const Device &device);

/// The device's best matmul rate on square `n`-sized operands of `type` (runs
/// timed for about `seconds` after one warm-up), in TFLOP/s.
StatusOr<PeakRate> measureMatmulPeak(Device &device, FloatType type, int64_t n = 2048,
                                     double seconds = 0.25);

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_THROUGHPUT_H
