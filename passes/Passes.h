//===- Passes.h - registration of all ptc passes ----------------*- C++ -*-===//

#ifndef PTC_PASSES_PASSES_H
#define PTC_PASSES_PASSES_H

namespace mlir::ptc {
/// Registers every ptc pass and named pipeline with the global registry, so
/// that ptc-opt accepts them as flags and inside --pass-pipeline.
void registerAllPasses();
} // namespace mlir::ptc

#endif // PTC_PASSES_PASSES_H
