// libFuzzer target: the compiler's front door, in process. Any bytes as model
// text: parsed and verified as ptc-opt does, then compiled by the ptc-compile
// pipeline (everything up to the plan, which is not written). A first line
// "// ptc-compile: OPTIONS" picks the compile options (mesh, zero,
// microbatches, precision, ...), so the fuzzer mutates layouts too; options
// that write files (plan, schedule-svg) are dropped and reports are off.
// Every outcome is fine but a crash, a sanitizer report or a hang: malformed
// text and impossible layouts must end as diagnostics.
#include "dialects/ptc/PtcOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace {

const mlir::DialectRegistry &registry() {
  static const mlir::DialectRegistry *r = [] {
    auto *reg = new mlir::DialectRegistry;
    reg->insert<mlir::ptc::PtcDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
                mlir::tensor::TensorDialect>();
    return reg;
  }();
  return *r;
}

/// The options of a first line "// ptc-compile: OPTIONS", or "".
llvm::StringRef optionLine(llvm::StringRef text) {
  constexpr llvm::StringLiteral kPrefix = "// ptc-compile:";
  if (!text.starts_with(kPrefix))
    return "";
  return text.drop_front(kPrefix.size()).split('\n').first.trim();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Model text of a few KiB is what the seeds are; larger inputs only slow
  // the search.
  if (size > (64u << 10))
    return 0;
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);

  auto options = mlir::ptc::CompilePipelineOptions::createFromString(optionLine(text));
  if (!options)
    return 0;
  options->plan = "";
  options->scheduleSvg = "";
  options->reportMemory = false;
  options->explain = false;
  options->scheduleReport = false;

  mlir::MLIRContext context(registry(), mlir::MLIRContext::Threading::DISABLED);
  context.printOpOnDiagnostic(false);
  mlir::ScopedDiagnosticHandler quiet(&context, [](mlir::Diagnostic &) { return mlir::success(); });
  llvm::SourceMgr sources;
  sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, "fuzz.mlir"), llvm::SMLoc());
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceFile<mlir::ModuleOp>(sources, &context);
  if (!module || mlir::failed(mlir::verify(*module)))
    return 0;
  mlir::PassManager pm(&context);
  mlir::ptc::buildCompilePipeline(pm, *options);
  (void)pm.run(*module);
  return 0;
}
