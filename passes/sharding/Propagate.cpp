//===- Propagate.cpp - sharding propagation -------------------------------===//
//
// ptc-propagate-sharding, the first sharding phase, in program order over the
// (single-block) training step:
//   1. argument shardings: annotation > default rule (ShardingDefaults.cpp:
//      Megatron's tensor-parallel splits, experts over ep, ZeRO over dp;
//      inputs: batch -> dp, sequence -> tp under sequence parallelism);
//   2. per op, its rule (ShardingRuleOpInterface) maps the shardings its
//      operands arrive with to the ones it needs and to its results';
//      results annotated by the user are resharded to the annotation.
// Nothing is rewritten: the decisions are recorded as typed attributes
// (ShardingPhases.h) for ptc-partition, which inserts the collectives.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "passes/sharding/ShardingDefaults.h"
#include "passes/sharding/ShardingPhases.h"

#include "mlir/IR/Builders.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_PROPAGATESHARDINGPASS
#include "passes/sharding/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using namespace mlir::ptc::sharding;

namespace {

/// Why a result annotation stands: the user's, or one a pass placed.
std::string annotationReason(Operation *op) {
  if (op->hasAttr(PtcDialect::kMuonStackAttrName))
    return "Muon's stack of matrices to orthogonalize";
  if (op->hasAttr(PtcDialect::kMuonOrthogonalAttrName))
    return "Muon's orthogonalized stack, back to its parameters' split";
  for (Operation *user : op->getUsers())
    if (user->hasAttr(PtcDialect::kMuonStackAttrName))
      return "a matrix joining Muon's stack of unlike splits";
  return "a user annotation";
}

/// Where a value's sharding came from, for diagnostics and `ptc.sharding_origins`.
struct Origin {
  std::string how; // "annotation", "default", "propagated", "reshard"
  Value annotated; // the annotated argument or op result this sharding derives from, if any
};

class Propagation {
public:
  Propagation(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel, int zero,
              bool reshardAfterForward)
      : func(func), mesh(mesh), b(func.getContext()), sequenceParallel(sequenceParallel),
        zero(zero), reshardAfterForward(reshardAfterForward) {}

  LogicalResult run();

  // For the ops' sharding rules (RuleContext).
  const Sharding &sharding(Value v) { return shardings[v]; }
  bool isAnnotated(Value v) { return static_cast<bool>(origins[v].annotated); }
  LogicalResult conflict(Operation *op, Value a, Value b);
  const MeshInfo &meshInfo() const { return mesh; }

private:
  LogicalResult processOp(Operation *op);
  /// Records `s` as what the users of `v` read, after checking that it fits.
  LogicalResult publish(Value v, const Sharding &s, Origin origin, Operation *where);
  /// The annotation text of an annotated argument or op result.
  std::string annotationOf(Value v);
  Attribute attr(const Sharding &s) { return getShardingAttr(b.getContext(), mesh, s); }

  func::FuncOp func;
  const MeshInfo &mesh;
  Builder b;
  bool sequenceParallel;
  int zero;
  bool reshardAfterForward;
  /// What the users of each value read (after the reshards the partitioner
  /// will insert right after its producer).
  llvm::DenseMap<Value, Sharding> shardings;
  llvm::DenseMap<Value, Origin> origins;
};

/// What an op's sharding rule sees of the propagation.
class RuleContext final : public ShardingRuleContext {
public:
  RuleContext(Propagation &p) : p(p) {}
  RankedTensorType globalType(Value v) const override {
    return cast<RankedTensorType>(v.getType());
  }
  const Sharding &sharding(Value v) const override { return p.sharding(v); }
  bool isAnnotated(Value v) const override { return p.isAnnotated(v); }
  LogicalResult conflict(Operation *op, Value a, Value b) override { return p.conflict(op, a, b); }
  const MeshInfo &mesh() const override { return p.meshInfo(); }

private:
  Propagation &p;
};

LogicalResult Propagation::publish(Value v, const Sharding &s, Origin origin, Operation *where) {
  Sharding normalized = normalizePartial(mesh, s);
  if (failed(localType(func, mesh, v, cast<RankedTensorType>(v.getType()), normalized, where)))
    return failure();
  shardings[v] = normalized;
  origins[v] = std::move(origin);
  return success();
}

std::string Propagation::annotationOf(Value v) {
  Attribute spec;
  if (auto arg = dyn_cast<BlockArgument>(v))
    spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName);
  if (auto res = dyn_cast<OpResult>(v))
    if (auto specs = res.getOwner()->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName))
      if (res.getResultNumber() < specs.size())
        spec = specs[res.getResultNumber()];
  if (auto t = dyn_cast_or_null<StringAttr>(spec))
    return t.str();
  if (auto typed = dyn_cast_or_null<ShardingAttr>(spec))
    return shardingText(typed);
  return "";
}

