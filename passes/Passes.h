//===- Passes.h - registration of all ptc passes and pipelines --*- C++ -*-===//

#ifndef PTC_PASSES_PASSES_H
#define PTC_PASSES_PASSES_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::ptc {

/// Options of the `ptc-compile` pipeline (model IR -> plan file).
struct CompilePipelineOptions : public PassPipelineOptions<CompilePipelineOptions> {
  // The options that are a pass's (the optimizer's settings, micro-batches,
  // ZeRO, the schedule, ...): declared in the passes' Passes.td, listed in
  // passes/PipelineOptions.td.
#define GEN_PIPELINE_OPTION_DECLS_Compile
#include "passes/PipelineOptions.h.inc"

  // The pipeline's own options.
  PassOptions::Option<std::string> plan{
      *this, "plan",
      llvm::cl::desc("Plan file to write (none: stop at the compiled IR; ptc-opt also takes "
                     "-o FILE.plan)")};
  PassOptions::Option<std::string> mesh{
      *this, "mesh", llvm::cl::desc("Device mesh, e.g. dp:2,tp:2 (default: one device)")};
  PassOptions::Option<std::string> cpAttention{
      *this, "cp-attention",
      llvm::cl::desc("Attention under context parallelism (a cp mesh axis): ring (key/value "
                     "blocks passed around the cp ring, causally balanced) or ulysses (all-to-all "
                     "from the sequence to the heads and back)"),
      llvm::cl::init("ring")};
  PassOptions::Option<bool> reportMemory{
      *this, "report-memory", llvm::cl::desc("Print the per-device memory report"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> deviceMemory{
      *this, "device-memory",
      llvm::cl::desc("Fail when the predicted peak exceeds this (e.g. 80GB)")};
  PassOptions::Option<bool> explain{
      *this, "explain", llvm::cl::desc("Print every inserted collective, its cause and cost"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> recompute{
      *this, "recompute",
      llvm::cl::desc("Activation recomputation: none, selective (cheap ops and attention) or "
                     "full (keep only the residual stream)"),
      llvm::cl::init("none")};
  PassOptions::Option<std::string> offload{
      *this, "offload",
      llvm::cl::desc("none, or optimizer: fp32 master weights, optimizer state and the update "
                     "in host memory (ZeRO-Offload; needs the plan's device to be discrete)"),
      llvm::cl::init("none")};
  PassOptions::Option<std::string> precision{
      *this, "precision",
      llvm::cl::desc("Compute precision: fp32, bf16 or f16 (fp32 master weights and optimizer)"),
      llvm::cl::init("fp32")};
  PassOptions::Option<bool> scheduleReport{
      *this, "schedule-report",
      llvm::cl::desc("Print the pipeline schedule report (bubble, in-flight, p2p bytes)"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> scheduleSvg{
      *this, "schedule-svg", llvm::cl::desc("Write the pipeline diagram (SVG) to this file")};
  PassOptions::Option<bool> saveAttentionStats{
      *this, "save-attention-stats",
      llvm::cl::desc("Attention's backward reads the forward's softmax statistics "
                     "(ptc-save-attention-stats; false: it recomputes them)"),
      llvm::cl::init(true)};
  PassOptions::Option<bool> keepWorkingCopies{
      *this, "keep-working-copies",
      llvm::cl::desc("Mixed precision: keep each parameter's bf16 / f16 working copy between "
                     "steps, written by its update (ptc-keep-working-copies; false: convert "
                     "the f32 master weights every step)"),
      llvm::cl::init(true)};
  /// Not a command-line option: the layout planner compiles one micro-batch
  /// to price a layout that accumulates gradients over several, whose plan
  /// widens every micro-batch's gradients (ptc-fuse-gradient-widening applies
  /// without accumulation only), and turns the pass off for that probe.
  bool fuseGradientWidening = true;
};

/// [microbatch] -> autodiff -> optimizer -> cse -> [shard -> cse] -> [split-stages ->
/// schedule-pipeline] -> plan-memory -> export-plan.
void buildCompilePipeline(OpPassManager &pm, const CompilePipelineOptions &options);

/// Options of the `ptc-compile-decode` pipeline (model IR -> forward-only
/// prefill / decode plan with a key/value cache; ptc-generate runs it).
struct DecodePipelineOptions : public PassPipelineOptions<DecodePipelineOptions> {
  PassOptions::Option<std::string> plan{
      *this, "plan",
      llvm::cl::desc("Plan file to write (none: stop at the compiled IR; ptc-opt also takes "
                     "-o FILE.plan)")};
  // ptc-derive-decode's options (passes/PipelineOptions.td).
#define GEN_PIPELINE_OPTION_DECLS_Decode
#include "passes/PipelineOptions.h.inc"
  PassOptions::Option<std::string> mesh{
      *this, "mesh", llvm::cl::desc("Device mesh, e.g. tp:2 (default: one device)")};
  PassOptions::Option<bool> reportMemory{
      *this, "report-memory", llvm::cl::desc("Print the per-device memory report"),
      llvm::cl::init(false)};
};

/// derive-decode -> cse -> [shard -> cse] -> plan-memory -> export-plan.
void buildDecodePipeline(OpPassManager &pm, const DecodePipelineOptions &options);

/// Registers every ptc pass and named pipeline with the global registry, so
/// that ptc-opt accepts them as flags and inside --pass-pipeline.
void registerAllPasses();

} // namespace mlir::ptc

#endif // PTC_PASSES_PASSES_H
