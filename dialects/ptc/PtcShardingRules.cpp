//===- PtcShardingRules.cpp - the sharding rule of every ptc op ----------===//
//
// ShardingRuleOpInterface implementations: per op, the operand shardings it
// needs and the shardings of its results, given its operands' current ones.
// ptc-propagate-sharding (passes/sharding) asks each op; ptc-partition inserts the
// collectives that bring every operand to what the rule wants. An op without
// a rule computes on whole tensors (the driver replicates its operands).
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcSharding.h"
#include "runtime/base/option_values.h"

#include <optional>

using namespace mlir;
using namespace mlir::ptc;

namespace {
LogicalResult elementwiseBinaryRule(Operation *o, ShardingRuleContext &ctx) {
  Operation *op = o;
  auto rankR = [&](unsigned i) { return cast<RankedTensorType>(op->getResult(i).getType()).getRank(); };

  Value lhs = o->getOperand(0), rhs = o->getOperand(1);
  RankedTensorType gl = ctx.globalType(lhs), gr = ctx.globalType(rhs);
  int64_t r = rankR(0);
  auto resultType = cast<RankedTensorType>(o->getResult(0).getType());
  // Result dim -> operand dim (or -1 when broadcast).
  auto mapDim = [&](RankedTensorType t, int64_t d) -> int64_t {
    int64_t od = d - (r - t.getRank());
    return od >= 0 && t.getDimSize(od) == resultType.getDimSize(d) ? od : -1;
  };
  // The operand whose sharding a user annotated leads; otherwise the
  // larger one keeps its sharding and the other follows.
  bool la = ctx.isAnnotated(lhs),
       ra = ctx.isAnnotated(rhs);
  bool lhsLeads = la != ra ? la : getNumElements(gl) >= getNumElements(gr);
  Value lead = lhsLeads ? lhs : rhs, follow = lhsLeads ? rhs : lhs;
  RankedTensorType gLead = lhsLeads ? gl : gr, gFollow = lhsLeads ? gr : gl;
  Sharding res = Sharding::replicated(r);
  // The lead's splits first, then the follower's where their axes are free.
  for (int64_t d = 0; d < r; ++d)
    if (int64_t ld = mapDim(gLead, d); ld >= 0)
      res.dims[d] = ctx.sharding(lead).dims[ld];
  for (int64_t d = 0; d < r; ++d) {
    int64_t fd = mapDim(gFollow, d);
    DimShard f = fd >= 0 ? ctx.sharding(follow).dims[fd] : DimShard();
    if (f.axis < 0)
      continue;
    if (res.dims[d].axis >= 0 && res.dims[d] != f && failed(ctx.conflict(o, lead, follow))) {
      return failure();
    }
    if (res.dims[d].axis < 0 && !ctx.uses(res, f.axis))
      res.dims[d] = f;
  }
  for (Value v : {lhs, rhs}) {
    unsigned i = v == lhs ? 0 : 1;
    RankedTensorType gv = ctx.globalType(v);
    Sharding w = Sharding::replicated(gv.getRank());
    for (int64_t d = 0; d < r; ++d) {
      int64_t od = mapDim(gv, d);
      if (od >= 0)
        w.dims[od] = res.dims[d];
    }
    w.partial = ctx.sharding(v).partial;
    ctx.want[i] = w;
  }
  // Linear cases keep partial sums; anything else sums first.
  bool isAdd = isa<AddOp, SubOp>(o);
  const auto &pl = ctx.want[0].partial, &pr = ctx.want[1].partial;
  int scaleOperand = -1;
  if (isAdd) {
    if (pl.empty() != pr.empty()) {
      // partial + whole stays partial if the whole side is divided by the
      // group size: the sum over the group restores it (a bias added to
      // a row-parallel output before its reduce-scatter or all-reduce).
      scaleOperand = pl.empty() ? 0 : 1;
      res.partial = pl.empty() ? pr : pl;
    } else {
      if (pl != pr) {
        ctx.full(0);
        ctx.full(1);
      }
      res.partial = ctx.want[0].partial;
    }
  } else if (isa<MulOp>(o) && !pl.empty() && !pr.empty()) {
    ctx.full(1);
    res.partial = ctx.want[0].partial;
  } else if (isa<DivOp>(o)) {
    ctx.full(1);
    res.partial = ctx.want[0].partial;
  } else {
    res.partial = pl.empty() ? pr : pl;
  }
  // An axis cannot both split a dimension (alone or in a compound) and carry
  // a pending sum.
  for (int a : SmallVector<int>(res.partial))
    if (ctx.uses(res, a)) {
      ctx.full(0);
      ctx.full(1);
      res.partial.clear();
    }
  if (scaleOperand >= 0 && !res.partial.empty())
    ctx.operandScale[scaleOperand] = 1.0 / static_cast<double>(ctx.shardFactor(res.partial));
  ctx.out.push_back(res);
  return success();
}

LogicalResult passThroughRule(Operation *, ShardingRuleContext &ctx) {
 ctx.out.push_back(ctx.want[0]);
  return success();
}

} // namespace

LogicalResult mlir::ptc::activationShardingRule(Operation *, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.out.push_back(ctx.want[0]);
  return success();
}

LogicalResult mlir::ptc::activationGradShardingRule(Operation *, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.like(1, ctx.want[0]);
  ctx.out.push_back(ctx.want[0]);
  return success();
}

