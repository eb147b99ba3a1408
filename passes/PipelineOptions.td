//===- PipelineOptions.td - pipeline options taken from passes -*- tablegen -*-===//
//
// The options of ptc's pass pipelines that are a pass's option under the same
// meaning: each is declared once, in the pass's `options` (MLIR's Passes.td),
// and listed here; passes/gen_pipeline_options.py makes the pipeline's
// declaration (the pass's type, default and description) and the function
// that hands its value to the pass from this file's records
// (PipelineOptions.h.inc). The pipelines' own options (the plan file, the
// precision, reports) stay with the pipelines.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_PASSES_PIPELINEOPTIONS_TD
#define PTC_PASSES_PIPELINEOPTIONS_TD

include "passes/autodiff/Passes.td"
include "passes/export/Passes.td"
include "passes/inference/Passes.td"
include "passes/pipeline/Passes.td"
include "passes/sharding/Passes.td"

// The option `option` (its cppName) of `pass`, an option of the pipeline
// `pipeline` ("Compile": ptc-compile's CompilePipelineOptions, "Shard":
// ptc-shard's ShardPipelineOptions). `argument` and `cppName` rename it on the
// pipeline (empty: the pass's); `description` replaces the pass's where the
// pipeline takes more (empty: the pass's).
class PipelineOption<string pipelineName, Pass fromPass, string passOption,
                     string pipelineArgument = "", string pipelineCppName = "",
                     string pipelineDescription = ""> {
  string pipeline = pipelineName;
  Pass pass = fromPass;
  string option = passOption;
  string argument = pipelineArgument;
  string cppName = pipelineCppName;
  string description = pipelineDescription;
}

// Every option of `pass` but those in `except`, under the pass's names.
class PipelineOptionsOf<string pipelineName, Pass fromPass, list<string> except = []> {
  string pipeline = pipelineName;
  Pass pass = fromPass;
  list<string> excluded = except;
}

//===- ptc-compile --------------------------------------------------------===//

// The optimizer's settings; muon-ranks follows from the mesh.
def : PipelineOptionsOf<"Compile", OptimizerPass, ["muonRanks"]>;
def : PipelineOption<"Compile", OptimizerPass, "optimizer", "", "",
                     "adamw, sgd, adafactor, muon or none (forward + backward only)">;
def : PipelineOption<"Compile", AutodiffPass, "lossScale">;
def : PipelineOption<"Compile", MicrobatchPass, "count", "microbatches", "microbatches",
                     "Micro-batches per step (gradient accumulation; pipeline schedules)">;
def : PipelineOption<"Compile", RecomputePass, "layers", "recompute-layers", "recomputeLayers">;
def : PipelineOption<"Compile", PropagateShardingPass, "sequenceParallel">;
def : PipelineOption<"Compile", PropagateShardingPass, "zero">;
def : PipelineOption<"Compile", PropagateShardingPass, "reshardAfterForward">;
def : PipelineOption<"Compile", BucketCollectivesPass, "gradReduceDtype">;
def : PipelineOption<"Compile", BucketCollectivesPass, "bucketMb">;
def : PipelineOption<"Compile", SplitStagesPass, "virtualStages">;
def : PipelineOption<"Compile", SchedulePipelinePass, "schedule">;
def : PipelineOption<"Compile", ExportPlanPass, "offloadTarget">;
def : PipelineOption<"Compile", ExportPlanPass, "offloadPath">;

//===- ptc-shard ----------------------------------------------------------===//

def : PipelineOptionsOf<"Shard", PropagateShardingPass>;

//===- ptc-compile-decode -------------------------------------------------===//

def : PipelineOptionsOf<"Decode", DeriveDecodePass>;

#endif // PTC_PASSES_PIPELINEOPTIONS_TD
