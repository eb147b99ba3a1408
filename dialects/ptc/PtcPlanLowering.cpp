//===- PtcPlanLowering.cpp - each op's plan instruction ---------------------===//
//
// PlanInstructionOpInterface: the instruction of the executable plan each op
// lowers to, by the opcode's name in kernels/common/op_table.def, with its
// integer and float attributes in the order the table names them.
// ptc-export-plan writes them after checking them against the table. Ops of a
// family bring theirs with their ODS class (activations: Unary / UnaryGrad
// with the function's name; row normalizations: their opcode and epsilon).
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"

#include "kernels/common/lr_schedule.h"

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::kernels::OpKind;

namespace {
int64_t rankOf(Value v) { return cast<RankedTensorType>(v.getType()).getRank(); }

/// An axis as the plan writes it: >= 0.
int64_t normAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

SmallVector<int64_t> normAxes(ArrayRef<int64_t> axes, int64_t rank) {
  SmallVector<int64_t> out;
  for (int64_t a : axes)
    out.push_back(normAxis(a, rank));
  return out;
}

/// Mesh axis names as their indices.
SmallVector<int64_t> axisIndices(MeshAxisIndexFn axisIndex, ArrayAttr axes) {
  SmallVector<int64_t> out;
  for (Attribute a : axes)
    out.push_back(axisIndex(cast<StringAttr>(a).getValue()));
  return out;
}
} // namespace

PlanInstruction AddOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Add};
}

PlanInstruction SubOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Sub};
}

PlanInstruction MulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Mul};
}

// A gated activation: function(input 0) * input 1 (and its gradient).
PlanInstruction SwigluOp::getPlanInstruction(MeshAxisIndexFn) {
  return {OpKind::GatedUnary, {}, {}, "silu"};
}
PlanInstruction SwigluGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return {OpKind::GatedUnaryGrad, {}, {}, "silu"};
}
PlanInstruction DivOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Div};
}

PlanInstruction ScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Scale, {}, {getFactor().convertToDouble()}};
}

// The stream, then per dimension its blocks and the mesh axes splitting it
// (a compound "dp*ep" by its components, major first).
PlanInstruction DropoutOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst{OpKind::Dropout, {getStreamAttr().getInt()}, {getP().convertToDouble()}};
  const int64_t rank = getInput().getType().getRank();
  ShardingAttr layout = getLayoutAttr();
  for (int64_t d = 0; d < rank; ++d) {
    StringRef axis;
    int64_t blocks = 1;
    if (layout && d < static_cast<int64_t>(layout.getAxes().size())) {
      if (StringAttr a = layout.getAxes()[d])
        axis = a.getValue();
      if (d < static_cast<int64_t>(layout.getBlocks().size()))
        blocks = layout.getBlocks()[d];
    }
    SmallVector<StringRef, 2> parts;
    if (!axis.empty())
      axis.split(parts, '*');
    inst.ints.push_back(axis.empty() ? 1 : blocks);
    inst.ints.push_back(static_cast<int64_t>(parts.size()));
    for (StringRef part : parts)
      inst.ints.push_back(axisIndex(part));
  }
  return inst;
}

PlanInstruction ConvertOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Convert};
}

PlanInstruction TransferOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Transfer};
}

PlanInstruction MatmulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Matmul, {getTransposeLhs(), getTransposeRhs()}, {}};
}

PlanInstruction RotaryOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  // [inverse, the sequence's mesh axis (-1: none), seq_major]; trailing
  // defaults left out (plans before seq_major read unchanged).
  SmallVector<int64_t> ints{getInverse() ? 1 : 0};
  std::optional<StringRef> axis = getSeqAxis();
  if (axis || getSeqMajor())
    ints.push_back(axis ? axisIndex(*axis) : -1);
  if (getSeqMajor())
    ints.push_back(1);
  return PlanInstruction{OpKind::Rotary, ints, {getTheta().convertToDouble()}};
}

PlanInstruction SoftmaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Softmax, {normAxis(getAxis(), rankOf(getInput()))}, {}};
}

// The optional integer: seq_major (ptc-fold-attention-layout).
PlanInstruction CausalAttentionOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CausalAttention,
                         getSeqMajor() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                         {getScaleOrDefault()}};
}

PlanInstruction EmbeddingOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return getVocabAxis() ? PlanInstruction{OpKind::Embedding, {axisIndex(*getVocabAxis())}, {}}
                          : PlanInstruction{OpKind::Embedding};
}

PlanInstruction CrossEntropyOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CrossEntropy};
}

PlanInstruction ReshapeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Reshape};
}

PlanInstruction TransposeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Transpose, SmallVector<int64_t>(getPermutation()), {}};
}

PlanInstruction SliceOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Slice, SmallVector<int64_t>(getOffsets()), {}};
}

PlanInstruction ConcatOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Concat, {normAxis(getAxis(), getType().getRank())}, {}};
}

PlanInstruction ReduceSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::ReduceSum, normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction ReduceMeanOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::ReduceMean, normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction ReduceMaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::ReduceMax, normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction TopKGateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::TopKGate, {getKAttr().getInt(), getNormalize()}, {}};
}

