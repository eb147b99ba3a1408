//===- PtcPlanLowering.cpp - each op's plan instruction ---------------------===//
//
// PlanInstructionOpInterface: the instruction of the executable plan each op
// lowers to, by its opcode (kernels/common/op_table.def's enum), with its
// attributes set by name (kernels/common/op_attrs.def; the plan stores them
// by position). ptc-export-plan writes them after checking them against the
// table. Ops of a family bring theirs with their ODS class (activations:
// Unary / UnaryGrad with the function's name; row normalizations: their
// opcode and epsilon).
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"

#include "kernels/common/lr_schedule.h"

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::kernels::OpKind;
namespace attr = ::ptc::kernels::attr;

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
  return PlanInstruction(OpKind::Add);
}

PlanInstruction SubOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Sub);
}

PlanInstruction MulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Mul);
}

// A gated activation: function(input 0) * input 1 (and its gradient).
PlanInstruction SwigluOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::GatedUnary, "silu");
}
PlanInstruction SwigluGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::GatedUnaryGrad, "silu");
}
PlanInstruction DivOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Div);
}

PlanInstruction ScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Scale).set(attr::Scale::factor, getFactor().convertToDouble());
}

// The stream, then per dimension its blocks and the mesh axes splitting it
// (a compound "dp*ep" by its components, major first).
PlanInstruction DropoutOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst(OpKind::Dropout);
  inst.set(attr::Dropout::stream, getStreamAttr().getInt()).set(attr::Dropout::p, getP().convertToDouble());
  SmallVector<int64_t> dims; // per dimension: blocks, axis count, the axes
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
    dims.push_back(axis.empty() ? 1 : blocks);
    dims.push_back(static_cast<int64_t>(parts.size()));
    for (StringRef part : parts)
      dims.push_back(axisIndex(part));
  }
  return inst.set(attr::Dropout::layout, dims);
}

PlanInstruction ConvertOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Convert);
}

PlanInstruction TransferOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Transfer);
}

PlanInstruction MatmulOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Matmul)
      .set(attr::Matmul::transpose_lhs, getTransposeLhs())
      .set(attr::Matmul::transpose_rhs, getTransposeRhs());
}

// A Matmul with a second output: the bias gradient (lhs summed over its
// contracted dimension).
PlanInstruction MatmulBiasGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Matmul)
      .set(attr::Matmul::transpose_lhs, getTransposeLhs())
      .set(attr::Matmul::transpose_rhs, getTransposeRhs());
}

PlanInstruction RotaryOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  std::optional<StringRef> axis = getSeqAxis();
  return PlanInstruction(OpKind::Rotary)
      .set(attr::Rotary::inverse, getInverse())
      .set(attr::Rotary::seq_axis, axis ? axisIndex(*axis) : int64_t{-1})
      .set(attr::Rotary::seq_major, getSeqMajor())
      .set(attr::Rotary::theta, getTheta().convertToDouble());
}

PlanInstruction SoftmaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Softmax).set(attr::Axis::axis, normAxis(getAxis(), rankOf(getInput())));
}

// seq_major: ptc-fold-attention-layout's layout.
PlanInstruction CausalAttentionOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CausalAttention)
      .set(attr::Attention::seq_major, getSeqMajor())
      .set(attr::Attention::scale, getScaleOrDefault());
}

PlanInstruction EmbeddingOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::Embedding)
      .set(attr::Embedding::vocab_axis, getVocabAxis() ? axisIndex(*getVocabAxis()) : int64_t{-1});
}

PlanInstruction CrossEntropyOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CrossEntropy);
}

PlanInstruction ReshapeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Reshape);
}

PlanInstruction TransposeOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Transpose).set(attr::Permutation::permutation, getPermutation());
}

PlanInstruction SliceOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Slice).set(attr::Offsets::offsets, getOffsets());
}

PlanInstruction ConcatOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Concat).set(attr::Axis::axis, normAxis(getAxis(), getType().getRank()));
}

PlanInstruction ReduceSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::ReduceSum).set(attr::Reduction::axes, normAxes(getAxes(), rankOf(getInput())));
}

