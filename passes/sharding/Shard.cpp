//===- Shard.cpp - sharding propagation, local shapes, collectives --------===//
//
// ptc-shard, the partitioning phase, in program order over the
// (single-block) training step:
//   1. argument shardings: annotation > default rule (ShardingDefaults.cpp;
//      inputs: batch -> dp);
//   2. per op, its rule (ShardingRuleOpInterface) maps operand shardings to
//      the operand shardings it needs and to its result shardings; mismatching
//      operands are resharded (all_reduce / reduce_scatter / all_to_all /
//      all_gather / shard_slice inserted right before the op, each with its
//      cause);
//   3. results get local types; means over sharded rows are rescaled;
//   4. the return needs losses replicated and updates like their argument.
// Bucketing (BucketCollectives.cpp) and the report (ExplainCollectives.cpp)
// are the next passes.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"
#include "passes/sharding/ShardingDefaults.h"
#include "passes/memory/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_SHARDPASS
#include "passes/sharding/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {

/// Where a value's sharding came from, for diagnostics and `ptc.shardings`.
struct Origin {
  std::string how; // "annotation", "default", "propagated", "rule"
  Value annotated; // the annotated argument or op result this sharding derives from, if any
};

struct Collective {
  Operation *op;
  std::string cause;
};

/// A fused optimizer update (its gradient is operand #1).
bool isUpdate(Operation *op) { return isa<AdamWUpdateOp, SgdUpdateOp>(op); }

class Partitioner {
public:
  Partitioner(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel, int zero,
              bool reshardAfterForward)
      : func(func), mesh(mesh), b(func), sequenceParallel(sequenceParallel), zero(zero),
        reshardAfterForward(reshardAfterForward) {}

  LogicalResult run();
  SmallVector<Collective> collectives;

  std::string str(const Sharding &s) const {
    std::string out = "[";
    for (auto [i, a] : llvm::enumerate(s.dims))
      out += (i ? ", " : "") +
             (a.axis < 0 ? std::string("_")
                         : mesh.name(a.axis) + (a.blocks > 1 ? "/" + std::to_string(a.blocks) : ""));
    out += "]";
    if (!s.partial.empty()) {
      out += " partial(";
      for (auto [i, a] : llvm::enumerate(s.partial))
        out += (i ? ", " : "") + mesh.axes[a];
      out += ")";
    }
    return out;
  }

  // For the ops' sharding rules (RuleContext).
  RankedTensorType global(Value v) const { return globalType.lookup(v); }
  const Sharding &sharding(Value v) { return shardings[v]; }
  bool isAnnotated(Value v) { return static_cast<bool>(origins[v].annotated); }
  LogicalResult conflict(Operation *op, Value a, Value b);
  const MeshInfo &meshInfo() const { return mesh; }

private:
  std::string describe(Value v);

  FailureOr<RankedTensorType> localType(Value v, RankedTensorType g, const Sharding &s,
                                        Operation *where);
  FailureOr<Value> reshard(Value v, const Sharding &target, Operation *user, StringRef why);
  LogicalResult setResult(Value r, const Sharding &s, Origin origin, Operation *where);
  LogicalResult processOp(Operation *op);
  LogicalResult processReturn(func::ReturnOp ret);
  /// Inserts `scale(r, factor)` after r's producer, redirects r's other uses
  /// to it and returns it.
  Value rescale(Value r, double factor);
  /// Reshards `value` (op result `source` or its rescaled copy) to the user
  /// annotation `spec` right after it is produced.
  LogicalResult constrain(Value value, Value source, Attribute spec);
  /// The annotation text of an annotated argument or op result.
  std::string annotationOf(Value v);

  func::FuncOp func;
  const MeshInfo &mesh;
  OpBuilder b;
  bool sequenceParallel;
  /// ZeRO-1 (the paper's, DeepSpeed's stage 1): a gradient on its way to an
  /// update is all-reduced whole and then sliced, never reduce-scattered.
  bool wholeGradient = false;
  int zero;
  bool reshardAfterForward;
  llvm::DenseMap<Value, Sharding> shardings;
  llvm::DenseMap<Value, Origin> origins;
  llvm::DenseMap<Value, RankedTensorType> globalType;
  std::map<std::pair<void *, std::string>, Value> reshardCache;
  /// ZeRO-3: the number of the next per-use parameter gather (ptc.gather_use).
  int64_t gatherUses = 0;
};

