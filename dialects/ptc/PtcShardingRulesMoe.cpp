//===- PtcShardingRulesMoe.cpp - the MoE ops' sharding rules ------------===//
//
// Mixture of experts: top-k routing is per token; dispatch and combine move
// tokens between the token side (split like the batch) and the expert side
// (experts split over ep); the expert-load metric counts the whole group.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcSharding.h"

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// Top-k routing is per token: every dimension but the experts' splits freely.
LogicalResult topKGateRule(Operation *op, ShardingRuleContext &ctx) {
  ctx.full(0);
  ctx.want[0].dims.back() = DimShard();
  for (unsigned i = 1; i < ctx.want.size(); ++i) // the gradient's indices and weights_grad
    ctx.like(i, ctx.want[0]);
  ctx.out.assign(op->getNumResults(), ctx.want[0]);
  return success();
}

/// MoE dispatch and combine (and their gradients) route each group on its
/// own: the group dimension splits freely, a group's tokens must stay
/// together on one device (capacity and slot order are per group). Returns
/// the groups' split, read from the indices operand `idx`, and in
/// `contextAxis` the cp axis when the tokens arrive split over it (context
/// parallelism): the routing ops then take the whole group (gathered over
/// cp) and the expert side is split over cp by capacity slots instead.
FailureOr<DimShard> routingGroups(Operation *op, ShardingRuleContext &ctx, unsigned idx,
                                  int &contextAxis) {
  const Sharding &s = ctx.want[idx];
  int64_t r = ctx.rank(op->getOperand(idx));
  int64_t tokenDim = r - 2;
  const int cp = ctx.mesh().axisIndex(MeshAxisRole::Context);
  contextAxis = -1;
  if (DimShard t = s.dims[tokenDim]; t.axis >= 0 && t.blocks == 1 && t.axis == cp && r == 3) {
    contextAxis = cp;
  } else if (t.axis >= 0) {
    op->emitOpError() << "splits a routing group over mesh axis '" << ctx.mesh().name(t.axis)
                      << "': dimension " << tokenDim << " of the expert indices ("
                      << ctx.globalType(op->getOperand(idx)).getDimSize(tokenDim)
                      << " tokens, one "
                      << (r == 3 ? "group" : "group: the op has no group dimension")
                      << ") is split, but capacity and slot order are per group; keep "
                         "groups whole (no sequence parallelism over this axis, or route "
                         "per sequence with [groups, tokens, k] indices)";
    return failure();
  }
  return r == 3 ? s.dims[0] : DimShard();
}

/// `[groups, tokens, ...]` split over `g` on its group dimension (0) only.
int64_t rankOf(Value v) { return cast<RankedTensorType>(v.getType()).getRank(); }

Sharding tokenSide(ShardingRuleContext &, Value v, DimShard g) {
  Sharding s = Sharding::replicated(rankOf(v));
  if (s.dims.size() == 3)
    s.dims[0] = g;
  return s;
}

/// `[experts, groups, capacity, dim]` split over `g` on its group dimension (1).
Sharding expertSide(ShardingRuleContext &, Value v, DimShard g) {
  Sharding s = Sharding::replicated(rankOf(v));
  if (s.dims.size() == 4)
    s.dims[1] = g;
  return s;
}

/// Dispatch, combine and their gradients: every operand and result is
/// token-side (the indices' rank) or expert-side (one more), split over the
/// routing groups like the indices (operand `indices`). Under context
/// parallelism the token side arrives gathered over cp (whole groups) and
/// each expert-side result is resharded right away to its cp share of the
/// capacity slots, so the experts' work splits over cp like the rest of the
/// layer (its users gather it back before the next routing op).
LogicalResult moeRoutingRule(Operation *op, ShardingRuleContext &ctx, unsigned indices) {
  int cp = -1;
  FailureOr<DimShard> g = routingGroups(op, ctx, indices, cp);
  if (failed(g))
    return failure();
  int64_t r = rankOf(op->getOperand(indices));
  auto side = [&](Value v) {
    return rankOf(v) == r + 1 ? expertSide(ctx, v, *g) : tokenSide(ctx, v, *g);
  };
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    ctx.like(static_cast<unsigned>(i), side(v));
  for (auto [i, v] : llvm::enumerate(op->getResults())) {
    ctx.out.push_back(side(v));
    // (Only when the groups are whole: with dp or ep splitting them too, the
    // experts' reshape of [groups, slots] would need a compound of both and
    // gathers the slots back; the expert work is then repeated over cp.)
    if (cp >= 0 && g->axis < 0 && rankOf(v) == r + 1 &&
        ctx.globalType(v).getDimSize(2) % ctx.axisSize(cp) == 0) {
      Sharding slots = side(v);
      slots.dims[2] = DimShard(cp);
      ctx.then.push_back({static_cast<unsigned>(i), slots,
                          "context parallelism: the routing group's capacity slots split over " +
                              ctx.mesh().axes[cp]});
    }
  }
  return success();
}
} // namespace

LogicalResult TopKGateOp::inferShardingRule(ShardingRuleContext &ctx) {
  if (failed(topKGateRule(*this, ctx)))
    return failure();
  if (getSelectionBias())
    ctx.replicate(1, 1); // one bias per expert, on every device
  return success();
}
LogicalResult TopKGateGradOp::inferShardingRule(ShardingRuleContext &ctx) { return topKGateRule(*this, ctx); }

LogicalResult MoeDispatchOp::inferShardingRule(ShardingRuleContext &ctx) { return moeRoutingRule(*this, ctx, 1); }
LogicalResult MoeDispatchGradOp::inferShardingRule(ShardingRuleContext &ctx) { return moeRoutingRule(*this, ctx, 1); }
LogicalResult MoeCombineOp::inferShardingRule(ShardingRuleContext &ctx) { return moeRoutingRule(*this, ctx, 2); }
LogicalResult MoeCombineGradOp::inferShardingRule(ShardingRuleContext &ctx) { return moeRoutingRule(*this, ctx, 2); }

LogicalResult ExpertLoadOp::inferShardingRule(ShardingRuleContext &ctx) {
  int cp = -1; // under cp the whole group's indices are counted (gathered)
  FailureOr<DimShard> g = routingGroups(*this, ctx, 0, cp);
  if (failed(g))
    return failure();
  ctx.like(0, tokenSide(ctx, getIndices(), *g));
  Sharding res = Sharding::replicated(rankOf(getResult()));
  if (res.dims.size() == 2)
    res.dims[0] = *g;
  ctx.out.push_back(res);
  return success();
}
