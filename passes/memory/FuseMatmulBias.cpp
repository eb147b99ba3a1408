//===- FuseMatmulBias.cpp - bias adds and gradients as matmul epilogues ---===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_FUSEMATMULBIASPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// The bias `add` adds to its matmul operand, or null: the other operand is
/// a vector of the result's last dimension (broadcast over every row), of
/// the same element type, and the add's result has the matmul's type.
Value biasOf(AddOp add, MatmulOp mm) {
  Value other = add.getLhs() == mm.getResult() ? add.getRhs() : add.getLhs();
  auto type = cast<RankedTensorType>(other.getType());
  RankedTensorType result = mm.getType();
  if (other == mm.getResult() || add.getType() != result || type.getRank() != 1 ||
      type.getDimSize(0) != result.getShape().back() ||
      type.getElementType() != result.getElementType())
    return {};
  return other;
}

/// Whether `sum` adds its input over every dimension but the last (a bias
/// gradient's column sums) into a vector of the input's element type.
bool sumsLeadingDims(ReduceSumOp sum) {
  RankedTensorType in = sum.getInput().getType(), out = sum.getType();
  const int64_t rank = in.getRank();
  if (rank < 2 || out.getRank() != 1 || out.getDimSize(0) != in.getShape().back() ||
      out.getElementType() != in.getElementType() ||
      static_cast<int64_t>(sum.getAxes().size()) != rank - 1)
    return false;
  llvm::SmallDenseSet<int64_t> axes;
  for (int64_t a : sum.getAxes())
    axes.insert(a < 0 ? a + rank : a);
  for (int64_t d = 0; d + 1 < rank; ++d)
    if (!axes.contains(d))
      return false;
  return true;
}

/// The weight-gradient product that reads `grad` as its transposed rank-2
/// lhs, as it is or through a reshape that keeps the last dimension, or null.
MatmulOp weightGradientOf(Value grad) {
  auto readsAsLhs = [](Value v) -> MatmulOp {
    for (Operation *user : v.getUsers())
      if (auto mm = dyn_cast<MatmulOp>(user))
        if (mm.getLhs() == v && mm.getTransposeLhs() && !mm.getBias() &&
            mm.getLhs().getType().getRank() == 2 && mm.getRhs().getType().getRank() == 2)
          return mm;
    return {};
  };
  if (MatmulOp mm = readsAsLhs(grad))
    return mm;
  auto shape = cast<RankedTensorType>(grad.getType()).getShape();
  for (Operation *user : grad.getUsers())
    if (auto reshape = dyn_cast<ReshapeOp>(user))
      if (reshape.getType().getRank() == 2 && reshape.getType().getShape().back() == shape.back())
        if (MatmulOp mm = readsAsLhs(reshape.getResult()))
          return mm;
  return {};
}

/// `op`'s discardable attributes but the per-result sharding records, which
/// differ between ops of one place (a bias gradient is partial where its
/// weight gradient is not).
NamedAttrList placement(Operation *op) {
  NamedAttrList attrs(op->getDiscardableAttrDictionary());
  attrs.erase(PtcDialect::kShardingsAttrName);
  attrs.erase(PtcDialect::kShardingOriginsAttrName);
  return attrs;
}

/// The per-result record `name` of `ops`' results, in order, where each op
/// has one.
void concatRecords(Operation *fused, ArrayRef<Operation *> ops, StringRef name) {
  SmallVector<Attribute> all;
  for (Operation *op : ops) {
    auto records = op->getAttrOfType<ArrayAttr>(name);
    if (!records)
      return;
    all.append(records.begin(), records.end());
  }
  fused->setAttr(name, ArrayAttr::get(fused->getContext(), all));
}

/// Whether `mm`'s operands can be there at `sum` (before it): each defined
/// before it, or by a reshape of a value that is (those reshapes in `hoist`).
bool operandsHoistable(MatmulOp mm, ReduceSumOp sum, SmallVectorImpl<Operation *> &hoist) {
  Block *block = sum->getBlock();
  for (Value v : {mm.getLhs(), mm.getRhs()}) {
    Operation *def = v.getDefiningOp();
    if (!def || def->getBlock() != block || def->isBeforeInBlock(sum))
      continue;
    auto reshape = dyn_cast<ReshapeOp>(def);
    Operation *source = reshape ? reshape.getInput().getDefiningOp() : nullptr;
    if (!reshape || (source && source->getBlock() == block && !source->isBeforeInBlock(sum)))
      return false;
    hoist.push_back(def);
  }
  return true;
}

