//===- PtcVjp.cpp - reverse-mode rules (VJPs), one per differentiable op --===//
//
// Each rule builds the operand gradients of one op from its result gradients,
// using ptc ops only. `ptc-autodiff` drives them; gradient checks against
// finite differences (test/passes/autodiff/gradcheck) cover every rule.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::ptc;

namespace {
RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

/// Sums `grad` (of a broadcast result) back to `target`'s shape: over leading
/// dimensions the operand lacked and over its size-1 dimensions.
Value unbroadcast(OpBuilder &b, Location loc, Value grad, RankedTensorType target) {
  RankedTensorType gradType = tensorType(grad);
  if (gradType == target)
    return grad;
  int64_t lead = gradType.getRank() - target.getRank();
  SmallVector<int64_t> axes;
  SmallVector<int64_t> keptShape;
  for (int64_t i = 0; i < gradType.getRank(); ++i) {
    bool reduce = i < lead || (target.getDimSize(i - lead) == 1 && gradType.getDimSize(i) != 1);
    if (reduce)
      axes.push_back(i);
    keptShape.push_back(reduce ? 1 : gradType.getDimSize(i));
  }
  // Reducing only the missing leading dimensions yields the target directly.
  bool leadingOnly = llvm::all_of(axes, [&](int64_t a) { return a < lead; });
  Value summed = grad;
  if (!axes.empty())
    summed = ReduceSumOp::create(
        b, loc,
        leadingOnly ? target : RankedTensorType::get(keptShape, target.getElementType()), grad,
        b.getDenseI64ArrayAttr(axes), b.getBoolAttr(!leadingOnly));
  if (tensorType(summed) != target)
    summed = ReshapeOp::create(b, loc, target, summed);
  return summed;
}

/// Swaps the last two dimensions.
Value transposeLast2(OpBuilder &b, Location loc, Value v) {
  int64_t rank = tensorType(v).getRank();
  SmallVector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    perm.push_back(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return TransposeOp::create(b, loc, v, perm);
}

/// Flattens all but the last dimension: [..., n] -> [prod(...), n].
Value flattenTo2D(OpBuilder &b, Location loc, Value v) {
  RankedTensorType t = tensorType(v);
  if (t.getRank() == 2)
    return v;
  int64_t rows = getNumElements(t) / t.getShape().back();
  return ReshapeOp::create(b, loc, RankedTensorType::get({rows, t.getShape().back()},
                                                         t.getElementType()), v);
}

/// The gradient of the keep-dims shape of a reduction, broadcast back to the input.
Value broadcastReduced(OpBuilder &b, Location loc, Value grad, RankedTensorType input,
                       ArrayRef<int64_t> axes) {
  SmallVector<int64_t> kept(input.getShape());
  for (int64_t a : axes)
    kept[a < 0 ? a + input.getRank() : a] = 1;
  auto keptType = RankedTensorType::get(kept, input.getElementType());
  Value g = grad;
  if (tensorType(g) != keptType)
    g = ReshapeOp::create(b, loc, keptType, g);
  return BroadcastOp::create(b, loc, input, g);
}
} // namespace

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

LogicalResult AddOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                              SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = unbroadcast(b, getLoc(), rg[0], getLhs().getType());
  if (needed[1])
    og[1] = unbroadcast(b, getLoc(), rg[0], getRhs().getType());
  return success();
}

LogicalResult SubOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                              SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = unbroadcast(b, getLoc(), rg[0], getLhs().getType());
  if (needed[1])
    og[1] = unbroadcast(b, getLoc(), ScaleOp::create(b, getLoc(), rg[0], b.getF64FloatAttr(-1.0)),
                        getRhs().getType());
  return success();
}

LogicalResult MulOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                              SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = unbroadcast(b, getLoc(), MulOp::create(b, getLoc(), rg[0], getRhs()),
                        getLhs().getType());
  if (needed[1])
    og[1] = unbroadcast(b, getLoc(), MulOp::create(b, getLoc(), rg[0], getLhs()),
                        getRhs().getType());
  return success();
}

// Both gradients from one swiglu_grad (the gate's activation recomputed there).
LogicalResult SwigluOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                 SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (!needed[0] && !needed[1])
    return success();
  auto grad = SwigluGradOp::create(b, getLoc(), getGate(), getUp(), rg[0]);
  if (needed[0])
    og[0] = grad.getGateGrad();
  if (needed[1])
    og[1] = grad.getUpGrad();
  return success();
}

