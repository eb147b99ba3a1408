//===- Models.h - builders of the standard ptc training models --*- C++ -*-===//
//
// GPT (nanoGPT's model.py), an MLP and a mixture-of-experts classifier, built
// as one `func.func @train_step` in the ptc dialect: parameters and inputs are
// arguments (global shapes), the result is the scalar mean loss.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_MODELS_MODELS_H
#define PTC_MODELS_MODELS_H

#include "models/ModelKeys.h"
#include "runtime/base/option_values.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace mlir::ptc {

/// A named tensor of a model's signature.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  /// Initializer of a parameter (`ptc.init`): "zeros", "ones" or "normal:<std>".
  std::string init = "";
  /// Stacked over this many experts along dimension 0 (`ptc.experts`; 0: not).
  int64_t experts = 0;
};

/// Mixture-of-experts MLPs in a transformer (`--moe-*` of the gpt and llama
/// builders). Routing as GShard / Switch: router logits in f32, softmax
/// over all experts, top-k, weights renormalized over the k chosen; one
/// routing group per sequence; capacity per expert per group
/// ceil(capacity_factor * tokens * k / experts), at most the group's tokens
/// (0: dropless, the group's tokens); slots filled choice-major.
struct MoeLayersConfig {
  int64_t experts = 0;          ///< 0: dense MLPs only
  int64_t topK = 2;
  int64_t every = 1;            ///< layers i with i % every == 0 are MoE layers
  int64_t ffn = 0;              ///< expert hidden size (0: the dense MLP's)
  double capacityFactor = 1.25; ///< 0: dropless
  double auxLoss = 0.01;        ///< Switch load-balancing loss coefficient
  double zLoss = 0.0;           ///< router z-loss coefficient
  int64_t sharedExperts = 0;    ///< experts every token passes through (one dense MLP N x ffn)
  double biasBalancing = 0.0;   ///< auxiliary-loss-free balancing rate (DeepSeek-V3), 0: off
  bool enabled() const { return experts > 0; }
  bool isMoeLayer(int64_t layer) const { return enabled() && layer % every == 0; }
};
/// Checks the MoE options (`model` names the builder in messages).
llvm::Error validateMoeLayers(const MoeLayersConfig &moe, const char *model);
/// Expert slots per routing group of `tokens` tokens.
int64_t moeLayerCapacity(const MoeLayersConfig &moe, int64_t tokens);

/// Total element count of `specs`.
int64_t countElements(const std::vector<TensorSpec> &specs);

/// The MLIR element type of parameters and activations of `dtype`.
Type floatType(MLIRContext &context, ::ptc::FloatDtype dtype);

struct GptConfig {
  int64_t layers = 2;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t seq = 64; ///< also the block size (length of the position table)
  int64_t vocab = 256;
  int64_t batch = 8;
  ::ptc::FloatDtype dtype = ::ptc::FloatDtype::F32;
  /// MoE MLPs (experts: c_fc [E, ffn, h] + GELU + c_proj [E, h, ffn], with biases).
  MoeLayersConfig moe;
  /// Dropout probability after the embeddings and after each block's
  /// attention and MLP (nanoGPT's `drop` and `resid_dropout`s; attention
  /// probabilities are not dropped: the attention is fused).
  double dropout = 0.0;
  /// Packed documents: the token id that ends a document, or -1 (one
  /// stream). With it the model takes a third input, `positions` [batch,
  /// seq] (i32, each token's position in its document, filled by ptc-run from
  /// the tokens): attention stops at document boundaries and the positions
  /// restart at each document.
  int64_t documentEnd = -1;
};
/// Checks a packed-documents token id against the vocabulary.
llvm::Error validateDocumentEnd(int64_t documentEnd, int64_t vocab, const char *model);
llvm::Error validateGptConfig(const GptConfig &config);
/// Parameters in nanoGPT's names and order (lm_head.weight is tied to
/// transformer.wte.weight and so not listed).
std::vector<TensorSpec> gptParameters(const GptConfig &config);
llvm::Expected<OwningOpRef<ModuleOp>> buildGptModel(MLIRContext &context,
                                                    const GptConfig &config);

