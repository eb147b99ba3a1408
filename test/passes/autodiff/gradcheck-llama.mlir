// Finite-difference checks of the VJP rules of the Llama ops: rms_norm,
// rotary (and its inverse), grouped-query causal_attention, and of the layout
// ops broadcast and pad when a model uses them directly.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/rms_norm.mlir --ptc-compile="plan=%t/rms_norm.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/rms_norm.plan | FileCheck %s
// RUN: ptc-opt %t/rotary.mlir --ptc-compile="plan=%t/rotary.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/rotary.plan | FileCheck %s
// RUN: ptc-opt %t/gqa.mlir --ptc-compile="plan=%t/gqa.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/gqa.plan | FileCheck %s
// RUN: ptc-opt %t/broadcast_pad.mlir --ptc-compile="plan=%t/broadcast_pad.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/broadcast_pad.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- rms_norm.mlir
func.func @rms_norm(%x: tensor<3x4x8xf32> {ptc.param = "x"}, %w: tensor<8xf32> {ptc.param = "w"}, %r: tensor<3x4x8xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.rms_norm %x, %w {epsilon = 1.0e-6 : f64} : tensor<3x4x8xf32>, tensor<8xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4x8xf32>, tensor<3x4x8xf32> -> tensor<3x4x8xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x4x8xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rotary.mlir
func.func @rotary(%x: tensor<2x3x5x6xf32> {ptc.param = "x"}, %r: tensor<2x3x5x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.rotary %x {theta = 100.0 : f64} : tensor<2x3x5x6xf32>
  %z = ptc.rotary %y {theta = 7.0 : f64, inverse = true} : tensor<2x3x5x6xf32>
  %weighted = ptc.mul %z, %r : tensor<2x3x5x6xf32>, tensor<2x3x5x6xf32> -> tensor<2x3x5x6xf32>
  %sq = ptc.mul %weighted, %y : tensor<2x3x5x6xf32>, tensor<2x3x5x6xf32> -> tensor<2x3x5x6xf32>
  %loss = ptc.reduce_sum %sq axes = [0, 1, 2, 3] : tensor<2x3x5x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gqa.mlir
func.func @gqa(%q: tensor<2x4x5x4xf32> {ptc.param = "q"}, %k: tensor<2x2x5x4xf32> {ptc.param = "k"}, %v: tensor<2x2x5x4xf32> {ptc.param = "v"}, %r: tensor<2x4x5x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.causal_attention %q, %k, %v : tensor<2x4x5x4xf32>, tensor<2x2x5x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x4x5x4xf32>, tensor<2x4x5x4xf32> -> tensor<2x4x5x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x4x5x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast_pad.mlir
func.func @broadcast_pad(%x: tensor<4x1xf32> {ptc.param = "x"}, %p: tensor<2x3xf32> {ptc.param = "p"}, %r: tensor<2x4x5xf32> {ptc.input = "r"}) -> tensor<f32> {
  %b = ptc.broadcast %x : tensor<4x1xf32> -> tensor<2x4x5xf32>
  %padded = ptc.pad %p offsets = [1, 2] : tensor<2x3xf32> -> tensor<4x5xf32>
  %s = ptc.mul %b, %padded : tensor<2x4x5xf32>, tensor<4x5xf32> -> tensor<2x4x5xf32>
  %sq = ptc.mul %s, %b : tensor<2x4x5xf32>, tensor<2x4x5xf32> -> tensor<2x4x5xf32>
  %weighted = ptc.mul %sq, %r : tensor<2x4x5xf32>, tensor<2x4x5xf32> -> tensor<2x4x5xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x4x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
