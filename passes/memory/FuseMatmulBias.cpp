//===- FuseMatmulBias.cpp - bias adds as matmul epilogues -----------------===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSEMATMULBIASPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The bias `add` adds to its matmul operand, or null: the other operand is
/// a vector of the result's last dimension (broadcast over every row), of
/// the same element type, and the add's result has the matmul's type.
Value biasOf(AddOp add, MatmulOp mm) {
  Value other = add.getLhs() == mm.getResult() ? add.getRhs() : add.getLhs();
  auto type = cast<RankedTensorType>(other.getType());
  RankedTensorType result = mm.getType();
  if (other == mm.getResult() || add.getType() != result || type.getRank() != 1 ||
      type.getDimSize(0) != result.getShape().back() ||
      type.getElementType() != result.getElementType())
    return {};
  return other;
}

struct FuseMatmulBiasPass : mlir::ptc::impl::FuseMatmulBiasPassBase<FuseMatmulBiasPass> {
  void runOnOperation() override {
    SmallVector<AddOp> adds;
    getOperation().walk([&](AddOp add) { adds.push_back(add); });
    for (AddOp add : adds)
      for (Value operand : add->getOperands()) {
        auto mm = operand.getDefiningOp<MatmulOp>();
        if (mm && fuse(add, mm))
          break;
      }
  }

  /// Folds `add` into `mm` when the matmul feeds nothing else, has no bias
  /// yet and the two ops carry the same discardable attributes (the same
  /// pipeline stage and segment, both forward or both backward).
  bool fuse(AddOp add, MatmulOp mm) {
    if (mm.getBias() || !mm->hasOneUse() ||
        mm->getDiscardableAttrDictionary() != add->getDiscardableAttrDictionary())
      return false;
    Value bias = biasOf(add, mm);
    if (!bias)
      return false;
    // Where the matmul was, unless the bias is defined after it (converted
    // between the two, say): then at the add, where every operand is.
    Operation *def = bias.getDefiningOp();
    bool biasLater = def && def->getBlock() == mm->getBlock() && mm->isBeforeInBlock(def);
    OpBuilder b(biasLater ? add.getOperation() : mm.getOperation());
    auto fused = MatmulOp::create(b, mm.getLoc(), mm.getType(), mm.getLhs(), mm.getRhs(), bias,
                                  mm.getTransposeLhs(), mm.getTransposeRhs());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    add.getResult().replaceAllUsesWith(fused.getResult());
    add.erase();
    mm.erase();
    return true;
  }
};
} // namespace
