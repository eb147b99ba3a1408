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
  // ptc-propagate-sharding's options (passes/PipelineOptions.td).
#define GEN_PIPELINE_OPTION_DECLS_Shard
#include "passes/PipelineOptions.h.inc"
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