std::string Partitioner::describe(Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    for (StringRef role : {PtcDialect::kParamAttrName, PtcDialect::kStateAttrName,
                           PtcDialect::kInputAttrName})
      if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), role))
        return "'" + name.str() + "'";
    return "argument #" + std::to_string(arg.getArgNumber());
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "the result of " << v.getDefiningOp()->getName() << " at " << v.getLoc();
  return s;
}

FailureOr<RankedTensorType> Partitioner::localType(Value v, RankedTensorType g, const Sharding &s,
                                                   Operation *where) {
  SmallVector<int64_t> shape(g.getShape());
  for (auto [d, ds] : llvm::enumerate(s.dims)) {
    int a = ds.axis;
    if (a < 0)
      continue;
    if (shape[d] % (mesh.size(a) * ds.blocks) != 0) {
      InFlightDiagnostic diag = where ? where->emitOpError() : mlir::emitError(v.getLoc());
      diag << describe(v) << " dimension " << d << " (size " << shape[d]
           << ") is not divisible by mesh axis '" << mesh.name(a) << "' (size " << mesh.size(a)
           << ")" << (ds.blocks > 1 ? " times its " + std::to_string(ds.blocks) + " blocks" : "");
      return failure();
    }
    shape[d] /= mesh.size(a);
  }
  return RankedTensorType::get(shape, g.getElementType());
}

LogicalResult Partitioner::setResult(Value r, const Sharding &s, Origin origin, Operation *where) {
  auto g = cast<RankedTensorType>(r.getType());
  globalType[r] = g;
  FailureOr<RankedTensorType> local = localType(r, g, s, where);
  if (failed(local))
    return failure();
  r.setType(*local);
  // Pending sums are over mesh axes: a sum over a compound is one over each
  // of its components.
  Sharding normalized = s;
  normalized.partial.clear();
  for (int a : s.partial)
    for (int p : mesh.parts(a))
      addPartial(normalized.partial, p);
  shardings[r] = normalized;
  origins[r] = std::move(origin);
  return success();
}

FailureOr<Value> Partitioner::reshard(Value v, const Sharding &target, Operation *user,
                                      StringRef why) {
  const Sharding from = sharding(v);
  if (from == target)
    return v;
  auto key = std::make_pair(v.getAsOpaquePointer(), str(target));
  // ZeRO-3 gathers a parameter for each use, so that the memory plan can free
  // the whole copy right after it instead of keeping it for the backward pass.
  // A parameter is gathered as itself or, under mixed precision, as its
  // low-precision copy (ptc.convert of the shard).
  Value root = v;
  while (auto convert = root.getDefiningOp<ConvertOp>())
    root = convert->getOperand(0);
  auto arg = dyn_cast<BlockArgument>(root);
  bool reuse = !(zero >= 3 && reshardAfterForward && arg &&
                 func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName));
  if (auto it = reshardCache.find(key); reuse && it != reshardCache.end())
    return it->second;
  b.setInsertionPoint(user);
  Location loc = user->getLoc();
  Value cur = v;
  Sharding curS = from;
  RankedTensorType g = global(v);
  auto cause = [&](StringRef kind) {
    return (Twine(kind) + " of " + describe(v) + " from " + str(curS) + " to " + str(target) +
            " for " + user->getName().getStringRef() + " (" + why + ")")
        .str();
  };
  // 1. Finish pending sums the consumer does not accept.
  SmallVector<int> reduce;
  for (int a : curS.partial)
    if (!llvm::is_contained(target.partial, a))
      reduce.push_back(a);
  // A pending sum over an axis that the consumer wants to split a dimension
  // over: reduce-scatter along that dimension (half the traffic of an
  // all-reduce, and no slice afterwards).
  for (int a : SmallVector<int>(wholeGradient ? SmallVector<int>() : reduce)) {
    for (size_t d = 0; d < target.dims.size(); ++d) {
      if (target.dims[d].axis != a || target.dims[d].blocks != 1 || curS.dims[d].axis >= 0)
        continue;
      Sharding next = curS;
      next.dims[d] = DimShard(a);
      llvm::erase(next.partial, a);
      FailureOr<RankedTensorType> type = localType(v, g, next, user);
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
      FailureOr<RankedTensorType> type = localType(v, g, next, user);
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
      auto type = cast<RankedTensorType>(localType(v, g, next, user).value());
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
      FailureOr<RankedTensorType> type = localType(v, g, next, user);
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
  origins[cur] = {"reshard", origins[v].annotated};
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
  Origin o = origins[r];
  shardings[scaled] = s;
  globalType[scaled] = g;
  origins[scaled] = o;
  return scaled;
}

std::string Partitioner::annotationOf(Value v) {
  Attribute spec;
  if (auto arg = dyn_cast<BlockArgument>(v))
    spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName);
  if (auto res = dyn_cast<OpResult>(v))
    if (auto specs = res.getOwner()->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName))
      if (res.getResultNumber() < specs.size())
        spec = specs[res.getResultNumber()];
  if (auto text = dyn_cast_or_null<StringAttr>(spec))
    return text.str();
  if (auto typed = dyn_cast_or_null<ShardingAttr>(spec))
    return shardingText(typed);
  return "";
}

