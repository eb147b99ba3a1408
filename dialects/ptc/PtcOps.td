//===- PtcOps.td - ptc model operations --------------------*- tablegen -*-===//
//
// Model operations of the ptc dialect. Every op verifies shapes and element
// types through one shape function per op (PtcOps.cpp), which the custom
// builders reuse to infer result types.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_OPS_TD
#define PTC_OPS_TD

include "dialects/ptc/PtcBase.td"
include "dialects/ptc/PtcInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/OpBase.td"

//===----------------------------------------------------------------------===//
// Elementwise arithmetic
//===----------------------------------------------------------------------===//

class Ptc_BinaryElementwiseOp<string mnemonic, string expr>
    : Ptc_Op<mnemonic, [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>]> {
  let summary = "elementwise " # mnemonic # " with broadcasting";
  let description = [{
    Computes `result = }] # expr # [{` elementwise. Operands broadcast as in
    NumPy: shapes are aligned at their last dimension, and a dimension of size 1
    (or a missing leading dimension) stretches to the other operand's size. The
    result has the broadcast shape; all element types must be equal.

    Example (a bias added to every position):
    ```mlir
    %y = ptc.}] # mnemonic # [{ %x, %b : tensor<8x64x384xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$lhs, Ptc_FloatTensor:$rhs);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state,
            ::mlir::ptc::inferBroadcastTypeOrFallback($_state.location, lhs, rhs),
            lhs, rhs);
    }]>
  ];
}

def Ptc_AddOp : Ptc_BinaryElementwiseOp<"add", "lhs + rhs">;
def Ptc_SubOp : Ptc_BinaryElementwiseOp<"sub", "lhs - rhs">;
def Ptc_MulOp : Ptc_BinaryElementwiseOp<"mul", "lhs * rhs">;
def Ptc_DivOp : Ptc_BinaryElementwiseOp<"div", "lhs / rhs">;

// An activation: an elementwise function that the kernel libraries name
// (kernels/common/elementwise.h lists them). Its sharding rule, batch
// dimension and plan lowering come from this class, so a new activation is
// its definition here, its gradient op, its VJP rule and its kernels.
class Ptc_UnaryElementwiseOp<string mnemonic, string what, string gradOp,
                             list<Trait> traits = []>
    : Ptc_Op<mnemonic, !listconcat([Pure, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
        DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>,
        DeclareOpInterfaceMethods<Ptc_ElementwiseFunctionOpInterface>,
        DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>], traits)> {
  let summary = what;
  let arguments = (ins Ptc_FloatTensor:$input);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferShardingRule(::mlir::ptc::ShardingRuleContext &ctx) {
      return ::mlir::ptc::activationShardingRule(*this, ctx);
    }
    ::mlir::FailureOr<int> $cppClass::inferBatchDim(::llvm::ArrayRef<int> dims, int64_t) {
      return dims[0];
    }
    ::llvm::StringRef $cppClass::getFunctionName() { return "}] # mnemonic # [{"; }
    bool $cppClass::isGradient() { return false; }
    ::mlir::ptc::PlanInstruction $cppClass::getPlanInstruction(::mlir::ptc::MeshAxisIndexFn) {
      return ::mlir::ptc::PlanInstruction(::ptc::kernels::OpKind::Unary, "}] # mnemonic # [{");
    }
    // The VJP: the gradient op of the same function, d input = grad * f'(input).
    ::llvm::LogicalResult $cppClass::buildVjp(::mlir::OpBuilder &b,
                                              ::llvm::ArrayRef<::mlir::Value> rg,
                                              ::llvm::ArrayRef<bool> needed,
                                              ::llvm::SmallVectorImpl<::mlir::Value> &og) {
      og.assign(1, ::mlir::Value());
      if (needed[0])
        og[0] = ::mlir::ptc::}] # gradOp # [{::create(b, getLoc(), getInput(), rg[0]);
      return ::mlir::success();
    }
  }];
}

def Ptc_GeluOp : Ptc_UnaryElementwiseOp<"gelu", "exact (erf) GELU activation", "GeluGradOp"> {
  let description = [{
    `result = 0.5 * x * (1 + erf(x / sqrt(2)))`, elementwise: the exact GELU of
    GPT-2/nanoGPT (`torch.nn.GELU()` with `approximate='none'`).

    ```mlir
    %y = ptc.gelu %x : tensor<8x64x1536xf32>
    ```
  }];
}

def Ptc_GeluTanhOp : Ptc_UnaryElementwiseOp<"gelu_tanh", "tanh-approximated GELU activation", "GeluTanhGradOp"> {
  let description = [{
    `result = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`,
    elementwise: GPT-2's original GELU (`torch.nn.GELU(approximate='tanh')`,
    minGPT's `NewGELU`, Hugging Face's `gelu_new`).

    ```mlir
    %y = ptc.gelu_tanh %x : tensor<8x64x1536xf32>
    ```
  }];
}

def Ptc_TanhOp : Ptc_UnaryElementwiseOp<"tanh", "hyperbolic tangent", "TanhGradOp"> {
  let description = [{
    `result = tanh(x)`, elementwise.

    ```mlir
    %y = ptc.tanh %x : tensor<32x256xf32>
    ```
  }];
}

def Ptc_ReluOp : Ptc_UnaryElementwiseOp<"relu", "rectified linear unit", "ReluGradOp"> {
  let description = [{
    `result = max(x, 0)`, elementwise.

    ```mlir
    %y = ptc.relu %x : tensor<32x256xf32>
    ```
  }];
}

def Ptc_SiluOp : Ptc_UnaryElementwiseOp<"silu", "SiLU (swish) activation", "SiluGradOp"> {
  let description = [{
    `result = x * sigmoid(x) = x / (1 + exp(-x))`, elementwise: the activation
    of Llama's SwiGLU MLP (`torch.nn.functional.silu`).

    ```mlir
    %y = ptc.silu %x : tensor<8x64x1408xf32>
    ```
  }];
}

def Ptc_SwigluOp : Ptc_Op<"swiglu", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
    DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
    DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>,
    DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>]> {
  let summary = "SwiGLU gate: silu(gate) * up";
  let description = [{
    `result = silu(gate) * up`, elementwise, with `silu(x) = x / (1 + exp(-x))`:
    the gated activation of Llama's MLP in one pass. `ptc-fuse-swiglu` forms it
    (and its gradient) from `ptc.silu` and `ptc.mul` after autodiff; the VJP is
    `ptc.swiglu_grad`, which recomputes the gate's activation instead of
    keeping it.

    ```mlir
    %h = ptc.swiglu %gate, %up : tensor<8x64x1408xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$gate, Ptc_FloatTensor:$up);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$gate `,` $up attr-dict `:` type($result)";
}

def Ptc_RsqrtOp : Ptc_UnaryElementwiseOp<"rsqrt", "reciprocal square root", "RsqrtGradOp"> {
  let description = [{
    `result = 1 / sqrt(x)`, elementwise (`torch.rsqrt`): Adafactor's factored
    second-moment estimate.

    ```mlir
    %y = ptc.rsqrt %x : tensor<384xf32>
    ```
  }];
}

def Ptc_ExpOp : Ptc_UnaryElementwiseOp<"exp", "natural exponential", "ExpGradOp"> {
  let description = [{
    `result = exp(x)`, elementwise.

    ```mlir
    %y = ptc.exp %x : tensor<f32>
    ```
  }];
}

def Ptc_LogOp : Ptc_UnaryElementwiseOp<"log", "natural logarithm", "LogGradOp"> {
  let description = [{
    `result = log(x)`, elementwise (negative inputs give NaN, zero gives -inf).

    ```mlir
    %y = ptc.log %x : tensor<f32>
    ```
  }];
}

def Ptc_SignOp : Ptc_UnaryElementwiseOp<"sign", "sign", "SignGradOp"> {
  let description = [{
    `result = sign(x)`: 1 for positive, -1 for negative, 0 for zero (and
    NaN for NaN), elementwise; its gradient is zero. Nudges an MoE layer's
    expert bias against the measured load (aux-loss-free balancing).

    ```mlir
    %y = ptc.sign %x : tensor<8xf32>
    ```
  }];
}

def Ptc_ScaleOp : Ptc_Op<"scale", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "multiplication by a compile-time constant";
  let description = [{
    `result = factor * input`, elementwise, with `factor` a constant known to
    the compiler (used e.g. for attention scaling and gradient averaging).

    ```mlir
    %y = ptc.scale %x by 1.250000e-01 : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, F64Attr:$factor);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input `by` $factor attr-dict `:` type($input)";
}

def Ptc_DropoutOp : Ptc_Op<"dropout", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure, SameOperandsAndResultType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "dropout: elements zeroed with probability p, the others scaled by 1 / (1 - p)";
  let description = [{
    `result = input * mask / (1 - p)` with `mask` 0 or 1 per element, 0 with
    probability `p` (`torch.nn.functional.dropout` in training mode). The
    mask comes from a counter-based generator (Philox4x32-10) keyed by the
    run's seed, the step, the op's `stream` and the element's index in the
    whole step's tensor, so every layout (any split, micro-batches,
    recomputation) draws the masks one rank draws, and a resumed run the
    masks of the run it continues. The op is its own gradient: the same
    `stream` on the result's gradient applies the same mask. Distinct
    dropouts of a model need distinct streams (`ptc-autodiff` checks).
    In evaluation and generation the op is the identity.

    `layout` is set by `ptc-partition`: how the input is split over the mesh,
    from which each device computes its elements' global indices.

    ```mlir
    %y = ptc.dropout %x {p = 1.000000e-01 : f64, stream = 3 : i64} : tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, F64Attr:$p, I64Attr:$stream,
                       OptionalAttr<Ptc_ShardingAttr>:$layout);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Ptc_ConvertOp : Ptc_Op<"convert", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultShape, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "element type conversion between f32, bf16 and f16";
  let description = [{
    Converts every element to the result's element type (round to nearest
    even when narrowing). Mixed precision inserts these between fp32 master
    weights and low-precision compute.

    ```mlir
    %h = ptc.convert %w : tensor<384x128xf32> -> tensor<384x128xbf16>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Dense algebra
//===----------------------------------------------------------------------===//

def Ptc_MatmulOp : Ptc_Op<"matmul", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_CostOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "batched matrix multiplication with optional transposes";
  let description = [{
    Multiplies the last two dimensions: `result[..., m, n] = sum_k
    op(lhs)[..., m, k] * op(rhs)[..., k, n]`, where `op` transposes the last
    two dimensions when `transpose_lhs` / `transpose_rhs` is set.

    Shapes: `lhs` has rank >= 2. `rhs` either has the same rank and the same
    leading (batch) dimensions, or has rank 2 and is shared by every batch
    entry (a weight applied at every position). The result has `lhs`'s batch
    dimensions. Element types must be equal; accumulation is in f32.

    An optional `bias` of the result's last dimension is added to every row
    (`result[..., m, n] += bias[n]`, in the accumulator, before the result is
    rounded): the epilogue `ptc-fuse-matmul-bias` forms from a following
    `ptc.add` of a bias, after sharding (the sharding rule refuses it).

    A linear layer with a PyTorch-layout weight `[out, in]`:
    ```mlir
    %y = ptc.matmul %x, %w {transpose_rhs = true}
        : tensor<8x64x128xf32>, tensor<384x128xf32> -> tensor<8x64x384xf32>
    %z = ptc.matmul %x, %w, %b {transpose_rhs = true}
        : tensor<8x64x128xf32>, tensor<384x128xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$lhs, Ptc_FloatTensor:$rhs,
                       Optional<Ptc_FloatTensor>:$bias,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_lhs,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_rhs);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs (`,` $bias^)? attr-dict `:` type($lhs) `,` type($rhs) (`,` type($bias)^)?
    `->` type($result)
  }];
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Value":$lhs, "::mlir::Value":$rhs,
                   CArg<"bool", "false">:$transposeLhs,
                   CArg<"bool", "false">:$transposeRhs,
                   CArg<"::mlir::Value", "{}">:$bias)>
  ];
}

