//===- Microbatch.cpp - split the batch of a model into micro-batches -----===//
//
// Runs on the forward model (before ptc-autodiff). Every value that depends on
// the inputs gets the shape of one micro-batch: its batch dimension, tracked
// from the inputs' first dimension through each op, shrinks by the count M.
// The loss of a micro-batch is a mean over B/M rows; the step's loss is the
// mean of the M micro-batch losses, so the returned loss is scaled by 1/M and
// ptc-autodiff puts a `ptc.microbatch_sum` on it and on every gradient.
//
//===----------------------------------------------------------------------===//

#include "passes/pipeline/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_MICROBATCHPASS
#include "passes/pipeline/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
// Per value: the batch dimension (>= 0), no batch (kNoBatch), or a per-micro-batch
// mean / sum over the batch (kBatchMean, kBatchSum: a loss). Each op says how
// it carries the batch (MicrobatchOpInterface, dialects/ptc/PtcMicrobatchRules.cpp).

struct Microbatcher {
  Microbatcher(func::FuncOp func, int64_t count, int64_t dataParallel)
      : func(func), count(count), dataParallel(std::max<int64_t>(dataParallel, 1)) {}
  func::FuncOp func;
  int64_t count, dataParallel;
  llvm::DenseMap<Value, int> dim;

  FailureOr<int> rule(Operation *op, SmallVector<int> &in) {
    auto err = [&](const Twine &why) -> FailureOr<int> {
      return op->emitOpError() << "cannot be split into micro-batches: " << why;
    };
    auto reducedIn = llvm::find_if(in, [](int d) { return d <= kBatchMean; });
    bool anyReduced = reducedIn != in.end();
    // Linear ops may carry a per-micro-batch loss along.
    if (anyReduced) {
      int kind = *reducedIn;
      if (!isa<AddOp, SubOp, MulOp, DivOp, ScaleOp, ConvertOp>(op))
        return err("it uses a per-micro-batch loss non-linearly");
      for (auto [i, d] : llvm::enumerate(in)) {
        if (d >= 0)
          return err("it combines a loss with a per-example value");
        if (d <= kBatchMean && d != kind)
          return err("it combines a mean and a sum over the batch");
        if (d <= kBatchMean && i == 1 && isa<MulOp, DivOp>(op) && in[0] <= kBatchMean)
          return err("it multiplies two losses");
        if (i == 1 && d <= kBatchMean && isa<DivOp>(op))
          return err("it divides by a loss");
      }
      return kind;
    }
    if (auto rule = dyn_cast<MicrobatchOpInterface>(op))
      return rule.inferBatchDim(in, count);
    return err("no micro-batch rule for this op (MoE routing depends on the whole batch)");
  }

  LogicalResult run() {
    Block &block = func.getBody().front();
    for (BlockArgument arg : block.getArguments()) {
      if (!func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName))
        continue;
      auto type = cast<RankedTensorType>(arg.getType());
      if (type.getRank() == 0 || type.getDimSize(0) % (count * dataParallel) != 0) {
        InFlightDiagnostic diag =
            func.emitError() << "input '"
                             << func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                                  PtcDialect::kInputAttrName)
                                    .getValue()
                             << "' of type " << type << ": its batch of "
                             << (type.getRank() ? type.getDimSize(0) : 1)
                             << " rows does not split into " << count << " micro-batches";
        if (dataParallel > 1)
          diag << " x " << dataParallel << " data-parallel ranks";
        return diag;
      }
      dim[arg] = 0;
      SmallVector<int64_t> shape(type.getShape());
      shape[0] /= count;
      arg.setType(RankedTensorType::get(shape, type.getElementType()));
    }
    for (Operation &op : block.without_terminator()) {
      SmallVector<int> in;
      bool any = false;
      for (Value v : op.getOperands()) {
        auto it = dim.find(v);
        in.push_back(it == dim.end() ? kNoBatch : it->second);
        any |= in.back() != kNoBatch;
      }
      if (!any)
        continue;
      FailureOr<int> d = rule(&op, in);
      if (failed(d))
        return failure();
      for (Value r : op.getResults()) {
        dim[r] = *d;
        if (*d < 0)
          continue;
        auto type = cast<RankedTensorType>(r.getType());
        if (type.getDimSize(*d) % count != 0)
          return op.emitOpError() << "dimension " << *d << " (" << type.getDimSize(*d)
                                  << ") of its result does not split into " << count
                                  << " micro-batches";
        SmallVector<int64_t> shape(type.getShape());
        shape[*d] /= count;
        r.setType(RankedTensorType::get(shape, type.getElementType()));
      }
    }
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    OpBuilder b(ret);
    for (OpOperand &operand : ret->getOpOperands()) {
      auto it = dim.find(operand.get());
      if (it == dim.end() || it->second == kNoBatch)
        continue;
      if (it->second >= 0)
        return ret.emitOpError() << "returns per-example result #" << operand.getOperandNumber()
                                 << ", which cannot be split into micro-batches";
      if (it->second == kBatchMean)
        operand.set(ScaleOp::create(b, ret.getLoc(), operand.get(),
                                    b.getF64FloatAttr(1.0 / static_cast<double>(count))));
    }
    func.setFunctionType(
        FunctionType::get(func.getContext(), block.getArgumentTypes(), ret.getOperandTypes()));
    func->setAttr(PtcDialect::kMicrobatchesAttrName, b.getI64IntegerAttr(count));
    return success();
  }
};

struct MicrobatchPass : mlir::ptc::impl::MicrobatchPassBase<MicrobatchPass> {
  using MicrobatchPassBase::MicrobatchPassBase;
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    if (count < 1) {
      func.emitError() << "micro-batch count must be >= 1, got " << static_cast<int64_t>(count);
      return signalPassFailure();
    }
    if (func->hasAttr(PtcDialect::kMicrobatchesAttrName)) {
      func.emitError() << "is already split into micro-batches";
      return signalPassFailure();
    }
    Microbatcher m(func, count, dataParallel);
    if (failed(m.run()))
      signalPassFailure();
  }
};
} // namespace
