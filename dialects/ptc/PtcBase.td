//===- PtcBase.td - ptc dialect definition and type constraints -*- tablegen -*-===//
//
// The `ptc` dialect describes a training step with global shapes and no
// parallelism. Later passes (autodiff, sharding, pipelining) rewrite it.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_BASE_TD
#define PTC_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Ptc_Dialect : Dialect {
  let name = "ptc";
  let cppNamespace = "::mlir::ptc";
  let summary = "Training-step operations for the ptc distributed training compiler";
  let description = [{
    The `ptc` dialect holds the operations a transformer, an MLP or a
    mixture-of-experts model needs in training: dense algebra (matmul,
    elementwise arithmetic), the fused blocks that kernels and parallelism
    treat as a whole (layer norm, softmax, causal attention, cross entropy),
    layout changes (reshape, transpose, slice, concat), reductions, and MoE
    routing (top-k gate, dispatch, combine).

    Values are ranked tensors with static, *global* shapes; element types are
    `f32`, `bf16` or `f16` for activations and weights and `i32` for token ids
    and expert indices. Functions, constants and control flow come from the
    upstream `func` and `arith` dialects.

    Function arguments carry their role as discardable attributes:
    `ptc.param = "<name>"` marks a trainable parameter (names follow nanoGPT,
    e.g. `transformer.h.0.attn.c_attn.weight`), `ptc.input = "<name>"` marks a
    per-step input (token ids, targets), `ptc.state = "<name>"` marks
    optimizer state (added by `ptc-optimizer`). `ptc.init = "normal:<std>" |
    "zeros" | "ones"` says how a parameter is initialized.

    Function results carry theirs: `ptc.loss` (the scalar loss),
    `ptc.grad = "<param>"` (a parameter's gradient, from `ptc-autodiff`),
    `ptc.update = "<param or state>"` (the new value of an argument, from
    `ptc-optimizer`; plans update it in place) and `ptc.grad_norm`.

    Distribution: the module attribute `ptc.mesh = {axes = ["dp", "tp"],
    shape = array<i64: 2, 2>}` names the device mesh; an argument may carry a
    user sharding `ptc.sharding = "[dp, _]"` (one mesh axis or `_` per
    dimension). `ptc-shard` partitions the step into per-device (local) shapes
    and inserts the collectives (`ptc.all_reduce`, `ptc.all_gather`,
    `ptc.shard_slice`).
  }];
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::arith::ArithDialect"];
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let hasOperationAttrVerify = 1;
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    /// Argument attribute naming a trainable parameter.
    static constexpr ::llvm::StringLiteral kParamAttrName = "ptc.param";
    /// Argument attribute naming a per-step input.
    static constexpr ::llvm::StringLiteral kInputAttrName = "ptc.input";
    /// Argument attribute naming optimizer state.
    static constexpr ::llvm::StringLiteral kStateAttrName = "ptc.state";
    /// Argument attribute on a parameter's optimizer state (set by
    /// ptc-optimizer): `{param = "<name>"}`, with `dropped_dim = d` for a
    /// factored moment that averages out dimension d of the parameter
    /// (Adafactor's row and column statistics). The sharding defaults split
    /// state like its parameter from it.
    static constexpr ::llvm::StringLiteral kStateOfAttrName = "ptc.state_of";
    /// Argument attribute naming the parameter (a `ptc.param`) whose bf16 /
    /// f16 rounding the argument holds across steps: its working copy, which
    /// the forward pass reads instead of converting the f32 master weight and
    /// the parameter's update rewrites (ptc-keep-working-copies). Not
    /// checkpointed: ptc-run rounds the parameter again after loading it.
    static constexpr ::llvm::StringLiteral kWorkingCopyAttrName = "ptc.working_copy";
    /// Argument attribute giving a parameter's initializer.
    static constexpr ::llvm::StringLiteral kInitAttrName = "ptc.init";
    /// Argument attribute on a parameter stacked over experts: the expert
    /// count, which is its dimension 0 (expert parallelism splits it over ep).
    static constexpr ::llvm::StringLiteral kExpertsAttrName = "ptc.experts";
    /// Argument attribute on an MoE router's selection bias (a `ptc.state`,
    /// `[experts]`): `{load = "<metric>", rate = R}`. After each step
    /// ptc-optimizer adds `R * sign(mean(load) - load)` (DeepSeek-V3's
    /// auxiliary-loss-free balancing; no gradient, checkpointed as state).
    static constexpr ::llvm::StringLiteral kBiasBalancingAttrName = "ptc.bias_balancing";
    /// Result attributes.
    static constexpr ::llvm::StringLiteral kLossAttrName = "ptc.loss";
    static constexpr ::llvm::StringLiteral kGradAttrName = "ptc.grad";
    static constexpr ::llvm::StringLiteral kUpdateAttrName = "ptc.update";
    static constexpr ::llvm::StringLiteral kGradNormAttrName = "ptc.grad_norm";
    static constexpr ::llvm::StringLiteral kLossScaleAttrName = "ptc.loss_scale";
    static constexpr ::llvm::StringLiteral kLrAttrName = "ptc.lr";
    /// 1.0 when the step's update was skipped (a gradient was not finite; with
    /// dynamic loss scaling also an overflow), else 0: the plan output `skipped`.
    static constexpr ::llvm::StringLiteral kSkippedAttrName = "ptc.skipped";
    /// A value the step reports (per-step metrics: an MoE layer's load),
    /// named by the attribute; a float tensor, the mean over the batch.
    static constexpr ::llvm::StringLiteral kMetricAttrName = "ptc.metric";
    /// Unit attribute on the result of a forward-only (decode) function: the
    /// next-token logits `[batch, tokens, vocab]` (ptc-derive-decode).
    static constexpr ::llvm::StringLiteral kLogitsAttrName = "ptc.logits";
    /// Module attribute: the device mesh, `{axes = ["dp", "tp"], shape = array<i64: 2, 2>}`.
    static constexpr ::llvm::StringLiteral kMeshAttrName = "ptc.mesh";
    /// Argument attribute: a user sharding annotation, e.g.
    /// `#ptc.sharding<[dp, _]>` (one mesh axis or `_` per dimension); after
    /// ptc-propagate-sharding, every argument's sharding.
    static constexpr ::llvm::StringLiteral kShardingAttrName = "ptc.sharding";
    /// Between ptc-propagate-sharding and ptc-partition, on an argument:
    /// the sharding every user reads (the batch over dp*ep), resharded on
    /// entry; and ZeRO-3's gather for each use of a parameter (unit).
    /// On an op whose sharding rule chose a partitioned form of it (the
    /// classes axis of a vocabulary-parallel cross-entropy), for its
    /// ShardingRuleOpInterface::partition.
    static constexpr ::llvm::StringLiteral kPartitionedFormAttrName = "ptc.partitioned_form";
    static constexpr ::llvm::StringLiteral kReshardOnEntryAttrName = "ptc.reshard_on_entry";
    static constexpr ::llvm::StringLiteral kGatherPerUseAttrName = "ptc.gather_per_use";
    /// On collectives ptc-shard inserted: why (the value, its sharding and the
    /// consumer that needs another); merged by ptc-bucket-collectives, printed
    /// by ptc-explain-collectives.
    static constexpr ::llvm::StringLiteral kCollectiveCauseAttrName = "ptc.cause";
    /// ptc-propagate-sharding's record of each result's sharding and where it
    /// came from (one entry per result); after ptc-partition only a record.
    static constexpr ::llvm::StringLiteral kShardingsAttrName = "ptc.shardings";
    static constexpr ::llvm::StringLiteral kShardingOriginsAttrName = "ptc.sharding_origins";

    /// Autodiff: on backward ops; in micro-batched steps also the id of each
    /// forward op and, on backward ops, the id of the forward op they
    /// differentiate (read by ptc-split-stages); on the backward pass's seed.
    static constexpr ::llvm::StringLiteral kBackwardAttrName = "ptc.backward";
    /// On the first op of an update built from primitive ops (Adafactor)
    /// that reads a parameter's gradient (its operand 0): the parameter's
    /// name. ZeRO places that gradient like the parameter's state, and the
    /// memory report counts it as the parameter's gradient.
    static constexpr ::llvm::StringLiteral kOptimizerGradAttrName = "ptc.optimizer_grad";
    /// Muon (ptc-optimizer): on the op that stacks matrices of one shape
    /// for their Newton-Schulz iterations, and on the op whose result is the
    /// orthogonalized stack: {params = [names], dealt = bool}. A dealt stack
    /// is split over dp (each rank orthogonalizes its share); the result
    /// leaves split like the parameters (ptc-propagate-sharding).
    static constexpr ::llvm::StringLiteral kMuonStackAttrName = "ptc.muon_stack";
    /// On a training function: the optimizer and the settings its plan
    /// instructions do not carry (Muon's: momentum, Nesterov, Newton-Schulz
    /// steps and type, scale), written as the plan's `optimizer`, which a
    /// checkpoint records and a resume compares.
    static constexpr ::llvm::StringLiteral kOptimizerAttrName = "ptc.optimizer";
    static constexpr ::llvm::StringLiteral kMuonOrthogonalAttrName = "ptc.muon_orthogonal";
    /// ZeRO-3: on a parameter's all_gather, the number of the use it gathers
    /// for (each use gathers anew: the forward and the backward pass), so that
    /// CSE keeps them apart and the memory plan frees each copy after its use.
    static constexpr ::llvm::StringLiteral kGatherUseAttrName = "ptc.gather_use";
    /// On a model function: the FLOPs of one training step of the whole model
    /// (3x the forward matmuls and attention over the global batch), recorded
    /// before autodiff and written into the plan (MFU).
    static constexpr ::llvm::StringLiteral kModelFlopsAttrName = "ptc.model_flops";
    /// On a model's module: what saving its weights for their users needs
    /// besides the parameters, as JSON text (`{"tied": {alias: parameter},
    /// "buffers": [name, ...], "hf_config": config.json's text}`, each optional), set by
    /// the builders and ptc-import-torch, written into the plan.
    static constexpr ::llvm::StringLiteral kModelInfoAttrName = "ptc.model_info";
    /// On an op that ptc-mixed-precision keeps in f32 (its float operands
    /// converted up, its results f32): an MoE router's logits.
    static constexpr ::llvm::StringLiteral kKeepF32AttrName = "ptc.keep_f32";
    /// optimizer offload (ptc-offload-optimizer): on an argument or op whose
    /// values live in host memory (an op so marked runs on the host).
    static constexpr ::llvm::StringLiteral kOnHostAttrName = "ptc.on_host";
    static constexpr ::llvm::StringLiteral kForwardIdAttrName = "ptc.forward_id";
    static constexpr ::llvm::StringLiteral kVjpOfAttrName = "ptc.vjp_of";
    static constexpr ::llvm::StringLiteral kLossSeedAttrName = "ptc.loss_seed";
    /// On the step function: the micro-batch count (ptc-microbatch).
    static constexpr ::llvm::StringLiteral kMicrobatchesAttrName = "ptc.microbatches";
    /// On the step function: {ranks, chunks, split_weight} (ptc-split-stages).
    static constexpr ::llvm::StringLiteral kPipelineAttrName = "ptc.pipeline";
    /// On every op of a split step (and on parameters): its chunk (-1: every
    /// pipeline rank); on ops also the segment ("forward", "backward", "weight", "step").
    static constexpr ::llvm::StringLiteral kStageAttrName = "ptc.stage";
    static constexpr ::llvm::StringLiteral kSegmentAttrName = "ptc.segment";
    /// On a forward op of the model: a new pipeline chunk starts here.
    static constexpr ::llvm::StringLiteral kStageBoundaryAttrName = "ptc.stage_boundary";
    /// On the step function: {name, actions = [[action strings] per rank]}.
    static constexpr ::llvm::StringLiteral kScheduleAttrName = "ptc.schedule";

    /// Parses a `ptc.init` value: "zeros", "ones" or "normal:<std>" with std > 0.
    static ::llvm::LogicalResult parseInit(::llvm::StringRef spec, ::llvm::StringRef &kind,
                                           double &stddev);
  }];
}

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Ptc_FloatElement : AnyTypeOf<[F32, BF16, F16], "f32, bf16 or f16">;
// ptc tensors have static shapes and are never empty: a zero-size dimension
// would reach shape arithmetic (autodiff's flattening, the kernels' loops) as a
// division by zero or an empty reduction, so the verifier refuses it here.
def Ptc_NoZeroSizeDimPred : CPred<
    "::llvm::all_of(::llvm::cast<::mlir::ShapedType>($_self).getShape(), "
    "[](int64_t d) { return d > 0; })">;
