//===- Passes.h - ptc analysis passes ---------------------------*- C++ -*-===//

#ifndef PTC_PASSES_ANALYSIS_PASSES_H
#define PTC_PASSES_ANALYSIS_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/analysis/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/analysis/Passes.h.inc"
} // namespace mlir::ptc

#endif // PTC_PASSES_ANALYSIS_PASSES_H
