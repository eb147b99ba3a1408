// Round-trip of every ptc op, in the custom and in the generic form.
// RUN: ptc-opt %s | ptc-opt | FileCheck %s
// RUN: ptc-opt %s --mlir-print-op-generic | ptc-opt | FileCheck %s

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%a: tensor<8x64x384xf32>, %b: tensor<384xf32>, %c: tensor<8x1x384xf32>) -> tensor<8x64x384xf32> {
  // CHECK: ptc.add %{{.*}}, %{{.*}} : tensor<8x64x384xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
  %0 = ptc.add %a, %b : tensor<8x64x384xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
  // CHECK: ptc.sub %{{.*}}, %{{.*}} : tensor<8x64x384xf32>, tensor<8x1x384xf32> -> tensor<8x64x384xf32>
  %1 = ptc.sub %0, %c : tensor<8x64x384xf32>, tensor<8x1x384xf32> -> tensor<8x64x384xf32>
  // CHECK: ptc.mul
  %2 = ptc.mul %1, %a : tensor<8x64x384xf32>, tensor<8x64x384xf32> -> tensor<8x64x384xf32>
  // CHECK: ptc.div
  %3 = ptc.div %2, %b : tensor<8x64x384xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
  // CHECK: ptc.scale %{{.*}} by 1.250000e-01 : tensor<8x64x384xf32>
  %4 = ptc.scale %3 by 0.125 : tensor<8x64x384xf32>
  // CHECK: ptc.gelu %{{.*}} : tensor<8x64x384xf32>
  %5 = ptc.gelu %4 : tensor<8x64x384xf32>
  // CHECK: ptc.silu %{{.*}} : tensor<8x64x384xf32>
  %silu = ptc.silu %4 : tensor<8x64x384xf32>
  // CHECK: ptc.gelu_tanh %{{.*}} : tensor<8x64x384xf32>
  %gelu_tanh = ptc.gelu_tanh %4 : tensor<8x64x384xf32>
  // CHECK: ptc.tanh %{{.*}} : tensor<8x64x384xf32>
  %tanh = ptc.tanh %4 : tensor<8x64x384xf32>
  // CHECK: ptc.dropout %{{.*}} {p = 1.000000e-01 : f64, stream = 2 : i64} : tensor<8x64x384xf32>
  %dropout = ptc.dropout %4 {p = 0.1 : f64, stream = 2 : i64} : tensor<8x64x384xf32>
  // CHECK: ptc.swiglu %{{.*}}, %{{.*}} : tensor<8x64x384xf32>
  %swiglu = ptc.swiglu %4, %5 : tensor<8x64x384xf32>
  // CHECK: ptc.swiglu_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x64x384xf32>
  %dgate, %dup = ptc.swiglu_grad %4, %5, %swiglu : tensor<8x64x384xf32>
  // CHECK: ptc.relu %{{.*}} : tensor<8x64x384xf32>
  %6 = ptc.relu %5 : tensor<8x64x384xf32>
  return %6 : tensor<8x64x384xf32>
}

// CHECK-LABEL: func.func @convert
func.func @convert(%w: tensor<384x128xf32>) -> tensor<384x128xf32> {
  // CHECK: ptc.convert %{{.*}} : tensor<384x128xf32> -> tensor<384x128xbf16>
  %0 = ptc.convert %w : tensor<384x128xf32> -> tensor<384x128xbf16>
  // CHECK: ptc.convert %{{.*}} : tensor<384x128xbf16> -> tensor<384x128xf16>
  %1 = ptc.convert %0 : tensor<384x128xbf16> -> tensor<384x128xf16>
  %2 = ptc.convert %1 : tensor<384x128xf16> -> tensor<384x128xf32>
  return %2 : tensor<384x128xf32>
}

// CHECK-LABEL: func.func @matmul
func.func @matmul(%x: tensor<8x64x128xf32>, %w: tensor<384x128xf32>, %a: tensor<4x16x8xbf16>, %b: tensor<4x16x32xbf16>) -> (tensor<8x64x384xf32>, tensor<4x8x32xbf16>) {
  // CHECK: ptc.matmul %{{.*}}, %{{.*}} {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32> -> tensor<8x64x384xf32>
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32> -> tensor<8x64x384xf32>
  // CHECK: ptc.matmul %{{.*}}, %{{.*}} {transpose_lhs = true} : tensor<4x16x8xbf16>, tensor<4x16x32xbf16> -> tensor<4x8x32xbf16>
  %1 = ptc.matmul %a, %b {transpose_lhs = true} : tensor<4x16x8xbf16>, tensor<4x16x32xbf16> -> tensor<4x8x32xbf16>
  return %0, %1 : tensor<8x64x384xf32>, tensor<4x8x32xbf16>
}