LogicalResult Partitioner::constrain(Value value, Value source, Attribute spec) {
  RankedTensorType g = global(value);
  FailureOr<ShardingSpec> parsed = getShardingSpec(spec, mesh, g.getRank(), [&] {
    return mlir::emitError(source.getLoc()) << describe(source) << ": ";
  });
  if (failed(parsed))
    return failure();
  Sharding target = Sharding::replicated(g.getRank());
  for (int64_t d = 0; d < g.getRank(); ++d)
    target.dims[d] = DimShard(parsed->axes[d], parsed->blocks[d]);
  Operation *after = value.getDefiningOp()->getNextNode();
  llvm::SmallPtrSet<Operation *, 8> before(value.getUsers().begin(), value.getUsers().end());
  FailureOr<Value> v = reshard(value, target, after, "a user annotation");
  if (failed(v))
    return failure();
  if (*v != value) {
    value.replaceUsesWithIf(*v, [&](OpOperand &use) {
      return before.contains(use.getOwner());
    });
  }
  origins[*v] = {"annotation", source};
  return success();
}

LogicalResult Partitioner::conflict(Operation *op, Value a, Value b2) {
  Value x = origins[a].annotated, y = origins[b2].annotated;
  if (!x || !y || x == y)
    return success();
  InFlightDiagnostic diag = op->emitOpError()
                            << "conflicting sharding annotations meet here: " << str(sharding(a))
                            << " from " << describe(x) << " and " << str(sharding(b2)) << " from "
                            << describe(y);
  for (Value v : {x, y})
    diag.attachNote(v.getLoc()) << describe(v) << " is annotated \"" << annotationOf(v) << "\"";
  return failure();
}

/// What an op's sharding rule sees of the partitioner.
class RuleContext final : public ShardingRuleContext {
public:
  RuleContext(Partitioner &p) : p(p) {}
  RankedTensorType globalType(Value v) const override { return p.global(v); }
  const Sharding &sharding(Value v) const override { return p.sharding(v); }
  bool isAnnotated(Value v) const override { return p.isAnnotated(v); }
  LogicalResult conflict(Operation *op, Value a, Value b) override { return p.conflict(op, a, b); }
  const MeshInfo &mesh() const override { return p.meshInfo(); }

private:
  Partitioner &p;
};

