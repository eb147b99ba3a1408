//===- Passes.td - memory planning -------------------------*- tablegen -*-===//

#ifndef PTC_PASSES_MEMORY_PASSES_TD
#define PTC_PASSES_MEMORY_PASSES_TD

include "mlir/Pass/PassBase.td"

def FoldAttentionLayoutPass : Pass<"ptc-fold-attention-layout", "::mlir::func::FuncOp"> {
  let summary = "Attention on the projections' [batch, seq, heads, head_dim] layout: no head transposes";
  let description = [{
    After sharding and pipeline splitting, before `ptc-plan-memory`. A model
    splits its projections into heads with `ptc.transpose ... permutation =
    [0, 2, 1, 3]` ([batch, seq, heads, head_dim] to [batch, heads, seq,
    head_dim]) before `ptc.causal_attention` and merges them back with the
    same transpose after it; the backward pass does the same around
    `ptc.causal_attention_grad`. Where every operand of an attention op (or
    its gradient) is such a transpose and every use of its results is one,
    the op takes the transposes' inputs instead, with `seq_major = true`, and
    its results replace the transposes after it: the kernels read and write
    the heads where they are, and the transposes' copies and buffers go
    (4 per layer forward, 4 backward). The numbers are the same. Transposes
    left without uses are erased.

    First, a rotary embedding between a head transpose and attention (Llama's
    query and key, and their gradients' inverse rotations after attention's
    gradient; `ptc.rotary_at` at packed documents' positions too) moves to
    the other side of the transpose, seq-major (`ptc.rotary {seq_major =
    true}` rotates each head row by its sequence index in the `[batch, seq,
    heads, head_dim]` layout), where the transpose has no other use: `rotary(transpose(y))` becomes `transpose(rotary(y))` and
    `transpose(rotary(g))` becomes `rotary(transpose(g))`, so the fold below
    finds transposes on every operand and result. On a Llama this removes
    all 8 transposes per layer.

    Then, where the three operands of seq-major attention are the column
    blocks of one fused projection `[batch, seq, (heads + 2 * kv_heads) *
    head_dim]` (query, key, value in that order, sliced out and reshaped into
    heads), the op becomes `ptc.causal_attention_qkv` of the projection, and
    its gradient, where the three gradients are only concatenated back in
    that layout, `ptc.causal_attention_qkv_grad`, which replaces the
    concatenation: the kernels read and write the blocks in place, and the
    slices' and the concatenation's copies and buffers go (on the bench GPT,
    1.1-2.0 ms per one-core step). The numbers are the same.

    Input:
    ```mlir
    %q = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<8x64x4x32xf32> -> tensor<8x4x64x32xf32>
    ...
    %o = ptc.causal_attention %q, %k, %v : tensor<8x4x64x32xf32>
    %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<8x4x64x32xf32> -> tensor<8x64x4x32xf32>
    ```
    Output:
    ```mlir
    %os = ptc.causal_attention %qs, %ks, %vs {seq_major = true} : tensor<8x64x4x32xf32>
    ```
  }];
}

def SaveAttentionStatsPass : Pass<"ptc-save-attention-stats", "::mlir::func::FuncOp"> {
  let summary = "Attention's backward reads the forward's softmax statistics instead of recomputing them";
  let description = [{
    After `ptc-fold-attention-layout`, before `ptc-plan-memory`. A causal
    attention gradient (`ptc.causal_attention_grad`,
    `ptc.causal_attention_qkv_grad`) recomputes the forward's softmax: each
    query row's scores, their maximum and sum. Where a forward of the same
    query, key and value (the same values: the same projection, or its
    recomputation under `recompute`), positions and scale comes before it in
    its block, the forward also returns its rows' log-sum-exp (`stats`, f32
    `[batch, heads, seq]`: 4 bytes per query row and head, 1/16 to 1/32 of
    the bf16 result) and the gradient takes the forward's result and those
    statistics (`saved`): the kernels make the probabilities as
    `exp(scale * q k^T - lse)` and take the rows' `grad . result` for the sum
    the softmax's gradient needs, so the backward pass runs no softmax
    reduction, and on GPUs no second forward (cuDNN's backward takes the
    statistics and the result directly). The forward's result is kept until
    the gradient (it usually is already: the output projection's weight
    gradient reads it). Ring attention (context parallelism,
    `ptc.ring_attention_grad`) pairs likewise with the `ptc.ring_attention`
    of the same blocks, axis and scale: its forward returns the rows'
    log-sum-exp over every block of the ring, and the gradient, given them,
    skips the ring it ran for them (about a third of its block transfers,
    2/7 of its attention FLOPs).

    Input:
    ```mlir
    %o = ptc.causal_attention_qkv %qkv {scale = 0.125 : f64} : tensor<8x64x384xbf16> -> tensor<8x64x4x32xbf16>
    ...
    %dqkv = ptc.causal_attention_qkv_grad %qkv, %g {scale = 0.125 : f64} : tensor<8x64x384xbf16>, tensor<8x64x4x32xbf16>
    ```
    Output:
    ```mlir
    %o, %lse = ptc.causal_attention_qkv %qkv {scale = 0.125 : f64} : tensor<8x64x384xbf16> -> tensor<8x64x4x32xbf16> stats tensor<8x4x64xf32>
    ...
    %dqkv = ptc.causal_attention_qkv_grad %qkv, %g saved(%o, %lse : tensor<8x64x4x32xbf16>, tensor<8x4x64xf32>) {scale = 0.125 : f64} : tensor<8x64x384xbf16>, tensor<8x64x4x32xbf16>
    ```
  }];
}