LogicalResult Propagation::conflict(Operation *op, Value a, Value b2) {
  Value x = origins[a].annotated, y = origins[b2].annotated;
  if (!x || !y || x == y)
    return success();
  InFlightDiagnostic diag = op->emitOpError()
                            << "conflicting sharding annotations meet here: "
                            << text(mesh, sharding(a)) << " from " << describe(func, x) << " and "
                            << text(mesh, sharding(b2)) << " from " << describe(func, y);
  for (Value v : {x, y})
    diag.attachNote(v.getLoc()) << describe(func, v) << " is annotated \"" << annotationOf(v)
                                << "\"";
  return failure();
}

LogicalResult Propagation::processOp(Operation *op) {
  // The op's rule: operand shardings wanted, result shardings produced,
  // rescales. Constants are whole everywhere; an op without a rule computes
  // on whole tensors.
  RuleContext ctx(*this);
  for (Value v : op->getOperands())
    ctx.want.push_back(sharding(v));
  ctx.scale.assign(op->getNumResults(), 1.0);
  ctx.operandScale.assign(op->getNumOperands(), 1.0);
  auto rankOf = [](Value v) { return cast<RankedTensorType>(v.getType()).getRank(); };
  if (auto rule = dyn_cast<ShardingRuleOpInterface>(op)) {
    if (failed(rule.inferShardingRule(ctx)))
      return failure();
    if (ctx.out.size() != op->getNumResults() || ctx.want.size() != op->getNumOperands())
      return op->emitOpError() << "sharding rule gave " << ctx.out.size() << " result and "
                               << ctx.want.size() << " operand shardings";
  } else {
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      ctx.replicate(i, rankOf(op->getOperand(i)));
    for (Value r : op->getResults())
      ctx.out.push_back(Sharding::replicated(rankOf(r)));
  }
  SmallVector<Sharding> &want = ctx.want, &out = ctx.out;

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
    Operation *update = *llvm::find_if(op->getResult(0).getUsers(), isFusedUpdate);
    Sharding shard = sharding(update->getOperand(0));
    shard.partial.clear();
    want[0] = shard;
    out[0] = shard;
  }
  if (gradientOperand >= 0)
    op->setAttr(kWholeGradient, b.getI64IntegerAttr(gradientOperand));

  // Results inherit the annotated source of their first annotated operand.
  Value annotated;
  for (Value v : op->getOperands())
    if (!annotated)
      annotated = origins[v].annotated;
  auto constraints = op->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName);
  SmallVector<Attribute> produced, origin, reshards;
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    Value r = op->getResult(i);
    if (failed(publish(r, out[i], {"propagated", annotated}, op)))
      return failure();
    produced.push_back(attr(sharding(r)));
    origin.push_back(b.getStringAttr(origins[r].how));
  }
  // Results the rule wants resharded right away (its users read the new copy).
  for (const ShardingRuleContext::Then &t : ctx.then) {
    Value r = op->getResult(t.result);
    if (t.target == sharding(r))
      continue;
    if (failed(publish(r, t.target, {"reshard", origins[r].annotated}, op)))
      return failure();
    reshards.push_back(b.getDictionaryAttr({b.getNamedAttr("result", b.getI64IntegerAttr(t.result)),
                                            b.getNamedAttr("to", attr(sharding(r))),
                                            b.getNamedAttr("why", b.getStringAttr(t.why))}));
  }
  // A user annotation on a result: resharded right after it is computed (and
  // rescaled). A unit entry: no constraint on that result.
  for (unsigned i = 0; constraints && i < op->getNumResults() && i < constraints.size(); ++i) {
    if (isa<UnitAttr>(constraints[i]))
      continue;
    Value r = op->getResult(i);
    FailureOr<Sharding> target =
        getSharding(constraints[i], mesh, rankOf(r), [&] {
          return mlir::emitError(r.getLoc()) << describe(func, r) << ": ";
        });
    if (failed(target) || failed(publish(r, *target, {"annotation", r}, op)))
      return failure();
    reshards.push_back(b.getDictionaryAttr({b.getNamedAttr("result", b.getI64IntegerAttr(i)),
                                            b.getNamedAttr("to", attr(sharding(r))),
                                            b.getNamedAttr("why", b.getStringAttr(annotationReason(op))),
                                            b.getNamedAttr("scaled", b.getUnitAttr())}));
  }

  SmallVector<Attribute> wanted;
  for (const Sharding &w : want)
    wanted.push_back(attr(w));
  op->setAttr(kOperandShardings, b.getArrayAttr(wanted));
  op->setAttr(kResultShardings, b.getArrayAttr(produced));
  op->setAttr(kOrigins, b.getArrayAttr(origin));
  auto anyScaled = [](ArrayRef<double> s) { return llvm::any_of(s, [](double x) { return x != 1.0; }); };
  if (anyScaled(ctx.operandScale))
    op->setAttr(kOperandScales, b.getDenseF64ArrayAttr(ctx.operandScale));
  if (anyScaled(ctx.scale))
    op->setAttr(kResultScales, b.getDenseF64ArrayAttr(ctx.scale));
  if (!reshards.empty())
    op->setAttr(kReshardResults, b.getArrayAttr(reshards));
  if (ctx.partitionedForm)
    op->setAttr(PtcDialect::kPartitionedFormAttrName, ctx.partitionedForm);
  return success();
}

