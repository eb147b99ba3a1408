//===- Passes.h - registration of all ptc passes and pipelines --*- C++ -*-===//

#ifndef PTC_PASSES_PASSES_H
#define PTC_PASSES_PASSES_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::ptc {

/// Options of the `ptc-compile` pipeline (model IR -> plan file).
struct CompilePipelineOptions : public PassPipelineOptions<CompilePipelineOptions> {
  PassOptions::Option<std::string> plan{
      *this, "plan",
      llvm::cl::desc("Plan file to write (none: stop at the compiled IR; ptc-opt also takes "
                     "-o FILE.plan)")};
  PassOptions::Option<std::string> optimizer{
      *this, "optimizer",
      llvm::cl::desc("adamw, sgd, adafactor, muon or none (forward + backward only)"),
      llvm::cl::init("adamw")};
  PassOptions::Option<double> lr{*this, "lr", llvm::cl::desc("Learning rate"),
                                 llvm::cl::init(1e-3)};
  PassOptions::Option<double> beta1{*this, "beta1", llvm::cl::desc("AdamW beta1"),
                                    llvm::cl::init(0.9)};
  PassOptions::Option<double> beta2{*this, "beta2", llvm::cl::desc("AdamW beta2"),
                                    llvm::cl::init(0.999)};
  PassOptions::Option<double> eps{*this, "eps", llvm::cl::desc("AdamW epsilon"),
                                  llvm::cl::init(1e-8)};
  PassOptions::Option<double> weightDecay{
      *this, "weight-decay", llvm::cl::desc("Weight decay on rank >= 2 parameters"),
      llvm::cl::init(0.0)};
  PassOptions::Option<double> momentum{*this, "momentum", llvm::cl::desc("SGD momentum"),
                                       llvm::cl::init(0.9)};
  PassOptions::Option<double> adafactorBeta1{
      *this, "adafactor-beta1",
      llvm::cl::desc("Adafactor first-moment decay (0: none, as Hugging Face's beta1=None)"),
      llvm::cl::init(0.0)};
  PassOptions::Option<double> adafactorEps{
      *this, "adafactor-eps", llvm::cl::desc("Adafactor eps added to the squared gradient"),
      llvm::cl::init(1e-30)};
  PassOptions::Option<double> clipThreshold{
      *this, "clip-threshold", llvm::cl::desc("Adafactor update clipping threshold (RMS)"),
      llvm::cl::init(1.0)};
  PassOptions::Option<double> decayRate{
      *this, "decay-rate", llvm::cl::desc("Adafactor second-moment decay 1 - t^-decay-rate"),
      llvm::cl::init(0.8)};
  PassOptions::Option<double> muonMomentum{
      *this, "muon-momentum", llvm::cl::desc("Muon momentum"), llvm::cl::init(0.95)};
  PassOptions::Option<bool> muonNesterov{
      *this, "muon-nesterov", llvm::cl::desc("Muon: Nesterov momentum"), llvm::cl::init(true)};
  PassOptions::Option<int64_t> muonNsSteps{
      *this, "muon-ns-steps", llvm::cl::desc("Muon: Newton-Schulz iterations"),
      llvm::cl::init(5)};
  PassOptions::Option<std::string> muonNsDtype{
      *this, "muon-ns-dtype",
      llvm::cl::desc("Muon: element type of the Newton-Schulz iterations (f32 or bf16)"),
      llvm::cl::init("f32")};
  PassOptions::Option<double> muonScale{
      *this, "muon-scale",
      llvm::cl::desc("Muon: update scale muon-scale * sqrt(max(rows, cols)) (Moonlight's 0.2)"),
      llvm::cl::init(0.2)};
  PassOptions::Option<std::string> mesh{
      *this, "mesh", llvm::cl::desc("Device mesh, e.g. dp:2,tp:2 (default: one device)")};
  PassOptions::Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("With a tp axis: also split the sequence over tp (Megatron-SP)"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> cpAttention{
      *this, "cp-attention",
      llvm::cl::desc("Attention under context parallelism (a cp mesh axis): ring (key/value "
                     "blocks passed around the cp ring, causally balanced) or ulysses (all-to-all "
                     "from the sequence to the heads and back)"),
      llvm::cl::init("ring")};
  PassOptions::Option<int> zero{*this, "zero",
                                 llvm::cl::desc("ZeRO stage over dp (0-3)"), llvm::cl::init(0)};
  PassOptions::Option<bool> reshardAfterForward{
      *this, "reshard-after-forward",
      llvm::cl::desc("ZeRO-3: gather again in the backward pass (true, FSDP's default) or keep "
                     "the forward pass's gathered copy until its backward use (false, "
                     "FSDP's SHARD_GRAD_OP)"),
      llvm::cl::init(true)};
  PassOptions::Option<bool> reportMemory{
      *this, "report-memory", llvm::cl::desc("Print the per-device memory report"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> deviceMemory{
      *this, "device-memory",
      llvm::cl::desc("Fail when the predicted peak exceeds this (e.g. 80GB)")};
  PassOptions::Option<bool> explain{
      *this, "explain", llvm::cl::desc("Print every inserted collective, its cause and cost"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> skipNonfinite{
      *this, "skip-nonfinite",
      llvm::cl::desc("Skip the update of a step whose gradients are not all finite (NaN or "
                     "inf): parameters and optimizer state unchanged, the plan output "
                     "'skipped' says so (false: no check; AdamW and SGD)"),
      llvm::cl::init(true)};
  PassOptions::Option<double> maxGradNorm{
      *this, "max-grad-norm", llvm::cl::desc("Global gradient-norm clipping (0: off)"),
      llvm::cl::init(0.0)};
  PassOptions::Option<std::string> recompute{
      *this, "recompute",
      llvm::cl::desc("Activation recomputation: none, selective (cheap ops and attention) or "
                     "full (keep only the residual stream)"),
      llvm::cl::init("none")};
  PassOptions::Option<int> recomputeLayers{
      *this, "recompute-layers",
      llvm::cl::desc("With recompute: only the first N transformer layers of each pipeline "
                     "chunk (-1: all)"),
      llvm::cl::init(-1)};
  PassOptions::Option<std::string> offload{
      *this, "offload",
      llvm::cl::desc("none, or optimizer: fp32 master weights, optimizer state and the update "
                     "in host memory (ZeRO-Offload; needs the plan's device to be discrete)"),
      llvm::cl::init("none")};
  PassOptions::Option<std::string> offloadTarget{
      *this, "offload-target",
      llvm::cl::desc("With offload=optimizer: host (host memory) or nvme (a file in offload-path, "
                     "ptc-run --offload-dir overrides it; ZeRO-Infinity)"),
      llvm::cl::init("host")};
  PassOptions::Option<std::string> offloadPath{
      *this, "offload-path",
      llvm::cl::desc("With offload-target=nvme: the directory of the offload file"),
      llvm::cl::init("")};
  PassOptions::Option<std::string> lrSchedule{
      *this, "lr-schedule",
      llvm::cl::desc("Learning-rate schedule: constant, cosine or linear (after warmup)"),
      llvm::cl::init("constant")};
  PassOptions::Option<int64_t> warmupSteps{
      *this, "warmup-steps", llvm::cl::desc("Linear warmup steps of the schedule"),
      llvm::cl::init(0)};
  PassOptions::Option<int64_t> decaySteps{
      *this, "decay-steps", llvm::cl::desc("Step at which cosine/linear decay reaches min-lr"),
      llvm::cl::init(0)};
  PassOptions::Option<double> minLr{*this, "min-lr",
                                    llvm::cl::desc("Learning rate after decay-steps"),
                                    llvm::cl::init(0.0)};
  PassOptions::Option<std::string> precision{
      *this, "precision",
      llvm::cl::desc("Compute precision: fp32, bf16 or f16 (fp32 master weights and optimizer)"),
      llvm::cl::init("fp32")};
  PassOptions::Option<std::string> gradReduceDtype{
      *this, "grad-reduce-dtype",
      llvm::cl::desc("Type of the data-parallel gradient reductions: f32 or bf16"),
      llvm::cl::init("f32")};
  PassOptions::Option<double> bucketMb{
      *this, "bucket-mb",
      llvm::cl::desc("Largest gradient all-reduce bucket in MiB (buckets go out during backward)"),
      llvm::cl::init(25.0)};
  PassOptions::Option<double> lossScale{
      *this, "loss-scale", llvm::cl::desc("Static loss scale (for f16 compute)"),
      llvm::cl::init(1.0)};
  PassOptions::Option<bool> dynamicLossScale{
      *this, "dynamic-loss-scale",
      llvm::cl::desc("Dynamic loss scaling: skip overflowing steps, halve / grow the scale"),
      llvm::cl::init(false)};
  PassOptions::Option<double> lossScaleInit{
      *this, "loss-scale-init", llvm::cl::desc("Initial dynamic loss scale"),
      llvm::cl::init(65536.0)};
  PassOptions::Option<int64_t> lossScaleWindow{
      *this, "loss-scale-window",
      llvm::cl::desc("Steps without overflow before the dynamic loss scale doubles"),
      llvm::cl::init(1000)};
  PassOptions::Option<int64_t> microbatches{
      *this, "microbatches",
      llvm::cl::desc("Micro-batches per step (gradient accumulation; pipeline schedules)"),
      llvm::cl::init(1)};
  PassOptions::Option<std::string> schedule{
      *this, "schedule",
      llvm::cl::desc("Pipeline schedule: gpipe, 1f1b, interleaved-1f1b or zb-h1"),
      llvm::cl::init("1f1b")};
  PassOptions::Option<int> virtualStages{
      *this, "virtual-stages", llvm::cl::desc("Model chunks per pipeline rank (interleaving)"),
      llvm::cl::init(1)};
  PassOptions::Option<bool> scheduleReport{
      *this, "schedule-report",
      llvm::cl::desc("Print the pipeline schedule report (bubble, in-flight, p2p bytes)"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> scheduleSvg{
      *this, "schedule-svg", llvm::cl::desc("Write the pipeline diagram (SVG) to this file")};
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
  PassOptions::Option<int64_t> tokens{
      *this, "tokens", llvm::cl::desc("New tokens per call (1: decode; prompt length: prefill)"),
      llvm::cl::init(1)};
  PassOptions::Option<int64_t> context{
      *this, "context",
      llvm::cl::desc("Positions of the key/value cache (0: the model's sequence length)"),
      llvm::cl::init(0)};
  PassOptions::Option<int64_t> batch{*this, "batch",
                                     llvm::cl::desc("Sequences generated together"),
                                     llvm::cl::init(1)};
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
