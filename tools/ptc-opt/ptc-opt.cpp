//===- ptc-opt.cpp - the ptc compiler driver, an mlir-opt for ptc ---------===//
//
// Reads .mlir, runs ptc passes and pipelines, prints IR. Every mlir-opt flag
// works (--pass-pipeline, --mlir-print-ir-after-all, --verify-diagnostics,
// --split-input-file, -o). One convenience: with --ptc-compile and no plan=
// option, `-o FILE.plan` names the plan file (the IR is then not written).
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

#include <string>
#include <vector>

namespace {
/// `ptc-opt in.mlir --ptc-compile="..." -o out.plan`: the plan goes to out.plan.
std::vector<std::string> planFromOutputFile(int argc, char **argv) {
  std::vector<std::string> args(argv, argv + argc);
  int compile = -1, output = -1;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a(args[static_cast<size_t>(i)]);
    if (a == "--ptc-compile" || a.starts_with("--ptc-compile="))
      compile = i;
    else if ((a == "-o" || a == "--o") && i + 1 < argc)
      output = i + 1;
  }
  if (compile < 0 || output < 0)
    return args;
  std::string &c = args[static_cast<size_t>(compile)], &o = args[static_cast<size_t>(output)];
  llvm::StringRef options = llvm::StringRef(c).split('=').second;
  bool hasPlan = options.starts_with("plan=") || options.contains(" plan=");
  if (hasPlan || !llvm::StringRef(o).ends_with(".plan"))
    return args;
  c = "--ptc-compile=" + options.str() + (options.empty() ? "" : " ") + "plan=" + o;
  o = "/dev/null";
  return args;
}
} // namespace

int main(int argc, char **argv) {
  std::vector<std::string> args = planFromOutputFile(argc, argv);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  argc = static_cast<int>(cargs.size());
  argv = cargs.data();
  mlir::DialectRegistry registry;
  registry.insert<mlir::ptc::PtcDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::tensor::TensorDialect>();

  // Generic cleanups users combine with ptc passes (canonicalize, cse, ...).
  mlir::registerTransformsPasses();
  mlir::ptc::registerAllPasses();

  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "ptc compiler driver\n", registry));
}
