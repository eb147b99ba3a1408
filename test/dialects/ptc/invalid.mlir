// Every diagnostic of the ptc verifiers, one case each.
// RUN: ptc-opt %s -split-input-file -verify-diagnostics

// Elementwise operands must have the same element type.
func.func @add_element_types(%a: tensor<4xf32>, %b: tensor<4xbf16>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.add' op lhs element type 'f32' differs from rhs element type 'bf16'}}
  %0 = ptc.add %a, %b : tensor<4xf32>, tensor<4xbf16> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Shapes that do not broadcast.
func.func @sub_no_broadcast(%a: tensor<8x3xf32>, %b: tensor<4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.sub' op operand shapes 8x3 and 4 do not broadcast: dimension 1 of the result would need both 3 and 4}}
  %0 = ptc.sub %a, %b : tensor<8x3xf32>, tensor<4xf32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// The declared result must be the broadcast shape.
func.func @mul_result(%a: tensor<8x1xf32>, %b: tensor<4xf32>) -> tensor<8x1xf32> {
  // expected-error @+1 {{'ptc.mul' op result type 'tensor<8x1xf32>' does not match the expected 'tensor<8x4xf32>'}}
  %0 = ptc.mul %a, %b : tensor<8x1xf32>, tensor<4xf32> -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// -----

// Integer tensors are not arithmetic operands.
func.func @div_int(%a: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{'ptc.div' op operand #0 must be statically shaped tensor without zero-size dimensions of 32-bit float or bfloat16 type or 16-bit float values}}
  %0 = ptc.div %a, %a : tensor<4xi32>, tensor<4xi32> -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// Dynamic shapes are rejected: ptc values have static global shapes.
func.func @gelu_dynamic(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {
  // expected-error @+1 {{'ptc.gelu' op operand #0 must be statically shaped tensor}}
  %0 = ptc.gelu %a : tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}

// -----

func.func @matmul_rank(%a: tensor<8xf32>, %b: tensor<8x4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.matmul' op lhs must have rank >= 2, got rank 1}}
  %0 = ptc.matmul %a, %b : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @matmul_rhs_rank(%a: tensor<2x3x8x4xf32>, %b: tensor<3x4x5xf32>) -> tensor<2x3x8x5xf32> {
  // expected-error @+1 {{'ptc.matmul' op rhs must have rank 2 or the rank of lhs (4), got rank 3}}
  %0 = ptc.matmul %a, %b : tensor<2x3x8x4xf32>, tensor<3x4x5xf32> -> tensor<2x3x8x5xf32>
  return %0 : tensor<2x3x8x5xf32>
}

// -----

func.func @matmul_bias_grad_rank(%a: tensor<2x8x4xf32>, %w: tensor<2x8x5xf32>) -> tensor<2x4x5xf32> {
  // expected-error @+1 {{'ptc.matmul_bias_grad' op a bias gradient's product takes rank-2 operands, got lhs 2x8x4 and rhs 2x8x5}}
  %0, %1 = ptc.matmul_bias_grad %a, %w {transpose_lhs = true} : tensor<2x8x4xf32>, tensor<2x8x5xf32> -> tensor<2x4x5xf32>, tensor<4xf32>
  return %0 : tensor<2x4x5xf32>
}

// -----

func.func @matmul_bias_grad_size(%a: tensor<8x4xbf16>, %w: tensor<8x5xbf16>) -> tensor<4x5xbf16> {
  // expected-error @+1 {{'ptc.matmul_bias_grad' op bias gradient must be 'bf16' [4] (lhs summed over its contracted dimension), got 'tensor<8xbf16>'}}
  %0, %1 = ptc.matmul_bias_grad %a, %w {transpose_lhs = true} : tensor<8x4xbf16>, tensor<8x5xbf16> -> tensor<4x5xbf16>, tensor<8xbf16>
  return %0 : tensor<4x5xbf16>
}

// -----

func.func @matmul_bias_size(%a: tensor<2x8x4xf32>, %w: tensor<4x5xf32>, %b: tensor<4xf32>) -> tensor<2x8x5xf32> {
  // expected-error @+1 {{'ptc.matmul' op bias must be a vector of the result's last dimension (5), got 'tensor<4xf32>'}}
  %0 = ptc.matmul %a, %w, %b : tensor<2x8x4xf32>, tensor<4x5xf32>, tensor<4xf32> -> tensor<2x8x5xf32>
  return %0 : tensor<2x8x5xf32>
}

// -----

func.func @matmul_bias_type(%a: tensor<2x8x4xf32>, %w: tensor<4x5xf32>, %b: tensor<5xbf16>) -> tensor<2x8x5xf32> {
  // expected-error @+1 {{'ptc.matmul' op bias element type 'bf16' differs from the result's 'f32'}}
  %0 = ptc.matmul %a, %w, %b : tensor<2x8x4xf32>, tensor<4x5xf32>, tensor<5xbf16> -> tensor<2x8x5xf32>
  return %0 : tensor<2x8x5xf32>
}

// -----

func.func @matmul_batch(%a: tensor<2x8x4xf32>, %b: tensor<3x4x5xf32>) -> tensor<2x8x5xf32> {
  // expected-error @+1 {{'ptc.matmul' op batch dimension 0 differs: lhs has 2, rhs has 3}}
  %0 = ptc.matmul %a, %b : tensor<2x8x4xf32>, tensor<3x4x5xf32> -> tensor<2x8x5xf32>
  return %0 : tensor<2x8x5xf32>
}

// -----

func.func @matmul_contracting(%a: tensor<8x64xf32>, %w: tensor<64x128xf32>) -> tensor<8x64xf32> {
  // expected-error @+1 {{'ptc.matmul' op contracting dimensions differ: lhs has 64, rhs has 128 (lhs 8x64, rhs 64x128 transposed)}}
  %0 = ptc.matmul %a, %w {transpose_rhs = true} : tensor<8x64xf32>, tensor<64x128xf32> -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}

// -----

func.func @matmul_element_types(%a: tensor<8x64xf16>, %w: tensor<64x128xf32>) -> tensor<8x128xf16> {
  // expected-error @+1 {{'ptc.matmul' op lhs element type 'f16' differs from rhs element type 'f32'}}
  %0 = ptc.matmul %a, %w : tensor<8x64xf16>, tensor<64x128xf32> -> tensor<8x128xf16>
  return %0 : tensor<8x128xf16>
}

// -----

func.func @matmul_result(%a: tensor<8x64xf32>, %w: tensor<64x128xf32>) -> tensor<8x64xf32> {
  // expected-error @+1 {{'ptc.matmul' op result type 'tensor<8x64xf32>' does not match the expected 'tensor<8x128xf32>'}}
  %0 = ptc.matmul %a, %w : tensor<8x64xf32>, tensor<64x128xf32> -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}

// -----

func.func @layer_norm_rank(%x: tensor<f32>, %g: tensor<1xf32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.layer_norm' op input must have rank >= 1}}
  %0 = ptc.layer_norm %x, %g, %g : tensor<f32>, tensor<1xf32>
  return %0 : tensor<f32>
}

// -----

func.func @layer_norm_weight(%x: tensor<8x128xf32>, %g: tensor<64xf32>) -> tensor<8x128xf32> {
  // expected-error @+1 {{'ptc.layer_norm' op weight and bias must have shape [128] (the normalized dimension), got 64}}
  %0 = ptc.layer_norm %x, %g, %g : tensor<8x128xf32>, tensor<64xf32>
  return %0 : tensor<8x128xf32>
}

// -----

func.func @layer_norm_element_type(%x: tensor<8x128xf32>, %g: tensor<128xbf16>) -> tensor<8x128xf32> {
  // expected-error @+1 {{'ptc.layer_norm' op input element type 'f32' differs from weight element type 'bf16'}}
  %0 = ptc.layer_norm %x, %g, %g : tensor<8x128xf32>, tensor<128xbf16>
  return %0 : tensor<8x128xf32>
}

// -----

func.func @layer_norm_epsilon(%x: tensor<8x128xf32>, %g: tensor<128xf32>) -> tensor<8x128xf32> {
  // expected-error @+1 {{'ptc.layer_norm' op epsilon must be positive, got 0}}
  %0 = ptc.layer_norm %x, %g, %g {epsilon = 0.0 : f64} : tensor<8x128xf32>, tensor<128xf32>
  return %0 : tensor<8x128xf32>
}

// -----

func.func @softmax_axis(%x: tensor<8x128xf32>) -> tensor<8x128xf32> {
  // expected-error @+1 {{'ptc.softmax' op axis 2 is out of range for rank 2}}
  %0 = ptc.softmax %x {axis = 2 : i64} : tensor<8x128xf32>
  return %0 : tensor<8x128xf32>
}

// -----

func.func @attention_rank(%q: tensor<8x64x32xf32>) -> tensor<8x64x32xf32> {
  // expected-error @+1 {{'ptc.causal_attention' op operands must have shape [batch, heads, seq, head_dim], got rank 3}}
  %0 = ptc.causal_attention %q, %q, %q : tensor<8x64x32xf32>
  return %0 : tensor<8x64x32xf32>
}

// -----

func.func @attention_positions(%q: tensor<2x4x16x8xf32>, %pos: tensor<2x8xi32>) -> tensor<2x4x16x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention' op positions must have shape [batch, tokens] = [2, 16], got 2x8}}
  %0 = ptc.causal_attention %q, %q, %q positions(%pos : tensor<2x8xi32>) : tensor<2x4x16x8xf32>
  return %0 : tensor<2x4x16x8xf32>
}

// -----

func.func @attention_seq_major_kv(%q: tensor<2x16x4x8xf32>, %kv: tensor<2x2x16x8xf32>) -> tensor<2x16x4x8xf32> {
  // Seq-major: key and value are [batch, seq, kv_heads, head_dim] too.
  // expected-error @+1 {{'ptc.causal_attention' op key and value must have shape [batch, seq, kv_heads, head_dim] with the query's batch, seq and head_dim (2x16x4x8), got 2x2x16x8}}
  %0 = ptc.causal_attention %q, %kv, %kv {seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x2x16x8xf32>
  return %0 : tensor<2x16x4x8xf32>
}

// -----

func.func @attention_seq_major_heads(%q: tensor<2x16x4x8xf32>, %kv: tensor<2x16x3x8xf32>) -> tensor<2x16x4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention' op the 3 key/value heads must divide the 4 query heads (grouped-query attention)}}
  %0 = ptc.causal_attention %q, %kv, %kv {seq_major = true} : tensor<2x16x4x8xf32>, tensor<2x16x3x8xf32>
  return %0 : tensor<2x16x4x8xf32>
}

// -----

func.func @attention_scale(%q: tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention' op scale must be positive, got -1}}
  %0 = ptc.causal_attention %q, %q, %q {scale = -1.0 : f64} : tensor<1x2x4x8xf32>
  return %0 : tensor<1x2x4x8xf32>
}

// -----

func.func @attention_stats_shape(%q: tensor<2x16x4x8xf32>) -> tensor<2x16x4xf32> {
  // Seq-major: the statistics are [batch, heads, seq] all the same.
  // expected-error @+1 {{'ptc.causal_attention' op expects row statistics of shape [batch, heads, seq] = [2, 4, 16], got 2x16x4}}
  %0, %1 = ptc.causal_attention %q, %q, %q {seq_major = true} : tensor<2x16x4x8xf32> stats tensor<2x16x4xf32>
  return %1 : tensor<2x16x4xf32>
}

// -----

func.func @attention_saved_result(%q: tensor<2x4x16x8xf32>, %o: tensor<2x4x16x4xf32>, %lse: tensor<2x4x16xf32>) -> tensor<2x4x16x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention_grad' op expects the saved result to be the forward result 'tensor<2x4x16x8xf32>' or a reshape of it, got 'tensor<2x4x16x4xf32>'}}
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %q, %q, %q saved(%o, %lse : tensor<2x4x16x4xf32>, tensor<2x4x16xf32>) : tensor<2x4x16x8xf32>
  return %dq : tensor<2x4x16x8xf32>
}

// -----

func.func @attention_qkv_saved_stats(%qkv: tensor<2x16x96xbf16>, %g: tensor<2x16x4x8xbf16>, %o: tensor<2x16x32xbf16>, %lse: tensor<2x16x4xf32>) -> tensor<2x16x96xbf16> {
  // A reshape of the result is a saved result; the statistics' heads come before the sequence.
  // expected-error @+1 {{'ptc.causal_attention_qkv_grad' op expects row statistics of shape [batch, heads, seq] = [2, 4, 16], got 2x16x4}}
  %0 = ptc.causal_attention_qkv_grad %qkv, %g saved(%o, %lse : tensor<2x16x32xbf16>, tensor<2x16x4xf32>) {scale = 0.35 : f64} : tensor<2x16x96xbf16>, tensor<2x16x4x8xbf16>
  return %0 : tensor<2x16x96xbf16>
}

// -----

func.func @attention_stats_without_result(%q: tensor<2x4x16x8xf32>, %lse: tensor<2x4x16xf32>) -> tensor<2x4x16x8xf32> {
  // A gradient reads the statistics with the forward's result, never alone.
  // expected-error @+1 {{'ptc.causal_attention_grad' op takes the forward's saved result and row statistics together}}
  %dq, %dk, %dv = "ptc.causal_attention_grad"(%q, %q, %q, %q, %lse) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1, 0>}> : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>)
  return %dq : tensor<2x4x16x8xf32>
}

// -----

module attributes {ptc.mesh = {axes = ["cp"], shape = array<i64: 2>}} {
  func.func @ring_stats_shape(%q: tensor<2x4x8x16xf32>) -> tensor<2x8x4xf32> {
    // expected-error @+1 {{'ptc.ring_attention' op expects row statistics of shape [batch, heads, seq] = [2, 4, 8], got 2x8x4}}
    %o, %lse = ptc.ring_attention %q, %q, %q {axes = ["cp"], scale = 0.25 : f64} : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> stats tensor<2x8x4xf32>
    return %lse : tensor<2x8x4xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["cp"], shape = array<i64: 2>}} {
  func.func @ring_saved_result(%q: tensor<2x4x8x16xbf16>, %o: tensor<2x4x8x16xf32>, %lse: tensor<2x4x8xf32>) -> tensor<2x4x8x16xbf16> {
    // expected-error @+1 {{'ptc.ring_attention_grad' op expects the saved result to be the forward result 'tensor<2x4x8x16xbf16>' or a reshape of it, got 'tensor<2x4x8x16xf32>'}}
    %dq, %dk, %dv = ptc.ring_attention_grad %q, %q, %q, %q saved(%o, %lse : tensor<2x4x8x16xf32>, tensor<2x4x8xf32>) {axes = ["cp"], scale = 0.25 : f64} : tensor<2x4x8x16xbf16>, tensor<2x4x8x16xbf16>
    return %dq : tensor<2x4x8x16xbf16>
  }
}

// -----

func.func @embedding_table(%t: tensor<256xf32>, %ids: tensor<8xi32>) -> tensor<8x1xf32> {
  // expected-error @+1 {{'ptc.embedding' op table must have rank 2 ([rows, dim]), got rank 1}}
  %0 = ptc.embedding %t, %ids : tensor<256xf32>, tensor<8xi32> -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// -----

func.func @embedding_result(%t: tensor<256x64xf32>, %ids: tensor<8x16xi32>) -> tensor<8x64xf32> {
  // expected-error @+1 {{'ptc.embedding' op result type 'tensor<8x64xf32>' does not match the expected 'tensor<8x16x64xf32>'}}
  %0 = ptc.embedding %t, %ids : tensor<256x64xf32>, tensor<8x16xi32> -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}

// -----

func.func @embedding_float_ids(%t: tensor<256x64xf32>, %ids: tensor<8xf32>) -> tensor<8x64xf32> {
  // expected-error @+1 {{'ptc.embedding' op operand #1 must be statically shaped tensor without zero-size dimensions of 32-bit signless integer values}}
  %0 = ptc.embedding %t, %ids : tensor<256x64xf32>, tensor<8xf32> -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}

// -----

func.func @cross_entropy_rank(%l: tensor<8x256xf32>, %t: tensor<8x4xi32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.cross_entropy' op logits must have one more dimension (classes) than targets, got logits 8x256 and targets 8x4}}
  %0 = ptc.cross_entropy %l, %t : tensor<8x256xf32>, tensor<8x4xi32> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @cross_entropy_dim(%l: tensor<8x256xf32>, %t: tensor<4xi32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.cross_entropy' op dimension 0 differs: logits have 8, targets have 4}}
  %0 = ptc.cross_entropy %l, %t : tensor<8x256xf32>, tensor<4xi32> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// A loss over bf16 logits is bf16 or f32, never f16; over f32 logits, f32.
func.func @cross_entropy_result(%l: tensor<8x256xbf16>, %t: tensor<8xi32>) -> tensor<f16> {
  // expected-error @+1 {{'ptc.cross_entropy' op result type 'tensor<f16>' does not match the expected 'tensor<bf16>'}}
  %0 = ptc.cross_entropy %l, %t : tensor<8x256xbf16>, tensor<8xi32> -> tensor<f16>
  return %0 : tensor<f16>
}

// -----

func.func @cross_entropy_narrower_result(%l: tensor<8x256xf32>, %t: tensor<8xi32>) -> tensor<bf16> {
  // expected-error @+1 {{'ptc.cross_entropy' op result type 'tensor<bf16>' does not match the expected 'tensor<f32>'}}
  %0 = ptc.cross_entropy %l, %t : tensor<8x256xf32>, tensor<8xi32> -> tensor<bf16>
  return %0 : tensor<bf16>
}

// -----

func.func @cross_entropy_grad_seed(%l: tensor<8x256xbf16>, %t: tensor<8xi32>, %g: tensor<f16>) -> tensor<8x256xbf16> {
  // expected-error @+1 {{'ptc.cross_entropy_grad' op grad type 'tensor<f16>' does not match the expected 'tensor<bf16>'}}
  %0 = ptc.cross_entropy_grad %l, %t, %g : tensor<8x256xbf16>, tensor<8xi32>, tensor<f16>
  return %0 : tensor<8x256xbf16>
}

// -----

func.func @reshape_count(%x: tensor<8x64xf32>) -> tensor<8x63xf32> {
  // expected-error @+1 {{'ptc.reshape' op cannot reshape 8x64 (512 elements) to 8x63 (504 elements)}}
  %0 = ptc.reshape %x : tensor<8x64xf32> -> tensor<8x63xf32>
  return %0 : tensor<8x63xf32>
}

// -----

func.func @reshape_element_type(%x: tensor<8x64xf32>) -> tensor<512xi32> {
  // expected-error @+1 {{'ptc.reshape' op requires the same element type for all operands and results}}
  %0 = ptc.reshape %x : tensor<8x64xf32> -> tensor<512xi32>
  return %0 : tensor<512xi32>
}

// -----

func.func @transpose_permutation(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  // expected-error @+1 {{'ptc.transpose' op permutation [0, 0, 1] is not a permutation of the 3 input dimensions}}
  %0 = ptc.transpose %x permutation = [0, 0, 1] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %0 : tensor<2x3x4xf32>
}

// -----

func.func @transpose_result(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  // expected-error @+1 {{'ptc.transpose' op result type 'tensor<2x3x4xf32>' does not match the expected 'tensor<2x4x3xf32>'}}
  %0 = ptc.transpose %x permutation = [0, 2, 1] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %0 : tensor<2x3x4xf32>
}

// -----

func.func @slice_rank(%x: tensor<8x64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'ptc.slice' op result rank 1 differs from input rank 2}}
  %0 = ptc.slice %x offsets = [0, 0] : tensor<8x64xf32> -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

func.func @slice_offsets(%x: tensor<8x64xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{'ptc.slice' op expected 2 offsets, got 1}}
  %0 = ptc.slice %x offsets = [0] : tensor<8x64xf32> -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

func.func @slice_bounds(%x: tensor<8x64xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{'ptc.slice' op slice of dimension 1 (offset 40, size 32) exceeds its size 64}}
  %0 = ptc.slice %x offsets = [0, 40] : tensor<8x64xf32> -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

// An offset whose end overflows int64 (was accepted: offset + size wrapped
// negative and the run read outside the tensor).
func.func @slice_offset_overflow(%x: tensor<8x96xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{'ptc.slice' op slice of dimension 1 (offset 9223372036854775800, size 32) exceeds its size 96}}
  %0 = ptc.slice %x offsets = [0, 9223372036854775800] : tensor<8x96xf32> -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

func.func @pad_offset_overflow(%x: tensor<8x32xf32>) -> tensor<8x96xf32> {
  // expected-error @+1 {{'ptc.pad' op padded region of dimension 1 (offset 9223372036854775800, size 32) exceeds the result size 96}}
  %0 = ptc.pad %x offsets = [0, 9223372036854775800] : tensor<8x32xf32> -> tensor<8x96xf32>
  return %0 : tensor<8x96xf32>
}

// -----

// Zero-size dimensions: refused by the types of every ptc op (a matmul weight
// of 0 rows divided by zero in autodiff) ...
func.func @zero_size_dimension(%x: tensor<4x0xf32>, %w: tensor<0x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'ptc.matmul' op operand #0 must be statically shaped tensor without zero-size dimensions of 32-bit float or bfloat16 type or 16-bit float values, but got 'tensor<4x0xf32>'}}
  %0 = ptc.matmul %x, %w : tensor<4x0xf32>, tensor<0x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// ... and by an argument's role, even where no op reads it.
// expected-error @+1 {{argument #0 ('w') has a zero-size dimension, 'tensor<0x4xf32>': ptc tensors are never empty}}
func.func @zero_size_parameter(%w: tensor<0x4xf32> {ptc.param = "w"}) {
  return
}

// -----

func.func @concat_empty() -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.concat' op expected 1 or more operands, but found 0}}
  %0 = "ptc.concat"() {axis = 0 : i64} : () -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @concat_axis(%a: tensor<4x3xf32>) -> tensor<4x6xf32> {
  // expected-error @+1 {{'ptc.concat' op axis 2 is out of range for rank 2}}
  %0 = ptc.concat %a, %a axis = 2 : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

func.func @concat_input_rank(%a: tensor<4x3xf32>, %b: tensor<12xf32>) -> tensor<4x6xf32> {
  // expected-error @+1 {{'ptc.concat' op input #1 has rank 1, expected 2}}
  %0 = ptc.concat %a, %b axis = 1 : tensor<4x3xf32>, tensor<12xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

func.func @concat_input_size(%a: tensor<4x3xf32>, %b: tensor<5x3xf32>) -> tensor<4x6xf32> {
  // expected-error @+1 {{'ptc.concat' op input #1 has size 5 in dimension 0, expected 4}}
  %0 = ptc.concat %a, %b axis = 1 : tensor<4x3xf32>, tensor<5x3xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

func.func @concat_result(%a: tensor<4x3xf32>) -> tensor<4x7xf32> {
  // expected-error @+1 {{'ptc.concat' op result type 'tensor<4x7xf32>' does not match the expected 'tensor<4x6xf32>'}}
  %0 = ptc.concat %a, %a axis = -1 : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x7xf32>
  return %0 : tensor<4x7xf32>
}

// -----

func.func @reduce_axis(%x: tensor<8x64xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.reduce_sum' op axis 2 is out of range for rank 2}}
  %0 = ptc.reduce_sum %x axes = [2] : tensor<8x64xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @reduce_twice(%x: tensor<8x64xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.reduce_max' op axis -1 is reduced twice}}
  %0 = ptc.reduce_max %x axes = [1, -1] : tensor<8x64xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @reduce_result(%x: tensor<8x64xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.reduce_mean' op result type 'tensor<8xf32>' does not match the expected 'tensor<8x1xf32>'}}
  %0 = ptc.reduce_mean %x axes = [1] {keep_dims = true} : tensor<8x64xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @top_k_rank(%l: tensor<4xf32>) -> tensor<1xf32> {
  // expected-error @+1 {{'ptc.top_k_gate' op logits must have shape [tokens, experts] or [groups, tokens, experts], got rank 1}}
  %w, %e = ptc.top_k_gate %l {k = 1 : i64} : tensor<4xf32> -> tensor<1xf32>, tensor<1xi32>
  return %w : tensor<1xf32>
}

// -----

func.func @top_k_k(%l: tensor<16x4xf32>) -> tensor<16x5xf32> {
  // expected-error @+1 {{'ptc.top_k_gate' op k = 5 must be in [1, 4] (the number of experts)}}
  %w, %e = ptc.top_k_gate %l {k = 5 : i64} : tensor<16x4xf32> -> tensor<16x5xf32>, tensor<16x5xi32>
  return %w : tensor<16x5xf32>
}

// -----

func.func @top_k_weights(%l: tensor<16x4xf32>) -> tensor<16x2xbf16> {
  // expected-error @+1 {{'ptc.top_k_gate' op weights must be 'tensor<16x2xf32>', got 'tensor<16x2xbf16>'}}
  %w, %e = ptc.top_k_gate %l {k = 2 : i64} : tensor<16x4xf32> -> tensor<16x2xbf16>, tensor<16x2xi32>
  return %w : tensor<16x2xbf16>
}

// -----

func.func @top_k_indices(%l: tensor<16x4xf32>) -> tensor<16x2xf32> {
  // expected-error @+1 {{'ptc.top_k_gate' op indices must have shape 16x2, got 16x1}}
  %w, %e = ptc.top_k_gate %l {k = 2 : i64} : tensor<16x4xf32> -> tensor<16x2xf32>, tensor<16x1xi32>
  return %w : tensor<16x2xf32>
}

// -----

func.func @dispatch_input(%x: tensor<16xf32>, %e: tensor<16x2xi32>) -> tensor<4x8x1xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch' op input must have shape [tokens, dim] or [groups, tokens, dim], got rank 1}}
  %0 = ptc.moe_dispatch %x, %e : tensor<16xf32>, tensor<16x2xi32> -> tensor<4x8x1xf32>
  return %0 : tensor<4x8x1xf32>
}

// -----

func.func @dispatch_indices(%x: tensor<16x32xf32>, %e: tensor<8x2xi32>) -> tensor<4x8x32xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch' op indices must have shape [16, k], got 8x2}}
  %0 = ptc.moe_dispatch %x, %e : tensor<16x32xf32>, tensor<8x2xi32> -> tensor<4x8x32xf32>
  return %0 : tensor<4x8x32xf32>
}

// -----

func.func @dispatch_result(%x: tensor<16x32xf32>, %e: tensor<16x2xi32>) -> tensor<4x8x16xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch' op result must have shape [experts, capacity, 32], got 4x8x16}}
  %0 = ptc.moe_dispatch %x, %e : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<4x8x16xf32>
  return %0 : tensor<4x8x16xf32>
}

// -----

func.func @dispatch_capacity(%x: tensor<16x32xf32>, %e: tensor<16x2xi32>) -> tensor<4x0x32xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch' op result #0 must be statically shaped tensor without zero-size dimensions of 32-bit float or bfloat16 type or 16-bit float values, but got 'tensor<4x0x32xf32>'}}
  %0 = ptc.moe_dispatch %x, %e : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<4x0x32xf32>
  return %0 : tensor<4x0x32xf32>
}

// -----

func.func @dispatch_element_type(%x: tensor<16x32xf32>, %e: tensor<16x2xi32>) -> tensor<4x8x32xbf16> {
  // expected-error @+1 {{'ptc.moe_dispatch' op result element type 'bf16' differs from input element type 'f32'}}
  %0 = ptc.moe_dispatch %x, %e : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<4x8x32xbf16>
  return %0 : tensor<4x8x32xbf16>
}

// -----

func.func @combine_experts(%o: tensor<4x8xf32>, %w: tensor<16x2xf32>, %e: tensor<16x2xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{'ptc.moe_combine' op expert_output must have shape [experts, capacity, dim], got 4x8}}
  %0 = ptc.moe_combine %o, %w, %e : tensor<4x8xf32>, tensor<16x2xf32>, tensor<16x2xi32> -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

func.func @combine_weights(%o: tensor<4x8x32xf32>, %w: tensor<32xf32>, %e: tensor<32xi32>) -> tensor<16x32xf32> {
  // expected-error @+1 {{'ptc.moe_combine' op indices must have shape [tokens, k] or [groups, tokens, k], got 32}}
  %0 = ptc.moe_combine %o, %w, %e : tensor<4x8x32xf32>, tensor<32xf32>, tensor<32xi32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

func.func @combine_indices(%o: tensor<4x8x32xf32>, %w: tensor<16x2xf32>, %e: tensor<16x1xi32>) -> tensor<16x32xf32> {
  // expected-error @+1 {{'ptc.moe_combine' op indices shape 16x1 differs from weights shape 16x2}}
  %0 = ptc.moe_combine %o, %w, %e : tensor<4x8x32xf32>, tensor<16x2xf32>, tensor<16x1xi32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

func.func @combine_element_type(%o: tensor<4x8x32xf32>, %w: tensor<16x2xf16>, %e: tensor<16x2xi32>) -> tensor<16x32xf32> {
  // expected-error @+1 {{'ptc.moe_combine' op weights element type 'f16' differs from expert_output element type 'f32'}}
  %0 = ptc.moe_combine %o, %w, %e : tensor<4x8x32xf32>, tensor<16x2xf16>, tensor<16x2xi32> -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

func.func @combine_result(%o: tensor<4x8x32xf32>, %w: tensor<16x2xf32>, %e: tensor<16x2xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{'ptc.moe_combine' op result type 'tensor<16x8xf32>' does not match the expected 'tensor<16x32xf32>'}}
  %0 = ptc.moe_combine %o, %w, %e : tensor<4x8x32xf32>, tensor<16x2xf32>, tensor<16x2xi32> -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

func.func @convert_shape(%x: tensor<4x8xf32>) -> tensor<8x4xbf16> {
  // expected-error @+1 {{'ptc.convert' op requires the same shape for all operands and results}}
  %0 = ptc.convert %x : tensor<4x8xf32> -> tensor<8x4xbf16>
  return %0 : tensor<8x4xbf16>
}

// -----

// Function argument attributes.

// expected-error @+1 {{unknown ptc argument attribute 'ptc.weight' on argument #0}}
func.func @unknown_arg_attr(%w: tensor<4xf32> {ptc.weight = "w"}) {
  return
}

// -----

// expected-error @+1 {{'ptc.param' on argument #0 must be a non-empty string}}
func.func @param_not_string(%w: tensor<4xf32> {ptc.param = 3 : i64}) {
  return
}

// -----

// expected-error @+1 {{'ptc.input' on argument #0 must be a non-empty string}}
func.func @input_empty(%x: tensor<4xi32> {ptc.input = ""}) {
  return
}

// -----

// expected-error @+1 {{argument #0 ('w') must be a statically shaped tensor, got 'tensor<?xf32>'}}
func.func @param_dynamic(%w: tensor<?xf32> {ptc.param = "w"}) {
  return
}

// -----

// expected-error @+1 {{parameter 'ids' must have a floating-point element type, got 'i32'}}
func.func @param_int(%w: tensor<4xi32> {ptc.param = "ids"}) {
  return
}

// -----

// expected-error @+1 {{tensor name 'w' is used by arguments #0 and #2}}
func.func @duplicate_names(%a: tensor<4xf32> {ptc.param = "w"}, %b: tensor<4xf32> {ptc.param = "v"}, %c: tensor<4xi32> {ptc.input = "w"}) {
  return
}

// -----

// Routing groups: the result's group dimension must be the indices' groups.
func.func @dispatch_groups(%x: tensor<4x16x32xf32>, %e: tensor<4x16x2xi32>) -> tensor<8x2x5x32xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch' op result must have shape [experts, 4, capacity, 32], got 8x2x5x32}}
  %0 = ptc.moe_dispatch %x, %e : tensor<4x16x32xf32>, tensor<4x16x2xi32> -> tensor<8x2x5x32xf32>
  return %0 : tensor<8x2x5x32xf32>
}

// -----

func.func @expert_load_result(%e: tensor<4x16x2xi32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.expert_load' op result must have shape [4, experts], got 8}}
  %0 = ptc.expert_load %e : tensor<4x16x2xi32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A fused projection's width must be (heads + 2 kv_heads) * head_dim.
func.func @attention_qkv_width(%qkv: tensor<2x16x40xf32>) -> tensor<2x16x4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention_qkv' op expects qkv's last dimension 40 to be (4 heads + 2 * kv_heads) * 8 with kv_heads dividing the heads}}
  %0 = ptc.causal_attention_qkv %qkv {scale = 0.5 : f64} : tensor<2x16x40xf32> -> tensor<2x16x4x8xf32>
  return %0 : tensor<2x16x4x8xf32>
}

// -----

func.func @attention_qkv_rank(%qkv: tensor<32x64xf32>) -> tensor<2x16x4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention_qkv' op expects qkv of rank 3 and a result of rank 4, got 'tensor<32x64xf32>' and 'tensor<2x16x4x8xf32>'}}
  %0 = ptc.causal_attention_qkv %qkv {scale = 0.5 : f64} : tensor<32x64xf32> -> tensor<2x16x4x8xf32>
  return %0 : tensor<2x16x4x8xf32>
}

// -----

func.func @attention_qkv_element_type(%qkv: tensor<2x16x64xbf16>) -> tensor<2x16x4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention_qkv' op expects qkv and the result to have one element type, got 'tensor<2x16x64xbf16>' and 'tensor<2x16x4x8xf32>'}}
  %0 = ptc.causal_attention_qkv %qkv {scale = 0.5 : f64} : tensor<2x16x64xbf16> -> tensor<2x16x4x8xf32>
  return %0 : tensor<2x16x4x8xf32>
}

// -----

func.func @attention_qkv_grad_batch(%qkv: tensor<2x16x64xf32>, %g: tensor<2x8x4x8xf32>) -> tensor<2x16x64xf32> {
  // expected-error @+1 {{'ptc.causal_attention_qkv_grad' op expects the gradient's batch and sequence (2, 8) to be qkv's (2, 16)}}
  %0 = ptc.causal_attention_qkv_grad %qkv, %g {scale = 0.5 : f64} : tensor<2x16x64xf32>, tensor<2x8x4x8xf32>
  return %0 : tensor<2x16x64xf32>
}

// -----

func.func @nonfinite_check_nothing() -> tensor<f32> {
  // expected-error @+1 {{'ptc.any_nonfinite' op needs at least one tensor to check, or mesh axes whose flag it joins}}
  %0 = "ptc.any_nonfinite"() : () -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// Dropout's probability must be in [0, 1).
func.func @dropout_p(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.dropout' op p must be in [0, 1), got 1}}
  %0 = ptc.dropout %x {p = 1.0 : f64, stream = 0 : i64} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Its stream must fit the generator's 32-bit counter word.
func.func @dropout_stream(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.dropout' op stream must be in [0, 2^31), got -1}}
  %0 = ptc.dropout %x {p = 0.5 : f64, stream = -1 : i64} : tensor<4xf32>
  return %0 : tensor<4xf32>
}
