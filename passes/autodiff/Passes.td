//===- Passes.td - autodiff and optimizer passes -----------*- tablegen -*-===//

#ifndef PTC_PASSES_AUTODIFF_PASSES_TD
#define PTC_PASSES_AUTODIFF_PASSES_TD

include "mlir/Pass/PassBase.td"

def AutodiffPass : Pass<"ptc-autodiff", "::mlir::func::FuncOp"> {
  let summary = "Reverse-mode automatic differentiation of a loss function";
  let description = [{
    Turns a function with `ptc.param` arguments that returns one scalar loss
    into forward + backward in the same function: after the forward ops it
    emits, in reverse order, each op's vector-Jacobian product (the op's
    `DifferentiableOpInterface` rule), summing gradients of values with
    several uses. Only values that depend on a parameter and that the loss
    depends on get gradients; everything else is pruned. A parameter the loss
    does not use gets a zero gradient.

    Input:
    ```mlir
    func.func @f(%w: tensor<4x8xf32> {ptc.param = "w"}, %x: tensor<2x8xf32> {ptc.input = "x"})
        -> tensor<f32>
    ```
    Output:
    ```mlir
    func.func @f(%w: ..., %x: ...) -> (tensor<f32> {ptc.loss}, tensor<4x8xf32> {ptc.grad = "w"})
    ```
    Functions without `ptc.param` arguments are left alone.

    With `loss-scale = S` the backward pass starts from S instead of 1 and
    every gradient is divided by S at the end (static loss scaling: small
    fp16 gradients stay representable).
  }];
  let options = [
    Option<"lossScale", "loss-scale", "double", /*default=*/"1.0",
           "Seed the backward pass with this factor and divide gradients by it">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect", "::mlir::arith::ArithDialect"];
}

def MixedPrecisionPass : Pass<"ptc-mixed-precision", "::mlir::func::FuncOp"> {
  let summary = "Compute the forward model in bf16 or f16 with fp32 master weights";
  let description = [{
    Runs on the forward model, before `ptc-autodiff`. Every f32 parameter
    stays f32 (the master copy the optimizer updates) and gets one
    `ptc.convert` to `dtype` for its uses; float inputs and constants are
    converted where used; every op computes in `dtype` — except the
    cross-entropy, which reads its logits in f32 so that the loss keeps full
    precision. Returned values are converted back to f32. The backward pass
    (the VJP of `ptc.convert` is a convert back) then produces f32 gradients
    for the f32 optimizer.
  }];
  let options = [
    Option<"dtype", "dtype", "std::string", /*default=*/"\"bf16\"", "bf16 or f16">
  ];
}

