//===- ShardingDefaults.cpp - default sharding rules (Megatron, ZeRO) -----===//
//
// The default shardings of ptc-propagate-sharding, below user annotations
// and above propagation: Megatron-LM's column/row-parallel linear layers and
// vocabulary-parallel embedding over the tensor axis, ZeRO's optimizer-state
// (and parameter) splits over the data axis. Both are found from the op
// structure of the training step.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/ShardingDefaults.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <functional>

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// Follows reshapes and transposes back to the value they view.
Value stripViews(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (!isa<ReshapeOp, TransposeOp>(def))
      break;
    v = def->getOperand(0);
  }
  return v;
}

/// The forward-pass users of `v` (not the backward ops ptc-autodiff added).
SmallVector<Operation *> forwardUsers(Value v) {
  SmallVector<Operation *> users;
  for (Operation *u : v.getUsers())
    if (!u->hasAttr(PtcDialect::kBackwardAttrName))
      users.push_back(u);
  return users;
}

/// Calls `fn(param, state, spec)` for every optimizer state argument of a
/// parameter (its `ptc.state_of`), where `spec(paramSharding)` turns the
/// parameter's sharding into the state's (nullopt: leave the state
/// unannotated): the same, or without the dimension a factored moment
/// averages out (Adafactor's row and column statistics).
using StateSpecFn = std::function<std::optional<Sharding>(const Sharding &)>;
void forEachOptimizerState(
    func::FuncOp func,
    llvm::function_ref<void(BlockArgument param, BlockArgument state, StateSpecFn spec)> fn) {
  llvm::StringMap<BlockArgument> params;
  for (BlockArgument arg : func.getArguments())
    if (auto n = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kParamAttrName))
      params[n.getValue()] = arg;
  for (BlockArgument state : func.getArguments()) {
    auto of = func.getArgAttrOfType<DictionaryAttr>(state.getArgNumber(),
                                                    PtcDialect::kStateOfAttrName);
    auto name = of ? of.getAs<StringAttr>("param") : StringAttr();
    auto param = name ? params.find(name.getValue()) : params.end();
    if (param == params.end())
      continue;
    auto dropped = of.getAs<IntegerAttr>("dropped_dim");
    fn(param->second, state, [dropped](const Sharding &s) -> std::optional<Sharding> {
      Sharding out = s;
      if (dropped && dropped.getInt() < static_cast<int64_t>(out.dims.size()))
        out.dims.erase(out.dims.begin() + dropped.getInt());
      if (llvm::none_of(out.dims, [](const DimShard &d) { return d.axis >= 0; }))
        return std::nullopt;
      return out;
    });
  }
}

/// Whether `op` is the product of a gated linear unit: act(gate) * up, or
/// ptc.swiglu.
bool isGatedProduct(Operation *op) {
  if (isa_and_nonnull<SwigluOp>(op))
    return true;
  auto mul = dyn_cast_or_null<MulOp>(op);
  if (!mul)
    return false;
  auto isActivation = [](Value x) {
    return isa_and_nonnull<ElementwiseFunctionOpInterface>(x.getDefiningOp());
  };
  return isActivation(mul.getLhs()) || isActivation(mul.getRhs());
}

/// The head count when `out` (a projection's result) only reshapes into
/// [..., heads, head_dim] that reach attention through transposes and rotary
/// embeddings (a separate q, k or v projection); 0 otherwise.
int64_t projectionHeads(Value out) {
  SmallVector<Operation *> users = forwardUsers(out);
  if (users.size() != 1)
    return 0;
  auto reshape = dyn_cast<ReshapeOp>(users.front());
  if (!reshape)
    return 0;
  ArrayRef<int64_t> shape = reshape.getType().getShape();
  int64_t features = cast<RankedTensorType>(out.getType()).getShape().back();
  if (shape.size() < 2 || shape.back() * shape[shape.size() - 2] != features)
    return 0;
  Value v = reshape.getResult();
  for (users = forwardUsers(v); users.size() == 1; users = forwardUsers(v)) {
    Operation *user = users.front();
    if (isa<CausalAttentionOp, CachedAttentionOp>(user))
      return shape[shape.size() - 2];
    if (!isa<TransposeOp, RotaryOp, RotaryAtOp>(user))
      return 0;
    v = user->getResult(0);
  }
  return 0;
}

