//===- PtcGradOps.td - ops that reverse-mode rules emit ----*- tablegen -*-===//
//
// Backward counterparts of the fused forward ops, plus the two layout ops
// (broadcast, pad) that gradients of broadcasting and slicing need. They are
// built by `ptc-autodiff`; each names the forward op it differentiates.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_GRAD_OPS_TD
#define PTC_GRAD_OPS_TD

def Ptc_BroadcastOp : Ptc_Op<"broadcast", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "NumPy-style broadcast to a larger shape";
  let description = [{
    Stretches dimensions of size 1 and adds leading dimensions so that the
    input takes the result's shape (the gradient of a reduction).

    ```mlir
    %y = ptc.broadcast %x : tensor<64x1xf32> -> tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Ptc_PadOp : Ptc_Op<"pad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultElementType, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>]> {
  let summary = "zero padding around a tensor (the gradient of a slice)";
  let description = [{
    The result is zero except for the region starting at `offsets` with the
    input's shape, which holds the input.

    ```mlir
    %y = ptc.pad %g offsets = [0, 0, 128] : tensor<8x64x128xf32> -> tensor<8x64x384xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, DenseI64ArrayAttr:$offsets);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `offsets` `=` $offsets attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

// The gradient of an activation (Ptc_UnaryElementwiseOp `forward`): the same
// kernel function, differentiated.
class Ptc_UnaryGradOp<string mnemonic, string forward>
    : Ptc_Op<mnemonic, [Pure, SameOperandsAndResultType,
                        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_ElementwiseFunctionOpInterface>,
                        DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>]> {
  let summary = "gradient of `ptc." # forward # "`";
  let description = [{
    `result = grad * d}] # forward # [{(input)/d input`, elementwise.

    ```mlir
    %dx = ptc.}] # mnemonic # [{ %x, %g : tensor<8x64x512xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_FloatTensor:$grad);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` type($input)";
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferShardingRule(::mlir::ptc::ShardingRuleContext &ctx) {
      return ::mlir::ptc::activationGradShardingRule(*this, ctx);
    }
    ::llvm::StringRef $cppClass::getFunctionName() { return "}] # forward # [{"; }
    bool $cppClass::isGradient() { return true; }
    ::mlir::ptc::PlanInstruction $cppClass::getPlanInstruction(::mlir::ptc::MeshAxisIndexFn) {
      return ::mlir::ptc::PlanInstruction(::ptc::kernels::OpKind::UnaryGrad, "}] # forward # [{");
    }
  }];
}

def Ptc_GeluGradOp : Ptc_UnaryGradOp<"gelu_grad", "gelu">;
def Ptc_GeluTanhGradOp : Ptc_UnaryGradOp<"gelu_tanh_grad", "gelu_tanh">;
def Ptc_TanhGradOp : Ptc_UnaryGradOp<"tanh_grad", "tanh">;
def Ptc_ReluGradOp : Ptc_UnaryGradOp<"relu_grad", "relu">;
def Ptc_SiluGradOp : Ptc_UnaryGradOp<"silu_grad", "silu">;
def Ptc_RsqrtGradOp : Ptc_UnaryGradOp<"rsqrt_grad", "rsqrt">;
def Ptc_ExpGradOp : Ptc_UnaryGradOp<"exp_grad", "exp">;
def Ptc_LogGradOp : Ptc_UnaryGradOp<"log_grad", "log">;
def Ptc_SignGradOp : Ptc_UnaryGradOp<"sign_grad", "sign">;

def Ptc_SwigluGradOp : Ptc_Op<"swiglu_grad", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
    DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>]> {
  let summary = "gradient of `ptc.swiglu`";
  let description = [{
    With `s = silu(gate)`: `gate_grad = grad * up * ds/dgate` and
    `up_grad = grad * s`, elementwise, in one pass (`s` recomputed from `gate`).

    ```mlir
    %dgate, %dup = ptc.swiglu_grad %gate, %up, %g : tensor<8x64x1408xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$gate, Ptc_FloatTensor:$up, Ptc_FloatTensor:$grad);
  let results = (outs Ptc_FloatTensor:$gate_grad, Ptc_FloatTensor:$up_grad);
  let assemblyFormat = "$gate `,` $up `,` $grad attr-dict `:` type($gate)";
}

def Ptc_SoftmaxGradOp : Ptc_Op<"softmax_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultType]> {
  let summary = "gradient of `ptc.softmax`, from its output";
  let description = [{
    With `y = softmax(x)` along `axis`: `result = y * (grad - sum(grad * y))`,
    the sum taken along `axis`.

    ```mlir
    %dx = ptc.softmax_grad %y, %g : tensor<512x8xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$output, Ptc_FloatTensor:$grad,
                       DefaultValuedAttr<Ptc_AxisAttr, "-1">:$axis);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$output `,` $grad attr-dict `:` type($output)";
  let hasVerifier = 1;
}

// The gradient of a Ptc_RowNormOp (operands: input, weight, result
// gradient; results: the gradient of each forward operand): verifier,
// sharding rule (the input gradient split as the input, parameter gradients
// partial sums over the axes that split it) and plan instruction.
class Ptc_RowNormGradOp<string mnemonic, string planOpcode,
                        list<Trait> traits = []>
    : Ptc_Op<mnemonic, !listconcat([Pure,
        DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>,
        DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>,
        AllTypesMatch<["input", "grad", "input_grad"]>], traits)> {
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_FloatTensor:$weight, Ptc_FloatTensor:$grad,
                       DefaultValuedAttr<F64Attr, "1e-5">:$epsilon);
  let assemblyFormat = [{
    $input `,` $weight `,` $grad attr-dict `:` type($input) `,` type($weight)
  }];
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::verify() {
      return ::mlir::ptc::verifyRowNorm(*this, getEpsilon().convertToDouble());
    }
    ::llvm::LogicalResult $cppClass::inferShardingRule(::mlir::ptc::ShardingRuleContext &ctx) {
      return ::mlir::ptc::rowNormGradShardingRule(*this, ctx);
    }
    ::mlir::ptc::PlanInstruction $cppClass::getPlanInstruction(::mlir::ptc::MeshAxisIndexFn) {
      return ::mlir::ptc::PlanInstruction(::ptc::kernels::OpKind::}] # planOpcode # [{)
          .set(::ptc::kernels::attr::RowNorm::epsilon, getEpsilon().convertToDouble());
    }
  }];
}

