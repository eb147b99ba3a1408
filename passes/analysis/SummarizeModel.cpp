//===- SummarizeModel.cpp - print a short summary of each model function --===//

#include "passes/analysis/ModelStatistics.h"
#include "passes/analysis/Passes.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_SUMMARIZEMODELPASS
#include "passes/analysis/Passes.h.inc"
} // namespace mlir::ptc

namespace mlir::ptc {
namespace {
void printShape(llvm::raw_ostream &os, RankedTensorType type) {
  for (int64_t d : type.getShape())
    os << d << "x";
  os << type.getElementType();
}

struct SummarizeModelPass : impl::SummarizeModelPassBase<SummarizeModelPass> {
  using SummarizeModelPassBase::SummarizeModelPassBase;

  void runOnOperation() override {
    llvm::raw_ostream &os = llvm::outs();
    getOperation().walk([&](func::FuncOp func) {
      ModelStatistics stats = computeModelStatistics(func);
      if (stats.params.empty())
        return;
      os << "ptc model @" << func.getSymName() << "\n";
      os << "  parameters: " << stats.numParams << " ("
         << llvm::format("%.2f", stats.numParams / 1e6) << " M) in " << stats.params.size()
         << " tensors, " << stats.paramBytes << " bytes\n";
      if (verbose) {
        for (const TensorInfo &p : stats.params) {
          os << "    " << p.name << ": ";
          printShape(os, p.type);
          os << "\n";
        }
      }
      os << "  inputs:";
      for (const TensorInfo &in : stats.inputs) {
        os << " " << in.name << " ";
        printShape(os, in.type);
      }
      os << "\n  ops: " << stats.numOps << " (";
      llvm::interleaveComma(stats.opCounts, os,
                            [&](const auto &entry) { os << entry.first << " " << entry.second; });
      os << ")\n";
      os << "  forward FLOPs per step: " << llvm::format("%.4g", stats.forwardFlops)
         << " (training step about 3x: " << llvm::format("%.4g", 3 * stats.forwardFlops)
         << ")\n";
      for (const MoeLayerInfo &m : stats.moeLayers) {
        os << "  MoE layer at " << m.loc << ": " << m.experts << " experts, top-" << m.topK
           << ", " << m.groups << " routing group" << (m.groups == 1 ? "" : "s") << " of "
           << m.tokensPerGroup << " tokens, capacity " << m.capacity
           << " per expert per group ("
           << llvm::format("%.2f", static_cast<double>(m.capacity * m.experts) /
                                       static_cast<double>(m.tokensPerGroup * m.topK))
           << " x tokens * k / experts" << (m.capacity >= m.tokensPerGroup ? ", dropless" : "")
           << "), " << m.expertParams << " expert parameters ("
           << m.expertParams * m.topK / m.experts << " active per token)\n";
      }
      os.flush();
    });
    markAllAnalysesPreserved();
  }
};
} // namespace
} // namespace mlir::ptc