/// Default rule for tensor parallelism (Megatron-LM): in every linear layer
/// x @ W^T of the forward pass, W is column-parallel ("[tp, _]", its bias
/// "[tp]") when its output feeds an activation, either side of a gated unit
/// (SwiGLU: act(gate) * up), becomes attention heads (a q, k or v
/// projection), feeds the loss (an untied LM head: vocabulary parallel) or is
/// cut into equal slices (a fused QKV projection: "[tp/3, _]", split by
/// heads), and row-parallel ("[_, tp]") when its input comes from attention,
/// an activation or a gated unit. An embedding table used as the LM head
/// follows the embedding rule. Optimizer state follows its parameter.
} // namespace

FailureOr<ShardingDefaults>
mlir::ptc::megatronDefaults(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel) {
  ShardingDefaults specs;
  int tp = mesh.axisIndex(MeshAxisRole::Tensor);
  if (tp < 0 || mesh.sizes[tp] < 2)
    return specs;
  int64_t tpSize = mesh.sizes[tp];
  // A layer the rules recognize but the axis cannot split is an error naming
  // both: running it replicated would waste every tp rank but one.
  auto paramName = [&](BlockArgument w) {
    return func.getArgAttrOfType<StringAttr>(w.getArgNumber(), PtcDialect::kParamAttrName).str();
  };
  // One error for the first layer the axis cannot split and one note naming
  // the others (a model's layers repeat: eight errors with snippets said the
  // same thing eight times).
  std::optional<InFlightDiagnostic> indivisible;
  SmallVector<std::string> alsoIndivisible;
  auto refuse = [&](Location loc, BlockArgument w, const std::string &message) {
    if (indivisible)
      alsoIndivisible.push_back(paramName(w));
    else
      indivisible.emplace(mlir::emitError(loc) << message);
  };
  auto cannotSplit = [&](Operation *at, BlockArgument w, StringRef how, int64_t features,
                         int64_t blocks) {
    std::string message;
    llvm::raw_string_ostream diag(message);
    diag << "mesh axis '" << mesh.axes[tp] << "' (size " << tpSize << ") cannot split parameter '"
         << paramName(w) << "' " << how << ": its " << features << " features";
    if (blocks > 1)
      diag << " are " << blocks << " blocks of " << features / blocks << ", which are not";
    else
      diag << " are not";
    diag << " divisible by " << tpSize;
    if (blocks > 1)
      diag << " (a fused attention projection: the head count must be divisible by the tp size)";
    refuse(at->getLoc(), w, message);
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
  // With sequence parallelism too (the lookup gathers its ids over tp and
  // its output is reduce-scattered into the sequence-parallel region).
  func.walk([&](EmbeddingOp e) {
    BlockArgument table = param(e.getTable());
    if (!table)
      return;
    int64_t vocab = e.getTable().getType().getDimSize(0);
    if (vocab % tpSize == 0)
      specs.try_emplace(table, Sharding{{DimShard(tp), DimShard()}, {}});
    else
      mlir::emitWarning(e.getLoc())
          << "the table '" << paramName(table) << "' stays whole on every '" << mesh.axes[tp]
          << "' rank: its vocabulary of " << vocab << " is not divisible by " << tpSize;
  });
  func.walk([&](MatmulOp mm) {
    BlockArgument w = param(mm.getRhs());
    if (!w || !mm.getTransposeRhs() || mm.getTransposeLhs())
      return;
    // A linear layer [out, in], or one stacked over experts [E, out, in]
    // (ptc.experts: expert tensor parallelism splits each expert alike; the
    // expert rule then puts dimension 0 on ep).
    int64_t rank = mm.getRhs().getType().getRank();
    bool stacked = rank == 3 && func.getArgAttr(w.getArgNumber(), PtcDialect::kExpertsAttrName);
    if (rank != 2 && !stacked)
      return;
    // The sharding of a weight (or bias) whose last two (one) dimensions
    // are `dims`; a stacked one keeps its expert dimension whole here.
    auto split = [&](std::initializer_list<DimShard> dims) {
      Sharding out;
      if (stacked)
        out.dims.push_back(DimShard());
      out.dims.append(dims.begin(), dims.end());
      return out;
    };
    if (usedByEmbedding(w))
      return; // tied LM head: follows the embedding rule
    int64_t outFeatures = mm.getRhs().getType().getDimSize(rank - 2);
    int64_t inFeatures = mm.getRhs().getType().getDimSize(rank - 1);
    Operation *src = stripViews(mm.getLhs()).getDefiningOp();
    if (src && (isa<CausalAttentionOp, CachedAttentionOp>(src) || isa<ElementwiseFunctionOpInterface>(src) ||
                isGatedProduct(src))) {
      if (inFeatures % tpSize == 0)
        specs.try_emplace(w, split({DimShard(), DimShard(tp)}));
      else
        cannotSplit(mm, w, "by rows (row-parallel)", inFeatures, 1);
      return;
    }
    Value out = mm.getResult();
    BlockArgument bias;
    if (out.hasOneUse())
      if (auto add = dyn_cast<AddOp>(*out.getUsers().begin()))
        if (BlockArgument b = param(stacked ? stripViews(add.getRhs()) : add.getRhs());
            b && cast<RankedTensorType>(b.getType()).getRank() == rank - 1) {
          bias = b;
          out = add.getResult();
        }
    int64_t blocks = 0;
    SmallVector<Operation *> users = forwardUsers(out);
    bool activation = !users.empty() && llvm::all_of(users, [](Operation *u) {
      return isa<ElementwiseFunctionOpInterface>(u) || isGatedProduct(u);
    });
    // The LM head feeds the loss, or a decode function returns its logits.
    bool lmHead = !users.empty() && llvm::all_of(users, [&](Operation *u) {
      if (isa<func::ReturnOp>(u))
        return llvm::all_of(u->getOpOperands(), [&](OpOperand &o) {
          return o.get() != out ||
                 func.getResultAttr(o.getOperandNumber(), PtcDialect::kLogitsAttrName);
        });
      return isa<CrossEntropyOp>(u);
    });
    int64_t heads = projectionHeads(out);
    if (heads > 0) {
      if (heads % tpSize != 0) {
        refuse(mm.getLoc(), w,
               llvm::formatv("mesh axis '{0}' (size {1}) cannot split the {2} attention heads of "
                             "parameter '{3}' (shape {4}x{5}, {2} heads of {6}): the head count "
                             "must be divisible by the tp size",
                             mesh.axes[tp], tpSize, heads, paramName(w), outFeatures, inFeatures,
                             outFeatures / heads)
                   .str());
        return;
      }
      blocks = 1;
    } else if (lmHead) {
      if (outFeatures % tpSize != 0) {
        mlir::emitWarning(mm.getLoc())
            << "the LM head '" << paramName(w) << "' stays whole on every '" << mesh.axes[tp]
            << "' rank: its " << outFeatures << " classes are not divisible by " << tpSize;
        return;
      }
      blocks = 1;
    } else if (activation) {
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
    // A fused projection whose pieces become attention heads ([..., heads,
    // head_dim] after a reshape): tp must split whole heads, or every rank
    // would gather the pieces back and compute all of attention.
    if (blocks > 1)
      for (Operation *u : out.getUsers())
        for (Operation *r : u->getUsers())
          if (auto reshape = dyn_cast<ReshapeOp>(r)) {
            ArrayRef<int64_t> shape = reshape.getType().getShape();
            int64_t piece = outFeatures / blocks;
            if (shape.size() < 2 || shape.back() * shape[shape.size() - 2] != piece)
              continue;
            int64_t heads = shape[shape.size() - 2];
            if (heads % tpSize != 0) {
              refuse(mm.getLoc(), w,
                     llvm::formatv("mesh axis '{0}' (size {1}) cannot split the {2} attention "
                                   "heads of parameter '{3}': the head count must be divisible "
                                   "by the tp size",
                                   mesh.axes[tp], tpSize, heads, paramName(w))
                         .str());
              return;
            }
          }
    specs.try_emplace(w, split({DimShard(tp, static_cast<int>(blocks)), DimShard()}));
    if (bias)
      specs.try_emplace(bias, split({DimShard(tp, static_cast<int>(blocks))}));
  });
  // Optimizer state is sharded like its parameter.
  forEachOptimizerState(func, [&](BlockArgument p, BlockArgument state, StateSpecFn spec) {
    auto it = specs.find(p);
    if (it == specs.end())
      return;
    if (std::optional<Sharding> s = spec(it->second))
      specs.try_emplace(state, *s);
  });
  // A decode function's key/value caches split their heads over tp with the
  // attention that reads them (ptc-derive-decode).
  func.walk([&](CachedAttentionOp attn) {
    int64_t kvHeads = attn.getKey().getType().getDimSize(1);
    if (kvHeads % tpSize != 0)
      return; // the attention's sharding rule says why
    for (Value cache : {attn.getKeyCache(), attn.getValueCache()})
      if (auto arg = dyn_cast<BlockArgument>(cache))
        specs.try_emplace(arg, Sharding{{DimShard(), DimShard(tp), DimShard(), DimShard()}, {}});
  });
  if (indivisible) {
    if (!alsoIndivisible.empty()) {
      std::string names;
      for (size_t i = 0; i < alsoIndivisible.size() && i < 6; ++i)
        names += (i ? ", '" : "'") + alsoIndivisible[i] + "'";
      if (alsoIndivisible.size() > 6)
        names += ", and " + std::to_string(alsoIndivisible.size() - 6) + " more";
      indivisible->attachNote()
          << "mesh axis '" << mesh.axes[tp] << "' cannot split " << alsoIndivisible.size()
          << " more parameter" << (alsoIndivisible.size() > 1 ? "s" : "") << " either: " << names
          << " (choose a tp size dividing the heads and the hidden and MLP sizes)";
    }
    indivisible->report();
    return failure();
  }
  return specs;
}

LogicalResult mlir::ptc::expertDefaults(func::FuncOp func, const MeshInfo &mesh,
                                        ShardingDefaults &specs) {
  int ep = mesh.axisIndex(MeshAxisRole::Expert);
  if (ep < 0 || mesh.sizes[ep] < 2)
    return success();
  int64_t epSize = mesh.sizes[ep];
  auto paramName = [&](BlockArgument a) {
    auto n = func.getArgAttrOfType<StringAttr>(a.getArgNumber(), PtcDialect::kParamAttrName);
    return n ? n.str() : "#" + std::to_string(a.getArgNumber());
  };
  bool any = false;
  for (BlockArgument arg : func.getArguments()) {
    auto experts = func.getArgAttrOfType<IntegerAttr>(arg.getArgNumber(), PtcDialect::kExpertsAttrName);
    if (!experts)
      continue;
    any = true;
    if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName))
      continue; // user annotations stand
    if (experts.getInt() % epSize != 0)
      return func.emitError() << "mesh axis '" << mesh.axes[ep] << "' (size " << epSize
                              << ") does not divide the " << experts.getInt()
                              << " experts of parameter '" << paramName(arg)
                              << "': use an ep size that divides the expert count";
    // Dimension 0 over ep, the others as the tensor-parallel rule split them.
    auto type = cast<RankedTensorType>(arg.getType());
    Sharding spec = Sharding::replicated(type.getRank());
    if (auto it = specs.find(arg); it != specs.end())
      spec = it->second;
    spec.dims[0] = DimShard(ep);
    specs[arg] = spec;
  }
  if (!any) {
    func.emitWarning() << "mesh axis '" << mesh.axes[ep] << "' (size " << epSize
                       << ", expert parallelism) has no effect: the model has no experts "
                          "(no parameter with 'ptc.experts'); its ranks only split the batch";
    return success();
  }
  forEachOptimizerState(func, [&](BlockArgument p, BlockArgument state, StateSpecFn spec) {
    auto it = specs.find(p);
    if (it == specs.end() || !func.getArgAttr(p.getArgNumber(), PtcDialect::kExpertsAttrName))
      return;
    if (std::optional<Sharding> s = spec(it->second))
      specs[state] = *s;
  });
  return success();
}

