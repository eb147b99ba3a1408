// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-save-attention-stats))" | FileCheck %s

// The fused projection's attention: the forward returns its rows' log-sum-exp
// (f32 [batch, heads, seq]) and keeps its attributes (a pipeline stage); the
// gradient reads its result and those statistics.
// CHECK-LABEL: func.func @fused
// CHECK: %[[O:.+]], %[[LSE:.+]] = ptc.causal_attention_qkv %arg0 {ptc.stage = 1 : i64, scale = 2.500000e-01 : f64} : tensor<2x8x48xbf16> -> tensor<2x8x4x4xbf16> stats tensor<2x4x8xf32>
// CHECK: ptc.causal_attention_qkv_grad %arg0, %arg1 saved(%[[O]], %[[LSE]] : tensor<2x8x4x4xbf16>, tensor<2x4x8xf32>) {ptc.backward, scale = 2.500000e-01 : f64}
func.func @fused(%qkv: tensor<2x8x48xbf16>, %g: tensor<2x8x4x4xbf16>) -> (tensor<2x8x4x4xbf16>, tensor<2x8x48xbf16>) {
  %o = ptc.causal_attention_qkv %qkv {ptc.stage = 1 : i64, scale = 0.25 : f64} : tensor<2x8x48xbf16> -> tensor<2x8x4x4xbf16>
  %d = ptc.causal_attention_qkv_grad %qkv, %g {ptc.backward, scale = 0.25 : f64} : tensor<2x8x48xbf16>, tensor<2x8x4x4xbf16>
  return %o, %d : tensor<2x8x4x4xbf16>, tensor<2x8x48xbf16>
}

// -----

// Separate query, key and value (grouped-query, seq-major, with document
// positions): the statistics' heads are the query's, whatever the layout;
// the positions stay the gradient's last operand.
// CHECK-LABEL: func.func @separate
// CHECK: %[[O:.+]], %[[LSE:.+]] = ptc.causal_attention %arg0, %arg1, %arg2 positions(%arg4 : tensor<2x8xi32>) {seq_major = true} : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32> stats tensor<2x4x8xf32>
// CHECK: ptc.causal_attention_grad %arg0, %arg1, %arg2, %arg3 saved(%[[O]], %[[LSE]] : tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) positions(%arg4 : tensor<2x8xi32>) {seq_major = true}
func.func @separate(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x16xf32>, %g: tensor<2x8x4x16xf32>, %pos: tensor<2x8xi32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>) {
  %o = ptc.causal_attention %q, %k, %v positions(%pos : tensor<2x8xi32>) {seq_major = true} : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %k, %v, %g positions(%pos : tensor<2x8xi32>) {seq_major = true} : tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>
  return %o, %dq, %dk : tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>
}

// -----

