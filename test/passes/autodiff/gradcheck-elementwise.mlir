// Finite-difference checks of the VJP rules of add/sub/mul/div/scale with broadcasting (unbroadcast reductions in the VJPs).
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/add_broadcast.mlir --ptc-compile="plan=%t/add_broadcast.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/add_broadcast.plan | FileCheck %s
// RUN: ptc-opt %t/sub_broadcast.mlir --ptc-compile="plan=%t/sub_broadcast.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/sub_broadcast.plan | FileCheck %s
// RUN: ptc-opt %t/mul_broadcast.mlir --ptc-compile="plan=%t/mul_broadcast.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/mul_broadcast.plan | FileCheck %s
// RUN: ptc-opt %t/div.mlir --ptc-compile="plan=%t/div.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/div.plan | FileCheck %s
// RUN: ptc-opt %t/scale.mlir --ptc-compile="plan=%t/scale.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/scale.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- add_broadcast.mlir
func.func @add_broadcast(%a: tensor<3x4x5xf32> {ptc.param = "a"}, %b: tensor<5xf32> {ptc.param = "b"}, %r: tensor<3x4x5xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.add %a, %b : tensor<3x4x5xf32>, tensor<5xf32> -> tensor<3x4x5xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4x5xf32>, tensor<3x4x5xf32> -> tensor<3x4x5xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x4x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- sub_broadcast.mlir
func.func @sub_broadcast(%a: tensor<3x1x5xf32> {ptc.param = "a"}, %b: tensor<4x1xf32> {ptc.param = "b"}, %r: tensor<3x4x5xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.sub %a, %b : tensor<3x1x5xf32>, tensor<4x1xf32> -> tensor<3x4x5xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4x5xf32>, tensor<3x4x5xf32> -> tensor<3x4x5xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x4x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- mul_broadcast.mlir
func.func @mul_broadcast(%a: tensor<3x4xf32> {ptc.param = "a"}, %b: tensor<1x4xf32> {ptc.param = "b"}, %r: tensor<3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.mul %a, %b : tensor<3x4xf32>, tensor<1x4xf32> -> tensor<3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- div.mlir
func.func @div(%a: tensor<3x4xf32> {ptc.param = "a"}, %b: tensor<4xf32> {ptc.param = "b"}, %r: tensor<3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %b2 = ptc.mul %b, %b : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %one = arith.constant dense<1.0> : tensor<4xf32>
  %d = ptc.add %b2, %one : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %y = ptc.div %a, %d : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- scale.mlir
func.func @scale(%a: tensor<6xf32> {ptc.param = "a"}, %r: tensor<6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.scale %a by -2.5 : tensor<6xf32>
  %weighted = ptc.mul %y, %r : tensor<6xf32>, tensor<6xf32> -> tensor<6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0] : tensor<6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
