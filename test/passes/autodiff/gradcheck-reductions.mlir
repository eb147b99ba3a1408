// Finite-difference checks of the VJP rules of reduce_sum, reduce_mean (keep_dims: broadcast in the VJP), reduce_max.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/reduce_sum.mlir --ptc-compile="plan=%t/reduce_sum.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/reduce_sum.plan | FileCheck %s
// RUN: ptc-opt %t/reduce_mean_keep.mlir --ptc-compile="plan=%t/reduce_mean_keep.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/reduce_mean_keep.plan | FileCheck %s
// RUN: ptc-opt %t/reduce_max.mlir --ptc-compile="plan=%t/reduce_max.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/reduce_max.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- reduce_sum.mlir
func.func @reduce_sum(%a: tensor<3x4x5xf32> {ptc.param = "a"}, %r: tensor<4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.reduce_sum %a axes = [0, 2] : tensor<3x4x5xf32> -> tensor<4xf32>
  %weighted = ptc.mul %y, %r : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0] : tensor<4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce_mean_keep.mlir
func.func @reduce_mean_keep(%a: tensor<3x4x5xf32> {ptc.param = "a"}, %r: tensor<3x1x5xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.reduce_mean %a axes = [1] {keep_dims = true} : tensor<3x4x5xf32> -> tensor<3x1x5xf32>
  %weighted = ptc.mul %y, %r : tensor<3x1x5xf32>, tensor<3x1x5xf32> -> tensor<3x1x5xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x1x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce_max.mlir
func.func @reduce_max(%a: tensor<3x4x5xf32> {ptc.param = "a"}, %r: tensor<3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.reduce_max %a axes = [-1] : tensor<3x4x5xf32> -> tensor<3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