// CHECK-LABEL: func.func @matmul_bias
func.func @matmul_bias(%x: tensor<8x64x128xf32>, %w: tensor<384x128xf32>, %b: tensor<384xf32>) -> tensor<8x64x384xf32> {
  // CHECK: ptc.matmul %{{.*}}, %{{.*}}, %{{.*}} {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
  %0 = ptc.matmul %x, %w, %b {transpose_rhs = true} : tensor<8x64x128xf32>, tensor<384x128xf32>, tensor<384xf32> -> tensor<8x64x384xf32>
  return %0 : tensor<8x64x384xf32>
}

// Packed documents: attention (and its forms) with each token's position in
// its document, rotation at those positions and its inverse.
// CHECK-LABEL: func.func @packed_documents
func.func @packed_documents(%q: tensor<8x4x64x32xf32>, %pos: tensor<8x64xi32>, %qkv: tensor<8x64x256xf32>, %g: tensor<8x64x4x32xf32>) -> (tensor<8x4x64x32xf32>, tensor<8x64x4x32xf32>) {
  // CHECK: ptc.causal_attention %{{.*}}, %{{.*}}, %{{.*}} positions(%{{.*}} : tensor<8x64xi32>) : tensor<8x4x64x32xf32>
  %0 = ptc.causal_attention %q, %q, %q positions(%pos : tensor<8x64xi32>) : tensor<8x4x64x32xf32>
  // CHECK: ptc.causal_attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} positions(%{{.*}} : tensor<8x64xi32>) : tensor<8x4x64x32xf32>
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %q, %q, %0 positions(%pos : tensor<8x64xi32>) : tensor<8x4x64x32xf32>
  // CHECK: ptc.causal_attention_qkv %{{.*}} positions(%{{.*}} : tensor<8x64xi32>) {scale = 2.500000e-01 : f64} : tensor<8x64x256xf32> -> tensor<8x64x4x32xf32>
  %1 = ptc.causal_attention_qkv %qkv positions(%pos : tensor<8x64xi32>) {scale = 0.25 : f64} : tensor<8x64x256xf32> -> tensor<8x64x4x32xf32>
  // CHECK: ptc.causal_attention_qkv_grad %{{.*}}, %{{.*}} positions(%{{.*}} : tensor<8x64xi32>) {scale = 2.500000e-01 : f64} : tensor<8x64x256xf32>, tensor<8x64x4x32xf32>
  %2 = ptc.causal_attention_qkv_grad %qkv, %g positions(%pos : tensor<8x64xi32>) {scale = 0.25 : f64} : tensor<8x64x256xf32>, tensor<8x64x4x32xf32>
  // CHECK: ptc.rotary_at %{{.*}}, %{{.*}} {inverse = true} : tensor<8x4x64x32xf32>, tensor<8x64xi32>
  %3 = ptc.rotary_at %dq, %pos {inverse = true} : tensor<8x4x64x32xf32>, tensor<8x64xi32>
  return %3, %1 : tensor<8x4x64x32xf32>, tensor<8x64x4x32xf32>
}

