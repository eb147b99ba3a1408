//===- Partition.cpp - local shapes and collectives -----------------------===//
//
// ptc-partition, the second sharding phase, in program order over the
// (single-block) training step annotated by ptc-propagate-sharding
// (ShardingPhases.h):
//   1. arguments get their local types;
//   2. per op, each operand that arrives with another sharding than the op
//      needs is resharded (all_reduce / reduce_scatter / all_to_all /
//      all_gather / shard_slice inserted right before the op, each with its
//      cause), results get local types, means over sharded rows are
//      rescaled, and an op with a partitioned form of its own (the
//      vocabulary-parallel cross-entropy) is replaced by it;
//   3. the return needs losses replicated and updates like their argument.
// Bucketing (BucketCollectives.cpp) and the report (ExplainCollectives.cpp)
// are the next passes.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "passes/sharding/ShardingPhases.h"

#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

#include <functional>

namespace mlir::ptc {
#define GEN_PASS_DEF_PARTITIONPASS
#include "passes/sharding/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using namespace mlir::ptc::sharding;

namespace {

struct Collective {
  Operation *op;
  std::string cause;
};

class Partitioner {
public:
  Partitioner(func::FuncOp func, const MeshInfo &mesh) : func(func), mesh(mesh), b(func) {}

  LogicalResult run();
  SmallVector<Collective> collectives;

private:
  RankedTensorType global(Value v) const { return globalType.lookup(v); }
  const Sharding &sharding(Value v) { return shardings[v]; }
  /// The sharding propagation recorded in `attr` for a value of global type `g`.
  FailureOr<Sharding> recorded(Attribute attr, RankedTensorType g, Operation *where);
  FailureOr<Value> reshard(Value v, const Sharding &target, Operation *user, StringRef why);
  /// Gives `r` its local type under `s`.
  LogicalResult setResult(Value r, const Sharding &s, Operation *where);
  LogicalResult processOp(Operation *op);
  LogicalResult processReturn(func::ReturnOp ret);
  /// Points each non-finite gradient check at what its updates read.
  void sinkNonfiniteChecks();
  /// Inserts `scale(r, factor)` after r's producer, redirects r's other uses
  /// to it and returns it.
  Value rescale(Value r, double factor);

