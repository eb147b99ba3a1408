//===- Autodiff.cpp - reverse-mode AD over ptc ops ------------------------===//

#include "passes/autodiff/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "passes/autodiff/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {

bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

Value splatConstant(OpBuilder &b, Location loc, Type type, double value) {
  auto t = cast<RankedTensorType>(type);
  auto attr = DenseElementsAttr::get(t, b.getFloatAttr(t.getElementType(), value));
  return arith::ConstantOp::create(b, loc, attr);
}

LogicalResult differentiate(func::FuncOp func, double lossScale) {
  if (!func.getBody().hasOneBlock())
    return func.emitOpError() << "ptc-autodiff expects a function with a single block";
  Block &block = func.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  // The loss, then any number of metrics (ptc.metric results: reported,
  // not differentiated).
  unsigned metrics = 0;
  for (unsigned i = 1; i < ret.getNumOperands(); ++i)
    metrics += static_cast<bool>(func.getResultAttr(i, PtcDialect::kMetricAttrName));
  if (ret.getNumOperands() != 1 + metrics || !isFloatTensor(ret.getOperand(0)) ||
      cast<RankedTensorType>(ret.getOperand(0).getType()).getRank() != 0)
    return func.emitOpError() << "ptc-autodiff expects the function to return one scalar float "
                                 "loss (then only 'ptc.metric' results), got "
                              << ret.getNumOperands() << " results";
  Value loss = ret.getOperand(0);

  // Values that depend on a parameter (forward) ...
  llvm::DenseSet<Value> active;
  SmallVector<BlockArgument> params;
  for (BlockArgument arg : block.getArguments())
    if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName)) {
      params.push_back(arg);
      active.insert(arg);
    }
  for (Operation &op : block.without_terminator())
    if (llvm::any_of(op.getOperands(), [&](Value v) { return active.contains(v); }))
      for (Value r : op.getResults())
        if (isFloatTensor(r))
          active.insert(r);
  // ... and that the loss depends on (backward).
  llvm::DenseSet<Value> useful{loss};
  for (Operation &op : llvm::reverse(block.without_terminator()))
    if (llvm::any_of(op.getResults(), [&](Value v) { return useful.contains(v); }))
      for (Value v : op.getOperands())
        useful.insert(v);
  auto needsGrad = [&](Value v) { return active.contains(v) && useful.contains(v); };

  OpBuilder b(ret);
  llvm::DenseMap<Value, Value> grads;
  auto accumulate = [&](Value v, Value g, Location loc) {
    auto [it, inserted] = grads.try_emplace(v, g);
    if (!inserted)
      it->second = AddOp::create(b, loc, it->second, g);
  };
  SmallVector<Operation *> forward;
  for (Operation &op : block.without_terminator())
    forward.push_back(&op);
  const bool microbatched = func->hasAttr(PtcDialect::kMicrobatchesAttrName);
  llvm::DenseMap<Operation *, size_t> forwardId;
  if (microbatched)
    for (auto [i, op] : llvm::enumerate(forward)) {
      forwardId[op] = i;
      op->setAttr(PtcDialect::kForwardIdAttrName, b.getI64IntegerAttr(static_cast<int64_t>(i)));
    }
  if (needsGrad(loss)) {
    grads[loss] = splatConstant(b, func.getLoc(), loss.getType(), lossScale);
    // Dynamic loss scaling (ptc-optimizer) replaces the seed by the scale.
    grads[loss].getDefiningOp()->setAttr(PtcDialect::kLossSeedAttrName, b.getUnitAttr());
  }
  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= static_cast<bool>(resultGrads.back());
    }
    if (!any)
      continue;
    SmallVector<bool> needed;
    for (Value v : op->getOperands())
      needed.push_back(isFloatTensor(v) && needsGrad(v));
    if (llvm::none_of(needed, [](bool n) { return n; }))
      continue;
    auto differentiable = dyn_cast<DifferentiableOpInterface>(op);
    if (!differentiable)
      return op->emitOpError() << "has no reverse-mode rule, but the loss depends on it "
                                  "through a parameter";
    SmallVector<Value> operandGrads;
    Operation *before = ret->getPrevNode();
    if (failed(differentiable.buildVjp(b, resultGrads, needed, operandGrads)))
      return failure();
    for (auto [operand, g, need] : llvm::zip(op->getOperands(), operandGrads, needed))
      if (need && g)
        accumulate(operand, g, op->getLoc());
    // In a micro-batched step, pipeline stage splitting places each backward
    // op with the forward op it differentiates.
    if (microbatched) {
      auto id = b.getI64IntegerAttr(static_cast<int64_t>(forwardId.lookup(op)));
      for (Operation *o = before ? before->getNextNode() : &block.front(); o != ret;
           o = o->getNextNode())
        if (!o->hasAttr(PtcDialect::kVjpOfAttrName))
          o->setAttr(PtcDialect::kVjpOfAttrName, id);
    }
  }

  // Results: the loss, then every parameter's gradient in argument order.
  SmallVector<Value> results{loss};
  SmallVector<DictionaryAttr> resultAttrs{
      b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kLossAttrName, b.getUnitAttr()))};
  for (unsigned i = 1; i <= metrics; ++i) {
    results.push_back(ret.getOperand(i));
    resultAttrs.push_back(func.getResultAttrDict(i));
  }
  for (BlockArgument p : params) {
    Value g = grads.lookup(p);
    if (!g) // the loss does not use this parameter
      g = splatConstant(b, func.getLoc(), p.getType(), 0.0);
    else if (lossScale != 1.0)
      g = ScaleOp::create(b, func.getLoc(), g, b.getF64FloatAttr(1.0 / lossScale));
    results.push_back(g);
    auto name = func.getArgAttrOfType<StringAttr>(p.getArgNumber(), PtcDialect::kParamAttrName);
    resultAttrs.push_back(
        b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kGradAttrName, name)));
  }
  // A micro-batched step accumulates the loss and the gradients over its
  // micro-batches (ptc-microbatch).
  if (func->hasAttr(PtcDialect::kMicrobatchesAttrName))
    for (Value &v : results)
      v = MicrobatchSumOp::create(b, v.getLoc(), v);
  replaceReturn(func, results, resultAttrs);
  // Mark the backward pass, so that memory reports can tell which forward
  // values it keeps alive.
  llvm::SmallPtrSet<Operation *, 32> forwardOps(forward.begin(), forward.end());
  for (Operation &op : block.without_terminator())
    if (!forwardOps.contains(&op))
      op.setAttr(PtcDialect::kBackwardAttrName, b.getUnitAttr());
  return success();
}

struct AutodiffPass : mlir::ptc::impl::AutodiffPassBase<AutodiffPass> {
  using AutodiffPassBase::AutodiffPassBase;
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    bool hasParams = false;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      hasParams |= static_cast<bool>(func.getArgAttr(i, PtcDialect::kParamAttrName));
    if (!hasParams || func.isExternal())
      return;
    if (lossScale <= 0.0) {
      func.emitError() << "loss-scale must be > 0, got " << lossScale;
      return signalPassFailure();
    }
    if (failed(differentiate(func, lossScale)))
      signalPassFailure();
  }
};
} // namespace
