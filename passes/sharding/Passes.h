//===- Passes.h - sharding and collective insertion -------------*- C++ -*-===//

#ifndef PTC_PASSES_SHARDING_PASSES_H
#define PTC_PASSES_SHARDING_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/sharding/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/sharding/Passes.h.inc"

/// The option values ptc-shard accepts whatever the mesh (zero a ZeRO stage;
/// reshard-after-forward=false only with zero=3); errors at `at`.
LogicalResult checkZeroOptions(Operation *at, int64_t zero, bool reshardAfterForward);
/// The values ptc-bucket-collectives accepts for grad-reduce-dtype.
LogicalResult checkGradReduceDtype(Operation *at, StringRef dtype);
} // namespace mlir::ptc

#endif // PTC_PASSES_SHARDING_PASSES_H
