// RUN: ptc-opt %s -split-input-file --ptc-shard="mesh=dp:2" | FileCheck %s

// A split that moves from one dimension to another on the same axis is one
// all_to_all: y (an input, batch -> dp by default) must follow the annotated x.
// CHECK-LABEL: func.func @move_split
// CHECK-SAME: %[[X:.+]]: tensor<4x2xf32> {ptc.input = "x", ptc.sharding = #ptc.sharding<[_, dp]>}
// CHECK-SAME: %[[Y:.+]]: tensor<2x4xf32> {ptc.input = "y", ptc.sharding = #ptc.sharding<[dp, _]>}
// CHECK: %[[T:.+]] = ptc.all_to_all %[[Y]] {axes = ["dp"], concat_dim = 0 : i64, {{.*}}split_dim = 1 : i64} : tensor<2x4xf32> -> tensor<4x2xf32>
// CHECK: ptc.add %[[X]], %[[T]]
func.func @move_split(%x: tensor<4x4xf32> {ptc.input = "x", ptc.sharding = "[_, dp]"},
                      %y: tensor<4x4xf32> {ptc.input = "y"}) -> tensor<4x4xf32> {
  %0 = ptc.add %x, %y : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// The same with a typed annotation: the text form and #ptc.sharding are one.
// CHECK-LABEL: func.func @move_split_typed
// CHECK-SAME: %[[X:.+]]: tensor<4x2xf32> {ptc.input = "x", ptc.sharding = #ptc.sharding<[_, dp]>}
// CHECK: ptc.all_to_all
func.func @move_split_typed(%x: tensor<4x4xf32> {ptc.input = "x", ptc.sharding = #ptc.sharding<[_, dp]>},
                            %y: tensor<4x4xf32> {ptc.input = "y"}) -> tensor<4x4xf32> {
  %0 = ptc.add %x, %y : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// A mean over a split dimension is a partial sum rescaled by the shard count;
// the result is summed where a whole value is needed.
// CHECK-LABEL: func.func @mean
// CHECK: %[[M:.+]] = ptc.reduce_mean %{{.*}} axes = [0]
// CHECK: %[[S:.+]] = ptc.scale %[[M]] by 5.000000e-01
// CHECK: ptc.all_reduce %[[S]] {axes = ["dp"]
func.func @mean(%x: tensor<8x4xf32> {ptc.input = "x"}) -> tensor<4xf32> {
  %0 = ptc.reduce_mean %x axes = [0] : tensor<8x4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// An annotation on any value: the value is resharded right after it is computed
// (here gathered whole), and its consumers see the annotated sharding.
// CHECK-LABEL: func.func @value_annotation
// CHECK: %[[G:.+]] = ptc.gelu %arg0
// CHECK-NEXT: %[[W:.+]] = ptc.all_gather %[[G]] {axes = ["dp"], {{.*}}dim = 0 : i64{{.*}} : tensor<2x4xf32> -> tensor<4x4xf32>
// CHECK-NEXT: ptc.relu %[[W]] {ptc.sharding_origins = ["propagated"], ptc.shardings = [#ptc.sharding<[_, _]>]} : tensor<4x4xf32>
func.func @value_annotation(%x: tensor<4x4xf32> {ptc.input = "x"}) -> tensor<4x4xf32> {
  %g = ptc.gelu %x {ptc.sharding = ["[_, _]"]} : tensor<4x4xf32>
  %0 = ptc.relu %g : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
