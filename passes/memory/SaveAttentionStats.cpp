//===- SaveAttentionStats.cpp - attention's softmax statistics saved ------===//
//
// Pairs each causal attention gradient with the forward of the same operands
// before it in its block: the forward returns its rows' log-sum-exp, the
// gradient reads them and the forward's result (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_SAVEATTENTIONSTATSPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The row statistics' type of a forward result: f32 [batch, heads, seq].
RankedTensorType statsType(RankedTensorType result, bool seqMajor) {
  ArrayRef<int64_t> s = result.getShape();
  return RankedTensorType::get({s[0], seqMajor ? s[2] : s[1], seqMajor ? s[1] : s[2]},
                               Float32Type::get(result.getContext()));
}

/// Whether forward `fwd` computed what gradient `grad` recomputes: the same
/// operands and positions, scale and layout.
bool samePair(CausalAttentionOp fwd, CausalAttentionGradOp grad) {
  return fwd.getQuery() == grad.getQuery() && fwd.getKey() == grad.getKey() &&
         fwd.getValue() == grad.getValue() && fwd.getPositions() == grad.getPositions() &&
         fwd.getScaleOrDefault() == grad.getScaleOrDefault() &&
         fwd.getSeqMajor() == grad.getSeqMajor();
}
bool samePair(CausalAttentionQkvOp fwd, CausalAttentionQkvGradOp grad) {
  return fwd.getQkv() == grad.getQkv() && fwd.getPositions() == grad.getPositions() &&
         fwd.getScale() == grad.getScale() &&
         fwd.getResult().getType() == grad.getGrad().getType();
}

bool samePair(RingAttentionOp fwd, RingAttentionGradOp grad) {
  return fwd.getQuery() == grad.getQuery() && fwd.getKey() == grad.getKey() &&
         fwd.getValue() == grad.getValue() && fwd.getPositions() == grad.getPositions() &&
         fwd.getAxes() == grad.getAxes() && fwd.getScale() == grad.getScale();
}

/// The forward `grad` pairs with: of the same operands, in its block, before
/// it (the latest such, nearest the gradient: a recomputation's under
/// `recompute`).
template <typename Fwd, typename Grad> Fwd forwardOf(Grad grad) {
  Fwd found;
  for (Operation *user : grad->getOperand(0).getUsers()) {
    auto fwd = dyn_cast<Fwd>(user);
    if (!fwd || fwd->getBlock() != grad->getBlock() || !fwd->isBeforeInBlock(grad) ||
        !samePair(fwd, grad))
      continue;
    if (!found || found->isBeforeInBlock(fwd))
      found = fwd;
  }
  return found;
}

/// Whether a forward's result is [batch, seq, heads, head_dim] (its
/// statistics are [batch, heads, seq] either way).
bool seqMajorResult(CausalAttentionOp fwd) { return fwd.getSeqMajor(); }
bool seqMajorResult(CausalAttentionQkvOp) { return true; }
bool seqMajorResult(RingAttentionOp) { return false; }

/// `fwd` again with its statistics as a second result (the same operands and
/// attributes; its uses move over); the statistics, or those it already
/// returns.
template <typename Fwd> Value withStats(Fwd fwd) {
  if (fwd.getStats())
    return fwd.getStats();
  RankedTensorType result = fwd.getResult().getType();
  OpBuilder b(fwd);
  OperationState state(fwd.getLoc(), fwd->getName());
  state.addOperands(fwd->getOperands());
  state.addTypes({result, statsType(result, seqMajorResult(fwd))});
  state.propertiesAttr = fwd->getPropertiesAsAttribute();
  state.addAttributes(fwd->getDiscardableAttrDictionary().getValue());
  auto now = cast<Fwd>(b.create(state));
  fwd.getResult().replaceAllUsesWith(now.getResult());
  fwd.erase();
  return now.getStats();
}

/// What gradient `grad` reads as the forward's result, given the statistics
/// `stats` the forward returns: a reshape of the result before the gradient
/// where it has one (the output projection's input, kept for its weight
/// gradient anyway: the same elements in the same order), else the result.
Value savedResultBeside(Value stats, Operation *grad) {
  Value result = stats.getDefiningOp()->getResult(0);
  for (Operation *user : result.getUsers())
    if (auto reshape = dyn_cast<ReshapeOp>(user);
        reshape && reshape->getBlock() == grad->getBlock() && reshape->isBeforeInBlock(grad))
      return reshape.getResult();
  return result;
}

/// Gradient `grad` (of forward op type Fwd) reading the statistics and result
/// of the forward it pairs with, where it has one.
template <typename Fwd, typename Grad> void pairWithForward(Grad grad) {
  Fwd fwd = forwardOf<Fwd>(grad);
  if (!fwd)
    return;
  Value stats = withStats(fwd);
  grad.getSavedResultMutable().assign(savedResultBeside(stats, grad));
  grad.getSavedStatsMutable().assign(stats);
}

struct SaveAttentionStatsPass
    : public mlir::ptc::impl::SaveAttentionStatsPassBase<SaveAttentionStatsPass> {
  void runOnOperation() override {
    SmallVector<Operation *> grads;
    getOperation().walk([&](Operation *op) {
      if (auto g = dyn_cast<CausalAttentionGradOp>(op); g && !g.getSavedStats())
        grads.push_back(op);
      if (auto g = dyn_cast<CausalAttentionQkvGradOp>(op); g && !g.getSavedStats())
        grads.push_back(op);
      if (auto g = dyn_cast<RingAttentionGradOp>(op); g && !g.getSavedStats())
        grads.push_back(op);
    });
    for (Operation *op : grads) {
      if (auto grad = dyn_cast<CausalAttentionGradOp>(op))
        pairWithForward<CausalAttentionOp>(grad);
      else if (auto qkvGrad = dyn_cast<CausalAttentionQkvGradOp>(op))
        pairWithForward<CausalAttentionQkvOp>(qkvGrad);
      else
        pairWithForward<RingAttentionOp>(cast<RingAttentionGradOp>(op));
    }
  }
};
} // namespace
