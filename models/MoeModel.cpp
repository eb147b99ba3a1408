//===- MoeModel.cpp - a mixture-of-experts classifier ---------------------===//
//
// x [tokens, d], routed in `groups` groups of consecutive tokens -> router
// (top-k gate over softmax(x @ gate^T)) -> dispatch to [experts, groups,
// capacity, d] -> per-expert MLP (d -> hidden -> d, GELU) -> weighted combine
// -> residual add -> linear head -> mean cross-entropy.
//
//===----------------------------------------------------------------------===//

#include "models/ModelBuilder.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::ptc;

llvm::Error mlir::ptc::validateMoeConfig(const MoeConfig &c) {
  for (auto [v, name] : {std::pair{c.input, "input"}, std::pair{c.hidden, "hidden"},
                         std::pair{c.experts, "experts"}, std::pair{c.topK, "top-k"},
                         std::pair{c.classes, "classes"}, std::pair{c.batch, "batch"},
                         std::pair{c.groups, "groups"}})
    if (v < 1)
      return llvm::createStringError("moe: --%s must be at least 1, got %lld", name,
                                     static_cast<long long>(v));
  if (c.topK > c.experts)
    return llvm::createStringError("moe: --top-k %lld exceeds --experts %lld",
                                   static_cast<long long>(c.topK),
                                   static_cast<long long>(c.experts));
  if (c.batch % c.groups != 0)
    return llvm::createStringError("moe: --groups %lld does not divide --batch %lld",
                                   static_cast<long long>(c.groups),
                                   static_cast<long long>(c.batch));
  if (!(c.capacityFactor > 0.0))
    return llvm::createStringError("moe: --capacity-factor must be positive, got %g",
                                   c.capacityFactor);
  return llvm::Error::success();
}

int64_t mlir::ptc::moeCapacity(const MoeConfig &c) {
  double slots = c.capacityFactor * static_cast<double>(c.batch / c.groups * c.topK) /
                 static_cast<double>(c.experts);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots)));
}

std::vector<TensorSpec> mlir::ptc::moeParameters(const MoeConfig &c) {
  auto fanIn = [](int64_t n) {
    return "normal:" + std::to_string(1.0 / std::sqrt(static_cast<double>(n)));
  };
  return {{"router.weight", {c.experts, c.input}, "normal:0.02"},
          {"experts.w_in", {c.experts, c.input, c.hidden}, fanIn(c.input), c.experts},
          {"experts.w_out", {c.experts, c.hidden, c.input}, fanIn(c.hidden), c.experts},
          {"head.weight", {c.classes, c.input}, fanIn(c.input)},
          {"head.bias", {c.classes}, "zeros"}};
}

llvm::Expected<OwningOpRef<ModuleOp>> mlir::ptc::buildMoeModel(MLIRContext &context,
                                                               const MoeConfig &c) {
  if (llvm::Error e = validateMoeConfig(c))
    return std::move(e);
  Type ftype = floatType(context, c.dtype);
  Type i32 = IntegerType::get(&context, 32);
  ModelBuilder m(context, ftype, moeParameters(c),
                 {{{"x", {c.batch, c.input}}, ftype}, {{"labels", {c.batch}}, i32}});
  OpBuilder &b = m.builder();
  Location loc = m.loc("experts");
  const int64_t capacity = moeCapacity(c);

  const int64_t G = c.groups, T = c.batch / c.groups, E = c.experts;
  Value x = m.input("x");
  Value xg = m.reshape(x, {G, T, c.input}, loc);
  Value logits = m.linear(xg, "router", /*bias=*/false); // [G, T, E]
  auto gate = TopKGateOp::create(b, m.loc("router"), RankedTensorType::get({G, T, c.topK}, ftype),
                                 RankedTensorType::get({G, T, c.topK}, i32), logits, Value(),
                                 b.getI64IntegerAttr(c.topK), b.getBoolAttr(true));
  Value buffers = MoeDispatchOp::create(
      b, loc, RankedTensorType::get({E, G, capacity, c.input}, ftype), xg, gate.getIndices());
  Value h = m.reshape(buffers, {E, G * capacity, c.input}, loc);
  h = MatmulOp::create(b, loc, h, m.param("experts.w_in")); // [E, G*C, hidden]
  h = GeluOp::create(b, loc, h);
  Value out = MatmulOp::create(b, loc, h, m.param("experts.w_out")); // [E, G*C, d]
  out = m.reshape(out, {E, G, capacity, c.input}, loc);
  Value combined = MoeCombineOp::create(b, loc, RankedTensorType::get({G, T, c.input}, ftype),
                                        out, gate.getWeights(), gate.getIndices());
  Value y = AddOp::create(b, loc, x, m.reshape(combined, {c.batch, c.input}, loc));
  Value classLogits = m.linear(y, "head");
  return m.finish(CrossEntropyOp::create(b, m.loc("loss"), classLogits, m.input("labels")));
}

