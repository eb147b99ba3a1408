//===- ptc-model.cpp - writes ptc training models (gpt, llama, mlp, moe) --===//
//
//   ptc-model gpt --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --batch 8 -o gpt.mlir
//   ptc-model llama --layers 2 --hidden 128 --heads 8 --kv-heads 4 --intermediate 352 ...
//   ptc-model llama --preset llama3-8b --seq 8192 --batch 1 -o l8b.mlir
//   ptc-model mlp --layers 3 --input 64 --hidden 128 --classes 10 --batch 32
//   ptc-model moe --experts 4 --top-k 2 ...
//   ptc-model gpt --list-parameters     # names and shapes, one per line
//
//===----------------------------------------------------------------------===//

#include "models/ModelFlags.h"
#include "models/Models.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <cmath>
#include <optional>
#include <string>
#include <cstdio>

using namespace mlir;
using namespace mlir::ptc;
namespace cl = llvm::cl;

namespace {
cl::OptionCategory modelOptions("ptc-model options");

cl::SubCommand gptCmd("gpt", "GPT as in nanoGPT's model.py (the standard model)");
cl::SubCommand llamaCmd("llama", "Llama-family decoder as Hugging Face's LlamaForCausalLM "
                                  "(RMSNorm, rotary, grouped-query attention, SwiGLU)");
cl::SubCommand mlpCmd("mlp", "multi-layer perceptron classifier");
cl::SubCommand moeCmd("moe", "mixture-of-experts classifier (top-k router, expert MLPs)");

cl::opt<std::string> outputFile("o", cl::desc("Output file (default: stdout)"),
                                cl::value_desc("file"), cl::init("-"), cl::sub(cl::SubCommand::getAll()), cl::cat(modelOptions));
cl::opt<bool> listParameters("list-parameters",
                             cl::desc("Print parameter names and shapes instead of the model"),
                             cl::sub(cl::SubCommand::getAll()), cl::cat(modelOptions));
cl::opt<std::string> hfConfig("hf-config",
                              cl::desc("Also write Hugging Face's config.json of the model to this file "
                                       "(llama; the form ptc-run --save DIR/ writes the weights in)"),
                              cl::value_desc("file"), cl::sub(llamaCmd), cl::cat(modelOptions));
/// Writes Hugging Face's config.json of a dense Llama (llamaHfConfig).
llvm::Error writeLlamaHfConfig(const LlamaConfig &c, const std::string &path) {
  if (c.moe.enabled())
    return llvm::createStringError("--hf-config: this model has MoE layers, whose experts ptc "
                                   "stacks into one tensor per layer; Hugging Face's Mixtral keeps "
                                   "one per expert, so there is no config.json for these weights");
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec)
    return llvm::createStringError("--hf-config: cannot write '%s': %s", path.c_str(),
                                   ec.message().c_str());
  os << llamaHfConfig(c) << "\n"; // ptc.model_info's hf_config holds the same text
  return llvm::Error::success();
}

