//===- LlamaModel.cpp - Llama-family decoders (Hugging Face LlamaForCausalLM) ===//
//
// Token embedding, pre-RMSNorm blocks (weight only, eps configurable),
// causal grouped-query attention with rotary position embeddings on q and k
// (rotate_half convention), SwiGLU MLP down(silu(gate(x)) * up(x)), no biases
// anywhere, final RMSNorm, LM head untied unless --tie-embeddings, mean
// cross-entropy. Parameter names and [out, in] layouts are Hugging Face's, so
// safetensors weights move between ptc and transformers unchanged.
//
//===----------------------------------------------------------------------===//

#include "models/ModelBuilder.h"

#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::ptc;

llvm::Error mlir::ptc::validateLlamaConfig(const LlamaConfig &c) {
  for (auto [v, name] : {std::pair{c.layers, "layers"}, std::pair{c.hidden, "hidden"},
                         std::pair{c.heads, "heads"}, std::pair{c.kvHeads, "kv-heads"},
                         std::pair{c.intermediate, "intermediate"}, std::pair{c.seq, "seq"},
                         std::pair{c.vocab, "vocab"}, std::pair{c.batch, "batch"}})
    if (v < 1)
      return llvm::createStringError("llama: --%s must be at least 1, got %lld", name,
                                     static_cast<long long>(v));
  if (llvm::Error e = validateDocumentEnd(c.documentEnd, c.vocab, "llama"))
    return e;
  if (c.hidden % c.heads != 0)
    return llvm::createStringError("llama: --hidden %lld is not divisible by --heads %lld",
                                   static_cast<long long>(c.hidden),
                                   static_cast<long long>(c.heads));
  if ((c.hidden / c.heads) % 2 != 0)
    return llvm::createStringError(
        "llama: the head dimension (--hidden / --heads = %lld) must be even for rotary "
        "embeddings",
        static_cast<long long>(c.hidden / c.heads));
  if (c.heads % c.kvHeads != 0)
    return llvm::createStringError(
        "llama: --kv-heads %lld does not divide --heads %lld (each key/value head serves "
        "heads/kv-heads query heads)",
        static_cast<long long>(c.kvHeads), static_cast<long long>(c.heads));
  if (!(c.ropeTheta > 1.0))
    return llvm::createStringError("llama: --rope-theta must be greater than 1, got %g",
                                   c.ropeTheta);
  if (!(c.rmsNormEps > 0.0))
    return llvm::createStringError("llama: --rms-norm-eps must be positive, got %g",
                                   c.rmsNormEps);
  if (c.vocab > (int64_t{1} << 31) - 1)
    return llvm::createStringError("llama: --vocab %lld does not fit i32 token ids",
                                   static_cast<long long>(c.vocab));
  return validateMoeLayers(c.moe, "llama");
}

std::vector<TensorSpec> mlir::ptc::llamaParameters(const LlamaConfig &c) {
  // Hugging Face's LlamaPreTrainedModel._init_weights: N(0, initializer_range
  // = 0.02) for embeddings and linear weights, RMSNorm weights 1.
  const int64_t h = c.hidden, d = c.hidden / c.heads, kv = c.kvHeads * d, f = c.intermediate;
  const std::string normal = "normal:0.02";
  std::vector<TensorSpec> p;
  p.push_back({"model.embed_tokens.weight", {c.vocab, h}, normal});
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string l = "model.layers." + std::to_string(i) + ".";
    p.push_back({l + "input_layernorm.weight", {h}, "ones"});
    p.push_back({l + "self_attn.q_proj.weight", {h, h}, normal});
    p.push_back({l + "self_attn.k_proj.weight", {kv, h}, normal});
    p.push_back({l + "self_attn.v_proj.weight", {kv, h}, normal});
    p.push_back({l + "self_attn.o_proj.weight", {h, h}, normal});
    p.push_back({l + "post_attention_layernorm.weight", {h}, "ones"});
    if (c.moe.isMoeLayer(i)) {
      // Mixtral's names; experts stacked along dimension 0:
      // block_sparse_moe.experts.w1.weight[j] is Hugging Face's
      // block_sparse_moe.experts.{j}.w1.weight (w2, w3 alike).
      const int64_t e = c.moe.experts, fe = c.moe.ffn > 0 ? c.moe.ffn : f;
      std::string moe = l + "block_sparse_moe.";
      p.push_back({moe + "gate.weight", {e, h}, normal});
      p.push_back({moe + "experts.w1.weight", {e, fe, h}, normal, e});
      p.push_back({moe + "experts.w2.weight", {e, h, fe}, normal, e});
      p.push_back({moe + "experts.w3.weight", {e, fe, h}, normal, e});
      if (c.moe.sharedExperts > 0) { // DeepSeek's shared experts: one SwiGLU MLP of N x ffn
        const int64_t fs = c.moe.sharedExperts * fe;
        p.push_back({moe + "shared_experts.gate_proj.weight", {fs, h}, normal});
        p.push_back({moe + "shared_experts.up_proj.weight", {fs, h}, normal});
        p.push_back({moe + "shared_experts.down_proj.weight", {h, fs}, normal});
      }
      continue;
    }
    p.push_back({l + "mlp.gate_proj.weight", {f, h}, normal});
    p.push_back({l + "mlp.up_proj.weight", {f, h}, normal});
    p.push_back({l + "mlp.down_proj.weight", {h, f}, normal});
  }
  p.push_back({"model.norm.weight", {h}, "ones"});
  if (!c.tieEmbeddings)
    p.push_back({"lm_head.weight", {c.vocab, h}, normal});
  return p;
}