def Ptc_LayerNormGradOp : Ptc_RowNormGradOp<"layer_norm_grad", "LayerNormGrad",
    [AllTypesMatch<["weight", "weight_grad", "bias_grad"]>]> {
  let summary = "gradient of `ptc.layer_norm` (input, weight and bias)";
  let description = [{
    Recomputes the row statistics of `input` and returns the gradients of
    the input, the weight and the bias of the matching `ptc.layer_norm`.

    ```mlir
    %dx, %dw, %db = ptc.layer_norm_grad %x, %w, %g : tensor<8x64x128xf32>, tensor<128xf32>
    ```
  }];
  let results = (outs Ptc_FloatTensor:$input_grad, Ptc_FloatTensor:$weight_grad,
                      Ptc_FloatTensor:$bias_grad);
}

def Ptc_RmsNormGradOp : Ptc_RowNormGradOp<"rms_norm_grad", "RmsNormGrad",
    [AllTypesMatch<["weight", "weight_grad"]>]> {
  let summary = "gradient of `ptc.rms_norm` (input and weight)";
  let description = [{
    Recomputes the row statistics of `input` and returns the gradients of
    the input and the weight of the matching `ptc.rms_norm`.

    ```mlir
    %dx, %dw = ptc.rms_norm_grad %x, %w, %g : tensor<8x64x128xf32>, tensor<128xf32>
    ```
  }];
  let results = (outs Ptc_FloatTensor:$input_grad, Ptc_FloatTensor:$weight_grad);
}

