//===- PtcDistOps.td - collectives over mesh axes ----------*- tablegen -*-===//
//
// Collectives that `ptc-shard` inserts when it partitions a training step
// over the device mesh named by the module's `ptc.mesh` attribute. Operands
// and results have local (per-device) shapes. `axes` names mesh axes; the
// group of a device is the devices that differ from it only along `axes`.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_DIST_OPS_TD
#define PTC_DIST_OPS_TD

def Ptc_AllReduceOp : Ptc_Op<"all_reduce", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure]> {
  let summary = "sum over a mesh group, of one or more tensors (a bucket)";
  let description = [{
    Every device of the group gets, for each operand, the elementwise sum of
    that operand over the group. Several operands form one bucket (one
    collective on the wire). With `axes = ["dp"]` on a `dp = 2` mesh:

    | device | operand | result    |
    |--------|---------|-----------|
    | dp=0   | a0      | a0 + a1   |
    | dp=1   | a1      | a0 + a1   |

    ```mlir
    %g0, %g1 = ptc.all_reduce %a, %b {axes = ["dp"]}
        : (tensor<128x64xf32>, tensor<64xf32>) -> (tensor<128x64xf32>, tensor<64xf32>)
    ```
  }];
  let arguments = (ins Variadic<Ptc_FloatTensor>:$inputs, StrArrayAttr:$axes);
  let results = (outs Variadic<Ptc_FloatTensor>:$results);
  let assemblyFormat = "$inputs attr-dict `:` functional-type($inputs, $results)";
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::ValueRange":$inputs, "::mlir::ArrayAttr":$axes), [{
    build($_builder, $_state, inputs.getTypes(), inputs, axes);
  }]>];
}