  func::FuncOp func;
  const MeshInfo &mesh;
  OpBuilder b;
  /// ZeRO-1 (the paper's, DeepSpeed's stage 1): a gradient on its way to an
  /// update is all-reduced whole and then sliced, never reduce-scattered.
  bool wholeGradient = false;
  /// ZeRO-3 parameters gathered for each use (ptc.gather_per_use).
  llvm::DenseSet<Value> gatherPerUse;
  llvm::DenseMap<Value, Sharding> shardings;
  llvm::DenseMap<Attribute, Sharding> parsed;
  llvm::DenseMap<Value, RankedTensorType> globalType;
  std::map<std::pair<void *, std::string>, Value> reshardCache;
  /// ZeRO-3: the number of the next per-use parameter gather (ptc.gather_use).
  int64_t gatherUses = 0;
};

FailureOr<Sharding> Partitioner::recorded(Attribute attr, RankedTensorType g, Operation *where) {
  // Attributes are uniqued: most ops share a few shardings.
  if (auto it = parsed.find(attr); it != parsed.end() && it->second.dims.size() == static_cast<size_t>(g.getRank()))
    return it->second;
  FailureOr<Sharding> s = getSharding(attr, mesh, g.getRank(), [&] {
    return (where ? where->emitOpError() : func.emitError()) << "propagated sharding: ";
  });
  if (succeeded(s))
    parsed[attr] = *s;
  return s;
}

LogicalResult Partitioner::setResult(Value r, const Sharding &s, Operation *where) {
  auto g = cast<RankedTensorType>(r.getType());
  globalType[r] = g;
  FailureOr<RankedTensorType> local = localType(func, mesh, r, g, s, where);
  if (failed(local))
    return failure();
  r.setType(*local);
  shardings[r] = normalizePartial(mesh, s);
  return success();
}

FailureOr<Value> Partitioner::reshard(Value v, const Sharding &target, Operation *user,
                                      StringRef why) {
  const Sharding from = sharding(v);
  if (from == target)
    return v;
  auto key = std::make_pair(v.getAsOpaquePointer(), text(mesh, target));
  // ZeRO-3 gathers a parameter for each use, so that the memory plan can free
  // the whole copy right after it instead of keeping it for the backward pass.
  // A parameter is gathered as itself or, under mixed precision, as its
  // low-precision copy (ptc.convert of the shard).
  Value root = v;
  while (auto convert = root.getDefiningOp<ConvertOp>())
    root = convert->getOperand(0);
  auto arg = dyn_cast<BlockArgument>(root);
  bool reuse = !(arg && gatherPerUse.contains(arg));
  if (auto it = reshardCache.find(key); reuse && it != reshardCache.end())
    return it->second;
  b.setInsertionPoint(user);
  Location loc = user->getLoc();
  Value cur = v;
  Sharding curS = from;
  RankedTensorType g = global(v);
  auto cause = [&](StringRef kind) {
    return (Twine(kind) + " of " + describe(func, v) + " from " + text(mesh, curS) + " to " + text(mesh, target) +
            " for " + user->getName().getStringRef() + " (" + why + ")")
        .str();
  };
  // 1. Finish pending sums the consumer does not accept.
  SmallVector<int> reduce;
  for (int a : curS.partial)
    if (!llvm::is_contained(target.partial, a))
      reduce.push_back(a);
  // A pending sum over an axis that the consumer wants to split a dimension
  // over (alone, or as the minor axis of a compound whose major part splits
  // it already: cp -> cp*tp): reduce-scatter along that dimension (half the
  // traffic of an all-reduce, and no slice afterwards).
  for (int a : SmallVector<int>(wholeGradient ? SmallVector<int>() : reduce)) {
    for (size_t d = 0; d < target.dims.size(); ++d) {
      if (target.dims[d].blocks != 1 || curS.dims[d].blocks != 1)
        continue;
      SmallVector<int, 2> scattered = mesh.parts(curS.dims[d].axis);
      scattered.push_back(a);
      if (target.dims[d].axis < 0 || target.dims[d].axis != mesh.axisOf(scattered))
        continue;
      Sharding next = curS;
      next.dims[d] = target.dims[d];
      llvm::erase(next.partial, a);
      FailureOr<RankedTensorType> type = localType(func, mesh, v, g, next, user);
      if (failed(type))
        return failure();
      auto rs = ReduceScatterOp::create(b, loc, *type, cur, b.getStrArrayAttr({mesh.axes[a]}),
                                        b.getI64IntegerAttr(static_cast<int64_t>(d)));
      collectives.push_back({rs, cause("reduce_scatter")});
      cur = rs;
      curS = next;
      llvm::erase(reduce, a);
      break;
    }
  }
  if (!reduce.empty()) {
    SmallVector<StringRef> names;
    for (int a : reduce)
      names.push_back(mesh.axes[a]);
    auto ar = AllReduceOp::create(b, loc, ValueRange{cur}, b.getStrArrayAttr(names));
    collectives.push_back({ar, cause("all_reduce")});
    cur = ar.getResult(0);
    Sharding next = curS;
    next.partial.clear();
    for (int a : curS.partial)
      if (!llvm::is_contained(reduce, a))
        next.partial.push_back(a);
    curS = next;
  }
  // 2. A split moving from one dimension to another: all_to_all over the
  // moving mesh axis m. Either d1 loses m (its minor axis; whole when it was
  // split over m alone) to d2, or d1 gains m as its minor axis from d2.
  auto minorOf = [&](int major, int whole) -> int { // whole = major*m -> m
    SmallVector<int, 2> pw = mesh.parts(whole), pm = mesh.parts(major);
    if (whole < 0 || pw.size() != pm.size() + 1 || !std::equal(pm.begin(), pm.end(), pw.begin()))
      return -1;
    return pw.back();
  };
  for (size_t d1 = 0; d1 < curS.dims.size(); ++d1) {
    DimShard a = curS.dims[d1], t = target.dims[d1];
    if (a == t || a.blocks != 1 || t.blocks != 1)
      continue;
    for (size_t d2 = 0; d2 < curS.dims.size(); ++d2) {
      if (d2 == d1)
        continue;
      int m = -1;
      size_t split = 0, concat = 0;
      if (int lost = minorOf(t.axis, a.axis);
          lost >= 0 && curS.dims[d2].axis < 0 && target.dims[d2] == DimShard(lost)) {
        m = lost, split = d2, concat = d1; // d1: major*m -> major, d2: whole -> m
      } else if (int gained = minorOf(a.axis, t.axis);
                 gained >= 0 && curS.dims[d2] == DimShard(gained) && target.dims[d2].axis < 0) {
        m = gained, split = d1, concat = d2; // d1: major -> major*m, d2: m -> whole
      }
      if (m < 0)
        continue;
      Sharding next = curS;
      next.dims[d1] = t;
      next.dims[d2] = target.dims[d2];
      FailureOr<RankedTensorType> type = localType(func, mesh, v, g, next, user);
      if (failed(type))
        return failure();
      auto a2a = AllToAllOp::create(b, loc, *type, cur, b.getStrArrayAttr({mesh.axes[m]}),
                                    b.getI64IntegerAttr(static_cast<int64_t>(split)),
                                    b.getI64IntegerAttr(static_cast<int64_t>(concat)));
      collectives.push_back({a2a, cause("all_to_all")});
      cur = a2a;
      curS = next;
      break;
    }
  }
  // 3. Per dimension: gather the mesh axes the consumer does not want (minor
  // first), then slice over the ones it adds (major first).
  for (size_t d = 0; d < curS.dims.size(); ++d) {
    DimShard a = curS.dims[d], want = target.dims[d];
    if (a == want)
      continue;
    SmallVector<int, 2> have = mesh.parts(a.axis), need = mesh.parts(want.axis);
    size_t common = 0;
    if (a.blocks == 1 && want.blocks == 1)
      while (common < have.size() && common < need.size() && have[common] == need[common])
        ++common;
    while (have.size() > common) {
      int p = have.pop_back_val();
      Sharding next = curS;
      next.dims[d] = have.empty() ? DimShard() : DimShard(mesh.axisOf(have));
      auto type = cast<RankedTensorType>(localType(func, mesh, v, g, next, user).value());
      auto ag = AllGatherOp::create(b, loc, type, cur, b.getStrArrayAttr({mesh.axes[p]}),
                                    b.getI64IntegerAttr(static_cast<int64_t>(d)),
                                    b.getI64IntegerAttr(a.blocks));
      // ZeRO-3: each use has a gather of its own (the forward and the backward
      // pass each gather, FSDP's reshard-after-forward), numbered so that CSE
      // does not merge them back into one copy kept from the forward pass to
      // the backward pass.
      if (!reuse)
        ag->setAttr(PtcDialect::kGatherUseAttrName, b.getI64IntegerAttr(gatherUses++));
      collectives.push_back({ag, cause("all_gather")});
      cur = ag;
      curS = next;
    }
    for (size_t i = common; i < need.size(); ++i) {
      have.push_back(need[i]);
      Sharding next = curS;
      next.dims[d] = i + 1 == need.size() ? want : DimShard(mesh.axisOf(have));
      FailureOr<RankedTensorType> type = localType(func, mesh, v, g, next, user);
      if (failed(type))
        return failure();
      cur = ShardSliceOp::create(b, loc, *type, cur, b.getStrArrayAttr({mesh.axes[need[i]]}),
                                 b.getI64IntegerAttr(static_cast<int64_t>(d)),
                                 b.getI64IntegerAttr(want.blocks));
      curS = next;
    }
  }
  shardings[cur] = curS;
  globalType[cur] = g;
  reshardCache[key] = cur;
  return cur;
}

Value Partitioner::rescale(Value r, double factor) {
  b.setInsertionPointAfterValue(r);
  auto scaled = ScaleOp::create(b, r.getLoc(), r, b.getF64FloatAttr(factor));
  r.replaceAllUsesExcept(scaled, scaled);
  // Copy first: inserting the new key may rehash and move the old entries.
  Sharding s = shardings[r];
  RankedTensorType g = globalType[r];
  shardings[scaled] = s;
  globalType[scaled] = g;
  return scaled;
}

LogicalResult Partitioner::processOp(Operation *op) {
  auto wants = op->getAttrOfType<ArrayAttr>(kOperandShardings);
  auto outs = op->getAttrOfType<ArrayAttr>(kResultShardings);
  if (!wants || !outs || wants.size() != op->getNumOperands() ||
      outs.size() != op->getNumResults())
    return op->emitOpError() << "has no propagated shardings (run ptc-propagate-sharding first)";
  auto scales = op->getAttrOfType<DenseF64ArrayAttr>(kOperandScales);
  auto whole = op->getAttrOfType<IntegerAttr>(kWholeGradient);
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    FailureOr<Sharding> want = recorded(wants[i], global(op->getOperand(i)), op);
    if (failed(want))
      return failure();
    wholeGradient = whole && whole.getInt() == static_cast<int64_t>(i);
    FailureOr<Value> v = reshard(op->getOperand(i), *want, op, "operand #" + std::to_string(i));
    wholeGradient = false;
    if (failed(v))
      return failure();
    Value nv = *v;
    if (scales && scales[i] != 1.0) {
      b.setInsertionPoint(op);
      Value scaled = ScaleOp::create(b, op->getLoc(), nv, b.getF64FloatAttr(scales[i]));
      Sharding sc = shardings[nv];
      RankedTensorType gt = globalType[nv];
      shardings[scaled] = sc;
      globalType[scaled] = gt;
      nv = scaled;
    }
    op->setOperand(i, nv);
  }
  auto resultScales = op->getAttrOfType<DenseF64ArrayAttr>(kResultScales);
  SmallVector<Value> current;
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    Value r = op->getResult(i);
    FailureOr<Sharding> out = recorded(outs[i], cast<RankedTensorType>(r.getType()), op);
    if (failed(out) || failed(setResult(r, *out, op)))
      return failure();
    // After a rescale, the scaled copy is what the other users read.
    current.push_back(resultScales && resultScales[i] != 1.0 ? rescale(r, resultScales[i]) : r);
  }
  // Results resharded right after the op: the rule's (on the raw result),
  // then the user's annotation (on what the users read).
  if (auto reshards = op->getAttrOfType<ArrayAttr>(kReshardResults)) {
    for (Attribute entry : reshards) {
      auto dict = cast<DictionaryAttr>(entry);
      auto i = static_cast<unsigned>(dict.getAs<IntegerAttr>("result").getInt());
      bool scaled = static_cast<bool>(dict.get("scaled"));
      Value src = scaled ? current[i] : op->getResult(i);
      FailureOr<Sharding> target = recorded(dict.get("to"), global(src), op);
      if (failed(target))
        return failure();
      llvm::SmallPtrSet<Operation *, 8> users(src.getUsers().begin(), src.getUsers().end());
      FailureOr<Value> v = reshard(src, *target, src.getDefiningOp()->getNextNode(),
                                   dict.getAs<StringAttr>("why").getValue());
      if (failed(v))
        return failure();
      src.replaceUsesWithIf(*v, [&](OpOperand &use) { return users.contains(use.getOwner()); });
      if (scaled)
        current[i] = *v;
    }
  }
  for (StringRef name : {kOperandShardings, kOperandScales, kResultScales, kReshardResults,
                         kWholeGradient})
    op->removeAttr(name);
  // An op with a partitioned form of its own (ShardingRuleOpInterface::partition).
  auto rule = dyn_cast<ShardingRuleOpInterface>(op);
  b.setInsertionPoint(op);
  Operation *replacement = rule ? rule.partition(b) : nullptr;
  op->removeAttr(PtcDialect::kPartitionedFormAttrName);
  if (!replacement)
    return success();
  if (replacement->getNumResults() != op->getNumResults())
    return op->emitOpError() << "partitioned form " << replacement->getName() << " has "
                             << replacement->getNumResults() << " results, not "
                             << op->getNumResults();
  for (auto [old, now] : llvm::zip(op->getResults(), replacement->getResults())) {
    Sharding sh = shardings[old];
    RankedTensorType gt = globalType[old];
    shardings[now] = sh;
    globalType[now] = gt;
    old.replaceAllUsesWith(now);
  }
  for (StringRef name : {StringRef(kOrigins), StringRef(PtcDialect::kOptimizerGradAttrName)})
    if (Attribute a = op->getAttr(name))
      replacement->setAttr(name, a);
  op->erase();
  return success();
}

