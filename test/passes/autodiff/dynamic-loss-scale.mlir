// RUN: ptc-opt %s --pass-pipeline="builtin.module(func.func(ptc-autodiff,ptc-optimizer{optimizer=adamw dynamic-loss-scale=true loss-scale-init=1024.0 loss-scale-window=8}))" | FileCheck %s

// Dynamic loss scaling: the backward pass starts from the current scale
// (1024 * 2^exponent, state); gradients are unscaled and checked; the update
// is skipped when any is not finite, the step counter only counts updates, and
// the scale halves after an overflow or doubles after 8 good steps.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: {ptc.state = "loss_scale.exponent"}
// CHECK-SAME: {ptc.state = "loss_scale.good_steps"}
// CHECK-SAME: -> (tensor<f32> {ptc.loss}, tensor<f32> {ptc.skipped}, tensor<f32> {ptc.loss_scale}
// CHECK: %[[SCALE:.+]] = ptc.loss_scale %{{.*}} {initial = 1.024000e+03 : f64} : tensor<f32>
// CHECK: ptc.cross_entropy_grad %{{.*}}, %{{.*}}, %[[SCALE]]
// CHECK: %[[U:.+]]:2, %[[INF:.+]] = ptc.unscale_grads %{{.*}} by %[[SCALE]]
// CHECK: %[[NOTINF:.+]] = ptc.sub %{{.*}}, %[[INF]]
// CHECK: %[[STEP:.+]] = ptc.add %{{.*}}, %[[NOTINF]]
// CHECK: ptc.adamw_update %arg0, %[[U]]#0, %{{.*}}, %{{.*}}, %[[STEP]] skip(%[[INF]] : tensor<f32>)
// CHECK: ptc.loss_scale_update %{{.*}}, %{{.*}}, %[[INF]] {window = 8 : i64} : tensor<f32>
func.func @mlp(%w: tensor<8x4xf32> {ptc.param = "w"}, %b: tensor<8xf32> {ptc.param = "b"},
               %x: tensor<2x4xf32> {ptc.input = "x"}, %y: tensor<2xi32> {ptc.input = "y"})
    -> (tensor<f32> {ptc.loss}) {
  %h = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x4xf32>, tensor<8x4xf32> -> tensor<2x8xf32>
  %o = ptc.add %h, %b : tensor<2x8xf32>, tensor<8xf32> -> tensor<2x8xf32>
  %l = ptc.cross_entropy %o, %y : tensor<2x8xf32>, tensor<2xi32> -> tensor<f32>
  return %l : tensor<f32>
}
