//===- CostModel.cpp - the planner's prices of ops and collectives -------===//

#include "planner/CostModel.h"
#include "planner/Planner.h"

#include "dialects/ptc/PtcOps.h"
#include "passes/memory/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

using namespace mlir;
using namespace mlir::ptc;

namespace ptc::planner {

/// Which traffic a collective is: an all-to-all over ep is the experts'
/// dispatch, one over cp Ulysses' attention; any other collective over dp,
/// ep or cp moves gradients or parameters (the dense ones are replicated over
/// dp x ep x cp); the rest is tp's.
MeshAxisRole classOf(const CollKey &key) {
  auto [mask, kind] = key;
  if (mask & roleBit(MeshAxisRole::Data))
    return MeshAxisRole::Data;
  if (mask & roleBit(MeshAxisRole::Expert))
    return kind == kAllToAll ? MeshAxisRole::Expert : MeshAxisRole::Data;
  if (mask & roleBit(MeshAxisRole::Context))
    return kind == kAllToAll ? MeshAxisRole::Context : MeshAxisRole::Data;
  return MeshAxisRole::Tensor;
}

/// 4 B H S^2 D of a query whose sequence is dimension `seqDim` ([B, H, S, D]:
/// 2; seq_major: 1).
double attentionFlopsOf(Value query, int64_t seqDim) {
  auto q = cast<RankedTensorType>(query.getType());
  return 4.0 * static_cast<double>(q.getNumElements()) * q.getDimSize(seqDim);
}

std::string elementTypeName(Type t) {
  if (t.isBF16())
    return "bf16";
  if (t.isF16())
    return "f16";
  return "f32";
}


double tensorBytes(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? static_cast<double>(getTensorBytes(t)) : 0.0;
}

/// The collective `op` is, its axis role and bytes per device, or nothing.
std::optional<std::tuple<CollKey, double>> collectiveOf(Operation *op) {
  int kind = -1;
  double bytes = 0;
  if (isa<AllReduceOp>(op)) {
    kind = kAllReduce;
    for (Value v : op->getOperands())
      bytes += tensorBytes(v);
  } else if (isa<AllGatherOp>(op)) {
    kind = kAllGather;
    bytes = tensorBytes(op->getResult(0));
  } else if (isa<ReduceScatterOp>(op)) {
    kind = kReduceScatter;
    bytes = tensorBytes(op->getOperand(0));
  } else if (isa<AllToAllOp>(op)) {
    kind = kAllToAll;
    bytes = tensorBytes(op->getOperand(0));
  } else {
    return std::nullopt;
  }
  int mask = 0;
  if (auto axes = op->getAttrOfType<ArrayAttr>("axes"))
    for (Attribute a : axes)
      if (const MeshAxisKind *k = lookupMeshAxisKind(cast<StringAttr>(a).getValue()))
        mask |= roleBit(k->role);
  return std::make_tuple(CollKey{mask, kind}, bytes);
}

/// The cost of every op of `func`, by chunk (`ptc.stage`, 0 without one) and
/// phase (`ptc.segment`, or the position around the backward ops).
std::map<int, Costs> aggregate(func::FuncOp func, const Pricer &price) {
  std::map<int, Costs> out;
  Block &block = func.getBody().front();
  FailureOr<MeshInfo> mesh = getEnclosingMesh(func);
  Operation *firstBackward = nullptr, *lastBackward = nullptr;
  for (Operation &op : block)
    if (op.hasAttr(PtcDialect::kBackwardAttrName)) {
      firstBackward = firstBackward ? firstBackward : &op;
      lastBackward = &op;
    }
  // Positions: forward until the first backward op, backward through the
  // last one and the gradient collectives right after it, then the step.
  int positional = kForward;
  bool afterBackward = false;
  for (Operation &op : block.without_terminator()) {
    if (&op == firstBackward)
      positional = kBackward;
    if (afterBackward && positional == kBackward && !isa<AllReduceOp, ReduceScatterOp>(op))
      positional = kStep;
    int phase = positional;
    if (std::optional<SegmentKind> seg = getSegment(&op))
      phase = *seg == SegmentKind::Forward ? kForward : *seg == SegmentKind::Step ? kStep : kBackward;
    int chunk = 0;
    if (auto stage = op.getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName); stage && stage.getInt() >= 0)
      chunk = static_cast<int>(stage.getInt());
    PhaseCost &pc = out[chunk].phase[phase];
    // Causal attention of `query`'s shape, `factor` times the forward's FLOPs.
    auto addAttention = [&](Value query, int64_t seqDim, double factor) {
      double f = factor * attentionFlopsOf(query, seqDim);
      double s = price.attention(
          f, elementTypeName(cast<RankedTensorType>(query.getType()).getElementType()));
      pc.seconds += s;
      pc.attentionSeconds += s;
      pc.flops += f;
    };
    if (&op == lastBackward)
      afterBackward = true;
    if (isa<arith::ConstantOp, ReshapeOp, TransferOp>(op))
      continue;
    if (succeeded(mesh))
      if (auto coll = collectiveOf(&op)) {
        Collective &c = pc.collectives[std::get<0>(*coll)];
        c.bytes += std::get<1>(*coll);
        c.count += 1;
        continue;
      }
    if (auto mm = dyn_cast<MatmulOp>(op)) {
      double f = mm.getFlops();
      double s = price.matmul(f, elementTypeName(mm.getType().getElementType()));
      pc.seconds += s;
      pc.matmulSeconds += s;
      pc.flops += f;
    } else if (auto mg = dyn_cast<MatmulBiasGradOp>(op)) {
      // The weight gradient's product, and the bias gradient's pass over its
      // lhs as the separate sum it replaces costs (the default path).
      double f = mg.getFlops();
      double s = price.matmul(f, elementTypeName(mg.getResult().getType().getElementType()));
      pc.seconds += s + price.memory(tensorBytes(mg.getLhs()) + tensorBytes(mg.getBiasGrad()));
      pc.matmulSeconds += s;
      pc.flops += f;
    } else if (auto at = dyn_cast<CausalAttentionOp>(op)) {
      addAttention(at.getQuery(), at.getSeqDim(), 1.0);
    } else if (auto aq = dyn_cast<CausalAttentionQkvOp>(op)) {
      // Read from a fused projection: the query's shape is the result's.
      addAttention(aq.getResult(), 1, 1.0);
    } else if (auto aqg = dyn_cast<CausalAttentionQkvGradOp>(op)) {
      addAttention(aqg.getGrad(), 1, 2.5);
    } else if (isa<RingAttentionOp, RingAttentionGradOp>(op)) {
      // A rank's causal share of the whole sequence's attention (the ring is
      // balanced): n blocks of its local size; the gradient runs the forward
      // ring again unless it reads the forward's saved statistics. Each of the
      // n - 1 steps passes the key and value blocks
      // (f32: the executor's working copies) on; the gradient's steps pass
      // their gradients too, and one last move brings them home.
      Value q = op.getOperand(0);
      auto axes = op.getAttrOfType<ArrayAttr>("axes");
      double n = 1;
      if (succeeded(mesh) && axes)
        for (Attribute a : axes)
          n *= static_cast<double>(mesh->sizes[static_cast<size_t>(
              mesh->axisIndex(cast<StringAttr>(a).getValue()))]);
      bool grad = isa<RingAttentionGradOp>(op);
      const bool recomputes = grad && !cast<RingAttentionGradOp>(op).getSavedStats();
      double f = (grad ? (recomputes ? 3.5 : 2.5) : 1.0) * n * attentionFlopsOf(q);
      double s = price.attention(f, elementTypeName(cast<RankedTensorType>(q.getType()).getElementType()));
      pc.seconds += s;
      pc.attentionSeconds += s;
      pc.ringComputeSeconds += s;
      pc.flops += f;
      auto [bytes, messages] = grad ? cast<RingAttentionGradOp>(op).ringTransfers(static_cast<int64_t>(n))
                                    : cast<RingAttentionOp>(op).ringTransfers(static_cast<int64_t>(n));
      pc.ring.bytes += bytes;
      pc.ring.count += messages;
    } else if (auto ag = dyn_cast<CausalAttentionGradOp>(op)) {
      // The gradient recomputes the probabilities: 2.5x the forward's FLOPs.
      addAttention(ag.getQuery(), ag.getSeqDim(), 2.5);
    } else {
      double bytes = 0;
      for (Value v : op.getOperands())
        bytes += tensorBytes(v);
      for (Value v : op.getResults())
        bytes += tensorBytes(v);
      pc.seconds += price.memory(bytes);
    }
  }
  return out;
}

ClassSeconds predictClasses(func::FuncOp compiled, const Cluster &cluster, int64_t ranks) {
  Pricer price(cluster, cluster.ranksPerNode(ranks));
  ClassSeconds out;
  for (auto &[chunk, costs] : aggregate(compiled, price))
    for (const PhaseCost &pc : costs.phase) {
      out.matmul += pc.matmulSeconds;
      out.attention += pc.attentionSeconds;
      out.other += pc.seconds - pc.matmulSeconds - pc.attentionSeconds;
    }
  return out;
}

} // namespace ptc::planner
