//===- FoldAttentionLayout.cpp - attention on the projections' layout -----===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FOLDATTENTIONLAYOUTPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// [batch, seq, heads, head_dim] <-> [batch, heads, seq, head_dim] (its own inverse).
bool swapsHeadsAndSeq(TransposeOp t) {
  return t && t.getPermutation() == ArrayRef<int64_t>{0, 2, 1, 3};
}

/// A seq-major head tensor [batch, seq, heads, dim] that is a column block of
/// a fused projection [batch, seq, width]: the projection and the block's
/// first column, for `v` = reshape(slice(projection)) with the slice whole
/// but for the last dimension.
struct ColumnBlock {
  Value projection;
  int64_t offset;
};
std::optional<ColumnBlock> columnBlockOf(Value v) {
  auto reshape = v.getDefiningOp<ReshapeOp>();
  auto slice = reshape ? reshape.getInput().getDefiningOp<SliceOp>() : SliceOp();
  if (!slice)
    return std::nullopt;
  auto whole = cast<RankedTensorType>(slice.getInput().getType());
  auto block = cast<RankedTensorType>(slice.getType());
  auto heads = cast<RankedTensorType>(reshape.getType());
  ArrayRef<int64_t> offsets = slice.getOffsets();
  if (whole.getRank() != 3 || block.getRank() != 3 || heads.getRank() != 4 || offsets[0] != 0 ||
      offsets[1] != 0 || block.getDimSize(0) != whole.getDimSize(0) ||
      block.getDimSize(1) != whole.getDimSize(1) || heads.getDimSize(0) != block.getDimSize(0) ||
      heads.getDimSize(1) != block.getDimSize(1) ||
      heads.getDimSize(2) * heads.getDimSize(3) != block.getDimSize(2))
    return std::nullopt;
  return ColumnBlock{slice.getInput(), offsets[2]};
}

/// The fused projection whose column blocks are exactly `q`, `k` and `v`, in
/// that order and filling it (a fused QKV projection split into heads), or
/// null.
Value fusedProjectionOf(Value q, Value k, Value v) {
  std::optional<ColumnBlock> bq = columnBlockOf(q), bk = columnBlockOf(k), bv = columnBlockOf(v);
  if (!bq || !bk || !bv || bq->projection != bk->projection ||
      bq->projection != bv->projection)
    return {};
  auto width = [](Value x) {
    auto t = cast<RankedTensorType>(x.getType());
    return t.getDimSize(2) * t.getDimSize(3);
  };
  int64_t total = cast<RankedTensorType>(bq->projection.getType()).getDimSize(2);
  if (bq->offset != 0 || bk->offset != width(q) || bv->offset != width(q) + width(k) ||
      total != width(q) + width(k) + width(v))
    return {};
  return bq->projection;
}

/// The head transpose of `input` (of `like`'s discardable attributes).
TransposeOp swapHeadsAndSeq(OpBuilder &b, Location loc, Value input, Operation *like) {
  auto type = cast<RankedTensorType>(input.getType());
  ArrayRef<int64_t> s = type.getShape();
  auto t = TransposeOp::create(
      b, loc, RankedTensorType::get({s[0], s[2], s[1], s[3]}, type.getElementType()), input,
      b.getDenseI64ArrayAttr({0, 2, 1, 3}));
  t->setDiscardableAttrs(like->getDiscardableAttrDictionary());
  return t;
}

/// Whether `op` is a rotation (ptc.rotary, ptc.rotary_at) on the heads-major
/// layout.
bool isHeadsMajorRotation(Operation *op) {
  if (auto r = dyn_cast<RotaryOp>(op))
    return !r.getSeqMajor();
  if (auto r = dyn_cast<RotaryAtOp>(op))
    return !r.getSeqMajor();
  return false;
}

/// Rotation `r`'s rotation of `input` seq-major, with `r`'s attributes (and
/// positions).
Operation *seqMajorRotationLike(OpBuilder &b, Operation *r, Value input) {
  Operation *rotated;
  if (auto rot = dyn_cast<RotaryOp>(r))
    rotated = RotaryOp::create(b, rot.getLoc(), input.getType(), input, rot.getThetaAttr(),
                               rot.getInverseAttr(), rot.getSeqAxisAttr(), b.getBoolAttr(true));
  else {
    auto at = cast<RotaryAtOp>(r);
    rotated = RotaryAtOp::create(b, at.getLoc(), input.getType(), input, at.getPositions(),
                                 at.getThetaAttr(), at.getInverseAttr(), b.getBoolAttr(true));
  }
  rotated->setDiscardableAttrs(r->getDiscardableAttrDictionary());
  return rotated;
}

