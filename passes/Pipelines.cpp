//===- Pipelines.cpp - ptc's named pass pipelines -------------------------===//

#include "passes/Passes.h"

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"

#include "passes/analysis/Passes.h"
#include "passes/autodiff/Passes.h"
#include "passes/export/Passes.h"
#include "passes/inference/Passes.h"
#include "passes/memory/Passes.h"
#include "passes/pipeline/Passes.h"
#include "passes/sharding/Passes.h"

#include "runtime/base/mesh_text.h"
#include "runtime/base/option_values.h"
#include "runtime/schedule/schedule.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

#include <cmath>

using namespace mlir;

namespace mlir::ptc {
#define GEN_PIPELINE_OPTION_FORWARDING
#include "passes/PipelineOptions.h.inc"
} // namespace mlir::ptc

namespace {
/// The mesh option's text parsed (empty when it is absent or malformed: a
/// malformed mesh is diagnosed by ptc-shard, which parses the same text).
::ptc::MeshText meshText(StringRef mesh) {
  ::ptc::StatusOr<::ptc::MeshText> text =
      ::ptc::parseMeshText(std::string_view(mesh.data(), mesh.size()));
  return text.isOk() ? *text : ::ptc::MeshText();
}
/// The size of the axis of `role` (1 without one).
int64_t axisSize(const ::ptc::MeshText &mesh, mlir::ptc::MeshAxisRole role) {
  StringRef name = mlir::ptc::meshAxisName(role);
  return mesh.size(std::string_view(name.data(), name.size()));
}
/// Refuses, before anything runs, the ptc-compile options whose value no
/// pass accepts, whether or not the layout would use them (a pipeline
/// schedule without pipeline stages, a ZeRO stage without a mesh): a bad
/// value is an error at the module, never a warning that depends on the
/// rest of the options.
struct CheckCompileOptionsPass
    : public PassWrapper<CheckCompileOptionsPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(CheckCompileOptionsPass)
  explicit CheckCompileOptionsPass(const mlir::ptc::CompilePipelineOptions &options)
      : zero(options.zero), reshardAfterForward(options.reshardAfterForward),
        schedule(options.schedule), gradReduceDtype(options.gradReduceDtype),
        cpAttention(options.cpAttention) {}
  StringRef getArgument() const override { return "ptc-check-compile-options"; }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool ok = succeeded(mlir::ptc::checkZeroOptions(module, zero, reshardAfterForward));
    // At the training function, as ptc-schedule-pipeline says it when the
    // layout is pipelined.
    if (::ptc::Status known = ::ptc::schedule::checkScheduleName(schedule); !known.isOk()) {
      Operation *at = module;
      for (auto func : module.getOps<func::FuncOp>())
        if (!func.isExternal()) {
          at = func;
          break;
        }
      ok = false;
      at->emitError() << "schedule '" << schedule << "': " << known.message();
    }
    if (failed(mlir::ptc::checkGradReduceDtype(module, gradReduceDtype)))
      ok = false;
    if (!::ptc::parseOption<::ptc::CpAttention>(cpAttention)) {
      ok = false;
      module.emitError() << ::ptc::badOptionMessage<::ptc::CpAttention>(cpAttention);
    } else {
      module->setAttr(mlir::ptc::kCpAttentionAttrName,
                      StringAttr::get(module.getContext(), cpAttention));
    }
    if (!ok)
      signalPassFailure();
  }

  int64_t zero;
  bool reshardAfterForward;
  std::string schedule, gradReduceDtype, cpAttention;
};
} // namespace

