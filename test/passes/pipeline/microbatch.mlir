// RUN: ptc-opt %s --split-input-file --verify-diagnostics --pass-pipeline="builtin.module(func.func(ptc-microbatch{count=2}))" | FileCheck %s

// The batch dimension of everything that depends on the inputs is halved,
// through broadcasts, matmuls, reshapes and transposes; parameters keep
// their shapes; the loss (a mean) is scaled by 1/2.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %arg0: tensor<8x4xf32> {ptc.param = "w"}
// CHECK-SAME: %arg1: tensor<2x3x4xf32> {ptc.input = "x"}
// CHECK-SAME: %arg2: tensor<2x3xi32> {ptc.input = "y"}
// CHECK-SAME: ptc.microbatches = 2 : i64
// CHECK: ptc.matmul %arg1, %arg0 {transpose_rhs = true} : tensor<2x3x4xf32>, tensor<8x4xf32> -> tensor<2x3x8xf32>
// CHECK: ptc.reshape %{{.*}} : tensor<2x3x8xf32> -> tensor<6x8xf32>
// CHECK: ptc.reshape %{{.*}} : tensor<6x8xf32> -> tensor<2x3x8xf32>
// CHECK: ptc.transpose %{{.*}} permutation = [1, 0, 2] : tensor<2x3x8xf32> -> tensor<3x2x8xf32>
// CHECK: ptc.transpose %{{.*}} permutation = [1, 0, 2] : tensor<3x2x8xf32> -> tensor<2x3x8xf32>
// CHECK: %[[L:.+]] = ptc.cross_entropy %{{.*}}, %arg2 : tensor<2x3x8xf32>, tensor<2x3xi32> -> tensor<f32>
// CHECK: %[[S:.+]] = ptc.scale %[[L]] by 5.000000e-01 : tensor<f32>
// CHECK: return %[[S]]
func.func @mlp(%w: tensor<8x4xf32> {ptc.param = "w"}, %x: tensor<4x3x4xf32> {ptc.input = "x"},
               %y: tensor<4x3xi32> {ptc.input = "y"}) -> (tensor<f32> {ptc.loss}) {
  %h = ptc.matmul %x, %w {transpose_rhs = true} : tensor<4x3x4xf32>, tensor<8x4xf32> -> tensor<4x3x8xf32>
  %f = ptc.reshape %h : tensor<4x3x8xf32> -> tensor<12x8xf32>
  %g = ptc.reshape %f : tensor<12x8xf32> -> tensor<4x3x8xf32>
  %t = ptc.transpose %g permutation = [1, 0, 2] : tensor<4x3x8xf32> -> tensor<3x4x8xf32>
  %u = ptc.transpose %t permutation = [1, 0, 2] : tensor<3x4x8xf32> -> tensor<4x3x8xf32>
  %l = ptc.cross_entropy %u, %y : tensor<4x3x8xf32>, tensor<4x3xi32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @odd(%x: tensor<3x4xf32> {ptc.input = "x"}) -> tensor<f32> {
  // expected-error@-1 {{input 'x' of type 'tensor<3x4xf32>': its batch of 3 rows does not split into 2 micro-batches}}
  %s = ptc.reduce_sum %x axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

func.func @contract(%x: tensor<4x4xf32> {ptc.input = "x"}) -> tensor<4x4xf32> {
  // expected-error@+1 {{'ptc.matmul' op cannot be split into micro-batches: it contracts over the batch dimension}}
  %g = ptc.matmul %x, %x {transpose_lhs = true} : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %g : tensor<4x4xf32>
}

// -----

func.func @max(%x: tensor<4x4xf32> {ptc.input = "x"}) -> tensor<4xf32> {
  // expected-error@+1 {{'ptc.reduce_max' op cannot be split into micro-batches: a maximum over the batch is not a sum of micro-batch maxima}}
  %m = ptc.reduce_max %x axes = [0] : tensor<4x4xf32> -> tensor<4xf32>
  return %m : tensor<4xf32>
}

// -----

func.func @perexample(%x: tensor<4x4xf32> {ptc.input = "x"}) -> tensor<4x4xf32> {
  %y = ptc.gelu %x : tensor<4x4xf32>
  // expected-error@+1 {{'func.return' op returns per-example result #0, which cannot be split into micro-batches}}
  return %y : tensor<4x4xf32>
}

// -----

// Dropout places micro-batch rows by their first dimension: the batch must be it.
func.func @dropout_batch_not_first(%w: tensor<4x6xf32> {ptc.param = "w"}, %x: tensor<6x4xf32> {ptc.input = "x"}) -> tensor<f32> {
  %t = ptc.transpose %x permutation = [1, 0] : tensor<6x4xf32> -> tensor<4x6xf32>
  // expected-error@+1 {{'ptc.dropout' op cannot be split into micro-batches: its input's batch dimension is not its first}}
  %d = ptc.dropout %t {p = 0.5 : f64, stream = 0 : i64} : tensor<4x6xf32>
  %m = ptc.mul %d, %w : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %s = ptc.reduce_mean %m axes = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %s : tensor<f32>
}