PlanInstruction ReduceMeanOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::ReduceMean).set(attr::Reduction::axes, normAxes(getAxes(), rankOf(getInput())));
}

PlanInstruction ReduceMaxOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::ReduceMax).set(attr::Reduction::axes, normAxes(getAxes(), rankOf(getInput())));
}

PlanInstruction TopKGateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::TopKGate)
      .set(attr::TopKGate::k, getKAttr().getInt())
      .set(attr::TopKGate::normalize, getNormalize());
}

PlanInstruction MoeDispatchOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::MoeDispatch);
}

PlanInstruction ExpertLoadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::ExpertLoad);
}

PlanInstruction MoeCombineOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::MoeCombine);
}

PlanInstruction BroadcastOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Broadcast);
}

PlanInstruction PadOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Pad).set(attr::Offsets::offsets, getOffsets());
}

PlanInstruction SoftmaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::SoftmaxGrad).set(attr::Axis::axis, normAxis(getAxis(), rankOf(getOutput())));
}

// Attention reading the fused projection in place (ptc-fold-attention-layout).
PlanInstruction CausalAttentionQkvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CausalAttentionQkv)
      .set(attr::ScaledAttention::scale, getScale().convertToDouble());
}
PlanInstruction CausalAttentionQkvGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CausalAttentionQkvGrad)
      .set(attr::ScaledAttention::scale, getScale().convertToDouble());
}

PlanInstruction CausalAttentionGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CausalAttentionGrad)
      .set(attr::Attention::seq_major, getSeqMajor())
      .set(attr::Attention::scale, getScaleOrDefault());
}

PlanInstruction EmbeddingGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::EmbeddingGrad)
      .set(attr::Embedding::vocab_axis, getVocabAxis() ? axisIndex(*getVocabAxis()) : int64_t{-1});
}

PlanInstruction VocabParallelCrossEntropyOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::VocabParallelCrossEntropy)
      .set(attr::VocabAxis::axis, axisIndices(axisIndex, getAxes())[0]);
}

PlanInstruction RingAttentionOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::RingAttention)
      .set(attr::RingAttention::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::RingAttention::scale, getScale().convertToDouble());
}

PlanInstruction RingAttentionGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::RingAttentionGrad)
      .set(attr::RingAttention::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::RingAttention::scale, getScale().convertToDouble());
}

PlanInstruction VocabParallelCrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::VocabParallelCrossEntropyGrad)
      .set(attr::VocabAxis::axis, axisIndices(axisIndex, getAxes())[0]);
}

// The plan's VocabParallelCrossEntropyGrad with its optional second output,
// the loss: (logits, targets, grad) -> (logits grad, loss).
PlanInstruction VocabParallelCrossEntropyWithGradOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::VocabParallelCrossEntropyGrad)
      .set(attr::VocabAxis::axis, axisIndices(axisIndex, getAxes())[0]);
}

// The plan's CrossEntropyGrad with its optional second output, the loss:
// (logits, targets, grad) -> (logits grad, loss).
PlanInstruction CrossEntropyWithGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CrossEntropyGrad);
}

PlanInstruction CrossEntropyGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CrossEntropyGrad);
}

PlanInstruction ReduceMaxGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::ReduceMaxGrad).set(attr::Reduction::axes, normAxes(getAxes(), rankOf(getInput())));
}

PlanInstruction TopKGateGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::TopKGateGrad).set(attr::TopKGateGrad::normalize, getNormalize());
}

PlanInstruction MoeDispatchGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::MoeDispatchGrad);
}

PlanInstruction MoeCombineGradOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::MoeCombineGrad);
}

PlanInstruction LrScheduleOp::getPlanInstruction(MeshAxisIndexFn) {
  auto kind = ::ptc::kernels::lookupLrScheduleKind(getKind().str());
  return PlanInstruction(OpKind::LrSchedule)
      .set(attr::LrSchedule::kind, static_cast<int64_t>(*kind))
      .set(attr::LrSchedule::warmup_steps, getWarmupStepsAttr().getInt())
      .set(attr::LrSchedule::decay_steps, getDecayStepsAttr().getInt())
      .set(attr::LrSchedule::lr, getLr().convertToDouble())
      .set(attr::LrSchedule::min_lr, getMinLr().convertToDouble());
}

