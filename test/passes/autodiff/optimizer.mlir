// RUN: ptc-opt %s -split-input-file --ptc-autodiff --ptc-optimizer="optimizer=adamw lr=0.5 beta1=0.8 beta2=0.9 eps=1e-6 weight-decay=0.25 max-grad-norm=2.0" | FileCheck %s --check-prefix=ADAMW
// RUN: ptc-opt %s -split-input-file --ptc-autodiff --ptc-optimizer="optimizer=sgd lr=0.25 momentum=0.5 weight-decay=0.5" | FileCheck %s --check-prefix=SGD

// AdamW: state arguments after the parameters, clipping, a step counter,
// weight decay on the matrix only, every new value returned as an update.
// ADAMW-LABEL: func.func @step
// ADAMW-SAME: %[[W:.+]]: tensor<3x4xf32> {ptc.param = "w"}, %[[B:.+]]: tensor<3xf32> {ptc.param = "b"}
// ADAMW-SAME: %[[T:.+]]: tensor<f32> {ptc.state = "optimizer.step"}
// ADAMW-SAME: %[[WM:.+]]: tensor<3x4xf32> {ptc.state = "w.exp_avg", ptc.state_of = {param = "w"}}, %[[WV:.+]]: tensor<3x4xf32> {ptc.state = "w.exp_avg_sq", ptc.state_of = {param = "w"}}
// ADAMW-SAME: {ptc.state = "b.exp_avg", ptc.state_of = {param = "b"}}
// ADAMW-SAME: {ptc.state = "b.exp_avg_sq", ptc.state_of = {param = "b"}}
// ADAMW-SAME: {ptc.input = "x"}
// ADAMW-SAME: -> (tensor<f32> {ptc.loss}, tensor<f32> {ptc.grad_norm}, tensor<f32> {ptc.skipped}, tensor<3x4xf32> {ptc.update = "w"}, tensor<3x4xf32> {ptc.update = "w.exp_avg"}, tensor<3x4xf32> {ptc.update = "w.exp_avg_sq"}, tensor<3xf32> {ptc.update = "b"}, tensor<3xf32> {ptc.update = "b.exp_avg"}, tensor<3xf32> {ptc.update = "b.exp_avg_sq"}, tensor<f32> {ptc.update = "optimizer.step"})
// A step whose gradients are not all finite is skipped (skip-nonfinite): one
// flag, read by every update and returned as ptc.skipped.
// ADAMW: %[[BAD:.+]] = ptc.any_nonfinite %{{.*}}, %{{.*}} : tensor<3x4xf32>, tensor<3xf32> -> tensor<f32>
// ADAMW: %[[C:.+]]:2, %[[NORM:.+]] = ptc.clip_grad_norm %{{.*}}, %{{.*}} {max_norm = 2.000000e+00 : f64}
// ADAMW: %[[T1:.+]] = ptc.add %[[T]], %{{.*}} : tensor<f32>, tensor<f32> -> tensor<f32>
// ADAMW: ptc.adamw_update %[[W]], %[[C]]#0, %[[WM]], %[[WV]], %[[T1]] skip(%[[BAD]] : tensor<f32>) {beta1 = 8.000000e-01 : f64, beta2 = 9.000000e-01 : f64, eps = 9.9999999999999995E-7 : f64, lr = 5.000000e-01 : f64, weight_decay = 2.500000e-01 : f64}
// ADAMW: ptc.adamw_update %[[B]], %[[C]]#1, {{.*}} weight_decay = 0.000000e+00 : f64}
// ADAMW: return %{{.*}}, %[[NORM]], %[[BAD]],

// With SGD there is one momentum buffer per parameter, no step counter, no clipping.
// SGD-LABEL: func.func @step
// SGD-SAME: {ptc.state = "w.momentum_buffer", ptc.state_of = {param = "w"}}
// SGD-SAME: {ptc.state = "b.momentum_buffer", ptc.state_of = {param = "b"}}
// SGD-NOT: optimizer.step
// SGD-NOT: ptc.clip_grad_norm
// SGD: ptc.sgd_update %arg0, %{{.*}}, %{{.*}} {lr = 2.500000e-01 : f64, momentum = 5.000000e-01 : f64, weight_decay = 5.000000e-01 : f64} : tensor<3x4xf32>
// SGD: ptc.sgd_update %arg1, %{{.*}}, %{{.*}} {lr = 2.500000e-01 : f64, momentum = 5.000000e-01 : f64, weight_decay = 0.000000e+00 : f64} : tensor<3xf32>
func.func @step(%w: tensor<3x4xf32> {ptc.param = "w"}, %b: tensor<3xf32> {ptc.param = "b"},
                %x: tensor<2x4xf32> {ptc.input = "x"}) -> tensor<f32> {
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
  %1 = ptc.add %0, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %2 = ptc.reduce_mean %1 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  return %2 : tensor<f32>
}
