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
        tMul.getType() != silu.getType())
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
  /// twice.
  void fuse(SiluOp silu) {
    auto isUp = [&](Value v) { return v && v.getType() == silu.getType(); };
    Value s = silu.getResult();
    MulOp forward;
    Value up;
    SmallVector<MulOp, 1> others;
    for (Operation *user : s.getUsers()) {
      auto mul = dyn_cast<MulOp>(user);
      if (!mul || mul.getType() != silu.getType())
        return;
      if (!forward && sameAttrs(mul, silu) && otherOperand(mul, s))
        forward = mul;
      else
        others.push_back(mul);
    }
    if (!forward || others.size() > 1)
      return;
    up = otherOperand(forward, s);
    if (!isUp(up))
      return;
    std::optional<Backward> backward;
    if (!others.empty()) {
      // Either product may be the forward one: the backward's is the one
      // whose other operand is a gradient that meets `up` too.
      backward = matchBackward(silu, others[0], up);
      if (!backward) {
        std::swap(forward, others[0]);
        up = otherOperand(forward, s);
        if (!sameAttrs(forward, silu) || !isUp(up))
          return;
        backward = matchBackward(silu, others[0], up);
      }
      if (!backward)
        return;
    }
    OpBuilder b(forward);
    auto fused = SwigluOp::create(b, forward.getLoc(), silu.getInput(), up);
    for (NamedAttribute a : forward->getDiscardableAttrs())
      fused->setAttr(a.getName(), a.getValue());
    forward.getResult().replaceAllUsesWith(fused.getResult());
    forward.erase();
    if (backward) {
      // Before the first of the two products, where the gate, up and the
      // gradient are all defined.
      Operation *first = backward->tMul->isBeforeInBlock(backward->upGrad)
                             ? backward->tMul.getOperation()
                             : backward->upGrad.getOperation();
      OpBuilder bb(first);
      Value g = otherOperand(backward->upGrad, s);
      auto grad = SwigluGradOp::create(bb, backward->gateGrad.getLoc(), silu.getInput(), up, g);
      for (NamedAttribute a : backward->gateGrad->getDiscardableAttrs())
        grad->setAttr(a.getName(), a.getValue());
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
