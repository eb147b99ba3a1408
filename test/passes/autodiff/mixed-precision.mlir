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
