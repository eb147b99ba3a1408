//===- GptModel.cpp - the standard GPT (nanoGPT model.py) -----------------===//
//
// Token + learned position embeddings, pre-LayerNorm blocks (LayerNorm with
// bias, eps 1e-5), causal multi-head attention with biases, MLP 4h with exact
// GELU, final LayerNorm, LM head tied to the token embedding, no dropout, mean
// cross-entropy over all positions.
//
//===----------------------------------------------------------------------===//

#include "models/ModelBuilder.h"

#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ptc;

llvm::Error mlir::ptc::validateDocumentEnd(int64_t documentEnd, int64_t vocab, const char *model) {
  if (documentEnd < -1 || documentEnd >= vocab)
    return llvm::createStringError("%s: --document-end %lld is not a token id of the vocabulary "
                                   "[0, %lld) (-1: no packed documents)",
                                   model, static_cast<long long>(documentEnd),
                                   static_cast<long long>(vocab));
  return llvm::Error::success();
}

llvm::Error mlir::ptc::validateGptConfig(const GptConfig &c) {
  auto positive = [](int64_t v, const char *name) -> llvm::Error {
    if (v < 1)
      return llvm::createStringError("gpt: --%s must be at least 1, got %lld", name,
                                     static_cast<long long>(v));
    return llvm::Error::success();
  };
  for (auto [v, name] : {std::pair{c.layers, "layers"}, std::pair{c.hidden, "hidden"},
                         std::pair{c.heads, "heads"}, std::pair{c.seq, "seq"},
                         std::pair{c.vocab, "vocab"}, std::pair{c.batch, "batch"}})
    if (llvm::Error e = positive(v, name))
      return e;
  if (c.hidden % c.heads != 0)
    return llvm::createStringError("gpt: --hidden %lld is not divisible by --heads %lld",
                                   static_cast<long long>(c.hidden),
                                   static_cast<long long>(c.heads));
  if (c.vocab > 2147483647)
    return llvm::createStringError("gpt: --vocab %lld exceeds 2^31 - 1 (ids are int32)",
                                   static_cast<long long>(c.vocab));
  if (llvm::Error e = validateDocumentEnd(c.documentEnd, c.vocab, "gpt"))
    return e;
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    return llvm::createStringError("gpt: --dropout must be in [0, 1), got %g", c.dropout);
  return validateMoeLayers(c.moe, "gpt");
}

