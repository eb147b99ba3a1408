// Round-trip of the ops that ptc-autodiff and ptc-optimizer emit.
// RUN: ptc-opt %s | ptc-opt | FileCheck %s
// RUN: ptc-opt %s --mlir-print-op-generic | ptc-opt | FileCheck %s

// CHECK-LABEL: func.func @layout_grads
func.func @layout_grads(%x: tensor<64x1xf32>, %g: tensor<8x64x128xf32>) -> (tensor<8x64x128xf32>, tensor<8x64x384xf32>) {
  // CHECK: ptc.broadcast %{{.*}} : tensor<64x1xf32> -> tensor<8x64x128xf32>
  %0 = ptc.broadcast %x : tensor<64x1xf32> -> tensor<8x64x128xf32>
  // CHECK: ptc.pad %{{.*}} offsets = [0, 0, 128] : tensor<8x64x128xf32> -> tensor<8x64x384xf32>
  %1 = ptc.pad %g offsets = [0, 0, 128] : tensor<8x64x128xf32> -> tensor<8x64x384xf32>
  return %0, %1 : tensor<8x64x128xf32>, tensor<8x64x384xf32>
}

// CHECK-LABEL: func.func @block_grads
func.func @block_grads(%x: tensor<8x64x128xf32>, %w: tensor<128xf32>, %q: tensor<8x4x64x32xf32>, %y: tensor<512x8xf32>)
    -> (tensor<8x64x128xf32>, tensor<128xf32>, tensor<8x4x64x32xf32>, tensor<512x8xf32>) {
  // CHECK: ptc.gelu_grad %{{.*}}, %{{.*}} : tensor<8x64x128xf32>
  %0 = ptc.gelu_grad %x, %x : tensor<8x64x128xf32>
  // CHECK: ptc.relu_grad %{{.*}}, %{{.*}} : tensor<8x64x128xf32>
  %1 = ptc.relu_grad %0, %x : tensor<8x64x128xf32>
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = ptc.layer_norm_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x64x128xf32>, tensor<128xf32>
  %dx, %dw, %db = ptc.layer_norm_grad %1, %w, %x : tensor<8x64x128xf32>, tensor<128xf32>
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = ptc.causal_attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f64} : tensor<8x4x64x32xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %q, %q, %q {scale = 0.25 : f64} : tensor<8x4x64x32xf32>
  // CHECK: ptc.softmax_grad %{{.*}}, %{{.*}} {axis = 0 : i64} : tensor<512x8xf32>
  %2 = ptc.softmax_grad %y, %y {axis = 0 : i64} : tensor<512x8xf32>
  return %dx, %dw, %dq, %2 : tensor<8x64x128xf32>, tensor<128xf32>, tensor<8x4x64x32xf32>, tensor<512x8xf32>
}

// CHECK-LABEL: func.func @lookup_grads
func.func @lookup_grads(%ids: tensor<8x64xi32>, %g: tensor<8x64x128xf32>, %l: tensor<8x64x256xf32>, %s: tensor<f32>,
                        %x: tensor<8x64xf32>, %gx: tensor<8xf32>) -> (tensor<256x128xf32>, tensor<8x64x256xf32>, tensor<8x64xf32>) {
  // CHECK: ptc.embedding_grad %{{.*}}, %{{.*}} : tensor<8x64xi32>, tensor<8x64x128xf32> -> tensor<256x128xf32>
  %0 = ptc.embedding_grad %ids, %g : tensor<8x64xi32>, tensor<8x64x128xf32> -> tensor<256x128xf32>
  // CHECK: ptc.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x64x256xf32>, tensor<8x64xi32>, tensor<f32>
  %1 = ptc.cross_entropy_grad %l, %ids, %s : tensor<8x64x256xf32>, tensor<8x64xi32>, tensor<f32>
  // CHECK: ptc.reduce_max_grad %{{.*}}, %{{.*}} axes = [1] : tensor<8x64xf32>, tensor<8xf32>
  %2 = ptc.reduce_max_grad %x, %gx axes = [1] : tensor<8x64xf32>, tensor<8xf32>
  return %0, %1, %2 : tensor<256x128xf32>, tensor<8x64x256xf32>, tensor<8x64xf32>
}

