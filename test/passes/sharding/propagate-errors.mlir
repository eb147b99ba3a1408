// Each phase's errors on its own.
// RUN: not ptc-opt %s -split-input-file --ptc-partition 2>&1 | FileCheck %s --check-prefix=UNPROPAGATED
// RUN: ptc-opt %s -split-input-file --ptc-propagate-sharding="mesh=dp:2,ep:2" 2>/dev/null | FileCheck %s --check-prefix=COMPOUND
// RUN: ptc-opt %s -split-input-file --ptc-propagate-sharding="mesh=dp:2,ep:2" 2>/dev/null | ptc-opt -split-input-file --ptc-partition | FileCheck %s --check-prefix=ENTRY

// ptc-partition on a step propagation has not annotated: an error naming
// the first value without a sharding.
// UNPROPAGATED: error: 'x' has no propagated sharding (run ptc-propagate-sharding first)
//
// A batch split over dp*ep (expert parallelism carved out of dp): the plan
// loads dp's rows, and every user reads the rows of its ep rank, a compound
// axis written by its mesh axes.
// COMPOUND: ptc.reshard_on_entry = #ptc.sharding<["dp*ep", _]>, ptc.sharding = #ptc.sharding<[dp, _]>
// COMPOUND: ptc.operand_shardings = [#ptc.sharding<["dp*ep", _]>]
// ENTRY: %arg0: tensor<4x4xf32> {ptc.input = "x", ptc.sharding = #ptc.sharding<[dp, _]>}
// ENTRY-NEXT: ptc.shard_slice %arg0 {axes = ["ep"], dim = 0 : i64{{.*}} : tensor<4x4xf32> -> tensor<2x4xf32>
module attributes {ptc.mesh = {axes = ["dp", "ep"], shape = array<i64: 2, 2>}} {
  func.func @rows(%x: tensor<8x4xf32> {ptc.input = "x"}) -> tensor<f32> {
    %l = ptc.reduce_mean %x axes = [0, 1] : tensor<8x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
