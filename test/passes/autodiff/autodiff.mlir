// RUN: ptc-opt %s -split-input-file --ptc-autodiff | FileCheck %s

// A linear layer, a square (two uses of one value: gradients add up) and a
// cross-entropy loss. Backward ops carry `ptc.backward` (for memory reports). The loss seed is 1; the bias gradient sums the
// broadcast batch dimension; the weight gradient is one GEMM (g^T x); the
// input x gets no gradient; the unused parameter gets zeros.
// CHECK-LABEL: func.func @step
// CHECK-SAME: -> (tensor<f32> {ptc.loss}, tensor<3x4xf32> {ptc.grad = "w"}, tensor<3xf32> {ptc.grad = "b"}, tensor<2xf32> {ptc.grad = "unused"})
// CHECK: %[[LOSS:.+]] = ptc.cross_entropy
// CHECK: %[[SEED:.+]] = arith.constant {{.*}}dense<1.000000e+00> : tensor<f32>
// CHECK: %[[DL:.+]] = ptc.cross_entropy_grad %{{.*}}, %{{.*}}, %[[SEED]]
// CHECK: %[[D1:.+]] = ptc.mul %[[DL]], %[[H:[^ ]+]] {ptc.backward} :
// CHECK: %[[D2:.+]] = ptc.mul %[[DL]], %[[H]] {ptc.backward} :
// CHECK: %[[DH:.+]] = ptc.add %[[D1]], %[[D2]]
// CHECK: %[[DB:.+]] = ptc.reduce_sum %[[DH]] axes = [0] {ptc.backward} : tensor<2x3xf32> -> tensor<3xf32>
// CHECK: %[[DW:.+]] = ptc.matmul %[[DH]], %arg3 {ptc.backward, transpose_lhs = true} : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
// CHECK-NOT: ptc.matmul
// CHECK: %[[ZERO:.+]] = arith.constant {{.*}}dense<0.000000e+00> : tensor<2xf32>
// CHECK: return %[[LOSS]], %[[DW]], %[[DB]], %[[ZERO]]
func.func @step(%w: tensor<3x4xf32> {ptc.param = "w"}, %b: tensor<3xf32> {ptc.param = "b"},
                %unused: tensor<2xf32> {ptc.param = "unused"}, %x: tensor<2x4xf32> {ptc.input = "x"},
                %y: tensor<2xi32> {ptc.input = "y"}) -> tensor<f32> {
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
  %1 = ptc.add %0, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %2 = ptc.mul %1, %1 : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x3xf32>
  %3 = ptc.cross_entropy %2, %y : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

// Ops the loss does not depend on get no backward ops (pruning).
// CHECK-LABEL: func.func @pruned
// CHECK: ptc.gelu
// CHECK-NOT: ptc.gelu_grad
// CHECK: ptc.relu_grad
func.func @pruned(%w: tensor<4xf32> {ptc.param = "w"}) -> tensor<f32> {
  %dead = ptc.gelu %w : tensor<4xf32>
  %0 = ptc.relu %w : tensor<4xf32>
  %1 = ptc.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// Functions without parameters are left alone.
// CHECK-LABEL: func.func @helper
// CHECK-SAME: -> tensor<4xf32>
// CHECK-NEXT: ptc.relu
// CHECK-NEXT: return
func.func @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ptc.relu %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
