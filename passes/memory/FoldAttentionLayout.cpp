//===- FoldAttentionLayout.cpp - attention on the projections' layout -----===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FOLDATTENTIONLAYOUTPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// [batch, seq, heads, head_dim] <-> [batch, heads, seq, head_dim] (its own inverse).
bool swapsHeadsAndSeq(TransposeOp t) {
  return t && t.getPermutation() == ArrayRef<int64_t>{0, 2, 1, 3};
}

struct FoldAttentionLayoutPass
    : mlir::ptc::impl::FoldAttentionLayoutPassBase<FoldAttentionLayoutPass> {
  void runOnOperation() override {
    SmallVector<Operation *> attention;
    getOperation().walk([&](Operation *op) {
      if (isa<CausalAttentionOp, CausalAttentionGradOp>(op))
        attention.push_back(op);
    });
    SmallVector<TransposeOp> inputs;
    for (Operation *op : attention)
      fold(op, inputs);
    // The heads' transposes nothing reads any more (once per transpose).
    for (TransposeOp t : inputs)
      if (t->use_empty())
        t.erase();
  }

  /// Rewrites one heads-major attention op whose operands are all head
  /// transposes and whose results only feed head transposes; the operands'
  /// transposes go to `inputs` (erased once nothing reads them).
  void fold(Operation *op, SmallVectorImpl<TransposeOp> &inputs) {
    auto fwd = dyn_cast<CausalAttentionOp>(op);
    auto grad = dyn_cast<CausalAttentionGradOp>(op);
    if ((fwd && fwd.getSeqMajor()) || (grad && grad.getSeqMajor()))
      return;
    SmallVector<Value> operands;
    SmallVector<TransposeOp> splits;
    for (Value v : op->getOperands()) {
      auto t = v.getDefiningOp<TransposeOp>();
      if (!swapsHeadsAndSeq(t))
        return;
      operands.push_back(t.getInput());
      splits.push_back(t);
    }
    SmallVector<Type> types;
    for (Value r : op->getResults()) {
      for (Operation *user : r.getUsers())
        if (!swapsHeadsAndSeq(dyn_cast<TransposeOp>(user)))
          return;
      auto type = cast<RankedTensorType>(r.getType());
      ArrayRef<int64_t> s = type.getShape();
      types.push_back(RankedTensorType::get({s[0], s[2], s[1], s[3]}, type.getElementType()));
    }
    OpBuilder b(op);
    Operation *folded;
    if (fwd)
      folded = CausalAttentionOp::create(b, op->getLoc(), types[0], operands[0], operands[1],
                                         operands[2], fwd.getScaleAttr(), true);
    else
      folded = CausalAttentionGradOp::create(b, op->getLoc(), types, operands[0], operands[1],
                                             operands[2], operands[3], grad.getScaleAttr(), true);
    // Discardable attributes (ptc.backward, a pipeline stage) carry over.
    for (NamedAttribute a : op->getDiscardableAttrs())
      folded->setAttr(a.getName(), a.getValue());
    for (auto [old, now] : llvm::zip(op->getResults(), folded->getResults()))
      for (Operation *user : llvm::make_early_inc_range(old.getUsers())) {
        user->getResult(0).replaceAllUsesWith(now);
        user->erase();
      }
    op->erase();
    for (TransposeOp t : splits)
      if (!llvm::is_contained(inputs, t))
        inputs.push_back(t);
  }
};
} // namespace