/// Whether the uses of `sum` before `mm` can move behind it: conversions or
/// reshapes (never a collective: the communication keeps its place) in the
/// block, every use of theirs after `mm` (in `sink`, in order).
bool usesSinkable(ReduceSumOp sum, MatmulOp mm, SmallVectorImpl<Operation *> &sink) {
  Block *block = sum->getBlock();
  for (Operation *user : sum->getUsers()) {
    if (user->getBlock() != block || !user->isBeforeInBlock(mm))
      continue;
    if (!isa<ConvertOp, ReshapeOp>(user))
      return false;
    for (Operation *later : user->getUsers()) {
      Operation *at = block->findAncestorOpInBlock(*later);
      if (!at || !mm->isBeforeInBlock(at))
        return false;
    }
    sink.push_back(user);
  }
  llvm::sort(sink, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return true;
}

struct FuseMatmulBiasPass : mlir::ptc::impl::FuseMatmulBiasPassBase<FuseMatmulBiasPass> {
  void runOnOperation() override {
    SmallVector<AddOp> adds;
    getOperation().walk([&](AddOp add) { adds.push_back(add); });
    for (AddOp add : adds)
      for (Value operand : add->getOperands()) {
        auto mm = operand.getDefiningOp<MatmulOp>();
        if (mm && fuse(add, mm))
          break;
      }
    SmallVector<ReduceSumOp> sums;
    getOperation().walk([&](ReduceSumOp sum) { sums.push_back(sum); });
    for (ReduceSumOp sum : sums)
      fuseBiasGradient(sum);
  }

  /// Folds the bias gradient `sum` into the weight-gradient product of the
  /// same gradient (ptc.matmul_bias_grad). It goes where the product was
  /// when every use of the sum comes after it; else where the sum was (its
  /// uses, a gradient collective say, keep their place), the product's
  /// operand reshapes moved up with it; else where the product was, the
  /// sum's conversions before it (whose uses all come later) moved down
  /// behind it. Both ops must be of one place (the same
  /// discardable attributes but the sharding records).
  bool fuseBiasGradient(ReduceSumOp sum) {
    if (!sumsLeadingDims(sum))
      return false;
    MatmulOp mm = weightGradientOf(sum.getInput());
    if (!mm || mm->getBlock() != sum->getBlock() || placement(mm) != placement(sum) ||
        mm.getLhs().getType().getElementType() != sum.getType().getElementType())
      return false;
    Block *block = mm->getBlock();
    bool usesAfter = true;
    for (Operation *user : sum->getUsers()) {
      Operation *at = block->findAncestorOpInBlock(*user);
      if (!at)
        return false;
      usesAfter &= at != mm.getOperation() && mm->isBeforeInBlock(at);
    }
    Operation *where = mm.getOperation();
    if (!usesAfter) {
      if (!sum->isBeforeInBlock(mm))
        return false;
      if (SmallVector<Operation *> hoist; operandsHoistable(mm, sum, hoist)) {
        for (Operation *def : hoist)
          def->moveBefore(sum);
        where = sum.getOperation();
      } else if (SmallVector<Operation *> sink; usesSinkable(sum, mm, sink)) {
        for (Operation *user : llvm::reverse(sink))
          user->moveAfter(mm);
      } else {
        return false;
      }
    }
    OpBuilder b(where);
    auto fused = MatmulBiasGradOp::create(b, mm.getLoc(), mm.getType(), sum.getType(), mm.getLhs(),
                                          mm.getRhs(), mm.getTransposeLhs(), mm.getTransposeRhs());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    concatRecords(fused, {mm.getOperation(), sum.getOperation()}, PtcDialect::kShardingsAttrName);
    concatRecords(fused, {mm.getOperation(), sum.getOperation()},
                  PtcDialect::kShardingOriginsAttrName);
    mm.getResult().replaceAllUsesWith(fused.getResult());
    sum.getResult().replaceAllUsesWith(fused.getBiasGrad());
    mm.erase();
    sum.erase();
    return true;
  }

  /// Folds `add` into `mm` when the matmul feeds nothing else, has no bias
  /// yet and the two ops carry the same discardable attributes (the same
  /// pipeline stage and segment, both forward or both backward).
  bool fuse(AddOp add, MatmulOp mm) {
    if (mm.getBias() || !mm->hasOneUse() ||
        mm->getDiscardableAttrDictionary() != add->getDiscardableAttrDictionary())
      return false;
    Value bias = biasOf(add, mm);
    if (!bias)
      return false;
    // Where the matmul was, unless the bias is defined after it (converted
    // between the two, say): then at the add, where every operand is.
    Operation *def = bias.getDefiningOp();
    bool biasLater = def && def->getBlock() == mm->getBlock() && mm->isBeforeInBlock(def);
    OpBuilder b(biasLater ? add.getOperation() : mm.getOperation());
    auto fused = MatmulOp::create(b, mm.getLoc(), mm.getType(), mm.getLhs(), mm.getRhs(), bias,
                                  mm.getTransposeLhs(), mm.getTransposeRhs());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    add.getResult().replaceAllUsesWith(fused.getResult());
    add.erase();
    mm.erase();
    return true;
  }
};
} // namespace