def FuseSwigluPass : Pass<"ptc-fuse-swiglu", "::mlir::func::FuncOp"> {
  let summary = "silu(gate) * up and its gradient as ptc.swiglu / ptc.swiglu_grad";
  let description = [{
    After autodiff and sharding, before `ptc-plan-memory`. Where a `ptc.silu`
    feeds only its product with `up` (a SwiGLU MLP: Llama, Mistral, Qwen) and,
    in training, the backward's product of the incoming gradient `g` with it,
    with `g * up` feeding only the `ptc.silu_grad` of the gate: the forward
    becomes one `ptc.swiglu` and the backward one `ptc.swiglu_grad`, one pass
    over the tensors each instead of two and three, and the activation
    `silu(gate)` is no longer kept from the forward to the backward (the
    gradient recomputes it). f32 results are the same (the same products in
    the same order); bf16 ones are rounded once instead of twice. The ops of
    each half must carry the same discardable attributes (pipeline stage,
    segment, forward or backward).

    Input:
    ```mlir
    %s = ptc.silu %a : tensor<8x64x1408xf32>
    %h = ptc.mul %s, %b : tensor<8x64x1408xf32>, tensor<8x64x1408xf32> -> tensor<8x64x1408xf32>
    ...
    %t = ptc.mul %g, %b {ptc.backward} : tensor<8x64x1408xf32>, tensor<8x64x1408xf32> -> tensor<8x64x1408xf32>
    %db = ptc.mul %g, %s {ptc.backward} : tensor<8x64x1408xf32>, tensor<8x64x1408xf32> -> tensor<8x64x1408xf32>
    %da = ptc.silu_grad %a, %t {ptc.backward} : tensor<8x64x1408xf32>
    ```
    Output:
    ```mlir
    %h = ptc.swiglu %a, %b : tensor<8x64x1408xf32>
    ...
    %da, %db = ptc.swiglu_grad %a, %b, %g {ptc.backward} : tensor<8x64x1408xf32>
    ```
  }];
}