// CHECK-LABEL: func.func @blocks
func.func @blocks(%x: tensor<8x64x128xf16>, %g: tensor<128xf16>, %b: tensor<128xf16>, %q: tensor<8x4x64x32xf32>, %s: tensor<512x8xf32>, %x4: tensor<8x64x4x32xf32>, %kv2: tensor<8x64x2x32xf32>, %qkv: tensor<8x64x256xf32>) -> (tensor<8x64x128xf16>, tensor<8x4x64x32xf32>, tensor<512x8xf32>) {
  // CHECK: ptc.layer_norm %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x64x128xf16>, tensor<128xf16>
  %0 = ptc.layer_norm %x, %g, %b : tensor<8x64x128xf16>, tensor<128xf16>
  // CHECK: ptc.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {epsilon = 2.500000e-01 : f64}
  %1 = ptc.layer_norm %0, %g, %b {epsilon = 0.25 : f64} : tensor<8x64x128xf16>, tensor<128xf16>
  // CHECK: ptc.causal_attention %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x4x64x32xf32>
  %2 = ptc.causal_attention %q, %q, %q : tensor<8x4x64x32xf32>
  // CHECK: ptc.causal_attention %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f64} : tensor<8x4x64x32xf32>
  %3 = ptc.causal_attention %2, %q, %q {scale = 0.25 : f64} : tensor<8x4x64x32xf32>
  // Seq-major ([batch, seq, heads, head_dim]), 4 query heads over 2 kv heads.
  // CHECK: ptc.causal_attention %{{.*}}, %{{.*}}, %{{.*}} {seq_major = true} : tensor<8x64x4x32xf32>, tensor<8x64x2x32xf32>
  %sm = ptc.causal_attention %x4, %kv2, %kv2 {seq_major = true} : tensor<8x64x4x32xf32>, tensor<8x64x2x32xf32>
  // Read from a fused projection: 4 query heads, 2 kv heads of 32 = 256 columns.
  // CHECK: ptc.causal_attention_qkv %{{.*}} {scale = 2.500000e-01 : f64} : tensor<8x64x256xf32> -> tensor<8x64x4x32xf32>
  %fq = ptc.causal_attention_qkv %qkv {scale = 0.25 : f64} : tensor<8x64x256xf32> -> tensor<8x64x4x32xf32>
  // CHECK: ptc.causal_attention_qkv_grad %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f64} : tensor<8x64x256xf32>, tensor<8x64x4x32xf32>
  %fd = ptc.causal_attention_qkv_grad %qkv, %fq {scale = 0.25 : f64} : tensor<8x64x256xf32>, tensor<8x64x4x32xf32>
  // CHECK: ptc.softmax %{{.*}} : tensor<512x8xf32>
  %4 = ptc.softmax %s : tensor<512x8xf32>
  // CHECK: ptc.softmax %{{.*}} {axis = 0 : i64} : tensor<512x8xf32>
  %5 = ptc.softmax %4 {axis = 0 : i64} : tensor<512x8xf32>
  return %1, %3, %5 : tensor<8x64x128xf16>, tensor<8x4x64x32xf32>, tensor<512x8xf32>
}

// CHECK-LABEL: func.func @embedding_and_loss
func.func @embedding_and_loss(%wte: tensor<256x128xf32>, %tokens: tensor<8x64xi32>, %logits: tensor<8x64x256xf32>) -> (tensor<8x64x128xf32>, tensor<f32>) {
  // CHECK: ptc.embedding %{{.*}}, %{{.*}} : tensor<256x128xf32>, tensor<8x64xi32> -> tensor<8x64x128xf32>
  %0 = ptc.embedding %wte, %tokens : tensor<256x128xf32>, tensor<8x64xi32> -> tensor<8x64x128xf32>
  // CHECK: ptc.cross_entropy %{{.*}}, %{{.*}} : tensor<8x64x256xf32>, tensor<8x64xi32> -> tensor<f32>
  %1 = ptc.cross_entropy %logits, %tokens : tensor<8x64x256xf32>, tensor<8x64xi32> -> tensor<f32>
  return %0, %1 : tensor<8x64x128xf32>, tensor<f32>
}

// An f32 loss over bf16 logits, and its gradient in the logits' type.
// CHECK-LABEL: func.func @loss_over_bf16_logits
func.func @loss_over_bf16_logits(%logits: tensor<8x64x256xbf16>, %tokens: tensor<8x64xi32>, %g: tensor<f32>) -> (tensor<f32>, tensor<8x64x256xbf16>) {
  // CHECK: ptc.cross_entropy %{{.*}}, %{{.*}} : tensor<8x64x256xbf16>, tensor<8x64xi32> -> tensor<f32>
  %0 = ptc.cross_entropy %logits, %tokens : tensor<8x64x256xbf16>, tensor<8x64xi32> -> tensor<f32>
  // CHECK: ptc.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32>
  %1 = ptc.cross_entropy_grad %logits, %tokens, %g : tensor<8x64x256xbf16>, tensor<8x64xi32>, tensor<f32>
  return %0, %1 : tensor<f32>, tensor<8x64x256xbf16>
}

// CHECK-LABEL: func.func @layout
func.func @layout(%x: tensor<8x64x384xf32>, %ids: tensor<8x64xi32>) -> (tensor<8x4x64x32xf32>, tensor<8x64x256xf32>, tensor<512xi32>) {
  // CHECK: ptc.slice %{{.*}} offsets = [0, 0, 128] : tensor<8x64x384xf32> -> tensor<8x64x128xf32>
  %0 = ptc.slice %x offsets = [0, 0, 128] : tensor<8x64x384xf32> -> tensor<8x64x128xf32>
  // CHECK: ptc.reshape %{{.*}} : tensor<8x64x128xf32> -> tensor<8x64x4x32xf32>
  %1 = ptc.reshape %0 : tensor<8x64x128xf32> -> tensor<8x64x4x32xf32>
  // CHECK: ptc.transpose %{{.*}} permutation = [0, 2, 1, 3] : tensor<8x64x4x32xf32> -> tensor<8x4x64x32xf32>
  %2 = ptc.transpose %1 permutation = [0, 2, 1, 3] : tensor<8x64x4x32xf32> -> tensor<8x4x64x32xf32>
  // CHECK: ptc.concat %{{.*}}, %{{.*}} axis = 2 : tensor<8x64x128xf32>, tensor<8x64x128xf32> -> tensor<8x64x256xf32>
  %3 = ptc.concat %0, %0 axis = 2 : tensor<8x64x128xf32>, tensor<8x64x128xf32> -> tensor<8x64x256xf32>
  // CHECK: ptc.reshape %{{.*}} : tensor<8x64xi32> -> tensor<512xi32>
  %4 = ptc.reshape %ids : tensor<8x64xi32> -> tensor<512xi32>
  return %2, %3, %4 : tensor<8x4x64x32xf32>, tensor<8x64x256xf32>, tensor<512xi32>
}

