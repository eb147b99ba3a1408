//===- Passes.h - micro-batches and pipeline stages -------------*- C++ -*-===//

#ifndef PTC_PASSES_PIPELINE_PASSES_H
#define PTC_PASSES_PIPELINE_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/pipeline/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/pipeline/Passes.h.inc"

} // namespace mlir::ptc

#endif // PTC_PASSES_PIPELINE_PASSES_H
