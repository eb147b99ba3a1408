// RUN: ptc-opt %s -split-input-file --ptc-optimizer -verify-diagnostics
// RUN: not ptc-opt %s -split-input-file --ptc-optimizer="optimizer=lion" 2>&1 | FileCheck %s

// An unknown optimizer name.
// CHECK: error: unknown optimizer 'lion' (expected adamw, sgd, adafactor or muon)

// Results after the loss must be gradients (ptc-optimizer runs right after ptc-autodiff).
// expected-error @+1 {{result #1 is not a 'ptc.grad' result; run ptc-optimizer directly after ptc-autodiff}}
func.func @not_grad(%w: tensor<4xf32> {ptc.param = "w"}) -> (tensor<f32> {ptc.loss}, tensor<4xf32>) {
  %0 = ptc.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0, %w : tensor<f32>, tensor<4xf32>
}
