// The plan op table (op_table.def) as data: what every opcode takes. Shared by
// the compiler's export and the runtime's loader and JSON dump; depends only on
// the generated schema header.
#ifndef PTC_RUNTIME_PLAN_PLAN_OPS_H
#define PTC_RUNTIME_PLAN_PLAN_OPS_H

#include "runtime/plan/plan_generated.h"

#include "kernels/common/kernel_call.h"

#include <cstddef>
#include <iterator>
#include <string_view>
#include <vector>

namespace ptc::plan {

/// The loader's shape and attribute checks, one per kind of instruction
/// (the last column of op_table.def): what an opcode's operands must look
/// like besides the table's fixed counts. RowNorm: x, weight[, bias] over
/// x's last dimension (the bias when the row has three inputs).
enum class ShapeRule {
  Broadcasting, SameShape, Activation, ActivationGrad, Matmul, RowNorm, RowNormGrad, Softmax,
  SoftmaxGrad, Rotary, Attention, AttentionGrad, Embedding, EmbeddingGrad, CrossEntropy,
  Reshape, Transpose, Slice, Pad, Concat, Reduction, ReductionMaxGrad, Broadcast, TopKGate,
  TopKGateGrad, ExpertLoad, MoeDispatch, MoeDispatchGrad, MoeCombine, OptimizerUpdate,
  LrSchedule, ClipGradNorm, AllReduce, AllGather, ShardSlice, ReduceScatter, AllToAll, Channel,
  MicrobatchSum, LossScale, LossScaleUpdate, UnscaleGrads, Transfer, CachedAttention, RotaryAt,
  GatedActivation, GatedActivationGrad, AttentionQkv, AttentionQkvGrad, AnyNonfinite, Dropout,
};

struct OpInfo {
  OpCode code;
  const char *name;
  int inputs, outputs; // -1: depends on the instruction
  kernels::AttrSet attrs; // its named integers and floats (op_attrs.def)
  ShapeRule rule;
};

inline constexpr OpInfo kOpTable[] = {
#define PTC_PLAN_OP(op, nIn, nOut, attrs, rule)                                                    \
  {OpCode::op, #op, nIn, nOut, kernels::AttrSet::attrs, ShapeRule::rule},
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
};

static_assert(std::size(kOpTable) == static_cast<size_t>(OpCode::MAX) + 1,
              "plan.fbs's OpCode is generated from op_table.def: one enumerator per row");
constexpr bool opTableInEnumOrder() {
  for (size_t i = 0; i < std::size(kOpTable); ++i)
    if (static_cast<size_t>(kOpTable[i].code) != i)
      return false;
  return true;
}
static_assert(opTableInEnumOrder(), "the generated OpCode enum follows op_table.def's rows");

/// The row of the opcode named `name` ("RmsNorm"), or null.
inline const OpInfo *lookupOp(std::string_view name) {
  for (const OpInfo &info : kOpTable)
    if (name == info.name)
      return &info;
  return nullptr;
}

/// The row of `code`, or null for a value outside the enum (a corrupt plan).
inline const OpInfo *lookupOp(OpCode code) {
  size_t i = static_cast<size_t>(code);
  return i < std::size(kOpTable) ? &kOpTable[i] : nullptr;
}

/// The input layout of an AdamWUpdate / SgdUpdate instruction
/// (kernels::updateInputs); the loader checks an instruction against it.
using kernels::UpdateInputs;
inline UpdateInputs updateInputs(const Instruction &inst) {
  return kernels::updateInputs(static_cast<kernels::OpKind>(inst.op()),
                               inst.inputs() ? inst.inputs()->size() : 0,
                               inst.ints() ? inst.ints()->data() : nullptr,
                               inst.ints() ? inst.ints()->size() : 0);
}

/// A named attribute of an instruction (op_attrs.def; an absent optional
/// one reads as its fallback). The caller knows the instruction's op has the
/// attribute's set (the loader checked the counts).
template <typename Attr> auto attrOf(const Instruction &inst, const Attr &a) {
  return kernels::AttrReader{inst.ints() ? inst.ints()->data() : nullptr,
                             inst.ints() ? inst.ints()->size() : 0,
                             inst.floats() ? inst.floats()->data() : nullptr,
                             inst.floats() ? inst.floats()->size() : 0}(a);
}

/// The mesh axes an instruction communicates over (its group's axes), or
/// none for one that does not.
inline std::vector<int64_t> meshAxesOf(const Instruction &inst) {
  namespace attr = kernels::attr;
  switch (inst.op()) {
  case OpCode::AllReduce:
  case OpCode::UnscaleGrads:
  case OpCode::AnyNonfinite:
    return attrOf(inst, attr::MeshAxes::axes);
  case OpCode::ClipGradNorm:
    return attrOf(inst, attr::ClipGradNorm::axes);
  case OpCode::AllGather:
    return {attrOf(inst, attr::BlockedAxis::axis)};
  case OpCode::ReduceScatter:
    return {attrOf(inst, attr::ReduceScatter::axis)};
  case OpCode::AllToAll:
    return {attrOf(inst, attr::AllToAll::axis)};
  case OpCode::VocabParallelCrossEntropy:
  case OpCode::VocabParallelCrossEntropyGrad:
    return {attrOf(inst, attr::VocabAxis::axis)};
  case OpCode::RingAttention:
  case OpCode::RingAttentionGrad:
    return {attrOf(inst, attr::RingAttention::axis)};
  default:
    return {};
  }
}

} // namespace ptc::plan

#endif // PTC_RUNTIME_PLAN_PLAN_OPS_H
