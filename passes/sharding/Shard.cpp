//===- Shard.cpp - sharding propagation, local shapes, collectives --------===//
//
// One pass in program order over the (single-block) training step:
//   1. argument shardings: annotation > default rule (inputs: batch -> dp);
//   2. per op, a rule maps operand shardings to the operand shardings it
//      needs and to its result shardings; mismatching operands are resharded
//      (all_reduce / all_gather / shard_slice inserted right before the op);
//   3. results get local types; means over sharded rows are rescaled;
//   4. the return needs losses replicated and updates like their argument;
//   5. all-reduces that are ready together are merged into buckets.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"
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

class Partitioner {
public:
  Partitioner(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel, int zero)
      : func(func), mesh(mesh), b(func), sequenceParallel(sequenceParallel), zero(zero) {}

  LogicalResult run();
  SmallVector<Collective> collectives;

  std::string str(const Sharding &s) const {
    std::string out = "[";
    for (auto [i, a] : llvm::enumerate(s.dims))
      out += (i ? ", " : "") +
             (a.axis < 0 ? std::string("_")
                         : mesh.axes[a.axis] + (a.blocks > 1 ? "/" + std::to_string(a.blocks) : ""));
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
  LogicalResult constrain(Value value, Value source, StringRef spec);
  /// The annotation text of an annotated argument or op result.
  std::string annotationOf(Value v);

  func::FuncOp func;
  const MeshInfo &mesh;
  OpBuilder b;
  bool sequenceParallel;
  int zero;
  llvm::DenseMap<Value, Sharding> shardings;
  llvm::DenseMap<Value, Origin> origins;
  llvm::DenseMap<Value, RankedTensorType> globalType;
  std::map<std::pair<void *, std::string>, Value> reshardCache;
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
    if (shape[d] % (mesh.sizes[a] * ds.blocks) != 0) {
      InFlightDiagnostic diag = where ? where->emitOpError() : mlir::emitError(v.getLoc());
      diag << describe(v) << " dimension " << d << " (size " << shape[d]
           << ") is not divisible by mesh axis '" << mesh.axes[a] << "' (size " << mesh.sizes[a]
           << ")" << (ds.blocks > 1 ? " times its " + std::to_string(ds.blocks) + " blocks" : "");
      return failure();
    }
    shape[d] /= mesh.sizes[a];
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
  shardings[r] = s;
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
  auto arg = dyn_cast<BlockArgument>(v);
  bool reuse = !(zero >= 3 && arg && func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName));
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
  for (int a : SmallVector<int>(reduce)) {
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
  // 2. A split moving from one dimension to another on the same axis: all_to_all.
  for (size_t d1 = 0; d1 < curS.dims.size(); ++d1) {
    DimShard a = curS.dims[d1];
    if (a.axis < 0 || a.blocks != 1 || target.dims[d1].axis == a.axis)
      continue;
    for (size_t d2 = 0; d2 < curS.dims.size(); ++d2) {
      if (d2 == d1 || curS.dims[d2].axis >= 0 || target.dims[d2] != DimShard(a.axis))
        continue;
      Sharding next = curS;
      next.dims[d1] = DimShard();
      next.dims[d2] = DimShard(a.axis);
      FailureOr<RankedTensorType> type = localType(v, g, next, user);
      if (failed(type))
        return failure();
      auto a2a = AllToAllOp::create(b, loc, *type, cur, b.getStrArrayAttr({mesh.axes[a.axis]}),
                                    b.getI64IntegerAttr(static_cast<int64_t>(d2)),
                                    b.getI64IntegerAttr(static_cast<int64_t>(d1)));
      collectives.push_back({a2a, cause("all_to_all")});
      cur = a2a;
      curS = next;
      break;
    }
  }
  // 3. Per dimension: gather what the consumer wants whole, slice what it wants split.
  for (size_t d = 0; d < curS.dims.size(); ++d) {
    DimShard a = curS.dims[d], want = target.dims[d];
    if (a == want)
      continue;
    if (a.axis >= 0) {
      Sharding next = curS;
      next.dims[d] = DimShard();
      auto type = cast<RankedTensorType>(localType(v, g, next, user).value());
      auto ag = AllGatherOp::create(b, loc, type, cur, b.getStrArrayAttr({mesh.axes[a.axis]}),
                                    b.getI64IntegerAttr(static_cast<int64_t>(d)),
                                    b.getI64IntegerAttr(a.blocks));
      collectives.push_back({ag, cause("all_gather")});
      cur = ag;
      curS = next;
    }
    if (want.axis >= 0) {
      Sharding next = curS;
      next.dims[d] = want;
      FailureOr<RankedTensorType> type = localType(v, g, next, user);
      if (failed(type))
        return failure();
      cur = ShardSliceOp::create(b, loc, *type, cur, b.getStrArrayAttr({mesh.axes[want.axis]}),
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
  if (auto arg = dyn_cast<BlockArgument>(v))
    if (auto spec = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kShardingAttrName))
      return spec.str();
  if (auto res = dyn_cast<OpResult>(v))
    if (auto specs = res.getOwner()->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName))
      if (res.getResultNumber() < specs.size())
        if (auto spec = dyn_cast<StringAttr>(specs[res.getResultNumber()]))
          return spec.str();
  return "";
}

LogicalResult Partitioner::constrain(Value value, Value source, StringRef spec) {
  RankedTensorType g = global(value);
  FailureOr<ShardingSpec> parsed = parseShardingSpec(spec, mesh, g.getRank(), [&] {
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

  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    FailureOr<Value> v = reshard(op->getOperand(i), want[i], op, "operand #" + std::to_string(i));
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
    if (constraints && i < constraints.size())
      if (auto spec = dyn_cast<StringAttr>(constraints[i]);
          spec && failed(constrain(current, r, spec.getValue())))
        return failure();
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

/// Follows reshapes and transposes back to the value they view.
Value stripViews(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (!isa<ReshapeOp, TransposeOp>(def))
      break;
    v = def->getOperand(0);
  }
  return v;
}

/// Default rule for tensor parallelism (Megatron-LM): in every linear layer
/// x @ W^T of the forward pass, W is column-parallel ("[tp, _]", its bias
/// "[tp]") when its output feeds an activation or is cut into equal slices
/// (a fused QKV projection: "[tp/3, _]", split by heads), and row-parallel
/// ("[_, tp]") when its input comes from attention or an activation. An
/// embedding table used as the LM head stays replicated. Optimizer state
/// follows its parameter.
FailureOr<llvm::DenseMap<BlockArgument, std::string>>
megatronDefaults(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel) {
  llvm::DenseMap<BlockArgument, std::string> specs;
  int tp = mesh.axisIndex(MeshAxisRole::Tensor);
  if (tp < 0 || mesh.sizes[tp] < 2)
    return specs;
  int64_t tpSize = mesh.sizes[tp];
  // A layer the rules recognize but the axis cannot split is an error naming
  // both: running it replicated would waste every tp rank but one.
  bool indivisible = false;
  auto paramName = [&](BlockArgument w) {
    return func.getArgAttrOfType<StringAttr>(w.getArgNumber(), PtcDialect::kParamAttrName).str();
  };
  auto cannotSplit = [&](Operation *at, BlockArgument w, StringRef how, int64_t features,
                         int64_t blocks) {
    InFlightDiagnostic diag = mlir::emitError(at->getLoc())
                              << "mesh axis '" << mesh.axes[tp] << "' (size " << tpSize
                              << ") cannot split parameter '" << paramName(w) << "' " << how
                              << ": its " << features << " features";
    if (blocks > 1)
      diag << " are " << blocks << " blocks of " << features / blocks << ", which are not";
    else
      diag << " are not";
    diag << " divisible by " << tpSize;
    if (blocks > 1)
      diag << " (a fused attention projection: the head count must be divisible by the tp size)";
    indivisible = true;
  };
  // A parameter, or its low-precision working copy (mixed precision).
  auto param = [&](Value v) -> BlockArgument {
    if (auto convert = v.getDefiningOp<ConvertOp>())
      v = convert.getInput();
    auto arg = dyn_cast<BlockArgument>(v);
    return arg && func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName) ? arg
                                                                                    : BlockArgument();
  };
  auto usedByEmbedding = [](BlockArgument w) {
    for (Operation *u : w.getUsers()) {
      if (isa<EmbeddingOp>(u))
        return true;
      if (isa<ConvertOp>(u) && llvm::any_of(u->getUsers(), [](Operation *c) {
            return isa<EmbeddingOp>(c);
          }))
        return true;
    }
    return false;
  };
  // Vocabulary-parallel embedding (and so LM head, when tied): rows over tp.
  // With sequence parallelism the lookup's tokens are split over tp already,
  // so the table stays whole there.
  if (!sequenceParallel)
    func.walk([&](EmbeddingOp e) {
      BlockArgument table = param(e.getTable());
      if (!table)
        return;
      int64_t vocab = e.getTable().getType().getDimSize(0);
      if (vocab % tpSize == 0)
        specs.try_emplace(table, "[" + mesh.axes[tp] + ", _]");
      else
        mlir::emitWarning(e.getLoc())
            << "the table '" << paramName(table) << "' stays whole on every '" << mesh.axes[tp]
            << "' rank: its vocabulary of " << vocab << " is not divisible by " << tpSize;
    });
  func.walk([&](MatmulOp mm) {
    BlockArgument w = param(mm.getRhs());
    if (!w || !mm.getTransposeRhs() || mm.getTransposeLhs() || mm.getRhs().getType().getRank() != 2)
      return;
    if (usedByEmbedding(w))
      return; // tied LM head: follows the embedding rule
    int64_t outFeatures = mm.getRhs().getType().getDimSize(0);
    int64_t inFeatures = mm.getRhs().getType().getDimSize(1);
    Operation *src = stripViews(mm.getLhs()).getDefiningOp();
    if (src && (isa<CausalAttentionOp>(src) || isa<ElementwiseFunctionOpInterface>(src))) {
      if (inFeatures % tpSize == 0)
        specs.try_emplace(w, "[_, " + mesh.axes[tp] + "]");
      else
        cannotSplit(mm, w, "by rows (row-parallel)", inFeatures, 1);
      return;
    }
    Value out = mm.getResult();
    BlockArgument bias;
    if (out.hasOneUse())
      if (auto add = dyn_cast<AddOp>(*out.getUsers().begin()))
        if (BlockArgument b = param(add.getRhs()); b && add.getRhs().getType().getRank() == 1) {
          bias = b;
          out = add.getResult();
        }
    int64_t blocks = 0;
    bool activation = !out.use_empty() && llvm::all_of(out.getUsers(), [](Operation *u) {
      return isa<ElementwiseFunctionOpInterface>(u);
    });
    if (activation) {
      blocks = 1;
    } else if (!out.use_empty() && llvm::all_of(out.getUsers(), [](Operation *u) {
                 return isa<SliceOp>(u);
               })) {
      int64_t piece = cast<SliceOp>(*out.getUsers().begin()).getType().getShape().back();
      bool equal = llvm::all_of(out.getUsers(), [&](Operation *u) {
        auto sl = cast<SliceOp>(u);
        return sl.getType().getShape().back() == piece && sl.getOffsets().back() % piece == 0;
      });
      if (equal && piece > 0 && outFeatures % piece == 0)
        blocks = outFeatures / piece;
    }
    if (blocks == 0)
      return;
    if (outFeatures % (tpSize * blocks) != 0) {
      cannotSplit(mm, w, "by columns (column-parallel)", outFeatures, blocks);
      return;
    }
    std::string tpName = meshAxisName(MeshAxisRole::Tensor).str();
    std::string axis = blocks > 1 ? tpName + "/" + std::to_string(blocks) : tpName;
    specs.try_emplace(w, "[" + axis + ", _]");
    if (bias)
      specs.try_emplace(bias, "[" + axis + "]");
  });
  // Optimizer state is sharded like its parameter.
  func.walk([&](Operation *op) {
    if (!isa<AdamWUpdateOp, SgdUpdateOp>(op))
      return;
    auto p = dyn_cast<BlockArgument>(op->getOperand(0));
    auto it = p ? specs.find(p) : specs.end();
    if (it == specs.end())
      return;
    std::string spec = it->second;
    for (Value v : op->getOperands().drop_front(2))
      if (auto state = dyn_cast<BlockArgument>(v);
          state && cast<RankedTensorType>(state.getType()).getRank() > 0)
        specs.try_emplace(state, spec);
  });
  if (indivisible)
    return failure();
  return specs;
}

/// ZeRO as sharding: optimizer state (stage >= 1) and parameters (stage 3)
/// split over dp along their first dimension that no other axis splits and
/// that dp divides, on top of the tensor-parallel defaults.
void zeroDefaults(func::FuncOp func, const MeshInfo &mesh, int zero,
                  llvm::DenseMap<BlockArgument, std::string> &specs) {
  int dp = mesh.axisIndex(MeshAxisRole::Data);
  if (zero < 1 || dp < 0 || mesh.sizes[dp] < 2)
    return;
  int64_t dpSize = mesh.sizes[dp];
  auto withDp = [&](BlockArgument arg) -> std::optional<std::string> {
    auto type = cast<RankedTensorType>(arg.getType());
    if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName))
      return std::nullopt; // user annotations stand
    FailureOr<ShardingSpec> base = ShardingSpec{SmallVector<int>(type.getRank(), -1),
                                                SmallVector<int>(type.getRank(), 1)};
    if (auto it = specs.find(arg); it != specs.end())
      base = parseShardingSpec(it->second, mesh, type.getRank(), [&] { return func.emitError(); });
    if (failed(base))
      return std::nullopt;
    std::string out = "[";
    bool placed = false;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      std::string entry = "_";
      int a = base->axes[d];
      if (a >= 0)
        entry = mesh.axes[a] + (base->blocks[d] > 1 ? "/" + std::to_string(base->blocks[d]) : "");
      else if (!placed && type.getDimSize(d) % dpSize == 0) {
        entry = meshAxisName(MeshAxisRole::Data).str();
        placed = true;
      }
      out += (d ? ", " : "") + entry;
    }
    if (!placed)
      return std::nullopt;
    return out + "]";
  };
  func.walk([&](Operation *op) {
    if (!isa<AdamWUpdateOp, SgdUpdateOp>(op))
      return;
    auto param = dyn_cast<BlockArgument>(op->getOperand(0));
    if (!param)
      return;
    std::optional<std::string> spec = withDp(param);
    if (!spec)
      return;
    for (Value v : op->getOperands().drop_front(2))
      if (auto state = dyn_cast<BlockArgument>(v);
          state && cast<RankedTensorType>(state.getType()).getRank() > 0)
        specs[state] = *spec;
    if (zero >= 3)
      specs[param] = *spec;
  });
}

