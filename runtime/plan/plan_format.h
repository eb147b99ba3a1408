// Version and identity of the plan format shared by compiler and runtime.
#ifndef PTC_RUNTIME_PLAN_PLAN_FORMAT_H
#define PTC_RUNTIME_PLAN_PLAN_FORMAT_H

#include <cstdint>

namespace ptc::plan {
/// Increase when the meaning of existing plan fields changes.
/// 2: mesh, per-tensor dim_axes, collectives.
/// 3: micro-batches and pipeline schedules (an older runtime would run every
///    instruction once).
/// 4: activations as Unary / UnaryGrad naming their function (Gelu, Relu,
///    GeluGrad, ReluGrad opcodes gone); dim_blocks and channels' at_end
///    (added under version 3).
/// 5: RmsNorm, RmsNormGrad, Rotary and LrSchedule opcodes (appended: version 4
///    plans read unchanged); attention key/value may have fewer (grouped)
///    heads; updates may take a scheduled learning rate (ints [1]).
/// 6: ExpertLoad opcode (appended); MoE dispatch/combine take routing groups
///    ([groups, tokens, ...] tokens, [experts, groups, capacity, dim]
///    buffers) and fill capacity choice-major (a version 5 plan's MoE ops
///    would route differently, and version 5 plans hold no other change).
/// 7: host tensors and host instructions (offload=optimizer) and the
///    Transfer opcode (appended); version 6 plans read unchanged.
/// 8: the plan's model FLOPs per step (appended; MFU in ptc-run's log);
///    version 7 plans read unchanged.
/// 9: offload_path (appended: NVMe offload's directory); version 8 plans
///    read unchanged.
/// Every change of plan.fbs needs a new version and a line in
/// schema-versions.txt (a test compares the schema's hash with it).
inline constexpr uint32_t kFormatVersion = 9;
/// The oldest version this runtime reads: version 4 renumbered the opcodes,
/// so an older plan would run other kernels than it names.
inline constexpr uint32_t kOldestFormatVersion = 4;
} // namespace ptc::plan

#endif // PTC_RUNTIME_PLAN_PLAN_FORMAT_H
