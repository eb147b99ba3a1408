// Model FLOPs utilisation: the plan's model FLOPs per step over the step time,
// against the device's peak matmul rate: given (--peak-tflops), a known GPU's
// datasheet figure, or measured with the device's own matmul kernel and kept
// per machine (the best measurement so far), so that runs compare.
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

/// The dense bf16 / f16 tensor-core peak of a known GPU named in `device`
/// (NVIDIA's datasheets: H100 and H200 SXM 989 TFLOP/s, H100 PCIe 756, A100
/// 312), or nothing (f32, CPUs, other GPUs).
std::optional<PeakRate> knownMatmulPeak(const std::string &device, FloatType type);

/// The peak MFU is measured against: a known GPU's (knownMatmulPeak), else
/// measureMatmulPeak's, raised to the best this machine has measured for the
/// same device, type and rank count (`cacheFile`: lines "key<TAB>tflops";
/// `update` writes a better one back, atomically). A busy machine measures a
/// lower rate, which would inflate MFU run to run; the best one is the peak.
/// An empty `cacheFile` measures only.
StatusOr<PeakRate> matmulPeak(Device &device, FloatType type, int ranks, const std::string &cacheFile,
                              bool update);

/// Where matmulPeak keeps its measurements: $PTC_PEAK_CACHE, else
/// $XDG_CACHE_HOME/ptc/matmul-peak.tsv, else ~/.cache/ptc/matmul-peak.tsv
/// (empty without a home).
std::string defaultPeakCacheFile();

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_THROUGHPUT_H
