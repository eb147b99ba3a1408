//===- ModelStatistics.cpp - parameter and FLOP counts of a model ---------===//

#include "passes/analysis/ModelStatistics.h"

#include "dialects/ptc/PtcOps.h"

using namespace mlir;
using namespace mlir::ptc;

namespace {
double matmulFlops(MatmulOp op) {
  RankedTensorType result = op.getType();
  RankedTensorType lhs = op.getLhs().getType();
  int64_t k = lhs.getDimSize(lhs.getRank() - (op.getTransposeLhs() ? 2 : 1));
  return 2.0 * static_cast<double>(getNumElements(result)) * static_cast<double>(k);
}

double attentionFlops(CausalAttentionOp op) {
  // 4 B H S^2 D: every query element against every key position.
  RankedTensorType q = op.getQuery().getType();
  return 4.0 * static_cast<double>(q.getNumElements()) * q.getDimSize(op.getSeqDim());
}
} // namespace

ModelStatistics mlir::ptc::computeModelStatistics(func::FuncOp func) {
  ModelStatistics stats;
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
    auto type = dyn_cast<RankedTensorType>(func.getArgumentTypes()[i]);
    if (!type)
      continue;
    if (auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kParamAttrName)) {
      stats.params.push_back({name.str(), type});
      int64_t n = getNumElements(type);
      stats.numParams += n;
      stats.paramBytes += n * static_cast<int64_t>(type.getElementTypeBitWidth() / 8);
    } else if (auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kInputAttrName)) {
      stats.inputs.push_back({name.str(), type});
    }
  }
  func.walk([&](Operation *op) {
    if (op == func.getOperation())
      return;
    ++stats.numOps;
    ++stats.opCounts[op->getName().getStringRef()];
    if (auto dispatch = dyn_cast<MoeDispatchOp>(op)) {
      RankedTensorType idx = dispatch.getIndices().getType(), buf = dispatch.getType();
      int64_t r = idx.getRank();
      MoeLayerInfo layer{op->getLoc(),
                         buf.getDimSize(0),
                         idx.getDimSize(r - 1),
                         r == 3 ? idx.getDimSize(0) : 1,
                         idx.getDimSize(r - 2),
                         buf.getDimSize(buf.getRank() - 2),
                         0};
      // The expert parameters: stacked arguments read between this dispatch
      // and its combine (through their matmuls), counted once.
      llvm::SmallPtrSet<Operation *, 16> seen;
      llvm::SmallDenseSet<unsigned, 8> counted;
      SmallVector<Operation *> work{op};
      while (!work.empty()) {
        Operation *o = work.pop_back_val();
        for (Value v : o->getOperands()) {
          // Through the reshapes and conversions of a parameter (a bias
          // broadcast over slots, a bf16 copy).
          while (v.getDefiningOp() && isa<ReshapeOp, ConvertOp>(v.getDefiningOp()))
            v = v.getDefiningOp()->getOperand(0);
          if (auto arg = dyn_cast<BlockArgument>(v))
            if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kExpertsAttrName) &&
                counted.insert(arg.getArgNumber()).second)
              layer.expertParams += getNumElements(cast<RankedTensorType>(arg.getType()));
        }
        if (isa<MoeCombineOp>(o))
          continue;
        for (Operation *user : o->getUsers())
          if (seen.insert(user).second)
            work.push_back(user);
      }
      stats.moeLayers.push_back(layer);
    }
    if (auto mm = dyn_cast<MatmulOp>(op))
      stats.forwardFlops += matmulFlops(mm);
    else if (auto attn = dyn_cast<CausalAttentionOp>(op))
      stats.forwardFlops += attentionFlops(attn);
  });
  return stats;
}