//===----------------------------------------------------------------------===//
// Fused neural-network blocks
//===----------------------------------------------------------------------===//

// A normalization of every row along the last dimension, with a weight (and
// optionally a bias) of that size: LayerNorm, RMSNorm. The class brings every
// fact the ops share: the verifier, the VJP (`gradOp`, a Ptc_RowNormGradOp),
// the batch dimension, the sharding rule (split anywhere but the last
// dimension, parameters whole), the plan instruction (`planOpcode`, floats
// [epsilon]) and the RowNormalization trait. A def gives its arguments
// (input, weight[, bias], epsilon), summary and description.
def Ptc_RowNormalization : NativeOpTrait<"RowNormalization">;
class Ptc_RowNormOp<string mnemonic, string planOpcode, string gradOp, list<Trait> traits = []>
    : Ptc_Op<mnemonic, !listconcat([Pure, Ptc_RowNormalization,
        DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>,
        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
        DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
        DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>,
        AllTypesMatch<["input", "result"]>], traits)> {
  let results = (outs Ptc_FloatTensor:$result);
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::verify() {
      return ::mlir::ptc::verifyRowNorm(*this, getEpsilon().convertToDouble());
    }
    ::mlir::FailureOr<int> $cppClass::inferBatchDim(::llvm::ArrayRef<int> dims, int64_t) {
      return ::mlir::ptc::rowNormBatchDim(*this, dims);
    }
    ::llvm::LogicalResult $cppClass::inferShardingRule(::mlir::ptc::ShardingRuleContext &ctx) {
      return ::mlir::ptc::rowNormShardingRule(*this, ctx);
    }
    ::mlir::ptc::PlanInstruction $cppClass::getPlanInstruction(::mlir::ptc::MeshAxisIndexFn) {
      return ::mlir::ptc::PlanInstruction(::ptc::kernels::OpKind::}] # planOpcode # [{)
          .set(::ptc::kernels::attr::RowNorm::epsilon, getEpsilon().convertToDouble());
    }
    // The VJP: the gradient op recomputes the row statistics and returns one
    // gradient per operand (input, weight[, bias]).
    ::llvm::LogicalResult $cppClass::buildVjp(::mlir::OpBuilder &b,
                                              ::llvm::ArrayRef<::mlir::Value> rg,
                                              ::llvm::ArrayRef<bool> needed,
                                              ::llvm::SmallVectorImpl<::mlir::Value> &og) {
      auto grad = ::mlir::ptc::}] # gradOp # [{::create(
          b, getLoc(), getOperation()->getOperandTypes(),
          ::mlir::ValueRange{getInput(), getWeight(), rg[0]},
          {b.getNamedAttr(getEpsilonAttrName(), getEpsilonAttr())});
      og.assign(getOperation()->getNumOperands(), ::mlir::Value());
      for (unsigned i = 0; i < og.size(); ++i)
        if (needed[i])
          og[i] = grad->getResult(i);
      return ::mlir::success();
    }
  }];
}

