//===- FuseSwiglu.cpp - silu(gate) * up and its gradient in one op each ---===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSESWIGLUPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The operand of the two-operand `op` that is not `v`, or null when neither
/// or both are `v`.
Value otherOperand(Operation *op, Value v) {
  Value lhs = op->getOperand(0), rhs = op->getOperand(1);
  if (lhs == v && rhs != v)
    return rhs;
  if (rhs == v && lhs != v)
    return lhs;
  return {};
}

bool sameAttrs(Operation *a, Operation *b) {
  return a->getDiscardableAttrDictionary() == b->getDiscardableAttrDictionary();
}

/// The backward half of a SwiGLU whose activation is `silu` (silu(gate) *
/// up): dup = g * silu(gate) (`upGrad`), t = g * up and dgate =
/// silu_grad(gate, t) (`tMul`, `gateGrad`), all of one type and with the same
/// discardable attributes.
struct Backward {
  MulOp upGrad, tMul;
  SiluGradOp gateGrad;
};

std::optional<Backward> matchBackward(SiluOp silu, MulOp upGrad, Value up) {
  Value g = otherOperand(upGrad, silu.getResult());
  if (!g || g.getType() != silu.getType() || upGrad.getType() != silu.getType())
    return std::nullopt;
  for (Operation *user : g.getUsers()) {
    auto tMul = dyn_cast<MulOp>(user);
    if (!tMul || tMul == upGrad || otherOperand(tMul, g) != up || !tMul->hasOneUse() ||
        tMul.getType() != silu.getType() || tMul->getBlock() != upGrad->getBlock())
      continue;
    auto gateGrad = dyn_cast<SiluGradOp>(*tMul->getUsers().begin());
    if (!gateGrad || gateGrad.getInput() != silu.getInput() ||
        gateGrad.getGrad() != tMul.getResult() || !sameAttrs(tMul, upGrad) ||
        !sameAttrs(gateGrad, upGrad))
      continue;
    return Backward{upGrad, tMul, gateGrad};
  }
  return std::nullopt;
}

struct FuseSwigluPass : mlir::ptc::impl::FuseSwigluPassBase<FuseSwigluPass> {
  void runOnOperation() override {
    SmallVector<SiluOp> silus;
    getOperation().walk([&](SiluOp op) { silus.push_back(op); });
    for (SiluOp silu : silus)
      fuse(silu);
  }

  /// Fuses the SwiGLU around `silu` when the activation feeds exactly its
  /// product with `up` (of its own type: no broadcast) and, in training, the
  /// backward's product of the incoming gradient with it: otherwise the
  /// activation would still be needed and the fused ops would compute it
  /// twice. Either of two products may be the forward one.
  void fuse(SiluOp silu) {
    Value s = silu.getResult();
    SmallVector<MulOp, 2> muls;
    for (Operation *user : s.getUsers()) {
      auto mul = dyn_cast<MulOp>(user);
      if (!mul || mul.getType() != silu.getType() || muls.size() == 2)
        return;
      muls.push_back(mul);
    }
    for (size_t f = 0; f < muls.size(); ++f) {
      MulOp forward = muls[f];
      Value up = otherOperand(forward, s);
      if (!up || up.getType() != silu.getType() || !sameAttrs(forward, silu))
        continue;
      std::optional<Backward> backward;
      if (muls.size() == 2 && !(backward = matchBackward(silu, muls[1 - f], up)))
        continue;
      rewrite(silu, forward, up, backward);
      return;
    }
  }

  void rewrite(SiluOp silu, MulOp forward, Value up, std::optional<Backward> backward) {
    OpBuilder b(forward);
    auto fused = SwigluOp::create(b, forward.getLoc(), silu.getInput(), up);
    fused->setDiscardableAttrs(forward->getDiscardableAttrDictionary());
    forward.getResult().replaceAllUsesWith(fused.getResult());
    forward.erase();
    if (backward) {
      // Before the first of the two products, where the gate, up and the
      // gradient are all defined.
      Operation *first = backward->tMul->isBeforeInBlock(backward->upGrad)
                             ? backward->tMul.getOperation()
                             : backward->upGrad.getOperation();
      OpBuilder bb(first);
      Value g = otherOperand(backward->upGrad, silu.getResult());
      auto grad = SwigluGradOp::create(bb, backward->gateGrad.getLoc(), silu.getInput(), up, g);
      grad->setDiscardableAttrs(backward->gateGrad->getDiscardableAttrDictionary());
      backward->gateGrad.getResult().replaceAllUsesWith(grad.getGateGrad());
      backward->upGrad.getResult().replaceAllUsesWith(grad.getUpGrad());
      backward->gateGrad.erase();
      backward->tMul.erase();
      backward->upGrad.erase();
    }
    silu.erase();
  }
};
} // namespace