def Ptc_CausalAttentionGradOp : Ptc_Op<"causal_attention_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure,
    AttrSizedOperandSegments,
    AllTypesMatch<["query", "grad", "query_grad"]>,
    AllTypesMatch<["key", "value", "key_grad", "value_grad"]>]> {
  let summary = "gradient of `ptc.causal_attention` (query, key and value)";
  let description = [{
    Recomputes the attention probabilities (no saved `seq x seq` matrix) and
    returns the gradients of query, key and value (with grouped-query heads,
    each kv head's gradient sums over the query heads it serves). With
    `seq_major`, every operand and result is `[batch, seq, heads, head_dim]`
    (see `ptc.causal_attention`); `positions` is the forward's document mask.
    With `saved`, the forward's result and row statistics (its `stats`;
    `ptc-save-attention-stats`), the probabilities are made from the
    statistics and the rows' `grad . result` replaces their recomputation.

    ```mlir
    %dq, %dk, %dv = ptc.causal_attention_grad %q, %k, %v, %g : tensor<8x4x64x32xf32>
    %dq2, %dk2, %dv2 = ptc.causal_attention_grad %q, %k, %v, %g saved(%o, %lse : tensor<8x4x64x32xf32>, tensor<8x4x64xf32>)
        : tensor<8x4x64x32xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$query, Ptc_FloatTensor:$key, Ptc_FloatTensor:$value,
                       Ptc_FloatTensor:$grad, Optional<Ptc_FloatTensor>:$saved_result,
                       Optional<Ptc_TensorOf<[F32]>>:$saved_stats,
                       Optional<Ptc_IdTensor>:$positions,
                       OptionalAttr<F64Attr>:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$seq_major);
  let results = (outs Ptc_FloatTensor:$query_grad, Ptc_FloatTensor:$key_grad,
                      Ptc_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $grad (`saved` `(` $saved_result^ `,` $saved_stats `:` type($saved_result) `,` type($saved_stats) `)`)? (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` custom<AttentionTypes>(type($query), type($key))
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

def Ptc_CausalAttentionQkvGradOp : Ptc_Op<"causal_attention_qkv_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AttrSizedOperandSegments, AllTypesMatch<["qkv", "qkv_grad"]>]> {
  let summary = "gradient of `ptc.causal_attention_qkv`, in the fused projection's layout";
  let description = [{
    The query, key and value gradients of `ptc.causal_attention_qkv` written
    into one tensor of `qkv`'s type, in its column blocks (what the
    concatenation of the three gradients gave). `grad` has the forward
    result's type; `saved` is the forward's result and row statistics (see
    `ptc.causal_attention_grad`).

    ```mlir
    %dqkv = ptc.causal_attention_qkv_grad %qkv, %g {scale = 0.17677669529663687 : f64}
        : tensor<8x64x384xf32>, tensor<8x64x4x32xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$qkv, Ptc_FloatTensor:$grad,
                       Optional<Ptc_FloatTensor>:$saved_result,
                       Optional<Ptc_TensorOf<[F32]>>:$saved_stats,
                       Optional<Ptc_IdTensor>:$positions, F64Attr:$scale);
  let results = (outs Ptc_FloatTensor:$qkv_grad);
  let assemblyFormat = [{
    $qkv `,` $grad (`saved` `(` $saved_result^ `,` $saved_stats `:` type($saved_result) `,` type($saved_stats) `)`)? (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` type($qkv) `,` type($grad)
  }];
  let hasVerifier = 1;
}

def Ptc_MatmulBiasGradOp : Ptc_Op<"matmul_bias_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_CostOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure]> {
  let summary = "a linear layer's weight-gradient product with its bias gradient";
  let description = [{
    `result` is `ptc.matmul %lhs, %rhs` of two rank-2 operands (with the same
    transposes); `bias_grad` is the sum of `lhs` over its contracted dimension
    (with `transpose_lhs`, `lhs` [k, m] summed over its k rows: the column
    sums of the upstream gradient, what a bias gradient `ptc.reduce_sum` over
    every dimension but the last gives), accumulated in f32 and rounded once.
    `ptc-fuse-matmul-bias` forms it after sharding from a weight-gradient
    product and the bias gradient of the same tensor, so that a GPU computes
    both in one cuBLASLt call (the BGRADB epilogue) and every backend runs
    one instruction where there were two.

    ```mlir
    %dw, %db = ptc.matmul_bias_grad %dy, %x {transpose_lhs = true}
        : tensor<512x384xf32>, tensor<512x128xf32> -> tensor<384x128xf32>, tensor<384xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$lhs, Ptc_FloatTensor:$rhs,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_lhs,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_rhs);
  let results = (outs Ptc_FloatTensor:$result, Ptc_FloatTensor:$bias_grad);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result) `,` type($bias_grad)
  }];
  let hasVerifier = 1;
}

def Ptc_EmbeddingGradOp : Ptc_Op<"embedding_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure]> {
  let summary = "gradient of `ptc.embedding`: rows scatter-added into the table shape";
  let description = [{
    `result[r, :] = sum of grad[i..., :] over positions with indices[i...] == r`;
    the result has the table's type. With `vocab_axis`, the result is this
    device's block of rows (as for `ptc.embedding`).

    ```mlir
    %dt = ptc.embedding_grad %tokens, %g
        : tensor<8x64xi32>, tensor<8x64x128xf32> -> tensor<256x128xf32>
    ```
  }];
  let arguments = (ins Ptc_IdTensor:$indices, Ptc_FloatTensor:$grad,
                       OptionalAttr<StrAttr>:$vocab_axis);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $indices `,` $grad attr-dict `:` type($indices) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_CrossEntropyGradOp : Ptc_Op<"cross_entropy_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure,
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "gradient of `ptc.cross_entropy` with respect to the logits";
  let description = [{
    `result = grad * (softmax(logits) - onehot(targets)) / num_positions`,
    with `grad` the scalar gradient of the mean loss (the logits' element
    type, or f32 over bf16 / f16 logits, as the loss). The result has the
    logits' type: computed in f32, rounded once.

    ```mlir
    %dl = ptc.cross_entropy_grad %logits, %targets, %g
        : tensor<8x64x256xf32>, tensor<8x64xi32>, tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets,
                       0DTensorOf<[F32, BF16, F16]>:$grad);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets `,` $grad attr-dict `:` type($logits) `,` type($targets) `,` type($grad)
  }];
  let hasVerifier = 1;
}

