// ptc-propagate-sharding alone: every value gets its sharding, nothing is
// rewritten (global types, no collectives). ptc-partition then carries the
// decisions out, from the IR text alone; the two in a row are ptc-shard.
// RUN: ptc-opt %s -split-input-file --ptc-propagate-sharding="mesh=dp:2,tp:2" | FileCheck %s
// RUN: ptc-opt %s -split-input-file --ptc-propagate-sharding="mesh=dp:2,tp:2" | ptc-opt -split-input-file --ptc-partition | FileCheck %s --check-prefix=PART
// (The causes name source locations, which differ between the two.)
// RUN: ptc-opt %s -split-input-file --ptc-propagate-sharding="mesh=dp:2,tp:2" | ptc-opt -split-input-file --ptc-partition | sed 's/ptc.cause = "[^"]*"//' > %t.phases
// RUN: ptc-opt %s -split-input-file --ptc-shard="mesh=dp:2,tp:2" | sed 's/ptc.cause = "[^"]*"//' > %t.shard
// RUN: diff %t.phases %t.shard

// Megatron's MLP: column- then row-parallel. The row-parallel product is a
// partial sum over tp; the mean over the dp-split batch a partial sum over dp
// too, rescaled by 1/2.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %arg0: tensor<8x16xf32> {ptc.input = "x", ptc.sharding = #ptc.sharding<[dp, _]>}
// CHECK-SAME: %arg1: tensor<16x32xf32> {ptc.param = "fc1.weight", ptc.sharding = #ptc.sharding<[_, tp]>}
// CHECK-NOT: ptc.all_reduce
// CHECK: ptc.matmul %arg0, %arg1 {ptc.operand_shardings = [#ptc.sharding<[dp, _]>, #ptc.sharding<[_, tp]>], ptc.sharding_origins = ["propagated"], ptc.shardings = [#ptc.sharding<[dp, tp]>]} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
// CHECK: ptc.gelu {{.*}}ptc.shardings = [#ptc.sharding<[dp, tp]>]} : tensor<8x32xf32>
// CHECK: ptc.matmul {{.*}}ptc.shardings = [#ptc.sharding<[dp, _], partial(tp)>]} : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
// CHECK: ptc.reduce_mean {{.*}}ptc.result_scales = array<f64: 5.000000e-01>, {{.*}}ptc.shardings = [#ptc.sharding<[], partial(dp, tp)>]}
// CHECK-NOT: ptc.all_reduce
// CHECK: return

// PART-LABEL: func.func @mlp
// PART-SAME: %arg0: tensor<4x16xf32>
// PART: ptc.matmul {{.*}} : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
// PART: %[[M:.+]] = ptc.reduce_mean
// PART: %[[S:.+]] = ptc.scale %[[M]] by 5.000000e-01
// PART: ptc.all_reduce %[[S]] {axes = ["dp", "tp"]
// PART-NOT: ptc.operand_shardings
func.func @mlp(%x: tensor<8x16xf32> {ptc.input = "x"},
               %w1: tensor<16x32xf32> {ptc.param = "fc1.weight", ptc.sharding = "[_, tp]"},
               %w2: tensor<32x16xf32> {ptc.param = "fc2.weight", ptc.sharding = "[tp, _]"}) -> tensor<f32> {
  %h = ptc.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %a = ptc.gelu %h : tensor<8x32xf32>
  %y = ptc.matmul %a, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  %l = ptc.reduce_mean %y axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A user annotation on a result is recorded as a reshard right after the op
// (on the rescaled value); its users' rules see the annotated sharding.
// CHECK-LABEL: func.func @annotated_result
// CHECK: ptc.gelu {{.*}}ptc.reshard_results = [{result = 0 : i64, scaled, to = #ptc.sharding<[_, _]>, why = "a user annotation"}]{{.*}}ptc.shardings = [#ptc.sharding<[dp, _]>]
// CHECK: ptc.relu {{.*}}ptc.operand_shardings = [#ptc.sharding<[_, _]>]
// PART-LABEL: func.func @annotated_result
// PART: %[[G:.+]] = ptc.gelu
// PART-NEXT: %[[W:.+]] = ptc.all_gather %[[G]]
// PART-NEXT: ptc.relu %[[W]]
func.func @annotated_result(%x: tensor<4x4xf32> {ptc.input = "x"}) -> tensor<4x4xf32> {
  %g = ptc.gelu %x {ptc.sharding = ["[_, _]"]} : tensor<4x4xf32>
  %0 = ptc.relu %g : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