def FuseCrossEntropyGradPass : Pass<"ptc-fuse-cross-entropy-grad", "::mlir::func::FuncOp"> {
  let summary = "The loss and its gradient in one op: the logits read once for both";
  let description = [{
    After `ptc-fuse-loss-widening`, before `ptc-plan-memory`. A
    `ptc.cross_entropy` and the `ptc.cross_entropy_grad` of the same logits
    and targets each find every row's maximum and sum of exponentials: at
    GPT-2's 50257 classes the logits are the step's largest tensor, read two
    times by the loss and three by its gradient. Where both are in one block,
    they become one `ptc.cross_entropy_with_grad`, which reads each row once
    for the statistics both need and once for the gradient, in one kernel
    launch. It takes the gradient's place when every use of the loss comes
    after the gradient (one step without micro-batches: the loss is only
    returned), else the loss's place (micro-batches and pipeline stages sum
    the loss in the forward pass; context parallelism averages it), with the
    loss gradient (`grad`, the seed) computed there: where it is not there
    yet, the chain of pure ops from constants that makes it (the seed, scaled
    by 1 / micro-batches) is cloned in with the loss's pipeline segment and
    stage, and the old chain goes. A seed made otherwise keeps the two apart.
    The numbers are the same: the CPU and CUDA kernels compute the two
    results as the separate kernels do. The fused op carries the attributes
    of the op whose place it takes. The vocabulary-parallel pair
    (`ptc.vocab_parallel_cross_entropy` and its gradient over the same mesh
    axes: tensor parallelism over the classes) becomes one
    `ptc.vocab_parallel_cross_entropy_with_grad` likewise: the rows' maxima
    and sums, combined over the group once, serve both (two reductions over
    each device's block of logits and two small all-reduces fewer).

    Input:
    ```mlir
    %loss = ptc.cross_entropy %logits, %t : tensor<8x64x256xbf16>, tensor<8x64xi32> -> tensor<f32>
    %seed = arith.constant {ptc.backward, ptc.loss_seed} dense<1.0> : tensor<f32>
    %g = ptc.cross_entropy_grad %logits, %t, %seed {ptc.backward} : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32>
    ```
    Output:
    ```mlir
    %seed = arith.constant {ptc.backward, ptc.loss_seed} dense<1.0> : tensor<f32>
    %g, %loss = ptc.cross_entropy_with_grad %logits, %t, %seed {ptc.backward} : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32> -> tensor<f32>
    ```
  }];
}

def FuseGradientWideningPass : Pass<"ptc-fuse-gradient-widening", "::mlir::func::FuncOp"> {
  let summary = "Optimizer updates read bf16 / f16 gradients directly";
  let description = [{
    After sharding, collectives and offload, before `ptc-plan-memory`. Mixed
    precision computes gradients in bf16 (or f16) and converts each to f32
    for the update of its f32 master weight. Where such a `ptc.convert` feeds
    only a `ptc.adamw_update` or `ptc.sgd_update` on the device, the update
    takes the low-precision gradient itself and widens it as it reads it (the
    same values: widening is exact). The f32 gradient buffers go: the arena
    no longer holds an f32 copy of every gradient until the optimizer step,
    and the step no longer writes and reads them back. Updates offloaded to
    the host (`ptc.on_host`) keep their f32 gradients.

    Input:
    ```mlir
    %g = ptc.convert %g16 {ptc.backward} : tensor<768x256xbf16> -> tensor<768x256xf32>
    %p2, %m2, %v2 = ptc.adamw_update %p, %g, %m, %v, %t {...} : tensor<768x256xf32>, tensor<f32>
    ```
    Output:
    ```mlir
    %p2, %m2, %v2 = ptc.adamw_update %p, %g16, %m, %v, %t {...}
        : tensor<768x256xf32> grad(tensor<768x256xbf16>), tensor<f32>
    ```
  }];
}