int fail(const Twine &message) {
  llvm::WithColor::error(llvm::errs(), "ptc-model") << message << "\n";
  return 1;
}
} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  // Only ptc-model's own options in --help (not the LLVM/MLIR ones linked in);
  // a bad subcommand or option is a usage error (exit status 2).
  // The model comes first. Checked before LLVM's parser, which reads an
  // option of another model (`--heads` without `gpt`) as the grouped `-h`.
  if (argc > 1) {
    llvm::StringRef first = argv[1];
    bool help = first == "-h" || first.starts_with("--help") || first.starts_with("-help") ||
                first == "--version";
    const std::string_view name(first.data(), first.size());
    if (!help && !::ptc::parseOption<::ptc::BuilderKind>(name)) {
      fail("unknown model '" + first + "': the first argument names one of " +
           llvm::join(::ptc::optionSpellings<::ptc::BuilderKind>(), ", ") + " (see ptc-model --help)");
      return 2;
    }
  }
  // The builders' keys as flags (models/ModelKeys.h), each on the
  // subcommands of the builders that take it.
  const std::pair<::ptc::BuilderKind, cl::SubCommand *> builders[] = {
      {::ptc::BuilderKind::Gpt, &gptCmd},
      {::ptc::BuilderKind::Llama, &llamaCmd},
      {::ptc::BuilderKind::Mlp, &mlpCmd},
      {::ptc::BuilderKind::Moe, &moeCmd}};
  ::ptc::models::ModelFlags::Config flagConfig;
  flagConfig.subcommands.assign(std::begin(builders), std::end(builders));
  ::ptc::models::ModelFlags modelFlags(modelOptions, flagConfig);

  for (cl::SubCommand *sub :
       {&cl::SubCommand::getTopLevel(), &gptCmd, &llamaCmd, &mlpCmd, &moeCmd})
    cl::HideUnrelatedOptions(modelOptions, *sub);
  if (!cl::ParseCommandLineOptions(argc, argv,
                                   "ptc-model: writes ptc training models (gpt, llama, mlp, moe)\n",
                                   &llvm::errs()))
    return 2;

  std::optional<::ptc::BuilderKind> builder;
  for (const auto &[kind, sub] : builders)
    if (*sub)
      builder = kind;
  if (!builder)
    return fail("name a model: ptc-model gpt|llama|mlp|moe [options] (see ptc-model <model> --help)");
  const std::string modelName = std::string(::ptc::optionName(*builder)) + ": ";

  // A given value must be within its key's bounds (a typo such as 2^62 fails
  // here, named, not in shape arithmetic or minutes of building later).
  llvm::Expected<::ptc::models::ModelArgs> args = modelFlags.given();
  if (!args) {
    fail(modelName + llvm::toString(args.takeError()));
    return 2;
  }

  if (llvm::Error e = checkPreset(*args, *builder)) {
    fail(llvm::toString(std::move(e)));
    return 2;
  }

  MLIRContext context;
  llvm::Expected<BuiltModel> module = buildModel(context, *builder, *args);
  if (module && *builder == ::ptc::BuilderKind::Llama && !hfConfig.empty()) {
    llvm::Expected<LlamaConfig> c = llamaConfigFrom(*args);
    if (!c)
      return fail(modelName + llvm::toString(c.takeError()));
    if (llvm::Error e = writeLlamaHfConfig(*c, hfConfig))
      return fail(llvm::toString(std::move(e)));
  }
  if (!module)
    return fail(llvm::toString(module.takeError()));
  const std::vector<TensorSpec> &params = module->parameters;
  // Sizes each within its bound can still multiply past what any device or
  // shape arithmetic holds (--batch 2^31 --seq 2^31): name the first tensor.
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  std::optional<std::string> tooLarge;
  module->module->walk([&](Operation *op) {
    auto check = [&](Type type) {
      auto tensor = dyn_cast<RankedTensorType>(type);
      if (!tensor || tooLarge)
        return;
      int64_t elements = 1;
      for (int64_t d : tensor.getShape())
        if (d > 0 && (elements > kMaxElements / d || (elements *= d) > kMaxElements)) {
          std::string text;
          llvm::raw_string_ostream os(text);
          os << tensor;
          tooLarge = text;
          return;
        }
    };
    for (Type t : op->getResultTypes())
      check(t);
    if (auto func = dyn_cast<func::FuncOp>(op))
      for (Type t : func.getArgumentTypes())
        check(t);
  });
  if (tooLarge)
    return fail(modelName + Twine("the model's tensor ") + *tooLarge + " has more than 2^48 elements: " +
                "the sizes given (--batch, --seq, --hidden, --vocab, ...) are too large");

  std::string errorMessage;
  std::unique_ptr<llvm::ToolOutputFile> output = openOutputFile(outputFile, &errorMessage);
  if (!output)
    return fail(errorMessage);
  if (listParameters) {
    for (const TensorSpec &p : params) {
      output->os() << p.name << " [";
      llvm::interleaveComma(p.shape, output->os());
      output->os() << "]\n";
    }
    output->os() << "total " << countElements(params) << "\n";
  } else {
    module->module->print(output->os());
    output->os() << "\n";
  }
  output->keep();
  return 0;
}