/// ZeRO as sharding: optimizer state (stage >= 1) and parameters (stage 3)
/// split over dp along their first dimension that no other axis splits and
/// that dp divides, on top of the tensor-parallel defaults.
int mlir::ptc::updateGradientOperand(Operation *op) {
  auto isUpdate = [](Operation *o) { return isa<FusedUpdateOpInterface>(o); };
  if (isUpdate(op))
    return 1;
  if (auto c = dyn_cast<ConvertOp>(op))
    for (OpOperand &use : c->getResult(0).getUses())
      if (isUpdate(use.getOwner()) && use.getOperandNumber() == 1)
        return 0;
  return -1;
}

void mlir::ptc::zeroDefaults(func::FuncOp func, const MeshInfo &mesh, int zero,
                             ShardingDefaults &specs) {
  if (zero == 1) {
    Block &block = func.getBody().front();
    SmallVector<Operation *> converts;
    for (Operation &op : block)
      if (isa<ConvertOp>(op) && updateGradientOperand(&op) == 0)
        converts.push_back(&op);
    for (Operation *c : converts) {
      Operation *first = nullptr;
      for (Operation *u : c->getResult(0).getUsers())
        if (u->getBlock() == &block && (!first || u->isBeforeInBlock(first)))
          first = u;
      if (first)
        c->moveBefore(first);
    }
  }
  // The data-parallel ranks of a parameter: dp; with expert parallelism
  // carved out of it and no dp, the ep ranks hold replicas of every
  // non-expert parameter, so ZeRO shards those over ep. (With both, the
  // non-expert state is sharded over dp only.)
  int dp = mesh.axisIndex(MeshAxisRole::Data), ep = mesh.axisIndex(MeshAxisRole::Expert);
  auto big = [&](int a) { return a >= 0 && mesh.sizes[a] > 1; };
  if (zero < 1 || (!big(dp) && !big(ep)))
    return;
  auto zeroAxis = [&](BlockArgument arg) {
    if (big(dp))
      return dp;
    return func.getArgAttr(arg.getArgNumber(), PtcDialect::kExpertsAttrName) ? -1 : ep;
  };
  auto withDp = [&](BlockArgument arg) -> std::optional<Sharding> {
    int axis = zeroAxis(arg);
    if (axis < 0)
      return std::nullopt;
    int64_t dpSize = mesh.sizes[axis];
    auto type = cast<RankedTensorType>(arg.getType());
    if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName))
      return std::nullopt; // user annotations stand
    Sharding out = Sharding::replicated(type.getRank());
    if (auto it = specs.find(arg); it != specs.end())
      out = it->second;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (out.dims[d].axis < 0 && type.getDimSize(d) % dpSize == 0) {
        out.dims[d] = DimShard(axis);
        return out;
      }
    return std::nullopt;
  };
  // Each parameter's split is decided from the specs before ZeRO (stage 3
  // then annotates the parameter itself).
  llvm::MapVector<BlockArgument, Sharding> placed;
  SmallVector<std::tuple<BlockArgument, BlockArgument, StateSpecFn>> states;
  forEachOptimizerState(func, [&](BlockArgument param, BlockArgument state, StateSpecFn spec) {
    if (!placed.count(param))
      if (std::optional<Sharding> pspec = withDp(param))
        placed[param] = *pspec;
    states.push_back({param, state, spec});
  });
  for (auto &[param, state, spec] : states)
    if (auto it = placed.find(param); it != placed.end())
      if (std::optional<Sharding> s = spec(it->second))
        specs[state] = *s;
  // Under mixed precision the fp32 parameter is a master weight: the model
  // computes with its low-precision copy (every use but the update is a
  // ptc.convert), and the ZeRO paper counts it as optimizer state. Stages 1
  // and 2 shard it with the moments (12 bytes/dp per parameter under AdamW);
  // its bf16 copy, converted from the shard, is gathered once per step and
  // kept whole (stage 3 gathers it for each use instead).
  auto isMasterWeight = [](BlockArgument param) {
    bool converted = false;
    for (Operation *user : param.getUsers()) {
      if (isa<FusedUpdateOpInterface>(user))
        continue;
      auto convert = dyn_cast<ConvertOp>(user);
      if (!convert)
        return false;
      auto from = cast<RankedTensorType>(convert->getOperand(0).getType()).getElementType();
      auto to = cast<RankedTensorType>(convert->getResult(0).getType()).getElementType();
      if (to.getIntOrFloatBitWidth() >= from.getIntOrFloatBitWidth())
        return false;
      converted = true;
    }
    return converted;
  };
  for (auto &[param, pspec] : placed)
    if (zero >= 3 || isMasterWeight(param))
      specs[param] = pspec;
  // An update built from primitive ops (Adafactor) reads the gradient where
  // the parameter's state lives: constrain the gradient to that split, so
  // that its reduction over dp is a reduce-scatter (as the fused updates'
  // rule asks) rather than an all-reduce. Not at stage 1, which keeps
  // gradients whole (all-reduced; the update's ops slice them).
  if (zero == 1)
    return;
  // `grad` arrives split like `pspec` (its producer's result annotated).
  MLIRContext *ctx = func.getContext();
  auto constrain = [&](OpResult grad, const Sharding &pspec) {
    Operation *producer = grad.getOwner();
    SmallVector<Attribute> entries(producer->getNumResults(), UnitAttr::get(ctx));
    if (auto old = producer->getAttrOfType<ArrayAttr>(PtcDialect::kShardingAttrName))
      for (auto [i, a] : llvm::enumerate(old))
        if (i < entries.size())
          entries[i] = a;
    if (isa<UnitAttr>(entries[grad.getResultNumber()]))
      entries[grad.getResultNumber()] = getShardingAttr(ctx, mesh, pspec);
    producer->setAttr(PtcDialect::kShardingAttrName, ArrayAttr::get(ctx, entries));
  };
  llvm::StringMap<Sharding> placedByName;
  for (auto &[param, pspec] : placed)
    if (auto n = func.getArgAttrOfType<StringAttr>(param.getArgNumber(), PtcDialect::kParamAttrName))
      placedByName[n.getValue()] = pspec;
  func.walk([&](Operation *op) {
    auto name = op->getAttrOfType<StringAttr>(PtcDialect::kOptimizerGradAttrName);
    auto it = name ? placedByName.find(name.getValue()) : placedByName.end();
    if (it == placedByName.end() || op->getNumOperands() == 0)
      return;
    if (auto grad = dyn_cast<OpResult>(op->getOperand(0)))
      constrain(grad, it->second);
  });
  // Gradient clipping and loss-scale unscaling between the gradients and the
  // fused updates keep splits (their norm and overflow flag reduce over
  // them): the gradient that enters such a chain arrives split as its update
  // reads it, so its reduction over dp stays a reduce-scatter. Only chains
  // with one of them: a gradient read by its update directly is resharded
  // where the update's rule asks.
  func.walk([&](FusedUpdateOpInterface update) {
    auto param = dyn_cast<BlockArgument>(update.getParam());
    auto it = param ? placed.find(param) : placed.end();
    if (it == placed.end())
      return;
    Value g = update.getGradMutable().get();
    bool through = false;
    for (;;) {
      auto r = dyn_cast<OpResult>(g);
      if (!r || !r.hasOneUse())
        break;
      Operation *def = r.getOwner();
      if (isa<ConvertOp>(def) && !through) { // the update's widening (a convert before the chain stays)
        g = def->getOperand(0);
      } else if (isa<ClipGradNormOp, UnscaleGradsOp>(def) && r.getResultNumber() + 1 < def->getNumResults()) {
        g = def->getOperand(r.getResultNumber()); // result i is gradient i's
        through = true;
      } else {
        break;
      }
    }
    if (auto grad = dyn_cast<OpResult>(g); grad && through)
      constrain(grad, it->second);
  });
}


