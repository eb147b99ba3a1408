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
} // namespace mlir::ptc

#endif // PTC_PASSES_SHARDING_PASSES_H