/// Hugging Face's LlamaForCausalLM without dropout (Llama 2/3, Mistral, Qwen-shaped).
struct LlamaConfig {
  int64_t layers = 2;
  int64_t hidden = 128;
  int64_t heads = 8;
  int64_t kvHeads = 8;       ///< grouped-query attention: divides heads
  int64_t intermediate = 352; ///< SwiGLU hidden size
  int64_t seq = 64;
  int64_t vocab = 256;
  int64_t batch = 8;
  double ropeTheta = 10000.0;
  double rmsNormEps = 1e-5;
  bool tieEmbeddings = false;
  ::ptc::FloatDtype dtype = ::ptc::FloatDtype::F32;
  /// MoE MLPs as Mixtral: SwiGLU experts w1 (gate) and w3 (up) [E, ffn, h],
  /// w2 (down) [E, h, ffn], router `block_sparse_moe.gate`.
  MoeLayersConfig moe;
  /// Packed documents (GptConfig::documentEnd): rotary at the positions.
  int64_t documentEnd = -1;
};
llvm::Error validateLlamaConfig(const LlamaConfig &config);
/// Parameters in Hugging Face's names, order and [out, in] layouts.
std::vector<TensorSpec> llamaParameters(const LlamaConfig &config);
/// Hugging Face's config.json of a dense Llama (LlamaForCausalLM, whose
/// names and layouts llamaParameters are), as indented JSON text. Not for
/// MoE layers: ptc stacks each layer's experts into one tensor where Hugging
/// Face's Mixtral keeps one per expert.
std::string llamaHfConfig(const LlamaConfig &config);
llvm::Expected<OwningOpRef<ModuleOp>> buildLlamaModel(MLIRContext &context,
                                                      const LlamaConfig &config);

/// Published shapes of real models (`ptc-model gpt|llama --preset NAME`).
struct ModelPreset {
  const char *name;
  const char *model; ///< "gpt" or "llama"
  const char *source;
  int64_t layers, hidden, heads, kvHeads, intermediate, seq, vocab;
  double ropeTheta, rmsNormEps;
  bool tieEmbeddings;
  int64_t experts = 0, topK = 0; ///< MoE MLPs in every layer (Mixtral), 0: dense
};
const std::vector<ModelPreset> &modelPresets();
/// The preset `name` of `model`, or null.
const ModelPreset *findModelPreset(StringRef model, StringRef name);
/// "gpt: gpt2, gpt2-medium, ...; llama: llama2-7b, ...": the presets by builder, for help texts.
std::string describePresets();

struct MlpConfig {
  int64_t layers = 3; ///< linear layers; ReLU between consecutive ones
  int64_t input = 64;
  int64_t hidden = 128;
  int64_t classes = 10;
  int64_t batch = 32;
  ::ptc::FloatDtype dtype = ::ptc::FloatDtype::F32;
};
llvm::Error validateMlpConfig(const MlpConfig &config);
std::vector<TensorSpec> mlpParameters(const MlpConfig &config);
llvm::Expected<OwningOpRef<ModuleOp>> buildMlpModel(MLIRContext &context,
                                                    const MlpConfig &config);

struct MoeConfig {
  int64_t input = 64;   ///< model dimension
  int64_t hidden = 128; ///< expert MLP hidden dimension
  int64_t experts = 4;
  int64_t topK = 2;
  double capacityFactor = 1.25;
  int64_t classes = 10;
  int64_t batch = 32; ///< tokens per step
  int64_t groups = 1; ///< routing groups (each batch / groups consecutive tokens)
  ::ptc::FloatDtype dtype = ::ptc::FloatDtype::F32;
};
llvm::Error validateMoeConfig(const MoeConfig &config);
/// Slots per expert per group: ceil(capacityFactor * (batch / groups) * topK / experts).
int64_t moeCapacity(const MoeConfig &config);
std::vector<TensorSpec> moeParameters(const MoeConfig &config);
llvm::Expected<OwningOpRef<ModuleOp>> buildMoeModel(MLIRContext &context,
                                                    const MoeConfig &config);

/// The builders' configurations from the keys given (models/ModelKeys.h):
/// the preset's shapes, then each key given, then the builder's defaults;
/// checked as the builder checks them (the error names the flag).
/// An error naming the builder's presets when `args` names a preset
/// `builder` does not have (a usage error: ptc-model exits 2).
llvm::Error checkPreset(const ::ptc::models::ModelArgs &args, ::ptc::BuilderKind builder);
llvm::Expected<GptConfig> gptConfigFrom(const ::ptc::models::ModelArgs &args);
llvm::Expected<LlamaConfig> llamaConfigFrom(const ::ptc::models::ModelArgs &args);
llvm::Expected<MlpConfig> mlpConfigFrom(const ::ptc::models::ModelArgs &args);
llvm::Expected<MoeConfig> moeConfigFrom(const ::ptc::models::ModelArgs &args);

/// A built model and its parameters (names and shapes, in argument order).
struct BuiltModel {
  OwningOpRef<ModuleOp> module;
  std::vector<TensorSpec> parameters;
};
/// Builds `builder`'s model from the keys given.
llvm::Expected<BuiltModel> buildModel(MLIRContext &context, ::ptc::BuilderKind builder,
                                      const ::ptc::models::ModelArgs &args);

} // namespace mlir::ptc

#endif // PTC_MODELS_MODELS_H