def RecomputePass : Pass<"ptc-recompute", "::mlir::func::FuncOp"> {
  let summary = "Rematerialize forward values in the backward pass instead of keeping them";
  let description = [{
    Runs after `ptc-autodiff` (and `ptc-optimizer`). Every forward value the
    backward pass reads is either kept (saved activation) or, when chosen,
    recomputed: its forward op is cloned, with the ops it needs, right before
    its first backward use, and the backward ops read the clone. Clones carry
    `ptc.recomputed` and `ptc.backward` (and, micro-batched, the `ptc.vjp_of`
    of the op they copy), so the sharding, stage and memory passes treat them
    as backward work: the forward value dies in the forward pass and the
    memory planner reuses its buffer. Kernels are deterministic, so the
    losses are bitwise those without recomputation.

    - `full`: keep only the residual stream (the input of every row
      normalization: ops with the `RowNormalization` trait), the parameters and inputs, and the loss's logits; recompute
      everything else (Korthikanti et al.'s full recomputation, at sub-layer
      granularity: two kept values per transformer layer).
    - `selective`: recompute the values of cheap ops (activations,
      elementwise arithmetic, layout changes, rotary embeddings) and of
      attention from operands that are kept anyway, so no new value is kept:
      the memory-heavy, FLOP-light part of each layer (attention output and
      the MLP's activated hidden state).

    With `layers` = N >= 0 only the first N transformer layers of each
    pipeline chunk are recomputed (Megatron's `--recompute-num-layers` with
    the block method): a forward op is in layer i when it reads a parameter
    named `transformer.h.<i>.*` or `model.layers.<i>.*` (ptc-model's names),
    in no layer when it reads another parameter (embeddings, final norm,
    head: then kept), and otherwise in the latest layer of its operands; the
    layers split evenly over the `chunks` pipeline chunks.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"full\"", "full or selective">,
    Option<"layers", "layers", "int64_t", /*default=*/"-1",
           "Recompute only the first N layers of each pipeline chunk (-1: every op)">,
    Option<"chunks", "chunks", "int64_t", /*default=*/"1",
           "Pipeline chunks (pp size x virtual stages) the layers split over">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

def OptimizerPass : Pass<"ptc-optimizer", "::mlir::func::FuncOp"> {
  let summary = "Append the optimizer step (AdamW, SGD, Adafactor or Muon) after the backward pass";
  let description = [{
    Takes a function from `ptc-autodiff` (results: `ptc.loss`, then one
    `ptc.grad` per parameter) and adds the optimizer: state arguments
    (`ptc.state`: `<param>.exp_avg`, `<param>.exp_avg_sq` and `optimizer.step`
    for AdamW; `<param>.momentum_buffer` for SGD; `<param>.exp_avg_sq_row` /
    `_col` (matrices) or `<param>.exp_avg_sq` (vectors), `optimizer.step` and
    with `adafactor-beta1` > 0 `<param>.exp_avg` for Adafactor), optional
    global-norm gradient clipping, and one update per parameter: a fused op
    for AdamW and SGD, primitive ops for Adafactor (its row / column means and
    the update's RMS are reductions that shard by the ops' rules). Results become the
    loss, the gradient norm (when clipping), and the new value of every
    parameter and state (`ptc.update = "<name>"`), which plans apply in place.

    Muon (`optimizer=muon`) updates the hidden matrices (parameters of rank
    >= 2 read only as a matmul operand, not an embedding table and not the
    output head, whose product reaches the cross-entropy) with momentum
    (`<param>.momentum_buffer`), optionally Nesterov, orthogonalized by
    `muon-ns-steps` quintic Newton-Schulz iterations in `muon-ns-dtype`
    (batched matmuls over the matrices of one shape) and scaled by
    `muon-scale * sqrt(max(rows, cols))` (Moonlight's AdamW-matched RMS):
    ```
    b = momentum * b + g;  u = nesterov ? g + momentum * b : b
    X = u / (|u|_F + 1e-7);  5x: A = X X^T, X = a X + (b A + c A A) X
    p = p * (1 - lr * weight_decay) - lr * muon-scale * sqrt(max(rows, cols)) * X
    ```
    (`a, b, c = 3.4445, -4.7750, 2.0315`; a tall matrix iterates on X^T X).
    Every other parameter takes AdamW with `beta1`, `beta2`, `eps` and the
    same `lr`. The matrices of one shape are stacked and iterate as one
    batch; with `muon-ranks` R > 1 (the data-parallel size; ptc-compile sets
    it) a stack is padded to a multiple of R (repeats of its first matrices)
    and ptc-propagate-sharding deals it over dp: every rank orthogonalizes
    ceil(k / R) of its k matrices and the results are gathered (or, for
    ZeRO-sharded parameters, exchanged all-to-all into their shards).
    `muon-ranks=0` stacks nothing (each matrix alone): pipeline stages, which
    each update their own matrices, compile so.

    Weight decay applies to parameters of rank >= 2 only (matrices and
    embeddings, not biases or LayerNorm weights), as nanoGPT configures
    torch.optim.AdamW.

    With a learning-rate schedule (`lr-schedule` other than constant, or
    `warmup-steps` > 0), one `ptc.lr_schedule` computes each step's rate from
    the step count (`optimizer.step`, added for SGD too), every update reads
    it, and the step returns it as `ptc.lr` (the plan output `lr`).

    With AdamW or SGD, a step whose gradients are not all finite changes nothing
    (`skip-nonfinite`, on by default): `ptc.any_nonfinite` reads the gradients
    and flags the step, every update takes the flag as its `skip`, and the step
    returns it as `ptc.skipped` (the plan output `skipped`, which ptc-run
    reports). The step count still advances on such a step (its learning rate
    too), so that the count is the same value on every pipeline rank; with
    dynamic loss scaling the scaling's own overflow flag does this, and an
    overflowing step does not count.
  }];
  let options = [
    Option<"optimizer", "optimizer", "std::string", /*default=*/"\"adamw\"",
           "adamw, sgd, adafactor or muon">,
    Option<"lr", "lr", "double", /*default=*/"1e-3", "Learning rate">,
    Option<"beta1", "beta1", "double", /*default=*/"0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", /*default=*/"0.999", "AdamW beta2">,
    Option<"eps", "eps", "double", /*default=*/"1e-8", "AdamW epsilon">,
    Option<"weightDecay", "weight-decay", "double", /*default=*/"0.0",
           "Weight decay (decoupled for AdamW, L2 for SGD) on rank >= 2 parameters">,
    Option<"momentum", "momentum", "double", /*default=*/"0.9", "SGD momentum">,
    Option<"dynamicLossScale", "dynamic-loss-scale", "bool", /*default=*/"false",
           "Dynamic loss scaling: skip steps whose gradients overflow and halve the scale">,
    Option<"lossScaleInit", "loss-scale-init", "double", /*default=*/"65536.0",
           "Initial dynamic loss scale">,
    Option<"lossScaleWindow", "loss-scale-window", "int64_t", /*default=*/"1000",
           "Double the dynamic loss scale after this many steps without overflow">,
    Option<"skipNonfinite", "skip-nonfinite", "bool", /*default=*/"true",
           "Skip the update of a step whose gradients are not all finite (NaN or inf): "
           "parameters and optimizer state stay as they were (ptc.any_nonfinite flags "
           "the step; the plan output 'skipped' says so). AdamW and SGD">,
    Option<"maxGradNorm", "max-grad-norm", "double", /*default=*/"0.0",
           "Clip gradients to this global L2 norm (0: no clipping)">,
    Option<"lrSchedule", "lr-schedule", "std::string", /*default=*/"\"constant\"",
           "constant, cosine or linear: the rate of each step from the step count "
           "(ptc.lr_schedule), with warmup-steps of linear warmup">,
    Option<"warmupSteps", "warmup-steps", "int64_t", /*default=*/"0",
           "Linear warmup steps">,
    Option<"decaySteps", "decay-steps", "int64_t", /*default=*/"0",
           "Step at which the cosine / linear decay reaches min-lr">,
    Option<"minLr", "min-lr", "double", /*default=*/"0.0",
           "Learning rate after decay-steps">,
    Option<"adafactorBeta1", "adafactor-beta1", "double", /*default=*/"0.0",
           "Adafactor first-moment decay (0: no first moment, Hugging Face's beta1=None)">,
    Option<"adafactorEps", "adafactor-eps", "double", /*default=*/"1e-30",
           "Adafactor regularizer added to the squared gradient (eps[0])">,
    Option<"clipThreshold", "clip-threshold", "double", /*default=*/"1.0",
           "Adafactor update clipping: the update's RMS is at most this">,
    Option<"decayRate", "decay-rate", "double", /*default=*/"0.8",
           "Adafactor second-moment decay 1 - t^-decay-rate">,
    Option<"muonMomentum", "muon-momentum", "double", /*default=*/"0.95",
           "Muon momentum (b = momentum * b + g)">,
    Option<"muonNesterov", "muon-nesterov", "bool", /*default=*/"true",
           "Muon: orthogonalize g + momentum * b (Nesterov) instead of b">,
    Option<"muonNsSteps", "muon-ns-steps", "int64_t", /*default=*/"5",
           "Muon: Newton-Schulz iterations">,
    Option<"muonNsDtype", "muon-ns-dtype", "std::string", /*default=*/"\"f32\"",
           "Muon: element type of the Newton-Schulz iterations (f32 or bf16)">,
    Option<"muonScale", "muon-scale", "double", /*default=*/"0.2",
           "Muon: the update is scaled by muon-scale * sqrt(max(rows, cols))">,
    Option<"muonRanks", "muon-ranks", "int64_t", /*default=*/"1",
           "Muon: deal the orthogonalizations over this many data-parallel ranks "
           "(stacks padded to a multiple of it per matrix shape; 1: stacks, no dealing; 0: each "
           "matrix alone, as pipeline stages need)">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect", "::mlir::arith::ArithDialect"];
}

#endif // PTC_PASSES_AUTODIFF_PASSES_TD