LogicalResult Partitioner::processReturn(func::ReturnOp ret) {
  llvm::StringMap<BlockArgument> argByName;
  for (BlockArgument arg : func.getArguments())
    for (StringRef role : {PtcDialect::kParamAttrName, PtcDialect::kStateAttrName})
      if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), role))
        argByName[name.getValue()] = arg;
  for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
    Value v = ret.getOperand(i);
    Sharding target = Sharding::replicated(global(v).getRank());
    std::string why = "a replicated result";
    auto update = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kUpdateAttrName);
    auto grad = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kGradAttrName);
    if (StringAttr name = update ? update : grad) {
      if (BlockArgument arg = argByName.lookup(name.getValue())) {
        target = sharding(arg);
        why = "the sharding of '" + name.str() + "'";
      }
    }
    FailureOr<Value> nv = reshard(v, target, ret, why);
    if (failed(nv))
      return failure();
    ret.setOperand(i, *nv);
  }
  return success();
}

LogicalResult Partitioner::run() {
  Block &block = func.getBody().front();
  // 1. Arguments: local types; the ones every user reads in another split
  // (the batch over dp*ep) are resharded on entry.
  SmallVector<std::pair<BlockArgument, Sharding>> onEntry;
  for (BlockArgument arg : block.getArguments()) {
    auto g = dyn_cast<RankedTensorType>(arg.getType());
    Attribute attr = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName);
    if (!g || !attr)
      return func.emitError() << describe(func, arg)
                              << " has no propagated sharding (run ptc-propagate-sharding first)";
    FailureOr<Sharding> s = recorded(attr, g, nullptr);
    if (failed(s) || failed(setResult(arg, *s, nullptr)))
      return failure();
    if (Attribute entry = func.getArgAttr(arg.getArgNumber(), kReshardOnEntry)) {
      FailureOr<Sharding> rows = recorded(entry, g, nullptr);
      if (failed(rows))
        return failure();
      onEntry.push_back({arg, *rows});
    }
    if (func.getArgAttr(arg.getArgNumber(), kGatherPerUse))
      gatherPerUse.insert(arg);
  }
  SmallVector<Operation *> ops;
  for (Operation &op : block)
    ops.push_back(&op);
  for (auto &[arg, target] : onEntry) {
    FailureOr<Value> rows = reshard(arg, target, ops.front(),
                                       "a compound axis refines the split the input is loaded in "
                                       "(ep ranks take their own rows of dp's batch, sequence "
                                       "parallelism within cp its tp share of the chunk)");
    if (failed(rows))
      return failure();
    arg.replaceAllUsesExcept(*rows, rows->getDefiningOp());
  }
  // 2. Ops in program order (collectives and rescales inserted on the way).
  for (Operation *op : ops) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      if (failed(processReturn(ret)))
        return failure();
      continue;
    }
    if (failed(processOp(op)))
      return failure();
  }
  sinkNonfiniteChecks();
  // 3. Record the shardings (inserted ops too), retype the function.
  Builder builder(func.getContext());
  for (Operation &op : block) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<Attribute> attrs;
    for (Value r : op.getResults())
      attrs.push_back(getShardingAttr(func.getContext(), mesh, sharding(r)));
    op.setAttr(kResultShardings, builder.getArrayAttr(attrs));
  }
  SmallVector<DictionaryAttr> argAttrs;
  func.getAllArgAttrs(argAttrs);
  for (DictionaryAttr &attrs : argAttrs) {
    NamedAttrList list(attrs);
    list.erase(kReshardOnEntry);
    list.erase(kGatherPerUse);
    attrs = list.getDictionary(func.getContext());
  }
  func.setAllArgAttrs(argAttrs);
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  func.setType(builder.getFunctionType(block.getArgumentTypes(), ret.getOperandTypes()));
  return success();
}

