//===- Passes.h - sharding and collective insertion -------------*- C++ -*-===//

#ifndef PTC_PASSES_SHARDING_PASSES_H
#define PTC_PASSES_SHARDING_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/sharding/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/sharding/Passes.h.inc"

/// ptc-shard: the sharding phases a layout needs before bucketing
/// (ptc-propagate-sharding, then ptc-partition), with propagation's options.
struct ShardPipelineOptions : public PassPipelineOptions<ShardPipelineOptions> {
  Option<std::string> mesh{*this, "mesh",
                           llvm::cl::desc("Device mesh, e.g. dp:2,tp:2 (default: the module's ptc.mesh)")};
  Option<bool> sequenceParallel{*this, "sequence-parallel",
                                llvm::cl::desc("Also split the sequence dimension of inputs over tp"),
                                llvm::cl::init(false)};
  Option<int> zero{*this, "zero", llvm::cl::desc("ZeRO stage over dp (0-3)"), llvm::cl::init(0)};
  Option<bool> reshardAfterForward{
      *this, "reshard-after-forward",
      llvm::cl::desc("ZeRO-3: gather parameters again in the backward pass"), llvm::cl::init(true)};
};
void buildShardPipeline(OpPassManager &pm, const ShardPipelineOptions &options);
/// Registers the sharding passes and the ptc-shard pipeline.
void registerShardingPassesAndPipelines();

/// The option values ptc-propagate-sharding accepts whatever the mesh (zero a ZeRO stage;
/// reshard-after-forward=false only with zero=3); errors at `at`.
LogicalResult checkZeroOptions(Operation *at, int64_t zero, bool reshardAfterForward);
/// The values ptc-bucket-collectives accepts for grad-reduce-dtype.
LogicalResult checkGradReduceDtype(Operation *at, StringRef dtype);
} // namespace mlir::ptc

#endif // PTC_PASSES_SHARDING_PASSES_H