std::vector<TensorSpec> mlir::ptc::gptParameters(const GptConfig &c) {
  // nanoGPT's initialization: N(0, 0.02) for embeddings and linear weights,
  // N(0, 0.02/sqrt(2*layers)) for the projections into the residual stream,
  // zero biases, LayerNorm weight 1 and bias 0.
  const int64_t h = c.hidden;
  const std::string normal = "normal:0.02";
  const std::string residual =
      "normal:" + std::to_string(0.02 / std::sqrt(2.0 * static_cast<double>(c.layers)));
  std::vector<TensorSpec> p;
  p.push_back({"transformer.wte.weight", {c.vocab, h}, normal});
  p.push_back({"transformer.wpe.weight", {c.seq, h}, normal});
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string l = "transformer.h." + std::to_string(i) + ".";
    p.push_back({l + "ln_1.weight", {h}, "ones"});
    p.push_back({l + "ln_1.bias", {h}, "zeros"});
    p.push_back({l + "attn.c_attn.weight", {3 * h, h}, normal});
    p.push_back({l + "attn.c_attn.bias", {3 * h}, "zeros"});
    p.push_back({l + "attn.c_proj.weight", {h, h}, residual});
    p.push_back({l + "attn.c_proj.bias", {h}, "zeros"});
    p.push_back({l + "ln_2.weight", {h}, "ones"});
    p.push_back({l + "ln_2.bias", {h}, "zeros"});
    if (c.moe.isMoeLayer(i)) {
      // Experts stacked along dimension 0: experts.c_fc.weight[j] is expert
      // j's c_fc.weight ([out, in], as the dense MLP's).
      const int64_t e = c.moe.experts, f = c.moe.ffn > 0 ? c.moe.ffn : 4 * h;
      p.push_back({l + "mlp.router.weight", {e, h}, normal});
      p.push_back({l + "mlp.experts.c_fc.weight", {e, f, h}, normal, e});
      p.push_back({l + "mlp.experts.c_fc.bias", {e, f}, "zeros", e});
      p.push_back({l + "mlp.experts.c_proj.weight", {e, h, f}, residual, e});
      p.push_back({l + "mlp.experts.c_proj.bias", {e, h}, "zeros", e});
      if (c.moe.sharedExperts > 0) { // DeepSeek's shared experts: one dense MLP of N x ffn
        const int64_t fs = c.moe.sharedExperts * f;
        p.push_back({l + "mlp.shared_experts.c_fc.weight", {fs, h}, normal});
        p.push_back({l + "mlp.shared_experts.c_fc.bias", {fs}, "zeros"});
        p.push_back({l + "mlp.shared_experts.c_proj.weight", {h, fs}, residual});
        p.push_back({l + "mlp.shared_experts.c_proj.bias", {h}, "zeros"});
      }
      continue;
    }
    p.push_back({l + "mlp.c_fc.weight", {4 * h, h}, normal});
    p.push_back({l + "mlp.c_fc.bias", {4 * h}, "zeros"});
    p.push_back({l + "mlp.c_proj.weight", {h, 4 * h}, residual});
    p.push_back({l + "mlp.c_proj.bias", {h}, "zeros"});
  }
  p.push_back({"transformer.ln_f.weight", {h}, "ones"});
  p.push_back({"transformer.ln_f.bias", {h}, "zeros"});
  return p;
}

namespace {
Value layerNorm(ModelBuilder &m, Value x, const std::string &prefix) {
  return LayerNormOp::create(m.builder(), m.loc(prefix), x.getType(), x,
                             m.param(prefix + ".weight"), m.param(prefix + ".bias"),
                             m.builder().getF64FloatAttr(1e-5));
}

Value attention(ModelBuilder &m, const GptConfig &c, Value x, Value positions,
                const std::string &prefix) {
  OpBuilder &b = m.builder();
  const int64_t B = c.batch, S = c.seq, H = c.hidden, A = c.heads, D = H / A;
  Location loc = m.loc(prefix);
  Type et = m.floatType();
  Value qkv = m.linear(x, prefix + ".c_attn"); // [B, S, 3H]
  auto headsOf = [&](int64_t part) {
    auto sliceType = RankedTensorType::get({B, S, H}, et);
    Value s = SliceOp::create(b, loc, sliceType, qkv, b.getDenseI64ArrayAttr({0, 0, part * H}));
    Value r = m.reshape(s, {B, S, A, D}, loc);
    return TransposeOp::create(b, loc, r, ArrayRef<int64_t>{0, 2, 1, 3}).getResult(); // [B,A,S,D]
  };
  Value q = headsOf(0), k = headsOf(1), v = headsOf(2);
  Value y = CausalAttentionOp::create(b, loc, q.getType(), /*stats=*/Type(), q, k, v, positions,
                                      /*scale=*/FloatAttr())
                .getResult();
  y = TransposeOp::create(b, loc, y, ArrayRef<int64_t>{0, 2, 1, 3}); // [B,S,A,D]
  y = m.reshape(y, {B, S, H}, loc);
  return m.linear(y, prefix + ".c_proj");
}

Value mlp(ModelBuilder &m, Value x, const std::string &prefix) {
  Value h = m.linear(x, prefix + ".c_fc");
  h = GeluOp::create(m.builder(), m.loc(prefix), h);
  return m.linear(h, prefix + ".c_proj");
}

/// The MoE MLP: GELU experts shaped like the dense MLP (plus the shared
/// experts' dense MLP on every token).
Value moeMlp(ModelBuilder &m, const GptConfig &c, Value x, const std::string &prefix,
             Value &auxLoss) {
  Value routed = m.moeLayer(x, c.moe, prefix + ".router",
                    [&](Value h) {
                      h = m.expertLinear(h, prefix + ".experts.c_fc", true);
                      h = GeluOp::create(m.builder(), m.loc(prefix), h);
                      return m.expertLinear(h, prefix + ".experts.c_proj", true);
                    },
                    auxLoss);
  if (c.moe.sharedExperts == 0)
    return routed;
  return AddOp::create(m.builder(), m.loc(prefix), routed, mlp(m, x, prefix + ".shared_experts"));
}
} // namespace

