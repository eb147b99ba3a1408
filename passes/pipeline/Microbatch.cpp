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
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_MICROBATCHPASS
#include "passes/pipeline/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
// Per value: the batch dimension (>= 0), no batch (kNone), or a per-micro-batch
// mean / sum over the batch (a loss).
constexpr int kNone = -1, kMean = -2, kSum = -3;

int rankOf(Value v) { return static_cast<int>(cast<RankedTensorType>(v.getType()).getRank()); }

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
    auto reducedIn = llvm::find_if(in, [](int d) { return d <= kMean; });
    bool anyReduced = reducedIn != in.end();
    auto batchDims = [&](ArrayRef<int> ds) {
      SmallVector<int> out;
      for (int d : ds)
        if (d >= 0)
          out.push_back(d);
      return out;
    };
    // Linear ops may carry a per-micro-batch loss along.
    if (anyReduced) {
      int kind = *reducedIn;
      if (!isa<AddOp, SubOp, MulOp, DivOp, ScaleOp, ConvertOp>(op))
        return err("it uses a per-micro-batch loss non-linearly");
      for (auto [i, d] : llvm::enumerate(in)) {
        if (d >= 0)
          return err("it combines a loss with a per-example value");
        if (d <= kMean && d != kind)
          return err("it combines a mean and a sum over the batch");
        if (d <= kMean && i == 1 && isa<MulOp, DivOp>(op) && in[0] <= kMean)
          return err("it multiplies two losses");
        if (i == 1 && d <= kMean && isa<DivOp>(op))
          return err("it divides by a loss");
      }
      return kind;
    }
    return llvm::TypeSwitch<Operation *, FailureOr<int>>(op)
        .Case<AddOp, SubOp, MulOp, DivOp>([&](Operation *o) -> FailureOr<int> {
          int r = rankOf(o->getResult(0)), out = kNone;
          for (auto [v, d] : llvm::zip(o->getOperands(), in)) {
            if (d < 0)
              continue;
            int mapped = d + r - rankOf(v);
            if (out != kNone && out != mapped)
              return err("its operands' batch dimensions do not line up");
            out = mapped;
          }
          return out;
        })
        .Case<ScaleOp, ConvertOp, GeluOp, ReluOp>([&](Operation *) { return in[0]; })
        .Case([&](LayerNormOp o) -> FailureOr<int> {
          if (in[1] >= 0 || in[2] >= 0 || in[0] == rankOf(o.getInput()) - 1)
            return err("it normalizes over the batch dimension");
          return in[0];
        })
        .Case([&](SoftmaxOp o) -> FailureOr<int> {
          int64_t axis = o.getAxis() < 0 ? o.getAxis() + rankOf(o.getInput()) : o.getAxis();
          if (axis == in[0])
            return err("its axis is the batch dimension");
          return in[0];
        })
        .Case([&](CausalAttentionOp o) -> FailureOr<int> {
          if (in[0] != in[1] || in[0] != in[2] || in[0] >= rankOf(o.getQuery()) - 2)
            return err("q, k and v must share a leading batch dimension");
          return in[0];
        })
        .Case([&](MatmulOp o) -> FailureOr<int> {
          int rl = rankOf(o.getLhs()), rr = rankOf(o.getRhs()), r = rankOf(o.getResult());
          int lRow = o.getTransposeLhs() ? rl - 1 : rl - 2;
          int rCol = o.getTransposeRhs() ? rr - 2 : rr - 1;
          int out = kNone;
          if (in[0] >= 0) {
            if (in[0] < rl - 2)
              out = in[0] + r - rl;
            else if (in[0] == lRow)
              out = r - 2;
            else
              return err("it contracts over the batch dimension");
          }
          if (in[1] >= 0) {
            int mapped;
            if (in[1] < rr - 2)
              mapped = in[1] + r - rr;
            else if (in[1] == rCol)
              mapped = r - 1;
            else
              return err("it contracts over the batch dimension");
            if (out != kNone && out != mapped)
              return err("both operands are per-example along different dimensions");
            out = mapped;
          }
          return out;
        })
        .Case([&](EmbeddingOp) -> FailureOr<int> {
          if (in[0] >= 0)
            return err("the table depends on the batch");
          return in[1];
        })
        .Case([&](CrossEntropyOp o) -> FailureOr<int> {
          if (in[0] == rankOf(o.getLogits()) - 1)
            return err("the classes are the batch dimension");
          return kMean;
        })
        .Case([&](TransposeOp o) -> FailureOr<int> {
          for (auto [i, p] : llvm::enumerate(o.getPermutation()))
            if (p == in[0])
              return static_cast<int>(i);
          return err("bad permutation");
        })
        .Case([&](ReshapeOp o) -> FailureOr<int> {
          ArrayRef<int64_t> src = o.getInput().getType().getShape();
          ArrayRef<int64_t> dst = o.getType().getShape();
          int64_t prefix = 1;
          for (int i = 0; i < in[0]; ++i)
            prefix *= src[i];
          int64_t p = 1;
          for (size_t e = 0; e < dst.size(); ++e) {
            if (p == prefix && dst[e] % count == 0)
              return static_cast<int>(e);
            p *= dst[e];
            if (p > prefix)
              break;
          }
          return err("the batch dimension does not survive the reshape");
        })
        .Case([&](SliceOp o) -> FailureOr<int> {
          if (o.getInput().getType().getDimSize(in[0]) * count != o.getType().getDimSize(in[0]))
            return err("it slices the batch dimension");
          return in[0];
        })
        .Case([&](ConcatOp o) -> FailureOr<int> {
          SmallVector<int> ds = batchDims(in);
          int64_t axis = o.getAxis() < 0 ? o.getAxis() + rankOf(o.getResult()) : o.getAxis();
          if (ds.size() != in.size() || llvm::any_of(ds, [&](int d) { return d != ds[0]; }) ||
              axis == ds[0])
            return err("its operands must all be per-example along one dimension, not the axis");
          return ds[0];
        })
        .Case<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>([&](Operation *o) -> FailureOr<int> {
          auto axes = o->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
          bool keep = o->hasAttr("keep_dims") &&
                      cast<BoolAttr>(o->getAttr("keep_dims")).getValue();
          int r = rankOf(o->getOperand(0)), shift = 0;
          for (int64_t a : axes) {
            int64_t n = a < 0 ? a + r : a;
            if (n == in[0]) {
              if (isa<ReduceMaxOp>(o))
                return err("a maximum over the batch is not a sum of micro-batch maxima");
              return isa<ReduceSumOp>(o) ? kSum : kMean;
            }
            if (n < in[0] && !keep)
              ++shift;
          }
          return in[0] - shift;
        })
        .Default([&](Operation *) -> FailureOr<int> {
          return err("no micro-batch rule for this op (MoE routing depends on the whole batch)");
        });
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
        in.push_back(it == dim.end() ? kNone : it->second);
        any |= in.back() != kNone;
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
      if (it == dim.end() || it->second == kNone)
        continue;
      if (it->second >= 0)
        return ret.emitOpError() << "returns per-example result #" << operand.getOperandNumber()
                                 << ", which cannot be split into micro-batches";
      if (it->second == kMean)
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
