//===- MlpModel.cpp - a small multi-layer perceptron classifier -----------===//
//
// x [batch, input] -> (linear, ReLU) x (layers - 1) -> linear -> logits
// [batch, classes]; loss = mean cross-entropy against i32 labels [batch].
//
//===----------------------------------------------------------------------===//

#include "models/ModelBuilder.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ptc;

llvm::Error mlir::ptc::validateMlpConfig(const MlpConfig &c) {
  for (auto [v, name] : {std::pair{c.layers, "layers"}, std::pair{c.input, "input"},
                         std::pair{c.hidden, "hidden"}, std::pair{c.classes, "classes"},
                         std::pair{c.batch, "batch"}})
    if (v < 1)
      return llvm::createStringError("mlp: --%s must be at least 1, got %lld", name,
                                     static_cast<long long>(v));
  return llvm::Error::success();
}

std::vector<TensorSpec> mlir::ptc::mlpParameters(const MlpConfig &c) {
  std::vector<TensorSpec> p;
  for (int64_t i = 0; i < c.layers; ++i) {
    int64_t in = i == 0 ? c.input : c.hidden;
    int64_t out = i == c.layers - 1 ? c.classes : c.hidden;
    std::string l = "layers." + std::to_string(i);
    // N(0, 1/in): unit-variance activations through each layer.
    p.push_back({l + ".weight", {out, in},
                 "normal:" + std::to_string(1.0 / std::sqrt(static_cast<double>(in)))});
    p.push_back({l + ".bias", {out}, "zeros"});
  }
  return p;
}

llvm::Expected<OwningOpRef<ModuleOp>> mlir::ptc::buildMlpModel(MLIRContext &context,
                                                               const MlpConfig &c) {
  if (llvm::Error e = validateMlpConfig(c))
    return std::move(e);
  Type ftype = floatType(context, c.dtype);
  ModelBuilder m(context, ftype, mlpParameters(c),
                 {{{"x", {c.batch, c.input}}, ftype},
                  {{"labels", {c.batch}}, IntegerType::get(&context, 32)}});
  Value x = m.input("x");
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string l = "layers." + std::to_string(i);
    x = m.linear(x, l);
    if (i + 1 < c.layers)
      x = ReluOp::create(m.builder(), m.loc(l), x);
  }
  return m.finish(CrossEntropyOp::create(m.builder(), m.loc("loss"), x, m.input("labels")));
}