def Ptc_CrossEntropyWithGradOp : Ptc_Op<"cross_entropy_with_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AllTypesMatch<["logits", "logits_grad"]>]> {
  let summary = "the cross-entropy loss and its gradient in one pass over the logits";
  let description = [{
    `loss` is `ptc.cross_entropy %logits, %targets` and `logits_grad` is
    `ptc.cross_entropy_grad %logits, %targets, %grad`, computed together: each
    row's maximum and sum of exponentials serve both (the same numbers as the
    two ops). `ptc-fuse-cross-entropy-grad` forms it after sharding, where
    the loss and its gradient read the same logits and targets, so that the
    logits are read once for both (at GPT-2's 50257 classes the step's
    largest tensor).

    ```mlir
    %dl, %loss = ptc.cross_entropy_with_grad %logits, %targets, %g
        : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets,
                       0DTensorOf<[F32, BF16, F16]>:$grad);
  // In the plan instruction's order: CrossEntropyGrad's output, then the loss.
  let results = (outs Ptc_FloatTensor:$logits_grad, 0DTensorOf<[F32, BF16, F16]>:$loss);
  let assemblyFormat = [{
    $logits `,` $targets `,` $grad attr-dict `:` type($logits) `,` type($targets) `,` type($grad) `->` type($loss)
  }];
  let hasVerifier = 1;
}

def Ptc_ReduceMaxGradOp : Ptc_Op<"reduce_max_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "gradient of `ptc.reduce_max`";
  let description = [{
    Routes `grad` to the positions that hold the maximum, split evenly among
    ties (as `torch.amax`); zero elsewhere. `axes` and `keep_dims` are those
    of the forward op.

    ```mlir
    %dx = ptc.reduce_max_grad %x, %g axes = [1] : tensor<8x64xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_FloatTensor:$grad, DenseI64ArrayAttr:$axes,
                       DefaultValuedAttr<BoolAttr, "false">:$keep_dims);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad `axes` `=` $axes attr-dict `:` type($input) `,` type($grad)
  }];
  let hasVerifier = 1;
}

