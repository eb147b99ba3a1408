// Finite-difference checks of the VJP rules of layer_norm, causal_attention (default and explicit scale), embedding.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/layer_norm.mlir --ptc-compile="plan=%t/layer_norm.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/layer_norm.plan | FileCheck %s
// RUN: ptc-opt %t/causal_attention.mlir --ptc-compile="plan=%t/causal_attention.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/causal_attention.plan | FileCheck %s
// RUN: ptc-opt %t/causal_attention_scale.mlir --ptc-compile="plan=%t/causal_attention_scale.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/causal_attention_scale.plan | FileCheck %s
// RUN: ptc-opt %t/embedding.mlir --ptc-compile="plan=%t/embedding.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/embedding.plan | FileCheck %s
// Each tensor's line gives the relative error only where it means something
// (near-zero gradients made it 1 on lines that passed) and the worst error as
// a share of its tolerance, which is what passing means.
// CHECK: max rel err {{[0-9.e+-]+}} (where |gradient| >= atol/rtol), worst error {{[0-9]+}}% of its tolerance
// CHECK: gradcheck: passed

//--- layer_norm.mlir
func.func @layer_norm(%x: tensor<3x4x8xf32> {ptc.param = "x"}, %w: tensor<8xf32> {ptc.param = "w"}, %b: tensor<8xf32> {ptc.param = "b"}, %r: tensor<3x4x8xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.layer_norm %x, %w, %b : tensor<3x4x8xf32>, tensor<8xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4x8xf32>, tensor<3x4x8xf32> -> tensor<3x4x8xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x4x8xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- causal_attention.mlir
func.func @causal_attention(%q: tensor<2x2x5x4xf32> {ptc.param = "q"}, %k: tensor<2x2x5x4xf32> {ptc.param = "k"}, %v: tensor<2x2x5x4xf32> {ptc.param = "v"}, %r: tensor<2x2x5x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.causal_attention %q, %k, %v : tensor<2x2x5x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x2x5x4xf32>, tensor<2x2x5x4xf32> -> tensor<2x2x5x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x2x5x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- causal_attention_scale.mlir
func.func @causal_attention_scale(%q: tensor<1x2x4x3xf32> {ptc.param = "q"}, %k: tensor<1x2x4x3xf32> {ptc.param = "k"}, %v: tensor<1x2x4x3xf32> {ptc.param = "v"}, %r: tensor<1x2x4x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.causal_attention %q, %k, %v {scale = 0.7 : f64} : tensor<1x2x4x3xf32>
  %weighted = ptc.mul %y, %r : tensor<1x2x4x3xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x4x3xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<1x2x4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- embedding.mlir
func.func @embedding(%t: tensor<7x3xf32> {ptc.param = "t"}, %ids: tensor<2x5xi32> {ptc.input = "ids"}, %r: tensor<2x5x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.embedding %t, %ids : tensor<7x3xf32>, tensor<2x5xi32> -> tensor<2x5x3xf32>
  %weighted = ptc.mul %y, %r : tensor<2x5x3xf32>, tensor<2x5x3xf32> -> tensor<2x5x3xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
