//===- Passes.td - ptc analysis passes ---------------------*- tablegen -*-===//

#ifndef PTC_PASSES_ANALYSIS_PASSES_TD
#define PTC_PASSES_ANALYSIS_PASSES_TD

include "mlir/Pass/PassBase.td"

def SummarizeModelPass : Pass<"ptc-summarize-model", "::mlir::ModuleOp"> {
  let summary = "Print parameter, input, op and FLOP counts of every ptc model function";
  let description = [{
    For every function that has `ptc.param` arguments, prints (to standard
    output, before the IR) a short summary: the number of trainable parameters
    and their bytes, the per-step inputs, the op mix, and the forward FLOPs of
    one step (matmuls `2*M*N*K`, causal attention counted dense as
    `4*B*heads*S*S*D`, as MFU conventions do). The IR is left unchanged.

    Input:
    ```mlir
    func.func @train_step(%w: tensor<4x8xf32> {ptc.param = "fc.weight"},
                          %x: tensor<2x8xf32> {ptc.input = "x"}) -> tensor<2x4xf32>
    ```
    Output (stdout):
    ```
    ptc model @train_step
      parameters: 32 in 1 tensors (128 bytes)
      ...
    ```
  }];
  let options = [
    Option<"verbose", "verbose", "bool", /*default=*/"false",
           "Also list every parameter with its shape">
  ];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

def RecordModelFlopsPass : Pass<"ptc-record-model-flops", "::mlir::ModuleOp"> {
  let summary = "Record each model function's training FLOPs per step (for MFU)";
  let description = [{
    Sets `ptc.model_flops` on every function with `ptc.param` arguments: three
    times its forward FLOPs as `ptc-summarize-model` counts them (the backward
    pass costs twice the forward), over the global batch, before autodiff,
    recomputation or partitioning change the function. `ptc-export-plan` writes
    it into the plan, where `ptc-run` divides it by the step time (TFLOP/s) and
    the device's peak (MFU). Recomputed work is not counted, as model FLOPs
    utilisation defines it.
  }];
  let dependentDialects = ["::mlir::ptc::PtcDialect"];
}

#endif // PTC_PASSES_ANALYSIS_PASSES_TD
