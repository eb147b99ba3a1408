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

#endif // PTC_PASSES_ANALYSIS_PASSES_TD
