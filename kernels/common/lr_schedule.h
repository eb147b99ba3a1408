// Learning-rate schedules (ptc.lr_schedule): nanoGPT's get_lr and Megatron's
// cosine / linear decay after a linear warmup, as a function of the step
// count. Shared by the runtime (which evaluates it once per step) and the
// tests. A leaf: it depends on nothing in the project.
#ifndef PTC_KERNELS_COMMON_LR_SCHEDULE_H
#define PTC_KERNELS_COMMON_LR_SCHEDULE_H

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ptc::kernels {

enum class LrScheduleKind : int { Constant = 0, Cosine = 1, Linear = 2 };

inline std::optional<LrScheduleKind> lookupLrScheduleKind(std::string_view name) {
  if (name == "constant")
    return LrScheduleKind::Constant;
  if (name == "cosine")
    return LrScheduleKind::Cosine;
  if (name == "linear")
    return LrScheduleKind::Linear;
  return std::nullopt;
}

/// The rate of the step counted `step` (1 for the first step). With it = step - 1:
/// warmup lr * (it + 1) / (warmup + 1) for it < warmup; then constant lr, or
/// after `decaySteps` min_lr, else min_lr + coeff * (lr - min_lr) with
/// r = (it - warmup) / (decay - warmup), coeff = (1 + cos(pi r)) / 2 (cosine)
/// or 1 - r (linear).
inline double scheduledLr(LrScheduleKind kind, double lr, double minLr, int64_t warmupSteps,
                          int64_t decaySteps, double step) {
  const double it = step - 1.0;
  const double w = static_cast<double>(warmupSteps), d = static_cast<double>(decaySteps);
  if (it < w)
    return lr * (it + 1.0) / (w + 1.0);
  if (kind == LrScheduleKind::Constant)
    return lr;
  if (it > d)
    return minLr;
  double r = d > w ? (it - w) / (d - w) : 1.0;
  double coeff = kind == LrScheduleKind::Cosine ? 0.5 * (1.0 + std::cos(M_PI * r)) : 1.0 - r;
  return minLr + coeff * (lr - minLr);
}

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_LR_SCHEDULE_H