PlanInstruction AdamWUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::AdamWUpdate)
      .set(attr::AdamWUpdate::scheduled_lr, getScheduledLr() ? 1 : 0) // the lr is the last input
      .set(attr::AdamWUpdate::lr, getLr().convertToDouble())
      .set(attr::AdamWUpdate::beta1, getBeta1().convertToDouble())
      .set(attr::AdamWUpdate::beta2, getBeta2().convertToDouble())
      .set(attr::AdamWUpdate::eps, getEps().convertToDouble())
      .set(attr::AdamWUpdate::weight_decay, getWeightDecay().convertToDouble());
}

PlanInstruction SgdUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::SgdUpdate)
      .set(attr::SgdUpdate::scheduled_lr, getScheduledLr() ? 1 : 0)
      .set(attr::SgdUpdate::lr, getLr().convertToDouble())
      .set(attr::SgdUpdate::momentum, getMomentum().convertToDouble())
      .set(attr::SgdUpdate::weight_decay, getWeightDecay().convertToDouble());
}

PlanInstruction ClipGradNormOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst(OpKind::ClipGradNorm);
  if (getAxes())
    inst.set(attr::ClipGradNorm::axes, axisIndices(axisIndex, *getAxes()));
  inst.set(attr::ClipGradNorm::max_norm, getMaxNorm().convertToDouble());
  if (std::optional<ArrayRef<double>> weights = getWeights())
    inst.set(attr::ClipGradNorm::weights, *weights);
  return inst;
}

PlanInstruction LossScaleOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::LossScale).set(attr::LossScale::initial, getInitial().convertToDouble());
}

PlanInstruction UnscaleGradsOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst(OpKind::UnscaleGrads);
  if (getAxes())
    inst.set(attr::MeshAxes::axes, axisIndices(axisIndex, *getAxes()));
  return inst;
}

PlanInstruction AnyNonfiniteOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  PlanInstruction inst(OpKind::AnyNonfinite);
  if (getAxes())
    inst.set(attr::MeshAxes::axes, axisIndices(axisIndex, *getAxes()));
  return inst;
}

PlanInstruction LossScaleUpdateOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::LossScaleUpdate)
      .set(attr::LossScaleUpdate::window, static_cast<int64_t>(getWindow()));
}

PlanInstruction SendOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Send).set(attr::Channel::channel, static_cast<int64_t>(getChannel()));
}

PlanInstruction RecvOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::Recv).set(attr::Channel::channel, static_cast<int64_t>(getChannel()));
}

PlanInstruction MicrobatchSumOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::MicrobatchSum);
}

PlanInstruction AllReduceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::AllReduce).set(attr::MeshAxes::axes, axisIndices(axisIndex, getAxes()));
}

PlanInstruction AllGatherOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::AllGather)
      .set(attr::BlockedAxis::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::BlockedAxis::dim, getDimAttr().getInt())
      .set(attr::BlockedAxis::blocks, getBlocksAttr().getInt());
}

PlanInstruction AllToAllOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::AllToAll)
      .set(attr::AllToAll::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::AllToAll::split_dim, getSplitDimAttr().getInt())
      .set(attr::AllToAll::concat_dim, getConcatDimAttr().getInt());
}

PlanInstruction ReduceScatterOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::ReduceScatter)
      .set(attr::ReduceScatter::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::ReduceScatter::dim, getDimAttr().getInt());
}

PlanInstruction ShardSliceOp::getPlanInstruction(MeshAxisIndexFn axisIndex) {
  return PlanInstruction(OpKind::ShardSlice)
      .set(attr::BlockedAxis::axis, axisIndices(axisIndex, getAxes())[0])
      .set(attr::BlockedAxis::dim, getDimAttr().getInt())
      .set(attr::BlockedAxis::blocks, getBlocksAttr().getInt());
}
