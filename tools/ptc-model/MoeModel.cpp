//===- MoeModel.cpp - a mixture-of-experts classifier ---------------------===//
//
// x [tokens, d] -> router (top-k gate over softmax(x @ gate^T)) -> dispatch to
// [experts, capacity, d] -> per-expert MLP (d -> hidden -> d, GELU) -> weighted
// combine -> residual add -> linear head -> mean cross-entropy.
//
//===----------------------------------------------------------------------===//

#include "ModelBuilder.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ptc;

llvm::Error mlir::ptc::validateMoeConfig(const MoeConfig &c) {
  for (auto [v, name] : {std::pair{c.input, "input"}, std::pair{c.hidden, "hidden"},
                         std::pair{c.experts, "experts"}, std::pair{c.topK, "top-k"},
                         std::pair{c.classes, "classes"}, std::pair{c.batch, "batch"}})
    if (v < 1)
      return llvm::createStringError("moe: --%s must be at least 1, got %lld", name,
                                     static_cast<long long>(v));
  if (c.topK > c.experts)
    return llvm::createStringError("moe: --top-k %lld exceeds --experts %lld",
                                   static_cast<long long>(c.topK),
                                   static_cast<long long>(c.experts));
  if (!(c.capacityFactor > 0.0))
    return llvm::createStringError("moe: --capacity-factor must be positive, got %g",
                                   c.capacityFactor);
  if (c.dtype != "f32" && c.dtype != "bf16" && c.dtype != "f16")
    return llvm::createStringError("moe: --dtype must be f32, bf16 or f16, got '%s'",
                                   c.dtype.c_str());
  return llvm::Error::success();
}

int64_t mlir::ptc::moeCapacity(const MoeConfig &c) {
  double slots = c.capacityFactor * static_cast<double>(c.batch * c.topK) /
                 static_cast<double>(c.experts);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots)));
}

std::vector<TensorSpec> mlir::ptc::moeParameters(const MoeConfig &c) {
  auto fanIn = [](int64_t n) {
    return "normal:" + std::to_string(1.0 / std::sqrt(static_cast<double>(n)));
  };
  return {{"router.weight", {c.experts, c.input}, "normal:0.02"},
          {"experts.w_in", {c.experts, c.input, c.hidden}, fanIn(c.input)},
          {"experts.w_out", {c.experts, c.hidden, c.input}, fanIn(c.hidden)},
          {"head.weight", {c.classes, c.input}, fanIn(c.input)},
          {"head.bias", {c.classes}, "zeros"}};
}

llvm::Expected<OwningOpRef<ModuleOp>> mlir::ptc::buildMoeModel(MLIRContext &context,
                                                               const MoeConfig &c) {
  if (llvm::Error e = validateMoeConfig(c))
    return std::move(e);
  Type ftype = *parseFloatType(context, c.dtype);
  Type i32 = IntegerType::get(&context, 32);
  ModelBuilder m(context, ftype, moeParameters(c),
                 {{{"x", {c.batch, c.input}}, ftype}, {{"labels", {c.batch}}, i32}});
  OpBuilder &b = m.builder();
  Location loc = m.loc("experts");
  const int64_t capacity = moeCapacity(c);

  Value x = m.input("x");
  Value logits = m.linear(x, "router", /*bias=*/false); // [T, E]
  auto gate = TopKGateOp::create(b, m.loc("router"), RankedTensorType::get({c.batch, c.topK}, ftype),
                                 RankedTensorType::get({c.batch, c.topK}, i32), logits,
                                 b.getI64IntegerAttr(c.topK), b.getBoolAttr(true));
  Value buffers =
      MoeDispatchOp::create(b, loc, RankedTensorType::get({c.experts, capacity, c.input}, ftype),
                            x, gate.getIndices()); // [E, C, d]
  Value h = MatmulOp::create(b, loc, buffers, m.param("experts.w_in"));  // [E, C, hidden]
  h = GeluOp::create(b, loc, h);
  Value out = MatmulOp::create(b, loc, h, m.param("experts.w_out"));     // [E, C, d]
  Value combined = MoeCombineOp::create(b, loc, RankedTensorType::get({c.batch, c.input}, ftype),
                                        out, gate.getWeights(), gate.getIndices());
  Value y = AddOp::create(b, loc, x, combined);
  Value classLogits = m.linear(y, "head");
  return m.finish(CrossEntropyOp::create(b, m.loc("loss"), classLogits, m.input("labels")));
}