def Ptc_LayerNormOp : Ptc_RowNormOp<"layer_norm", "LayerNorm", "LayerNormGradOp",
    [AllTypesMatch<["weight", "bias"]>]> {
  let summary = "layer normalization over the last dimension, with affine weight and bias";
  let description = [{
    For every row `x` along the last dimension (size `N`):
    `result = (x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias`, with the
    biased variance (as `torch.nn.LayerNorm`). `weight` and `bias` have shape
    `[N]` and the input's element type.

    ```mlir
    %y = ptc.layer_norm %x, %g, %b {epsilon = 1.000000e-05 : f64}
        : tensor<8x64x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_FloatTensor:$weight,
                       Ptc_FloatTensor:$bias,
                       DefaultValuedAttr<F64Attr, "1e-5">:$epsilon);
  let assemblyFormat = [{
    $input `,` $weight `,` $bias attr-dict `:` type($input) `,` type($weight)
  }];
}

def Ptc_RmsNormOp : Ptc_RowNormOp<"rms_norm", "RmsNorm", "RmsNormGradOp"> {
  let summary = "RMS normalization over the last dimension, with a weight";
  let description = [{
    For every row `x` along the last dimension (size `N`):
    `result = x / sqrt(mean(x^2) + epsilon) * weight`, computed in f32 (as
    Hugging Face's `LlamaRMSNorm`). `weight` has shape `[N]` and the input's
    element type.

    ```mlir
    %y = ptc.rms_norm %x, %g {epsilon = 1.000000e-05 : f64}
        : tensor<8x64x128xf32>, tensor<128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_FloatTensor:$weight,
                       DefaultValuedAttr<F64Attr, "1e-5">:$epsilon);
  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` type($weight)
  }];
}

def Ptc_RotaryOp : Ptc_Op<"rotary", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure, SameOperandsAndResultType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "rotary position embedding (rotate_half convention)";
  let description = [{
    The input has shape `[batch, heads, seq, head_dim]` with an even
    `head_dim = 2h`. Position `p` (the index along `seq`) and feature `i < h`
    rotate by the angle `p * theta^(-2i / head_dim)`, pairing feature `i` with
    `i + h` (the first and second halves of each head, Hugging Face's
    `rotate_half`): `result[i] = x[i] cos - x[i+h] sin`,
    `result[i+h] = x[i+h] cos + x[i] sin`. With `inverse`, the rotation goes
    the other way (its transpose, and so its gradient).

    With `seq_axis` (set by `ptc-shard` under context parallelism), the input
    is this device's block of the sequence along that mesh axis: block `c`
    holds positions `c * seq ..`, so each device rotates its own positions.

    With `seq_major`, the input is `[batch, seq, heads, head_dim]` (the
    projections' layout; `ptc-fold-attention-layout` moves a rotation across
    the head transpose that attention then no longer needs): the same
    rotation of each head row by its index along `seq`.

    ```mlir
    %q2 = ptc.rotary %q {theta = 1.000000e+04 : f64} : tensor<8x8x64x16xf32>
    %q3 = ptc.rotary %p {seq_major = true} : tensor<8x64x8x16xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input,
                       DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                       DefaultValuedAttr<BoolAttr, "false">:$inverse,
                       OptionalAttr<StrAttr>:$seq_axis,
                       DefaultValuedAttr<BoolAttr, "false">:$seq_major);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Ptc_SoftmaxOp : Ptc_Op<"softmax", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "numerically stable softmax along one axis";
  let description = [{
    `result = exp(x - max(x)) / sum(exp(x - max(x)))` along `axis`
    (negative values count from the end; default: the last axis).

    ```mlir
    %p = ptc.softmax %logits {axis = -1 : i64} : tensor<512x8xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input,
                       DefaultValuedAttr<Ptc_AxisAttr, "-1">:$axis);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Ptc_CausalAttentionOp : Ptc_Op<"causal_attention", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_CostOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
    AllTypesMatch<["query", "result"]>, AllTypesMatch<["key", "value"]>]> {
  let summary = "causal scaled dot-product attention over all heads";
  let description = [{
    `query` has shape `[batch, heads, seq, head_dim]`, `key` and `value`
    `[batch, kv_heads, seq, head_dim]` with `kv_heads` dividing `heads`
    (grouped-query attention; `kv_heads == heads` is multi-head attention):
    query head `h` attends with key/value head `h / (heads / kv_heads)`, so
    each kv head serves that many consecutive query heads. For every batch
    entry and head: `result = softmax(mask(query * key^T * scale)) * value`,
    where the causal mask hides key positions after the query position and
    `scale` defaults to `1 / sqrt(head_dim)`.

    Attention is one op so that kernels can fuse it (no `seq x seq` matrix in
    memory) and sequence parallelism can treat it as a whole.

    With `positions` (`i32`, `[batch, seq]`: each token's position in its
    document, 0 at a document's first token), the sequence is packed
    documents: the query at index `i` sees only the keys `j` of its own
    document, `i - positions[b, i] <= j <= i` (the document mask; a key block
    that the mask empties is not computed). Positions that count up from 0
    across the whole sequence give the plain causal mask.

    With `seq_major`, the operands and the result are `[batch, seq, heads,
    head_dim]` instead: the layout the projections produce, so that the
    kernels read and write the heads where they are (strided) and no
    transposes surround the op. `ptc-fold-attention-layout` sets it late in
    the pipeline (after sharding), where transposes are all that surrounded
    the op; the passes before it see `[batch, heads, seq, head_dim]` only.

    The optional second result `stats` (f32 `[batch, heads, seq]`, in either
    layout) is each query row's log-sum-exp of its scaled scores:
    `ptc-save-attention-stats` adds it late in the pipeline for the gradient
    (`ptc.causal_attention_grad`'s `saved`), which then does not recompute
    the softmax.

    ```mlir
    %o = ptc.causal_attention %q, %k, %v : tensor<8x4x64x32xf32>
    %o2 = ptc.causal_attention %q, %k2, %v2 : tensor<8x4x64x32xf32>, tensor<8x2x64x32xf32>
    %o3 = ptc.causal_attention %qs, %ks, %vs {seq_major = true} : tensor<8x64x4x32xf32>
    %o4 = ptc.causal_attention %q, %k, %v positions(%pos : tensor<8x64xi32>) : tensor<8x4x64x32xf32>
    %o5, %lse = ptc.causal_attention %q, %k, %v : tensor<8x4x64x32xf32> stats tensor<8x4x64xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$query, Ptc_FloatTensor:$key,
                       Ptc_FloatTensor:$value, Optional<Ptc_IdTensor>:$positions,
                       OptionalAttr<F64Attr>:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$seq_major);
  let results = (outs Ptc_FloatTensor:$result, Optional<Ptc_TensorOf<[F32]>>:$stats);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` custom<AttentionTypes>(type($query), type($key)) (`stats` type($stats)^)?
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The scale applied to query * key^T: the attribute, or 1/sqrt(head_dim).
    double getScaleOrDefault();
    /// The operands' sequence and heads dimensions (seq_major swaps them).
    int64_t getSeqDim() { return getSeqMajor() ? 1 : 2; }
    int64_t getHeadsDim() { return getSeqMajor() ? 2 : 1; }
  }];
}

def Ptc_CausalAttentionQkvOp : Ptc_Op<"causal_attention_qkv", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure]> {
  let summary = "causal attention reading query, key and value from one fused projection";
  let description = [{
    `ptc.causal_attention {seq_major}` of the three column blocks of `qkv`
    (`[batch, seq, (heads + 2 * kv_heads) * head_dim]`: the query's heads,
    then the key's, then the value's, as a fused QKV projection writes them),
    read in place instead of sliced out first. The result is `[batch, seq,
    heads, head_dim]`, which gives `heads` and `head_dim`; `kv_heads` follows
    from `qkv`'s last dimension. `ptc-fold-attention-layout` forms it after
    sharding, where the three operands were slices of one projection.
    `positions` is `ptc.causal_attention`'s document mask, `stats` its row
    statistics.

    ```mlir
    %o = ptc.causal_attention_qkv %qkv {scale = 0.17677669529663687 : f64}
        : tensor<8x64x384xf32> -> tensor<8x64x4x32xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$qkv, Optional<Ptc_IdTensor>:$positions, F64Attr:$scale);
  let results = (outs Ptc_FloatTensor:$result, Optional<Ptc_TensorOf<[F32]>>:$stats);
  let assemblyFormat = [{
    $qkv (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` type($qkv) `->` type($result) (`stats` type($stats)^)?
  }];
  let hasVerifier = 1;
}

def Ptc_EmbeddingOp : Ptc_Op<"embedding", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "row lookup in an embedding table";
  let description = [{
    `result[i..., :] = table[indices[i...], :]` for a table of shape
    `[num_rows, dim]` and `i32` indices of any shape; the result has shape
    `indices.shape + [dim]`. An index outside `[0, num_rows)` is a runtime
    error.

    With `vocab_axis` (set by `ptc-shard` for a vocabulary-parallel table),
    the table is this device's block of rows along that mesh axis: block `c`
    holds rows `[c * num_rows, (c + 1) * num_rows)` of the whole table, and
    indices outside the block give zero rows (the group's results sum to the
    lookup in the whole table).

    ```mlir
    %x = ptc.embedding %wte, %tokens
        : tensor<256x128xf32>, tensor<8x64xi32> -> tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$table, Ptc_IdTensor:$indices,
                       OptionalAttr<StrAttr>:$vocab_axis);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $table `,` $indices attr-dict `:` type($table) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::Value":$table, "::mlir::Value":$indices)>];
}

def Ptc_CrossEntropyOp : Ptc_Op<"cross_entropy", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "mean softmax cross-entropy over all positions";
  let description = [{
    `logits` has shape `targets.shape + [num_classes]`; `targets` holds `i32`
    class ids. The result is the scalar
    `mean_i(logsumexp(logits[i, :]) - logits[i, targets[i]])` over all
    positions `i`, as `torch.nn.functional.cross_entropy` with reduction
    `mean`. A target outside `[0, num_classes)` is a runtime error.

    The loss has the logits' element type, or f32 over bf16 / f16 logits
    (the kernels compute in f32 either way; `ptc-fuse-loss-widening` forms it
    from a loss over widened logits, which need no f32 copy then).

    ```mlir
    %loss = ptc.cross_entropy %logits, %targets
        : tensor<8x64x256xf32>, tensor<8x64xi32> -> tensor<f32>
    %loss16 = ptc.cross_entropy %logits16, %targets
        : tensor<8x64x256xbf16>, tensor<8x64xi32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets);
  let results = (outs 0DTensorOf<[F32, BF16, F16]>:$result);
  let assemblyFormat = [{
    $logits `,` $targets attr-dict `:` type($logits) `,` type($targets) `->` type($result)
  }];
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::Value":$logits, "::mlir::Value":$targets)>];
}

//===----------------------------------------------------------------------===//
// Layout changes
//===----------------------------------------------------------------------===//

def Ptc_ReshapeOp : Ptc_Op<"reshape", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "reinterpretation of a tensor with another shape";
  let description = [{
    Row-major reinterpretation: the element count must be unchanged.

    ```mlir
    %y = ptc.reshape %x : tensor<8x64x128xf32> -> tensor<8x64x4x32xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Ptc_TransposeOp : Ptc_Op<"transpose", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "permutation of dimensions";
  let description = [{
    `result.shape[i] = input.shape[permutation[i]]`, and
    `result[j_0, ..., j_n] = input[k]` with `k[permutation[i]] = j_i`.

    ```mlir
    %y = ptc.transpose %x permutation = [0, 2, 1, 3]
        : tensor<8x64x4x32xf32> -> tensor<8x4x64x32xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = [{
    $input `permutation` `=` $permutation attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::Value":$input, "::llvm::ArrayRef<int64_t>":$permutation)>];
}

def Ptc_SliceOp : Ptc_Op<"slice", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "contiguous static slice";
  let description = [{
    `result[i...] = input[offsets + i...]`: the result's shape gives the slice
    sizes and `offsets` its start in every dimension (unit strides). The slice
    must lie inside the input.

    Taking the query third of a fused QKV projection:
    ```mlir
    %q = ptc.slice %qkv offsets = [0, 0, 0]
        : tensor<8x64x384xf32> -> tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, DenseI64ArrayAttr:$offsets);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = [{
    $input `offsets` `=` $offsets attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_ConcatOp : Ptc_Op<"concat", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "concatenation along one axis";
  let description = [{
    Joins the inputs along `axis`; all other dimensions must agree.

    ```mlir
    %y = ptc.concat %a, %b axis = 1
        : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Ptc_AnyTensor>:$inputs, Ptc_AxisAttr:$axis);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = [{
    $inputs `axis` `=` $axis attr-dict `:` type($inputs) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

class Ptc_ReduceOp<string mnemonic, string what>
    : Ptc_Op<mnemonic, [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>]> {
  let summary = what # " over a set of axes";
  let description = [{
    Reduces `input` over `axes` (distinct, in range, negative values count
    from the end). With `keep_dims` the reduced dimensions stay with size 1;
    otherwise they are removed (reducing every axis gives a rank-0 tensor).

    ```mlir
    %s = ptc.}] # mnemonic # [{ %x axes = [0, 1] : tensor<8x64x128xf32> -> tensor<128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, DenseI64ArrayAttr:$axes,
                       DefaultValuedAttr<BoolAttr, "false">:$keep_dims);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `axes` `=` $axes attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_ReduceSumOp : Ptc_ReduceOp<"reduce_sum", "sum">;
def Ptc_ReduceMeanOp : Ptc_ReduceOp<"reduce_mean", "arithmetic mean">;
def Ptc_ReduceMaxOp : Ptc_ReduceOp<"reduce_max", "maximum">;

//===----------------------------------------------------------------------===//
// Mixture-of-experts routing
//===----------------------------------------------------------------------===//

def Ptc_TopKGateOp : Ptc_Op<"top_k_gate", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "softmax router choosing the top-k experts of every token";
  let description = [{
    `logits` has shape `[..., num_experts]` (`[tokens, E]` or, per routing
    group, `[groups, tokens, E]`). For every token the op takes
    `p = softmax(logits)` (in f32) and returns the `k` largest probabilities
    (`weights`, `[..., k]`, descending; renormalized to sum to 1 when
    `normalize` is set) and their expert ids (`indices`, `[..., k]`, `i32`;
    ties go to the lower expert id). With a `selection_bias` (`[num_experts]`,
    f32; DeepSeek-V3's auxiliary-loss-free balancing) the experts are chosen
    by `p + selection_bias`, and the weights are still the chosen `p`.

    ```mlir
    %w, %e = ptc.top_k_gate %logits {k = 2 : i64}
        : tensor<512x8xf32> -> tensor<512x2xf32>, tensor<512x2xi32>
    %w2, %e2 = ptc.top_k_gate %logits bias %b {k = 2 : i64}
        : tensor<512x8xf32>, tensor<8xf32> -> tensor<512x2xf32>, tensor<512x2xi32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Optional<Ptc_FloatTensor>:$selection_bias,
                       I64Attr:$k, DefaultValuedAttr<BoolAttr, "true">:$normalize);
  let results = (outs Ptc_FloatTensor:$weights, Ptc_IdTensor:$indices);
  let assemblyFormat = [{
    $logits (`bias` $selection_bias^)? attr-dict `:` type($logits) (`,` type($selection_bias)^)?
    `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
}

def Ptc_ExpertLoadOp : Ptc_Op<"expert_load", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure]> {
  let summary = "fraction of each routing group's assignments that go to each expert";
  let description = [{
    `indices` (from `ptc.top_k_gate`) is `[groups, tokens, k]`; the result
    is `[groups, experts]` (f32) with `result[g, e]` = the number of
    assignments `(t, j)` of group `g` with `indices[g, t, j] = e`, divided by
    `tokens * k`, counted before capacity drops anything: the `f` of the
    Switch load-balancing loss `E * sum_e f_e * P_e`, and the per-expert
    load of the metrics. (`[tokens, k]` indices: one group, result
    `[experts]`.) It has no gradient: the expert choice is discrete.

    ```mlir
    %f = ptc.expert_load %e : tensor<4x128x2xi32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Ptc_IdTensor:$indices);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $indices attr-dict `:` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_MoeDispatchOp : Ptc_Op<"moe_dispatch", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "scatter of tokens into per-expert buffers of fixed capacity";
  let description = [{
    Routing groups (GShard): `input` is `[groups, tokens, dim]` and
    `indices` (from `ptc.top_k_gate`) `[groups, tokens, k]`; the result is
    `[num_experts, groups, capacity, dim]`, `capacity` slots per expert per
    group. (Without the group dimension: one group, `[tokens, dim]`,
    `[tokens, k]` -> `[num_experts, capacity, dim]`.) Within a group the
    assignments are visited choice-major: all first choices in token order,
    then all second choices, and so on; assignment `(t, j)` takes the next
    free slot `s` of expert `e = indices[g, t, j]` in its group and
    `result[e, g, s, :] = input[g, t, :]`. Assignments beyond an expert's
    capacity are dropped (their token skips that expert); unused slots are
    zero. `ptc.moe_combine` uses the same slot assignment. Groups are
    independent, so a layout that splits the group dimension routes exactly
    as one device does.

    ```mlir
    %buf = ptc.moe_dispatch %x, %e
        : tensor<4x128x64xf32>, tensor<4x128x2xi32> -> tensor<8x4x40x64xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_IdTensor:$indices);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $indices attr-dict `:` type($input) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_MoeCombineOp : Ptc_Op<"moe_combine", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "weighted gather of expert outputs back to tokens";
  let description = [{
    The inverse of `ptc.moe_dispatch`: `expert_output` is
    `[num_experts, groups, capacity, dim]`, `weights` and `indices` are
    `[groups, tokens, k]`; the result is `[groups, tokens, dim]` with
    `result[g, t, :] = sum_j weights[g, t, j] * expert_output[e, g, s, :]`
    over the assignments `(t, j) -> (e, s)` that fit in capacity (same slot
    order as dispatch). Without the group dimension: one group.

    ```mlir
    %y = ptc.moe_combine %out, %w, %e
        : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32> -> tensor<512x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$expert_output, Ptc_FloatTensor:$weights,
                       Ptc_IdTensor:$indices);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $expert_output `,` $weights `,` $indices attr-dict `:` type($expert_output) `,`
    type($weights) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

include "dialects/ptc/PtcGradOps.td"
include "dialects/ptc/PtcOptimizerOps.td"
include "dialects/ptc/PtcDistOps.td"
include "dialects/ptc/PtcDecodeOps.td"

#endif // PTC_OPS_TD
