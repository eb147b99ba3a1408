//===- PtcShardingRulesOptimizer.cpp - the step ops' sharding rules -----===//
//
// The once-per-step ops: fused optimizer updates run where their state
// lives (ZeRO), gradient clipping and loss-scale unscaling read each gradient
// as it arrives and reduce their norm or flag over the axes gradients split.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcSharding.h"

using namespace mlir;
using namespace mlir::ptc;

namespace {
LogicalResult updateRule(Operation *o, ShardingRuleContext &ctx) {
  Operation *op = o;

  // The update runs where the optimizer state lives: under ZeRO the
  // state is split over dp, the parameter and gradient are cut to match
  // and the new parameter is gathered where the whole one is needed.
  Sharding p = ctx.want[0].withoutPartial();
  if (ctx.rank(o->getOperand(2)) > 0) {
    Sharding state = ctx.sharding(o->getOperand(2)).withoutPartial();
    if (llvm::any_of(state.dims, [](const DimShard &d) { return d.axis >= 0; }))
      p = state;
  }
  ctx.want[0] = p;
  for (unsigned i = 1; i < o->getNumOperands(); ++i) {
    if (ctx.rank(o->getOperand(i)) == 0)
      ctx.replicate(i, ctx.rank(op->getOperand(i)));
    else
      ctx.like(i, p);
  }
  for (unsigned i = 0; i < o->getNumResults(); ++i)
    ctx.out.push_back(p);
  return success();
}
} // namespace

LogicalResult AdamWUpdateOp::inferShardingRule(ShardingRuleContext &ctx) { return updateRule(*this, ctx); }
LogicalResult SgdUpdateOp::inferShardingRule(ShardingRuleContext &ctx) { return updateRule(*this, ctx); }

namespace {
/// Gradients read as they arrive (a tensor-parallel block, a ZeRO shard;
/// complete sums only), each result split like its gradient, for the first
/// `n` operands of a once-per-step gradient op. Returns the mesh axes some
/// gradient is split over (sorted), and in `splitOver` each one's own.
SmallVector<int> keepGradientSplits(ShardingRuleContext &ctx, unsigned n,
                                    SmallVectorImpl<llvm::SmallSetVector<int, 4>> &splitOver) {
  llvm::SmallSetVector<int, 4> axes;
  splitOver.assign(n, {});
  for (unsigned i = 0; i < n; ++i) {
    ctx.full(i);
    for (const DimShard &d : ctx.want[i].dims)
      if (d.axis >= 0)
        for (int part : ctx.mesh().parts(d.axis)) {
          axes.insert(part);
          splitOver[i].insert(part);
        }
    ctx.out.push_back(ctx.want[i]);
  }
  SmallVector<int> sorted(axes.begin(), axes.end());
  llvm::sort(sorted);
  return sorted;
}

ArrayAttr axisNames(MLIRContext *context, const MeshInfo &mesh, ArrayRef<int> axes) {
  SmallVector<StringRef> names;
  for (int a : axes)
    names.push_back(mesh.axes[a]);
  return Builder(context).getStrArrayAttr(names);
}
} // namespace

// Gradient clipping reads each gradient as it arrives: the clipped gradients
// keep those splits, and the norm's sum of squares runs over every mesh axis
// some gradient is split over, each gradient counting with 1 / the copies of
// it that group holds. Clipping whole gradients would gather every split one
// for the clip alone.
LogicalResult ClipGradNormOp::inferShardingRule(ShardingRuleContext &ctx) {
  const unsigned n = getGrads().size();
  SmallVector<llvm::SmallSetVector<int, 4>> splitOver;
  SmallVector<int> axes = keepGradientSplits(ctx, n, splitOver);
  ctx.out.push_back(Sharding::replicated(0)); // the norm
  if (axes.empty())
    return success();
  SmallVector<double> weights;
  for (unsigned i = 0; i < n; ++i) {
    int64_t copies = 1;
    for (int a : axes)
      if (!splitOver[i].contains(a))
        copies *= ctx.mesh().sizes[a];
    weights.push_back(1.0 / static_cast<double>(copies));
  }
  Builder b(getContext());
  ctx.partitionedForm =
      b.getArrayAttr({axisNames(getContext(), ctx.mesh(), axes), b.getDenseF64ArrayAttr(weights)});
  return success();
}

Operation *ClipGradNormOp::partition(OpBuilder &b) {
  auto form = (*this)->getAttrOfType<ArrayAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!form || form.size() != 2)
    return nullptr;
  return ClipGradNormOp::create(b, getLoc(), getResultTypes(), getGrads(), getMaxNormAttr(),
                                cast<ArrayAttr>(form[0]), cast<DenseF64ArrayAttr>(form[1]));
}

// Unscaling divides each gradient by the loss scale where it arrives; the
// overflow flag is the maximum over every axis some gradient is split over (a
// replicated gradient's flag is the same on each copy, so no weights: a
// maximum counts it once).
LogicalResult UnscaleGradsOp::inferShardingRule(ShardingRuleContext &ctx) {
  const unsigned n = getGrads().size();
  SmallVector<llvm::SmallSetVector<int, 4>> splitOver;
  SmallVector<int> axes = keepGradientSplits(ctx, n, splitOver);
  ctx.replicate(n, 0); // the scale
  ctx.out.push_back(Sharding::replicated(0)); // the flag
  if (!axes.empty())
    ctx.partitionedForm = axisNames(getContext(), ctx.mesh(), axes);
  return success();
}

Operation *UnscaleGradsOp::partition(OpBuilder &b) {
  auto axes = (*this)->getAttrOfType<ArrayAttr>(PtcDialect::kPartitionedFormAttrName);
  if (!axes)
    return nullptr;
  return UnscaleGradsOp::create(b, getLoc(), getResultTypes(), getGrads(), getScale(), axes);
}
