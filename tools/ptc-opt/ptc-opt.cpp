//===- ptc-opt.cpp - the ptc compiler driver, an mlir-opt for ptc ---------===//
//
// Reads .mlir, runs ptc passes and pipelines, prints IR. Every mlir-opt flag
// works (--pass-pipeline, --mlir-print-ir-after-all, --verify-diagnostics,
// --split-input-file, -o).
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::ptc::PtcDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::tensor::TensorDialect>();

  // Generic cleanups users combine with ptc passes (canonicalize, cse, ...).
  mlir::registerTransformsPasses();
  mlir::ptc::registerAllPasses();

  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "ptc compiler driver\n", registry));
}