LogicalResult Propagation::run() {
  Block &block = func.getBody().front();
  // The batch of inputs goes to dp; with expert parallelism to dp*ep (each
  // ep rank takes its own rows of its dp rank's batch).
  int batch = mesh.batchAxis();
  int batchArg = mesh.parts(batch).empty() ? -1 : mesh.parts(batch).front();
  FailureOr<ShardingDefaults> tensorParallel = megatronDefaults(func, mesh, sequenceParallel);
  if (failed(tensorParallel))
    return failure();
  ShardingDefaults defaults = std::move(*tensorParallel);
  if (failed(expertDefaults(func, mesh, defaults)))
    return failure();
  zeroDefaults(func, mesh, zero, defaults);
  muonDefaults(func, mesh, defaults);
  // 1. Arguments (all their attributes in one update: one setArgAttr per
  // argument rebuilds the whole array each time, quadratic in the count).
  SmallVector<DictionaryAttr> argAttrs;
  func.getAllArgAttrs(argAttrs);
  for (BlockArgument arg : block.getArguments()) {
    auto g = dyn_cast<RankedTensorType>(arg.getType());
    if (!g)
      return func.emitError() << "argument #" << arg.getArgNumber() << " is not a ranked tensor";
    Sharding s = Sharding::replicated(g.getRank());
    Origin origin{"default", {}};
    // The split the plan loads an input in (plain mesh axes) and the one its
    // users read, when a compound axis refines it (sliced on entry).
    std::optional<Sharding> entry;
    std::string entryWhy;
    auto emit = [&] { return mlir::emitError(arg.getLoc()) << describe(func, arg) << ": "; };
    bool input = func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName) != nullptr;
    bool annotated = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName) != nullptr;
    if (Attribute spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName)) {
      FailureOr<Sharding> parsed = getSharding(spec, mesh, g.getRank(), emit);
      if (failed(parsed))
        return failure();
      s = *parsed;
      origin = {"annotation", arg};
    } else if (auto it = defaults.find(arg); it != defaults.end()) {
      s = it->second;
      origin = {"default rule", {}};
    } else if (input && batch >= 0 && g.getRank() >= 1) {
      // Default rule: the batch dimension of inputs goes to dp (or ep). The
      // plan loads dp's rows; a compound batch axis slices them over ep on
      // entry.
      s.dims[0] = batchArg;
      origin = {"default: batch -> " + mesh.axes[batchArg], {}};
      if (batch != batchArg) {
        entry = Sharding::replicated(g.getRank());
        entry->dims[0] = DimShard(batch);
        entryWhy = "default: batch -> " + mesh.name(batch);
      }
    }
    int tp = mesh.axisIndex(MeshAxisRole::Tensor);
    int cp = mesh.axisIndex(MeshAxisRole::Context);
    bool sequenceToTp = sequenceParallel && tp >= 0 && mesh.sizes[tp] > 1 && g.getRank() >= 2 &&
                        !annotated && input;
    if (cp >= 0 && mesh.sizes[cp] > 1 && g.getRank() >= 2 && !annotated && input) {
      // Context parallelism: the sequence of inputs (dimension 1 of [batch,
      // seq, ...]) goes to cp for the whole layer. With sequence parallelism
      // too, each cp rank's chunk is split over tp (cp*tp, sliced on entry):
      // the projections gather it over tp back to the chunk.
      int seq = sequenceToTp ? mesh.axisOf({cp, tp}) : cp;
      if (g.getDimSize(1) % mesh.size(seq) != 0)
        return emit() << "its sequence of " << g.getDimSize(1) << " does not split over mesh axis '"
                      << mesh.name(seq) << "' (size " << mesh.size(seq) << ")";
      s.dims[1] = cp;
      origin.how += ", sequence -> " + mesh.axes[cp];
      if (seq != cp) {
        if (!entry) {
          entry = Sharding::replicated(g.getRank());
          entryWhy = origin.how;
        }
        entry->dims[1] = DimShard(seq);
        entryWhy += ", sequence -> " + mesh.name(seq) + " (sequence parallelism)";
      }
    } else if (sequenceToTp) {
      s.dims[1] = tp; // sequence parallelism: the sequence dimension goes to tp
      origin.how += ", sequence -> tp";
    }
    if (failed(publish(arg, s, origin, nullptr)))
      return failure();
    NamedAttrList attrs(argAttrs[arg.getArgNumber()]);
    attrs.set(PtcDialect::kShardingAttrName, attr(sharding(arg)));
    if (entry && !arg.use_empty()) {
      // Every other dimension as loaded.
      for (auto [e, loaded] : llvm::zip(entry->dims, s.dims))
        if (e.axis < 0)
          e = loaded;
      if (failed(publish(arg, *entry, {entryWhy, {}}, nullptr)))
        return failure();
      attrs.set(kReshardOnEntry, attr(*entry));
    }
    // ZeRO-3 gathers a parameter for each use (FSDP's reshard-after-forward),
    // so that the memory plan can free the whole copy right after it.
    if (zero >= 3 && reshardAfterForward && attrs.get(PtcDialect::kParamAttrName))
      attrs.set(kGatherPerUse, b.getUnitAttr());
    argAttrs[arg.getArgNumber()] = attrs.getDictionary(func.getContext());
  }
  func.setAllArgAttrs(argAttrs);
  // 2. Ops in program order.
  for (Operation &op : block)
    if (!isa<func::ReturnOp>(op) && failed(processOp(&op)))
      return failure();
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
struct PropagateShardingPass
    : mlir::ptc::impl::PropagateShardingPassBase<PropagateShardingPass> {
  using PropagateShardingPassBase::PropagateShardingPassBase;

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
        module.emitError() << "ptc-propagate-sharding needs a mesh: mesh=dp:2,tp:2 or a 'ptc.mesh' "
                              "module attribute";
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
      Propagation propagation(func, *meshInfo, sequenceParallel, zero, reshardAfterForward);
      if (failed(propagation.run()))
        return signalPassFailure();
    }
  }
};
} // namespace
