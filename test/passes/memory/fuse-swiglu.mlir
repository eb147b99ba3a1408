// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fuse-swiglu))" | FileCheck %s

// Training: the forward silu(gate) * up becomes ptc.swiglu, and the backward's
// g * up, silu_grad(gate, g * up) and g * silu(gate) one ptc.swiglu_grad; the
// products may take their operands in either order; discardable attributes
// carry over; silu(gate) is no longer computed.
// CHECK-LABEL: func.func @train
// CHECK-NOT: ptc.silu
// CHECK: %[[H:.+]] = ptc.swiglu %arg0, %arg1 {ptc.stage = 1 : i64} : tensor<2x8x6xbf16>
// CHECK: %[[DA:.+]], %[[DB:.+]] = ptc.swiglu_grad %arg0, %arg1, %arg2 {ptc.backward, ptc.stage = 1 : i64} : tensor<2x8x6xbf16>
// CHECK-NOT: ptc.mul
// CHECK-NOT: ptc.silu_grad
// CHECK: return %[[H]], %[[DA]], %[[DB]]
func.func @train(%a: tensor<2x8x6xbf16>, %b: tensor<2x8x6xbf16>, %g: tensor<2x8x6xbf16>) -> (tensor<2x8x6xbf16>, tensor<2x8x6xbf16>, tensor<2x8x6xbf16>) {
  %s = ptc.silu %a {ptc.stage = 1 : i64} : tensor<2x8x6xbf16>
  %h = ptc.mul %b, %s {ptc.stage = 1 : i64} : tensor<2x8x6xbf16>, tensor<2x8x6xbf16> -> tensor<2x8x6xbf16>
  %db = ptc.mul %s, %g {ptc.backward, ptc.stage = 1 : i64} : tensor<2x8x6xbf16>, tensor<2x8x6xbf16> -> tensor<2x8x6xbf16>
  %t = ptc.mul %g, %b {ptc.backward, ptc.stage = 1 : i64} : tensor<2x8x6xbf16>, tensor<2x8x6xbf16> -> tensor<2x8x6xbf16>
  %da = ptc.silu_grad %a, %t {ptc.backward, ptc.stage = 1 : i64} : tensor<2x8x6xbf16>
  return %h, %da, %db : tensor<2x8x6xbf16>, tensor<2x8x6xbf16>, tensor<2x8x6xbf16>
}

// -----

// Inference: the forward alone.
// CHECK-LABEL: func.func @forward
// CHECK-NEXT: %[[H:.+]] = ptc.swiglu %arg0, %arg1 : tensor<4x6xf32>
// CHECK-NEXT: return %[[H]]
func.func @forward(%a: tensor<4x6xf32>, %b: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %s = ptc.silu %a : tensor<4x6xf32>
  %h = ptc.mul %s, %b : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  return %h : tensor<4x6xf32>
}

// -----

// Not fused, where silu(gate) would still be needed or the ops do not form a
// SwiGLU: the activation has another user; the product broadcasts a vector;
// the two forward ops are in different pipeline stages; the backward's
// g * up feeds something besides the gate's silu_grad.
// CHECK-LABEL: func.func @kept
// CHECK-NOT: ptc.swiglu
// CHECK-COUNT-5: ptc.silu %
// CHECK-NOT: ptc.swiglu
func.func @kept(%a: tensor<4x6xf32>, %b: tensor<4x6xf32>, %v: tensor<6xf32>, %g: tensor<4x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>) {
  %s0 = ptc.silu %a : tensor<4x6xf32>
  %h0 = ptc.mul %s0, %b : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %s1 = ptc.silu %b : tensor<4x6xf32>
  %h1 = ptc.mul %s1, %v : tensor<4x6xf32>, tensor<6xf32> -> tensor<4x6xf32>
  %s2 = ptc.silu %g {ptc.stage = 0 : i64} : tensor<4x6xf32>
  %h2 = ptc.mul %s2, %b {ptc.stage = 1 : i64} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %s3 = ptc.silu %v : tensor<6xf32>
  %s4 = ptc.silu %b : tensor<4x6xf32>
  %h4 = ptc.mul %s4, %a : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %db = ptc.mul %g, %s4 {ptc.backward} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %t = ptc.mul %g, %a {ptc.backward} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %da = ptc.silu_grad %b, %t {ptc.backward} : tensor<4x6xf32>
  return %s0, %h0, %h1, %h2, %h4, %db, %da, %t : tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>
}