void mlir::ptc::muonDefaults(func::FuncOp func, const MeshInfo &mesh,
                             const ShardingDefaults &specs) {
  MLIRContext *ctx = func.getContext();
  llvm::StringMap<BlockArgument> params;
  for (BlockArgument arg : func.getArguments())
    if (auto n = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kParamAttrName))
      params[n.getValue()] = arg;
  // A parameter's split: its annotation, else its default, else whole.
  auto split = [&](BlockArgument arg) {
    int64_t rank = cast<RankedTensorType>(arg.getType()).getRank();
    if (Attribute spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName)) {
      FailureOr<Sharding> s = getSharding(spec, mesh, rank, [&] { return emitError(arg.getLoc()); });
      return succeeded(s) ? *s : Sharding::replicated(rank); // the argument's own check reports it
    }
    auto it = specs.find(arg);
    return it != specs.end() ? it->second : Sharding::replicated(rank);
  };
  const int dp = mesh.axisIndex(MeshAxisRole::Data);
  func.walk([&](Operation *op) {
    for (StringRef attrName : {PtcDialect::kMuonStackAttrName, PtcDialect::kMuonOrthogonalAttrName}) {
      auto stack = op->getAttrOfType<DictionaryAttr>(attrName);
      if (!stack || op->getNumResults() != 1)
        continue;
      auto type = cast<RankedTensorType>(op->getResult(0).getType());
      auto names = stack.getAs<ArrayAttr>("params");
      auto dealt = stack.getAs<BoolAttr>("dealt");
      if (!names || names.empty() || !dealt || type.getRank() != 3)
        continue;
      // The members' common split (nullopt: not alike).
      std::optional<Sharding> common;
      bool alike = true;
      for (Attribute n : names) {
        BlockArgument arg = params.lookup(cast<StringAttr>(n).getValue());
        if (!arg) {
          alike = false;
          break;
        }
        Sharding s = split(arg);
        if (!common)
          common = s;
        else if (!(*common == s))
          alike = false;
      }
      Sharding out = Sharding::replicated(3);
      const bool result = attrName == PtcDialect::kMuonOrthogonalAttrName;
      if (alike && common && common->partial.empty() && common->dims.size() >= 2) {
        size_t r = common->dims.size();
        if (r == 3 && names.size() == 1) // one expert-batched parameter: its experts stay put
          out.dims[0] = common->dims[0];
        if (result) {
          out.dims[1] = common->dims[r - 2];
          out.dims[2] = common->dims[r - 1];
        }
      }
      // Matrices split unlike each other (tensor parallelism's column- and
      // row-split layers of one shape) are made whole before they meet.
      if (!alike && !result)
        for (Value member : op->getOperands())
          if (Operation *def = member.getDefiningOp(); def && def->getNumResults() == 1)
            def->setAttr(PtcDialect::kShardingAttrName,
                         ArrayAttr::get(ctx, {getShardingAttr(ctx, mesh, Sharding::replicated(
                                                  cast<RankedTensorType>(member.getType()).getRank()))}));
      if (dealt.getValue() && !result && dp >= 0 && mesh.sizes[dp] > 1 &&
          type.getDimSize(0) % mesh.sizes[dp] == 0)
        out.dims[0] = DimShard(dp);
      op->setAttr(PtcDialect::kShardingAttrName,
                  ArrayAttr::get(ctx, {getShardingAttr(ctx, mesh, out)}));
    }
  });
}