LogicalResult Partitioner::processOp(Operation *op) {
  // The op's rule: operand shardings wanted, result shardings produced,
  // rescales. Constants are whole everywhere; an op without a rule computes
  // on whole tensors.
  RuleContext ctx(*this);
  for (Value v : op->getOperands())
    ctx.want.push_back(sharding(v));
  ctx.scale.assign(op->getNumResults(), 1.0);
  ctx.operandScale.assign(op->getNumOperands(), 1.0);
  auto rankR = [&](unsigned i) { return cast<RankedTensorType>(op->getResult(i).getType()).getRank(); };
  if (auto rule = dyn_cast<ShardingRuleOpInterface>(op)) {
    if (failed(rule.inferShardingRule(ctx)))
      return failure();
    if (ctx.out.size() != op->getNumResults() || ctx.want.size() != op->getNumOperands())
      return op->emitOpError() << "sharding rule gave " << ctx.out.size() << " result and "
                               << ctx.want.size() << " operand shardings";
  } else {
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      ctx.replicate(i, global(op->getOperand(i)).getRank());
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      ctx.out.push_back(Sharding::replicated(rankR(i)));
  }
  SmallVector<Sharding> &want = ctx.want, &out = ctx.out;
  SmallVector<double> &scale = ctx.scale, &operandScale = ctx.operandScale;
  int vocabAxis = ctx.vocabAxis;

  // A user annotation is only overridden by the op's needs, never by another
  // user annotation: that is a conflict the user must resolve.
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    Value vi = op->getOperand(i);
    if (!origins[vi].annotated || want[i].dims == sharding(vi).dims)
      continue;
    for (unsigned j = 0; j < op->getNumOperands(); ++j) {
      Value vj = op->getOperand(j);
      if (i != j && origins[vj].annotated && want[j].dims == sharding(vj).dims &&
          llvm::any_of(sharding(vj).dims, [](const DimShard &d) { return d.axis >= 0; }) &&
          failed(conflict(op, vj, vi)))
        return failure();
    }
  }

  // ZeRO-1 keeps gradients whole: the one an update reads (or its f32 copy's
  // source under mixed precision) is all-reduced, then sliced to the shard
  // the update works on right where it is read (the all-reduce itself moves
  // to the gradient's producer: ptc-bucket-collectives).
  const int gradientOperand = zero == 1 ? updateGradientOperand(op) : -1;
  if (gradientOperand >= 0 && isa<ConvertOp>(op)) {
    // The f32 copy is made of the shard: the update's parameter's split.
    Operation *update = *llvm::find_if(op->getResult(0).getUsers(), isUpdate);
    Sharding shard = sharding(update->getOperand(0));
    shard.partial.clear();
    want[0] = shard;
    out[0] = shard;
  }
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    wholeGradient = static_cast<int>(i) == gradientOperand;
    FailureOr<Value> v = reshard(op->getOperand(i), want[i], op, "operand #" + std::to_string(i));
    wholeGradient = false;
    if (failed(v))
      return failure();
    Value nv = *v;
    if (operandScale[i] != 1.0) {
      b.setInsertionPoint(op);
      Value scaled = ScaleOp::create(b, op->getLoc(), nv, b.getF64FloatAttr(operandScale[i]));
      Sharding sc = shardings[nv];
      RankedTensorType gt = globalType[nv];
      Origin org = origins[nv];
      shardings[scaled] = sc;
      globalType[scaled] = gt;
      origins[scaled] = org;
      nv = scaled;
    }
    op->setOperand(i, nv);
  }
  // Results inherit the annotated source of their first annotated operand.
  Value annotated;
  for (Value v : op->getOperands())
    if (!annotated)
      annotated = origins[v].annotated;
  auto constraints = op->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName);
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    Value r = op->getResult(i);
    if (failed(setResult(r, out[i], {"propagated", annotated}, op)))
      return failure();
    // After a rescale, the scaled copy is what the other users read.
    Value current = scale[i] != 1.0 ? rescale(r, scale[i]) : r;
    // A user annotation on the value: reshard right after it is computed.
    // (A unit entry: no constraint on this result.)
    if (constraints && i < constraints.size() && !isa<UnitAttr>(constraints[i]))
      if (failed(constrain(current, r, constraints[i])))
        return failure();
  }
  // Results the rule wants resharded right away (its users read the new copy).
  for (const ShardingRuleContext::Then &t : ctx.then) {
    Value r = op->getResult(t.result);
    if (t.target == sharding(r))
      continue;
    llvm::SmallPtrSet<Operation *, 8> users(r.getUsers().begin(), r.getUsers().end());
    FailureOr<Value> v = reshard(r, t.target, op->getNextNode(), t.why);
    if (failed(v))
      return failure();
    r.replaceUsesWithIf(*v, [&](OpOperand &use) { return users.contains(use.getOwner()); });
  }
  if (vocabAxis >= 0) {
    b.setInsertionPoint(op);
    ArrayAttr axes = b.getStrArrayAttr({mesh.axes[vocabAxis]});
    Operation *replacement =
        isa<CrossEntropyOp>(op)
            ? VocabParallelCrossEntropyOp::create(b, op->getLoc(), op->getResult(0).getType(),
                                                  op->getOperand(0), op->getOperand(1), axes)
                  .getOperation()
            : VocabParallelCrossEntropyGradOp::create(b, op->getLoc(), op->getResult(0).getType(),
                                                      op->getOperand(0), op->getOperand(1),
                                                      op->getOperand(2), axes)
                  .getOperation();
    Value old = op->getResult(0), now = replacement->getResult(0);
    Sharding sh = shardings[old];
    RankedTensorType gt = globalType[old];
    Origin org = origins[old];
    shardings[now] = sh;
    globalType[now] = gt;
    origins[now] = org;
    old.replaceAllUsesWith(now);
    op->erase();
  }
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
  // The batch of inputs goes to dp; with expert parallelism to dp*ep (each
  // ep rank takes its own rows of its dp rank's batch).
  int batch = mesh.batchAxis();
  int batchArg = mesh.parts(batch).empty() ? -1 : mesh.parts(batch).front();
  SmallVector<BlockArgument> refineBatch;
  FailureOr<llvm::DenseMap<BlockArgument, std::string>> tensorParallel =
      megatronDefaults(func, mesh, sequenceParallel);
  if (failed(tensorParallel))
    return failure();
  llvm::DenseMap<BlockArgument, std::string> defaults = std::move(*tensorParallel);
  if (failed(expertDefaults(func, mesh, defaults)))
    return failure();
  zeroDefaults(func, mesh, zero, defaults);
  // 1. Arguments.
  for (BlockArgument arg : block.getArguments()) {
    auto g = dyn_cast<RankedTensorType>(arg.getType());
    if (!g)
      return func.emitError() << "argument #" << arg.getArgNumber() << " is not a ranked tensor";
    Sharding s = Sharding::replicated(g.getRank());
    Origin origin{"default", {}};
    if (Attribute spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName)) {
      FailureOr<ShardingSpec> parsed = getShardingSpec(
          spec, mesh, g.getRank(),
          [&] { return mlir::emitError(arg.getLoc()) << describe(arg) << ": "; });
      if (failed(parsed))
        return failure();
      for (int64_t d = 0; d < g.getRank(); ++d)
        s.dims[d] = DimShard(parsed->axes[d], parsed->blocks[d]);
      origin = {"annotation", arg};
    } else if (auto it = defaults.find(arg); it != defaults.end()) {
      FailureOr<ShardingSpec> parsed =
          parseShardingSpec(it->second, mesh, g.getRank(), [&] { return func.emitError(); });
      if (failed(parsed))
        return failure();
      for (int64_t d = 0; d < g.getRank(); ++d)
        s.dims[d] = DimShard(parsed->axes[d], parsed->blocks[d]);
      origin = {"default rule", {}};
    } else if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName) && batch >= 0 &&
               g.getRank() >= 1) {
      // Default rule: the batch dimension of inputs goes to dp (or ep). The
      // plan loads dp's rows; a compound batch axis slices them over ep on
      // entry.
      s.dims[0] = batchArg;
      origin = {"default: batch -> " + mesh.axes[batchArg], {}};
      if (batch != batchArg)
        refineBatch.push_back(arg);
    }
    int tp = mesh.axisIndex(MeshAxisRole::Tensor);
    if (sequenceParallel && tp >= 0 && mesh.sizes[tp] > 1 && g.getRank() >= 2 &&
        !func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName) &&
        func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName)) {
      s.dims[1] = tp; // sequence parallelism: the sequence dimension goes to tp
      origin.how += ", sequence -> tp";
    }
    if (failed(setResult(arg, s, origin, nullptr)))
      return failure();
  }
  // 2. Ops in program order (collectives and rescales inserted on the way).
  SmallVector<Operation *> ops;
  for (Operation &op : block)
    ops.push_back(&op);
  for (BlockArgument arg : refineBatch) {
    if (arg.use_empty())
      continue;
    Sharding target = sharding(arg);
    target.dims[0] = DimShard(batch);
    FailureOr<Value> rows = reshard(arg, target, ops.front(), "expert parallelism: ep ranks take "
                                                              "their own rows of dp's batch");
    if (failed(rows))
      return failure();
    arg.replaceAllUsesExcept(*rows, rows->getDefiningOp());
    origins[*rows] = {"default: batch -> " + mesh.name(batch), {}};
  }
  for (Operation *op : ops) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      if (failed(processReturn(ret)))
        return failure();
      continue;
    }
    if (failed(processOp(op)))
      return failure();
  }
  // 3. Record the shardings, annotate arguments, retype the function.
  Builder builder(func.getContext());
  for (Operation &op : block) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<Attribute> strs;
    for (Value r : op.getResults())
      strs.push_back(builder.getStringAttr(str(sharding(r)) + " (" + origins[r].how + ")"));
    op.setAttr("ptc.shardings", builder.getArrayAttr(strs));
  }
  // All argument attributes in one update (one setArgAttr per argument
  // rebuilds the whole array each time: quadratic in the parameter count).
  SmallVector<DictionaryAttr> argAttrs;
  func.getAllArgAttrs(argAttrs);
  for (BlockArgument arg : block.getArguments()) {
    NamedAttrList attrs(argAttrs[arg.getArgNumber()]);
    const Sharding &sh = sharding(arg);
    SmallVector<int> axes, blocks;
    for (const DimShard &d : sh.dims) {
      axes.push_back(d.axis);
      blocks.push_back(d.blocks);
    }
    attrs.set(PtcDialect::kShardingAttrName,
              getShardingAttr(func.getContext(), mesh, axes, blocks, sh.partial));
    argAttrs[arg.getArgNumber()] = attrs.getDictionary(func.getContext());
  }
  func.setAllArgAttrs(argAttrs);
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  func.setType(builder.getFunctionType(block.getArgumentTypes(), ret.getOperandTypes()));
  return success();
}

} // namespace

