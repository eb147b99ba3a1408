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
  return PlanInstruction{"Add"};
}

PlanInstruction SubOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Sub"};
}

PlanInstruction MulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Mul"};
}

// A gated activation: function(input 0) * input 1 (and its gradient).
PlanInstruction SwigluOp::getPlanInstruction(MeshAxisIndexFn) {
  return {"GatedUnary", {}, {}, "silu"};
}
PlanInstruction SwigluGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return {"GatedUnaryGrad", {}, {}, "silu"};
}
PlanInstruction DivOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Div"};
}

PlanInstruction ScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Scale", {}, {getFactor().convertToDouble()}};
}

// The stream, then per dimension its blocks and the mesh axes splitting it
// (a compound "dp*ep" by its components, major first).
PlanInstruction DropoutOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst{"Dropout", {getStreamAttr().getInt()}, {getP().convertToDouble()}};
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
  return PlanInstruction{"Convert"};
}

PlanInstruction TransferOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Transfer"};
}

PlanInstruction MatmulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Matmul", {getTransposeLhs(), getTransposeRhs()}, {}};
}

PlanInstruction RotaryOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  if (std::optional<StringRef> axis = getSeqAxis())
    return PlanInstruction{"Rotary", {getInverse() ? 1 : 0, axisIndex(*axis)},
                           {getTheta().convertToDouble()}};
  return PlanInstruction{"Rotary", {getInverse() ? 1 : 0}, {getTheta().convertToDouble()}};
}

PlanInstruction SoftmaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Softmax", {normAxis(getAxis(), rankOf(getInput()))}, {}};
}

// The optional integer: seq_major (ptc-fold-attention-layout).
PlanInstruction CausalAttentionOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CausalAttention",
                         getSeqMajor() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                         {getScaleOrDefault()}};
}

PlanInstruction EmbeddingOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return getVocabAxis() ? PlanInstruction{"Embedding", {axisIndex(*getVocabAxis())}, {}}
                          : PlanInstruction{"Embedding"};
}

PlanInstruction CrossEntropyOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CrossEntropy"};
}

PlanInstruction ReshapeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Reshape"};
}

PlanInstruction TransposeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Transpose", SmallVector<int64_t>(getPermutation()), {}};
}

PlanInstruction SliceOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Slice", SmallVector<int64_t>(getOffsets()), {}};
}

PlanInstruction ConcatOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Concat", {normAxis(getAxis(), getType().getRank())}, {}};
}

PlanInstruction ReduceSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"ReduceSum", normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction ReduceMeanOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"ReduceMean", normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction ReduceMaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"ReduceMax", normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction TopKGateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"TopKGate", {getKAttr().getInt(), getNormalize()}, {}};
}

PlanInstruction MoeDispatchOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"MoeDispatch"};
}

PlanInstruction ExpertLoadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"ExpertLoad"};
}

PlanInstruction MoeCombineOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"MoeCombine"};
}

PlanInstruction BroadcastOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Broadcast"};
}

PlanInstruction PadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Pad", SmallVector<int64_t>(getOffsets()), {}};
}

PlanInstruction SoftmaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"SoftmaxGrad", {normAxis(getAxis(), rankOf(getOutput()))}, {}};
}

// Attention reading the fused projection in place (ptc-fold-attention-layout).
PlanInstruction CausalAttentionQkvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CausalAttentionQkv", {}, {getScale().convertToDouble()}};
}
PlanInstruction CausalAttentionQkvGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CausalAttentionQkvGrad", {}, {getScale().convertToDouble()}};
}

PlanInstruction CausalAttentionGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CausalAttentionGrad",
                         getSeqMajor() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                         {getScaleOrDefault()}};
}

PlanInstruction EmbeddingGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return getVocabAxis()
             ? PlanInstruction{"EmbeddingGrad", {axisIndex(*getVocabAxis())}, {}}
             : PlanInstruction{"EmbeddingGrad"};
}

PlanInstruction VocabParallelCrossEntropyOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"VocabParallelCrossEntropy", axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction RingAttentionOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"RingAttention", axisIndices(axisIndex, getAxes()),
                         {getScale().convertToDouble()}};
}

PlanInstruction RingAttentionGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"RingAttentionGrad", axisIndices(axisIndex, getAxes()),
                         {getScale().convertToDouble()}};
}

PlanInstruction VocabParallelCrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"VocabParallelCrossEntropyGrad", axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction CrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"CrossEntropyGrad"};
}

PlanInstruction ReduceMaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"ReduceMaxGrad", normAxes(getAxes(), rankOf(getInput())), {}};
}

PlanInstruction TopKGateGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"TopKGateGrad", {getNormalize()}, {}};
}

PlanInstruction MoeDispatchGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"MoeDispatchGrad"};
}

PlanInstruction MoeCombineGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"MoeCombineGrad"};
}

PlanInstruction LrScheduleOp::getPlanInstruction(MeshAxisIndexFn) {
  auto kind = ::ptc::kernels::lookupLrScheduleKind(getKind().str());
  return PlanInstruction{"LrSchedule",
                 {static_cast<int64_t>(*kind), getWarmupStepsAttr().getInt(), getDecayStepsAttr().getInt()},
                 {getLr().convertToDouble(), getMinLr().convertToDouble()}};
}

PlanInstruction AdamWUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  // ints [1]: the last input is the scheduled learning rate.
  return PlanInstruction{"AdamWUpdate",
                 getScheduledLr() ? SmallVector<int64_t>{1} : SmallVector<int64_t>{},
                 {getLr().convertToDouble(), getBeta1().convertToDouble(),
                  getBeta2().convertToDouble(), getEps().convertToDouble(),
                  getWeightDecay().convertToDouble()}};
}

PlanInstruction SgdUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"SgdUpdate",
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
  return PlanInstruction{"ClipGradNorm", axes, floats};
}

PlanInstruction LossScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"LossScale", {}, {getInitial().convertToDouble()}};
}

PlanInstruction UnscaleGradsOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  SmallVector<int64_t> axes;
  if (getAxes())
    axes = axisIndices(axisIndex, *getAxes());
  return PlanInstruction{"UnscaleGrads", axes, {}};
}

PlanInstruction AnyNonfiniteOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  SmallVector<int64_t> axes;
  if (getAxes())
    axes = axisIndices(axisIndex, *getAxes());
  return PlanInstruction{"AnyNonfinite", axes, {}};
}

PlanInstruction LossScaleUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"LossScaleUpdate", {static_cast<int64_t>(getWindow())}, {}};
}

PlanInstruction SendOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Send", {static_cast<int64_t>(getChannel())}, {}};
}

PlanInstruction RecvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"Recv", {static_cast<int64_t>(getChannel())}, {}};
}

PlanInstruction MicrobatchSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction{"MicrobatchSum"};
}

PlanInstruction AllReduceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"AllReduce", axisIndices(axisIndex, getAxes()), {}};
}

PlanInstruction AllGatherOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"AllGather",
                 {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt(),
                  getBlocksAttr().getInt()},
                 {}};
}

PlanInstruction AllToAllOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"AllToAll",
                 {axisIndices(axisIndex, getAxes())[0], getSplitDimAttr().getInt(),
                  getConcatDimAttr().getInt()},
                 {}};
}

PlanInstruction ReduceScatterOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"ReduceScatter", {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt()}, {}};
}

PlanInstruction ShardSliceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction{"ShardSlice",
                 {axisIndices(axisIndex, getAxes())[0], getDimAttr().getInt(),
                  getBlocksAttr().getInt()},
                 {}};
}