//===----------------------------------------------------------------------===//
// MoE MLPs inside transformers (gpt and llama --moe-experts)
//===----------------------------------------------------------------------===//

llvm::Error mlir::ptc::validateMoeLayers(const MoeLayersConfig &c, const char *model) {
  if (!c.enabled())
    return llvm::Error::success();
  for (auto [v, name] : {std::pair{c.experts, "moe-experts"}, std::pair{c.topK, "moe-top-k"},
                         std::pair{c.every, "moe-every"}})
    if (v < 1)
      return llvm::createStringError("%s: --%s must be at least 1, got %lld", model, name,
                                     static_cast<long long>(v));
  if (c.topK > c.experts)
    return llvm::createStringError("%s: --moe-top-k %lld exceeds --moe-experts %lld", model,
                                   static_cast<long long>(c.topK),
                                   static_cast<long long>(c.experts));
  if (c.sharedExperts < 0)
    return llvm::createStringError("%s: --moe-shared-experts must be >= 0, got %lld", model,
                                   static_cast<long long>(c.sharedExperts));
  if (c.ffn < 0)
    return llvm::createStringError("%s: --moe-ffn must be positive (0: the dense MLP's size), "
                                   "got %lld",
                                   model, static_cast<long long>(c.ffn));
  if (!(c.capacityFactor >= 0.0) || std::isinf(c.capacityFactor))
    return llvm::createStringError("%s: --moe-capacity-factor must be >= 0 (0: dropless), got %g",
                                   model, c.capacityFactor);
  if (!(c.biasBalancing >= 0.0) || std::isinf(c.biasBalancing))
    return llvm::createStringError("%s: --moe-bias-balancing must be >= 0 (0: off), got %g", model,
                                   c.biasBalancing);
  if (!(c.auxLoss >= 0.0) || !(c.zLoss >= 0.0))
    return llvm::createStringError("%s: --moe-aux-loss and --moe-z-loss must be >= 0, got %g "
                                   "and %g",
                                   model, c.auxLoss, c.zLoss);
  return llvm::Error::success();
}

int64_t mlir::ptc::moeLayerCapacity(const MoeLayersConfig &c, int64_t tokens) {
  if (c.capacityFactor == 0.0)
    return tokens; // dropless: an expert gets each token of the group at most once
  double slots = c.capacityFactor * static_cast<double>(tokens * c.topK) /
                 static_cast<double>(c.experts);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(slots)), 1, tokens);
}

Value ModelBuilder::addAuxLoss(Value loss, Value auxLoss) {
  if (!auxLoss)
    return loss;
  if (auxLoss.getType() != loss.getType())
    auxLoss = ConvertOp::create(b, loc("loss"), loss.getType(), auxLoss);
  addMetric("moe.aux_loss", auxLoss);
  auto total = AddOp::create(b, loc("loss"), loss, auxLoss);
  total->setAttr(PtcDialect::kKeepF32AttrName, b.getUnitAttr()); // the loss stays f32
  return total;
}

