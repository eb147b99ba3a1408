// Every diagnostic of the mesh attribute and the collective verifiers.
// RUN: ptc-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'ptc.mesh' must be {axes = [names...], shape = array<i64: sizes...>} with one size per axis}}
module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2, 2>}} {
}

// -----

// expected-error @+1 {{mesh axis 'dp' appears twice}}
module attributes {ptc.mesh = {axes = ["dp", "dp"], shape = array<i64: 2, 2>}} {
}

// -----

// expected-error @+1 {{mesh axis 'tp' has size 0; sizes must be at least 1}}
module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 0>}} {
}

// -----

// expected-error @+1 {{mesh axis names must be non-empty and not '_'}}
module attributes {ptc.mesh = {axes = ["_"], shape = array<i64: 2>}} {
}

// -----

// expected-error @+1 {{the mesh needs at least one axis}}
module attributes {ptc.mesh = {axes = [], shape = array<i64>}} {
}

// -----

module {
  // expected-error @+1 {{'ptc.mesh' belongs on the module}}
  func.func @f() attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
    return
  }
}

// -----

module {
  func.func @no_mesh(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'ptc.all_reduce' op needs a 'ptc.mesh' on the enclosing module}}
    %0 = ptc.all_reduce %x {axes = ["dp"]} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @unknown_axis(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'ptc.all_reduce' op axis 'tp' is not in the module's mesh}}
    %0 = ptc.all_reduce %x {axes = ["tp"]} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @no_axes(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'ptc.all_reduce' op needs mesh axes}}
    %0 = ptc.all_reduce %x {axes = []} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @types(%x: tensor<4xf32>) -> tensor<2xf32> {
    // expected-error @+1 {{'ptc.all_reduce' op results must have the operand types}}
    %0 = ptc.all_reduce %x {axes = ["dp"]} : (tensor<4xf32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @empty() {
    // expected-error @+1 {{'ptc.all_reduce' op needs at least one operand}}
    ptc.all_reduce {axes = ["dp"]} : () -> ()
    return
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
  func.func @gather_axes(%x: tensor<4xf32>) -> tensor<16xf32> {
    // expected-error @+1 {{'ptc.all_gather' op needs exactly one mesh axis}}
    %0 = ptc.all_gather %x {axes = ["dp", "tp"], dim = 0 : i64} : tensor<4xf32> -> tensor<16xf32>
    return %0 : tensor<16xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @gather_shape(%x: tensor<4xf32>) -> tensor<12xf32> {
    // expected-error @+1 {{'ptc.all_gather' op the gathered tensor must be 2 blocks along dim 0 of the local one, got 'tensor<12xf32>' and 'tensor<4xf32>'}}
    %0 = ptc.all_gather %x {axes = ["tp"], dim = 0 : i64} : tensor<4xf32> -> tensor<12xf32>
    return %0 : tensor<12xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @gather_dim(%x: tensor<4xf32>) -> tensor<8xf32> {
    // expected-error @+1 {{'ptc.all_gather' op dim 1 is out of range, or the ranks differ}}
    %0 = ptc.all_gather %x {axes = ["tp"], dim = 1 : i64} : tensor<4xf32> -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @slice_blocks(%x: tensor<6xf32>) -> tensor<3xf32> {
    // expected-error @+1 {{'ptc.shard_slice' op blocks = 2 must divide the local size 3 of dim 0}}
    %0 = ptc.shard_slice %x {axes = ["tp"], dim = 0 : i64, blocks = 2 : i64} : tensor<6xf32> -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 4>}} {
  func.func @scatter_shape(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
    // expected-error @+1 {{'ptc.reduce_scatter' op the gathered tensor must be 4 blocks along dim 0 of the local one, got 'tensor<8x4xf32>' and 'tensor<4x4xf32>'}}
    %0 = ptc.reduce_scatter %x {axes = ["tp"], dim = 0 : i64} : tensor<8x4xf32> -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{argument #0: sharding "[tp, tp]" uses mesh axis 'tp' twice}}
  func.func @spec_twice(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = "[tp, tp]"}) {
    return
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{argument #0: sharding "[tp]" has 1 entries for a tensor of rank 2}}
  func.func @spec_rank(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = "[tp]"}) {
    return
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{argument #0: sharding "tp, _" must be written [axis or _, ...]}}
  func.func @spec_syntax(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = "tp, _"}) {
    return
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{argument #0: sharding "[tp/x, _]": block count in 'tp/x' must be a positive integer}}
  func.func @spec_blocks(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = "[tp/x, _]"}) {
    return
  }
}

// -----

// expected-error @+1 {{'ptc.sharding' on argument #0 must be a #ptc.sharding<[dp, _]> (or its text, "[dp, _]")}}
func.func @spec_type(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = 3 : i64}) {
  return
}

// -----

module {
  func.func @vocab_no_mesh(%t: tensor<16x8xf32>, %ids: tensor<4xi32>) -> tensor<4x8xf32> {
    // expected-error @+1 {{'ptc.embedding' op vocab_axis needs a 'ptc.mesh' on the enclosing module}}
    %0 = ptc.embedding %t, %ids {vocab_axis = "tp"} : tensor<16x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @vocab_axis(%ids: tensor<4xi32>, %g: tensor<4x8xf32>) -> tensor<16x8xf32> {
    // expected-error @+1 {{'ptc.embedding_grad' op vocab_axis 'tp' is not in the module's mesh}}
    %0 = ptc.embedding_grad %ids, %g {vocab_axis = "tp"} : tensor<4xi32>, tensor<4x8xf32> -> tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @vpce_result(%l: tensor<4x16xf32>, %t: tensor<4xi32>) -> tensor<bf16> {
    // expected-error @+1 {{'ptc.vocab_parallel_cross_entropy' op result type 'tensor<bf16>' does not match the expected 'tensor<f32>'}}
    %0 = ptc.vocab_parallel_cross_entropy %l, %t {axes = ["tp"]} : tensor<4x16xf32>, tensor<4xi32> -> tensor<bf16>
    return %0 : tensor<bf16>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @vpce_grad(%l: tensor<4x16xf32>, %t: tensor<4xi32>, %g: tensor<f16>) -> tensor<4x16xf32> {
    // expected-error @+1 {{'ptc.vocab_parallel_cross_entropy_grad' op grad type 'tensor<f16>' does not match the expected 'tensor<f32>'}}
    %0 = ptc.vocab_parallel_cross_entropy_grad %l, %t, %g {axes = ["tp"]} : tensor<4x16xf32>, tensor<4xi32>, tensor<f16>
    return %0 : tensor<4x16xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @vpce_shapes(%l: tensor<4x16xf32>, %t: tensor<8xi32>) -> tensor<f32> {
    // expected-error @+1 {{'ptc.vocab_parallel_cross_entropy' op dimension 0 differs: logits have 4, targets have 8}}
    %0 = ptc.vocab_parallel_cross_entropy %l, %t {axes = ["tp"]} : tensor<4x16xf32>, tensor<8xi32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @a2a_dims(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    // expected-error @+1 {{'ptc.all_to_all' op split_dim 1 and concat_dim 1 must be two different dimensions of the operand}}
    %0 = ptc.all_to_all %x {axes = ["tp"], split_dim = 1 : i64, concat_dim = 1 : i64} : tensor<4x8xf32> -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @a2a_shape(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    // expected-error @+1 {{'ptc.all_to_all' op result must be 2 times larger along concat_dim 0 and 2 times smaller along split_dim 1, got 'tensor<4x8xf32>' -> 'tensor<4x8xf32>'}}
    %0 = ptc.all_to_all %x {axes = ["tp"], split_dim = 1 : i64, concat_dim = 0 : i64} : tensor<4x8xf32> -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}

// -----

func.func @op_annotation(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.gelu' op 'ptc.sharding' needs one sharding (or `unit`: none) per result, e.g. [#ptc.sharding<[dp, _]>] (or ["[dp, _]"])}}
  %0 = ptc.gelu %x {ptc.sharding = "[dp]"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// The typed annotation is checked against the mesh like its text.
module attributes {ptc.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
  // expected-error @+1 {{argument #0: sharding [tp, tp] uses mesh axis 'tp' twice}}
  func.func @typed_twice(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[tp, tp]>}) {
    return
  }
}

// -----

module attributes {ptc.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
  // expected-error @+1 {{argument #0: sharding [ep, _] names 'ep', which is not a mesh axis}}
  func.func @typed_axis(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[ep, _]>}) {
    return
  }
}

// -----

// expected-error @+1 {{#ptc.sharding: 0 blocks of dimension split over 'tp' (blocks must be >= 1, and 1 for '_')}}
func.func @typed_blocks(%w: tensor<4x4xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[tp/0, _]>}) {
  return
}

// -----

// expected-error @+1 {{#ptc.action send needs a channel >= 0}}
func.func @action_channel() attributes {ptc.schedule = {actions = [[#ptc.action<send mb 0>]]}} {
  return
}

// -----

// expected-error @+1 {{unknown schedule action 'jump' (expected forward, backward, weight, send or recv)}}
func.func @action_kind() attributes {ptc.schedule = {actions = [[#ptc.action<jump chunk 0 mb 0>]]}} {
  return
}

// -----

module attributes {ptc.mesh = {axes = ["tp"], shape = array<i64: 2>}} {
  func.func @vpce_with_grad_loss(%l: tensor<4x16xf32>, %t: tensor<4xi32>, %g: tensor<f32>) -> tensor<4x16xf32> {
    // expected-error @+1 {{'ptc.vocab_parallel_cross_entropy_with_grad' op loss type 'tensor<f16>' does not match the expected 'tensor<f32>'}}
    %0, %1 = ptc.vocab_parallel_cross_entropy_with_grad %l, %t, %g {axes = ["tp"]} : tensor<4x16xf32>, tensor<4xi32>, tensor<f32> -> tensor<f16>
    return %0 : tensor<4x16xf32>
  }
}
