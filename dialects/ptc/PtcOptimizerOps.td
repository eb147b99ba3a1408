//===- PtcOptimizerOps.td - optimizer update ops -----------*- tablegen -*-===//
//
// Fused parameter updates that `ptc-optimizer` appends after the backward
// pass. Each op takes a parameter, its gradient and its optimizer state and
// returns the new parameter and state (the plan updates them in place).
//
//===----------------------------------------------------------------------===//

#ifndef PTC_OPTIMIZER_OPS_TD
#define PTC_OPTIMIZER_OPS_TD

def Ptc_LrScheduleOp : Ptc_Op<"lr_schedule", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, AllTypesMatch<["step", "result"]>]> {
  let summary = "the learning rate of this step from the step count";
  let description = [{
    `step` counts this step (1 for the first; the optimizer state
    `optimizer.step` after its increment), so the rate resumes with a
    checkpoint. With `it = step - 1` (nanoGPT's iteration index), `W` =
    `warmup_steps`, `D` = `decay_steps`:
    ```
    it < W:       lr * (it + 1) / (W + 1)                      (linear warmup)
    constant:     lr
    it > D:       min_lr
    otherwise:    r = (it - W) / (D - W)
                  cosine: min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr)
                  linear: min_lr + (1 - r) * (lr - min_lr)
    ```
    which is nanoGPT's `get_lr` (cosine) and Megatron's cosine / linear decay
    after warmup.

    ```mlir
    %lr = ptc.lr_schedule %t {kind = "cosine", lr = 6.0e-4 : f64, min_lr = 6.0e-5 : f64,
                              warmup_steps = 100 : i64, decay_steps = 5000 : i64} : tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$step, StrAttr:$kind, F64Attr:$lr, F64Attr:$min_lr,
                       I64Attr:$warmup_steps, I64Attr:$decay_steps);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let assemblyFormat = "$step attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Ptc_AdamWUpdateOp : Ptc_Op<"adamw_update", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, DeclareOpInterfaceMethods<Ptc_FusedUpdateOpInterface>, Pure, AttrSizedOperandSegments,
    AllTypesMatch<["param", "exp_avg", "exp_avg_sq", "new_param", "new_exp_avg",
                   "new_exp_avg_sq"]>]> {
  let summary = "one AdamW step (torch.optim.AdamW semantics, decoupled weight decay)";
  let description = [{
    With `t = step` (a scalar already counting this step); with `skip` (a
    scalar, dynamic loss scaling) non-zero, nothing changes; with
    `scheduled_lr` (a `ptc.lr_schedule`), that value replaces `lr`:
    ```
    p  = p * (1 - lr * weight_decay)
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g * g
    p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    ```
    The gradient has the parameter's type, or (f32 master weights under
    mixed precision, `ptc-fuse-gradient-widening`) its shape in bf16 or f16,
    widened exactly as it is read: `grad(<type>)` after the parameter's type.
    With the optional result `working_copy` (bf16 or f16, the parameter's
    shape; `ptc-keep-working-copies`), the update also writes the new
    parameter rounded to that type (exactly what a `ptc.convert` of it
    gives; under `skip`, the old parameter's rounding).

    ```mlir
    %p2, %m2, %v2 = ptc.adamw_update %p, %g, %m, %v, %t
        {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64,
         weight_decay = 0.1 : f64} : tensor<384x128xf32>, tensor<f32>
    %q2, %n2, %w2 = ptc.adamw_update %q, %g16, %n, %w, %t {...}
        : tensor<384x128xf32> grad(tensor<384x128xbf16>), tensor<f32>
    %r2, %o2, %u2, %r16 = ptc.adamw_update %r, %g16, %o, %u, %t {...}
        : tensor<384x128xf32> grad(tensor<384x128xbf16>), tensor<f32>
          working_copy(tensor<384x128xbf16>)
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$param, Ptc_FloatTensor:$grad, Ptc_FloatTensor:$exp_avg,
                       Ptc_FloatTensor:$exp_avg_sq, 0DTensorOf<[F32]>:$step,
                       Optional<0DTensorOf<[F32]>>:$skip,
                       Optional<0DTensorOf<[F32]>>:$scheduled_lr,
                       F64Attr:$lr, F64Attr:$beta1, F64Attr:$beta2, F64Attr:$eps,
                       F64Attr:$weight_decay);
  let results = (outs Ptc_FloatTensor:$new_param, Ptc_FloatTensor:$new_exp_avg,
                      Ptc_FloatTensor:$new_exp_avg_sq, Optional<Ptc_FloatTensor>:$working_copy);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $step (`skip` `(` $skip^ `:` type($skip) `)`)?
    (`lr` `(` $scheduled_lr^ `:` type($scheduled_lr) `)`)? attr-dict `:`
    custom<OptimizerTypes>(type($param), type($grad)) `,` type($step)
    (`working_copy` `(` type($working_copy)^ `)`)?
  }];
  let hasVerifier = 1;
}

