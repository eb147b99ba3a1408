// Version and identity of the plan format shared by compiler and runtime.
#ifndef PTC_RUNTIME_PLAN_PLAN_FORMAT_H
#define PTC_RUNTIME_PLAN_PLAN_FORMAT_H

#include <cstdint>

namespace ptc::plan {
/// Increase when the meaning of existing plan fields changes.
/// 2: mesh, per-tensor dim_axes, collectives.
/// 3: micro-batches and pipeline schedules (an older runtime would run every
///    instruction once).
inline constexpr uint32_t kFormatVersion = 3;
} // namespace ptc::plan

#endif // PTC_RUNTIME_PLAN_PLAN_FORMAT_H
