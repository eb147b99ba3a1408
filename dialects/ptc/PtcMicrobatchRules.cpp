//===- PtcMicrobatchRules.cpp - how each op carries the batch dimension --===//
//
// MicrobatchOpInterface implementations: given the batch dimension of each
// operand (kNoBatch where an operand has none), the batch dimension of the
// results, kBatchMean / kBatchSum for a loss, or an error when the op cannot
// run on micro-batches. ptc-microbatch (passes/pipeline) is the driver; the
// activations' rule comes with their ODS class.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"

using namespace mlir;
using namespace mlir::ptc;

namespace {
int rankOf(Value v) { return static_cast<int>(cast<RankedTensorType>(v.getType()).getRank()); }

/// The batch dimensions among `ds` (those >= 0).
SmallVector<int> batchDims(ArrayRef<int> ds) {
  SmallVector<int> out;
  for (int d : ds)
    if (d >= 0)
      out.push_back(d);
  return out;
}

FailureOr<int> addBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  Operation *o = op;

  int r = rankOf(o->getResult(0)), out = kNoBatch;
  for (auto [v, d] : llvm::zip(o->getOperands(), in)) {
    if (d < 0)
      continue;
    int mapped = d + r - rankOf(v);
    if (out != kNoBatch && out != mapped)
      return emitMicrobatchError(op, "its operands' batch dimensions do not line up");
    out = mapped;
  }
  return out;
}

FailureOr<int> scaleBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
 return in[0];
}

FailureOr<int> softmaxBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<SoftmaxOp>(op);

  int64_t axis = o.getAxis() < 0 ? o.getAxis() + rankOf(o.getInput()) : o.getAxis();
  if (axis == in[0])
    return emitMicrobatchError(op, "its axis is the batch dimension");
  return in[0];
}

FailureOr<int> causalAttentionBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<CausalAttentionOp>(op);

  if (in[0] != in[1] || in[0] != in[2] || in[0] >= rankOf(o.getQuery()) - 2)
    return emitMicrobatchError(op, "q, k and v must share a leading batch dimension");
  // Seq-major operands have the sequence second: never split it.
  if (o.getSeqMajor() && in[0] == o.getSeqDim())
    return emitMicrobatchError(op, "a seq_major attention's dimension 1 is its sequence");
  // The document positions [batch, seq] split with the query's batch.
  if (o.getPositions() && (in[0] != 0 || in[3] != 0))
    return emitMicrobatchError(op, "its document positions must split along the batch "
                                   "(dimension 0) with the query");
  return in[0];
}

FailureOr<int> matmulBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<MatmulOp>(op);

  int rl = rankOf(o.getLhs()), rr = rankOf(o.getRhs()), r = rankOf(o.getResult());
  int lRow = o.getTransposeLhs() ? rl - 1 : rl - 2;
  int rCol = o.getTransposeRhs() ? rr - 2 : rr - 1;
  int out = kNoBatch;
  if (in[0] >= 0) {
    if (in[0] < rl - 2)
      out = in[0] + r - rl;
    else if (in[0] == lRow)
      out = r - 2;
    else
      return emitMicrobatchError(op, "it contracts over the batch dimension");
  }
  if (in[1] >= 0) {
    int mapped;
    if (in[1] < rr - 2)
      mapped = in[1] + r - rr;
    else if (in[1] == rCol)
      mapped = r - 1;
    else
      return emitMicrobatchError(op, "it contracts over the batch dimension");
    if (out != kNoBatch && out != mapped)
      return emitMicrobatchError(op, "both operands are per-example along different dimensions");
    out = mapped;
  }
  if (o.getBias() && in[2] >= 0)
    return emitMicrobatchError(op, "its bias depends on the batch");
  return out;
}

FailureOr<int> embeddingBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {

  if (in[0] >= 0)
    return emitMicrobatchError(op, "the table depends on the batch");
  return in[1];
}

FailureOr<int> crossEntropyBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<CrossEntropyOp>(op);

  if (in[0] == rankOf(o.getLogits()) - 1)
    return emitMicrobatchError(op, "the classes are the batch dimension");
  return kBatchMean;
}

FailureOr<int> transposeBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<TransposeOp>(op);

  for (auto [i, p] : llvm::enumerate(o.getPermutation()))
    if (p == in[0])
      return static_cast<int>(i);
  return emitMicrobatchError(op, "bad permutation");
}

FailureOr<int> reshapeBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<ReshapeOp>(op);

  ArrayRef<int64_t> src = o.getInput().getType().getShape();
  ArrayRef<int64_t> dst = o.getType().getShape();
  int64_t prefix = 1;
  for (int i = 0; i < in[0]; ++i)
    prefix *= src[i];
  int64_t p = 1;
  for (size_t e = 0; e < dst.size(); ++e) {
    if (p == prefix && dst[e] % count == 0)
      return static_cast<int>(e);
    p *= dst[e];
    if (p > prefix)
      break;
  }
  return emitMicrobatchError(op, "the batch dimension does not survive the reshape");
}

FailureOr<int> sliceBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<SliceOp>(op);

  if (o.getInput().getType().getDimSize(in[0]) * count != o.getType().getDimSize(in[0]))
    return emitMicrobatchError(op, "it slices the batch dimension");
  return in[0];
}

FailureOr<int> concatBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  auto o = cast<ConcatOp>(op);

  SmallVector<int> ds = batchDims(in);
  int64_t axis = o.getAxis() < 0 ? o.getAxis() + rankOf(o.getResult()) : o.getAxis();
  if (ds.size() != in.size() || llvm::any_of(ds, [&](int d) { return d != ds[0]; }) ||
      axis == ds[0])
    return emitMicrobatchError(op, "its operands must all be per-example along one dimension, not the axis");
  return ds[0];
}