namespace {
LogicalResult matmulRule(MatmulOp mm, ShardingRuleContext &ctx) {
  if (mm.getBias())
    return mm.emitOpError() << "with a bias has no sharding rule: ptc-fuse-matmul-bias forms it "
                               "after sharding";
  int64_t r = ctx.rank(mm.getLhs()), rb = ctx.rank(mm.getRhs());
  bool tl = mm.getTransposeLhs(), tr = mm.getTransposeRhs();
  int64_t mDim = tl ? r - 1 : r - 2, kDim = tl ? r - 2 : r - 1;
  int64_t kDimB = tr ? rb - 1 : rb - 2, nDim = tr ? rb - 2 : rb - 1;
  Sharding sa = ctx.want[0], sb = ctx.want[1];
  if (!sa.partial.empty() && !sb.partial.empty())
    sb.partial.clear();
  Sharding res = Sharding::replicated(r);
  // Batch dimensions follow the lhs, except where only the rhs is split:
  // a stacked weight (experts split over ep) stays where it is and the
  // activations come to it.
  for (int64_t d = 0; d < r - 2; ++d) {
    if (rb == r && sa.dims[d].axis < 0 && sb.dims[d].axis >= 0)
      sa.dims[d] = sb.dims[d];
    res.dims[d] = sa.dims[d];
    if (rb == r)
      sb.dims[d] = sa.dims[d];
  }
  // A split keeps only the mesh axes that no dimension decided before it
  // uses (dp*ep under an ep-split batch dimension: dp).
  auto strip = [&](DimShard a, ArrayRef<DimShard> taken) {
    for (const DimShard &t : taken)
      if (a.axis >= 0 && t.axis >= 0 && ctx.mesh().overlaps(a.axis, t.axis)) {
        int rest = a.blocks == 1 ? ctx.without(a.axis, t.axis) : -1;
        a = DimShard(rest);
      }
    return a;
  };
  SmallVector<DimShard> taken(res.dims.begin(), res.dims.begin() + (r - 2));
  // Contracting dimension: split both the same way -> partial sum.
  DimShard ka = sa.dims[kDim], kb = sb.dims[kDimB];
  DimShard k = ka.axis >= 0 ? ka : kb;
  if (ka.axis >= 0 && kb.axis >= 0 && ka != kb &&
      failed(ctx.conflict(mm, mm.getLhs(), mm.getRhs()))) {
    return failure();
  }
  k = strip(k, taken);
  taken.push_back(k);
  sa.dims[kDim] = k;
  sb.dims[kDimB] = k;
  // The weight's split (N) wins over the activation's (M): gathering
  // activations is what tensor/sequence parallelism expects.
  DimShard n = strip(sb.dims[nDim], taken);
  taken.push_back(n);
  sb.dims[nDim] = n;
  res.dims[r - 1] = n;
  DimShard m = strip(sa.dims[mDim], taken);
  sa.dims[mDim] = m;
  res.dims[r - 2] = m;
  res.partial = sa.partial.empty() ? sb.partial : sa.partial;
  if (k.axis >= 0) {
    if (llvm::is_contained(res.partial, k.axis) || ctx.uses(res, k.axis)) {
      sa.partial.clear();
      sb.partial.clear();
      res.partial.clear();
    }
    addPartial(res.partial, k.axis);
  }
  ctx.want[0] = sa;
  ctx.want[1] = sb;
  ctx.out.push_back(res);
  return success();
}

} // namespace

/// A normalization over the last dimension (LayerNorm, RMSNorm): the input
/// may be split anywhere but there, its affine parameters (operands 1..) are
/// whole.
LogicalResult mlir::ptc::rowNormShardingRule(Operation *op, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.want[0].dims.back() = -1;
  for (unsigned i = 1; i < op->getNumOperands(); ++i)
    ctx.replicate(i, ctx.rank(op->getOperand(i)));
  ctx.out.push_back(ctx.want[0]);
  return success();
}

/// Its gradient (operands: input, weight, result gradient): the input
/// gradient split as the input; each parameter gradient (results 1..) a
/// partial sum over every axis that splits the input.
LogicalResult mlir::ptc::rowNormGradShardingRule(Operation *op, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.want[0].dims.back() = -1;
  ctx.replicate(1, ctx.rank(op->getOperand(1)));
  ctx.like(2, ctx.want[0]);
  ctx.out.push_back(ctx.want[0]);
  Sharding w = Sharding::replicated(1);
  for (const DimShard &a : ctx.want[0].dims)
    if (a.axis >= 0)
      addPartial(w.partial, a.axis);
  for (unsigned i = 1; i < op->getNumResults(); ++i)
    ctx.out.push_back(w);
  return success();
}

