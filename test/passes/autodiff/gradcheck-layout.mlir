// Finite-difference checks of the VJP rules of reshape, transpose, slice (pad in the VJP) and concat.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/reshape_transpose.mlir --ptc-compile="plan=%t/reshape_transpose.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/reshape_transpose.plan | FileCheck %s
// RUN: ptc-opt %t/slice.mlir --ptc-compile="plan=%t/slice.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/slice.plan | FileCheck %s
// RUN: ptc-opt %t/concat.mlir --ptc-compile="plan=%t/concat.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/concat.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- reshape_transpose.mlir
func.func @reshape_transpose(%a: tensor<2x3x4xf32> {ptc.param = "a"}, %r: tensor<2x3x2x2xf32> {ptc.input = "r"}) -> tensor<f32> {
  %s = ptc.reshape %a : tensor<2x3x4xf32> -> tensor<2x3x2x2xf32>
  %y = ptc.transpose %s permutation = [3, 1, 0, 2] : tensor<2x3x2x2xf32> -> tensor<2x3x2x2xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x2x2xf32>, tensor<2x3x2x2xf32> -> tensor<2x3x2x2xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x3x2x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- slice.mlir
func.func @slice(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<2x3xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.slice %a offsets = [1, 2] : tensor<4x6xf32> -> tensor<2x3xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x3xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- concat.mlir
func.func @concat(%a: tensor<2x3xf32> {ptc.param = "a"}, %b: tensor<2x2xf32> {ptc.param = "b"}, %r: tensor<2x8xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.concat %a, %b, %a axis = 1 : tensor<2x3xf32>, tensor<2x2xf32>, tensor<2x3xf32> -> tensor<2x8xf32>
  %weighted = ptc.mul %y, %r : tensor<2x8xf32>, tensor<2x8xf32> -> tensor<2x8xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<2x8xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
