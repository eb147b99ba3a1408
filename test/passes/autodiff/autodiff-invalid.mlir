// RUN: ptc-opt %s -split-input-file --ptc-autodiff -verify-diagnostics

// The function must return exactly one scalar loss.
// expected-error @+1 {{'func.func' op ptc-autodiff expects the function to return one scalar float loss, got 2 results}}
func.func @two_results(%w: tensor<4xf32> {ptc.param = "w"}) -> (tensor<4xf32>, tensor<4xf32>) {
  return %w, %w : tensor<4xf32>, tensor<4xf32>
}

// -----

// An op without a VJP rule on the path from a parameter to the loss.
func.func @no_rule(%w: tensor<4xf32> {ptc.param = "w"}) -> tensor<f32> {
  // expected-error @+1 {{'arith.addf' op has no reverse-mode rule, but the loss depends on it through a parameter}}
  %0 = arith.addf %w, %w : tensor<4xf32>
  %1 = ptc.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}