LogicalResult Partitioner::run() {
  Block &block = func.getBody().front();
  int dp = mesh.axisIndex(MeshAxisRole::Data);
  FailureOr<llvm::DenseMap<BlockArgument, std::string>> tensorParallel =
      megatronDefaults(func, mesh, sequenceParallel);
  if (failed(tensorParallel))
    return failure();
  llvm::DenseMap<BlockArgument, std::string> defaults = std::move(*tensorParallel);
  zeroDefaults(func, mesh, zero, defaults);
  // 1. Arguments.
  for (BlockArgument arg : block.getArguments()) {
    auto g = dyn_cast<RankedTensorType>(arg.getType());
    if (!g)
      return func.emitError() << "argument #" << arg.getArgNumber() << " is not a ranked tensor";
    Sharding s = Sharding::replicated(g.getRank());
    Origin origin{"default", {}};
    if (auto spec = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                      PtcDialect::kShardingAttrName)) {
      FailureOr<ShardingSpec> parsed = parseShardingSpec(
          spec.getValue(), mesh, g.getRank(),
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
    } else if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName) && dp >= 0 &&
               g.getRank() >= 1 && mesh.sizes[dp] > 1) {
      s.dims[0] = dp; // default rule: the batch dimension of inputs goes to dp
      origin = {"default: batch -> dp", {}};
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
    attrs.set(PtcDialect::kShardingAttrName, builder.getStringAttr(str(sharding(arg))));
    argAttrs[arg.getArgNumber()] = attrs.getDictionary(func.getContext());
  }
  func.setAllArgAttrs(argAttrs);
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  func.setType(builder.getFunctionType(block.getArgumentTypes(), ret.getOperandTypes()));
  return success();
}

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
void bucketAllReduces(func::FuncOp func, double capBytes, SmallVector<Collective> &collectives) {
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
        for (Collective &c : collectives)
          if (c.op == ar.getOperation()) {
            cause += "\n      " + c.cause;
            c.op = nullptr;
          }
        ar.getResult(0).replaceAllUsesWith(merged.getResult(i));
        ar.erase();
      }
      SmallVector<Attribute> strs(merged.getNumResults(),
                                  StringAttr::get(func.getContext(), "(bucketed all_reduce)"));
      merged->setAttr("ptc.shardings", ArrayAttr::get(func.getContext(), strs));
      collectives.push_back({merged, cause});
    }
    pending.clear();
    bucket.members.clear();
    bucket.bytes = 0;
  };
  for (Operation &op : llvm::make_early_inc_range(block)) {
    // A reader of a pending result closes that bucket first.
    for (auto &[k, bucket] : open)
      if (llvm::any_of(op.getOperands(), [&](Value v) {
            return v.getDefiningOp() && bucket.members.contains(v.getDefiningOp());
          }))
        flush(bucket);
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
      if (zero < 0 || zero > 3) {
        module.emitError() << "zero = " << zero.getValue() << " is not a ZeRO stage (0, 1, 2 or 3)";
        return signalPassFailure();
      }
      int dpAxis = meshInfo->axisIndex(MeshAxisRole::Data);
      if (zero > 0 && (dpAxis < 0 || meshInfo->sizes[dpAxis] < 2))
        module.emitWarning() << "zero=" << zero.getValue() << " has no effect: it shards over the '"
                             << meshAxisName(MeshAxisRole::Data)
                             << "' mesh axis, and the mesh has none of size >= 2";
      int tpAxis = meshInfo->axisIndex(MeshAxisRole::Tensor);
      if (sequenceParallel && (tpAxis < 0 || meshInfo->sizes[tpAxis] < 2))
        module.emitWarning() << "sequence-parallel=true has no effect: it splits over the '"
                             << meshAxisName(MeshAxisRole::Tensor)
                             << "' mesh axis, and the mesh has none of size >= 2";
      Partitioner partitioner(func, *meshInfo, sequenceParallel, zero);
      if (failed(partitioner.run()))
        return signalPassFailure();
      hoistReductions(func);
      bucketAllReduces(func, bucketMb * 1024.0 * 1024.0, partitioner.collectives);
      if (explain)
        report(func, *meshInfo, partitioner.collectives);
      if (gradReduceDtype == "bf16") {
        reduceInBf16(func, dpAxis);
      } else if (gradReduceDtype != "f32") {
        module.emitError() << "grad-reduce-dtype must be f32 or bf16, got '"
                           << gradReduceDtype.getValue() << "'";
        return signalPassFailure();
      }
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

  void report(func::FuncOp func, const MeshInfo &meshInfo, ArrayRef<Collective> collectives) {
    llvm::raw_ostream &os = llvm::outs();
    double alpha = alphaUs * 1e-6, beta = betaGbps * 1e9;
    double total = 0;
    int count = 0;
    os << "ptc-shard @" << func.getSymName() << " on mesh";
    for (auto [a, s] : llvm::zip(meshInfo.axes, meshInfo.sizes))
      os << " " << a << "=" << s;
    os << "\n";
    for (const Collective &c : collectives) {
      if (!c.op)
        continue;
      int64_t p = 1;
      for (Attribute a : c.op->getAttrOfType<ArrayAttr>("axes"))
        p *= meshInfo.sizes[meshInfo.axisIndex(cast<StringAttr>(a).getValue())];
      int64_t bytes = 0;
      double seconds = 0;
      if (isa<AllReduceOp>(c.op)) {
        for (Value v : c.op->getOperands())
          bytes += getTensorBytes(cast<RankedTensorType>(v.getType()));
        // Ring all-reduce: reduce-scatter + all-gather.
        seconds = 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * bytes / beta;
      } else if (isa<AllToAllOp>(c.op)) {
        bytes = getTensorBytes(cast<RankedTensorType>(c.op->getOperand(0).getType()));
        seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
      } else if (isa<ReduceScatterOp>(c.op)) {
        bytes = getTensorBytes(cast<RankedTensorType>(c.op->getOperand(0).getType()));
        seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
      } else {
        bytes = getTensorBytes(cast<RankedTensorType>(c.op->getResult(0).getType()));
        seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
      }
      total += seconds;
      ++count;
      os << "  " << c.op->getName().getStringRef() << " over " << c.op->getAttr("axes") << " at "
         << c.op->getLoc() << ": " << bytes << " bytes per device, est. "
         << llvm::format("%.1f", seconds * 1e6) << " us\n    " << c.cause << "\n";
    }
    os << "  " << count << " collectives, est. " << llvm::format("%.1f", total * 1e6)
       << " us per step (alpha " << llvm::format("%g", alphaUs.getValue()) << " us, beta "
       << llvm::format("%g", betaGbps.getValue()) << " GB/s)\n";
    os.flush();
  }
};
} // namespace
