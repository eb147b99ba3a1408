// A tensor whose element count overflows int64 (2^32 x 2^32 x 4 bytes) or
// exceeds the plan format's 2^40 elements per device is an error naming the
// type, not a wrapped size (getNumElements saturates; the arena planner checks).
// RUN: not ptc-opt %s --ptc-compile="plan=%t.plan optimizer=none" -o /dev/null 2>&1 | FileCheck %s
// CHECK: error: 'ptc.broadcast' op result of type 'tensor<4294967296x4294967296xf32>' has more than 2^40 elements on one device
func.func @train_step(%w: tensor<4294967296x4294967296xf32> {ptc.param = "w"}) -> tensor<f32> {
  %0 = ptc.reduce_sum %w axes = [0, 1] : tensor<4294967296x4294967296xf32> -> tensor<f32>
  return %0 : tensor<f32>
}