// ptc-optimizer's non-finite check (skip-nonfinite) reads the whole
// gradients; once partitioned, it reads what each update it guards reads (a
// ZeRO shard, a tensor-parallel block), right before the first of them, and
// takes the flag's maximum over the mesh axes those are split over. Checking
// the whole gradients would gather each tp-split one for the check alone, and
// keep ZeRO's whole gradients alive until the check. What was made only for
// the old check (those gathers) goes with it.
void Partitioner::sinkNonfiniteChecks() {
  Block &block = func.getBody().front();
  SmallVector<AnyNonfiniteOp> checks(block.getOps<AnyNonfiniteOp>());
  // Muon's matrices read their gradients through ptc.unscale_grads by 1
  // (ptc.optimizer_grad: non-finite entries zeroed) and take the flag in
  // the multiplications that blend old and new values.
  SmallVector<UnscaleGradsOp> sanitizers;
  for (UnscaleGradsOp u : block.getOps<UnscaleGradsOp>())
    if (u->hasAttr(PtcDialect::kOptimizerGradAttrName))
      sanitizers.push_back(u);
  for (AnyNonfiniteOp check : checks) {
    SmallVector<Operation *> updates, readers;
    bool onlyUpdates = true;
    for (Operation *user : check.getFlag().getUsers()) {
      if (isa<func::ReturnOp>(user))
        continue; // the step's 'skipped' output
      readers.push_back(user);
      if (isa<FusedUpdateOpInterface>(user))
        updates.push_back(user);
      else
        onlyUpdates &= isa<MulOp>(user) && !sanitizers.empty();
    }
    if (readers.empty() || !onlyUpdates)
      continue;
    Operation *first = readers.front();
    for (Operation *u : readers)
      if (u->isBeforeInBlock(first))
        first = u;
    // The gradients' producers between the updates move up before them.
    std::function<void(Value)> hoist = [&](Value v) {
      Operation *def = v.getDefiningOp();
      if (!def || def->getBlock() != &block || def->isBeforeInBlock(first))
        return;
      for (Value operand : def->getOperands())
        hoist(operand);
      def->moveBefore(first);
    };
    SmallVector<Value> read;
    for (Operation *u : updates)
      read.push_back(u->getOperand(1));
    for (UnscaleGradsOp u : sanitizers)
      read.push_back(u->getOperand(0));
    SmallVector<Value> grads;
    llvm::SmallSetVector<int, 4> axes;
    for (Value g : read) {
      if (auto widen = g.getDefiningOp<ConvertOp>()) // checked before its widening
        g = widen.getInput();
      if (llvm::is_contained(grads, g))
        continue;
      grads.push_back(g);
      hoist(g);
      for (const DimShard &d : sharding(g).dims)
        if (d.axis >= 0)
          for (int part : mesh.parts(d.axis))
            axes.insert(part);
    }
    SmallVector<int> sorted(axes.begin(), axes.end());
    llvm::sort(sorted);
    SmallVector<StringRef> names;
    for (int a : sorted)
      names.push_back(mesh.axes[a]);
    b.setInsertionPoint(first);
    auto fresh = AnyNonfiniteOp::create(b, check.getLoc(), check.getFlag().getType(), grads,
                                        names.empty() ? ArrayAttr() : b.getStrArrayAttr(names));
    shardings[fresh.getFlag()] = sharding(check.getFlag());
    globalType[fresh.getFlag()] = global(check.getFlag());
    check.getFlag().replaceAllUsesWith(fresh.getFlag());
    llvm::SetVector<Operation *> made;
    for (Value v : check.getOperands())
      if (Operation *def = v.getDefiningOp())
        made.insert(def);
    check.erase();
    llvm::DenseSet<Operation *> erased;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < made.size(); ++i) {
        Operation *def = made[i];
        if (erased.contains(def) || !def->use_empty() || !isMemoryEffectFree(def))
          continue;
        for (Value v : def->getOperands())
          if (Operation *producer = v.getDefiningOp())
            made.insert(producer);
        for (Collective &c : collectives)
          if (c.op == def)
            c.op = nullptr;
        for (Value r : def->getResults()) {
          shardings.erase(r);
          globalType.erase(r);
        }
        def->erase();
        erased.insert(def);
        changed = true;
      }
    }
  }
}

} // namespace