namespace {

/// Rotary embeddings: positions are indices along the sequence, so the
/// sequence and head dimensions stay whole; batch and heads split freely.
/// Linear, so a partial sum passes through.
LogicalResult rotaryRule(RotaryOp r, ShardingRuleContext &ctx) {
  // A sequence split plainly over cp stays split: each rank rotates its
  // positions (the partitioned op offsets them by its coordinate).
  const int cp = ctx.mesh().axisIndex(MeshAxisRole::Context);
  const int seqDim = r.getSeqMajor() ? 1 : 2;
  const bool contextSplit = cp >= 0 && ctx.want[0].dims[seqDim] == DimShard(cp);
  if (!contextSplit)
    ctx.want[0].dims[seqDim] = -1;
  ctx.want[0].dims[3] = -1;
  if (contextSplit)
    ctx.partitionedForm = StringAttr::get(r->getContext(), ctx.mesh().axes[cp]);
  ctx.out.push_back(ctx.want[0]);
  return success();
}

LogicalResult softmaxRule(SoftmaxOp s, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.want[0].dims[s.getAxis() < 0 ? s.getAxis() + ctx.rank(s.getInput()) : s.getAxis()] = -1;
  ctx.out.push_back(ctx.want[0]);
  return success();
}

LogicalResult softmaxGradRule(SoftmaxGradOp s, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.want[0].dims[s.getAxis() < 0 ? s.getAxis() + ctx.rank(s.getOutput()) : s.getAxis()] = -1;
  ctx.like(1, ctx.want[0]);
  ctx.out.push_back(ctx.want[0]);
  return success();
}

/// Attention: batch and heads split freely, sequence and head dim stay whole.
/// With grouped-query heads, key and value split their (fewer) heads the same
/// way, which keeps each rank's query heads with their kv heads only if the
/// axis divides the kv head count.
LogicalResult attentionRule(Operation *o, ShardingRuleContext &ctx) {
  auto fwd = dyn_cast<CausalAttentionOp>(o);
  auto grad = dyn_cast<CausalAttentionGradOp>(o);
  if ((fwd && fwd.getSeqMajor()) || (grad && grad.getSeqMajor()))
    return o->emitOpError() << "with seq_major has no sharding rule: ptc-fold-attention-layout "
                               "forms it after sharding";
  // q, k, v[, the incoming gradient], then the optional document positions
  // [batch, seq], split as the query's batch and sequence.
  const unsigned floats = fwd ? 3 : 4;
  const bool documents = o->getNumOperands() > floats;
  ctx.full(0);
  // Context parallelism (Ulysses): queries, keys and values that arrive with
  // the sequence split over cp move that split to the heads (an all_to_all
  // each), attention runs on whole sequences of cp's share of the heads, and
  // the results move back to the sequence (all_to_all).
  const int cp = ctx.mesh().axisIndex(MeshAxisRole::Context);
  std::optional<Sharding> arrivedQ, arrivedKv;
  // Ring attention (cp-attention=ring, the default; a module attribute
  // ptc-compile sets): the sequence stays split; key/value blocks travel
  // around the cp ring.
  auto module = o->getParentOfType<ModuleOp>();
  auto mode = module ? module->getAttrOfType<StringAttr>(kCpAttentionAttrName) : StringAttr();
  if (cp >= 0 && ctx.want[0].dims[2] == DimShard(cp) && (!mode || ::ptc::parseOption<::ptc::CpAttention>(mode.getValue()) == ::ptc::CpAttention::Ring)) {
    ctx.want[0].dims[3] = DimShard();
    DimShard heads = ctx.want[0].dims[1];
    int64_t kvHeads = ctx.globalType(o->getOperand(1)).getDimSize(1);
    if (heads.axis >= 0 && kvHeads % (ctx.axisSize(heads.axis) * heads.blocks) != 0)
      return o->emitError() << "mesh axis '" << ctx.mesh().name(heads.axis)
                            << "' cannot split the " << kvHeads << " key/value heads";
    for (unsigned i = 1; i < floats; ++i)
      ctx.like(i, ctx.want[0]);
    if (documents)
      ctx.like(floats, ctx.want[0].tokenPositions(2)); // the block's, split over cp as well
    for (unsigned i = 0; i < o->getNumResults(); ++i)
      ctx.out.push_back(ctx.want[0]);
    ctx.partitionedForm = StringAttr::get(o->getContext(), ctx.mesh().axes[cp]);
    // The causal balance splits each rank's block in two halves.
    const int64_t seq = ctx.globalType(o->getOperand(0)).getDimSize(2), n = ctx.axisSize(cp);
    if (isa<CausalAttentionOp>(o) && n > 1 && (seq / n) % 2 != 0)
      o->emitWarning() << "ring attention cannot balance the causal work over '"
                       << ctx.mesh().axes[cp] << "': each rank's block of " << seq / n
                       << " tokens does not split in two halves, so rank " << n - 1 << " attends "
                       << 2 * n - 1 << "x the blocks rank 0 does (a sequence divisible by "
                       << 2 * n << " is balanced)";
    return success();
  }
  if (cp >= 0 && ctx.want[0].dims[2] == DimShard(cp)) {
    const int64_t qHeads = ctx.globalType(o->getOperand(0)).getDimSize(1),
                  kvHeads = ctx.globalType(o->getOperand(1)).getDimSize(1);
    // Heads already split over tp: over tp*cp (cp minor).
    const DimShard headsBefore = ctx.want[0].dims[1];
    int headsAxis = cp;
    if (headsBefore.axis >= 0) {
      SmallVector<int, 2> parts(ctx.mesh().parts(headsBefore.axis));
      parts.push_back(cp);
      headsAxis = ctx.mesh().axisOf(parts);
      if (headsAxis < 0 || headsBefore.blocks != 1)
        return o->emitError() << "context parallelism (mesh axis '" << ctx.mesh().axes[cp]
                              << "') with the heads also split over '"
                              << ctx.mesh().name(headsBefore.axis)
                              << "' is not implemented (tp and cp are)";
    }
    const int64_t total = ctx.axisSize(headsAxis);
    if (qHeads % total != 0 || kvHeads % total != 0)
      return o->emitError() << "context parallelism (Ulysses) splits the heads over '"
                            << ctx.mesh().name(headsAxis) << "' (" << total << " ways), which "
                            << "must divide the " << qHeads << " query heads and the " << kvHeads
                            << " key/value heads";
    arrivedQ = ctx.want[0];
    arrivedKv = ctx.want[1].withoutPartial();
    arrivedKv->dims[1] = DimShard();
    arrivedKv->dims[2] = DimShard(cp);
    arrivedKv->dims[0] = arrivedQ->dims[0];
    arrivedKv->dims[1] = headsBefore;
    ctx.want[0].dims[1] = DimShard(headsAxis);
  }
  ctx.want[0].dims[2] = ctx.want[0].dims[3] = -1; // sequence and head dim stay whole
  DimShard heads = ctx.want[0].dims[1];
  int64_t kvHeads = ctx.globalType(o->getOperand(1)).getDimSize(1);
  if (heads.axis >= 0 && kvHeads % (ctx.axisSize(heads.axis) * heads.blocks) != 0) {
    int64_t qHeads = ctx.globalType(o->getOperand(0)).getDimSize(1);
    return o->emitError() << "mesh axis '" << ctx.mesh().axes[heads.axis] << "' (size "
                          << ctx.axisSize(heads.axis) << ") splits the " << qHeads
                          << " query heads but cannot split the " << kvHeads
                          << " key/value heads (grouped-query attention: the kv head count "
                             "must be divisible by the axis size)";
  }
  for (unsigned i = 1; i < floats; ++i)
    ctx.like(i, ctx.want[0]);
  if (documents)
    ctx.like(floats, ctx.want[0].tokenPositions(2));
  for (unsigned i = 0; i < o->getNumResults(); ++i) {
    ctx.out.push_back(ctx.want[0]);
    if (arrivedQ)
      ctx.then.push_back({i, i == 0 ? *arrivedQ : *arrivedKv,
                          "context parallelism (Ulysses): back from the heads to the sequence"});
  }
  return success();
}

LogicalResult embeddingRule(EmbeddingOp e, ShardingRuleContext &ctx) {
  Operation *op = e.getOperation();

  // A table split by rows (vocabulary parallel): each device looks up
  // its rows, the group's results sum to the lookup. Ids split over the
  // table's axis too (sequence parallelism) are gathered over it first, as
  // Megatron's embedding takes the whole sequence and reduce-scatters its
  // output into the sequence-parallel region.
  DimShard rows = ctx.want[0].dims[0];
  bool vocab = rows.axis >= 0 && rows.blocks == 1;
  const bool tensorAxis = rows.axis >= 0 && rows.axis == ctx.mesh().axisIndex(MeshAxisRole::Tensor);
  if (vocab && ctx.uses(ctx.want[1], rows.axis) && !tensorAxis)
    vocab = false; // rows over dp (ZeRO-3): the table is gathered instead
  std::optional<Sharding> arrived;
  if (vocab && ctx.uses(ctx.want[1], rows.axis)) {
    // Gathered over the table's axis; a compound keeps its other part (ids
    // over cp*tp under context and sequence parallelism: over cp).
    arrived = ctx.want[1].withoutPartial();
    for (DimShard &d : ctx.want[1].dims)
      if (d.axis >= 0 && d.blocks == 1 && ctx.mesh().overlaps(d.axis, rows.axis))
        d = DimShard(ctx.without(d.axis, rows.axis));
    vocab = !ctx.uses(ctx.want[1], rows.axis); // a blocked split holding it: no
  }
  Sharding res = ctx.want[1];
  res.dims.push_back(DimShard());
  if (vocab) {
    ctx.want[0].dims[1] = DimShard();
    ctx.want[0].partial.clear();
    addPartial(res.partial, rows.axis);
    e.setVocabAxisAttr(StringAttr::get(op->getContext(), ctx.mesh().axes[rows.axis]));
    if (arrived) {
      arrived->dims.push_back(DimShard());
      ctx.then.push_back({0, *arrived,
                          "sequence parallelism: the vocabulary-parallel lookup's output enters "
                          "the sequence-parallel region"});
    }
  } else {
    ctx.replicate(0, ctx.rank(op->getOperand(0)));
    e.removeVocabAxisAttr();
  }
  ctx.out.push_back(res);
  return success();
}

LogicalResult embeddingGradRule(EmbeddingGradOp eg, ShardingRuleContext &ctx) {
  Operation *op = eg.getOperation();

  // The gradient of a vocabulary-parallel lookup keeps the table's rows: its
  // ids (and their gradient) whole over the table's axis, as the forward
  // lookup took them (sequence parallelism gathers both over it).
  int vocabAxis = -1;
  SmallVector<Operation *> readers(eg.getIndices().getUsers().begin(), eg.getIndices().getUsers().end());
  for (size_t i = 0; i < readers.size() && vocabAxis < 0; ++i) {
    if (auto e = dyn_cast<EmbeddingOp>(readers[i]); e && e.getVocabAxis())
      vocabAxis = ctx.mesh().axisIndex(*e.getVocabAxis());
    else if (isa<AllGatherOp>(readers[i])) // the ids the forward lookup gathered
      readers.append(readers[i]->getUsers().begin(), readers[i]->getUsers().end());
  }
  if (vocabAxis >= 0 && vocabAxis == ctx.mesh().axisIndex(MeshAxisRole::Tensor))
    for (DimShard &d : ctx.want[0].dims)
      if (d.axis >= 0 && d.blocks == 1 && ctx.mesh().overlaps(d.axis, vocabAxis))
        d = DimShard(ctx.without(d.axis, vocabAxis));
  Sharding g = ctx.want[0];
  g.dims.push_back(-1);
  ctx.want[1] = g;
  Sharding res = Sharding::replicated(2);
  for (const DimShard &a : ctx.want[0].dims)
    if (a.axis >= 0)
      addPartial(res.partial, a.axis);
  eg.removeVocabAxisAttr();
  if (vocabAxis >= 0 && !llvm::is_contained(res.partial, vocabAxis)) {
    res.dims[0] = DimShard(vocabAxis);
    eg.setVocabAxisAttr(StringAttr::get(op->getContext(), ctx.mesh().axes[vocabAxis]));
  }
  ctx.out.push_back(res);
  return success();
}

LogicalResult crossEntropyRule(Operation *o, ShardingRuleContext &ctx) {
  Operation *op = o;

  ctx.full(0);
  // Classes split plainly over an axis: the vocabulary-parallel kernel.
  DimShard classes = ctx.want[0].dims.back();
  if (classes.axis >= 0 && classes.blocks == 1)
    ctx.partitionedForm = StringAttr::get(op->getContext(), ctx.mesh().name(classes.axis));
  else
    ctx.want[0].dims.back() = -1;
  ctx.want[1].dims.assign(ctx.want[0].dims.begin(), ctx.want[0].dims.end() - 1);
  SmallVector<int> rows;
  for (const DimShard &a : ctx.want[1].dims)
    if (a.axis >= 0)
      rows.push_back(a.axis);
  // The kernel averages over local rows: ctx.scale by local/global rows.
  ctx.scale[0] = 1.0 / static_cast<double>(ctx.shardFactor(rows));
  if (isa<CrossEntropyOp>(o)) {
    Sharding res = Sharding::replicated(0);
    for (int a : rows)
      addPartial(res.partial, a);
    ctx.out.push_back(res);
  } else {
    ctx.replicate(2, ctx.rank(op->getOperand(2)));
    ctx.out.push_back(ctx.want[0]);
  }
  return success();
}

LogicalResult reshapeRule(ReshapeOp rs, ShardingRuleContext &ctx) {
  RankedTensorType gi = ctx.globalType(rs.getInput());
  auto go = cast<RankedTensorType>(rs.getType());
  Sharding res = Sharding::replicated(go.getRank());
  res.partial = ctx.want[0].partial;
  // A split dimension maps to the output dimension that starts at the
  // same outer product and holds whole blocks.
  for (int64_t d = 0; d < gi.getRank(); ++d) {
    DimShard ds = ctx.want[0].dims[d];
    int a = ds.axis;
    if (a < 0)
      continue;
    int64_t prefix = 1, mapped = -1;
    for (int64_t i = 0; i < d; ++i)
      prefix *= gi.getDimSize(i);
    int64_t p = 1;
    for (int64_t e = 0; e < go.getRank(); ++e) {
      // Unit dimensions inserted before it do not hold it ([E, F] -> [E, 1, F]).
      if (p == prefix && go.getDimSize(e) == 1 && gi.getDimSize(d) != 1)
        continue;
      if (p == prefix) {
        int64_t in = gi.getDimSize(d), outSize = go.getDimSize(e);
        bool merge = outSize % in == 0, split = in % outSize == 0;
        if (ds.blocks > 1 ? outSize == in
                          : (merge || split) && outSize % ctx.axisSize(a) == 0 &&
                                (split || in % ctx.axisSize(a) == 0))
          mapped = e;
        break;
      }
      p *= go.getDimSize(e);
    }
    // Context parallelism's sequence under sequence parallelism (cp*tp) is
    // gathered over tp to cp's chunk first (Megatron's gather of the input).
    const int cp = ctx.mesh().axisIndex(MeshAxisRole::Context);
    if (mapped < 0 && ds.blocks == 1 && cp >= 0 && a != cp && ctx.mesh().parts(a).front() == cp) {
      a = cp;
      ds = DimShard(cp);
      ctx.want[0].dims[d] = ds;
    }
    // A plain split merged into an output dimension with the dimensions
    // before it (the sequence of [batch, seq, h] -> [batch * seq, h], as the
    // weight gradients flatten it). The output dimension e spans the input
    // prefixes [pe, spanEnd) and holds dimension d whole after `prefix / pe`
    // outer rows.
    int64_t blocks = 0, e = -1, pe = 1, spanEnd = 0;
    if (mapped < 0 && ds.blocks == 1 && gi.getDimSize(d) % ctx.axisSize(a) == 0)
      for (int64_t o = 0; o < go.getRank() && pe <= prefix && prefix % pe == 0; ++o) {
        spanEnd = pe * go.getDimSize(o);
        if (spanEnd > prefix) {
          if (pe < prefix && spanEnd % (prefix * gi.getDimSize(d)) == 0)
            e = o;
          break;
        }
        pe = spanEnd;
      }
    // Merged with exactly the dimension before it, which is split over P
    // down to one row per device (a batch over dp, one sequence each): each
    // device holds one contiguous run of the output dimension, the compound
    // P*a's when the mesh has it (dp*cp: the weight gradients of dp x cp).
    if (e >= 0 && res.dims[e].axis >= 0 && res.dims[e].blocks == 1 &&
        res.dims[e] == ctx.want[0].dims[d - 1] && pe * gi.getDimSize(d - 1) == prefix &&
        spanEnd == prefix * gi.getDimSize(d) &&
        gi.getDimSize(d - 1) == ctx.axisSize(res.dims[e].axis)) {
      SmallVector<int, 3> parts(ctx.mesh().parts(res.dims[e].axis));
      llvm::append_range(parts, ctx.mesh().parts(a));
      if (int both = ctx.mesh().axisOf(parts); both >= 0) {
        res.dims[e] = DimShard(both);
        continue;
      }
    }
    // Otherwise a split over cp: `prefix / pe` equal blocks, each split, so
    // that the gradient is a partial sum over cp rather than a gather of the
    // sequence.
    if (e >= 0 && a == cp && res.dims[e].axis < 0) {
      mapped = e;
      blocks = prefix / pe;
    }
    if (mapped >= 0 && res.dims[mapped].axis < 0)
      res.dims[mapped] = blocks > 1 ? DimShard(a, static_cast<int>(blocks)) : ds;
    else
      ctx.want[0].dims[d] = DimShard();
  }
  ctx.out.push_back(res);
  return success();
}

LogicalResult transposeRule(TransposeOp t, ShardingRuleContext &ctx) {
  Sharding res = ctx.want[0];
  for (auto [i, p] : llvm::enumerate(t.getPermutation()))
    res.dims[i] = ctx.want[0].dims[p];
  ctx.out.push_back(res);
  return success();
}

LogicalResult sliceOrPadRule(Operation *o, ShardingRuleContext &ctx) {
  RankedTensorType gi = ctx.globalType(o->getOperand(0));
  auto go = cast<RankedTensorType>(o->getResult(0).getType());
  ArrayRef<int64_t> offsets = isa<SliceOp>(o) ? cast<SliceOp>(o).getOffsets()
                                              : cast<PadOp>(o).getOffsets();
  bool slice = isa<SliceOp>(o);
  Sharding res = ctx.want[0];
  SmallVector<int64_t> localOffsets(offsets);
  for (int64_t d = 0; d < gi.getRank(); ++d) {
    if (gi.getDimSize(d) == go.getDimSize(d))
      continue;
    // One whole block of a blocked dimension is a plainly split piece
    // (slice), and a split piece padded into k blocks is blocked (pad).
    int64_t big = slice ? gi.getDimSize(d) : go.getDimSize(d);
    int64_t small = slice ? go.getDimSize(d) : gi.getDimSize(d);
    DimShard ds = ctx.want[0].dims[d];
    bool aligned = big % small == 0 && offsets[d] % small == 0;
    if (slice && ds.axis >= 0 && aligned && ds.blocks == big / small) {
      res.dims[d] = DimShard(ds.axis);
      localOffsets[d] /= ctx.axisSize(ds.axis); // block b starts at b * small / p locally
    } else if (!slice && ds.axis >= 0 && ds.blocks == 1 && aligned) {
      res.dims[d] = DimShard(ds.axis, static_cast<int>(big / small));
      localOffsets[d] /= ctx.axisSize(ds.axis);
    } else {
      ctx.want[0].dims[d] = DimShard();
      res.dims[d] = DimShard();
    }
  }
  o->setAttr("offsets", DenseI64ArrayAttr::get(o->getContext(), localOffsets));
  ctx.out.push_back(res);
  return success();
}

LogicalResult concatRule(ConcatOp c, ShardingRuleContext &ctx) {
  int64_t axis = c.getAxis() < 0 ? c.getAxis() + c.getType().getRank() : c.getAxis();
  Sharding s = ctx.want[0];
  // Equal pieces, each plainly split over one mesh axis along the
  // concatenated axis, concatenate locally into the blocked layout (the
  // fused QKV gradient of q, k and v split over tp is [.., tp/3]).
  DimShard piece = ctx.want[0].dims[axis];
  int64_t size = ctx.globalType(c->getOperand(0)).getDimSize(axis);
  bool blocked = piece.axis >= 0 && piece.blocks == 1 && ctx.want.size() > 1;
  for (unsigned i = 0; i < ctx.want.size(); ++i)
    blocked &= ctx.want[i].dims[axis].axis == piece.axis && ctx.want[i].dims[axis].blocks == 1 &&
               ctx.globalType(c->getOperand(i)).getDimSize(axis) == size;
  s.dims[axis] = -1;
  bool samePartial = llvm::all_of(ctx.want, [&](const Sharding &w) { return w.partial == s.partial; });
  if (!samePartial)
    s.partial.clear();
  for (unsigned i = 0; i < ctx.want.size(); ++i) {
    ctx.want[i] = s;
    if (blocked)
      ctx.want[i].dims[axis] = piece;
  }
  if (blocked)
    s.dims[axis] = DimShard(piece.axis, static_cast<int>(ctx.want.size()));
  ctx.out.push_back(s);
  return success();
}

LogicalResult sumOrMeanRule(Operation *o, ShardingRuleContext &ctx) {
  ArrayRef<int64_t> axes = isa<ReduceSumOp>(o) ? cast<ReduceSumOp>(o).getAxes()
                                               : cast<ReduceMeanOp>(o).getAxes();
  bool keep = isa<ReduceSumOp>(o) ? cast<ReduceSumOp>(o).getKeepDims()
                                  : cast<ReduceMeanOp>(o).getKeepDims();
  int64_t r = ctx.rank(o->getOperand(0));
  SmallVector<bool> reduced(r, false);
  for (int64_t a : axes)
    reduced[a < 0 ? a + r : a] = true;
  Sharding res;
  res.partial = ctx.want[0].partial;
  SmallVector<int> split;
  for (int64_t d = 0; d < r; ++d) {
    if (!reduced[d])
      res.dims.push_back(ctx.want[0].dims[d]);
    else {
      if (keep)
        res.dims.push_back(-1);
      if (ctx.want[0].dims[d].axis >= 0) {
        split.push_back(ctx.want[0].dims[d].axis);
        addPartial(res.partial, ctx.want[0].dims[d].axis);
      }
    }
  }
  if (isa<ReduceMeanOp>(o))
    ctx.scale[0] = 1.0 / static_cast<double>(ctx.shardFactor(split));
  ctx.out.push_back(res);
  return success();
}

LogicalResult maxRule(Operation *o, ShardingRuleContext &ctx) {
  // The maximum needs whole reduced dimensions; the rest keep their split.
  ctx.full(0);
  ArrayRef<int64_t> axes = isa<ReduceMaxOp>(o) ? cast<ReduceMaxOp>(o).getAxes()
                                               : cast<ReduceMaxGradOp>(o).getAxes();
  bool keep = isa<ReduceMaxOp>(o) ? cast<ReduceMaxOp>(o).getKeepDims()
                                  : cast<ReduceMaxGradOp>(o).getKeepDims();
  int64_t r = ctx.rank(o->getOperand(0));
  SmallVector<bool> reduced(r, false);
  for (int64_t a : axes)
    reduced[a < 0 ? a + r : a] = true;
  Sharding kept;
  for (int64_t d = 0; d < r; ++d) {
    if (reduced[d])
      ctx.want[0].dims[d] = DimShard();
    if (!reduced[d] || keep)
      kept.dims.push_back(reduced[d] ? DimShard() : ctx.want[0].dims[d]);
  }
  if (isa<ReduceMaxOp>(o)) {
    ctx.out.push_back(kept);
  } else {
    ctx.want[1] = kept; // the gradient has the reduced shape
    ctx.out.push_back(ctx.want[0]);
  }
  return success();
}

LogicalResult broadcastRule(BroadcastOp bc, ShardingRuleContext &ctx) {
  RankedTensorType gi = ctx.globalType(bc.getInput());
  auto go = cast<RankedTensorType>(bc.getType());
  Sharding res = Sharding::replicated(go.getRank());
  res.partial = ctx.want[0].partial;
  int64_t lead = go.getRank() - gi.getRank();
  for (int64_t d = 0; d < gi.getRank(); ++d) {
    if (gi.getDimSize(d) == go.getDimSize(lead + d))
      res.dims[lead + d] = ctx.want[0].dims[d];
    else
      ctx.want[0].dims[d] = -1;
  }
  ctx.out.push_back(res);
  return success();
}

} // namespace

