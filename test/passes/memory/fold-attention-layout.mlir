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

// A rotary embedding after the head transpose (Llama's query and key) moves
// before it, seq-major (a rotation of each head row by its sequence index
// in either layout): the op then folds, and every transpose goes. The
// gradients' inverse rotations move after their transposes likewise.
// CHECK-LABEL: func.func @rotary_query_and_key
// CHECK-NOT: ptc.transpose
// CHECK: %[[Q:.+]] = ptc.rotary %arg0 {seq_major = true} : tensor<2x16x4x8xf32>
// CHECK: %[[K:.+]] = ptc.rotary %arg1 {seq_major = true} : tensor<2x16x2x8xf32>
// CHECK: %[[O:.+]] = ptc.causal_attention %[[Q]], %[[K]], %arg2 {seq_major = true}
// CHECK: %[[DQ:.+]], %[[DK:.+]], %[[DV:.+]] = ptc.causal_attention_grad %[[Q]], %[[K]], %arg2, %arg3 {ptc.backward, seq_major = true}
// CHECK: %[[RDQ:.+]] = ptc.rotary %[[DQ]] {inverse = true, ptc.backward, seq_major = true} : tensor<2x16x4x8xf32>
// CHECK: %[[RDK:.+]] = ptc.rotary %[[DK]] {inverse = true, ptc.backward, seq_major = true} : tensor<2x16x2x8xf32>
// CHECK-NOT: ptc.transpose
// CHECK: return %[[O]], %[[RDQ]], %[[RDK]], %[[DV]]
func.func @rotary_query_and_key(%qs: tensor<2x16x4x8xf32>, %ks: tensor<2x16x2x8xf32>, %vs: tensor<2x16x2x8xf32>, %gs: tensor<2x16x4x8xf32>)
    -> (tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) {
  %q0 = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %q = ptc.rotary %q0 {theta = 10000.0 : f64} : tensor<2x4x16x8xf32>
  %k0 = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %k = ptc.rotary %k0 {theta = 10000.0 : f64} : tensor<2x2x16x8xf32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %g = ptc.transpose %gs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %k, %v, %g {ptc.backward} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %rdq = ptc.rotary %dq {inverse = true, ptc.backward, theta = 10000.0 : f64} : tensor<2x4x16x8xf32>
  %dqs = ptc.transpose %rdq permutation = [0, 2, 1, 3] {ptc.backward} : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %rdk = ptc.rotary %dk {inverse = true, ptc.backward, theta = 10000.0 : f64} : tensor<2x2x16x8xf32>
  %dks = ptc.transpose %rdk permutation = [0, 2, 1, 3] {ptc.backward} : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  %dvs = ptc.transpose %dv permutation = [0, 2, 1, 3] : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  return %os, %dqs, %dks, %dvs : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
}

// -----

// Packed documents' rotations at positions move likewise (ptc.rotary_at
// seq-major: its positions [batch, tokens] are the same in either layout).
// CHECK-LABEL: func.func @rotary_at_positions
// CHECK-NOT: ptc.transpose
// CHECK: %[[Q:.+]] = ptc.rotary_at %arg0, %arg3 {seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x16xi32>
// CHECK: %[[K:.+]] = ptc.rotary_at %arg1, %arg3 {seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x16xi32>
// CHECK: %[[O:.+]] = ptc.causal_attention %[[Q]], %[[K]], %arg2 positions(%arg3 : tensor<2x16xi32>) {seq_major = true}
// CHECK-NOT: ptc.transpose
func.func @rotary_at_positions(%qs: tensor<2x16x4x8xf32>, %ks: tensor<2x16x4x8xf32>, %vs: tensor<2x16x4x8xf32>, %pos: tensor<2x16xi32>) -> tensor<2x16x4x8xf32> {
  %q0 = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %q = ptc.rotary_at %q0, %pos : tensor<2x4x16x8xf32>, tensor<2x16xi32>
  %k0 = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %k = ptc.rotary_at %k0, %pos : tensor<2x4x16x8xf32>, tensor<2x16xi32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v positions(%pos : tensor<2x16xi32>) : tensor<2x4x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  return %os : tensor<2x16x4x8xf32>
}

