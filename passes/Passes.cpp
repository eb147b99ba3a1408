//===- Passes.cpp - registration of all ptc passes ------------------------===//

#include "passes/Passes.h"

#include "passes/analysis/Passes.h"

void mlir::ptc::registerAllPasses() { registerAnalysisPasses(); }