LogicalResult AddOp::inferShardingRule(ShardingRuleContext &ctx) { return elementwiseBinaryRule(*this, ctx); }
LogicalResult SubOp::inferShardingRule(ShardingRuleContext &ctx) { return elementwiseBinaryRule(*this, ctx); }
LogicalResult MulOp::inferShardingRule(ShardingRuleContext &ctx) { return elementwiseBinaryRule(*this, ctx); }
LogicalResult DivOp::inferShardingRule(ShardingRuleContext &ctx) { return elementwiseBinaryRule(*this, ctx); }
LogicalResult SwigluOp::inferShardingRule(ShardingRuleContext &ctx) { return elementwiseBinaryRule(*this, ctx); }
// The gradient: every operand and both results split like the gate.
LogicalResult SwigluGradOp::inferShardingRule(ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.like(1, ctx.want[0]);
  ctx.like(2, ctx.want[0]);
  ctx.out.assign(2, ctx.want[0]);
  return success();
}
LogicalResult ScaleOp::inferShardingRule(ShardingRuleContext &ctx) { return passThroughRule(*this, ctx); }
// Any split: each device draws its elements' masks by their global indices,
// so the rule records the split for the partitioned op (and, being linear,
// passes partial sums through).
LogicalResult DropoutOp::inferShardingRule(ShardingRuleContext &ctx) {
  if (failed(passThroughRule(*this, ctx)))
    return failure();
  const Sharding &s = ctx.want[0];
  if (llvm::any_of(s.dims, [](const DimShard &d) { return d.axis >= 0; }))
    ctx.partitionedForm = getShardingAttr(getContext(), ctx.mesh(), s.withoutPartial());
  return success();
}
Operation *DropoutOp::partition(OpBuilder &b) {
  auto layout = (*this)->getAttrOfType<ShardingAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!layout)
    return nullptr;
  return DropoutOp::create(b, getLoc(), getType(), getInput(), getPAttr(), getStreamAttr(), layout);
}
LogicalResult ConvertOp::inferShardingRule(ShardingRuleContext &ctx) { return passThroughRule(*this, ctx); }
LogicalResult MicrobatchSumOp::inferShardingRule(ShardingRuleContext &ctx) { return passThroughRule(*this, ctx); }
LogicalResult MatmulOp::inferShardingRule(ShardingRuleContext &ctx) { return matmulRule(*this, ctx); }
LogicalResult RotaryOp::inferShardingRule(ShardingRuleContext &ctx) { return rotaryRule(*this, ctx); }
LogicalResult SoftmaxOp::inferShardingRule(ShardingRuleContext &ctx) { return softmaxRule(*this, ctx); }
LogicalResult SoftmaxGradOp::inferShardingRule(ShardingRuleContext &ctx) { return softmaxGradRule(*this, ctx); }
LogicalResult CausalAttentionOp::inferShardingRule(ShardingRuleContext &ctx) { return attentionRule(*this, ctx); }
LogicalResult CausalAttentionGradOp::inferShardingRule(ShardingRuleContext &ctx) { return attentionRule(*this, ctx); }
LogicalResult EmbeddingOp::inferShardingRule(ShardingRuleContext &ctx) { return embeddingRule(*this, ctx); }
LogicalResult EmbeddingGradOp::inferShardingRule(ShardingRuleContext &ctx) { return embeddingGradRule(*this, ctx); }
LogicalResult CrossEntropyOp::inferShardingRule(ShardingRuleContext &ctx) { return crossEntropyRule(*this, ctx); }
LogicalResult CrossEntropyGradOp::inferShardingRule(ShardingRuleContext &ctx) { return crossEntropyRule(*this, ctx); }

