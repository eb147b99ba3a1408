//===- RecordModelFlops.cpp - a model's training FLOPs per step -----------===//

#include "passes/analysis/ModelStatistics.h"
#include "passes/analysis/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_RECORDMODELFLOPSPASS
#include "passes/analysis/Passes.h.inc"
} // namespace mlir::ptc

namespace mlir::ptc {
namespace {
struct RecordModelFlopsPass : impl::RecordModelFlopsPassBase<RecordModelFlopsPass> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp func) {
      ModelStatistics stats = computeModelStatistics(func);
      if (stats.params.empty())
        return;
      func->setAttr(PtcDialect::kModelFlopsAttrName,
                    FloatAttr::get(Float64Type::get(func.getContext()), 3.0 * stats.forwardFlops));
    });
  }
};
} // namespace
} // namespace mlir::ptc
