// Version and identity of the plan format shared by compiler and runtime.
#ifndef PTC_RUNTIME_PLAN_PLAN_FORMAT_H
#define PTC_RUNTIME_PLAN_PLAN_FORMAT_H

#include <cstdint>

namespace ptc::plan {
/// Increase when the meaning of existing plan fields changes.
/// 2: mesh, per-tensor dim_axes, collectives.
inline constexpr uint32_t kFormatVersion = 2;
} // namespace ptc::plan

#endif // PTC_RUNTIME_PLAN_PLAN_FORMAT_H
