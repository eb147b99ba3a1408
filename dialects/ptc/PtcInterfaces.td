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

def Ptc_ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    An op's sharding rule: given the current shardings of its operands (split
    dimensions over mesh axes, pending partial sums), it states the sharding
    each operand must have (`ctx.want`, initialized to the current ones) and
    the sharding of each result (`ctx.out`), and optionally rescales results
    or operands (means over split rows). `ptc-propagate-sharding` asks every
    op in program order and records the answers; `ptc-partition` inserts the
    collectives that turn each operand into what the rule wants. Ops without the interface compute on whole tensors.
    The rules live in `PtcShardingRules.cpp`, next to the ops' other facts.
  }];
  let methods = [
    InterfaceMethod<[{
        Fills `ctx.want` (per operand) and `ctx.out` (per result); fails after
        a diagnostic (e.g. two user annotations that disagree).
      }],
      "::llvm::LogicalResult", "inferShardingRule",
      (ins "::mlir::ptc::ShardingRuleContext &":$ctx)>,
    InterfaceMethod<[{
        Called by `ptc-partition` once the op has its local operands and
        result types: the op's partitioned form, built with `b` before the op,
        when its rule chose one (`ctx.partitionedForm`, recorded on the op as
        `ptc.partitioned_form`), whose results replace the op's; null to keep
        the op as it is. The vocabulary-parallel cross-entropy is one.
      }],
      "::mlir::Operation *", "partition", (ins "::mlir::OpBuilder &":$b), [{}],
      [{ return nullptr; }]>
  ];
}

def Ptc_MicrobatchOpInterface : OpInterface<"MicrobatchOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    How an op carries the batch dimension, for `ptc-microbatch`: given the
    batch dimension of each operand (>= 0, or `kNoBatch`), the batch dimension
    of its results, `kBatchMean` / `kBatchSum` for a mean / sum over the batch
    (a loss), or failure after a diagnostic when the op cannot be split into
    micro-batches (e.g. it normalizes over the batch). Ops without the
    interface are refused when they see the batch.
  }];
  let methods = [
    InterfaceMethod<[{
        The results' batch dimension. `count` is the number of micro-batches
        (a reshape needs the batch dimension to stay divisible by it).
      }],
      "::mlir::FailureOr<int>", "inferBatchDim",
      (ins "::llvm::ArrayRef<int>":$operandDims, "int64_t":$count)>
  ];
}

def Ptc_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    The arithmetic an op performs, for stage balancing (`ptc-split-stages`),
    the model summary and the planner. Ops without the interface count the
    elements they produce.
  }];
  let methods = [
    InterfaceMethod<"Floating-point operations (a multiply-add counts 2).",
      "double", "getFlops", (ins)>
  ];
}

def Ptc_ElementwiseFunctionOpInterface : OpInterface<"ElementwiseFunctionOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    An activation or its gradient: an elementwise function the kernel
    libraries implement under a name (kernels/common/elementwise.h).
    `ptc-export-plan` lowers every such op to the plan's `Unary` /
    `UnaryGrad` instruction naming the function.
  }];
  let methods = [
    InterfaceMethod<"The function's name (`gelu`, `relu`, `silu`).", "::llvm::StringRef",
                    "getFunctionName", (ins)>,
    InterfaceMethod<"Whether the op is the function's gradient (input, grad -> dinput).",
                    "bool", "isGradient", (ins)>
  ];
}

def Ptc_PlanInstructionOpInterface : OpInterface<"PlanInstructionOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    The instruction of the executable plan an op lowers to: an opcode of
    `kernels/common/op_table.def` as its enum (`::ptc::kernels::OpKind`,
    declared from the table's rows, so a misspelled opcode does not compile),
    its integer and float attributes
    in the order the table names them (axes normalized, mesh axes as
    indices), and for an activation the function's name. `ptc-export-plan`
    asks every op of the step and checks each answer against the table; an
    op without the interface has no plan instruction.
  }];
  let methods = [
    InterfaceMethod<[{
        The op's plan instruction; `axisIndex` gives the index of a mesh axis.
      }],
      "::mlir::ptc::PlanInstruction", "getPlanInstruction",
      (ins "::mlir::ptc::MeshAxisIndexFn":$axisIndex)>
  ];
}

def Ptc_FusedUpdateOpInterface : OpInterface<"FusedUpdateOpInterface"> {
  let cppNamespace = "::mlir::ptc";
  let description = [{
    One optimizer step of one parameter as a single op (`ptc.adamw_update`,
    `ptc.sgd_update`): it reads the parameter (operand 0), its gradient
    (operand 1) and the parameter's optimizer state, and returns the new
    parameter and state. The sharding passes keep its gradient split as the
    update reads it (ZeRO), the memory passes find the gradients through it,
    and the plan names the optimizer by it. Optimizers built from primitive
    ops (Adafactor, Muon) mark their gradient's first reader
    `ptc.optimizer_grad` instead.
  }];
  let methods = [
    InterfaceMethod<"The parameter being updated.", "::mlir::Value", "getParam", (ins), [{}],
                    [{ return $_op.getParam(); }]>,
    InterfaceMethod<"The gradient operand (to read or to replace).", "::mlir::OpOperand &",
                    "getGradMutable", (ins), [{}], [{ return $_op.getGradMutable(); }]>,
    InterfaceMethod<"The optimizer's name in the plan (`adamw`, `sgd`).", "::llvm::StringRef",
                    "getOptimizerName", (ins)>,
    InterfaceMethod<"The new parameter's low-precision working copy, if the update writes one "
                    "(`ptc-keep-working-copies`).", "::mlir::Value", "getWorkingCopy", (ins), [{}],
                    [{ return $_op.getWorkingCopy(); }]>
  ];
}

#endif // PTC_INTERFACES_TD
