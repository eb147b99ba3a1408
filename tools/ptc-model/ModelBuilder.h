//===- ModelBuilder.h - helper shared by the model builders -----*- C++ -*-===//

#ifndef PTC_TOOLS_PTC_MODEL_MODELBUILDER_H
#define PTC_TOOLS_PTC_MODEL_MODELBUILDER_H

#include "Models.h"

#include "dialects/ptc/PtcOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

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

  OpBuilder &builder() { return b; }
  Type floatType() const { return ftype; }
  /// A location naming the model part being built (e.g. "transformer.h.0.attn").
  Location loc(const Twine &scope);
  Value param(StringRef name) const;
  Value input(StringRef name) const;

  /// `x @ weight^T (+ bias)` with a PyTorch-layout weight `[out, in]`.
  Value linear(Value x, StringRef prefix, bool bias = true);
  Value reshape(Value x, ArrayRef<int64_t> shape, Location loc);

  /// Returns `loss`, verifies the module and hands it over.
  llvm::Expected<OwningOpRef<ModuleOp>> finish(Value loss);

private:
  OpBuilder b;
  Type ftype;
  OwningOpRef<ModuleOp> module;
  func::FuncOp func;
  llvm::StringMap<Value> args;
};

} // namespace mlir::ptc

#endif // PTC_TOOLS_PTC_MODEL_MODELBUILDER_H