// CHECK-LABEL: func.func @reductions
func.func @reductions(%x: tensor<8x64x128xf32>) -> (tensor<128xf32>, tensor<8x64x1xf32>, tensor<f32>) {
  // CHECK: ptc.reduce_sum %{{.*}} axes = [0, 1] : tensor<8x64x128xf32> -> tensor<128xf32>
  %0 = ptc.reduce_sum %x axes = [0, 1] : tensor<8x64x128xf32> -> tensor<128xf32>
  // CHECK: ptc.reduce_max %{{.*}} axes = [-1] {keep_dims = true} : tensor<8x64x128xf32> -> tensor<8x64x1xf32>
  %1 = ptc.reduce_max %x axes = [-1] {keep_dims = true} : tensor<8x64x128xf32> -> tensor<8x64x1xf32>
  // CHECK: ptc.reduce_mean %{{.*}} axes = [0, 1, 2] : tensor<8x64x128xf32> -> tensor<f32>
  %2 = ptc.reduce_mean %x axes = [0, 1, 2] : tensor<8x64x128xf32> -> tensor<f32>
  return %0, %1, %2 : tensor<128xf32>, tensor<8x64x1xf32>, tensor<f32>
}

// CHECK-LABEL: func.func @moe
func.func @moe(%logits: tensor<512x8xf32>, %x: tensor<512x128xf32>) -> tensor<512x128xf32> {
  // CHECK: %[[W:.+]], %[[E:.+]] = ptc.top_k_gate %{{.*}} {k = 2 : i64} : tensor<512x8xf32> -> tensor<512x2xf32>, tensor<512x2xi32>
  %w, %e = ptc.top_k_gate %logits {k = 2 : i64} : tensor<512x8xf32> -> tensor<512x2xf32>, tensor<512x2xi32>
  // CHECK: ptc.top_k_gate %{{.*}} {k = 1 : i64, normalize = false}
  %w1, %e1 = ptc.top_k_gate %logits {k = 1 : i64, normalize = false} : tensor<512x8xf32> -> tensor<512x1xf32>, tensor<512x1xi32>
  // CHECK: %[[BUF:.+]] = ptc.moe_dispatch %{{.*}}, %[[E]] : tensor<512x128xf32>, tensor<512x2xi32> -> tensor<8x160x128xf32>
  %buf = ptc.moe_dispatch %x, %e : tensor<512x128xf32>, tensor<512x2xi32> -> tensor<8x160x128xf32>
  // CHECK: ptc.moe_combine %[[BUF]], %[[W]], %[[E]] : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32> -> tensor<512x128xf32>
  %y = ptc.moe_combine %buf, %w, %e : tensor<8x160x128xf32>, tensor<512x2xf32>, tensor<512x2xi32> -> tensor<512x128xf32>
  return %y : tensor<512x128xf32>
}

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: {ptc.param = "fc.weight"}
// CHECK-SAME: {ptc.input = "x"}
func.func @train_step(%w: tensor<4x8xf32> {ptc.param = "fc.weight"}, %x: tensor<2x8xf32> {ptc.input = "x"}) -> tensor<2x4xf32> {
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x8xf32>, tensor<4x8xf32> -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// CHECK-LABEL: func.func @nonfinite_check
func.func @nonfinite_check(%g0: tensor<128x64xf32>, %g1: tensor<64xbf16>) -> tensor<f32> {
  // CHECK: ptc.any_nonfinite %{{.*}}, %{{.*}} {axes = ["dp"]} : tensor<128x64xf32>, tensor<64xbf16> -> tensor<f32>
  %0 = ptc.any_nonfinite %g0, %g1 {axes = ["dp"]} : tensor<128x64xf32>, tensor<64xbf16> -> tensor<f32>
  return %0 : tensor<f32>
}