// CHECK-LABEL: func.func @moe_grads
func.func @moe_grads(%l: tensor<512x8xf32>, %e: tensor<512x2xi32>, %w: tensor<512x2xf32>, %buf: tensor<8x160x128xf32>,
                     %g: tensor<512x128xf32>) -> (tensor<512x8xf32>, tensor<512x128xf32>, tensor<8x160x128xf32>, tensor<512x2xf32>) {
  // CHECK: ptc.top_k_gate_grad %{{.*}}, %{{.*}}, %{{.*}} {normalize = false} : tensor<512x8xf32>, tensor<512x2xi32>, tensor<512x2xf32>
  %0 = ptc.top_k_gate_grad %l, %e, %w {normalize = false} : tensor<512x8xf32>, tensor<512x2xi32>, tensor<512x2xf32>
  // CHECK: ptc.moe_dispatch_grad %{{.*}}, %{{.*}} : tensor<8x160x128xf32>, tensor<512x2xi32> -> tensor<512x128xf32>
  %1 = ptc.moe_dispatch_grad %buf, %e : tensor<8x160x128xf32>, tensor<512x2xi32> -> tensor<512x128xf32>
  // CHECK: %{{.*}}, %{{.*}} = ptc.moe_combine_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32>, tensor<512x128xf32>
  %do, %dw = ptc.moe_combine_grad %buf, %w, %e, %g : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32>, tensor<512x128xf32>
  return %0, %1, %do, %dw : tensor<512x8xf32>, tensor<512x128xf32>, tensor<8x160x128xf32>, tensor<512x2xf32>
}

// CHECK-LABEL: func.func @optimizer
func.func @optimizer(%p: tensor<384x128xf32>, %t: tensor<f32>, %b: tensor<384xf32>, %g16: tensor<384x128xbf16>, %b16: tensor<384xf16>) -> (tensor<384x128xf32>, tensor<384xf32>, tensor<f32>) {
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = ptc.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-01 : f64} : tensor<384x128xf32>, tensor<f32>
  %p2, %m2, %v2 = ptc.adamw_update %p, %p, %p, %p, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64} : tensor<384x128xf32>, tensor<f32>
  // CHECK: %{{.*}}, %{{.*}} = ptc.sgd_update %{{.*}}, %{{.*}}, %{{.*}} {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64, weight_decay = 0.000000e+00 : f64} : tensor<384xf32>
  %b2, %mb = ptc.sgd_update %b, %b, %b {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<384xf32>
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} = ptc.adamw_update {{.*}} : tensor<384x128xf32>, tensor<f32> working_copy(tensor<384x128xbf16>)
  %pw, %mw, %vw, %ww = ptc.adamw_update %p, %p, %p, %p, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64} : tensor<384x128xf32>, tensor<f32> working_copy(tensor<384x128xbf16>)
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = ptc.sgd_update {{.*}} : tensor<384xf32> working_copy(tensor<384xf16>)
  %bw, %mbw, %wb = ptc.sgd_update %b, %b, %b {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<384xf32> working_copy(tensor<384xf16>)
  // A bf16 gradient for an f32 parameter (ptc-fuse-gradient-widening).
  // CHECK: ptc.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {{{.*}}} : tensor<384x128xf32> grad(tensor<384x128xbf16>), tensor<f32>
  %q2, %n2, %w2 = ptc.adamw_update %p, %g16, %p, %p, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64} : tensor<384x128xf32> grad(tensor<384x128xbf16>), tensor<f32>
  // CHECK: ptc.sgd_update %{{.*}}, %{{.*}}, %{{.*}} {{{.*}}} : tensor<384xf32> grad(tensor<384xf16>)
  %b3, %mb3 = ptc.sgd_update %b, %b16, %b {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<384xf32> grad(tensor<384xf16>)
  // CHECK: %{{.*}}:2, %{{.*}} = ptc.clip_grad_norm %{{.*}}, %{{.*}} {max_norm = 1.000000e+00 : f64} : (tensor<384x128xf32>, tensor<384xf32>) -> (tensor<384x128xf32>, tensor<384xf32>, tensor<f32>)
  %c:2, %n = ptc.clip_grad_norm %p2, %b2 {max_norm = 1.0 : f64} : (tensor<384x128xf32>, tensor<384xf32>) -> (tensor<384x128xf32>, tensor<384xf32>, tensor<f32>)
  return %c#0, %c#1, %n : tensor<384x128xf32>, tensor<384xf32>, tensor<f32>
}

// Argument and result roles of a compiled training step.
// CHECK-LABEL: func.func @roles
// CHECK-SAME: {ptc.init = "normal:0.02", ptc.param = "w"}
// CHECK-SAME: {ptc.state = "w.exp_avg"}
// CHECK-SAME: -> (tensor<f32> {ptc.loss}, tensor<f32> {ptc.grad_norm}, tensor<4xf32> {ptc.grad = "w"}, tensor<4xf32> {ptc.update = "w.exp_avg"})
func.func @roles(%w: tensor<4xf32> {ptc.param = "w", ptc.init = "normal:0.02"}, %m: tensor<4xf32> {ptc.state = "w.exp_avg"}, %s: tensor<f32>)
    -> (tensor<f32> {ptc.loss}, tensor<f32> {ptc.grad_norm}, tensor<4xf32> {ptc.grad = "w"}, tensor<4xf32> {ptc.update = "w.exp_avg"}) {
  return %s, %s, %w, %m : tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>
}
