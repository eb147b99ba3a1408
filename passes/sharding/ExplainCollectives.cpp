//===- ExplainCollectives.cpp - the collectives report ---------------------===//
//
// ptc-explain-collectives: every collective ptc-shard inserted (after
// bucketing), why it is there (its `ptc.cause`), its bytes per device and its
// time under an alpha-beta model of the links; then the causes are dropped.
//
//===----------------------------------------------------------------------===//

#include "passes/sharding/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "passes/memory/Passes.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_EXPLAINCOLLECTIVESPASS
#include "passes/sharding/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
void printReport(func::FuncOp func, const MeshInfo &meshInfo, double alphaUs, double betaGbps) {
  llvm::raw_ostream &os = llvm::outs();
  double alpha = alphaUs * 1e-6, beta = betaGbps * 1e9;
  double total = 0;
  int count = 0;
  os << "ptc-explain-collectives @" << func.getSymName() << " on mesh";
  for (auto [a, s] : llvm::zip(meshInfo.axes, meshInfo.sizes))
    os << " " << a << "=" << s;
  os << "\n";
  func.walk([&](Operation *op) {
    // Ring attention passes key/value blocks to the next rank itself.
    if (isa<RingAttentionOp, RingAttentionGradOp>(op)) {
      int64_t p = 1;
      for (Attribute a : op->getAttrOfType<ArrayAttr>("axes"))
        p *= meshInfo.sizes[meshInfo.axisIndex(cast<StringAttr>(a).getValue())];
      auto [bytes, messages] = isa<RingAttentionOp>(op) ? cast<RingAttentionOp>(op).ringTransfers(p)
                                                        : cast<RingAttentionGradOp>(op).ringTransfers(p);
      double seconds = messages * alpha + bytes / beta;
      total += seconds;
      ++count;
      os << "  " << op->getName().getStringRef() << " over " << op->getAttr("axes") << " at "
         << op->getLoc() << ": " << llvm::format("%.0f", bytes) << " bytes per device sent in "
         << llvm::format("%.0f", messages) << " messages, est. " << llvm::format("%.1f", seconds * 1e6)
         << " us (before overlap with the blocks' compute)\n    "
         << (isa<RingAttentionOp>(op) ? "ring attention: the key/value blocks travel around the ring"
                                      : "ring attention gradient: the key/value blocks travel around the "
                                        "ring twice, the second time with their gradients, which a "
                                        "last move brings home")
         << "; the sequence is balanced in halves on the way in and back on the way out";
      if (auto grad = dyn_cast<RingAttentionGradOp>(op); grad && !grad.getSavedStats()) {
        // ptc-save-attention-stats, later in the pipeline, may leave the first ring out.
        auto [savedBytes, savedMessages] = grad.ringTransfers(p, /*saved=*/true);
        os << " (with its forward's softmax statistics, save-attention-stats=true, the first "
              "ring is left out and the forward's result and statistics come in: "
           << llvm::format("%.0f", savedBytes) << " bytes in "
           << llvm::format("%.0f", savedMessages) << " messages)";
      }
      os << "\n";
      return;
    }
    auto cause = op->getAttrOfType<StringAttr>(PtcDialect::kCollectiveCauseAttrName);
    if (!cause)
      return;
    struct {
      Operation *op;
      std::string cause;
    } c{op, cause.str()};
    int64_t p = 1;
    for (Attribute a : c.op->getAttrOfType<ArrayAttr>("axes"))
      p *= meshInfo.sizes[meshInfo.axisIndex(cast<StringAttr>(a).getValue())];
    int64_t bytes = 0;
    double seconds = 0;
    if (isa<AllReduceOp>(c.op)) {
      for (Value v : c.op->getOperands())
        bytes += getTensorBytes(cast<RankedTensorType>(v.getType()));
      // Ring all-reduce: reduce-scatter + all-gather.
      seconds = 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * bytes / beta;
    } else if (isa<AllToAllOp>(c.op)) {
      bytes = getTensorBytes(cast<RankedTensorType>(c.op->getOperand(0).getType()));
      seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
    } else if (isa<ReduceScatterOp>(c.op)) {
      bytes = getTensorBytes(cast<RankedTensorType>(c.op->getOperand(0).getType()));
      seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
    } else {
      bytes = getTensorBytes(cast<RankedTensorType>(c.op->getResult(0).getType()));
      seconds = (p - 1) * alpha + static_cast<double>(p - 1) / p * bytes / beta;
    }
    total += seconds;
    ++count;
    os << "  " << c.op->getName().getStringRef() << " over " << c.op->getAttr("axes") << " at "
       << c.op->getLoc() << ": " << bytes << " bytes per device, est. "
       << llvm::format("%.1f", seconds * 1e6) << " us\n    " << c.cause << "\n";
  });
  os << "  " << count << " collectives, est. " << llvm::format("%.1f", total * 1e6)
     << " us per step (alpha " << llvm::format("%g", alphaUs) << " us, beta "
     << llvm::format("%g", betaGbps) << " GB/s)\n";
  os.flush();
}

struct ExplainCollectivesPass
    : mlir::ptc::impl::ExplainCollectivesPassBase<ExplainCollectivesPass> {
  using ExplainCollectivesPassBase::ExplainCollectivesPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<MeshInfo> mesh = getEnclosingMesh(module);
    if (failed(mesh)) {
      // Not partitioned (no mesh): no collectives to explain.
      if (report)
        llvm::outs() << "ptc-explain-collectives: the module has no mesh, so no collectives\n";
      return;
    }
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && report)
        printReport(func, *mesh, alphaUs, betaGbps);
    module.walk([](Operation *op) { op->removeAttr(PtcDialect::kCollectiveCauseAttrName); });
  }
};
} // namespace
