//===- BucketCollectives.cpp - gradient buckets and reduction dtype -------===//
//
// ptc-bucket-collectives, the phase after ptc-shard: each all-reduce and
// reduce-scatter moves right after the op producing its operand, single-tensor
// all-reduces of one element type over the same axes merge into buckets of at
// most bucket-mb MiB (DDP's gradient buckets, sent while backward continues),
// ZeRO's gathers of the updated parameters merge into flat buckets too,
// ZeRO-3's per-use gathers are issued one parameter ahead, and with
// grad-reduce-dtype=bf16 the data-parallel reductions run in bf16.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"
#include "runtime/base/option_values.h"

#include "dialects/ptc/PtcMesh.h"
#include "passes/memory/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <map>

namespace mlir::ptc {
#define GEN_PASS_DEF_BUCKETCOLLECTIVESPASS
#include "passes/sharding/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::FloatDtype;

namespace {
/// Moves each single-tensor all-reduce and each reduce-scatter right after the
/// op that produces its operand (the partitioner inserts them before the
/// consumer): a gradient's reduction then starts as soon as the gradient
/// exists, and the runtime overlaps it with the rest of the backward pass.
void hoistReductions(func::FuncOp func) {
  Block &block = func.getBody().front();
  for (Operation &op : llvm::make_early_inc_range(block)) {
    Value in;
    if (auto ar = dyn_cast<AllReduceOp>(op); ar && ar.getInputs().size() == 1)
      in = ar.getInputs()[0];
    else if (auto rs = dyn_cast<ReduceScatterOp>(op))
      in = rs->getOperand(0);
    else
      continue;
    Operation *def = in.getDefiningOp();
    if (def && def->getBlock() == &block)
      op.moveAfter(def);
  }
}

/// Merges single-tensor all-reduces over the same axes and of the same element
/// type, in program order, into buckets of up to `capBytes` (one open bucket
/// per key, so interleaved groups still bucket). A bucket's all-reduce goes where its last
/// member was (every operand is ready there); a bucket closes when full or
/// before the first op that reads one of its results, so a gradient bucket
/// is sent while the backward pass computes the next one (DDP's buckets).
void bucketAllReduces(func::FuncOp func, double capBytes) {
  Block &block = func.getBody().front();
  struct Bucket {
    SmallVector<AllReduceOp> ops;
    llvm::SmallPtrSet<Operation *, 16> members;
    int64_t bytes = 0;
  };
  std::map<std::string, Bucket> open;
  // One bucket holds one element type over one set of axes.
  auto key = [](AllReduceOp ar) {
    std::string k;
    llvm::raw_string_ostream os(k);
    for (Attribute a : ar.getAxes())
      os << cast<StringAttr>(a).str() << ",";
    os << cast<RankedTensorType>(ar.getInputs()[0].getType()).getElementType();
    return k;
  };
  auto flush = [&](Bucket &bucket) {
    SmallVector<AllReduceOp> &pending = bucket.ops;
    if (pending.size() > 1) {
      OpBuilder b(pending.back());
      b.setInsertionPointAfter(pending.back());
      SmallVector<Value> inputs;
      std::string cause = "bucket of " + std::to_string(pending.size()) + ":";
      for (AllReduceOp ar : pending)
        inputs.push_back(ar.getInputs()[0]);
      auto merged = AllReduceOp::create(b, pending.front().getLoc(), inputs, pending.front().getAxes());
      for (auto [i, ar] : llvm::enumerate(pending)) {
        if (auto c = ar->getAttrOfType<StringAttr>(PtcDialect::kCollectiveCauseAttrName))
          cause += "\n      " + c.str();
        ar.getResult(0).replaceAllUsesWith(merged.getResult(i));
        ar.erase();
      }
      SmallVector<Attribute> strs(merged.getNumResults(),
                                  StringAttr::get(func.getContext(), "(bucketed all_reduce)"));
      merged->setAttr(PtcDialect::kShardingsAttrName, ArrayAttr::get(func.getContext(), strs));
      merged->setAttr(PtcDialect::kCollectiveCauseAttrName, b.getStringAttr(cause));
    }
    pending.clear();
    bucket.members.clear();
    bucket.bytes = 0;
  };
  for (Operation &op : llvm::make_early_inc_range(block)) {
    // A reader of a pending result closes that bucket first.
    for (auto &entry : open) {
      Bucket &bucket = entry.second;
      if (llvm::any_of(op.getOperands(), [&](Value v) {
            return v.getDefiningOp() && bucket.members.contains(v.getDefiningOp());
          }))
        flush(bucket);
    }
    auto ar = dyn_cast<AllReduceOp>(op);
    if (!ar || ar.getInputs().size() != 1)
      continue;
    Bucket &bucket = open[key(ar)];
    int64_t size = getTensorBytes(cast<RankedTensorType>(ar.getInputs()[0].getType()));
    if (!bucket.ops.empty() && bucket.bytes + size > capBytes)
      flush(bucket);
    bucket.ops.push_back(ar);
    bucket.members.insert(ar);
    bucket.bytes += size;
  }
  for (auto &[k, bucket] : open)
    flush(bucket);
}


/// ZeRO-1/2's gathers of the updated parameter shards (one per parameter,
/// results only returned, for the next step) merge into buckets of up to
/// `capBytes` gathered bytes per key (axes and element type): each rank
/// flattens its shards into one buffer, one all_gather over dp stacks the
/// buffers, and slices of the stack are the parameters (a shard split along
/// dimension 0 is the parameter's rows of that rank, so [ranks, shard
/// elements] is the parameter's layout). One collective per bucket instead of
/// one per parameter: latency paid once (DeepSpeed's and FSDP's flat buffers).
/// Pipelined steps keep their gathers per parameter (the stage split places
/// each with its parameter's rank).
void bucketParameterGathers(func::FuncOp func, double capBytes) {
  Block &block = func.getBody().front();
  auto returnedOnly = [](AllGatherOp g) {
    return !g.getResult().use_empty() &&
           llvm::all_of(g.getResult().getUsers(), [](Operation *u) { return isa<func::ReturnOp>(u); });
  };
  std::map<std::string, SmallVector<AllGatherOp>> groups;
  SmallVector<std::string> order;
  for (Operation &op : block) {
    auto g = dyn_cast<AllGatherOp>(op);
    auto in = g ? dyn_cast<RankedTensorType>(g.getInput().getType()) : RankedTensorType();
    if (!g || g.getDim() != 0 || g.getBlocks() != 1 || !in || in.getRank() == 0 ||
        g->hasAttr(PtcDialect::kGatherUseAttrName) || !returnedOnly(g))
      continue;
    std::string k;
    llvm::raw_string_ostream os(k);
    for (Attribute a : g.getAxes())
      os << cast<StringAttr>(a).str() << ",";
    os << in.getElementType();
    if (!groups.count(k))
      order.push_back(k);
    groups[k].push_back(g);
  }
  MLIRContext *ctx = func.getContext();
  auto flush = [&](SmallVector<AllGatherOp> &pending) {
    if (pending.size() > 1) {
      OpBuilder b(pending.back());
      b.setInsertionPointAfter(pending.back());
      Location loc = pending.front().getLoc();
      Type element = cast<RankedTensorType>(pending.front().getInput().getType()).getElementType();
      int64_t ranks = cast<RankedTensorType>(pending.front().getType()).getDimSize(0) /
                      cast<RankedTensorType>(pending.front().getInput().getType()).getDimSize(0);
      SmallVector<Value> flat;
      SmallVector<int64_t> sizes;
      int64_t total = 0;
      std::string cause = "bucket of " + std::to_string(pending.size()) + " parameter gathers:";
      for (AllGatherOp g : pending) {
        int64_t n = getNumElements(cast<RankedTensorType>(g.getInput().getType()));
        flat.push_back(ReshapeOp::create(b, loc, RankedTensorType::get({1, n}, element), g.getInput()));
        sizes.push_back(n);
        total += n;
        if (auto c = g->getAttrOfType<StringAttr>(PtcDialect::kCollectiveCauseAttrName))
          cause += "\n      " + c.str();
      }
      auto packed = ConcatOp::create(b, loc, RankedTensorType::get({1, total}, element), flat,
                                     b.getI64IntegerAttr(1));
      auto gathered = AllGatherOp::create(b, loc, RankedTensorType::get({ranks, total}, element),
                                          packed, pending.front().getAxes(), b.getI64IntegerAttr(0),
                                          b.getI64IntegerAttr(1));
      gathered->setAttr(PtcDialect::kShardingsAttrName,
                        ArrayAttr::get(ctx, {StringAttr::get(ctx, "(bucketed all_gather)")}));
      gathered->setAttr(PtcDialect::kCollectiveCauseAttrName, b.getStringAttr(cause));
      int64_t offset = 0;
      for (auto [g, n] : llvm::zip(pending, sizes)) {
        auto part = SliceOp::create(b, loc, RankedTensorType::get({ranks, n}, element), gathered,
                                    b.getDenseI64ArrayAttr({0, offset}));
        auto whole = ReshapeOp::create(b, loc, g.getType(), part);
        g.getResult().replaceAllUsesWith(whole.getResult());
        g.erase();
        offset += n;
      }
    }
    pending.clear();
  };
  for (const std::string &k : order) {
    SmallVector<AllGatherOp> pending;
    int64_t bytes = 0;
    for (AllGatherOp g : groups[k]) {
      int64_t size = getTensorBytes(cast<RankedTensorType>(g.getType()));
      if (!pending.empty() && bytes + size > capBytes) {
        flush(pending);
        bytes = 0;
      }
      pending.push_back(g);
      bytes += size;
    }
    flush(pending);
  }
}

/// ZeRO-3's per-use gathers, each moved to right before the first reader of
/// the gather before it (with the narrowing copy it gathers, under mixed
/// precision): a parameter's gather is issued while the previous parameter's
/// consumer computes, so a device that runs collectives on their own stream
/// (NCCL on GPUs) overlaps them, at the cost of one more gathered parameter
/// alive. Never across the forward/backward boundary, so the backward pass's
/// gathers do not keep copies from the forward pass.
void prefetchParameterGathers(func::FuncOp func) {
  Block &block = func.getBody().front();
  SmallVector<AllGatherOp> gathers;
  for (Operation &op : block)
    if (auto g = dyn_cast<AllGatherOp>(op); g && g->hasAttr(PtcDialect::kGatherUseAttrName))
      gathers.push_back(g);
  auto firstReader = [&](Operation *op) -> Operation * {
    Operation *first = nullptr;
    for (Operation *u : op->getUsers())
      if (u->getBlock() == &block && (!first || u->isBeforeInBlock(first)))
        first = u;
    return first;
  };
  auto backward = [](Operation *op) { return op->hasAttr(PtcDialect::kBackwardAttrName); };
  for (size_t i = 1; i < gathers.size(); ++i) {
    Operation *previous = firstReader(gathers[i - 1]), *mine = firstReader(gathers[i]);
    if (!previous || !mine || backward(previous) != backward(mine) ||
        !previous->isBeforeInBlock(gathers[i]))
      continue;
    // What the gather reads: the shard itself, or its narrowing copy read by
    // nothing else (moved along); anything else stays where it is.
    Value in = gathers[i].getInput();
    Operation *copy = in.getDefiningOp();
    if (copy && !(isa<ConvertOp>(copy) && copy->hasOneUse() &&
                  isa<BlockArgument>(copy->getOperand(0))))
      continue;
    if (copy)
      copy->moveBefore(previous);
    gathers[i]->moveBefore(previous);
  }
}

/// Gradient reductions over dp (all-reduce buckets, ZeRO reduce-scatters)
/// of f32 tensors run in bf16: a convert before, a convert after. Scalars
/// (the loss) stay f32, split off into their own bucket.
void reduceInBf16(func::FuncOp func, int dpAxis) {
  if (dpAxis < 0)
    return;
  OpBuilder b(func.getContext());
  auto isDpOnly = [&](ArrayAttr axes) {
    return axes.size() == 1 && cast<StringAttr>(axes[0]).getValue() == meshAxisName(MeshAxisRole::Data);
  };
  auto wide = [](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return t.getElementType().isF32() && t.getRank() > 0;
  };
  auto toType = [](Value v, Type e) {
    return RankedTensorType::get(cast<RankedTensorType>(v.getType()).getShape(), e);
  };
  SmallVector<Operation *> ops;
  func.walk([&](Operation *op) {
    if (auto ar = dyn_cast<AllReduceOp>(op); ar && isDpOnly(ar.getAxes()))
      ops.push_back(op);
    if (auto rs = dyn_cast<ReduceScatterOp>(op); rs && isDpOnly(rs.getAxes()) && wide(rs.getInput()))
      ops.push_back(op);
  });
  for (Operation *op : ops) {
    b.setInsertionPoint(op);
    if (auto rs = dyn_cast<ReduceScatterOp>(op)) {
      Value in = ConvertOp::create(b, op->getLoc(), toType(rs.getInput(), b.getBF16Type()), rs.getInput());
      auto low = ReduceScatterOp::create(b, op->getLoc(), toType(rs.getResult(), b.getBF16Type()), in,
                                         rs.getAxes(), rs.getDimAttr());
      Value back = ConvertOp::create(b, op->getLoc(), rs.getResult().getType(), low.getResult());
      low->setDiscardableAttrs(op->getDiscardableAttrDictionary());
      rs.getResult().replaceAllUsesWith(back);
      op->erase();
      continue;
    }
    auto ar = cast<AllReduceOp>(op);
    SmallVector<unsigned> lowIdx, keepIdx;
    for (auto [i, v] : llvm::enumerate(ar.getInputs()))
      (wide(v) ? lowIdx : keepIdx).push_back(static_cast<unsigned>(i));
    if (lowIdx.empty())
      continue;
    SmallVector<Value> lowIn;
    for (unsigned i : lowIdx)
      lowIn.push_back(ConvertOp::create(b, op->getLoc(), toType(ar.getInputs()[i], b.getBF16Type()),
                                        ar.getInputs()[i]));
    auto lowOp = AllReduceOp::create(b, op->getLoc(), ValueRange(lowIn), ar.getAxes());
    lowOp->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    for (auto [k, i] : llvm::enumerate(lowIdx))
      ar.getResult(i).replaceAllUsesWith(ConvertOp::create(
          b, op->getLoc(), ar.getResult(i).getType(), lowOp.getResult(static_cast<unsigned>(k))));
    if (!keepIdx.empty()) {
      SmallVector<Value> keepIn;
      for (unsigned i : keepIdx)
        keepIn.push_back(ar.getInputs()[i]);
      auto keepOp = AllReduceOp::create(b, op->getLoc(), ValueRange(keepIn), ar.getAxes());
      keepOp->setDiscardableAttrs(op->getDiscardableAttrDictionary());
      for (auto [k, i] : llvm::enumerate(keepIdx))
        ar.getResult(i).replaceAllUsesWith(keepOp.getResult(static_cast<unsigned>(k)));
    }
    op->erase();
  }
}
} // namespace

LogicalResult mlir::ptc::checkGradReduceDtype(Operation *at, StringRef dtype) {
  const std::optional<FloatDtype> kind = parseOption<FloatDtype>(dtype);
  if (kind != FloatDtype::F32 && kind != FloatDtype::Bf16)
    return at->emitError() << "grad-reduce-dtype must be f32 or bf16, got '" << dtype << "'";
  return success();
}

namespace {
struct BucketCollectivesPass
    : mlir::ptc::impl::BucketCollectivesPassBase<BucketCollectivesPass> {
  using BucketCollectivesPassBase::BucketCollectivesPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkGradReduceDtype(module, gradReduceDtype)))
      return signalPassFailure();
    if (!std::isfinite(bucketMb) || !(bucketMb > 0)) {
      module.emitError() << "bucket-mb=" << llvm::formatv("{0}", bucketMb.getValue()).str()
                         << " must be a positive number of MiB";
      return signalPassFailure();
    }
    FailureOr<MeshInfo> mesh = getEnclosingMesh(module);
    int dpAxis = succeeded(mesh) ? mesh->axisIndex(MeshAxisRole::Data) : -1;
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal() || !func.getBody().hasOneBlock())
        continue;
      hoistReductions(func);
      bucketAllReduces(func, bucketMb * 1024.0 * 1024.0);
      if (!succeeded(mesh) || mesh->axisIndex(MeshAxisRole::Pipeline) < 0)
        bucketParameterGathers(func, bucketMb * 1024.0 * 1024.0);
      prefetchParameterGathers(func);
      if (parseOption<FloatDtype>(gradReduceDtype) == FloatDtype::Bf16)
        reduceInBf16(func, dpAxis);
    }
  }
};
} // namespace
