//===- PtcInterfaces.td - ptc op interfaces ----------------*- tablegen -*-===//

#ifndef PTC_INTERFACES_TD
#define PTC_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Ptc_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    An op with a reverse-mode rule: given the gradients of its results it
    builds, at the builder's insertion point, the gradients of its operands
    (a vector-Jacobian product). `ptc-autodiff` calls it on every op between
    the parameters and the loss, in reverse order.
  }];
  let methods = [
    InterfaceMethod<[{
        Builds the operand gradients. `resultGrads` has one entry per result,
        null where the result's gradient is zero. `needed[i]` says whether
        operand i's gradient is wanted; `operandGrads` receives one entry per
        operand (null where not needed or not defined, e.g. integer ids).
      }],
      "::llvm::LogicalResult", "buildVjp",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::ArrayRef<bool>":$needed,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>
  ];
}

#endif // PTC_INTERFACES_TD