// -----

// A transpose read by something else than the rotation stays, and so does
// the rotation's layout (and the attention's, whose query it then is).
// CHECK-LABEL: func.func @rotary_query_shared
// CHECK-COUNT-4: ptc.transpose
// CHECK-NOT: seq_major
func.func @rotary_query_shared(%qs: tensor<2x16x4x8xf32>, %ks: tensor<2x16x4x8xf32>, %vs: tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x4x16x8xf32>) {
  %q0 = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %q = ptc.rotary %q0 {theta = 10000.0 : f64} : tensor<2x4x16x8xf32>
  %k = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v : tensor<2x4x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  return %os, %q0 : tensor<2x16x4x8xf32>, tensor<2x4x16x8xf32>
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

// -----

// Query, key and value sliced out of one fused projection [batch, seq,
// (heads + 2 kv_heads) * head_dim] (grouped kv heads here): attention reads
// them there (ptc.causal_attention_qkv), and the gradient writes its three
// parts where their concatenation put them (ptc.causal_attention_qkv_grad);
// the slices, reshapes and the concat go; the default scale is made explicit.
// CHECK-LABEL: func.func @fused_projection
// CHECK-NOT: ptc.slice
// CHECK: %[[O:.+]] = ptc.causal_attention_qkv %arg0 {ptc.stage = 1 : i64, scale = 0.35355339059327373 : f64} : tensor<2x16x64xf32> -> tensor<2x16x4x8xf32>
// CHECK: %[[D:.+]] = ptc.causal_attention_qkv_grad %arg0, %arg1 {ptc.backward, scale = 0.35355339059327373 : f64} : tensor<2x16x64xf32>, tensor<2x16x4x8xf32>
// CHECK-NOT: ptc.concat
// CHECK: return %[[O]], %[[D]] : tensor<2x16x4x8xf32>, tensor<2x16x64xf32>
func.func @fused_projection(%qkv: tensor<2x16x64xf32>, %gs: tensor<2x16x4x8xf32>) -> (tensor<2x16x4x8xf32>, tensor<2x16x64xf32>) {
  %q0 = ptc.slice %qkv offsets = [0, 0, 0] : tensor<2x16x64xf32> -> tensor<2x16x32xf32>
  %k0 = ptc.slice %qkv offsets = [0, 0, 32] : tensor<2x16x64xf32> -> tensor<2x16x16xf32>
  %v0 = ptc.slice %qkv offsets = [0, 0, 48] : tensor<2x16x64xf32> -> tensor<2x16x16xf32>
  %qs = ptc.reshape %q0 : tensor<2x16x32xf32> -> tensor<2x16x4x8xf32>
  %ks = ptc.reshape %k0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %vs = ptc.reshape %v0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %q = ptc.transpose %qs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %k = ptc.transpose %ks permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %v = ptc.transpose %vs permutation = [0, 2, 1, 3] : tensor<2x16x2x8xf32> -> tensor<2x2x16x8xf32>
  %o = ptc.causal_attention %q, %k, %v {ptc.stage = 1 : i64} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %os = ptc.transpose %o permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %g = ptc.transpose %gs permutation = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %k, %v, %g {ptc.backward} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>
  %dqs = ptc.transpose %dq permutation = [0, 2, 1, 3] : tensor<2x4x16x8xf32> -> tensor<2x16x4x8xf32>
  %dks = ptc.transpose %dk permutation = [0, 2, 1, 3] : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  %dvs = ptc.transpose %dv permutation = [0, 2, 1, 3] : tensor<2x2x16x8xf32> -> tensor<2x16x2x8xf32>
  %dq2 = ptc.reshape %dqs : tensor<2x16x4x8xf32> -> tensor<2x16x32xf32>
  %dk2 = ptc.reshape %dks : tensor<2x16x2x8xf32> -> tensor<2x16x16xf32>
  %dv2 = ptc.reshape %dvs : tensor<2x16x2x8xf32> -> tensor<2x16x16xf32>
  %d = ptc.concat %dq2, %dk2, %dv2 axis = 2 : tensor<2x16x32xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32> -> tensor<2x16x64xf32>
  return %os, %d : tensor<2x16x4x8xf32>, tensor<2x16x64xf32>
}

// -----

// Not read in place: the blocks are out of order (key first); the projection
// is wider than the three blocks. The gradient keeps its own operands when its
// parts are concatenated in another order; the forward still folds there.
// CHECK-LABEL: func.func @kept_projections
// CHECK-NOT: ptc.causal_attention_qkv
// CHECK: ptc.causal_attention {{.*}}seq_major = true
// CHECK: ptc.causal_attention {{.*}}seq_major = true
// CHECK-LABEL: func.func @kept_gradient
// CHECK: ptc.causal_attention_qkv %arg0
// CHECK: ptc.causal_attention_grad {{.*}}seq_major = true
// CHECK: ptc.concat
func.func @kept_projections(%qkv: tensor<2x16x48xf32>, %wide: tensor<2x16x56xf32>) -> (tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) {
  %k0 = ptc.slice %qkv offsets = [0, 0, 0] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %q0 = ptc.slice %qkv offsets = [0, 0, 16] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %v0 = ptc.slice %qkv offsets = [0, 0, 32] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %qs = ptc.reshape %q0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %ks = ptc.reshape %k0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %vs = ptc.reshape %v0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %o = ptc.causal_attention %qs, %ks, %vs {seq_major = true} : tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
  %q1 = ptc.slice %wide offsets = [0, 0, 0] : tensor<2x16x56xf32> -> tensor<2x16x16xf32>
  %k1 = ptc.slice %wide offsets = [0, 0, 16] : tensor<2x16x56xf32> -> tensor<2x16x16xf32>
  %v1 = ptc.slice %wide offsets = [0, 0, 32] : tensor<2x16x56xf32> -> tensor<2x16x16xf32>
  %qw = ptc.reshape %q1 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %kw = ptc.reshape %k1 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %vw = ptc.reshape %v1 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %ow = ptc.causal_attention %qw, %kw, %vw {seq_major = true} : tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
  return %o, %ow : tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
}
func.func @kept_gradient(%qkv: tensor<2x16x48xf32>, %g: tensor<2x16x2x8xf32>) -> (tensor<2x16x2x8xf32>, tensor<2x16x48xf32>) {
  %q0 = ptc.slice %qkv offsets = [0, 0, 0] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %k0 = ptc.slice %qkv offsets = [0, 0, 16] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %v0 = ptc.slice %qkv offsets = [0, 0, 32] : tensor<2x16x48xf32> -> tensor<2x16x16xf32>
  %qs = ptc.reshape %q0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %ks = ptc.reshape %k0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %vs = ptc.reshape %v0 : tensor<2x16x16xf32> -> tensor<2x16x2x8xf32>
  %o = ptc.causal_attention %qs, %ks, %vs {seq_major = true} : tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %qs, %ks, %vs, %g {ptc.backward, seq_major = true} : tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>
  %dq2 = ptc.reshape %dq : tensor<2x16x2x8xf32> -> tensor<2x16x16xf32>
  %dk2 = ptc.reshape %dk : tensor<2x16x2x8xf32> -> tensor<2x16x16xf32>
  %dv2 = ptc.reshape %dv : tensor<2x16x2x8xf32> -> tensor<2x16x16xf32>
  %d = ptc.concat %dk2, %dq2, %dv2 axis = 2 : tensor<2x16x16xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32> -> tensor<2x16x48xf32>
  return %o, %d : tensor<2x16x2x8xf32>, tensor<2x16x48xf32>
}