void mlir::ptc::buildCompilePipeline(OpPassManager &pm, const CompilePipelineOptions &options) {
  const ::ptc::MeshText mesh = meshText(options.mesh);
  const bool pipelined = options.microbatches != 1 || axisSize(mesh, MeshAxisRole::Pipeline) > 1 ||
                         options.virtualStages != 1;
  pm.addPass(std::make_unique<CheckCompileOptionsPass>(options));
  // Before anything changes the model: its FLOPs per step for MFU.
  pm.addPass(createRecordModelFlopsPass());
  if (::ptc::parseOption<::ptc::Precision>(options.precision) != ::ptc::Precision::Fp32) {
    MixedPrecisionPassOptions mp;
    mp.dtype = options.precision;
    pm.addNestedPass<func::FuncOp>(createMixedPrecisionPass(mp));
  }
  if (pipelined) {
    MicrobatchPassOptions mb;
    forwardCompileOptionsToMicrobatchPass(options, mb);
    mb.dataParallel = axisSize(mesh, MeshAxisRole::Data);
    pm.addNestedPass<func::FuncOp>(createMicrobatchPass(mb));
  }
  AutodiffPassOptions ad;
  forwardCompileOptionsToAutodiffPass(options, ad);
  pm.addNestedPass<func::FuncOp>(createAutodiffPass(ad));
  if (::ptc::parseOption<::ptc::OptimizerKind>(options.optimizer) != ::ptc::OptimizerKind::None) {
    OptimizerPassOptions opt;
    forwardCompileOptionsToOptimizerPass(options, opt);
    // Muon's orthogonalizations are dealt over dp, in stacks that mix
    // layers: not across pipeline stages, which each update their own.
    opt.muonRanks = axisSize(mesh, MeshAxisRole::Pipeline) == 1 &&
                            options.virtualStages == 1
                        ? axisSize(mesh, MeshAxisRole::Data)
                        : 0;
    pm.addNestedPass<func::FuncOp>(createOptimizerPass(opt));
  }
  // recompute-layers without a mode reaches ptc-recompute, which refuses it.
  if (::ptc::parseOption<::ptc::Recompute>(options.recompute) != ::ptc::Recompute::None ||
      options.recomputeLayers != -1) {
    RecomputePassOptions rc;
    rc.mode = options.recompute;
    forwardCompileOptionsToRecomputePass(options, rc);
    rc.chunks = axisSize(mesh, MeshAxisRole::Pipeline) *
                std::max(1, static_cast<int>(options.virtualStages));
    pm.addNestedPass<func::FuncOp>(createRecomputePass(rc));
  }
  pm.addPass(createCSEPass());
  // zero= and sequence-parallel= without a mesh reach ptc-shard too, which
  // refuses them (an option that cannot take effect is an error).
  // An invalid bucket-mb is refused (by the bucketing pass) even where no
  // mesh would use it.
  if (options.mesh.empty() && options.zero == 0 && !options.sequenceParallel &&
      !(options.bucketMb > 0 && std::isfinite(options.bucketMb))) {
    BucketCollectivesPassOptions bucket;
    forwardCompileOptionsToBucketCollectivesPass(options, bucket);
    pm.addPass(createBucketCollectivesPass(bucket));
  }
  if (!options.mesh.empty() || options.zero != 0 || options.sequenceParallel) {
    ShardPipelineOptions shard;
    shard.mesh = options.mesh;
    forwardCompileOptionsToPropagateShardingPass(options, shard);
    buildShardPipeline(pm, shard);
    BucketCollectivesPassOptions bucket;
    forwardCompileOptionsToBucketCollectivesPass(options, bucket);
    pm.addPass(createBucketCollectivesPass(bucket));
    ExplainCollectivesPassOptions explain;
    explain.report = options.explain;
    pm.addPass(createExplainCollectivesPass(explain));
    pm.addPass(createCSEPass());
  }
  if (pipelined) {
    SplitStagesPassOptions split;
    forwardCompileOptionsToSplitStagesPass(options, split);
    split.splitWeight = ::ptc::parseOption<::ptc::schedule::ScheduleKind>(options.schedule) ==
                        ::ptc::schedule::ScheduleKind::ZbH1;
    split.report = options.scheduleReport;
    pm.addPass(createSplitStagesPass(split));
    SchedulePipelinePassOptions sched;
    forwardCompileOptionsToSchedulePipelinePass(options, sched);
    sched.report = options.scheduleReport;
    sched.svg = options.scheduleSvg;
    pm.addPass(createSchedulePipelinePass(sched));
  }
  if (::ptc::parseOption<::ptc::Offload>(options.offload) != ::ptc::Offload::None) {
    OffloadOptimizerPassOptions offload;
    offload.what = options.offload;
    pm.addNestedPass<func::FuncOp>(createOffloadOptimizerPass(offload));
  }
  // Attention on the projections' layout (the head transposes folded away):
  // after sharding and stage splitting, which see heads-major attention only.
  pm.addNestedPass<func::FuncOp>(createFoldAttentionLayoutPass());
  // The attention gradients read the forward's softmax statistics (after the
  // fold, which forms the fused-projection ops that pair).
  if (options.saveAttentionStats)
    pm.addNestedPass<func::FuncOp>(createSaveAttentionStatsPass());
  // Bias adds as matmul epilogues and SwiGLU in one op (after sharding: the
  // rules see plain matmuls and elementwise ops).
  pm.addNestedPass<func::FuncOp>(createFuseMatmulBiasPass());
  pm.addNestedPass<func::FuncOp>(createFuseSwigluPass());
  // The loss over bf16 / f16 logits without their f32 copy (after sharding:
  // the vocabulary-parallel loss keeps f32 logits).
  pm.addNestedPass<func::FuncOp>(createFuseLossWideningPass());
  // The loss and its gradient in one pass over the logits (after the loss
  // reads the narrow logits, so both read the same tensor).
  pm.addNestedPass<func::FuncOp>(createFuseCrossEntropyGradPass());
  // Mixed precision's updates read the bf16 gradients (after offload, which
  // keeps host updates f32).
  if (options.fuseGradientWidening)
    pm.addNestedPass<func::FuncOp>(createFuseGradientWideningPass());
  if (options.keepWorkingCopies)
    pm.addNestedPass<func::FuncOp>(createKeepWorkingCopiesPass());
  pm.addNestedPass<func::FuncOp>(createPlanMemoryPass());
  if (options.reportMemory || !options.deviceMemory.empty()) {
    ReportMemoryPassOptions report;
    report.deviceMemory = options.deviceMemory;
    pm.addPass(createReportMemoryPass(report));
  }
  // Without a plan file the pipeline stops at the compiled IR (and reports).
  if (options.plan.empty())
    return;
  ExportPlanPassOptions exportOptions;
  exportOptions.output = options.plan;
  exportOptions.reportStash = options.reportMemory || !options.deviceMemory.empty();
  exportOptions.deviceMemory = options.deviceMemory;
  forwardCompileOptionsToExportPlanPass(options, exportOptions);
  pm.addPass(createExportPlanPass(exportOptions));
}

