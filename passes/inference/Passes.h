//===- Passes.h - forward-only functions for inference ----------*- C++ -*-===//

#ifndef PTC_PASSES_INFERENCE_PASSES_H
#define PTC_PASSES_INFERENCE_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/inference/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/inference/Passes.h.inc"
} // namespace mlir::ptc

#endif // PTC_PASSES_INFERENCE_PASSES_H