namespace {
Value rmsNorm(ModelBuilder &m, const LlamaConfig &c, Value x, const std::string &name) {
  return RmsNormOp::create(m.builder(), m.loc(name), x.getType(), x, m.param(name + ".weight"),
                           m.builder().getF64FloatAttr(c.rmsNormEps));
}

Value attention(ModelBuilder &m, const LlamaConfig &c, Value x, Value positions,
                const std::string &prefix) {
  OpBuilder &b = m.builder();
  const int64_t B = c.batch, S = c.seq, H = c.hidden, A = c.heads, KV = c.kvHeads, D = H / A;
  Location loc = m.loc(prefix);
  // [B, S, n*D] -> [B, n, S, D], rotated when `rotate`.
  auto heads = [&](const std::string &proj, int64_t n, bool rotate) {
    Value y = m.linear(x, prefix + "." + proj, /*bias=*/false);
    y = m.reshape(y, {B, S, n, D}, loc);
    y = TransposeOp::create(b, loc, y, ArrayRef<int64_t>{0, 2, 1, 3});
    // Packed documents: each row turns by its position in its document.
    if (rotate && positions)
      y = RotaryAtOp::create(b, loc, y.getType(), y, positions, b.getF64FloatAttr(c.ropeTheta),
                             b.getBoolAttr(false), b.getBoolAttr(false));
    else if (rotate)
      y = RotaryOp::create(b, loc, y.getType(), y, b.getF64FloatAttr(c.ropeTheta),
                           b.getBoolAttr(false), StringAttr(), b.getBoolAttr(false));
    return y;
  };
  Value q = heads("q_proj", A, true), k = heads("k_proj", KV, true), v = heads("v_proj", KV, false);
  Value y = CausalAttentionOp::create(b, loc, q.getType(), /*stats=*/Type(), q, k, v, positions,
                                      /*scale=*/FloatAttr())
                .getResult();
  y = TransposeOp::create(b, loc, y, ArrayRef<int64_t>{0, 2, 1, 3}); // [B,S,A,D]
  y = m.reshape(y, {B, S, H}, loc);
  return m.linear(y, prefix + ".o_proj", /*bias=*/false);
}

Value mlp(ModelBuilder &m, Value x, const std::string &prefix) {
  Value gate = SiluOp::create(m.builder(), m.loc(prefix), m.linear(x, prefix + ".gate_proj", false));
  Value up = m.linear(x, prefix + ".up_proj", false);
  Value h = MulOp::create(m.builder(), m.loc(prefix), gate, up);
  return m.linear(h, prefix + ".down_proj", false);
}

/// Mixtral's sparse MoE block: SwiGLU experts w2(silu(w1 x) * w3 x).
Value moeBlock(ModelBuilder &m, const LlamaConfig &c, Value x, const std::string &prefix,
               Value &auxLoss) {
  Value routed = m.moeLayer(x, c.moe, prefix + ".gate",
                    [&](Value h) {
                      OpBuilder &b = m.builder();
                      Location l = m.loc(prefix);
                      Value gate = SiluOp::create(b, l, m.expertLinear(h, prefix + ".experts.w1", false));
                      Value up = m.expertLinear(h, prefix + ".experts.w3", false);
                      return m.expertLinear(MulOp::create(b, l, gate, up), prefix + ".experts.w2",
                                            false);
                    },
                    auxLoss);
  if (c.moe.sharedExperts == 0)
    return routed;
  return AddOp::create(m.builder(), m.loc(prefix), routed, mlp(m, x, prefix + ".shared_experts"));
}
} // namespace