void mlir::ptc::buildDecodePipeline(OpPassManager &pm, const DecodePipelineOptions &options) {
  DeriveDecodePassOptions derive;
  forwardDecodeOptionsToDeriveDecodePass(options, derive);
  pm.addNestedPass<func::FuncOp>(createDeriveDecodePass(derive));
  pm.addPass(createCSEPass());
  if (!options.mesh.empty()) {
    ShardPipelineOptions shard;
    shard.mesh = options.mesh;
    buildShardPipeline(pm, shard);
    pm.addPass(createCSEPass());
  }
  pm.addNestedPass<func::FuncOp>(createFuseMatmulBiasPass());
  pm.addNestedPass<func::FuncOp>(createFuseSwigluPass());
  pm.addNestedPass<func::FuncOp>(createPlanMemoryPass());
  if (options.reportMemory) {
    ReportMemoryPassOptions report;
    pm.addPass(createReportMemoryPass(report));
  }
  if (options.plan.empty())
    return;
  ExportPlanPassOptions exportOptions;
  exportOptions.output = options.plan;
  pm.addPass(createExportPlanPass(exportOptions));
}

namespace {
void registerPipelines() {
  PassPipelineRegistration<mlir::ptc::CompilePipelineOptions>(
      "ptc-compile",
      "Compile a ptc model to a plan: autodiff, optimizer, cse, memory planning, export",
      mlir::ptc::buildCompilePipeline);
  PassPipelineRegistration<mlir::ptc::DecodePipelineOptions>(
      "ptc-compile-decode",
      "Compile a ptc model to a forward-only prefill / decode plan with a key/value cache: "
      "derive-decode, cse, [shard], memory planning, export",
      mlir::ptc::buildDecodePipeline);
}
} // namespace

void mlir::ptc::registerAllPasses() {
  mlir::ptc::registerAnalysisPasses();
  registerAutodiffPasses();
  registerMemoryPasses();
  registerShardingPassesAndPipelines();
  registerPipelinePasses();
  registerExportPasses();
  registerInferencePasses();
  registerPipelines();
}
