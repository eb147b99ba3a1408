// ptc-opt behaves like mlir-opt: pass pipelines, IR printing between passes,
// split input files.
// RUN: ptc-opt %s -split-input-file --pass-pipeline='builtin.module(ptc-summarize-model,canonicalize)' --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s

// CHECK: IR Dump After SummarizeModelPass (ptc-summarize-model)
// CHECK: IR Dump After Canonicalizer (canonicalize)
// CHECK: func.func @first
// CHECK: IR Dump After SummarizeModelPass (ptc-summarize-model)
// CHECK: func.func @second
func.func @first(%w: tensor<4x8xf32> {ptc.param = "w"}, %x: tensor<2x8xf32> {ptc.input = "x"}) -> tensor<2x4xf32> {
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x8xf32>, tensor<4x8xf32> -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @second(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ptc.relu %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