/// Whether every use of `v` is an operand of attention or its gradient (the
/// ops the fold rewrites; not ring attention, nor Ulysses' all-to-all).
bool onlyAttentionReads(Value v) {
  return !v.use_empty() && llvm::all_of(v.getUsers(), [](Operation *user) {
    return isa<CausalAttentionOp, CausalAttentionGradOp>(user);
  });
}

/// A rotation commutes with the head transpose (it rotates each head row by
/// its sequence index, or its position, in either layout): rotation(swap(y))
/// becomes swap(rotation(y) seq-major), and swap(rotation(g)) becomes
/// rotation(swap(g)) seq-major, where the inner op has no other use and
/// attention is on the other side: attention's rotated query and key (Llama;
/// packed documents' positions too) are then head transposes the fold
/// removes, and so are its gradients' before their inverse rotations.
void commuteRotations(func::FuncOp f) {
  SmallVector<Operation *> rotations;
  f.walk([&](Operation *op) {
    if (isHeadsMajorRotation(op))
      rotations.push_back(op);
  });
  for (Operation *r : rotations) {
    auto before = r->getOperand(0).getDefiningOp<TransposeOp>();
    if (swapsHeadsAndSeq(before) && before->hasOneUse() && onlyAttentionReads(r->getResult(0))) {
      OpBuilder b(r);
      Operation *rotated = seqMajorRotationLike(b, r, before.getInput());
      r->getResult(0).replaceAllUsesWith(
          swapHeadsAndSeq(b, r->getLoc(), rotated->getResult(0), before).getResult());
      r->erase();
      before.erase();
      continue;
    }
    if (!r->hasOneUse() || !r->getOperand(0).getDefiningOp<CausalAttentionGradOp>())
      continue;
    auto after = dyn_cast<TransposeOp>(*r->getUsers().begin());
    if (!swapsHeadsAndSeq(after))
      continue;
    OpBuilder b(after);
    TransposeOp swapped = swapHeadsAndSeq(b, after.getLoc(), r->getOperand(0), after);
    after.getResult().replaceAllUsesWith(seqMajorRotationLike(b, r, swapped.getResult())->getResult(0));
    after.erase();
    r->erase();
  }
}

