//===- FuseGradientWidening.cpp - updates read low-precision gradients ----===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSEGRADIENTWIDENINGPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The low-precision gradient `grad` widens, when it is the result of a
/// `ptc.convert` from bf16 or f16 to f32 that feeds nothing else; else null.
Value narrowGradient(Value grad) {
  auto convert = grad.getDefiningOp<ConvertOp>();
  if (!convert || !convert->hasOneUse())
    return {};
  Type from = getElementTypeOrSelf(convert.getInput().getType());
  if (!getElementTypeOrSelf(grad.getType()).isF32() || !(from.isBF16() || from.isF16()))
    return {};
  return convert.getInput();
}

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
