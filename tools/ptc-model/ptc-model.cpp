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
cl::opt<std::string> dtype("dtype", cl::desc("Parameter/activation type: f32, bf16 or f16"),
                           cl::init("f32"), cl::sub(cl::SubCommand::getAll()), cl::cat(modelOptions));
cl::opt<double> dropout("dropout",
                        cl::desc("Dropout probability after the embeddings and each block's attention "
                                 "and MLP (gpt; default 0)"),
                        cl::init(0.0), cl::sub(gptCmd), cl::cat(modelOptions));
cl::opt<int64_t> documentEnd(
    "document-end",
    cl::desc("Packed documents: the token id that ends a document (ptc-tokenize --append-eos "
             "writes it; GPT-2's is 50256). The model takes a 'positions' input that ptc-run "
             "fills from the tokens: attention stops at document boundaries and positions restart "
             "(gpt, llama; default -1: one stream)"),
    cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> batch("batch", cl::desc("Global batch (sequences for gpt, rows otherwise)"),
                       cl::init(-1), cl::sub(cl::SubCommand::getAll()), cl::cat(modelOptions));
cl::opt<int64_t> hidden("hidden", cl::desc("Hidden size"), cl::init(-1),
                        cl::sub(cl::SubCommand::getAll()), cl::cat(modelOptions));
cl::opt<int64_t> layers("layers", cl::desc("Transformer blocks (gpt, llama) or linear layers (mlp)"),
                        cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::sub(mlpCmd),
                        cl::cat(modelOptions));

cl::opt<std::string> preset("preset",
                            cl::desc("Published shapes of a real model (gpt: gpt2, gpt2-medium, "
                                     "gpt2-large, gpt2-xl; llama: llama2-7b, llama2-13b, "
                                     "llama2-70b, llama3-8b, llama3-70b, mistral-7b, mixtral-8x7b); other "
                                     "options override them"),
                            cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> heads("heads", cl::desc("Attention heads (default: gpt 4, llama 8)"),
                       cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> seq("seq", cl::desc("Sequence length (= block size)"), cl::init(64),
                     cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> vocab("vocab", cl::desc("Vocabulary size"), cl::init(256), cl::sub(gptCmd),
                       cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> kvHeads("kv-heads",
                         cl::desc("Key/value heads, dividing --heads (default: --heads)"),
                         cl::init(-1), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> intermediate("intermediate", cl::desc("SwiGLU MLP hidden size (default 352)"),
                              cl::init(-1), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> ropeTheta("rope-theta", cl::desc("Rotary embedding base"), cl::init(10000.0),
                          cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> rmsNormEps("rms-norm-eps", cl::desc("RMSNorm epsilon"), cl::init(1e-5),
                           cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<bool> tieEmbeddings("tie-embeddings",
                            cl::desc("Tie the LM head to the token embedding (default: untied)"),
                            cl::sub(llamaCmd), cl::cat(modelOptions));

cl::opt<int64_t> input("input", cl::desc("Input (model) dimension"), cl::init(64),
                       cl::sub(mlpCmd), cl::sub(moeCmd), cl::cat(modelOptions));
cl::opt<int64_t> classes("classes", cl::desc("Output classes"), cl::init(10), cl::sub(mlpCmd),
                         cl::sub(moeCmd), cl::cat(modelOptions));
cl::opt<int64_t> experts("experts", cl::desc("Number of experts"), cl::init(4), cl::sub(moeCmd), cl::cat(modelOptions));
cl::opt<int64_t> topK("top-k", cl::desc("Experts per token"), cl::init(2), cl::sub(moeCmd), cl::cat(modelOptions));
cl::opt<int64_t> groups("groups",
                        cl::desc("Routing groups: each holds batch / groups consecutive tokens "
                                 "(default 1; a mesh splits the batch only in whole groups)"),
                        cl::init(1), cl::sub(moeCmd), cl::cat(modelOptions));
cl::opt<double> capacityFactor("capacity-factor",
                               cl::desc("Expert capacity = ceil(factor * tokens * k / experts)"),
                               cl::init(1.25), cl::sub(moeCmd), cl::cat(modelOptions));

// Mixture-of-experts MLPs in gpt and llama.
cl::opt<int64_t> moeExperts("moe-experts",
                            cl::desc("Experts per MoE layer (0: dense MLPs; default 0, or the "
                                     "preset's)"),
                            cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> moeTopK("moe-top-k", cl::desc("Experts per token (default 2, or the preset's)"),
                         cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> moeEvery("moe-every",
                          cl::desc("Layers i with i % N == 0 get an MoE MLP (default 1: all)"),
                          cl::init(1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<int64_t> moeFfn("moe-ffn",
                        cl::desc("Expert hidden size (default: the dense MLP's, or the preset's)"),
                        cl::init(-1), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> moeCapacityFactor(
    "moe-capacity-factor",
    cl::desc("Slots per expert per sequence = ceil(factor * seq * k / experts), at most seq "
             "(0: dropless; default 1.25)"),
    cl::init(1.25), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> moeAuxLoss("moe-aux-loss",
                           cl::desc("Switch load-balancing loss coefficient (default 0.01)"),
                           cl::init(0.01), cl::sub(gptCmd), cl::sub(llamaCmd),
                           cl::cat(modelOptions));
cl::opt<int64_t> moeSharedExperts(
    "moe-shared-experts",
    cl::desc("Shared experts every token passes through, added to the routed ones (DeepSeek, "
             "Qwen-MoE; one dense MLP of N x the expert size; default 0)"),
    cl::init(0), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> moeBiasBalancing(
    "moe-bias-balancing",
    cl::desc("Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the routing "
             "scores, moved by RATE * sign(mean load - load) after each step (default 0: off)"),
    cl::init(0.0), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));
cl::opt<double> moeZLoss("moe-z-loss", cl::desc("Router z-loss coefficient (default 0)"),
                         cl::init(0.0), cl::sub(gptCmd), cl::sub(llamaCmd), cl::cat(modelOptions));

int64_t orDefault(int64_t value, int64_t fallback) { return value < 0 ? fallback : value; }

/// The --moe-* options over `base` (a preset's experts, or none).
MoeLayersConfig moeOptions(MoeLayersConfig base) {
  base.experts = orDefault(moeExperts, base.experts);
  base.topK = orDefault(moeTopK, base.topK);
  base.every = moeEvery;
  base.ffn = orDefault(moeFfn, base.ffn);
  base.capacityFactor = moeCapacityFactor;
  base.auxLoss = moeAuxLoss;
  base.zLoss = moeZLoss;
  base.sharedExperts = moeSharedExperts;
  base.biasBalancing = moeBiasBalancing;
  return base;
}

/// The option's value when given on the command line, else `fallback`.
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

template <typename T> T given(const cl::opt<T> &option, T fallback) {
  return option.getNumOccurrences() ? T(option) : fallback;
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
  for (cl::SubCommand *sub :
       {&cl::SubCommand::getTopLevel(), &gptCmd, &llamaCmd, &mlpCmd, &moeCmd})
    cl::HideUnrelatedOptions(modelOptions, *sub);
  if (!cl::ParseCommandLineOptions(argc, argv,
                                   "ptc-model: writes ptc training models (gpt, llama, mlp, moe)\n",
                                   &llvm::errs()))
    return 2;

  // A given size or count must be one: the -1 defaults mean "not given", so a
  // negative value would otherwise silently become the default (--layers -1
  // built 2 layers).
  const char *modelName = gptCmd ? "gpt: " : llamaCmd ? "llama: " : mlpCmd ? "mlp: " : moeCmd ? "moe: " : "";
  // ... and at most a bound far past any real model, so that a typo (2^62)
  // fails here, named, not in shape arithmetic or minutes of building later.
  struct IntBound {
    const cl::opt<int64_t> *option;
    int64_t min, max;
  };
  constexpr int64_t kMaxSize = int64_t{1} << 31, kMaxCount = 65536;
  for (IntBound b : {IntBound{&batch, 1, kMaxSize}, {&hidden, 1, kMaxSize}, {&layers, 1, 4096},
                     {&heads, 1, kMaxCount}, {&seq, 1, kMaxSize}, {&vocab, 1, kMaxSize},
                     {&kvHeads, 1, kMaxCount}, {&intermediate, 1, kMaxSize}, {&input, 1, kMaxSize},
                     {&classes, 1, kMaxSize}, {&experts, 1, kMaxCount}, {&topK, 1, kMaxCount},
                     {&groups, 1, kMaxCount}, {&moeExperts, 0, kMaxCount}, {&moeTopK, 1, kMaxCount},
                     {&moeEvery, 1, 4096}, {&moeFfn, 1, kMaxSize}, {&moeSharedExperts, 0, kMaxCount}})
    if (b.option->getNumOccurrences() && (*b.option < b.min || *b.option > b.max)) {
      fail(modelName + Twine("--") + b.option->ArgStr + " must be " +
           (*b.option < b.min ? "at least " + Twine(b.min) : "at most " + Twine(b.max)) + ", got " +
           Twine(static_cast<int64_t>(*b.option)));
      return 2;
    }
  // The builders check the real options' ranges; NaN passes every comparison,
  // and infinity is no setting either.
  for (const cl::opt<double> *option : {&ropeTheta, &rmsNormEps, &capacityFactor, &moeCapacityFactor,
                                         &moeAuxLoss, &moeBiasBalancing, &moeZLoss})
    if (option->getNumOccurrences() && !std::isfinite(*option)) {
      fail(modelName + Twine("--") + option->ArgStr + " must be a finite number, got " +
           (std::isnan(*option) ? "nan" : "inf"));
      return 2;
    }

  const std::optional<::ptc::FloatDtype> elementType = ::ptc::parseOption<::ptc::FloatDtype>(dtype.getValue());
  if (!elementType)
    return fail(modelName + Twine("--dtype must be ") + ::ptc::optionChoices<::ptc::FloatDtype>() +
                ", got '" + dtype + "'");

  MLIRContext context;
  std::vector<TensorSpec> params;
  llvm::Expected<OwningOpRef<ModuleOp>> module = llvm::createStringError("no model");
  const ModelPreset *chosen = nullptr;
  if ((gptCmd || llamaCmd) && preset.getNumOccurrences()) {
    chosen = findModelPreset(gptCmd ? "gpt" : "llama", preset);
    if (!chosen) {
      std::string known;
      for (const ModelPreset &p : modelPresets())
        if (StringRef(p.model) == (gptCmd ? "gpt" : "llama"))
          known += (known.empty() ? "" : ", ") + std::string(p.name);
      fail("unknown " + Twine(gptCmd ? "gpt" : "llama") + " preset '" + preset +
           "' (known: " + known + ")");
      return 2;
    }
  }
  if (gptCmd) {
    GptConfig c;
    if (chosen) {
      c.layers = chosen->layers;
      c.hidden = chosen->hidden;
      c.heads = chosen->heads;
      c.seq = chosen->seq;
      c.vocab = chosen->vocab;
    }
    c.layers = orDefault(layers, c.layers);
    c.hidden = orDefault(hidden, c.hidden);
    c.heads = orDefault(heads, c.heads);
    c.seq = given(seq, c.seq);
    c.vocab = given(vocab, c.vocab);
    c.batch = orDefault(batch, c.batch);
    c.dtype = *elementType;
    c.dropout = dropout;
    c.documentEnd = documentEnd;
    c.moe = moeOptions(c.moe);
    params = gptParameters(c);
    module = buildGptModel(context, c);
  } else if (llamaCmd) {
    LlamaConfig c;
    if (chosen) {
      c.layers = chosen->layers;
      c.hidden = chosen->hidden;
      c.heads = chosen->heads;
      c.kvHeads = chosen->kvHeads;
      c.intermediate = chosen->intermediate;
      c.seq = chosen->seq;
      c.vocab = chosen->vocab;
      c.ropeTheta = chosen->ropeTheta;
      c.rmsNormEps = chosen->rmsNormEps;
      c.tieEmbeddings = chosen->tieEmbeddings;
    }
    c.layers = orDefault(layers, c.layers);
    c.hidden = orDefault(hidden, c.hidden);
    c.heads = orDefault(heads, c.heads);
    // Without a preset, kv heads default to the (possibly given) head count.
    c.kvHeads = orDefault(kvHeads, chosen ? c.kvHeads : c.heads);
    c.intermediate = orDefault(intermediate, c.intermediate);
    c.seq = given(seq, c.seq);
    c.vocab = given(vocab, c.vocab);
    c.ropeTheta = given(ropeTheta, c.ropeTheta);
    c.rmsNormEps = given(rmsNormEps, c.rmsNormEps);
    c.tieEmbeddings = given(tieEmbeddings, c.tieEmbeddings);
    c.batch = orDefault(batch, c.batch);
    c.dtype = *elementType;
    c.documentEnd = documentEnd;
    c.moe = moeOptions(c.moe);
    if (chosen && chosen->experts > 0) {
      c.moe.experts = orDefault(moeExperts, chosen->experts);
      c.moe.topK = orDefault(moeTopK, chosen->topK);
    }
    params = llamaParameters(c);
    module = buildLlamaModel(context, c);
    if (module && !hfConfig.empty())
      if (llvm::Error e = writeLlamaHfConfig(c, hfConfig))
        return fail(llvm::toString(std::move(e)));
  } else if (mlpCmd) {
    MlpConfig c;
    c.layers = orDefault(layers, c.layers);
    c.input = input;
    c.hidden = orDefault(hidden, c.hidden);
    c.classes = classes;
    c.batch = orDefault(batch, c.batch);
    c.dtype = *elementType;
    params = mlpParameters(c);
    module = buildMlpModel(context, c);
  } else if (moeCmd) {
    MoeConfig c;
    c.input = input;
    c.hidden = orDefault(hidden, c.hidden);
    c.experts = experts;
    c.topK = topK;
    c.capacityFactor = capacityFactor;
    c.groups = groups;
    c.classes = classes;
    c.batch = orDefault(batch, c.batch);
    c.dtype = *elementType;
    params = moeParameters(c);
    module = buildMoeModel(context, c);
  } else {
    llvm::consumeError(module.takeError());
    return fail("name a model: ptc-model gpt|llama|mlp|moe [options] (see ptc-model <model> --help)");
  }
  if (!module)
    return fail(llvm::toString(module.takeError()));
  // Sizes each within its bound can still multiply past what any device or
  // shape arithmetic holds (--batch 2^31 --seq 2^31): name the first tensor.
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  std::optional<std::string> tooLarge;
  (*module)->walk([&](Operation *op) {
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
    (*module)->print(output->os());
    output->os() << "\n";
  }
  output->keep();
  return 0;
}
