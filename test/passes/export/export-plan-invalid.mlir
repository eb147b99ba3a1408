// RUN: ptc-opt %s -split-input-file --ptc-export-plan="output=%t.plan" -verify-diagnostics
// RUN: not ptc-opt %s -split-input-file --ptc-export-plan 2>&1 | FileCheck %s --check-prefix=NO-OUTPUT
// NO-OUTPUT: error: ptc-export-plan needs output=<plan file> (with ptc-compile: plan=<plan file>)

// Nothing to export.
// expected-error @+1 {{no function returns a 'ptc.loss' result (run ptc-autodiff first) or decode 'ptc.logits' (ptc-derive-decode)}}
module {
  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}

// -----

// The memory plan is missing.
module {
  // expected-error @+1 {{no memory plan; run ptc-plan-memory before ptc-export-plan}}
  func.func @f(%w: tensor<4xf32> {ptc.param = "w"}) -> (tensor<f32> {ptc.loss}) {
    %0 = ptc.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// Every argument needs a role.
module {
  // expected-error @+1 {{argument #1 has no role (ptc.param, ptc.state or ptc.input)}}
  func.func @f(%w: tensor<4xf32> {ptc.param = "w"}, %x: tensor<4xf32>) -> (tensor<f32> {ptc.loss})
      attributes {ptc.arena_bytes = 64 : i64, ptc.arena_bytes_unshared = 64 : i64} {
    %0 = ptc.reduce_sum %w axes = [0] {ptc.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// Reading a parameter after its in-place update would see the new value.
module {
  func.func @f(%w: tensor<4xf32> {ptc.param = "w"}, %m: tensor<4xf32> {ptc.state = "m"})
      -> (tensor<f32> {ptc.loss}, tensor<4xf32> {ptc.update = "w"}, tensor<4xf32> {ptc.update = "m"})
      attributes {ptc.arena_bytes = 64 : i64, ptc.arena_bytes_unshared = 64 : i64} {
    %p, %b = ptc.sgd_update %w, %w, %m {lr = 0.1 : f64, momentum = 0.0 : f64, weight_decay = 0.0 : f64, ptc.offsets = array<i64: -1, -1>} : tensor<4xf32>
    // expected-error @+1 {{reads '<block argument> of type 'tensor<4xf32>' at index: 0' after it was updated in place}}
    %0 = ptc.reduce_sum %w axes = [0] {ptc.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
    return %0, %p, %b : tensor<f32>, tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Ops outside the plan's instruction set.
module {
  func.func @f(%w: tensor<4xf32> {ptc.param = "w"}) -> (tensor<f32> {ptc.loss})
      attributes {ptc.arena_bytes = 128 : i64, ptc.arena_bytes_unshared = 128 : i64} {
    // expected-error @+1 {{'arith.addf' op has no plan instruction}}
    %a = arith.addf %w, %w {ptc.offsets = array<i64: 64>} : tensor<4xf32>
    %0 = ptc.reduce_sum %a axes = [0] {ptc.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}