def Ptc_TopKGateGradOp : Ptc_Op<"top_k_gate_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "gradient of `ptc.top_k_gate` with respect to the router logits";
  let description = [{
    Differentiates the selected (and, with `normalize`, renormalized) softmax
    probabilities; the selection itself has no gradient.

    ```mlir
    %dl = ptc.top_k_gate_grad %logits, %e, %gw
        : tensor<512x8xf32>, tensor<512x2xi32>, tensor<512x2xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$indices,
                       Ptc_FloatTensor:$weights_grad,
                       DefaultValuedAttr<BoolAttr, "true">:$normalize);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $indices `,` $weights_grad attr-dict `:` type($logits) `,` type($indices) `,`
    type($weights_grad)
  }];
  let hasVerifier = 1;
}

def Ptc_MoeDispatchGradOp : Ptc_Op<"moe_dispatch_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure]> {
  let summary = "gradient of `ptc.moe_dispatch`: expert slots gathered back to tokens";
  let description = [{
    `result[g, t, :] = sum over assignments (t, j) -> (e, s) of group g within
    capacity of grad[e, g, s, :]` (shapes as `ptc.moe_dispatch`, with or
    without the group dimension).

    ```mlir
    %dx = ptc.moe_dispatch_grad %g, %e
        : tensor<8x4x40x64xf32>, tensor<4x128x2xi32> -> tensor<4x128x64xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$grad, Ptc_IdTensor:$indices);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $grad `,` $indices attr-dict `:` type($grad) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_MoeCombineGradOp : Ptc_Op<"moe_combine_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AllTypesMatch<["expert_output", "expert_output_grad"]>,
    AllTypesMatch<["weights", "weights_grad"]>]> {
  let summary = "gradient of `ptc.moe_combine` (expert outputs and weights)";
  let description = [{
    Per group g: `expert_output_grad[e, g, s, :] = weights[g, t, j] *
    grad[g, t, :]` for the assignment `(t, j) -> (e, s)` (zero for unused
    slots) and `weights_grad[g, t, j] = dot(grad[g, t, :],
    expert_output[e, g, s, :])` (zero when the assignment was dropped).
    Shapes as `ptc.moe_combine`.

    ```mlir
    %do, %dw = ptc.moe_combine_grad %out, %w, %e, %g
        : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32>, tensor<512x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$expert_output, Ptc_FloatTensor:$weights,
                       Ptc_IdTensor:$indices, Ptc_FloatTensor:$grad);
  let results = (outs Ptc_FloatTensor:$expert_output_grad, Ptc_FloatTensor:$weights_grad);
  let assemblyFormat = [{
    $expert_output `,` $weights `,` $indices `,` $grad attr-dict `:` type($expert_output) `,`
    type($weights) `,` type($indices) `,` type($grad)
  }];
  let hasVerifier = 1;
}

#endif // PTC_GRAD_OPS_TD