// Formed after sharding (ptc-fold-attention-layout): no rule.
LogicalResult CausalAttentionQkvOp::inferShardingRule(ShardingRuleContext &) {
  return emitOpError() << "has no sharding rule: ptc-fold-attention-layout forms it after "
                          "sharding";
}
LogicalResult CausalAttentionQkvGradOp::inferShardingRule(ShardingRuleContext &) {
  return emitOpError() << "has no sharding rule: ptc-fold-attention-layout forms it after "
                          "sharding";
}

LogicalResult CrossEntropyWithGradOp::inferShardingRule(ShardingRuleContext &) {
  return emitOpError()
         << "has no sharding rule: ptc-fuse-cross-entropy-grad forms it after sharding";
}
LogicalResult MatmulBiasGradOp::inferShardingRule(ShardingRuleContext &) {
  return emitOpError() << "has no sharding rule: ptc-fuse-matmul-bias forms it after sharding";
}

// Causal attention of a sequence split over cp with cp-attention=ring.
Operation *CausalAttentionOp::partition(OpBuilder &b) {
  auto axis = (*this)->getAttrOfType<StringAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axis)
    return nullptr;
  return RingAttentionOp::create(b, getLoc(), getResult().getType(),
                                 getStats() ? getStats().getType() : Type(), getQuery(), getKey(),
                                 getValue(), getPositions(), b.getStrArrayAttr({axis.getValue()}),
                                 b.getF64FloatAttr(getScaleOrDefault()));
}
Operation *CausalAttentionGradOp::partition(OpBuilder &b) {
  auto axis = (*this)->getAttrOfType<StringAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axis)
    return nullptr;
  return RingAttentionGradOp::create(b, getLoc(), getResultTypes(), getOperand(0), getOperand(1),
                                     getOperand(2), getOperand(3), getSavedResult(),
                                     getSavedStats(), getPositions(),
                                     b.getStrArrayAttr({axis.getValue()}),
                                     b.getF64FloatAttr(getScaleOrDefault()));
}

