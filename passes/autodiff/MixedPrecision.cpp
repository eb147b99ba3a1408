//===- MixedPrecision.cpp - low-precision compute, fp32 master weights ----===//

#include "passes/autodiff/Passes.h"
#include "runtime/base/option_values.h"

#include "mlir/IR/Builders.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "passes/autodiff/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::FloatDtype;

namespace {
RankedTensorType withElement(Type t, Type element) {
  auto ranked = cast<RankedTensorType>(t);
  return RankedTensorType::get(ranked.getShape(), element);
}

bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

struct MixedPrecisionPass : mlir::ptc::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  using MixedPrecisionPassBase::MixedPrecisionPassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    OpBuilder b(func.getContext());
    Type low;
    const std::optional<FloatDtype> kind = parseOption<FloatDtype>(dtype);
    if (kind == FloatDtype::Bf16)
      low = b.getBF16Type();
    else if (kind == FloatDtype::F16)
      low = b.getF16Type();
    else {
      func.emitError() << "mixed precision dtype must be bf16 or f16, got '" << dtype << "'";
      return signalPassFailure();
    }
    Type f32 = b.getF32Type();
    Block &block = func.getBody().front();
    auto convert = [&](Value v, Type element) -> Value {
      return ConvertOp::create(b, v.getLoc(), withElement(v.getType(), element), v);
    };

    // Arguments (master weights, float inputs): one conversion each, right
    // before the argument's first use. Reverse-mode autodiff then places the
    // conversion's VJP (the gradient widened to f32) right after that use's
    // gradient, so each layer's low-precision weight gradients are narrowed,
    // reduced and freed as the backward pass goes, instead of all waiting
    // for conversions at the end of it (10 GiB per device on a 7.5B GPT).
    for (BlockArgument arg : block.getArguments()) {
      if (!isFloatTensor(arg) || arg.use_empty())
        continue;
      if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kStateAttrName))
        continue; // state the model reads (an MoE selection bias) stays f32
      if (!cast<RankedTensorType>(arg.getType()).getElementType().isF32()) {
        func.emitError() << "argument #" << arg.getArgNumber()
                         << " must be f32 (the master copy), got " << arg.getType();
        return signalPassFailure();
      }
      Operation *first = nullptr;
      for (Operation *user : arg.getUsers()) {
        Operation *top = block.findAncestorOpInBlock(*user);
        if (top && (!first || top->isBeforeInBlock(first)))
          first = top;
      }
      if (first)
        b.setInsertionPoint(first);
      else
        b.setInsertionPointToStart(&block);
      Value c = convert(arg, low);
      arg.replaceAllUsesExcept(c, c.getDefiningOp());
    }

    for (Operation &op : llvm::make_early_inc_range(block.without_terminator())) {
      if (isa<arith::ConstantOp>(op) || (isa<ConvertOp>(op) && op.getBlock() == &block &&
                                         op.getOperand(0).getDefiningOp() == nullptr))
        continue;
      b.setInsertionPoint(&op);
      if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
        // The loss in f32: logits converted up, the result stays f32.
        if (!ce.getLogits().getType().getElementType().isF32())
          ce.getLogitsMutable().assign(convert(ce.getLogits(), f32));
        continue;
      }
      if (isa<TopKGateOp, ExpertLoadOp>(op) || op.hasAttr(PtcDialect::kKeepF32AttrName)) {
        // MoE routing in f32: the router's logits (its matmul marked
        // ptc.keep_f32), the softmax and top-k choice over them, f32 weights
        // and loads (converted down where they are used).
        for (OpOperand &operand : op.getOpOperands())
          if (isFloatTensor(operand.get()) &&
              !cast<RankedTensorType>(operand.get().getType()).getElementType().isF32())
            operand.set(convert(operand.get(), f32));
        continue;
      }
      for (OpOperand &operand : op.getOpOperands()) {
        Value v = operand.get();
        if (isFloatTensor(v) && cast<RankedTensorType>(v.getType()).getElementType() != low)
          operand.set(convert(v, low));
      }
      for (Value r : op.getResults())
        if (isFloatTensor(r))
          r.setType(withElement(r.getType(), low));
    }
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    b.setInsertionPoint(ret);
    for (OpOperand &operand : ret->getOpOperands())
      if (isFloatTensor(operand.get()) &&
          !cast<RankedTensorType>(operand.get().getType()).getElementType().isF32())
        operand.set(convert(operand.get(), f32));
    func.setFunctionType(
        FunctionType::get(func.getContext(), block.getArgumentTypes(), ret.getOperandTypes()));
  }
};
} // namespace
