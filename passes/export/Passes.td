//===- Passes.td - plan export -----------------------------*- tablegen -*-===//

#ifndef PTC_PASSES_EXPORT_PASSES_TD
#define PTC_PASSES_EXPORT_PASSES_TD

include "mlir/Pass/PassBase.td"

def ExportPlanPass : Pass<"ptc-export-plan", "::mlir::ModuleOp"> {
  let summary = "Write the training step as a FlatBuffers plan for ptc-run";
  let description = [{
    Serializes the one function with a `ptc.loss` result (after
    `ptc-plan-memory`) into the plan format of `runtime/plan/plan.fbs`:
    a tensor table (parameters with their initializers, optimizer state,
    inputs, constants, arena temporaries), one instruction per ptc op, and the
    named outputs (`loss`, `grad_norm`, `grad:<param>`). Results returned
    with `ptc.update` become in-place writes of their argument; the pass
    rejects IR that would read the old value after such a write. A module
    with a `ptc.mesh` (after `ptc-shard`) gives the plan its mesh, the number
    of ranks, and each argument's sharding. The IR is left unchanged.
  }];
  let options = [
    Option<"output", "output", "std::string", /*default=*/"\"\"",
           "Path of the plan file to write">,
    Option<"reportStash", "report-stash", "bool", /*default=*/"false",
           "For a pipelined plan, print each pipeline rank's activation stash: the "
           "rank's schedule simulated on the written plan with the runtime's own "
           "segment code (runtime/plan/pipeline_segments), and the rank's peak with it">,
    Option<"offloadTarget", "offload-target", "std::string", /*default=*/"\"host\"",
           "Where an offloaded plan's host model state lives: host (memory) or nvme (a file "
           "in offload-path)">,
    Option<"offloadPath", "offload-path", "std::string", /*default=*/"\"\"",
           "NVMe offload: the directory of the offload file, recorded in the plan">,
    Option<"deviceMemory", "device-memory", "std::string", /*default=*/"\"\"",
           "With report-stash: fail when a pipeline rank's peak with its stash exceeds "
           "this many bytes (e.g. 80GB, 512MiB)">
  ];
}

#endif // PTC_PASSES_EXPORT_PASSES_TD
