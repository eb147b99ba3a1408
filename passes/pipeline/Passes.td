//===- Passes.td - micro-batches and pipeline stages -------*- tablegen -*-===//

#ifndef PTC_PASSES_PIPELINE_PASSES_TD
#define PTC_PASSES_PIPELINE_PASSES_TD

include "mlir/Pass/PassBase.td"

def MicrobatchPass : Pass<"ptc-microbatch", "::mlir::func::FuncOp"> {
  let summary = "Give the forward model the shapes of one micro-batch";
  let description = [{
    Runs before `ptc-autodiff`. The batch dimension of every value that
    depends on the inputs (the inputs' first dimension, tracked through each
    op: broadcasts, matmuls, reshapes, transposes, ...) is divided by `count`,
    so the step's ops describe one micro-batch of B/M rows. The loss (a mean
    over the batch) is scaled by 1/M; `ptc-autodiff` then sums the loss and
    every gradient over the micro-batches with `ptc.microbatch_sum`
    (gradient accumulation), and the function gets `ptc.microbatches = M`.

    Ops whose result depends on the whole batch at once (a maximum over the
    batch, MoE routing with its capacity) are errors naming the op.
  }];
  let options = [
    Option<"count", "count", "int64_t", /*default=*/"1", "Micro-batches per step">,
    Option<"dataParallel", "data-parallel", "int64_t", /*default=*/"1",
           "Data-parallel ranks the micro-batches are split over later (checked up front)">
  ];
}

def SplitStagesPass : Pass<"ptc-split-stages", "::mlir::ModuleOp"> {
  let summary = "Cut a micro-batched training step into pipeline stages";
  let description = [{
    Runs after `ptc-shard` (or after the optimizer without a mesh) on a step
    with `ptc.microbatches`. Ops fall into three groups: per micro-batch
    forward ops (those that depend on the inputs or feed ops that do),
    per micro-batch backward ops, and once-per-step ops (after the
    `ptc.microbatch_sum`s: gradient reduction, clipping, optimizer).

    The forward ops are cut into `stages` x `virtual-stages` chunks at places
    where a single activation crosses (between layers), balanced by a cost
    model (matmul and attention FLOPs, bytes elsewhere); fewer such places
    than cuts is an error. Forward ops marked `ptc.stage_boundary` in the
    model start a new chunk instead (exactly chunks - 1 of them). Chunk c runs on pipeline rank c mod `stages`. A
    backward op joins the lowest chunk among the values it reads (its forward
    op's chunk); a parameter lives with its first user; once-per-step ops
    with their parameter (ops of no chunk, such as the step counter, run on
    every rank). A value needed by another chunk gets a `ptc.send` /
    `ptc.recv` pair (a channel); a parameter used by a later chunk (the LM
    head tied to the embedding) is sent once per step from its home chunk,
    which sums both gradients and updates it. Gradient all-reduces and
    norm clipping are split per rank; the clipping norm then sums over `pp`.

    With `split-weight`, each chunk's backward ops that the input gradient
    does not need (weight gradients) form a separate segment (zero-bubble
    schedules). Every op gets `ptc.stage` (its chunk, -1: every rank) and
    `ptc.segment` ("forward", "backward", "weight" or "step").
  }];
  let options = [
    Option<"stages", "stages", "int", /*default=*/"0",
           "Pipeline ranks (default: the size of the mesh axis 'pp', else 1)">,
    Option<"virtualStages", "virtual-stages", "int", /*default=*/"1",
           "Model chunks per pipeline rank (interleaved schedules)">,
    Option<"splitWeight", "split-weight", "bool", /*default=*/"false",
           "Separate weight-gradient ops from input-gradient ops">,
    Option<"report", "report", "bool", /*default=*/"false",
           "Print each chunk's share of the forward cost and where it starts">
  ];
}

def SchedulePipelinePass : Pass<"ptc-schedule-pipeline", "::mlir::ModuleOp"> {
  let summary = "Build, verify and report the per-rank action lists of a pipeline schedule";
  let description = [{
    After `ptc-split-stages`: generates the schedule (`gpipe`, `1f1b`,
    `interleaved-1f1b`, `zb-h1`) as one list of actions per pipeline rank —
    `F c<chunk> mb<i>`, `B ...`, `W ...`, `SEND ch<channel> mb<i>`,
    `RECV ...` — verifies it (every receive has its send, every chunk and
    micro-batch computed once, dependencies in order, no deadlock when
    receives block) and stores it as `ptc.schedule` on the function.

    With `report`, prints per rank the simulated bubble fraction (equal stage
    times), the peak number of in-flight micro-batches (activation sets) and
    the point-to-point bytes per step, next to the closed forms. With `svg`,
    writes the pipeline diagram to that file.
  }];
  let options = [
    Option<"schedule", "schedule", "std::string", /*default=*/"\"1f1b\"",
           "gpipe, 1f1b, interleaved-1f1b or zb-h1">,
    Option<"report", "report", "bool", /*default=*/"false", "Print the schedule report">,
    Option<"svg", "svg", "std::string", /*default=*/"\"\"", "Write the pipeline diagram here">
  ];
}

def ScheduleReportPass : Pass<"ptc-schedule-report", "::mlir::ModuleOp"> {
  let summary = "Report on the pipeline schedule of an already scheduled step";
  let description = [{
    Reads back the action lists `ptc-schedule-pipeline` stored (e.g. after
    `--ptc-compile="mesh=pp:4 microbatches=8 ..."`), verifies them and prints
    the same report: per rank the simulated busy time with equal stage times,
    peak in-flight micro-batches and point-to-point bytes, and the bubble next
    to its closed form. With `svg`, also writes the pipeline diagram.
  }];
  let options = [
    Option<"svg", "svg", "std::string", /*default=*/"\"\"", "Write the pipeline diagram here">
  ];
}

#endif // PTC_PASSES_PIPELINE_PASSES_TD