def KeepWorkingCopiesPass : Pass<"ptc-keep-working-copies", "::mlir::func::FuncOp"> {
  let summary = "The optimizer update writes each parameter's bf16 / f16 working copy";
  let description = [{
    After sharding, collectives, offload and ptc-fuse-gradient-widening,
    before `ptc-plan-memory`. Mixed precision converts every f32 master
    weight to bf16 (or f16) at the start of each step: one conversion per
    parameter (292 for GPT-2 medium), reading 4 and writing 2 bytes per
    parameter every step. Where a parameter's conversions to one low type
    come before its `ptc.adamw_update` or `ptc.sgd_update` on the device,
    and the update's new parameter is written back in place (`ptc.update`),
    the function gets a new argument holding that rounding across steps
    (`ptc.working_copy = "<parameter>"`, the parameter's sharding and
    pipeline stage), the conversions are replaced by it, and the update also
    returns the new parameter rounded to the low type (its optional
    `working_copy` result), written back into the argument (a result with
    `ptc.working_copy = "<parameter>"`). The numbers are the same: the update
    rounds exactly as the conversion did. The copy is 2 bytes per parameter
    (of the device's shard) held between steps; the arena no longer holds the
    converted copies. The runtime rounds the parameter into it whenever it
    sets the parameter from outside a step (initialization, checkpoints).
    Updates on the host (`ptc.on_host`) and other optimizers (Adafactor,
    Muon: built from primitive ops) keep their conversions, and so does a
    conversion a pipeline `ptc.send` reads (a tied weight another stage
    uses: the schedule sends what its micro-batch computes).

    Input:
    ```mlir
    func.func @step(%p: tensor<64xf32> {ptc.param = "w"}, ...) -> (tensor<64xf32> {ptc.update = "w"}, ...) {
      %w16 = ptc.convert %p : tensor<64xf32> -> tensor<64xbf16>
      ...
      %p2, %m2, %v2 = ptc.adamw_update %p, %g16, %m, %v, %t {...} : tensor<64xf32> grad(tensor<64xbf16>), tensor<f32>
      return %p2, ... : ...
    }
    ```
    Output:
    ```mlir
    func.func @step(%p: tensor<64xf32> {ptc.param = "w"}, ..., %w16: tensor<64xbf16> {ptc.working_copy = "w"})
        -> (tensor<64xf32> {ptc.update = "w"}, ..., tensor<64xbf16> {ptc.working_copy = "w"}) {
      ...
      %p2, %m2, %v2, %c2 = ptc.adamw_update %p, %g16, %m, %v, %t {...}
          : tensor<64xf32> grad(tensor<64xbf16>), tensor<f32> working_copy(tensor<64xbf16>)
      return %p2, ..., %c2 : ...
    }
    ```
  }];
}

def FuseLossWideningPass : Pass<"ptc-fuse-loss-widening", "::mlir::func::FuncOp"> {
  let summary = "The cross-entropy reads bf16 / f16 logits directly";
  let description = [{
    After sharding, before `ptc-plan-memory`. Mixed precision computes the
    loss in f32 over logits widened from bf16 (or f16) by a `ptc.convert`,
    and the logits' gradient in f32, converted back. Where a
    `ptc.cross_entropy` or `ptc.cross_entropy_grad` reads such widened logits,
    it reads the low-precision logits instead (the loss stays f32; widening is
    exact, so the numbers are the same); a gradient whose only use is the
    conversion back to the logits' type is produced in that type directly
    (computed in f32 and rounded once, as the conversion rounded it). The
    widened logits and the f32 gradient go: at GPT-2's 50257 classes they are
    the step's two largest tensors (1.6 GB each at 8 x 1024 tokens), and the
    step no longer writes and reads them. The vocabulary-parallel
    cross-entropy (`ptc.vocab_parallel_cross_entropy[_grad]`: tensor
    parallelism over the classes) likewise reads each rank's block of
    low-precision logits and writes its gradient in their type.

    Input:
    ```mlir
    %w = ptc.convert %logits : tensor<8x64x256xbf16> -> tensor<8x64x256xf32>
    %loss = ptc.cross_entropy %w, %t : tensor<8x64x256xf32>, tensor<8x64xi32> -> tensor<f32>
    %g = ptc.cross_entropy_grad %w, %t, %seed {ptc.backward} : tensor<8x64x256xf32>, tensor<8x64xi32>, tensor<f32>
    %g16 = ptc.convert %g {ptc.backward} : tensor<8x64x256xf32> -> tensor<8x64x256xbf16>
    ```
    Output:
    ```mlir
    %loss = ptc.cross_entropy %logits, %t : tensor<8x64x256xbf16>, tensor<8x64xi32> -> tensor<f32>
    %g16 = ptc.cross_entropy_grad %logits, %t, %seed {ptc.backward} : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32>
    ```
  }];
}

def FuseMatmulBiasPass : Pass<"ptc-fuse-matmul-bias", "::mlir::func::FuncOp"> {
  let summary = "Bias adds after matmuls and bias gradients beside weight gradients as matmul epilogues";
  let description = [{
    After sharding and pipeline splitting, before `ptc-plan-memory`. Where a
    `ptc.add` adds a vector of the last dimension (a linear layer's bias) to
    the result of a `ptc.matmul` that feeds nothing else, the matmul takes
    the bias as its optional third operand and replaces the add: the kernels
    add it to the accumulator before the result is stored (oneDNN's bias
    argument for bf16 on CPUs, which costs ~1% of the product against a
    separate pass over the result; for f32 in place after the GEMM), and the
    add's result buffer goes. f32 results are the same (the same add, in the
    same order); bf16 results are rounded once instead of twice. Both ops
    must carry the same discardable attributes (pipeline stage, segment).

    Input:
    ```mlir
    %y = ptc.matmul %x, %w {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32> -> tensor<8x64x384xf32>
    %z = ptc.add %y, %b : tensor<8x64x384xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
    ```
    Output:
    ```mlir
    %z = ptc.matmul %x, %w, %b {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
    ```

    In the backward pass, the bias gradient joins the weight gradient: where
    a `ptc.reduce_sum` sums a gradient over every dimension but the last (a
    bias gradient) and a `ptc.matmul` with `transpose_lhs` reads the same
    gradient, as it is or reshaped to rank 2 with the same last dimension, as
    its lhs (the weight gradient), the two become one
    `ptc.matmul_bias_grad` at the matmul, whose second result is the sum: the
    same additions in the same order on the CPU (column sums over the rows,
    in f32), one cuBLASLt call with the BGRADB epilogue on a GPU. Every use of
    the sum must come after the matmul, and both ops carry the same
    discardable attributes.

    Input:
    ```mlir
    %db = ptc.reduce_sum %dy axes = [0, 1] : tensor<8x64x384xf32> -> tensor<384xf32>
    %g = ptc.reshape %dy : tensor<8x64x384xf32> -> tensor<512x384xf32>
    %dw = ptc.matmul %g, %x {transpose_lhs = true} : tensor<512x384xf32>, tensor<512x128xf32> -> tensor<384x128xf32>
    ```
    Output:
    ```mlir
    %g = ptc.reshape %dy : tensor<8x64x384xf32> -> tensor<512x384xf32>
    %dw, %db = ptc.matmul_bias_grad %g, %x {transpose_lhs = true} : tensor<512x384xf32>, tensor<512x128xf32> -> tensor<384x128xf32>, tensor<384xf32>
    ```
  }];
}

def PlanMemoryPass : Pass<"ptc-plan-memory", "::mlir::func::FuncOp"> {
  let summary = "Assign arena offsets to temporaries from their lifetimes";
  let description = [{
    Every op result that lives in the per-step arena (all except constants
    and in-place updates of parameters/state) gets a live interval from its
    definition to its last use (to the end for returned values). Buffers are
    placed greedily, largest first, at the lowest 64-byte-aligned offset that
    does not overlap any buffer live at the same time; an op's results never
    share memory with its operands, except a `ptc.reshape`, whose result is a
    view of its operand's buffer (the copy becomes a no-op).

    The result is recorded as attributes: `ptc.offsets = array<i64: ...>` on
    each op (one per result, -1 outside the arena) and `ptc.arena_bytes` /
    `ptc.arena_bytes_unshared` on the function. With `report`, prints one line
    per function: buffers, arena bytes and what no reuse would need.
  }];
  let options = [
    Option<"report", "report", "bool", /*default=*/"false",
           "Print the arena size and the saving from buffer reuse">
  ];
}

def OffloadOptimizerPass : Pass<"ptc-offload-optimizer", "::mlir::func::FuncOp"> {
  let summary = "Keep fp32 master weights and optimizer state in host memory (ZeRO-Offload)";
  let description = [{
    After sharding (and pipeline splitting), before `ptc-plan-memory`: the
    parameters (fp32 master weights under mixed precision), the optimizer's
    state and the optimizer's per-parameter math move to the host, as
    ZeRO-Offload does. An op runs on the host (`ptc.on_host`) when it is part
    of a parameter's update: it lies on the path from a gradient (the value
    an update reads) to the returned new value of a parameter or optimizer
    state, and is not a collective or a gradient-wide op (loss-scale
    unscaling, norm clipping, the learning-rate schedule stay on the device).
    A state argument moves to the host when only host ops read it. Two
    conversions move too, so that low-precision bytes cross: a gradient's
    widening to f32 when only host ops read it, and a master weight's
    narrowing to its low-precision working copy.
    Every value that crosses gets one `ptc.transfer`: to the device before
    its first device user, to the host right after it is computed (a
    gradient leaves during the backward pass; inside a pipeline segment,
    before its first host user instead). `ptc-plan-memory` places only device
    values in the arena, and the plan marks host tensors and host
    instructions.
  }];
  let options = [
    Option<"what", "what", "std::string", /*default=*/"\"optimizer\"",
           "What moves to the host: optimizer (the only choice so far)">
  ];
}

