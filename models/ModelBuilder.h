//===- ModelBuilder.h - helper shared by the model builders -----*- C++ -*-===//

#ifndef PTC_MODELS_MODELBUILDER_H
#define PTC_MODELS_MODELBUILDER_H

#include "models/Models.h"

#include "dialects/ptc/PtcOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

#include <functional>

namespace mlir::ptc {

/// Creates `module { func.func @train_step(params..., inputs...) }` and hands
/// out the arguments by name while the body is built.
class ModelBuilder {
public:
  struct Input {
    TensorSpec spec;
    Type elementType;
  };

  ModelBuilder(MLIRContext &context, Type floatType, const std::vector<TensorSpec> &params,
               const std::vector<Input> &inputs);

  /// A language model's inputs: `tokens` and `targets` [batch, seq] i32, and
  /// with `documents` (packed documents) `positions` [batch, seq] i32.
  static std::vector<Input> tokenInputs(MLIRContext &context, int64_t batch, int64_t seq,
                                        bool documents);

  OpBuilder &builder() { return b; }
  Type floatType() const { return ftype; }
  /// A location naming the model part being built (e.g. "transformer.h.0.attn").
  Location loc(const Twine &scope);
  Value param(StringRef name) const;
  Value input(StringRef name) const;

  /// `x @ weight^T (+ bias)` with a PyTorch-layout weight `[out, in]`.
  Value linear(Value x, StringRef prefix, bool bias = true);
  Value reshape(Value x, ArrayRef<int64_t> shape, Location loc);
  /// An expert-stacked linear layer: `x [E, M, in] @ weight[e]^T (+ bias[e])`
  /// with `weight` [E, out, in] and `bias` [E, out].
  Value expertLinear(Value x, StringRef prefix, bool bias);

  /// An MoE MLP on `x` [batch, seq, hidden], one routing group per sequence:
  /// router `<router>.weight` [E, hidden], then the experts (stacked
  /// parameters `<experts>.<name>.weight` [E, out, in]) run `expertMlp` on
  /// [E, groups * capacity, hidden] and are combined. Adds the layer's
  /// load-balancing and z-losses (scaled) to `auxLoss` (null: none yet).
  Value moeLayer(Value x, const MoeLayersConfig &moe, StringRef router,
                 const std::function<Value(Value)> &expertMlp, Value &auxLoss);
  /// `loss + auxLoss` (auxLoss, f32, converted to the loss's type), or `loss`.
  Value addAuxLoss(Value loss, Value auxLoss);

  /// Reports `value` (a float tensor) as the per-step metric `name`
  /// (a `ptc.metric` result after the loss).
  void addMetric(StringRef name, Value value) { metrics.push_back({name.str(), value}); }
  /// A `ptc.state` argument `name` (after the parameters), zero at the start,
  /// with the extra argument attributes `attrs`.
  Value addState(StringRef name, Type type, ArrayRef<NamedAttribute> attrs);

  /// Returns `loss` (and the metrics), verifies the module and hands it over.
  llvm::Expected<OwningOpRef<ModuleOp>> finish(Value loss);

private:
  OpBuilder b;
  Type ftype;
  OwningOpRef<ModuleOp> module;
  func::FuncOp func;
  llvm::StringMap<Value> args;
  SmallVector<std::pair<std::string, Value>> metrics;
};

} // namespace mlir::ptc

#endif // PTC_MODELS_MODELBUILDER_H