Value ModelBuilder::moeLayer(Value x, const MoeLayersConfig &moe, StringRef router,
                             const std::function<Value(Value)> &expertMlp, Value &auxLoss) {
  auto xt = cast<RankedTensorType>(x.getType());
  const int64_t B = xt.getDimSize(0), S = xt.getDimSize(1), H = xt.getDimSize(2);
  const int64_t E = moe.experts, K = moe.topK, C = moeLayerCapacity(moe, S);
  Location l = loc(router);
  Type f32 = b.getF32Type();
  auto toF32 = [&](Value v) -> Value {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getElementType() == f32)
      return v;
    return ConvertOp::create(b, l, RankedTensorType::get(t.getShape(), f32), v);
  };
  // Router in f32: logits [B, S, E], one routing group per sequence.
  auto routerMatmul = MatmulOp::create(b, l, toF32(x), toF32(param((router + ".weight").str())),
                                       /*transposeLhs=*/false, /*transposeRhs=*/true);
  routerMatmul->setAttr(PtcDialect::kKeepF32AttrName, b.getUnitAttr()); // under precision=bf16 too
  Value logits = routerMatmul;
  // Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the
  // selection scores, nudged by ptc-optimizer after each step against this
  // layer's measured load (the tokens_per_expert metric below).
  StringRef layer = router.rsplit('.').first;
  Value selectionBias;
  if (moe.biasBalancing > 0.0)
    selectionBias = addState(
        (router + ".expert_bias").str(), RankedTensorType::get({E}, f32),
        {b.getNamedAttr(PtcDialect::kBiasBalancingAttrName,
                        b.getDictionaryAttr(
                            {b.getNamedAttr("load", b.getStringAttr(layer + ".tokens_per_expert")),
                             b.getNamedAttr("rate", b.getF64FloatAttr(moe.biasBalancing))}))});
  auto gate = TopKGateOp::create(b, l, RankedTensorType::get({B, S, K}, f32),
                                 RankedTensorType::get({B, S, K}, b.getI32Type()), logits,
                                 selectionBias, b.getI64IntegerAttr(K), b.getBoolAttr(true));
  Value buffers = MoeDispatchOp::create(b, l, RankedTensorType::get({E, B, C, H}, ftype), x,
                                        gate.getIndices());
  Value y = expertMlp(reshape(buffers, {E, B * C, H}, l)); // [E, B*C, H]
  y = reshape(y, {E, B, C, H}, l);
  Value weights = gate.getWeights();
  if (ftype != f32)
    weights = ConvertOp::create(b, l, RankedTensorType::get({B, S, K}, ftype), weights);
  Value out = MoeCombineOp::create(b, l, xt, y, weights, gate.getIndices());

  // The auxiliary losses are small [groups, tokens, experts] computations:
  // in f32 under precision=bf16 too.
  auto f32Op = [&](Value v) {
    v.getDefiningOp()->setAttr(PtcDialect::kKeepF32AttrName, b.getUnitAttr());
    return v;
  };
  auto reduce = [&](auto tag, Value v, ArrayRef<int64_t> axes, bool keep) -> Value {
    using OpT = decltype(tag);
    RankedTensorType type =
        *inferReduceType(cast<RankedTensorType>(v.getType()), axes, keep, [&] { return emitError(l); });
    return f32Op(OpT::create(b, l, type, v, b.getDenseI64ArrayAttr(axes), b.getBoolAttr(keep)));
  };
  auto accumulate = [&](Value term) {
    auxLoss = auxLoss ? f32Op(AddOp::create(b, l, auxLoss, term)) : term;
  };
  // f[g, e]: the fraction of group g's S * K assignments routed to expert e.
  Value f = ExpertLoadOp::create(b, l, RankedTensorType::get({B, E}, f32), gate.getIndices());
  // Metrics: assignments per expert per group (mean over groups) and the
  // fraction of assignments over capacity, sum_e max(0, S K f - C) / (S K).
  Value count = f32Op(ScaleOp::create(b, l, f, b.getF64FloatAttr(static_cast<double>(S * K))));
  addMetric((layer + ".tokens_per_expert").str(), reduce(ReduceMeanOp(), count, {0}, false));
  auto scalar = RankedTensorType::get({}, f32);
  Value cap = arith::ConstantOp::create(
      b, l, DenseElementsAttr::get(scalar, b.getFloatAttr(f32, static_cast<double>(C))));
  Value over = f32Op(ReluOp::create(b, l, f32Op(SubOp::create(b, l, count, cap))));
  Value dropped = reduce(ReduceSumOp(), over, {0, 1}, false);
  addMetric((layer + ".dropped_fraction").str(),
            f32Op(ScaleOp::create(b, l, dropped,
                                  b.getF64FloatAttr(1.0 / static_cast<double>(B * S * K)))));
  if (moe.auxLoss > 0.0) {
    // Switch load balancing per group, averaged over groups:
    // aux * E * mean_g sum_e f[g, e] * P[g, e].
    Value probs = f32Op(SoftmaxOp::create(b, l, logits, b.getI64IntegerAttr(-1)));
    Value p = reduce(ReduceMeanOp(), probs, {1}, false); // [B, E]
    Value perGroup = reduce(ReduceSumOp(), f32Op(MulOp::create(b, l, f, p)), {1}, false); // [B]
    Value mean = reduce(ReduceMeanOp(), perGroup, {0}, false);
    accumulate(f32Op(
        ScaleOp::create(b, l, mean, b.getF64FloatAttr(moe.auxLoss * static_cast<double>(E)))));
  }
  if (moe.zLoss > 0.0) {
    // Router z-loss (ST-MoE): z * mean over tokens of logsumexp(logits)^2.
    Value mx = reduce(ReduceMaxOp(), logits, {2}, true); // [B, S, 1]
    Value shifted = f32Op(ExpOp::create(b, l, f32Op(SubOp::create(b, l, logits, mx))));
    Value lse = f32Op(AddOp::create(
        b, l, f32Op(LogOp::create(b, l, reduce(ReduceSumOp(), shifted, {2}, false))),
        f32Op(reshape(mx, {B, S}, l)))); // [B, S]
    Value mean = reduce(ReduceMeanOp(), f32Op(MulOp::create(b, l, lse, lse)), {0, 1}, false);
    accumulate(f32Op(ScaleOp::create(b, l, mean, b.getF64FloatAttr(moe.zLoss))));
  }
  return out;
}
