//===- PtcDecodeOps.cpp - ops of forward-only decode plans ----------------===//
//
// Verifiers, sharding rules and plan instructions of the ops ptc-derive-decode
// introduces (PtcDecodeOps.td): attention over a key/value cache and rotary
// embeddings at given positions.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"
#include "dialects/ptc/PtcSharding.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::kernels::OpKind;

namespace {

/// Batch and heads split freely (with the query's split of its heads on the
/// key/value heads and caches); tokens, context and head_dim stay whole; the
/// positions follow the batch.
void batchAndHeadsRule(Operation *op, ShardingRuleContext &ctx, unsigned numFloat,
                       unsigned positionsOperand) {
  ctx.full(0);
  ctx.want[0].dims[2] = ctx.want[0].dims[3] = -1;
  for (unsigned i = 1; i < numFloat; ++i)
    ctx.like(i, ctx.want[0]);
  ctx.like(positionsOperand, ctx.want[0].tokenPositions(2)); // tokens whole: batch only
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    ctx.out.push_back(ctx.want[0]);
}
} // namespace

LogicalResult CachedAttentionOp::verify() {
  RankedTensorType q = getQuery().getType(), kv = getKey().getType(),
                   cache = getKeyCache().getType();
  if (q.getRank() != 4)
    return emitOpError() << "query must have shape [batch, heads, tokens, head_dim], got "
                         << shapeStr(q.getShape());
  if (kv.getRank() != 4 || kv.getDimSize(0) != q.getDimSize(0) ||
      kv.getDimSize(2) != q.getDimSize(2) || kv.getDimSize(3) != q.getDimSize(3))
    return emitOpError() << "key and value must have shape [batch, kv_heads, tokens, head_dim] "
                            "with the query's batch, tokens and head_dim ("
                         << shapeStr(q.getShape()) << "), got " << shapeStr(kv.getShape());
  if (kv.getElementType() != q.getElementType() || cache.getElementType() != q.getElementType())
    return emitOpError() << "query, key/value and caches must have one element type";
  int64_t heads = q.getDimSize(1), kvHeads = kv.getDimSize(1);
  if (kvHeads < 1 || heads % kvHeads != 0)
    return emitOpError() << "the " << kvHeads << " key/value heads must divide the " << heads
                         << " query heads (grouped-query attention)";
  if (cache.getRank() != 4 || cache.getDimSize(0) != kv.getDimSize(0) ||
      cache.getDimSize(1) != kvHeads || cache.getDimSize(3) != kv.getDimSize(3) ||
      cache.getDimSize(2) < kv.getDimSize(2))
    return emitOpError() << "caches must have shape [batch, kv_heads, context, head_dim] with the "
                            "key's batch, kv_heads and head_dim and a context of at least its "
                         << kv.getDimSize(2) << " tokens, got " << shapeStr(cache.getShape());
  if (std::optional<llvm::APFloat> scale = getScale(); scale && !(scale->convertToDouble() > 0.0))
    return emitOpError() << "scale must be positive, got " << scale->convertToDouble();
  return verifyTokenPositions(*this, q, getPositions().getType());
}

double CachedAttentionOp::getScaleOrDefault() {
  if (std::optional<llvm::APFloat> scale = getScale())
    return scale->convertToDouble();
  return 1.0 / std::sqrt(static_cast<double>(getQuery().getType().getDimSize(3)));
}

LogicalResult CachedAttentionOp::inferShardingRule(ShardingRuleContext &ctx) {
  DimShard heads = ctx.want[0].dims[1];
  int64_t kvHeads = ctx.globalType(getKey()).getDimSize(1);
  if (heads.axis >= 0 && kvHeads % (ctx.axisSize(heads.axis) * heads.blocks) != 0)
    return emitError() << "mesh axis '" << ctx.mesh().axes[heads.axis] << "' (size "
                       << ctx.axisSize(heads.axis) << ") cannot split the " << kvHeads
                       << " key/value heads of the cache";
  batchAndHeadsRule(*this, ctx, 5, 5);
  return success();
}

PlanInstruction CachedAttentionOp::getPlanInstruction(MeshAxisIndexFn) {
  return PlanInstruction(OpKind::CachedAttention)
      .set(::ptc::kernels::attr::ScaledAttention::scale, getScaleOrDefault());
}

LogicalResult RotaryAtOp::verify() {
  if (failed(verifyRotaryInput(*this, getType(), getTheta().convertToDouble())))
    return failure();
  return verifyTokenPositions(*this, getType(), getPositions().getType(), getSeqMajor() ? 1 : 2);
}

/// Each row turns by its own position: batch, heads and the sequence split
/// freely (the positions with the rows), the head dim stays whole. Linear, so
/// a partial sum passes through.
LogicalResult RotaryAtOp::inferShardingRule(ShardingRuleContext &ctx) {
  ctx.want[0].dims[3] = -1;
  ctx.like(1, ctx.want[0].tokenPositions(getSeqMajor() ? 1 : 2));
  ctx.out.push_back(ctx.want[0]);
  return success();
}

// inverse and seq_major are optional (within format 15).
PlanInstruction RotaryAtOp::getPlanInstruction(MeshAxisIndexFn) {
  namespace attr = ::ptc::kernels::attr;
  return PlanInstruction(OpKind::RotaryAt)
      .set(attr::RotaryAt::inverse, getInverse())
      .set(attr::RotaryAt::seq_major, getSeqMajor())
      .set(attr::RotaryAt::theta, getTheta().convertToDouble());
}

FailureOr<int> RotaryAtOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  if (in[0] != 0 || in[1] != 0)
    return emitMicrobatchError(*this, "its rows and their positions must split along the "
                                      "batch (dimension 0)");
  return in[0];
}

LogicalResult RotaryAtOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = RotaryAtOp::create(b, getLoc(), getType(), rg[0], getPositions(), getThetaAttr(),
                               b.getBoolAttr(!getInverse()), getSeqMajorAttr());
  return success();
}