struct FoldAttentionLayoutPass
    : mlir::ptc::impl::FoldAttentionLayoutPassBase<FoldAttentionLayoutPass> {
  void runOnOperation() override {
    commuteRotations(getOperation());
    SmallVector<Operation *> attention;
    getOperation().walk([&](Operation *op) {
      if (isa<CausalAttentionOp, CausalAttentionGradOp>(op))
        attention.push_back(op);
    });
    SmallVector<TransposeOp> inputs;
    for (Operation *op : attention)
      fold(op, inputs);
    // The heads' transposes nothing reads any more (once per transpose).
    for (TransposeOp t : inputs)
      if (t->use_empty())
        t.erase();
    // Then seq-major attention whose operands are the column blocks of one
    // fused projection reads them there.
    SmallVector<Operation *> seqMajor;
    getOperation().walk([&](Operation *op) {
      auto fwd = dyn_cast<CausalAttentionOp>(op);
      auto grad = dyn_cast<CausalAttentionGradOp>(op);
      if ((fwd && fwd.getSeqMajor()) || (grad && grad.getSeqMajor()))
        seqMajor.push_back(op);
    });
    SmallVector<Operation *> blocks;
    for (Operation *op : seqMajor)
      foldProjection(op, blocks);
    // The reshapes and slices that split the projections, once unread.
    for (Operation *op : blocks)
      if (op->use_empty()) {
        Operation *slice = op->getOperand(0).getDefiningOp();
        op->erase();
        if (slice && slice->use_empty())
          slice->erase();
      }
  }

  /// Seq-major attention (or its gradient) whose query, key and value are the
  /// column blocks of one fused projection becomes ptc.causal_attention_qkv
  /// (ptc.causal_attention_qkv_grad when the three gradients only feed their
  /// concatenation in the projection's layout, which it replaces). The
  /// blocks' reshapes go to `blocks` (erased with their slices once unread).
  void foldProjection(Operation *op, SmallVectorImpl<Operation *> &blocks) {
    Value q = op->getOperand(0), k = op->getOperand(1), v = op->getOperand(2);
    Value projection = fusedProjectionOf(q, k, v);
    if (!projection)
      return;
    OpBuilder b(op);
    Operation *folded;
    if (auto fwd = dyn_cast<CausalAttentionOp>(op)) {
      folded = CausalAttentionQkvOp::create(b, op->getLoc(), fwd.getResult().getType(),
                                            /*stats=*/Type(), projection, fwd.getPositions(),
                                            b.getF64FloatAttr(fwd.getScaleOrDefault()));
      fwd.getResult().replaceAllUsesWith(folded->getResult(0));
    } else {
      auto grad = cast<CausalAttentionGradOp>(op);
      // dq, dk, dv: each reshaped back to [batch, seq, heads * dim], the three
      // concatenated along the last dimension in order, nothing else.
      ConcatOp concat;
      for (auto [i, r] : llvm::enumerate(grad->getResults())) {
        if (!r.hasOneUse())
          return;
        auto reshape = dyn_cast<ReshapeOp>(*r.getUsers().begin());
        if (!reshape || !reshape->hasOneUse())
          return;
        auto user = dyn_cast<ConcatOp>(*reshape->getUsers().begin());
        if (!user || (concat && user != concat) || user.getInputs().size() != 3 ||
            user.getInputs()[i] != reshape.getResult())
          return;
        concat = user;
      }
      if (!concat || concat.getType() != projection.getType() || concat.getAxis() != 2)
        return;
      folded = CausalAttentionQkvGradOp::create(b, op->getLoc(), projection.getType(), projection,
                                                grad.getGrad(), /*saved_result=*/Value(),
                                                /*saved_stats=*/Value(), grad.getPositions(),
                                                b.getF64FloatAttr(grad.getScaleOrDefault()));
      concat.getResult().replaceAllUsesWith(folded->getResult(0));
      SmallVector<Operation *> reshapes;
      for (Value in : concat.getInputs())
        reshapes.push_back(in.getDefiningOp());
      concat.erase();
      for (Operation *r : reshapes)
        r->erase();
    }
    // Discardable attributes (ptc.backward, a pipeline stage) carry over.
    folded->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    op->erase();
    for (Value x : {q, k, v})
      if (Operation *reshape = x.getDefiningOp(); !llvm::is_contained(blocks, reshape))
        blocks.push_back(reshape);
  }

  /// Rewrites one heads-major attention op whose operands are all head
  /// transposes and whose results only feed head transposes; the operands'
  /// transposes go to `inputs` (erased once nothing reads them).
  void fold(Operation *op, SmallVectorImpl<TransposeOp> &inputs) {
    auto fwd = dyn_cast<CausalAttentionOp>(op);
    auto grad = dyn_cast<CausalAttentionGradOp>(op);
    if ((fwd && fwd.getSeqMajor()) || (grad && grad.getSeqMajor()))
      return;
    SmallVector<Value> operands;
    SmallVector<TransposeOp> splits;
    // The float operands (q, k, v[, incoming gradient]); the document
    // positions [batch, seq] read the same in either layout.
    Value positions = fwd ? fwd.getPositions() : grad.getPositions();
    for (Value v : op->getOperands().take_front(fwd ? 3 : 4)) {
      auto t = v.getDefiningOp<TransposeOp>();
      if (!swapsHeadsAndSeq(t))
        return;
      operands.push_back(t.getInput());
      splits.push_back(t);
    }
    SmallVector<Type> types;
    for (Value r : op->getResults()) {
      for (Operation *user : r.getUsers())
        if (!swapsHeadsAndSeq(dyn_cast<TransposeOp>(user)))
          return;
      auto type = cast<RankedTensorType>(r.getType());
      ArrayRef<int64_t> s = type.getShape();
      types.push_back(RankedTensorType::get({s[0], s[2], s[1], s[3]}, type.getElementType()));
    }
    OpBuilder b(op);
    Operation *folded;
    if (fwd)
      folded = CausalAttentionOp::create(b, op->getLoc(), types[0], /*stats=*/Type(), operands[0],
                                         operands[1],
                                         operands[2], positions, fwd.getScaleAttr(), true);
    else
      folded = CausalAttentionGradOp::create(b, op->getLoc(), types, operands[0], operands[1],
                                             operands[2], operands[3], /*saved_result=*/Value(),
                                             /*saved_stats=*/Value(), positions,
                                             grad.getScaleAttr(), true);
    // Discardable attributes (ptc.backward, a pipeline stage) carry over.
    folded->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    for (auto [old, now] : llvm::zip(op->getResults(), folded->getResults()))
      for (Operation *user : llvm::make_early_inc_range(old.getUsers())) {
        user->getResult(0).replaceAllUsesWith(now);
        user->erase();
      }
    op->erase();
    for (TransposeOp t : splits)
      if (!llvm::is_contained(inputs, t))
        inputs.push_back(t);
  }
};
} // namespace
