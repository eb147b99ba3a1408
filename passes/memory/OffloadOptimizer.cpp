//===- OffloadOptimizer.cpp - master weights and optimizer on the host ----===//
//
// ZeRO-Offload (Ren et al. 2021) as a placement of values: the parameters,
// the optimizer's state and the ops of each parameter's update move to host
// memory; gradients cross to the host and updated low-precision working
// copies cross back, each through one explicit ptc.transfer.

#include "passes/memory/Passes.h"
#include "runtime/base/option_values.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_OFFLOADOPTIMIZERPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::Offload;

bool mlir::ptc::isOnHost(Value value) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    return func && func.getArgAttr(arg.getArgNumber(), PtcDialect::kOnHostAttrName);
  }
  Operation *def = value.getDefiningOp();
  if (auto transfer = dyn_cast<TransferOp>(def))
    return transfer.toHost();
  return def->hasAttr(PtcDialect::kOnHostAttrName);
}

namespace {
/// Ops that must stay on the device: communication (a ShardSlice only reads
/// this rank's block and may run on the host), the gradient-wide ops
/// of the optimizer (they reduce over every gradient and over the mesh),
/// the loss scale, the learning-rate schedule and micro-batch accumulation.
bool staysOnDevice(Operation *op) {
  return isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, VocabParallelCrossEntropyOp,
             VocabParallelCrossEntropyGradOp, SendOp, RecvOp, MicrobatchSumOp, UnscaleGradsOp,
             AnyNonfiniteOp,
             ClipGradNormOp, LossScaleOp, LossScaleUpdateOp, LrScheduleOp, TransferOp>(op);
}

/// A pipelined step: the transfer runs in the chunk and segment of `op`
/// (the user it precedes, or the producer of a returned update).
void inheritPlacementInStep(Operation *transfer, Operation *op) {
  for (StringRef name : {PtcDialect::kStageAttrName, PtcDialect::kSegmentAttrName})
    if (Attribute a = op->getAttr(name))
      transfer->setAttr(name, a);
}

struct OffloadOptimizerPass : mlir::ptc::impl::OffloadOptimizerPassBase<OffloadOptimizerPass> {
  using OffloadOptimizerPassBase::OffloadOptimizerPassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (parseOption<Offload>(what) != Offload::Optimizer) {
      func.emitError() << "offload must be " << ::ptc::optionChoices<Offload>() << ", got '" << what << "'";
      return signalPassFailure();
    }
    if (func.isExternal() || func.getNumResults() == 0 ||
        !func.getResultAttr(0, PtcDialect::kLossAttrName))
      return;
    Block &block = func.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    llvm::StringMap<BlockArgument> argByName;
    for (BlockArgument arg : block.getArguments())
      for (StringRef role : {PtcDialect::kParamAttrName, PtcDialect::kStateAttrName})
        if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), role))
          argByName[name.getValue()] = arg;

    // The forward pass: every op the loss or a metric depends on.
    llvm::DenseSet<Operation *> forward;
    SmallVector<Operation *> work;
    auto reach = [&](Value v, llvm::DenseSet<Operation *> &set) {
      if (Operation *def = v.getDefiningOp(); def && set.insert(def).second)
        work.push_back(def);
    };
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      if (func.getResultAttr(i, PtcDialect::kLossAttrName) ||
          func.getResultAttr(i, PtcDialect::kMetricAttrName))
        reach(v, forward);
    while (!work.empty())
      for (Value operand : work.pop_back_val()->getOperands())
        reach(operand, forward);

    // The gradients the updates read: where the host's part begins.
    llvm::DenseSet<Value> gradients;
    func.walk([&](Operation *op) {
      if (auto update = dyn_cast<FusedUpdateOpInterface>(op))
        gradients.insert(update.getGradMutable().get());
      else if (op->hasAttr(PtcDialect::kOptimizerGradAttrName))
        gradients.insert(op->getOperand(0));
    });
    auto hostCapable = [&](Operation *op) {
      return !staysOnDevice(op) && !forward.contains(op) && !isa<arith::ConstantOp>(op);
    };

    // Host arguments: every parameter, and each state only host-capable ops read.
    llvm::SetVector<BlockArgument> hostArgs;
    for (BlockArgument arg : block.getArguments()) {
      unsigned i = arg.getArgNumber();
      if (func.getArgAttr(i, PtcDialect::kParamAttrName))
        hostArgs.insert(arg);
      else if (func.getArgAttr(i, PtcDialect::kStateAttrName) &&
               !func.getArgAttr(i, PtcDialect::kBiasBalancingAttrName) && !arg.use_empty() &&
               llvm::all_of(arg.getUsers(), hostCapable))
        hostArgs.insert(arg);
    }

    // Host ops: the updates of host arguments, back to the gradients.
    llvm::DenseSet<Operation *> host;
    SmallVector<std::pair<unsigned, BlockArgument>> hostUpdates;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto name = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kUpdateAttrName);
      if (!name)
        continue;
      BlockArgument target = argByName.lookup(name.getValue());
      if (!target || !hostArgs.contains(target))
        continue;
      hostUpdates.push_back({static_cast<unsigned>(i), target});
      if (Operation *def = v.getDefiningOp(); def && hostCapable(def) && host.insert(def).second)
        work.push_back(def);
    }
    while (!work.empty())
      for (Value operand : work.pop_back_val()->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (!def || gradients.contains(operand) || !hostCapable(def))
          continue;
        if (host.insert(def).second)
          work.push_back(def);
      }
    // A gradient widened to f32 for host ops only is widened on the host (the
    // low-precision bytes cross); a master weight is narrowed to its working
    // copy on the host (the same).
    for (Value g : gradients)
      if (auto convert = g.getDefiningOp<ConvertOp>();
          convert && !convert.getInput().getType().getElementType().isF32() &&
          !staysOnDevice(convert) &&
          llvm::all_of(g.getUsers(), [&](Operation *u) { return host.contains(u); }))
        host.insert(convert);
    for (BlockArgument arg : hostArgs)
      for (Operation *user : arg.getUsers())
        if (auto convert = dyn_cast<ConvertOp>(user);
            convert && !convert.getType().getElementType().isF32())
          host.insert(convert);
    // Constants that only host ops read live on the host.
    for (Operation &op : block)
      if (isa<arith::ConstantOp>(op) && !op.use_empty() &&
          llvm::all_of(op.getUsers(), [&](Operation *u) { return host.contains(u); }))
        host.insert(&op);

    OpBuilder b(func.getContext());
    for (BlockArgument arg : hostArgs)
      func.setArgAttr(arg.getArgNumber(), PtcDialect::kOnHostAttrName, b.getUnitAttr());
    for (Operation *op : host)
      op->setAttr(PtcDialect::kOnHostAttrName, b.getUnitAttr());
    // An update the device computes (ZeRO-1/2: the all-gather of the updated
    // shards) is copied back into the host argument.
    for (auto [i, target] : hostUpdates)
      if (!isOnHost(ret.getOperand(i))) {
        b.setInsertionPoint(ret);
        Value v = ret.getOperand(i);
        auto transfer = TransferOp::create(b, v.getLoc(), v.getType(), v, b.getStringAttr("host"));
        if (Operation *def = v.getDefiningOp())
          inheritPlacementInStep(transfer, def);
        ret.setOperand(i, transfer);
      }

    // One transfer per value and side, before its first user on that side.
    llvm::DenseMap<Value, Value> toHost, toDevice;
    for (Operation &op : llvm::make_early_inc_range(block.without_terminator())) {
      if (isa<TransferOp>(op))
        continue;
      bool onHost = host.contains(&op);
      for (OpOperand &use : op.getOpOperands()) {
        Value v = use.get();
        if (isOnHost(v) == onHost)
          continue;
        Value &t = (onHost ? toHost : toDevice)[v];
        if (!t) {
          // To the device: before its first user. To the host: right after
          // the value is computed (a gradient, during the backward pass, so
          // that the copy overlaps the rest of it and its device memory is
          // free early), unless that is inside a pipeline segment (the host
          // value would have to wait between segments).
          Operation *def = v.getDefiningOp();
          std::optional<SegmentKind> defSegment = def ? getSegment(def) : std::nullopt;
          bool early = onHost && def && (!defSegment || *defSegment == SegmentKind::Step);
          if (early)
            b.setInsertionPointAfter(def);
          else
            b.setInsertionPoint(&op);
          auto transfer = TransferOp::create(b, early ? def->getLoc() : op.getLoc(), v.getType(), v,
                                             b.getStringAttr(onHost ? "host" : "device"));
          inheritPlacementInStep(transfer, early ? def : &op);
          t = transfer.getResult();
        }
        use.set(t);
      }
    }

    // A pipelined step hands values between segments through the device's
    // activation stash: host values must stay within their segment.
    auto segmentOf = [](Operation *op) {
      return std::make_pair(op->getAttr(PtcDialect::kStageAttrName),
                            op->getAttr(PtcDialect::kSegmentAttrName));
    };
    for (Operation *op : host) {
      std::optional<SegmentKind> own = getSegment(op);
      if (!own || *own == SegmentKind::Step) // once-per-step values need no stash
        continue;
      for (Operation *user : op->getUsers())
        if (!isa<func::ReturnOp>(user) && segmentOf(user) != segmentOf(op)) {
          op->emitError() << "offload=optimizer: this host value is read in another pipeline "
                             "segment (at "
                          << user->getLoc() << "), which the activation stash cannot hold";
          return signalPassFailure();
        }
    }
  }
};
} // namespace
