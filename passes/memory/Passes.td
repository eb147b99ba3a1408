//===- Passes.td - memory planning -------------------------*- tablegen -*-===//

#ifndef PTC_PASSES_MEMORY_PASSES_TD
#define PTC_PASSES_MEMORY_PASSES_TD

include "mlir/Pass/PassBase.td"

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

#endif // PTC_PASSES_MEMORY_PASSES_TD