class Ptc_TensorOf<list<Type> types>
    : RankedTensorOf<types, [HasStaticShapePred, Ptc_NoZeroSizeDimPred],
                     "statically shaped tensor without zero-size dimensions">;
def Ptc_FloatTensor : Ptc_TensorOf<[F32, BF16, F16]>;
def Ptc_IdTensor : Ptc_TensorOf<[I32]>;
def Ptc_AnyTensor : Ptc_TensorOf<[F32, BF16, F16, I32]>;

// A dimension index where negative values count from the end. Upstream's
// I64Attr reads back as uint64_t, which turns the default -1 into 2^64 - 1 in
// every `axis < 0` test; this one reads back signed.
def Ptc_AxisAttr : TypedSignlessIntegerAttrBase<I64, "int64_t",
    "64-bit signless integer attribute (a dimension; negative counts from the end)"> {
  let convertFromStorage = "$_self.getValue().getSExtValue()";
}

class Ptc_Op<string mnemonic, list<Trait> traits = []>
    : Op<Ptc_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def Ptc_ShardingAttr : AttrDef<Ptc_Dialect, "Sharding"> {
  let mnemonic = "sharding";
  let summary = "how a tensor is split over the device mesh";
  let description = [{
    Per dimension the mesh axis it is split over, or `_` (whole), optionally
    as `k` equal blocks each split over the axis (`tp/3`: a fused QKV
    projection split by heads), and the axes over which the value is a
    partial sum. User annotations (`ptc.sharding` on arguments, or a list of
    them on an op's results) and ptc-shard's result on every argument use it;
    passes read it without parsing text again. A string with the same text
    (`"[dp, _]"`) is accepted in annotations.

    ```mlir
    %w: tensor<384x128xf32> {ptc.param = "attn.c_attn.weight", ptc.sharding = #ptc.sharding<[tp/3, _]>}
    #ptc.sharding<[dp, _, _], partial(tp)>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"::mlir::StringAttr", "axis per dimension (empty: whole)">:$axes,
    ArrayRefParameter<"int64_t", "blocks per dimension (1: a plain split)">:$blocks,
    ArrayRefParameter<"::mlir::StringAttr", "axes of a pending partial sum">:$partial);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Ptc_ScheduleActionAttr : AttrDef<Ptc_Dialect, "ScheduleAction"> {
  let mnemonic = "action";
  let summary = "one action of a pipeline rank's schedule";
  let description = [{
    What ptc-schedule-pipeline puts in a step's `ptc.schedule` action lists and
    ptc-export-plan and ptc-schedule-report read: compute a chunk's forward,
    backward or weight segment for a micro-batch, or send / receive on a
    channel (micro-batch -1: once per step).

    ```mlir
    #ptc.action<forward chunk 1 mb 3>
    #ptc.action<send channel 2 mb 3>
    ```
  }];
  let parameters = (ins "int64_t":$kind, "int64_t":$chunk, "int64_t":$mb, "int64_t":$channel);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Action kinds, in the order of the plan's ActionKind.
    enum Kind : int64_t { Forward = 0, Backward = 1, Weight = 2, Send = 3, Recv = 4 };
    bool isCompute() const { return getKind() <= Weight; }
  }];
}

#endif // PTC_BASE_TD