LogicalResult mlir::ptc::checkZeroOptions(Operation *at, int64_t zero, bool reshardAfterForward) {
  if (zero < 0 || zero > 3)
    return at->emitError() << "zero = " << zero << " is not a ZeRO stage (0, 1, 2 or 3)";
  if (!reshardAfterForward && zero != 3)
    return at->emitError() << "reshard-after-forward=false keeps ZeRO-3's gathered parameters "
                              "from the forward to the backward pass; it needs zero=3, not zero="
                           << zero;
  return success();
}

namespace {
struct ShardPass : mlir::ptc::impl::ShardPassBase<ShardPass> {
  using ShardPassBase::ShardPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto emit = [&] { return module.emitError(); };
    FailureOr<MeshInfo> meshInfo =
        mesh.empty() ? getEnclosingMesh(module) : parseMeshSpec(mesh, emit);
    // zero= and sequence-parallel= that cannot take effect change nothing
    // but are never silent: a warning naming the axis they need.
    if (failed(meshInfo) && mesh.empty() && (zero > 0 || sequenceParallel) &&
        !module->hasAttr(PtcDialect::kMeshAttrName)) {
      if (zero > 0)
        module.emitWarning() << "zero=" << zero.getValue() << " has no effect: it shards over the '"
                             << meshAxisName(MeshAxisRole::Data)
                             << "' mesh axis, and there is no mesh (add mesh=dp:N)";
      if (sequenceParallel)
        module.emitWarning() << "sequence-parallel=true has no effect: it splits over the '"
                             << meshAxisName(MeshAxisRole::Tensor)
                             << "' mesh axis, and there is no mesh (add mesh=tp:N)";
      return;
    }
    if (failed(meshInfo)) {
      if (mesh.empty())
        module.emitError() << "ptc-shard needs a mesh: mesh=dp:2,tp:2 or a 'ptc.mesh' module attribute";
      return signalPassFailure();
    }
    module->setAttr(PtcDialect::kMeshAttrName, meshInfo->toAttr(&getContext()));
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal() || !func.getBody().hasOneBlock())
        continue;
      if (failed(checkZeroOptions(module, zero, reshardAfterForward)))
        return signalPassFailure();
      int dpAxis = meshInfo->axisIndex(MeshAxisRole::Data);
      int epAxis = meshInfo->axisIndex(MeshAxisRole::Expert);
      if (zero > 0 && (dpAxis < 0 || meshInfo->sizes[dpAxis] < 2) &&
          (epAxis < 0 || meshInfo->sizes[epAxis] < 2))
        module.emitWarning() << "zero=" << zero.getValue() << " has no effect: it shards over the '"
                             << meshAxisName(MeshAxisRole::Data)
                             << "' mesh axis, and the mesh has none of size >= 2";
      int tpAxis = meshInfo->axisIndex(MeshAxisRole::Tensor);
      if (sequenceParallel && (tpAxis < 0 || meshInfo->sizes[tpAxis] < 2))
        module.emitWarning() << "sequence-parallel=true has no effect: it splits over the '"
                             << meshAxisName(MeshAxisRole::Tensor)
                             << "' mesh axis, and the mesh has none of size >= 2";
      Partitioner partitioner(func, *meshInfo, sequenceParallel, zero, reshardAfterForward);
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
