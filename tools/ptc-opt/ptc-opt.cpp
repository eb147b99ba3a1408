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
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace mlir;

namespace {
/// `ptc-opt in.mlir --ptc-compile="..." -o out.plan` (or --ptc-compile-decode):
/// the plan goes to out.plan.
std::vector<std::string> planFromOutputFile(int argc, char **argv) {
  std::vector<std::string> args(argv, argv + argc);
  int compile = -1, output = -1;
  std::string pipeline;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a(args[static_cast<size_t>(i)]);
    for (llvm::StringRef name : {"--ptc-compile", "--ptc-compile-decode"})
      if (a == name || (a.starts_with(name) && a.drop_front(name.size()).starts_with("="))) {
        compile = i;
        pipeline = name.str();
      }
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
  c = pipeline + "=" + options.str() + (options.empty() ? "" : " ") + "plan=" + o;
  o = "/dev/null";
  return args;
}

/// Prints pass diagnostics as `file:line:col: severity: message`, then the
/// source line and a caret, and the notes the same way. Unlike upstream's
/// SourceMgr handler it never echoes more than a window of a long line: ptc
/// models put a function's whole signature (thousands of parameters) on one
/// line, and a diagnostic is a location and a message, not the module.
class ConciseDiagnostics {
public:
  static constexpr size_t kMaxLine = 160;

  void print(Diagnostic &diag, llvm::raw_ostream &os) {
    printOne(diag.getLocation(), diag.getSeverity(), diag.str(), os);
    for (Diagnostic &note : diag.getNotes())
      printOne(note.getLocation(), note.getSeverity(), note.str(), os);
  }

private:
  static const char *severityName(DiagnosticSeverity s) {
    switch (s) {
    case DiagnosticSeverity::Error:
      return "error";
    case DiagnosticSeverity::Warning:
      return "warning";
    case DiagnosticSeverity::Note:
      return "note";
    case DiagnosticSeverity::Remark:
      return "remark";
    }
    return "error";
  }

  /// The first file position inside `loc` (names, call sites and fused
  /// locations wrap one), if any.
  static std::optional<FileLineColLoc> filePosition(Location loc) {
    std::optional<FileLineColLoc> found;
    loc->walk([&](Location l) {
      if (auto f = dyn_cast<FileLineColLoc>(l)) {
        found = f;
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    return found;
  }

  std::optional<StringRef> sourceLine(StringRef file, unsigned line) {
    auto it = files_.find(file);
    if (it == files_.end()) {
      auto buffer = llvm::MemoryBuffer::getFile(file, /*IsText=*/true);
      it = files_.try_emplace(file, buffer ? std::move(*buffer) : nullptr).first;
    }
    if (!it->second || line == 0)
      return std::nullopt;
    StringRef rest = it->second->getBuffer();
    for (unsigned i = 1; i < line && !rest.empty(); ++i)
      rest = rest.split('\n').second;
    if (rest.empty())
      return std::nullopt;
    return rest.split('\n').first.rtrim('\r');
  }

  void printOne(Location loc, DiagnosticSeverity severity, StringRef message,
                llvm::raw_ostream &os) {
    std::optional<FileLineColLoc> pos = filePosition(loc);
    if (pos)
      os << pos->getFilename().getValue() << ":" << pos->getLine() << ":" << pos->getColumn();
    else
      os << loc;
    os << ": " << severityName(severity) << ": " << message << "\n";
    if (!pos)
      return;
    std::optional<StringRef> line = sourceLine(pos->getFilename().getValue(), pos->getLine());
    if (!line)
      return;
    size_t col = pos->getColumn() ? pos->getColumn() - 1 : 0;
    col = std::min(col, line->size());
    // A window of the line around the column, marked where it is cut.
    size_t begin = 0, end = line->size();
    if (end > kMaxLine) {
      begin = col > kMaxLine / 4 ? col - kMaxLine / 4 : 0;
      end = std::min(line->size(), begin + kMaxLine);
    }
    std::string prefix = begin > 0 ? "... " : "";
    os << prefix << line->slice(begin, end) << (end < line->size() ? " ..." : "") << "\n";
    os << std::string(prefix.size() + (col - begin), ' ') << "^\n";
  }

  llvm::StringMap<std::unique_ptr<llvm::MemoryBuffer>> files_;
};
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

  // A diagnostic names a location; it does not print the operation (a whole
  // training step) unless asked with --mlir-print-op-on-diagnostic.
  mlir::registerMLIRContextCLOptions();
  if (auto *opt = llvm::cl::getRegisteredOptions().lookup("mlir-print-op-on-diagnostic"))
    static_cast<llvm::cl::opt<bool> *>(opt)->setInitialValue(false);

  auto [inputFile, outputFile] =
      mlir::registerAndParseCLIOptions(argc, argv, "ptc compiler driver\n", registry);
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects() || config.shouldListPasses())
    return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, inputFile, outputFile, registry));

  auto concise = std::make_shared<ConciseDiagnostics>();
  if (!config.shouldVerifyDiagnostics()) {
    mlir::MlirOptMainConfig inner = config;
    config.setPassPipelineSetupFn([inner, concise](mlir::PassManager &pm) {
      // Registered last, so it sees pass diagnostics before upstream's handler.
      pm.getContext()->getDiagEngine().registerHandler([concise](mlir::Diagnostic &diag) {
        concise->print(diag, llvm::errs());
        return mlir::success();
      });
      return inner.setupPassPipeline(pm);
    });
  }

  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> file = mlir::openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "ptc-opt: " << error << "\n";
    return 1;
  }
  std::unique_ptr<llvm::ToolOutputFile> output = mlir::openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "ptc-opt: " << error << "\n";
    return 1;
  }
  if (mlir::failed(mlir::MlirOptMain(output->os(), std::move(file), registry, config)))
    return 1;
  output->keep();
  return 0;
}