namespace {
struct PartitionPass : mlir::ptc::impl::PartitionPassBase<PartitionPass> {
  using PartitionPassBase::PartitionPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Without a mesh propagation had nothing to do (zero= or
    // sequence-parallel= without one only warn).
    if (!module->hasAttr(PtcDialect::kMeshAttrName))
      return;
    FailureOr<MeshInfo> meshInfo = getEnclosingMesh(module);
    if (failed(meshInfo))
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal() || !func.getBody().hasOneBlock())
        continue;
      Partitioner partitioner(func, *meshInfo);
      if (failed(partitioner.run()))
        return signalPassFailure();
      // Why each collective is there, for ptc-bucket-collectives and
      // ptc-explain-collectives.
      for (const Collective &c : partitioner.collectives)
        if (c.op)
          c.op->setAttr(PtcDialect::kCollectiveCauseAttrName, StringAttr::get(&getContext(), c.cause));
    }
  }
};
} // namespace

namespace mlir::ptc {
#define GEN_PIPELINE_OPTION_FORWARDING
#include "passes/PipelineOptions.h.inc"
} // namespace mlir::ptc

void mlir::ptc::buildShardPipeline(OpPassManager &pm, const ShardPipelineOptions &options) {
  PropagateShardingPassOptions propagate;
  forwardShardOptionsToPropagateShardingPass(options, propagate);
  pm.addPass(createPropagateShardingPass(propagate));
  pm.addPass(createPartitionPass());
}

void mlir::ptc::registerShardingPassesAndPipelines() {
  registerShardingPasses();
  PassPipelineRegistration<ShardPipelineOptions>(
      "ptc-shard",
      "Shard a training step over a device mesh: ptc-propagate-sharding, then ptc-partition",
      buildShardPipeline);
}
