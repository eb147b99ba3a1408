// Version and identity of the plan format shared by compiler and runtime.
#ifndef PTC_RUNTIME_PLAN_PLAN_FORMAT_H
#define PTC_RUNTIME_PLAN_PLAN_FORMAT_H

#include <cstdint>

namespace ptc::plan {
/// Increase when the meaning of existing plan fields changes (every change of
/// the schema — plan.fbs.in, or the op table's opcodes — needs a new version
/// and a line in schema-versions.txt: a test compares the schema's hash with
/// it). What each version changed: docs/plan-format.md, "Format versions".
inline constexpr uint32_t kFormatVersion = 16;
/// The oldest version this runtime reads: version 4 renumbered the opcodes,
/// so an older plan would run other kernels than it names.
inline constexpr uint32_t kOldestFormatVersion = 4;
} // namespace ptc::plan

#endif // PTC_RUNTIME_PLAN_PLAN_FORMAT_H
