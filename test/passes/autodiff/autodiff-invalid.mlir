// RUN: ptc-opt %s -split-input-file --ptc-autodiff -verify-diagnostics

// The function must return exactly one scalar loss.
// expected-error @+1 {{'func.func' op ptc-autodiff expects the function to return one scalar float loss (then only 'ptc.metric' results), got 2 results}}
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

// -----

// A metric must be a float tensor.
// expected-error @+1 {{'ptc.metric' on result #1 must name a float tensor result}}
func.func @metric_type(%w: tensor<4xf32> {ptc.param = "w"}, %i: tensor<4xi32> {ptc.input = "i"}) -> (tensor<f32>, tensor<4xi32> {ptc.metric = "ids"}) {
  %0 = ptc.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0, %i : tensor<f32>, tensor<4xi32>
}

// -----

// Two dropouts with one stream would draw the same masks.
func.func @dropout_streams(%w: tensor<4xf32> {ptc.param = "w"}) -> tensor<f32> {
  // expected-note @+1 {{the other dropout}}
  %0 = ptc.dropout %w {p = 0.5 : f64, stream = 3 : i64} : tensor<4xf32>
  // expected-error @+1 {{'ptc.dropout' op has stream 3, which another dropout has: they would draw the same masks}}
  %1 = ptc.dropout %0 {p = 0.5 : f64, stream = 3 : i64} : tensor<4xf32>
  %2 = ptc.reduce_sum %1 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}
