// Finite-difference checks of the VJP rules of matmul with every transpose combination, shared (rank-2) and batched rhs.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/shared_00.mlir --ptc-compile="plan=%t/shared_00.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/shared_00.plan | FileCheck %s
// RUN: ptc-opt %t/batched_00.mlir --ptc-compile="plan=%t/batched_00.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/batched_00.plan | FileCheck %s
// RUN: ptc-opt %t/shared_01.mlir --ptc-compile="plan=%t/shared_01.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/shared_01.plan | FileCheck %s
// RUN: ptc-opt %t/batched_01.mlir --ptc-compile="plan=%t/batched_01.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/batched_01.plan | FileCheck %s
// RUN: ptc-opt %t/shared_10.mlir --ptc-compile="plan=%t/shared_10.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/shared_10.plan | FileCheck %s
// RUN: ptc-opt %t/batched_10.mlir --ptc-compile="plan=%t/batched_10.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/batched_10.plan | FileCheck %s
// RUN: ptc-opt %t/shared_11.mlir --ptc-compile="plan=%t/shared_11.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/shared_11.plan | FileCheck %s
// RUN: ptc-opt %t/batched_11.mlir --ptc-compile="plan=%t/batched_11.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/batched_11.plan | FileCheck %s
// A matmul written with a bias (its VJP sums the gradient's rows), and a bias
// add that ptc-fuse-matmul-bias folds into the forward matmul after autodiff.
// RUN: ptc-opt %t/bias.mlir --ptc-compile="plan=%t/bias.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/bias.plan | FileCheck %s
// RUN: ptc-opt %t/bias_add.mlir --ptc-compile="plan=%t/bias_add.plan optimizer=none" -o - | FileCheck %s --check-prefix=FUSED
// RUN: ptc-gradcheck %t/bias_add.plan | FileCheck %s
// CHECK: gradcheck: passed
// FUSED: ptc.matmul %{{[^,]+}}, %{{[^,]+}}, %{{[^ ]+}} {{.*}}transpose_rhs = true{{.*}} : tensor<2x3x5xf32>, tensor<4x5xf32>, tensor<4xf32> -> tensor<2x3x4xf32>

//--- shared_00.mlir
func.func @shared_00(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<5x4xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b : tensor<2x3x5xf32>, tensor<5x4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched_00.mlir
func.func @batched_00(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<2x5x4xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b : tensor<2x3x5xf32>, tensor<2x5x4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- shared_01.mlir
func.func @shared_01(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<4x5xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_rhs = true} : tensor<2x3x5xf32>, tensor<4x5xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched_01.mlir
func.func @batched_01(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<2x4x5xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_rhs = true} : tensor<2x3x5xf32>, tensor<2x4x5xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- shared_10.mlir
func.func @shared_10(%a: tensor<2x5x3xf32> {ptc.param = "a"}, %b: tensor<5x4xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_lhs = true} : tensor<2x5x3xf32>, tensor<5x4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched_10.mlir
func.func @batched_10(%a: tensor<2x5x3xf32> {ptc.param = "a"}, %b: tensor<2x5x4xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_lhs = true} : tensor<2x5x3xf32>, tensor<2x5x4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- shared_11.mlir
func.func @shared_11(%a: tensor<2x5x3xf32> {ptc.param = "a"}, %b: tensor<4x5xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_lhs = true, transpose_rhs = true} : tensor<2x5x3xf32>, tensor<4x5xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched_11.mlir
func.func @batched_11(%a: tensor<2x5x3xf32> {ptc.param = "a"}, %b: tensor<2x4x5xf32> {ptc.param = "b"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_lhs = true, transpose_rhs = true} : tensor<2x5x3xf32>, tensor<2x4x5xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- bias.mlir
func.func @bias(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<4x5xf32> {ptc.param = "b"}, %c: tensor<4xf32> {ptc.param = "c"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b, %c {transpose_rhs = true} : tensor<2x3x5xf32>, tensor<4x5xf32>, tensor<4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %y, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- bias_add.mlir
func.func @bias_add(%a: tensor<2x3x5xf32> {ptc.param = "a"}, %b: tensor<4x5xf32> {ptc.param = "b"}, %c: tensor<4xf32> {ptc.param = "c"}, %r: tensor<2x3x4xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.matmul %a, %b {transpose_rhs = true} : tensor<2x3x5xf32>, tensor<4x5xf32> -> tensor<2x3x4xf32>
  %z = ptc.add %y, %c : tensor<2x3x4xf32>, tensor<4xf32> -> tensor<2x3x4xf32>
  %weighted = ptc.mul %z, %r : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
