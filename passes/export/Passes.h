//===- Passes.h - plan export -----------------------------------*- C++ -*-===//

#ifndef PTC_PASSES_EXPORT_PASSES_H
#define PTC_PASSES_EXPORT_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/export/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/export/Passes.h.inc"
} // namespace mlir::ptc

#endif // PTC_PASSES_EXPORT_PASSES_H