// Rotary embeddings of a sequence split over cp: offset by the block.
Operation *RotaryOp::partition(OpBuilder &b) {
  auto axis = (*this)->getAttrOfType<StringAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axis)
    return nullptr;
  return RotaryOp::create(b, getLoc(), getType(), getInput(), getThetaAttr(), getInverseAttr(),
                          axis, getSeqMajorAttr());
}

// The vocabulary-parallel cross-entropy (and its gradient) over the axis the
// rule found the classes split over.
Operation *CrossEntropyOp::partition(OpBuilder &b) {
  auto axis = (*this)->getAttrOfType<StringAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axis)
    return nullptr;
  return VocabParallelCrossEntropyOp::create(b, getLoc(), getType(), getLogits(), getTargets(),
                                             b.getStrArrayAttr({axis.getValue()}));
}
Operation *CrossEntropyGradOp::partition(OpBuilder &b) {
  auto axis = (*this)->getAttrOfType<StringAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axis)
    return nullptr;
  return VocabParallelCrossEntropyGradOp::create(b, getLoc(), getType(), getOperand(0),
                                                 getOperand(1), getOperand(2),
                                                 b.getStrArrayAttr({axis.getValue()}));
}
LogicalResult ReshapeOp::inferShardingRule(ShardingRuleContext &ctx) { return reshapeRule(*this, ctx); }
LogicalResult TransposeOp::inferShardingRule(ShardingRuleContext &ctx) { return transposeRule(*this, ctx); }
LogicalResult SliceOp::inferShardingRule(ShardingRuleContext &ctx) { return sliceOrPadRule(*this, ctx); }
LogicalResult PadOp::inferShardingRule(ShardingRuleContext &ctx) { return sliceOrPadRule(*this, ctx); }
LogicalResult ConcatOp::inferShardingRule(ShardingRuleContext &ctx) { return concatRule(*this, ctx); }
LogicalResult ReduceSumOp::inferShardingRule(ShardingRuleContext &ctx) { return sumOrMeanRule(*this, ctx); }
LogicalResult ReduceMeanOp::inferShardingRule(ShardingRuleContext &ctx) { return sumOrMeanRule(*this, ctx); }
LogicalResult ReduceMaxOp::inferShardingRule(ShardingRuleContext &ctx) { return maxRule(*this, ctx); }
LogicalResult ReduceMaxGradOp::inferShardingRule(ShardingRuleContext &ctx) { return maxRule(*this, ctx); }
LogicalResult BroadcastOp::inferShardingRule(ShardingRuleContext &ctx) { return broadcastRule(*this, ctx); }
