// Finite-difference checks of the VJP rules of gelu, gelu_tanh, tanh, relu (kinks skipped), silu, exp, rsqrt and log
// (on exp's positive output), softmax on the last and a leading axis.
// Each case: ptc-compile with optimizer=none, then ptc-gradcheck compares every
// parameter gradient of sum(op(...) * r) (r random) with central differences.
// RUN: rm -rf %t && split-file %s %t
// RUN: ptc-opt %t/gelu.mlir --ptc-compile="plan=%t/gelu.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/gelu.plan | FileCheck %s
// RUN: ptc-opt %t/gelu_tanh.mlir --ptc-compile="plan=%t/gelu_tanh.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/gelu_tanh.plan | FileCheck %s
// RUN: ptc-opt %t/tanh.mlir --ptc-compile="plan=%t/tanh.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/tanh.plan | FileCheck %s
// RUN: ptc-opt %t/relu.mlir --ptc-compile="plan=%t/relu.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/relu.plan | FileCheck %s
// RUN: ptc-opt %t/silu.mlir --ptc-compile="plan=%t/silu.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/silu.plan | FileCheck %s
// SwiGLU written as ptc.swiglu (its VJP: ptc.swiglu_grad), and as silu(a) * b,
// which ptc-fuse-swiglu turns into ptc.swiglu and ptc.swiglu_grad after autodiff.
// RUN: ptc-opt %t/swiglu.mlir --ptc-compile="plan=%t/swiglu.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/swiglu.plan | FileCheck %s
// RUN: ptc-opt %t/silu_mul.mlir --ptc-compile="plan=%t/silu_mul.plan optimizer=none" -o - | FileCheck %s --check-prefix=FUSED
// RUN: ptc-gradcheck %t/silu_mul.plan | FileCheck %s
// RUN: ptc-opt %t/exp_rsqrt_log.mlir --ptc-compile="plan=%t/erl.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/erl.plan | FileCheck %s
// RUN: ptc-opt %t/softmax_last.mlir --ptc-compile="plan=%t/softmax_last.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/softmax_last.plan | FileCheck %s
// RUN: ptc-opt %t/softmax_axis0.mlir --ptc-compile="plan=%t/softmax_axis0.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t/softmax_axis0.plan | FileCheck %s
// CHECK: gradcheck: passed

//--- gelu.mlir
func.func @gelu(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.gelu %a : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gelu_tanh.mlir
func.func @gelu_tanh(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.gelu_tanh %a : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- tanh.mlir
func.func @tanh(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.tanh %a : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

// FUSED: ptc.swiglu %
// FUSED: ptc.swiglu_grad %
// FUSED-NOT: ptc.silu

//--- swiglu.mlir
func.func @swiglu(%a: tensor<4x6xf32> {ptc.param = "a"}, %b: tensor<4x6xf32> {ptc.param = "b"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.swiglu %a, %b : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- silu_mul.mlir
func.func @silu_mul(%a: tensor<4x6xf32> {ptc.param = "a"}, %b: tensor<4x6xf32> {ptc.param = "b"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %s = ptc.silu %a : tensor<4x6xf32>
  %y = ptc.mul %s, %b : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- silu.mlir
func.func @silu(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.silu %a : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- relu.mlir
func.func @relu(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.relu %a : tensor<4x6xf32>
  %weighted = ptc.mul %y, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax_last.mlir
func.func @softmax_last(%a: tensor<3x5xf32> {ptc.param = "a"}, %r: tensor<3x5xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.softmax %a : tensor<3x5xf32>
  %weighted = ptc.mul %y, %r : tensor<3x5xf32>, tensor<3x5xf32> -> tensor<3x5xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax_axis0.mlir
func.func @softmax_axis0(%a: tensor<3x4x2xf32> {ptc.param = "a"}, %r: tensor<3x4x2xf32> {ptc.input = "r"}) -> tensor<f32> {
  %y = ptc.softmax %a {axis = 0 : i64} : tensor<3x4x2xf32>
  %weighted = ptc.mul %y, %r : tensor<3x4x2xf32>, tensor<3x4x2xf32> -> tensor<3x4x2xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x4x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- exp_rsqrt_log.mlir
func.func @exp_rsqrt_log(%a: tensor<4x6xf32> {ptc.param = "a"}, %r: tensor<4x6xf32> {ptc.input = "r"}) -> tensor<f32> {
  %e = ptc.exp %a : tensor<4x6xf32>
  %y = ptc.rsqrt %e : tensor<4x6xf32>
  %z = ptc.log %e : tensor<4x6xf32>
  %s = ptc.add %y, %z : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %weighted = ptc.mul %s, %r : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %loss = ptc.reduce_sum %weighted axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
