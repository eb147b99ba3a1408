// RUN: ptc-opt %s --split-input-file --verify-diagnostics --pass-pipeline="builtin.module(func.func(ptc-mixed-precision{dtype=bf16}))" | FileCheck %s
// RUN: ptc-opt %s --split-input-file --verify-diagnostics --pass-pipeline="builtin.module(func.func(ptc-mixed-precision{dtype=bf16},ptc-autodiff{loss-scale=8.0}))" | FileCheck %s --check-prefix=GRAD

// The master weight stays f32 and is converted once; the model computes in
// bf16; the cross-entropy reads f32 logits, so the loss keeps full precision.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %arg0: tensor<8x4xf32> {ptc.param = "w"}
// CHECK-SAME: -> (tensor<f32> {ptc.loss})
// CHECK-NEXT: %[[W:.+]] = ptc.convert %arg0 : tensor<8x4xf32> -> tensor<8x4xbf16>
// CHECK-NEXT: %[[X:.+]] = ptc.convert %arg1 : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[H:.+]] = ptc.matmul %[[X]], %[[W]] {transpose_rhs = true} : tensor<2x4xbf16>, tensor<8x4xbf16> -> tensor<2x8xbf16>
// CHECK-NEXT: %[[G:.+]] = ptc.gelu %[[H]] : tensor<2x8xbf16>
// CHECK-NEXT: %[[L:.+]] = ptc.convert %[[G]] : tensor<2x8xbf16> -> tensor<2x8xf32>
// CHECK-NEXT: %[[LOSS:.+]] = ptc.cross_entropy %[[L]], %arg2 : tensor<2x8xf32>, tensor<2xi32> -> tensor<f32>
// CHECK-NEXT: return %[[LOSS]]

// The gradient reaches the master weight in f32 (the convert's VJP), scaled
// back by 1/8 after a backward pass seeded with the loss scale 8.
// GRAD-LABEL: func.func @mlp
// GRAD: arith.constant {{.*}}dense<8.000000e+00> : tensor<f32>
// GRAD: %[[DW:.+]] = ptc.convert %{{.*}} {ptc.backward} : tensor<8x4xbf16> -> tensor<8x4xf32>
// GRAD: %[[S:.+]] = ptc.scale %[[DW]] by 1.250000e-01 {{.*}}: tensor<8x4xf32>
// GRAD: return %{{.*}}, %[[S]] : tensor<f32>, tensor<8x4xf32>
func.func @mlp(%w: tensor<8x4xf32> {ptc.param = "w"}, %x: tensor<2x4xf32> {ptc.input = "x"},
               %y: tensor<2xi32> {ptc.input = "y"}) -> (tensor<f32> {ptc.loss}) {
  %h = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x4xf32>, tensor<8x4xf32> -> tensor<2x8xf32>
  %g = ptc.gelu %h : tensor<2x8xf32>
  %l = ptc.cross_entropy %g, %y : tensor<2x8xf32>, tensor<2xi32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error@+1 {{argument #0 must be f32 (the master copy), got 'tensor<4xbf16>'}}
func.func @low_master(%w: tensor<4xbf16> {ptc.param = "w"}) -> tensor<bf16> {
  %s = ptc.reduce_sum %w axes = [0] : tensor<4xbf16> -> tensor<bf16>
  return %s : tensor<bf16>
}

// -----

// Each argument is converted right before its first use, so a later layer's
// weight is converted after the earlier layer, and reverse-mode autodiff
// widens its gradient right after that layer's backward matmuls, before the
// earlier layer's: each gradient is narrowed, reduced and freed as the
// backward pass goes (not all kept for conversions at its end).
// CHECK-LABEL: func.func @two_layers
// CHECK-NEXT: %[[W1:.+]] = ptc.convert %arg0
// CHECK-NEXT: %[[X:.+]] = ptc.convert %arg2
// CHECK-NEXT: %[[H:.+]] = ptc.matmul %[[X]], %[[W1]]
// CHECK-NEXT: %[[W2:.+]] = ptc.convert %arg1
// CHECK-NEXT: ptc.matmul %[[H]], %[[W2]]
// GRAD-LABEL: func.func @two_layers
// GRAD: %[[DW2:.+]] = ptc.matmul %{{.*}}, %{{.*}} {ptc.backward, transpose_lhs = true}
// GRAD-NEXT: ptc.convert %[[DW2]] {ptc.backward} : tensor<4x4xbf16> -> tensor<4x4xf32>
// GRAD-NEXT: %[[DW1:.+]] = ptc.matmul %{{.*}}, %{{.*}} {ptc.backward, transpose_lhs = true}
// GRAD-NEXT: ptc.convert %[[DW1]] {ptc.backward} : tensor<4x4xbf16> -> tensor<4x4xf32>
func.func @two_layers(%w1: tensor<4x4xf32> {ptc.param = "w1"}, %w2: tensor<4x4xf32> {ptc.param = "w2"},
                      %x: tensor<2x4xf32> {ptc.input = "x"}, %y: tensor<2xi32> {ptc.input = "y"}) -> (tensor<f32> {ptc.loss}) {
  %h = ptc.matmul %x, %w1 {transpose_rhs = true} : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  %o = ptc.matmul %h, %w2 {transpose_rhs = true} : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  %l = ptc.cross_entropy %o, %y : tensor<2x4xf32>, tensor<2xi32> -> tensor<f32>
  return %l : tensor<f32>
}
