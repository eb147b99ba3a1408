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

/// The gradient of a value split by slices that tile one axis (the fused
/// QKV projection's q, k and v) arrives as a sum of pads; it is the
/// concatenation of the slices' gradients, built in one pass instead of a
/// pad per slice and an add per pair. `root` is the last add of such a sum.
void foldTiledPadSum(AddOp root, OpBuilder &b) {
  SmallVector<PadOp> pads;
  SmallVector<AddOp> adds{root};
  for (size_t i = 0; i < adds.size(); ++i)
    for (Value operand : adds[i]->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def || !operand.hasOneUse())
        return;
      if (auto add = dyn_cast<AddOp>(def))
        adds.push_back(add);
      else if (auto pad = dyn_cast<PadOp>(def))
        pads.push_back(pad);
      else
        return;
    }
  auto type = cast<RankedTensorType>(root.getType());
  if (pads.size() < 2 || llvm::any_of(adds, [&](AddOp a) { return a.getType() != type; }))
    return;
  // One axis, each pad a full box elsewhere, the boxes tiling the axis.
  int64_t axis = -1;
  for (PadOp pad : pads) {
    auto in = cast<RankedTensorType>(pad.getInput().getType());
    if (pad.getType() != type)
      return;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (in.getDimSize(d) != type.getDimSize(d)) {
        if (axis >= 0 && axis != d)
          return;
        axis = d;
      } else if (pad.getOffsets()[d] != 0) {
        return;
      }
  }
  if (axis < 0)
    return;
  llvm::sort(pads, [&](PadOp x, PadOp y) { return x.getOffsets()[axis] < y.getOffsets()[axis]; });
  int64_t next = 0;
  for (PadOp pad : pads) {
    if (pad.getOffsets()[axis] != next)
      return;
    next += cast<RankedTensorType>(pad.getInput().getType()).getDimSize(axis);
  }
  if (next != type.getDimSize(axis))
    return;
  SmallVector<Value> parts;
  for (PadOp pad : pads)
    parts.push_back(pad.getInput());
  b.setInsertionPoint(root);
  auto concat = ConcatOp::create(b, root.getLoc(), type, parts, b.getI64IntegerAttr(axis));
  concat->setDiscardableAttrs(root->getDiscardableAttrDictionary());
  root.getResult().replaceAllUsesWith(concat.getResult());
  for (AddOp add : adds)
    add.erase();
  for (PadOp pad : pads)
    pad.erase();
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

  {
    // Roots of backward sums (an add no other add consumes alone).
    llvm::SmallPtrSet<Operation *, 32> isForward(forward.begin(), forward.end());
    SmallVector<AddOp> roots;
    for (Operation &op : block.without_terminator())
      if (auto add = dyn_cast<AddOp>(op); add && !isForward.contains(&op) &&
                                          !(add->hasOneUse() && isa<AddOp>(*add->user_begin())))
        roots.push_back(add);
    for (AddOp root : roots)
      foldTiledPadSum(root, b);
    b.setInsertionPoint(ret);
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
    if (failed(checkDropoutStreams(func)) || failed(differentiate(func, lossScale)))
      signalPassFailure();
  }

  /// Two dropouts of the model with one stream would draw the same masks:
  /// each needs its own (the gradients autodiff adds share their forward's).
  static LogicalResult checkDropoutStreams(func::FuncOp func) {
    llvm::DenseMap<int64_t, DropoutOp> byStream;
    WalkResult r = func.walk([&](DropoutOp d) {
      auto [it, inserted] = byStream.try_emplace(d.getStream(), d);
      if (inserted)
        return WalkResult::advance();
      InFlightDiagnostic diag = d.emitOpError()
                                << "has stream " << d.getStream()
                                << ", which another dropout has: they would draw the same masks";
      diag.attachNote(it->second.getLoc()) << "the other dropout";
      return WalkResult::interrupt();
    });
    return failure(r.wasInterrupted());
  }
};
} // namespace