def Ptc_SgdUpdateOp : Ptc_Op<"sgd_update", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, DeclareOpInterfaceMethods<Ptc_FusedUpdateOpInterface>, Pure, AttrSizedOperandSegments,
    AllTypesMatch<["param", "momentum_buffer", "new_param", "new_momentum_buffer"]>]> {
  let summary = "one SGD step with momentum (torch.optim.SGD semantics, dampening 0)";
  let description = [{
    ```
    g = g + weight_decay * p
    b = momentum * b + g
    p = p - lr * b
    ```
    With `skip` (a scalar, dynamic loss scaling) non-zero, nothing changes.
    The gradient may be bf16 or f16 for an f32 parameter, and the update may
    write the new parameter's `working_copy`, as in `ptc.adamw_update`.

    ```mlir
    %p2, %b2 = ptc.sgd_update %p, %g, %b {lr = 0.1 : f64, momentum = 0.9 : f64,
                                          weight_decay = 0.0 : f64} : tensor<128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$param, Ptc_FloatTensor:$grad,
                       Ptc_FloatTensor:$momentum_buffer, Optional<0DTensorOf<[F32]>>:$skip,
                       Optional<0DTensorOf<[F32]>>:$scheduled_lr,
                       F64Attr:$lr, F64Attr:$momentum, F64Attr:$weight_decay);
  let results = (outs Ptc_FloatTensor:$new_param, Ptc_FloatTensor:$new_momentum_buffer,
                      Optional<Ptc_FloatTensor>:$working_copy);
  let assemblyFormat = [{
    $param `,` $grad `,` $momentum_buffer (`skip` `(` $skip^ `:` type($skip) `)`)?
    (`lr` `(` $scheduled_lr^ `:` type($scheduled_lr) `)`)? attr-dict `:`
    custom<OptimizerTypes>(type($param), type($grad))
    (`working_copy` `(` type($working_copy)^ `)`)?
  }];
  let hasVerifier = 1;
}

def Ptc_ClipGradNormOp : Ptc_Op<"clip_grad_norm", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure]> {
  let summary = "scales gradients so that their global L2 norm is at most max_norm";
  let description = [{
    `norm = sqrt(sum of squares of every element of every grad)`; each result
    is `grad * min(1, max_norm / (norm + 1e-6))` (torch.nn.utils.clip_grad_norm_).
    The last result is `norm`, before clipping. With `axes`, the sum of
    squares also runs over the devices of that mesh group (each holds other
    gradients, e.g. another pipeline stage's, or other pieces of them: a
    tensor-parallel block, a ZeRO shard). `weights`, one per gradient, is the
    factor its sum of squares counts with: 1 / the copies of it the group
    holds (a gradient split over tp but replicated over dp, summed over both,
    counts 1 / dp), so the norm is the whole gradients' (ptc-partition sets
    both when it keeps the gradients split).

    ```mlir
    %c0, %c1, %norm = ptc.clip_grad_norm %g0, %g1 {max_norm = 1.0 : f64}
        : (tensor<384x128xf32>, tensor<384xf32>) -> (tensor<384x128xf32>, tensor<384xf32>, tensor<f32>)
    ```
  }];
  let arguments = (ins Variadic<Ptc_FloatTensor>:$grads, F64Attr:$max_norm,
                       OptionalAttr<StrArrayAttr>:$axes, OptionalAttr<DenseF64ArrayAttr>:$weights);
  let results = (outs Variadic<Ptc_FloatTensor>:$clipped, 0DTensorOf<[F32]>:$norm);
  let assemblyFormat = "$grads attr-dict `:` functional-type($grads, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Dynamic loss scaling
//===----------------------------------------------------------------------===//

def Ptc_LossScaleOp : Ptc_Op<"loss_scale", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, AllTypesMatch<["exponent", "scale"]>]> {
  let summary = "the current loss scale: initial * 2^exponent";
  let description = [{
    The factor the backward pass starts from under dynamic loss scaling;
    `exponent` is optimizer state (starts at 0), moved by
    `ptc.loss_scale_update`.

    ```mlir
    %s = ptc.loss_scale %e {initial = 65536.0 : f64} : tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$exponent, F64Attr:$initial);
  let results = (outs 0DTensorOf<[F32]>:$scale);
  let assemblyFormat = "$exponent attr-dict `:` type($scale)";
}

def Ptc_UnscaleGradsOp : Ptc_Op<"unscale_grads", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface, ["partition"]>, Pure]> {
  let summary = "gradients divided by the loss scale, and whether any is not finite";
  let description = [{
    Each result is its gradient divided by `scale`; the last result is 1.0
    when any element of any gradient is infinite or NaN (over the devices of
    the `axes` groups too, which hold other parts of the gradients), else 0.
    Partitioned, it reads each gradient as it arrives (a tensor-parallel
    block, a ZeRO shard) and its flag is the maximum over the axes they are
    split over.

    ```mlir
    %g0, %g1, %inf = ptc.unscale_grads %a, %b by %s
        : (tensor<128x64xf32>, tensor<64xf32>, tensor<f32>)
          -> (tensor<128x64xf32>, tensor<64xf32>, tensor<f32>)
    ```
  }];
  let arguments = (ins Variadic<Ptc_FloatTensor>:$grads, 0DTensorOf<[F32]>:$scale,
                       OptionalAttr<StrArrayAttr>:$axes);
  let results = (outs Variadic<Ptc_FloatTensor>:$unscaled, 0DTensorOf<[F32]>:$found_inf);
  let assemblyFormat = "$grads `by` $scale attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Ptc_AnyNonfiniteOp : Ptc_Op<"any_nonfinite", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure]> {
  let summary = "1.0 when any element of the tensors is not finite, else 0";
  let description = [{
    The flag is 1.0 when any element of any operand is infinite or NaN (over
    the devices of the `axes` groups too, which hold other tensors, e.g.
    another pipeline stage's gradients), else 0. It reads its operands and
    writes nothing else: `ptc-optimizer` checks the gradients with it and
    passes the flag to every update as its `skip` (`skip-nonfinite`).

    ```mlir
    %bad = ptc.any_nonfinite %g0, %g1 : tensor<128x64xf32>, tensor<64xf32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Variadic<Ptc_FloatTensor>:$tensors, OptionalAttr<StrArrayAttr>:$axes);
  let results = (outs 0DTensorOf<[F32]>:$flag);
  let assemblyFormat = "$tensors attr-dict `:` custom<TypesOrNone>(type($tensors)) `->` type($flag)";
  let hasVerifier = 1;
}

def Ptc_LossScaleUpdateOp : Ptc_Op<"loss_scale_update", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure,
    AllTypesMatch<["exponent", "good_steps", "found_inf", "new_exponent", "new_good_steps"]>]> {
  let summary = "halve the loss scale after an overflow, double it after `window` good steps";
  let description = [{
    ```
    if found_inf: exponent -= 1, good = 0          (the step was skipped)
    else:         good += 1; if good == window: exponent += 1, good = 0
    ```

    ```mlir
    %e2, %g2 = ptc.loss_scale_update %e, %g, %inf {window = 1000 : i64} : tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[F32]>:$exponent, 0DTensorOf<[F32]>:$good_steps,
                       0DTensorOf<[F32]>:$found_inf, I64Attr:$window);
  let results = (outs 0DTensorOf<[F32]>:$new_exponent, 0DTensorOf<[F32]>:$new_good_steps);
  let assemblyFormat = "$exponent `,` $good_steps `,` $found_inf attr-dict `:` type($exponent)";
}

#endif // PTC_OPTIMIZER_OPS_TD
