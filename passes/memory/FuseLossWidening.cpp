//===- FuseLossWidening.cpp - the loss reads low-precision logits ---------===//

#include "passes/memory/Passes.h"

#include "llvm/ADT/SetVector.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSELOSSWIDENINGPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The conversion of `grad` back to `type` when it is grad's only use, or null.
ConvertOp onlyNarrowing(Value grad, Type type) {
  if (!grad.hasOneUse())
    return {};
  auto convert = dyn_cast<ConvertOp>(*grad.getUsers().begin());
  return convert && convert.getType() == type ? convert : ConvertOp();
}

/// Loss `loss` (ptc.cross_entropy, ptc.vocab_parallel_cross_entropy) reading
/// the narrow logits its widened ones come from; the widening goes in
/// `widenings`.
template <typename Loss> void readNarrow(Loss loss, llvm::SetVector<Operation *> &widenings) {
  if (Value narrow = narrowSourceOf(loss.getLogits())) {
    widenings.insert(loss.getLogits().getDefiningOp());
    loss.getLogitsMutable().assign(narrow);
  }
}

/// Gradient `grad` (ptc.cross_entropy_grad, its vocabulary-parallel form)
/// likewise, producing the narrow type where its one use converts it there.
template <typename Grad> void readNarrowGrad(Grad grad, llvm::SetVector<Operation *> &widenings) {
  Value narrow = narrowSourceOf(grad.getLogits());
  // The gradient has the logits' type: only where its one use converts
  // it to the narrow type anyway.
  ConvertOp back = narrow ? onlyNarrowing(grad.getResult(), narrow.getType()) : ConvertOp();
  if (!back)
    return;
  widenings.insert(grad.getLogits().getDefiningOp());
  grad.getLogitsMutable().assign(narrow);
  grad.getResult().setType(cast<RankedTensorType>(narrow.getType()));
  back.getResult().replaceAllUsesWith(grad.getResult());
  back.erase();
}

struct FuseLossWideningPass
    : mlir::ptc::impl::FuseLossWideningPassBase<FuseLossWideningPass> {
  void runOnOperation() override {
    SmallVector<Operation *> losses;
    getOperation().walk([&](Operation *op) {
      if (isa<CrossEntropyOp, CrossEntropyGradOp, VocabParallelCrossEntropyOp,
              VocabParallelCrossEntropyGradOp>(op))
        losses.push_back(op);
    });
    llvm::SetVector<Operation *> widenings;
    for (Operation *op : losses) {
      if (auto loss = dyn_cast<CrossEntropyOp>(op))
        readNarrow(loss, widenings);
      else if (auto loss = dyn_cast<VocabParallelCrossEntropyOp>(op))
        readNarrow(loss, widenings);
      else if (auto grad = dyn_cast<CrossEntropyGradOp>(op))
        readNarrowGrad(grad, widenings);
      else
        readNarrowGrad(cast<VocabParallelCrossEntropyGradOp>(op), widenings);
    }
    // A widening read by nothing else goes (one may serve several losses).
    for (Operation *convert : widenings)
      if (convert->use_empty())
        convert->erase();
  }
};
} // namespace
