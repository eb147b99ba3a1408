// RUN: ptc-opt %s --ptc-summarize-model='verbose=true' | FileCheck %s

// Parameters, inputs, the op mix and forward FLOPs (2*M*N*K per matmul:
// 2*2*4*8 = 128 and 2*2*3*4 = 48) of a two-layer model.
// CHECK-LABEL: ptc model @train_step
// CHECK-NEXT:   parameters: 47 (0.00 M) in 3 tensors, 188 bytes
// CHECK-NEXT:     fc1.weight: 4x8xf32
// CHECK-NEXT:     fc2.weight: 3x4xf32
// CHECK-NEXT:     fc2.bias: 3xf32
// CHECK-NEXT:   inputs: x 2x8xf32 labels 2xi32
// CHECK-NEXT:   ops: 6 (ptc.matmul 2, ptc.relu 1, ptc.add 1, ptc.cross_entropy 1, func.return 1)
// CHECK-NEXT:   forward FLOPs per step: 176 (training step about 3x: 528)
// The IR is unchanged.
// CHECK: func.func @train_step
func.func @train_step(%w1: tensor<4x8xf32> {ptc.param = "fc1.weight"}, %w2: tensor<3x4xf32> {ptc.param = "fc2.weight"},
                      %b2: tensor<3xf32> {ptc.param = "fc2.bias"}, %x: tensor<2x8xf32> {ptc.input = "x"},
                      %labels: tensor<2xi32> {ptc.input = "labels"}) -> tensor<f32> {
  %0 = ptc.matmul %x, %w1 {transpose_rhs = true} : tensor<2x8xf32>, tensor<4x8xf32> -> tensor<2x4xf32>
  %1 = ptc.relu %0 : tensor<2x4xf32>
  %2 = ptc.matmul %1, %w2 {transpose_rhs = true} : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
  %3 = ptc.add %2, %b2 : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %4 = ptc.cross_entropy %3, %labels : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  return %4 : tensor<f32>
}

// A function without parameters is not summarized.
// CHECK-NOT: ptc model @helper
func.func @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ptc.gelu %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
