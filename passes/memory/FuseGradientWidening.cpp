//===- FuseGradientWidening.cpp - updates read low-precision gradients ----===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSEGRADIENTWIDENINGPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

Value mlir::ptc::narrowSourceOf(Value v) {
  auto convert = v.getDefiningOp<ConvertOp>();
  if (!convert || !getElementTypeOrSelf(v.getType()).isF32())
    return {};
  Type from = getElementTypeOrSelf(convert.getInput().getType());
  return from.isBF16() || from.isF16() ? convert.getInput() : Value();
}

namespace {
/// The low-precision gradient `grad` widens, when that widening feeds
/// nothing else; else null.
Value narrowGradient(Value grad) { return grad.hasOneUse() ? narrowSourceOf(grad) : Value(); }

struct FuseGradientWideningPass
    : mlir::ptc::impl::FuseGradientWideningPassBase<FuseGradientWideningPass> {
  void runOnOperation() override {
    getOperation().walk([&](Operation *op) {
      // On the host the update's tensors stay f32 (the plan keeps
      // low-precision tensors on the device).
      auto update = dyn_cast<FusedUpdateOpInterface>(op);
      if (!update || op->hasAttr(PtcDialect::kOnHostAttrName))
        return;
      OpOperand &gradOperand = update.getGradMutable();
      Value narrow = narrowGradient(gradOperand.get());
      if (!narrow)
        return;
      Operation *convert = gradOperand.get().getDefiningOp();
      gradOperand.set(narrow);
      convert->erase();
    });
  }
};
} // namespace