FailureOr<int> reduceSumBatchDim(Operation *op, ArrayRef<int> in, int64_t count) {
  Operation *o = op;

  auto axes = o->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  bool keep = o->hasAttr("keep_dims") &&
              cast<BoolAttr>(o->getAttr("keep_dims")).getValue();
  int r = rankOf(o->getOperand(0)), shift = 0;
  for (int64_t a : axes) {
    int64_t n = a < 0 ? a + r : a;
    if (n == in[0]) {
      if (isa<ReduceMaxOp>(o))
        return emitMicrobatchError(op, "a maximum over the batch is not a sum of micro-batch maxima");
      return isa<ReduceSumOp>(o) ? kBatchSum : kBatchMean;
    }
    if (n < in[0] && !keep)
      ++shift;
  }
  return in[0] - shift;
}
} // namespace

FailureOr<int> AddOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return addBatchDim(getOperation(), in, count);
}

FailureOr<int> SubOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return addBatchDim(getOperation(), in, count);
}

FailureOr<int> MulOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return addBatchDim(getOperation(), in, count);
}

FailureOr<int> SwigluOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return addBatchDim(getOperation(), in, count);
}

FailureOr<int> DivOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return addBatchDim(getOperation(), in, count);
}

FailureOr<int> ScaleOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return scaleBatchDim(getOperation(), in, count);
}

// Its masks place batch rows by the data order of micro-batches, along the
// first dimension (kernels/common/dropout.h).
FailureOr<int> DropoutOp::inferBatchDim(ArrayRef<int> in, int64_t) {
  if (in[0] != 0)
    return emitMicrobatchError(getOperation(), in[0] < 0
                                                   ? "its input has no batch dimension"
                                                   : "its input's batch dimension is not its first");
  return 0;
}

FailureOr<int> ConvertOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return scaleBatchDim(getOperation(), in, count);
}

/// A row normalization keeps its input's batch dimension, unless it
/// normalizes over it (the last one) or a parameter is batched.
FailureOr<int> mlir::ptc::rowNormBatchDim(Operation *op, ArrayRef<int> in) {
  const int64_t rank = cast<RankedTensorType>(op->getOperand(0).getType()).getRank();
  if (in[0] == rank - 1 || llvm::any_of(in.drop_front(), [](int d) { return d >= 0; }))
    return emitMicrobatchError(op, "it normalizes over the batch dimension");
  return in[0];
}

FailureOr<int> RotaryOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  if (in[0] >= 2)
    return emitMicrobatchError(*this, "positions run along the batch dimension");
  return in[0];
}

FailureOr<int> SoftmaxOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return softmaxBatchDim(getOperation(), in, count);
}

FailureOr<int> CausalAttentionOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return causalAttentionBatchDim(getOperation(), in, count);
}

FailureOr<int> MatmulOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return matmulBatchDim(getOperation(), in, count);
}

FailureOr<int> EmbeddingOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return embeddingBatchDim(getOperation(), in, count);
}

FailureOr<int> CrossEntropyOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return crossEntropyBatchDim(getOperation(), in, count);
}

FailureOr<int> TransposeOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return transposeBatchDim(getOperation(), in, count);
}

FailureOr<int> ReshapeOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return reshapeBatchDim(getOperation(), in, count);
}

FailureOr<int> SliceOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return sliceBatchDim(getOperation(), in, count);
}

FailureOr<int> ConcatOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return concatBatchDim(getOperation(), in, count);
}

FailureOr<int> ReduceSumOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return reduceSumBatchDim(getOperation(), in, count);
}

FailureOr<int> ReduceMeanOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return reduceSumBatchDim(getOperation(), in, count);
}

FailureOr<int> ReduceMaxOp::inferBatchDim(ArrayRef<int> in, int64_t count) {
  return reduceSumBatchDim(getOperation(), in, count);
}

// Mixture of experts: routing groups are the batch; a micro-batch holds whole
// groups, so it routes exactly as the whole batch does.
FailureOr<int> TopKGateOp::inferBatchDim(ArrayRef<int> in, int64_t) {
  if (in[0] == rankOf(getLogits()) - 1 || (in.size() > 1 && in[1] >= 0))
    return emitMicrobatchError(*this, "its experts (the logits' last dimension, the bias) carry "
                                      "the batch dimension");
  return in[0];
}

FailureOr<int> MoeDispatchOp::inferBatchDim(ArrayRef<int> in, int64_t) {
  if (rankOf(getIndices()) != 3 || in[0] != 0 || in[1] != 0)
    return emitMicrobatchError(*this, "its routing groups ([groups, tokens, dim], dimension 0) "
                                      "must be the batch dimension");
  return 1; // [experts, groups, capacity, dim]
}

FailureOr<int> MoeCombineOp::inferBatchDim(ArrayRef<int> in, int64_t) {
  if (rankOf(getIndices()) != 3 || in[0] != 1 || in[1] != 0 || in[2] != 0)
    return emitMicrobatchError(*this, "its routing groups (dimension 1 of the expert outputs, 0 "
                                      "of weights and indices) must be the batch dimension");
  return 0;
}

FailureOr<int> ExpertLoadOp::inferBatchDim(ArrayRef<int> in, int64_t) {
  if (rankOf(getIndices()) != 3 || in[0] != 0)
    return emitMicrobatchError(*this, "its routing groups (dimension 0 of [groups, tokens, k]) "
                                      "must be the batch dimension");
  return 0;
}
