//===- ModelArgs.cpp - builder configurations from the keys given ---------===//
//
// The one reading of a model's keys (ModelKeys.h) into the builders' typed
// configurations: a preset first, then each key given, then the builder's
// defaults. ptc-model, ptc-plan and (through ptc-model's flags) ptc-train all
// get their models from here.
//
//===----------------------------------------------------------------------===//

#include "models/Models.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::models::ModelArgs;

namespace {

/// The preset `args` names for `builder` (gpt or llama), null when none is
/// given, or an error listing the builder's presets.
llvm::Expected<const ModelPreset *> presetOf(const ModelArgs &args, ::ptc::BuilderKind builder) {
  if (!args.has("preset"))
    return nullptr;
  const std::string name = args.stringOr("preset", "");
  const std::string_view model = ::ptc::optionName(builder);
  const StringRef modelRef(model.data(), model.size());
  if (const ModelPreset *p = findModelPreset(modelRef, name))
    return p;
  std::vector<std::string> known;
  for (const ModelPreset &p : modelPresets())
    if (modelRef == p.model)
      known.push_back(p.name);
  return llvm::createStringError("unknown " + modelRef + " preset '" + name +
                                 "' (known: " + llvm::join(known, ", ") + ")");
}

llvm::Expected<::ptc::FloatDtype> dtypeOf(const ModelArgs &args) {
  const std::string text = args.stringOr("dtype", "f32");
  if (std::optional<::ptc::FloatDtype> d = ::ptc::parseOption<::ptc::FloatDtype>(text))
    return *d;
  return llvm::createStringError("--dtype must be " + ::ptc::optionChoices<::ptc::FloatDtype>() +
                                 ", got '" + text + "'");
}

/// The MoE-layer keys over `moe` (a preset's experts, or none).
MoeLayersConfig moeLayers(const ModelArgs &args, MoeLayersConfig moe) {
  moe.experts = args.intOr("moe_experts", moe.experts);
  moe.topK = args.intOr("moe_top_k", moe.topK);
  moe.every = args.intOr("moe_every", moe.every);
  moe.ffn = args.intOr("moe_ffn", moe.ffn);
  moe.capacityFactor = args.floatOr("moe_capacity_factor", moe.capacityFactor);
  moe.auxLoss = args.floatOr("moe_aux_loss", moe.auxLoss);
  moe.zLoss = args.floatOr("moe_z_loss", moe.zLoss);
  moe.sharedExperts = args.intOr("moe_shared_experts", moe.sharedExperts);
  moe.biasBalancing = args.floatOr("moe_bias_balancing", moe.biasBalancing);
  return moe;
}

MoeLayersConfig presetMoe(const ModelPreset *p) {
  MoeLayersConfig moe;
  if (p && p->experts > 0) {
    moe.experts = p->experts;
    moe.topK = p->topK;
  }
  return moe;
}

} // namespace

llvm::Error mlir::ptc::checkPreset(const ModelArgs &args, ::ptc::BuilderKind builder) {
  llvm::Expected<const ModelPreset *> p = presetOf(args, builder);
  return p ? llvm::Error::success() : p.takeError();
}

namespace {
/// The keys every builder takes (the batch, the element type), then the
/// builder's own checks of the whole configuration.
template <typename Config>
llvm::Expected<Config> finishConfig(Config c, const ModelArgs &args,
                                    llvm::Error (*validate)(const Config &)) {
  c.batch = args.intOr("batch", c.batch);
  llvm::Expected<::ptc::FloatDtype> dtype = dtypeOf(args);
  if (!dtype)
    return dtype.takeError();
  c.dtype = *dtype;
  if (llvm::Error e = validate(c))
    return std::move(e);
  return c;
}

/// MoE-layer keys given for a dense model (no experts) would change nothing:
/// an error naming the first.
llvm::Error moeKeysTakeEffect(const ModelArgs &args, const MoeLayersConfig &moe) {
  if (moe.experts > 0)
    return llvm::Error::success();
  for (const auto &entry : args.all()) {
    const std::string &name = entry.first;
    if (name.rfind("moe_", 0) != 0 || name == "moe_experts")
      continue;
    const ::ptc::models::ModelKey *key = ::ptc::models::findModelKey(name);
    const ::ptc::models::ModelKey *experts = ::ptc::models::findModelKey("moe_experts");
    return llvm::createStringError(key->flag() + " has no effect on a dense model: it sets up "
                                   "MoE layers, which " + experts->flag() + " N (> 0) adds");
  }
  return llvm::Error::success();
}

/// The keys GPT and Llama share, over the preset's shapes (`preset`, or none).
template <typename Config>
llvm::Error readLanguageModelKeys(Config &c, const ModelArgs &args, const ModelPreset *preset) {
  if (preset) {
    c.layers = preset->layers;
    c.hidden = preset->hidden;
    c.heads = preset->heads;
    c.seq = preset->seq;
    c.vocab = preset->vocab;
  }
  c.layers = args.intOr("layers", c.layers);
  c.hidden = args.intOr("hidden", c.hidden);
  c.heads = args.intOr("heads", c.heads);
  c.seq = args.intOr("seq", c.seq);
  c.vocab = args.intOr("vocab", c.vocab);
  c.documentEnd = args.intOr("document_end", c.documentEnd);
  c.moe = moeLayers(args, presetMoe(preset));
  return moeKeysTakeEffect(args, c.moe);
}
} // namespace

