// Round-trip of the collectives and the mesh attribute.
// RUN: ptc-opt %s | ptc-opt | FileCheck %s
// RUN: ptc-opt %s --mlir-print-op-generic | ptc-opt | FileCheck %s

// CHECK: module attributes {ptc.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 4>}}
module attributes {ptc.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 4>}} {
  // A typed sharding round-trips, blocks and partial sums included; its text
  // form (the string) is accepted as it is.
  // CHECK-LABEL: func.func @typed
  // CHECK-SAME: ptc.sharding = #ptc.sharding<[tp/3, _]>
  // CHECK-SAME: ptc.sharding = "[dp, _]"
  // CHECK: ptc.sharding = [#ptc.sharding<[dp, _], partial(tp)>]
  func.func @typed(%w: tensor<24x8xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[tp/3, _]>},
                   %x: tensor<4x8xf32> {ptc.input = "x", ptc.sharding = "[dp, _]"}) -> tensor<4x8xf32> {
    %y = ptc.scale %x by 2.0 {ptc.sharding = [#ptc.sharding<[dp, _], partial(tp)>]} : tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }

  // Schedule actions round-trip.
  // CHECK-LABEL: func.func @scheduled
  // CHECK-SAME: ptc.schedule = {actions = {{\[\[}}#ptc.action<forward chunk 0 mb 1>, #ptc.action<send channel 2 mb 1>], [#ptc.action<recv channel 0 mb -1>]]
  func.func @scheduled() attributes {ptc.schedule = {actions = [[#ptc.action<forward chunk 0 mb 1>, #ptc.action<send channel 2 mb 1>], [#ptc.action<recv mb -1 channel 0>]]}} {
    return
  }

  // CHECK-LABEL: func.func @collectives
  // CHECK-SAME: {ptc.param = "w", ptc.sharding = "[tp/3, _]"}
  func.func @collectives(%w: tensor<24x8xf32> {ptc.param = "w", ptc.sharding = "[tp/3, _]"},
                         %x: tensor<4x8xf32>, %g: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<16x8xf32>, tensor<4x2xf32>, tensor<1x8xf32>) {
    // CHECK: ptc.all_reduce %{{.*}}, %{{.*}} {axes = ["dp"]} : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
    %a, %b = ptc.all_reduce %x, %g {axes = ["dp"]} : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>)
    // CHECK: ptc.all_gather %{{.*}} {axes = ["tp"], dim = 0 : i64} : tensor<4x8xf32> -> tensor<16x8xf32>
    %c = ptc.all_gather %a {axes = ["tp"], dim = 0 : i64} : tensor<4x8xf32> -> tensor<16x8xf32>
    // CHECK: ptc.shard_slice %{{.*}} {axes = ["tp"], blocks = 2 : i64, dim = 1 : i64} : tensor<4x8xf32> -> tensor<4x2xf32>
    %d = ptc.shard_slice %a {axes = ["tp"], dim = 1 : i64, blocks = 2 : i64} : tensor<4x8xf32> -> tensor<4x2xf32>
    // CHECK: ptc.all_to_all %{{.*}} {axes = ["tp"], concat_dim = 0 : i64, split_dim = 1 : i64} : tensor<4x8xf32> -> tensor<16x2xf32>
    %f = ptc.all_to_all %a {axes = ["tp"], split_dim = 1 : i64, concat_dim = 0 : i64} : tensor<4x8xf32> -> tensor<16x2xf32>
    // CHECK: ptc.reduce_scatter %{{.*}} {axes = ["tp"], dim = 0 : i64} : tensor<4x8xf32> -> tensor<1x8xf32>
    %e = ptc.reduce_scatter %a {axes = ["tp"], dim = 0 : i64} : tensor<4x8xf32> -> tensor<1x8xf32>
    return %a, %b, %c, %d, %e : tensor<4x8xf32>, tensor<8xf32>, tensor<16x8xf32>, tensor<4x2xf32>, tensor<1x8xf32>
  }

  // CHECK-LABEL: func.func @vocab_parallel
  func.func @vocab_parallel(%t: tensor<16x8xf32>, %ids: tensor<4x6xi32>, %l: tensor<4x6x16xf32>, %g: tensor<f32>, %d: tensor<4x6x8xf32>)
      -> (tensor<4x6x8xf32>, tensor<16x8xf32>, tensor<f32>, tensor<4x6x16xf32>) {
    // CHECK: ptc.embedding %{{.*}}, %{{.*}} {vocab_axis = "tp"} : tensor<16x8xf32>, tensor<4x6xi32> -> tensor<4x6x8xf32>
    %0 = ptc.embedding %t, %ids {vocab_axis = "tp"} : tensor<16x8xf32>, tensor<4x6xi32> -> tensor<4x6x8xf32>
    // CHECK: ptc.embedding_grad %{{.*}}, %{{.*}} {vocab_axis = "tp"} : tensor<4x6xi32>, tensor<4x6x8xf32> -> tensor<16x8xf32>
    %1 = ptc.embedding_grad %ids, %d {vocab_axis = "tp"} : tensor<4x6xi32>, tensor<4x6x8xf32> -> tensor<16x8xf32>
    // CHECK: ptc.vocab_parallel_cross_entropy %{{.*}}, %{{.*}} {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32> -> tensor<f32>
    %2 = ptc.vocab_parallel_cross_entropy %l, %ids {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32> -> tensor<f32>
    // CHECK: ptc.vocab_parallel_cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32>, tensor<f32>
    %3 = ptc.vocab_parallel_cross_entropy_grad %l, %ids, %g {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32>, tensor<f32>
    // CHECK: ptc.vocab_parallel_cross_entropy_with_grad %{{.*}}, %{{.*}}, %{{.*}} {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32>, tensor<f32> -> tensor<f32>
    %4, %5 = ptc.vocab_parallel_cross_entropy_with_grad %l, %ids, %g {axes = ["tp"]} : tensor<4x6x16xf32>, tensor<4x6xi32>, tensor<f32> -> tensor<f32>
    return %0, %1, %2, %3 : tensor<4x6x8xf32>, tensor<16x8xf32>, tensor<f32>, tensor<4x6x16xf32>
  }
}