LogicalResult DivOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                              SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  Location loc = getLoc();
  if (needed[0])
    og[0] = unbroadcast(b, loc, DivOp::create(b, loc, rg[0], getRhs()), getLhs().getType());
  if (needed[1]) {
    // d(l/r)/dr = -(l/r)/r
    Value t = DivOp::create(b, loc, MulOp::create(b, loc, rg[0], getResult()), getRhs());
    og[1] = unbroadcast(b, loc, ScaleOp::create(b, loc, t, b.getF64FloatAttr(-1.0)),
                        getRhs().getType());
  }
  return success();
}

LogicalResult ScaleOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = ScaleOp::create(b, getLoc(), rg[0], getFactorAttr());
  return success();
}

// Dropout is linear with its mask as the factor: the gradient is the same
// dropout (same stream, so the same mask) of the result's gradient.
LogicalResult DropoutOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                  SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = DropoutOp::create(b, getLoc(), rg[0], getPAttr(), getStreamAttr(), ShardingAttr());
  return success();
}

LogicalResult ConvertOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                  SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = ConvertOp::create(b, getLoc(), getInput().getType(), rg[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

// With C = op(A) op(B) (+ bias): dop(A) = g op(B)^T and dop(B) = op(A)^T g. A
// shared (rank-2) B gets the sum over the batch, done as one GEMM on flattened
// rows; the bias the sum of g over every row.
LogicalResult MatmulOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                 SmallVectorImpl<Value> &og) {
  og.assign(getNumOperands(), Value());
  Location loc = getLoc();
  Value g = rg[0], lhs = getLhs(), rhs = getRhs();
  if (getBias() && needed[2])
    og[2] = unbroadcast(b, loc, g, getBias().getType());
  bool tl = getTransposeLhs(), tr = getTransposeRhs();
  if (needed[0]) {
    Value dOpA = MatmulOp::create(b, loc, g, rhs, false, !tr);
    og[0] = tl ? transposeLast2(b, loc, dOpA) : dOpA;
  }
  if (needed[1]) {
    bool sharedRhs = getRhs().getType().getRank() == 2 && getLhs().getType().getRank() > 2;
    if (sharedRhs && !tl) {
      Value a2 = flattenTo2D(b, loc, lhs), g2 = flattenTo2D(b, loc, g);
      og[1] = tr ? MatmulOp::create(b, loc, g2, a2, true, false).getResult()  // g^T A
                 : MatmulOp::create(b, loc, a2, g2, true, false).getResult(); // A^T g
    } else if (!sharedRhs && tr) {
      // dB = (op(A)^T g)^T = g^T op(A)
      og[1] = MatmulOp::create(b, loc, g, lhs, true, tl);
    } else {
      Value dOpB = MatmulOp::create(b, loc, lhs, g, !tl, false);
      Value dB = tr ? transposeLast2(b, loc, dOpB) : dOpB;
      if (sharedRhs) {
        int64_t batchDims = tensorType(dB).getRank() - 2;
        SmallVector<int64_t> axes;
        for (int64_t i = 0; i < batchDims; ++i)
          axes.push_back(i);
        dB = ReduceSumOp::create(b, loc, getRhs().getType(), dB, b.getDenseI64ArrayAttr(axes),
                                 b.getBoolAttr(false));
      }
      og[1] = dB;
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Fused blocks
//===----------------------------------------------------------------------===//

// A rotation is orthogonal: its gradient is the inverse rotation.
LogicalResult RotaryOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                 SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = RotaryOp::create(b, getLoc(), getType(), rg[0], getThetaAttr(),
                             b.getBoolAttr(!getInverse()), getSeqAxisAttr(), getSeqMajorAttr());
  return success();
}

LogicalResult SoftmaxOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                  SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = SoftmaxGradOp::create(b, getLoc(), getResult(), rg[0], getAxisAttr());
  return success();
}

LogicalResult CausalAttentionOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                          SmallVectorImpl<Value> &og) {
  Type t = getQuery().getType(), kv = getKey().getType();
  auto grad = CausalAttentionGradOp::create(b, getLoc(), t, kv, kv, getQuery(), getKey(),
                                            getValue(), rg[0], /*saved_result=*/Value(),
                                            /*saved_stats=*/Value(), getPositions(), getScaleAttr(),
                                            getSeqMajor());
  og.assign({needed[0] ? grad.getQueryGrad() : Value(), needed[1] ? grad.getKeyGrad() : Value(),
             needed[2] ? grad.getValueGrad() : Value()});
  return success();
}

LogicalResult EmbeddingOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                    SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = EmbeddingGradOp::create(b, getLoc(), getTable().getType(), getIndices(), rg[0],
                                    getVocabAxisAttr());
  return success();
}

