// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fold-attention-layout))" | FileCheck %s

// The heads' transposes around attention and its gradient go: both ops take
// and give [batch, seq, heads, head_dim] (seq_major), grouped kv heads too.
// CHECK-LABEL: func.func @layer
// CHECK-NOT: ptc.transpose
// CHECK: %[[O:.+]] = ptc.causal_attention %arg0, %arg1, %arg2 {ptc.stage = 1 : i64, scale = 5.000000e-01 : f64, seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>
// CHECK: %[[DQ:.+]], %[[DK:.+]], %[[DV:.+]] = ptc.causal_attention_grad %arg0, %arg1, %arg2, %arg3 {ptc.backward, scale = 5.000000e-01 : f64, seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>
// CHECK-NOT: ptc.transpose
// CHECK: return %[[O]], %[[DQ]], %[[DK]], %[[DV]] : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
func.func @layer(%qs: tensor<2x16x4x8xf32>, %ks: tensor<2x16x2x8xf32>, %vs: tensor<2x16x2x8xf32>, %gs: tensor<2x16x4x8xf32>)
    -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) {
  %q = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %k = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v {ptc.stage = 1 : i64, scale = 0.5 : f64} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %g = ptc.transpose %gs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %k, %v, %g {ptc.backward, scale = 0.5 : f64} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %dqs = ptc.transpose %dq permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %dks = ptc.transpose %dk permutation = [0, 2, 1, 3] : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  %dvs = ptc.transpose %dv permutation = [0, 2, 1, 3] : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  return %os, %dqs, %dks, %dvs : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
}

// -----

// An operand that is not a head transpose (a rotary embedding applied after
// it, as in Llama) keeps the op heads-major, and its transposes with it.
// CHECK-LABEL: func.func @rotary_query
// CHECK-COUNT-4: ptc.transpose
// CHECK-NOT: seq_major
func.func @rotary_query(%qs: tensor<2x16x4x8xf32>, %ks: tensor<2x16x4x8xf32>, %vs: tensor<2x16x4x8xf32>) -> tensor<2x16x4x8xf32> {
  %q0 = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %q = ptc.rotary %q0 {theta = 10000.0 : f64} : tensor<2x4x16x8xf32>
  %k = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v : tensor<2x4x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  return %os : tensor<2x16x4x8xf32>
}

// -----

// A result read by anything else than a head transpose keeps it too; another
// permutation is not a head transpose.
// CHECK-LABEL: func.func @other_uses
// CHECK-NOT: seq_major
func.func @other_uses(%qs: tensor<2x16x4x8xf32>, %x: tensor<2x4x8x16xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x16x4x8xf32>) {
  %q = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %o = ptc.causal_attention %q, %q, %q : tensor<2x4x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %k = ptc.transpose %x permutation = [0, 1, 3, 2] : tensor<2x4x8x16xf32> -> tensor<2x4x16x8xf32>
  %o2 = ptc.causal_attention %k, %k, %k : tensor<2x4x16x8xf32>
  %o2s = ptc.transpose %o2 permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  return %o, %o2s : tensor<2x4x16x8xf32>, tensor<2x16x4x8xf32>
}