PlanInstruction MoeDispatchOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::MoeDispatch};
}

PlanInstruction ExpertLoadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::ExpertLoad};
}

PlanInstruction MoeCombineOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::MoeCombine};
}

PlanInstruction BroadcastOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Broadcast};
}

PlanInstruction PadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Pad, SmallVector<int64_t>(getOffsets()), {}};
}

PlanInstruction SoftmaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::SoftmaxGrad, {normAxis(getAxis(), rankOf(getOutput()))}, {}};
}

// Attention reading the fused projection in place (ptc-fold-attention-layout).
PlanInstruction CausalAttentionQkvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CausalAttentionQkv, {}, {getScale().convertToDouble()}};
}
PlanInstruction CausalAttentionQkvGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CausalAttentionQkvGrad, {}, {getScale().convertToDouble()}};
}

PlanInstruction CausalAttentionGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CausalAttentionGrad,
                         getSeqMajor() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                         {getScaleOrDefault()}};
}

PlanInstruction EmbeddingGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return getVocabAxis()
             ? PlanInstruction{OpKind::EmbeddingGrad, {axisIndex(*getVocabAxis())}, {}}
             : PlanInstruction{OpKind::EmbeddingGrad};
}

PlanInstruction VocabParallelCrossEntropyOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::VocabParallelCrossEntropy, axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction RingAttentionOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::RingAttention, axisIndices(axisIndex, getAxes()),
                         {getScale().convertToDouble()}};
}

PlanInstruction RingAttentionGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::RingAttentionGrad, axisIndices(axisIndex, getAxes()),
                         {getScale().convertToDouble()}};
}

PlanInstruction VocabParallelCrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::VocabParallelCrossEntropyGrad, axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction CrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::CrossEntropyGrad};
}

PlanInstruction ReduceMaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::ReduceMaxGrad, normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction TopKGateGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::TopKGateGrad, {getNormalize()}, {}};
}

PlanInstruction MoeDispatchGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::MoeDispatchGrad};
}

PlanInstruction MoeCombineGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::MoeCombineGrad};
}

PlanInstruction LrScheduleOp::getPlanInstruction(MeshAxisIndexFn) {
  auto kind = ::ptc::kernels::lookupLrScheduleKind(getKind().str());
  return PlanInstruction{OpKind::LrSchedule,
                 {static_cast<int64_t>(*kind), getWarmupStepsAttr().getInt(), getDecayStepsAttr().getInt()},
                 {getLr().convertToDouble(), getMinLr().convertToDouble()}};
}

PlanInstruction AdamWUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  // ints [1]: the last input is the scheduled learning rate.
  return PlanInstruction{OpKind::AdamWUpdate,
                 getScheduledLr() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                 {getLr().convertToDouble(), getBeta1().convertToDouble(),
                  getBeta2().convertToDouble(), getEps().convertToDouble(),
                  getWeightDecay().convertToDouble()}};
}

PlanInstruction SgdUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::SgdUpdate,
                 getScheduledLr() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                 {getLr().convertToDouble(), getMomentum().convertToDouble(),
                  getWeightDecay().convertToDouble()}};
}

PlanInstruction ClipGradNormOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  SmallVector<int64_t> axes;
  if (getAxes())
    axes = axisIndices(axisIndex, *getAxes());
  SmallVector<double> floats{getMaxNorm().convertToDouble()};
  if (std::optional<ArrayRef<double>> weights = getWeights())
    floats.append(weights->begin(), weights->end());
  return PlanInstruction{OpKind::ClipGradNorm, axes, floats};
}

PlanInstruction LossScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::LossScale, {}, {getInitial().convertToDouble()}};
}

PlanInstruction UnscaleGradsOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  SmallVector<int64_t> axes;
  if (getAxes())
    axes = axisIndices(axisIndex, *getAxes());
  return PlanInstruction{OpKind::UnscaleGrads, axes, {}};
}

PlanInstruction AnyNonfiniteOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  SmallVector<int64_t> axes;
  if (getAxes())
    axes = axisIndices(axisIndex, *getAxes());
  return PlanInstruction{OpKind::AnyNonfinite, axes, {}};
}

PlanInstruction LossScaleUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::LossScaleUpdate, {static_cast<int64_t>(getWindow())}, {}};
}

PlanInstruction SendOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Send, {static_cast<int64_t>(getChannel())}, {}};
}

PlanInstruction RecvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::Recv, {static_cast<int64_t>(getChannel())}, {}};
}

PlanInstruction MicrobatchSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{OpKind::MicrobatchSum};
}

PlanInstruction AllReduceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::AllReduce, axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction AllGatherOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::AllGather,
                 {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt(),
                  getBlocksAttr().getInt()},
                 {}};
}

PlanInstruction AllToAllOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::AllToAll,
                 {axisIndices(axisIndex, getAxes())[0], getSplitDimAttr().getInt(),
                  getConcatDimAttr().getInt()},
                 {}};
}

PlanInstruction ReduceScatterOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::ReduceScatter, {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt()}, {}};
}

PlanInstruction ShardSliceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{OpKind::ShardSlice,
                 {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt(),
                  getBlocksAttr().getInt()},
                 {}};
}
