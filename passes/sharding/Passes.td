//===- Passes.td - sharding and collective insertion -------*- tablegen -*-===//

#ifndef PTC_PASSES_SHARDING_PASSES_TD
#define PTC_PASSES_SHARDING_PASSES_TD

include "mlir/Pass/PassBase.td"

def PropagateShardingPass : Pass<"ptc-propagate-sharding", "::mlir::ModuleOp"> {
  let summary = "Decide the sharding of every value of a training step over a device mesh";
  let description = [{
    The first sharding phase. Gives every value of the training step
    (forward, backward and optimizer) a sharding — one mesh axis or none per
    dimension, plus the axes over which it is a partial sum — and records it
    without rewriting anything: each argument's `ptc.sharding`, each op's
    `ptc.operand_shardings` (what it needs of its operands) and
    `ptc.shardings` (what its results are), as `#ptc.sharding` attributes,
    with rescales and the other decisions `ptc-partition` carries out
    (passes/sharding/ShardingPhases.h lists them). `ptc-shard` runs both.

    Shardings come, in order of priority, from user annotations
    (`ptc.sharding = #ptc.sharding<[dp, _]>` or `"[dp, _]"` on arguments, or
    a list of them on an op's results), default rules (the batch dimension of
    every `ptc.input` is sharded over `dp`; Megatron's tensor-parallel splits
    of the parameters; experts over `ep`), and propagation through each op's
    rule in program order. Where operands disagree, the smaller one is
    resharded; two user annotations that disagree are an error. Every op
    records where its results' shardings came from in `ptc.sharding_origins`.

    With `sequence-parallel`, the sequence dimension (dim 1) of the inputs is
    split over `tp` too, so LayerNorms and residual adds run on sequence
    shards; entering a column-parallel layer then all-gathers the sequence and
    leaving a row-parallel one reduce-scatters it.

    ZeRO is sharding too: with `zero=1` every optimizer state tensor is split
    over `dp` along its first dimension that `dp` divides (and no other axis
    splits), the update runs on that shard and the new parameter is
    all-gathered; stage 1 all-reduces gradients whole and slices the update's
    shard, stage 2 reduce-scatters them; `zero=3` splits the parameters the
    same way, so each use all-gathers them into a temporary that the memory
    plan frees after its last use (with `reshard-after-forward=false` the
    backward pass reuses the forward pass's copy). A stage with no `dp` axis
    (or dp=1) is a warning.

    Reductions over a sharded dimension yield partial sums (the parameter
    gradients of data parallelism, the row-parallel matmul of tensor
    parallelism); means rescale by the shard count.

    The pass is a driver: each op's sharding rule comes from its
    ShardingRuleOpInterface (dialects/ptc/PtcShardingRules.cpp), the default
    rules from ShardingDefaults.cpp. The mesh comes from `mesh`
    ("dp:2,tp:2") and is recorded on the module as `ptc.mesh`.
  }];
  let options = [
    Option<"mesh", "mesh", "std::string", /*default=*/"\"\"",
           "Device mesh, e.g. dp:2,tp:2 (default: the module's ptc.mesh)">,
    Option<"sequenceParallel", "sequence-parallel", "bool", /*default=*/"false",
           "Also split the sequence dimension of inputs over tp (Megatron sequence "
           "parallelism: LayerNorm and residuals on sequence shards)">,
    Option<"zero", "zero", "int", /*default=*/"0",
           "ZeRO stage over dp: 1 splits optimizer state, 2 also gradients, 3 also "
           "parameters (gathered before each use)">,
    Option<"reshardAfterForward", "reshard-after-forward", "bool", /*default=*/"true",
           "ZeRO-3: gather parameters again in the backward pass (FSDP's "
           "reshard_after_forward); false keeps the forward pass's gathered copy "
           "until its backward use (FSDP's SHARD_GRAD_OP: half the gathers, the "
           "gathered weights saved as activations)">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

def PartitionPass : Pass<"ptc-partition", "::mlir::ModuleOp"> {
  let summary = "Rewrite a training step to local shapes with collectives, as propagation decided";
  let description = [{
    The second sharding phase, after `ptc-propagate-sharding`. Gives every
    value its local (per-device) type and inserts collectives where an op
    needs another sharding of an operand than its producer gives:
    `ptc.all_reduce` (partial -> full sum), `ptc.reduce_scatter` (partial ->
    sharded), `ptc.all_to_all` (a split moving between dimensions),
    `ptc.all_gather` (sharded -> replicated), `ptc.shard_slice` (replicated
    -> sharded, no communication). Means over sharded rows are rescaled; a
    cross-entropy whose classes are split becomes its vocabulary-parallel
    form. Every inserted collective records why in `ptc.cause` (for
    ptc-bucket-collectives and ptc-explain-collectives, the next phases).
    Without a `ptc.mesh` on the module the pass does nothing.
  }];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

def BucketCollectivesPass : Pass<"ptc-bucket-collectives", "::mlir::ModuleOp"> {
  let summary = "Move gradient reductions next to their producers and merge them into buckets";
  let description = [{
    Runs after ptc-shard. Each all-reduce and reduce-scatter moves right after
    the op producing its operand, and single-tensor all-reduces of one element
    type over the same axes are merged in program order into buckets of at
    most `bucket-mb` MiB, each placed at its last member (a bucket also closes
    before the first reader of one of its results): gradient buckets go out
    while the backward pass goes on, as in DDP. A bucket's `ptc.cause` lists
    its members'. With `grad-reduce-dtype=bf16` the data-parallel gradient
    reductions of f32 tensors run in bf16 (a convert before and after; scalars
    such as the loss keep an f32 bucket).
  }];
  let options = [
    Option<"gradReduceDtype", "grad-reduce-dtype", "std::string", /*default=*/"\"f32\"",
           "Type of the data-parallel gradient reductions: f32 or bf16 (half the bytes)">,
    Option<"bucketMb", "bucket-mb", "double", /*default=*/"25.0",
           "Largest all-reduce bucket in MiB">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

def ExplainCollectivesPass : Pass<"ptc-explain-collectives", "::mlir::ModuleOp"> {
  let summary = "Print every collective with its cause, bytes and estimated time";
  let description = [{
    Prints, per function, every collective that carries a `ptc.cause`: the
    values and shardings that caused it, its bytes per device and its time
    under an alpha-beta model (`alpha-us` per message step, `beta-gbps` of
    link bandwidth; ring algorithms), and the total per step. Then drops the
    causes, so that identical collectives are alike again for cse (ptc-compile
    runs it with `report=false` when not asked to explain).
  }];
  let options = [
    Option<"report", "report", "bool", /*default=*/"true", "Print the report">,
    Option<"alphaUs", "alpha-us", "double", /*default=*/"5.0",
           "Cost model: latency per message step in microseconds">,
    Option<"betaGbps", "beta-gbps", "double", /*default=*/"10.0",
           "Cost model: link bandwidth in GB/s">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

#endif // PTC_PASSES_SHARDING_PASSES_TD
