// Finite-difference checks of the VJP rules of top_k_gate (normalized or not), moe_dispatch, moe_combine with capacity drops.
// (The router cases use eps 3e-3: softmax curvature makes eps 1e-2 too coarse.)
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/top_k_gate_normalized.mlir --ptc-compile="plan=%t/top_k_gate_normalized.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/top_k_gate_normalized.plan --eps 3e-3 | FileCheck %s
// RUN: ptc-opt %t/top_k_gate_raw.mlir --ptc-compile="plan=%t/top_k_gate_raw.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/top_k_gate_raw.plan --eps 3e-3 | FileCheck %s
// RUN: ptc-opt %t/moe_layer.mlir --ptc-compile="plan=%t/moe_layer.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/moe_layer.plan | FileCheck %s
// RUN: ptc-opt %t/moe_groups.mlir --ptc-compile="plan=%t/moe_groups.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/moe_groups.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- top_k_gate_normalized.mlir
func.func @top_k_gate_normalized(%l: tensor<6x4xf32> {ptc.param = "l"}, %r: tensor<6x2xf32> {ptc.input = "r"}) -> tensor<f32> {
  %w, %e = ptc.top_k_gate %l {k = 2 : i64} : tensor<6x4xf32> -> tensor<6x2xf32>, tensor<6x2xi32>
  %weighted = ptc.mul %w, %r : tensor<6x2xf32>, tensor<6x2xf32> -> tensor<6x2xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<6x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- top_k_gate_raw.mlir
func.func @top_k_gate_raw(%l: tensor<6x4xf32> {ptc.param = "l"}, %r: tensor<6x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %w, %e = ptc.top_k_gate %l {k = 3 : i64, normalize = false} : tensor<6x4xf32> -> tensor<6x3xf32>, tensor<6x3xi32>
  %weighted = ptc.mul %w, %r : tensor<6x3xf32>, tensor<6x3xf32> -> tensor<6x3xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<6x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- moe_layer.mlir
func.func @moe_layer(%l: tensor<8x4xf32> {ptc.param = "l"}, %x: tensor<8x3xf32> {ptc.param = "x"}, %w1: tensor<4x3x5xf32> {ptc.param = "w1"}, %r: tensor<8x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %w, %e = ptc.top_k_gate %l {k = 2 : i64} : tensor<8x4xf32> -> tensor<8x2xf32>, tensor<8x2xi32>
  %buf = ptc.moe_dispatch %x, %e : tensor<8x3xf32>, tensor<8x2xi32> -> tensor<4x3x3xf32>
  %h = ptc.matmul %buf, %w1 : tensor<4x3x3xf32>, tensor<4x3x5xf32> -> tensor<4x3x5xf32>
  %o = ptc.slice %h offsets = [0, 0, 1] : tensor<4x3x5xf32> -> tensor<4x3x3xf32>
  %y = ptc.moe_combine %o, %w, %e : tensor<4x3x3xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x3xf32>
  %weighted = ptc.mul %y, %r : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<8x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- moe_groups.mlir
// Two routing groups of 4 tokens, capacity 2 per expert per group (drops), and the
// load-balancing term sum(expert_load * mean probability) (expert_load has no gradient).
func.func @moe_groups(%l: tensor<2x4x4xf32> {ptc.param = "l"}, %x: tensor<2x4x3xf32> {ptc.param = "x"}, %w1: tensor<4x4x3xf32> {ptc.param = "w1"}, %r: tensor<2x4x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %w, %e = ptc.top_k_gate %l {k = 2 : i64} : tensor<2x4x4xf32> -> tensor<2x4x2xf32>, tensor<2x4x2xi32>
  %buf = ptc.moe_dispatch %x, %e : tensor<2x4x3xf32>, tensor<2x4x2xi32> -> tensor<4x2x2x3xf32>
  %flat = ptc.reshape %buf : tensor<4x2x2x3xf32> -> tensor<4x4x3xf32>
  %h = ptc.matmul %flat, %w1 {transpose_rhs = true} : tensor<4x4x3xf32>, tensor<4x4x3xf32> -> tensor<4x4x4xf32>
  %o = ptc.slice %h offsets = [0, 0, 1] : tensor<4x4x4xf32> -> tensor<4x4x3xf32>
  %o4 = ptc.reshape %o : tensor<4x4x3xf32> -> tensor<4x2x2x3xf32>
  %y = ptc.moe_combine %o4, %w, %e : tensor<4x2x2x3xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32> -> tensor<2x4x3xf32>
  %weighted = ptc.mul %y, %r : tensor<2x4x3xf32>, tensor<2x4x3xf32> -> tensor<2x4x3xf32>
  %main = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x4x3xf32> -> tensor<f32>
  %p = ptc.softmax %l : tensor<2x4x4xf32>
  %pm = ptc.reduce_mean %p axes = [1] : tensor<2x4x4xf32> -> tensor<2x4xf32>
  %f = ptc.expert_load %e : tensor<2x4x2xi32> -> tensor<2x4xf32>
  %fp = ptc.mul %f, %pm : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %aux = ptc.reduce_sum %fp axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
  %loss = ptc.add %main, %aux : tensor<f32>, tensor<f32> -> tensor<f32>
  return %loss : tensor<f32>
}