llvm::Expected<OwningOpRef<ModuleOp>> mlir::ptc::buildGptModel(MLIRContext &context,
                                                               const GptConfig &c) {
  if (llvm::Error e = validateGptConfig(c))
    return std::move(e);
  Type ftype = floatType(context, c.dtype);
  const bool documents = c.documentEnd >= 0;
  ModelBuilder m(context, ftype, gptParameters(c),
                 ModelBuilder::tokenInputs(context, c.batch, c.seq, documents));
  OpBuilder &b = m.builder();
  Value positions = documents ? m.input("positions") : Value();

  Value x = EmbeddingOp::create(b, m.loc("transformer.wte"), m.param("transformer.wte.weight"),
                                m.input("tokens"));
  if (documents) {
    // Packed documents: each token's row of the position table, by its
    // position in its document.
    x = AddOp::create(b, m.loc("transformer.wpe"), x,
                      EmbeddingOp::create(b, m.loc("transformer.wpe"),
                                          m.param("transformer.wpe.weight"), positions));
  } else {
    // The position table has exactly `seq` rows, so it broadcasts over the batch.
    x = AddOp::create(b, m.loc("transformer.wpe"), x, m.param("transformer.wpe.weight"));
  }
  // Each dropout draws from its own stream, numbered in program order.
  int64_t streams = 0;
  auto dropout = [&](Value v, const std::string &where) -> Value {
    if (c.dropout <= 0.0)
      return v;
    return DropoutOp::create(b, m.loc(where), v, b.getF64FloatAttr(c.dropout),
                             b.getI64IntegerAttr(streams++), ShardingAttr());
  };
  x = dropout(x, "transformer.drop");
  Value auxLoss;
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string l = "transformer.h." + std::to_string(i);
    x = AddOp::create(b, m.loc(l), x,
                      dropout(attention(m, c, layerNorm(m, x, l + ".ln_1"), positions,
                                        l + ".attn"),
                              l + ".attn.resid_dropout"));
    Value h = layerNorm(m, x, l + ".ln_2");
    x = AddOp::create(b, m.loc(l), x,
                      dropout(c.moe.isMoeLayer(i) ? moeMlp(m, c, h, l + ".mlp", auxLoss)
                                                  : mlp(m, h, l + ".mlp"),
                              l + ".mlp.dropout"));
  }
  x = layerNorm(m, x, "transformer.ln_f");
  // LM head tied to the token embedding: logits = x @ wte^T.
  Value logits = MatmulOp::create(b, m.loc("lm_head"), x, m.param("transformer.wte.weight"),
                                  /*transposeLhs=*/false, /*transposeRhs=*/true);
  Value loss = CrossEntropyOp::create(b, m.loc("loss"), logits, m.input("targets"));
  auto module = m.finish(m.addAuxLoss(loss, auxLoss));
  if (!module)
    return module;
  // nanoGPT's state_dict also names the tied head; packed documents name
  // their boundary token (ptc-run fills 'positions' from it).
  llvm::json::Object info;
  info["tied"] = llvm::json::Object{{"lm_head.weight", "transformer.wte.weight"}};
  if (documents)
    info["document_end"] = c.documentEnd;
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(info));
  (**module)->setAttr(PtcDialect::kModelInfoAttrName, StringAttr::get(&context, text));
  return module;
}