llvm::Expected<GptConfig> mlir::ptc::gptConfigFrom(const ModelArgs &args) {
  GptConfig c;
  llvm::Expected<const ModelPreset *> p = presetOf(args, ::ptc::BuilderKind::Gpt);
  if (!p)
    return p.takeError();
  if (llvm::Error e = readLanguageModelKeys(c, args, *p))
    return std::move(e);
  c.dropout = args.floatOr("dropout", c.dropout);
  return finishConfig(c, args, validateGptConfig);
}

llvm::Expected<LlamaConfig> mlir::ptc::llamaConfigFrom(const ModelArgs &args) {
  LlamaConfig c;
  llvm::Expected<const ModelPreset *> p = presetOf(args, ::ptc::BuilderKind::Llama);
  if (!p)
    return p.takeError();
  if (*p) {
    c.kvHeads = (*p)->kvHeads;
    c.intermediate = (*p)->intermediate;
    c.ropeTheta = (*p)->ropeTheta;
    c.rmsNormEps = (*p)->rmsNormEps;
    c.tieEmbeddings = (*p)->tieEmbeddings;
  }
  if (llvm::Error e = readLanguageModelKeys(c, args, *p))
    return std::move(e);
  // Without a preset, the kv heads default to the (possibly given) heads.
  c.kvHeads = args.intOr("kv_heads", *p ? c.kvHeads : c.heads);
  c.intermediate = args.intOr("intermediate", c.intermediate);
  c.ropeTheta = args.floatOr("rope_theta", c.ropeTheta);
  c.rmsNormEps = args.floatOr("rms_norm_eps", c.rmsNormEps);
  c.tieEmbeddings = args.boolOr("tie_embeddings", c.tieEmbeddings);
  return finishConfig(c, args, validateLlamaConfig);
}

llvm::Expected<MlpConfig> mlir::ptc::mlpConfigFrom(const ModelArgs &args) {
  MlpConfig c;
  c.layers = args.intOr("layers", c.layers);
  c.input = args.intOr("input", c.input);
  c.hidden = args.intOr("hidden", c.hidden);
  c.classes = args.intOr("classes", c.classes);
  return finishConfig(c, args, validateMlpConfig);
}

llvm::Expected<MoeConfig> mlir::ptc::moeConfigFrom(const ModelArgs &args) {
  MoeConfig c;
  c.input = args.intOr("input", c.input);
  c.hidden = args.intOr("hidden", c.hidden);
  c.experts = args.intOr("experts", c.experts);
  c.topK = args.intOr("top_k", c.topK);
  c.capacityFactor = args.floatOr("capacity_factor", c.capacityFactor);
  c.groups = args.intOr("groups", c.groups);
  c.classes = args.intOr("classes", c.classes);
  return finishConfig(c, args, validateMoeConfig);
}

namespace {
/// The model of a configuration read from the keys, and its parameters.
template <typename Config>
llvm::Expected<BuiltModel>
buildFrom(MLIRContext &context, llvm::Expected<Config> config,
          std::vector<TensorSpec> (*parameters)(const Config &),
          llvm::Expected<OwningOpRef<ModuleOp>> (*build)(MLIRContext &, const Config &)) {
  if (!config)
    return config.takeError();
  llvm::Expected<OwningOpRef<ModuleOp>> module = build(context, *config);
  if (!module)
    return module.takeError();
  return BuiltModel{std::move(*module), parameters(*config)};
}
} // namespace

llvm::Expected<BuiltModel> mlir::ptc::buildModel(MLIRContext &context, ::ptc::BuilderKind builder,
                                                 const ModelArgs &args) {
  switch (builder) {
  case ::ptc::BuilderKind::Gpt:
    return buildFrom(context, gptConfigFrom(args), gptParameters, buildGptModel);
  case ::ptc::BuilderKind::Llama:
    return buildFrom(context, llamaConfigFrom(args), llamaParameters, buildLlamaModel);
  case ::ptc::BuilderKind::Mlp:
    return buildFrom(context, mlpConfigFrom(args), mlpParameters, buildMlpModel);
  case ::ptc::BuilderKind::Moe:
    return buildFrom(context, moeConfigFrom(args), moeParameters, buildMoeModel);
  }
  return llvm::createStringError("unknown model builder");
}
