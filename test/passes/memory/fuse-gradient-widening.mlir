// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fuse-gradient-widening))" | FileCheck %s

// Mixed precision's f32 copies of bf16 / f16 gradients go: AdamW and SGD
// read the low-precision gradients, the updates' attributes unchanged.
// CHECK-LABEL: func.func @widened
// CHECK-NOT: ptc.convert
// CHECK: ptc.adamw_update %arg0, %arg1, %arg2, %arg3, %arg4 {{{.*}}ptc.stage = 1 : i64{{.*}}} : tensor<6x4xf32> grad(tensor<6x4xbf16>), tensor<f32>
// CHECK: ptc.sgd_update %arg5, %arg6, %arg7 {{{.*}}} : tensor<6xf32> grad(tensor<6xf16>)
func.func @widened(%p: tensor<6x4xf32>, %g: tensor<6x4xbf16>, %m: tensor<6x4xf32>, %v: tensor<6x4xf32>, %t: tensor<f32>,
                   %q: tensor<6xf32>, %h: tensor<6xf16>, %b: tensor<6xf32>) -> (tensor<6x4xf32>, tensor<6xf32>) {
  %g32 = ptc.convert %g {ptc.backward} : tensor<6x4xbf16> -> tensor<6x4xf32>
  %p2, %m2, %v2 = ptc.adamw_update %p, %g32, %m, %v, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, ptc.stage = 1 : i64} : tensor<6x4xf32>, tensor<f32>
  %h32 = ptc.convert %h {ptc.backward} : tensor<6xf16> -> tensor<6xf32>
  %q2, %b2 = ptc.sgd_update %q, %h32, %b {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<6xf32>
  return %p2, %q2 : tensor<6x4xf32>, tensor<6xf32>
}

// -----

// Kept: the f32 gradient feeds something else too (clipping reads every
// gradient); the update runs on the host (offloaded: its tensors stay f32);
// the gradient was computed in f32 (no conversion to undo).
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-2: ptc.convert
// CHECK-NOT: grad(
func.func @kept(%p: tensor<4xf32>, %g: tensor<4xbf16>, %m: tensor<4xf32>, %v: tensor<4xf32>, %t: tensor<f32>,
                %q: tensor<4xf32>, %h: tensor<4xbf16>, %f: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<4xf32>) {
  %g32 = ptc.convert %g : tensor<4xbf16> -> tensor<4xf32>
  %p2, %m2, %v2 = ptc.adamw_update %p, %g32, %m, %v, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64} : tensor<4xf32>, tensor<f32>
  %c, %n = ptc.clip_grad_norm %g32 {max_norm = 1.0 : f64} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>)
  %h32 = ptc.convert %h : tensor<4xbf16> -> tensor<4xf32>
  %q2, %mq, %vq = ptc.adamw_update %q, %h32, %m, %v, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, ptc.on_host} : tensor<4xf32>, tensor<f32>
  %r2, %b2 = ptc.sgd_update %q, %f, %m {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>
  return %p2, %q2, %n, %r2 : tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<4xf32>
}