def Ptc_AllGatherOp : Ptc_Op<"all_gather", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultElementType]> {
  let summary = "concatenation of the group's shards along one dimension";
  let description = [{
    Every device gets the operands of the whole group (one mesh axis),
    concatenated along `dim` in the order of the axis coordinate. With
    `axes = ["tp"]`, `dim = 1` on a `tp = 2` mesh:

    | device | operand | result      |
    |--------|---------|-------------|
    | tp=0   | x0      | [x0, x1]    |
    | tp=1   | x1      | [x0, x1]    |

    With `blocks = k`, `dim` consists of k equal blocks, each split over the
    group: block b of the result is [b of x0, b of x1, ...].

    ```mlir
    %y = ptc.all_gather %x {axes = ["tp"], dim = 1 : i64} : tensor<8x32xf32> -> tensor<8x64xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, StrArrayAttr:$axes, I64Attr:$dim,
                       DefaultValuedAttr<I64Attr, "1">:$blocks);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Ptc_ReduceScatterOp : Ptc_Op<"reduce_scatter", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultElementType]> {
  let summary = "sum over a mesh group, each device keeping one block of the result";
  let description = [{
    Sums the operand over the group (one mesh axis) and leaves on the device
    with coordinate `c` block `c` of the sum along `dim` (sequence
    parallelism's exit from a row-parallel layer). With `axes = ["tp"]`,
    `dim = 0` on a `tp = 2` mesh:

    | device | operand      | result      |
    |--------|--------------|-------------|
    | tp=0   | [a0; b0]     | a0 + a1     |
    | tp=1   | [a1; b1]     | b0 + b1     |

    ```mlir
    %y = ptc.reduce_scatter %x {axes = ["tp"], dim = 1 : i64} : tensor<8x64x128xf32> -> tensor<8x32x128xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, StrArrayAttr:$axes, I64Attr:$dim);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Ptc_AllToAllOp : Ptc_Op<"all_to_all", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultElementType]> {
  let summary = "moves a split from one dimension to another within a mesh group";
  let description = [{
    The operand is split along `concat_dim` over the axis and whole along
    `split_dim`; the result is whole along `concat_dim` and split along
    `split_dim`. Device `c` sends block `r` of `split_dim` to device `r` and
    places what it receives from device `r` at block `r` of `concat_dim`.
    With `axes = ["tp"]`, `split_dim = 1`, `concat_dim = 0` on `tp = 2`:

    | device | operand          | result            |
    |--------|------------------|-------------------|
    | tp=0   | [x00, x01]       | [x00; x10]        |
    | tp=1   | [x10, x11]       | [x01; x11]        |

    ```mlir
    %y = ptc.all_to_all %x {axes = ["tp"], split_dim = 1 : i64, concat_dim = 0 : i64}
        : tensor<4x8xf32> -> tensor<8x4xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, StrArrayAttr:$axes, I64Attr:$split_dim,
                       I64Attr:$concat_dim);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Ptc_VocabParallelCrossEntropyOp : Ptc_Op<"vocab_parallel_cross_entropy", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure]> {
  let summary = "mean cross-entropy of logits whose classes are split over a mesh axis";
  let description = [{
    The local program of `ptc.cross_entropy` when the class dimension is split
    over `axes` (a vocabulary-parallel LM head): every device holds a block of
    classes; the row maximum, the sum of exponentials and the target logit are
    combined over the group, so every device gets the mean loss of its rows
    over all classes. Targets are global class ids.

    ```mlir
    %l = ptc.vocab_parallel_cross_entropy %logits, %t {axes = ["tp"]}
        : tensor<8x64x128xf32>, tensor<8x64xi32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets, StrArrayAttr:$axes);
  let results = (outs 0DTensorOf<[F32, BF16, F16]>:$result);
  let assemblyFormat = [{
    $logits `,` $targets attr-dict `:` type($logits) `,` type($targets) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Ptc_VocabParallelCrossEntropyGradOp : Ptc_Op<"vocab_parallel_cross_entropy_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure,
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "gradient of `ptc.vocab_parallel_cross_entropy` for the local classes";
  let description = [{
    `grad * (softmax(logits) - onehot(targets)) / rows` for this device's block
    of classes, with the softmax normalized over the whole group.

    ```mlir
    %d = ptc.vocab_parallel_cross_entropy_grad %logits, %t, %g {axes = ["tp"]}
        : tensor<8x64x128xf32>, tensor<8x64xi32>, tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets,
                       0DTensorOf<[F32, BF16, F16]>:$grad, StrArrayAttr:$axes);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets `,` $grad attr-dict `:` type($logits) `,` type($targets) `,` type($grad)
  }];
  let hasVerifier = 1;
}

def Ptc_VocabParallelCrossEntropyWithGradOp : Ptc_Op<"vocab_parallel_cross_entropy_with_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure,
    AllTypesMatch<["logits", "logits_grad"]>]> {
  let summary = "the vocabulary-parallel loss and its gradient in one pass over the logits";
  let description = [{
    `loss` is `ptc.vocab_parallel_cross_entropy %logits, %targets` and
    `logits_grad` is `ptc.vocab_parallel_cross_entropy_grad %logits, %targets,
    %grad` over the same `axes`, computed together: each row's maximum and sum
    of exponentials, combined over the group once, serve both (the same
    numbers as the two ops; half their reductions over the logits and of
    their collectives). `ptc-fuse-cross-entropy-grad` forms it, as
    `ptc.cross_entropy_with_grad` for whole logits.

    ```mlir
    %dl, %loss = ptc.vocab_parallel_cross_entropy_with_grad %logits, %t, %g {axes = ["tp"]}
        : tensor<8x64x128xbf16>, tensor<8x64xi32>, tensor<f32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$logits, Ptc_IdTensor:$targets,
                       0DTensorOf<[F32, BF16, F16]>:$grad, StrArrayAttr:$axes);
  // In the plan instruction's order: VocabParallelCrossEntropyGrad's output, then the loss.
  let results = (outs Ptc_FloatTensor:$logits_grad, 0DTensorOf<[F32, BF16, F16]>:$loss);
  let assemblyFormat = [{
    $logits `,` $targets `,` $grad attr-dict `:` type($logits) `,` type($targets) `,` type($grad) `->` type($loss)
  }];
  let hasVerifier = 1;
}

def Ptc_ShardSliceOp : Ptc_Op<"shard_slice", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultElementType]> {
  let summary = "this device's block of a replicated tensor (no communication)";
  let description = [{
    The inverse of `ptc.all_gather`: a device with coordinate `c` along the
    axis keeps block `c` of `dim` (of size `input / axis size`); with
    `blocks = k`, part `c` of each of the k equal blocks of `dim`.

    ```mlir
    %x = ptc.shard_slice %y {axes = ["dp"], dim = 0 : i64} : tensor<8x64xf32> -> tensor<4x64xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, StrArrayAttr:$axes, I64Attr:$dim,
                       DefaultValuedAttr<I64Attr, "1">:$blocks);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Micro-batches and pipeline stages
//===----------------------------------------------------------------------===//

def Ptc_MicrobatchSumOp : Ptc_Op<"microbatch_sum", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure, SameOperandsAndResultType]> {
  let summary = "sum of a per-micro-batch value over the micro-batches of a step";
  let description = [{
    In a training step whose function carries `ptc.microbatches = M`, the ops
    that depend on the inputs run once per micro-batch (B/M rows each). This op
    is the boundary between them and the once-per-step ops (gradient
    reduction, optimizer): its result is the sum of its operand over the M
    micro-batches (gradient accumulation). `ptc-autodiff` puts one on the loss
    and on every parameter gradient.

    ```mlir
    %g = ptc.microbatch_sum %g_mb : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def Ptc_SendOp : Ptc_Op<"send", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>]> {
  let summary = "point-to-point send of a value to another pipeline stage";
  let description = [{
    Inserted by `ptc-split-stages`: the value, produced on pipeline chunk
    `ptc.stage`, is needed on chunk `to`. `channel` pairs it with the one
    `ptc.recv` of the same channel. Per-micro-batch values travel once per
    micro-batch (the schedule says when); `per_step` ones once per step:
    before the first micro-batch (a tied parameter), or with `at_end` after
    the last (a gradient already summed over the micro-batches).

    ```mlir
    ptc.send %x {channel = 0 : i64, to = 1 : i64} : tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, I64Attr:$channel, I64Attr:$to, UnitAttr:$per_step,
                       UnitAttr:$at_end);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Ptc_RecvOp : Ptc_Op<"recv", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>]> {
  let summary = "point-to-point receive of a value from another pipeline stage";
  let description = [{
    The receiving end of channel `channel`: the value sent by chunk `from`.

    ```mlir
    %x = ptc.recv {channel = 0 : i64, from = 0 : i64} : tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins I64Attr:$channel, I64Attr:$from, UnitAttr:$per_step, UnitAttr:$at_end);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Memory placement
//===----------------------------------------------------------------------===//

def Ptc_TransferOp : Ptc_Op<"transfer", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure, SameOperandsAndResultType]> {
  let summary = "a copy between device memory and host memory";
  let description = [{
    Inserted by `ptc-offload-optimizer` where a value crosses between the
    device and the host: the result is the operand's value in host memory
    (`to "host"`) or in device memory (`to "device"`). Host values are the
    offloaded optimizer's: arguments and op results marked `ptc.on_host`
    (fp32 master weights, optimizer state, the update's temporaries); every
    other value lives on the device. A transfer is the only op that reads a
    value on one side and writes one on the other.

    ```mlir
    %gh = ptc.transfer %g to "host" : tensor<384x128xbf16>
    ```
  }];
  let arguments = (ins Ptc_AnyTensor:$input, StrAttr:$destination);
  let results = (outs Ptc_AnyTensor:$result);
  let assemblyFormat = "$input `to` $destination attr-dict `:` type($input)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    bool toHost() { return getDestination() == "host"; }
  }];
}


def Ptc_RingAttentionOp : Ptc_Op<"ring_attention", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure,
    AllTypesMatch<["query", "result"]>, AllTypesMatch<["key", "value"]>]> {
  let summary = "causal attention of a sequence split over a mesh axis (ring attention)";
  let description = [{
    The local program of `ptc.causal_attention` under context parallelism
    with `cp-attention=ring`: every device of the `axes` group holds a block
    of the sequence (block `c` of `[batch, heads, seq, head_dim]`); the
    key/value blocks travel around the ring (`c -> c + 1`) and each device
    merges the blocks its queries may see into their online softmax, so no
    device holds more than two key/value blocks. `positions` (the device's
    block of `[batch, seq]`) is `ptc.causal_attention`'s document mask: a
    query sees the keys of every block from its document's start, and a block
    pair that the mask empties is not computed. The optional second result
    `stats` (f32 `[batch, heads, seq]`, the device's block of rows) is each
    query row's log-sum-exp over every block it saw, for the gradient
    (`ptc-save-attention-stats`).

    ```mlir
    %o = ptc.ring_attention %q, %k, %v {axes = ["cp"]} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    %o2, %lse = ptc.ring_attention %q, %k, %v {axes = ["cp"]} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32> stats tensor<2x4x8xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$query, Ptc_FloatTensor:$key, Ptc_FloatTensor:$value,
                       Optional<Ptc_IdTensor>:$positions, StrArrayAttr:$axes, F64Attr:$scale);
  let results = (outs Ptc_FloatTensor:$result, Optional<Ptc_TensorOf<[F32]>>:$stats);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` type($query) `,` type($key) (`stats` type($stats)^)?
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// What one call sends on a ring of `ranks`: bytes (the executor's f32
    /// key/value blocks to the next device, and the causal balancing moves)
    /// and messages.
    std::pair<double, double> ringTransfers(int64_t ranks);
  }];
}

def Ptc_RingAttentionGradOp : Ptc_Op<"ring_attention_grad", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, Pure,
    AttrSizedOperandSegments,
    AllTypesMatch<["query", "grad", "query_grad"]>, AllTypesMatch<["key", "value", "key_grad", "value_grad"]>]> {
  let summary = "gradient of `ptc.ring_attention`";
  let description = [{
    Runs the ring once for the rows' softmax statistics and once more with
    the key/value blocks and their gradients travelling together, which come
    home after a full turn. With `saved`, the forward's result and row
    statistics (its `stats`; `ptc-save-attention-stats`), the first ring is
    not run: the backward's ring alone passes blocks.

    ```mlir
    %dq, %dk, %dv = ptc.ring_attention_grad %q, %k, %v, %g {axes = ["cp"]}
        : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    %dq2, %dk2, %dv2 = ptc.ring_attention_grad %q, %k, %v, %g saved(%o, %lse : tensor<2x4x8x16xf32>, tensor<2x4x8xf32>) {axes = ["cp"]}
        : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$query, Ptc_FloatTensor:$key, Ptc_FloatTensor:$value,
                       Ptc_FloatTensor:$grad, Optional<Ptc_FloatTensor>:$saved_result,
                       Optional<Ptc_TensorOf<[F32]>>:$saved_stats,
                       Optional<Ptc_IdTensor>:$positions,
                       StrArrayAttr:$axes, F64Attr:$scale);
  let results = (outs Ptc_FloatTensor:$query_grad, Ptc_FloatTensor:$key_grad,
                      Ptc_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $grad (`saved` `(` $saved_result^ `,` $saved_stats `:` type($saved_result) `,` type($saved_stats) `)`)? (`positions` `(` $positions^ `:` type($positions) `)`)? attr-dict `:` type($query) `,` type($key)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// What one call sends on a ring of `ranks`: bytes (the executor's f32
    /// key/value blocks and their gradients to the next device, and the causal
    /// balancing moves) and messages; with the forward's statistics or without
    /// (`saved`), or as it stands.
    std::pair<double, double> ringTransfers(int64_t ranks, bool saved);
    std::pair<double, double> ringTransfers(int64_t ranks) {
      return ringTransfers(ranks, static_cast<bool>(getSavedStats()));
    }
  }];
}

#endif // PTC_DIST_OPS_TD