llvm::Expected<OwningOpRef<ModuleOp>> mlir::ptc::buildLlamaModel(MLIRContext &context,
                                                                 const LlamaConfig &c) {
  if (llvm::Error e = validateLlamaConfig(c))
    return std::move(e);
  Type ftype = floatType(context, c.dtype);
  const bool documents = c.documentEnd >= 0;
  ModelBuilder m(context, ftype, llamaParameters(c),
                 ModelBuilder::tokenInputs(context, c.batch, c.seq, documents));
  OpBuilder &b = m.builder();
  Value positions = documents ? m.input("positions") : Value();

  Value x = EmbeddingOp::create(b, m.loc("model.embed_tokens"),
                                m.param("model.embed_tokens.weight"), m.input("tokens"));
  Value auxLoss;
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string l = "model.layers." + std::to_string(i);
    x = AddOp::create(b, m.loc(l), x,
                      attention(m, c, rmsNorm(m, c, x, l + ".input_layernorm"), positions,
                                l + ".self_attn"));
    Value h = rmsNorm(m, c, x, l + ".post_attention_layernorm");
    x = AddOp::create(b, m.loc(l), x,
                      c.moe.isMoeLayer(i) ? moeBlock(m, c, h, l + ".block_sparse_moe", auxLoss)
                                          : mlp(m, h, l + ".mlp"));
  }
  x = rmsNorm(m, c, x, "model.norm");
  Value head = m.param(c.tieEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  Value logits = MatmulOp::create(b, m.loc("lm_head"), x, head, /*transposeLhs=*/false,
                                  /*transposeRhs=*/true);
  Value loss = CrossEntropyOp::create(b, m.loc("loss"), logits, m.input("targets"));
  auto module = m.finish(m.addAuxLoss(loss, auxLoss));
  if (!module)
    return module;
  // What a saved folder needs: config.json (dense models), the tied head.
  llvm::json::Object info;
  if (!c.moe.enabled())
    info["hf_config"] = llamaHfConfig(c) + "\n"; // the text, as --hf-config writes it
  if (c.tieEmbeddings)
    info["tied"] = llvm::json::Object{{"lm_head.weight", "model.embed_tokens.weight"}};
  if (documents)
    info["document_end"] = c.documentEnd; // ptc-run fills 'positions' from it
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(info));
  (**module)->setAttr(PtcDialect::kModelInfoAttrName, StringAttr::get(&context, text));
  return module;
}

std::string mlir::ptc::llamaHfConfig(const LlamaConfig &c) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attributeArray("architectures", [&] { j.value("LlamaForCausalLM"); });
    j.attribute("model_type", "llama");
    j.attribute("hidden_size", c.hidden);
    j.attribute("intermediate_size", c.intermediate);
    j.attribute("num_hidden_layers", c.layers);
    j.attribute("num_attention_heads", c.heads);
    j.attribute("num_key_value_heads", c.kvHeads);
    j.attribute("head_dim", c.hidden / c.heads);
    j.attribute("vocab_size", c.vocab);
    j.attribute("max_position_embeddings", c.seq);
    j.attribute("rope_theta", c.ropeTheta);
    j.attribute("rms_norm_eps", c.rmsNormEps);
    j.attribute("tie_word_embeddings", c.tieEmbeddings);
    j.attribute("hidden_act", "silu");
    j.attribute("attention_bias", false);
    j.attribute("mlp_bias", false);
    j.attribute("torch_dtype", c.dtype == ::ptc::FloatDtype::Bf16  ? "bfloat16"
                               : c.dtype == ::ptc::FloatDtype::F16 ? "float16"
                                                                   : "float32");
  });
  return text;
}
