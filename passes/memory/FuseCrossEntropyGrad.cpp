//===- FuseCrossEntropyGrad.cpp - the loss and its gradient in one op -----===//
//
// A ptc.cross_entropy and the ptc.cross_entropy_grad of the same logits and
// targets become one ptc.cross_entropy_with_grad (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "passes/memory/Passes.h"

#include "mlir/IR/Dominance.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSECROSSENTROPYGRADPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The loss of the same logits and targets as `grad` (and, vocabulary-parallel,
/// over the same mesh axes), before it in its block.
template <typename Loss, typename Grad> Loss lossOf(Grad grad) {
  for (Operation *user : grad.getLogits().getUsers())
    if (auto loss = dyn_cast<Loss>(user);
        loss && loss->getBlock() == grad->getBlock() && loss->isBeforeInBlock(grad) &&
        loss.getTargets() == grad.getTargets() &&
        loss->getAttr("axes") == grad->getAttr("axes"))
      return loss;
  return {};
}

/// Whether every use of `v` is after `op` in op's block (in an op there, or
/// nested in one).
bool usedOnlyAfter(Value v, Operation *op) {
  Block *block = op->getBlock();
  return llvm::all_of(v.getUsers(), [&](Operation *user) {
    Operation *at = block->findAncestorOpInBlock(*user);
    return at && op->isBeforeInBlock(at);
  });
}

/// Whether `v` can be made before `at`: it is available there already, or it
/// is a short chain of pure scalar ops (cloning them costs nothing) from
/// constants and values available there.
bool materializable(Value v, Operation *at, DominanceInfo &dom, int depth = 0) {
  if (dom.properlyDominates(v, at))
    return true;
  Operation *def = v.getDefiningOp();
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!def || !type || type.getRank() != 0 || depth > 8 || def->getNumResults() != 1 ||
      def->getNumRegions() != 0 || !isPure(def) ||
      (def->getNumOperands() == 0 && !def->hasTrait<OpTrait::ConstantLike>()))
    return false;
  return llvm::all_of(def->getOperands(),
                      [&](Value operand) { return materializable(operand, at, dom, depth + 1); });
}

/// `v` made before `at` (materializable): itself, or its chain cloned before
/// `at` with at's discardable attributes (its pipeline segment and stage; the
/// loss seed keeps its mark).
Value materializeBefore(Value v, Operation *at, OpBuilder &b, DominanceInfo &dom) {
  if (dom.properlyDominates(v, at))
    return v;
  Operation *def = v.getDefiningOp();
  IRMapping map;
  for (Value operand : def->getOperands())
    map.map(operand, materializeBefore(operand, at, b, dom));
  Operation *clone = b.clone(*def, map);
  DictionaryAttr kept = def->getDiscardableAttrDictionary();
  clone->setDiscardableAttrs(at->getDiscardableAttrDictionary());
  if (Attribute seed = kept.get(PtcDialect::kLossSeedAttrName))
    clone->setAttr(PtcDialect::kLossSeedAttrName, seed);
  return clone->getResult(0);
}

/// Erases `v`'s defining op and, in turn, its operands' where nothing else
/// reads them (a seed chain left without its gradient).
void eraseIfDead(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def || !def->use_empty() || !isPure(def))
    return;
  SmallVector<Value> operands(def->getOperands());
  def->erase();
  for (Value operand : operands)
    eraseIfDead(operand);
}

/// Fuses the gradient `grad` (a Grad op) with the loss of the same logits
/// into a Fused op, where there is one and the seed can be made before the
/// fused op's place.
template <typename Loss, typename Fused, typename Grad>
void fuseWithLoss(Grad grad, DominanceInfo &dom) {
  Loss loss = lossOf<Loss>(grad);
  if (!loss)
    return;
  // At the gradient where the loss is read only after it; else at the loss,
  // with the seed computed there.
  Operation *at =
      usedOnlyAfter(loss.getResult(), grad) ? grad.getOperation() : loss.getOperation();
  Value seed = grad.getGrad();
  if (!materializable(seed, at, dom))
    return;
  OpBuilder b(at);
  Value seedHere = materializeBefore(seed, at, b, dom);
  // The same operands with the seed made here, the gradient's attributes
  // (a vocabulary-parallel one's axes) and the place's discardable ones.
  OperationState state(at->getLoc(), Fused::getOperationName());
  state.addOperands({grad.getLogits(), grad.getTargets(), seedHere});
  state.addTypes({grad.getResult().getType(), loss.getResult().getType()});
  state.propertiesAttr = grad->getPropertiesAsAttribute();
  auto fused = cast<Fused>(b.create(state));
  fused->setDiscardableAttrs(at->getDiscardableAttrDictionary());
  loss.getResult().replaceAllUsesWith(fused.getLoss());
  grad.getResult().replaceAllUsesWith(fused.getLogitsGrad());
  loss.erase();
  grad.erase();
  if (seedHere != seed)
    eraseIfDead(seed);
}

struct FuseCrossEntropyGradPass
    : public mlir::ptc::impl::FuseCrossEntropyGradPassBase<FuseCrossEntropyGradPass> {
  void runOnOperation() override {
    SmallVector<Operation *> grads;
    getOperation().walk([&](Operation *op) {
      if (isa<CrossEntropyGradOp, VocabParallelCrossEntropyGradOp>(op))
        grads.push_back(op);
    });
    DominanceInfo dom(getOperation());
    for (Operation *op : grads) {
      if (auto grad = dyn_cast<CrossEntropyGradOp>(op))
        fuseWithLoss<CrossEntropyOp, CrossEntropyWithGradOp>(grad, dom);
      else
        fuseWithLoss<VocabParallelCrossEntropyOp, VocabParallelCrossEntropyWithGradOp>(
            cast<VocabParallelCrossEntropyGradOp>(op), dom);
    }
  }
};
} // namespace
