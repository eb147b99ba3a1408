//===- ModelStatistics.h - parameter and FLOP counts of a model -*- C++ -*-===//
//
// Shared by the summary pass and ptc-model's own report, so both count the
// same way.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_PASSES_ANALYSIS_MODELSTATISTICS_H
#define PTC_PASSES_ANALYSIS_MODELSTATISTICS_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"

#include <cstdint>
#include <string>

namespace mlir::ptc {

struct TensorInfo {
  std::string name;
  RankedTensorType type;
};

/// One mixture-of-experts layer (a `ptc.moe_dispatch`).
struct MoeLayerInfo {
  Location loc;
  int64_t experts, topK, groups, tokensPerGroup, capacity;
  int64_t expertParams; ///< elements of the `ptc.experts` parameters its experts read
};

struct ModelStatistics {
  SmallVector<TensorInfo> params;
  SmallVector<TensorInfo> inputs;
  int64_t numParams = 0;
  int64_t paramBytes = 0;
  int64_t numOps = 0;
  /// Op name -> count, in order of first appearance.
  llvm::MapVector<StringRef, int64_t> opCounts;
  /// Forward FLOPs of one step (matmul 2MNK; attention dense 4*B*H*S*S*D).
  double forwardFlops = 0;
  SmallVector<MoeLayerInfo> moeLayers;
};

/// Counts parameters (args with `ptc.param`), inputs and FLOPs of `func`.
ModelStatistics computeModelStatistics(func::FuncOp func);

} // namespace mlir::ptc

#endif // PTC_PASSES_ANALYSIS_MODELSTATISTICS_H