LogicalResult CrossEntropyOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                       SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = CrossEntropyGradOp::create(b, getLoc(), getLogits().getType(), getLogits(),
                                       getTargets(), rg[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                  SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = ReshapeOp::create(b, getLoc(), getInput().getType(), rg[0]);
  return success();
}

LogicalResult TransposeOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                    SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (!needed[0])
    return success();
  ArrayRef<int64_t> perm = getPermutation();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = i;
  og[0] = TransposeOp::create(b, getLoc(), rg[0], inverse);
  return success();
}

LogicalResult SliceOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = PadOp::create(b, getLoc(), getInput().getType(), rg[0], getOffsetsAttr());
  return success();
}

LogicalResult PadOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                              SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = SliceOp::create(b, getLoc(), getInput().getType(), rg[0], getOffsetsAttr());
  return success();
}

LogicalResult BroadcastOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                    SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = unbroadcast(b, getLoc(), rg[0], getInput().getType());
  return success();
}

LogicalResult ConcatOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                 SmallVectorImpl<Value> &og) {
  og.assign(getInputs().size(), Value());
  int64_t rank = getType().getRank();
  int64_t axis = getAxis() < 0 ? getAxis() + rank : getAxis();
  int64_t offset = 0;
  for (auto [i, input] : llvm::enumerate(getInputs())) {
    auto type = cast<RankedTensorType>(input.getType());
    if (needed[i]) {
      SmallVector<int64_t> offsets(rank, 0);
      offsets[axis] = offset;
      og[i] = SliceOp::create(b, getLoc(), type, rg[0], b.getDenseI64ArrayAttr(offsets));
    }
    offset += type.getDimSize(axis);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

LogicalResult ReduceSumOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                    SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = broadcastReduced(b, getLoc(), rg[0], getInput().getType(), getAxes());
  return success();
}

LogicalResult ReduceMeanOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (!needed[0])
    return success();
  RankedTensorType input = getInput().getType();
  int64_t count = 1;
  for (int64_t a : getAxes())
    count *= input.getDimSize(a < 0 ? a + input.getRank() : a);
  Value g = broadcastReduced(b, getLoc(), rg[0], input, getAxes());
  og[0] = ScaleOp::create(b, getLoc(), g, b.getF64FloatAttr(1.0 / static_cast<double>(count)));
  return success();
}

LogicalResult ReduceMaxOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                    SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  if (needed[0])
    og[0] = ReduceMaxGradOp::create(b, getLoc(), getInput().getType(), getInput(), rg[0],
                                    getAxesAttr(), getKeepDimsAttr());
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

LogicalResult TopKGateOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                   SmallVectorImpl<Value> &og) {
  og.assign(1, Value());
  // Only the weights carry a gradient; the expert choice is discrete.
  if (needed[0] && rg[0])
    og[0] = TopKGateGradOp::create(b, getLoc(), getLogits().getType(), getLogits(), getIndices(),
                                   rg[0], getNormalizeAttr());
  return success();
}

LogicalResult MoeDispatchOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                      SmallVectorImpl<Value> &og) {
  og.assign(2, Value());
  if (needed[0])
    og[0] = MoeDispatchGradOp::create(b, getLoc(), getInput().getType(), rg[0], getIndices());
  return success();
}

LogicalResult MoeCombineOp::buildVjp(OpBuilder &b, ArrayRef<Value> rg, ArrayRef<bool> needed,
                                     SmallVectorImpl<Value> &og) {
  auto grad = MoeCombineGradOp::create(b, getLoc(), getExpertOutput().getType(),
                                       getWeights().getType(), getExpertOutput(), getWeights(),
                                       getIndices(), rg[0]);
  og.assign({needed[0] ? grad.getExpertOutputGrad() : Value(),
             needed[1] ? grad.getWeightsGrad() : Value(), Value()});
  return success();
}
