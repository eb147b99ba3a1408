// RUN: ptc-opt %s -split-input-file --ptc-shard="mesh=dp:2,tp:2" -verify-diagnostics

// A dimension that the mesh axis does not divide.
// expected-error @+1 {{'x' dimension 0 (size 3) is not divisible by mesh axis 'dp' (size 2)}}
func.func @indivisible(%x: tensor<3x4xf32> {ptc.input = "x"}) -> tensor<3x4xf32> {
  %0 = ptc.relu %x : tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

// Two user annotations that disagree where they meet; notes point at both.
// expected-note @+2 {{'a' is annotated "[tp, _]"}}
// expected-note @+2 {{'b' is annotated "[_, tp]"}}
func.func @conflict(%a: tensor<4x4xf32> {ptc.param = "a", ptc.sharding = "[tp, _]"},
                    %b: tensor<4x4xf32> {ptc.param = "b", ptc.sharding = "[_, tp]"}) -> tensor<4x4xf32> {
  // expected-error @+1 {{'ptc.add' op conflicting sharding annotations meet here: [tp, _] from 'a' and [_, tp] from 'b'}}
  %0 = ptc.add %a, %b : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// An annotation naming an axis the mesh lacks.
// expected-error @+1 {{'w': sharding "[ep, _]" names 'ep', which is not a mesh axis}}
func.func @unknown_axis(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = "[ep, _]"}) -> tensor<4x4xf32> {
  return %w : tensor<4x4xf32>
}

// -----

// A block count that does not divide the dimension.
// expected-error @+1 {{'w' dimension 0 (size 6) is not divisible by mesh axis 'tp' (size 2) times its 2 blocks}}
func.func @blocks(%w: tensor<6x4xf32> {ptc.param = "w", ptc.sharding = "[tp/2, _]"}) -> tensor<6x4xf32> {
  return %w : tensor<6x4xf32>
}

// -----

// An annotated value conflicting with an annotated argument.
// expected-note @+1 {{'a' is annotated "[tp, _]"}}
func.func @value_conflict(%a: tensor<4x4xf32> {ptc.param = "a", ptc.sharding = "[tp, _]"},
                          %x: tensor<4x4xf32> {ptc.param = "x"}) -> tensor<4x4xf32> {
  // expected-note @+1 {{is annotated "[_, tp]"}}
  %g = ptc.gelu %x {ptc.sharding = ["[_, tp]"]} : tensor<4x4xf32>
  // expected-error @+1 {{'ptc.add' op conflicting sharding annotations meet here}}
  %0 = ptc.add %a, %g : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// Ops the compiler forms only after sharding have no sharding rule: a matmul
// with a bias (ptc-fuse-matmul-bias), seq-major attention
// (ptc-fold-attention-layout).
func.func @fused_bias(%x: tensor<4x8xf32> {ptc.input = "x"}, %w: tensor<6x8xf32> {ptc.param = "w"}, %b: tensor<6xf32> {ptc.param = "b"}) -> tensor<4x6xf32> {
  // expected-error @+1 {{'ptc.matmul' op with a bias has no sharding rule: ptc-fuse-matmul-bias forms it after sharding}}
  %0 = ptc.matmul %x, %w, %b {transpose_rhs = true} : tensor<4x8xf32>, tensor<6x8xf32>, tensor<6xf32> -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

func.func @seq_major(%q: tensor<2x8x4x4xf32> {ptc.input = "q"}) -> tensor<2x8x4x4xf32> {
  // expected-error @+1 {{'ptc.causal_attention' op with seq_major has no sharding rule: ptc-fold-attention-layout forms it after sharding}}
  %0 = ptc.causal_attention %q, %q, %q {seq_major = true} : tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>
  return %0 : tensor<2x8x4x4xf32>
}

// -----

func.func @attention_qkv(%qkv: tensor<2x8x48xf32> {ptc.input = "qkv"}) -> tensor<2x8x4x4xf32> {
  // expected-error @+1 {{'ptc.causal_attention_qkv' op has no sharding rule: ptc-fold-attention-layout forms it after sharding}}
  %0 = ptc.causal_attention_qkv %qkv {scale = 0.5 : f64} : tensor<2x8x48xf32> -> tensor<2x8x4x4xf32>
  return %0 : tensor<2x8x4x4xf32>
}
