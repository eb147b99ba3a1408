// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fuse-loss-widening))" | FileCheck %s

// Mixed precision's loss: the widened logits and the f32 gradient go; the
// loss and its gradient read the bf16 logits, the gradient is bf16.
// CHECK-LABEL: func.func @widened
// CHECK-NOT: ptc.convert
// CHECK: %[[L:.*]] = ptc.cross_entropy %arg0, %arg1 : tensor<2x4x16xbf16>, tensor<2x4xi32> -> tensor<f32>
// CHECK: %[[G:.*]] = ptc.cross_entropy_grad %arg0, %arg1, %arg2 {ptc.backward} : tensor<2x4x16xbf16>, tensor<2x4xi32>, tensor<f32>
// CHECK-NOT: ptc.convert
// CHECK: return %[[L]], %[[G]]
func.func @widened(%l: tensor<2x4x16xbf16>, %t: tensor<2x4xi32>, %seed: tensor<f32>) -> (tensor<f32>, tensor<2x4x16xbf16>) {
  %w = ptc.convert %l : tensor<2x4x16xbf16> -> tensor<2x4x16xf32>
  %loss = ptc.cross_entropy %w, %t : tensor<2x4x16xf32>, tensor<2x4xi32> -> tensor<f32>
  %g = ptc.cross_entropy_grad %w, %t, %seed {ptc.backward} : tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<f32>
  %g16 = ptc.convert %g {ptc.backward} : tensor<2x4x16xf32> -> tensor<2x4x16xbf16>
  return %loss, %g16 : tensor<f32>, tensor<2x4x16xbf16>
}

// -----

// f16 logits (fp16 training with loss scaling) likewise.
// CHECK-LABEL: func.func @half
// CHECK-NOT: ptc.convert
// CHECK: ptc.cross_entropy_grad %arg0, %arg1, %arg2 : tensor<8x16xf16>, tensor<8xi32>, tensor<f32>
func.func @half(%l: tensor<8x16xf16>, %t: tensor<8xi32>, %seed: tensor<f32>) -> (tensor<f32>, tensor<8x16xf16>) {
  %w = ptc.convert %l : tensor<8x16xf16> -> tensor<8x16xf32>
  %loss = ptc.cross_entropy %w, %t : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  %g = ptc.cross_entropy_grad %w, %t, %seed : tensor<8x16xf32>, tensor<8xi32>, tensor<f32>
  %g16 = ptc.convert %g : tensor<8x16xf32> -> tensor<8x16xf16>
  return %loss, %g16 : tensor<f32>, tensor<8x16xf16>
}

// -----

// Kept where the widened logits or the f32 gradient serve something else:
// the loss reads the bf16 logits, but the widening stays for the other
// reader; the gradient stays f32 (it is returned as f32, not narrowed).
// CHECK-LABEL: func.func @kept
// CHECK: %[[W:.*]] = ptc.convert %arg0 : tensor<8x16xbf16> -> tensor<8x16xf32>
// CHECK: ptc.cross_entropy %arg0, %arg1 : tensor<8x16xbf16>, tensor<8xi32> -> tensor<f32>
// CHECK: ptc.cross_entropy_grad %[[W]], %arg1, %arg2 : tensor<8x16xf32>, tensor<8xi32>, tensor<f32>
// CHECK: ptc.softmax %[[W]]
func.func @kept(%l: tensor<8x16xbf16>, %t: tensor<8xi32>, %seed: tensor<f32>) -> (tensor<f32>, tensor<8x16xf32>, tensor<8x16xf32>) {
  %w = ptc.convert %l : tensor<8x16xbf16> -> tensor<8x16xf32>
  %loss = ptc.cross_entropy %w, %t : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  %g = ptc.cross_entropy_grad %w, %t, %seed : tensor<8x16xf32>, tensor<8xi32>, tensor<f32>
  %p = ptc.softmax %w {axis = 1 : i64} : tensor<8x16xf32>
  return %loss, %g, %p : tensor<f32>, tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// f32 logits, and logits narrowed from f32 (no widening to undo): unchanged.
// CHECK-LABEL: func.func @unchanged
// CHECK: ptc.cross_entropy %arg0, %arg1 : tensor<8x16xf32>
// CHECK: %[[N:.*]] = ptc.convert %arg0 : tensor<8x16xf32> -> tensor<8x16xbf16>
// CHECK: ptc.cross_entropy %[[N]], %arg1 : tensor<8x16xbf16>, tensor<8xi32> -> tensor<bf16>
func.func @unchanged(%l: tensor<8x16xf32>, %t: tensor<8xi32>) -> (tensor<f32>, tensor<bf16>) {
  %loss = ptc.cross_entropy %l, %t : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  %n = ptc.convert %l : tensor<8x16xf32> -> tensor<8x16xbf16>
  %loss16 = ptc.cross_entropy %n, %t : tensor<8x16xbf16>, tensor<8xi32> -> tensor<bf16>
  return %loss, %loss16 : tensor<f32>, tensor<bf16>
}

// -----

// The vocabulary-parallel loss (tp over the classes) and its gradient read
// each rank's block of bf16 logits; the gradient is produced in bf16.
// CHECK-LABEL: func.func @vocab_parallel
// CHECK-NOT: ptc.convert
// CHECK: %[[L:.*]] = ptc.vocab_parallel_cross_entropy %arg0, %arg1 {axes = ["tp"]} : tensor<2x4x16xbf16>, tensor<2x4xi32> -> tensor<f32>
// CHECK: %[[G:.*]] = ptc.vocab_parallel_cross_entropy_grad %arg0, %arg1, %arg2 {axes = ["tp"], ptc.backward} : tensor<2x4x16xbf16>, tensor<2x4xi32>, tensor<f32>
// CHECK-NOT: ptc.convert
// CHECK: return %[[L]], %[[G]]
module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @vocab_parallel(%logits: tensor<2x4x16xbf16>, %t: tensor<2x4xi32>, %seed: tensor<f32>) -> (tensor<f32>, tensor<2x4x16xbf16>) {
    %w = ptc.convert %logits : tensor<2x4x16xbf16> -> tensor<2x4x16xf32>
    %l = ptc.vocab_parallel_cross_entropy %w, %t {axes = ["tp"]} : tensor<2x4x16xf32>, tensor<2x4xi32> -> tensor<f32>
    %g = ptc.vocab_parallel_cross_entropy_grad %w, %t, %seed {axes = ["tp"], ptc.backward} : tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<f32>
    %g16 = ptc.convert %g {ptc.backward} : tensor<2x4x16xf32> -> tensor<2x4x16xbf16>
    return %l, %g16 : tensor<f32>, tensor<2x4x16xbf16>
  }
}