def ReportMemoryPass : Pass<"ptc-report-memory", "::mlir::ModuleOp"> {
  let summary = "Per-device memory: model state, saved activations, buffers, predicted peak";
  let description = [{
    After `ptc-plan-memory`, prints per device (local shapes): the bytes of
    parameters, gradients (the values the optimizer consumes), optimizer
    state, inputs and constants, activations the backward pass keeps (values
    computed before the first `ptc.backward` op and read after it), the
    largest communication buffer, the planned arena of temporaries, and the
    predicted peak = persistent tensors + arena + communication buffer — what
    `ptc-run` allocates. Without a tensor-parallel axis it also prints the
    ZeRO paper's model-state formula for the stage in use (fp32 AdamW:
    4 + 4 + 8 bytes per parameter).

    With `device-memory` (e.g. 80GB, 512MiB), a predicted peak above it is an
    error naming the largest consumers. With `params` (e.g. 7.5e9) it reads no
    IR and prints the ZeRO paper's model-state memory per device for `dp`
    devices at every stage (mixed-precision AdamW: 2 + 2 + 12 bytes per
    parameter; `fp32`: 4 + 4 + 8), with `tp` and `pp` splitting the
    parameters evenly first (Megatron's ideal split). Activations, sequence
    parallelism, recomputation and uneven stages need the model's shapes:
    compile them (`ptc-model ... --preset NAME`, seconds) with `report-memory`.
  }];
  let options = [
    Option<"deviceMemory", "device-memory", "std::string", /*default=*/"\"\"",
           "Fail when the predicted peak exceeds this (e.g. 80GB, 512MiB)">,
    Option<"params", "params", "double", /*default=*/"0",
           "Estimate for a model of this many parameters without IR">,
    Option<"dp", "dp", "int", /*default=*/"1", "Data-parallel devices (with params)">,
    Option<"tp", "tp", "int", /*default=*/"1", "Tensor-parallel devices (with params)">,
    Option<"pp", "pp", "int", /*default=*/"1", "Pipeline stages (with params)">,
    Option<"fp32", "fp32", "bool", /*default=*/"false",
           "With params: fp32 training instead of mixed precision">
  ];
}

#endif // PTC_PASSES_MEMORY_PASSES_TD