// Under recomputation the gradient pairs with the nearest forward of its
// operands (the recomputed one); a forward of other operands, another scale
// or other positions, or one after the gradient, is left alone, and so is a
// gradient without its forward.
// CHECK-LABEL: func.func @pairs
// CHECK: %[[FIRST:.+]] = ptc.causal_attention_qkv %arg0 {scale = 2.500000e-01 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>{{$}}
// CHECK: ptc.causal_attention_qkv %arg0 {scale = 5.000000e-01 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>{{$}}
// CHECK: %[[O:.+]], %[[LSE:.+]] = ptc.causal_attention_qkv %arg0 {ptc.recomputed, scale = 2.500000e-01 : f64} {{.*}} stats tensor<2x4x8xf32>
// CHECK: ptc.causal_attention_qkv_grad %arg0, %arg2 saved(%[[O]], %[[LSE]] :
// CHECK: ptc.causal_attention_qkv_grad %arg1, %arg2 {scale = 2.500000e-01 : f64}
// CHECK: ptc.causal_attention_qkv %arg1 {scale = 2.500000e-01 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>{{$}}
func.func @pairs(%qkv: tensor<2x8x48xf32>, %other: tensor<2x8x48xf32>, %g: tensor<2x8x4x4xf32>) -> (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x48xf32>, tensor<2x8x48xf32>, tensor<2x8x4x4xf32>) {
  %o1 = ptc.causal_attention_qkv %qkv {scale = 0.25 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  %o2 = ptc.causal_attention_qkv %qkv {scale = 0.5 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  %o3 = ptc.causal_attention_qkv %qkv {ptc.recomputed, scale = 0.25 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  %d1 = ptc.causal_attention_qkv_grad %qkv, %g {scale = 0.25 : f64} : tensor<2x8x48xf32>, tensor<2x8x4x4xf32>
  %d2 = ptc.causal_attention_qkv_grad %other, %g {scale = 0.25 : f64} : tensor<2x8x48xf32>, tensor<2x8x4x4xf32>
  %o4 = ptc.causal_attention_qkv %other {scale = 0.25 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  return %o1, %o2, %o3, %d1, %d2, %o4 : tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x48xf32>, tensor<2x8x48xf32>, tensor<2x8x4x4xf32>
}

// -----

// A reshape of the result after the gradient is not what the gradient reads
// (it would not exist yet): the result itself; one before it is.
// CHECK-LABEL: func.func @reshape_after
// CHECK: %[[O:.+]], %[[LSE:.+]] = ptc.causal_attention_qkv %arg0
// CHECK: ptc.causal_attention_qkv_grad %arg0, %arg1 saved(%[[O]], %[[LSE]] : tensor<2x8x4x4xf32>, tensor<2x4x8xf32>)
// CHECK: ptc.reshape %[[O]]
func.func @reshape_after(%qkv: tensor<2x8x48xf32>, %g: tensor<2x8x4x4xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x48xf32>) {
  %o = ptc.causal_attention_qkv %qkv {scale = 0.25 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  %d = ptc.causal_attention_qkv_grad %qkv, %g {scale = 0.25 : f64} : tensor<2x8x48xf32>, tensor<2x8x4x4xf32>
  %r = ptc.reshape %o : tensor<2x8x4x4xf32> -> tensor<2x8x16xf32>
  return %r, %d : tensor<2x8x16xf32>, tensor<2x8x48xf32>
}

// -----

// Ring attention (context parallelism): the forward returns its rows'
// log-sum-exp over the ring, the gradient of the same blocks, axis, scale and
// positions reads them with the result; one of another scale is left alone.
// CHECK-LABEL: func.func @ring
// CHECK: %[[O:.+]], %[[LSE:.+]] = ptc.ring_attention %arg0, %arg1, %arg2 positions(%arg4 : tensor<2x8xi32>) {axes = ["cp"], scale = 2.500000e-01 : f64} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32> stats tensor<2x4x8xf32>
// CHECK: ptc.ring_attention_grad %arg0, %arg1, %arg2, %arg3 saved(%[[O]], %[[LSE]] : tensor<2x4x8x16xf32>, tensor<2x4x8xf32>) positions(%arg4 : tensor<2x8xi32>) {axes = ["cp"], scale = 2.500000e-01 : f64}
// CHECK: ptc.ring_attention_grad %arg0, %arg1, %arg2, %arg3 positions(%arg4 : tensor<2x8xi32>) {axes = ["cp"], scale = 5.000000e-01 : f64}
module attributes {ptc.mesh = {axes = ["cp"], shape = array<i64: 2>}} {
  func.func @ring(%q: tensor<2x4x8x16xf32>, %k: tensor<2x2x8x16xf32>, %v: tensor<2x2x8x16xf32>, %g: tensor<2x4x8x16xf32>, %pos: tensor<2x8xi32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) {
    %o = ptc.ring_attention %q, %k, %v positions(%pos : tensor<2x8xi32>) {axes = ["cp"], scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    %dq, %dk, %dv = ptc.ring_attention_grad %q, %k, %v, %g positions(%pos : tensor<2x8xi32>) {axes = ["cp"], scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    %dq2, %dk2, %dv2 = ptc.ring_attention_grad %q, %k, %v, %g positions(%pos : tensor<2x8xi32>) {axes = ["cp"], scale = 0.5 : f64} : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>
    return %o, %dq, %dq2 : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>
  }
}
