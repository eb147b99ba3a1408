// RUN: ptc-opt %s -split-input-file --ptc-plan-memory=report=true | FileCheck %s

// A chain of four 1 KiB temporaries needs two buffers: each result reuses
// the buffer of the value that died one op earlier, never its own operand's.
// CHECK: ptc-plan-memory @chain: 4 buffers, arena 2048 bytes (4096 without reuse)
// CHECK-LABEL: func.func @chain
// CHECK-SAME: attributes {ptc.arena_bytes = 2048 : i64, ptc.arena_bytes_unshared = 4096 : i64}
// CHECK: ptc.relu %arg0 {ptc.offsets = array<i64: 0>}
// CHECK: ptc.gelu %{{.*}} {ptc.offsets = array<i64: 1024>}
// CHECK: ptc.relu %{{.*}} {ptc.offsets = array<i64: 0>}
// CHECK: ptc.gelu %{{.*}} {ptc.offsets = array<i64: 1024>}
func.func @chain(%a: tensor<256xf32>) -> tensor<256xf32> {
  %0 = ptc.relu %a : tensor<256xf32>
  %1 = ptc.gelu %0 : tensor<256xf32>
  %2 = ptc.relu %1 : tensor<256xf32>
  %3 = ptc.gelu %2 : tensor<256xf32>
  return %3 : tensor<256xf32>
}

// -----

// A value used late stays live: %0 is read by the last op, so nothing else
// may take its buffer; constants and in-place updates are not in the arena.
// Buffers are 64-byte aligned.
// CHECK: ptc-plan-memory @long_lived: 2 buffers, arena 128 bytes (128 without reuse)
// CHECK-LABEL: func.func @long_lived
// CHECK: arith.constant
// CHECK-NOT: ptc.offsets
// CHECK: ptc.relu %arg0 {ptc.offsets = array<i64: [[A:[0-9]+]]>}
// CHECK: ptc.add %arg1, %{{.*}} {ptc.offsets = array<i64: -1>}
// CHECK-NOT: array<i64: [[A]]>
// CHECK: ptc.add {{.*}} {ptc.offsets = array<i64: {{[0-9]+}}>}
func.func @long_lived(%a: tensor<4xf32>, %s: tensor<f32> {ptc.state = "optimizer.step"})
    -> (tensor<4xf32>, tensor<f32> {ptc.update = "optimizer.step"}) {
  %one = arith.constant dense<1.0> : tensor<f32>
  %0 = ptc.relu %a : tensor<4xf32>
  %s1 = ptc.add %s, %one : tensor<f32>, tensor<f32> -> tensor<f32>
  %1 = ptc.add %0, %0 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %1, %s1 : tensor<4xf32>, tensor<f32>
}

// -----

// A reshape is a view: its result shares the operand's buffer, which stays
// live until the reshape's last use.
// CHECK: ptc-plan-memory @reshape_view: 2 buffers, arena 128 bytes (128 without reuse)
// CHECK-LABEL: func.func @reshape_view
// CHECK: ptc.relu %arg0 {ptc.offsets = array<i64: [[R:[0-9]+]]>}
// CHECK: ptc.reshape %{{.*}} {ptc.offsets = array<i64: [[R]]>}
// CHECK: ptc.gelu %{{.*}} {ptc.offsets = array<i64: {{[0-9]+}}>}
func.func @reshape_view(%a: tensor<2x4xf32>) -> tensor<8xf32> {
  %0 = ptc.relu %a : tensor<2x4xf32>
  %1 = ptc.reshape %0 : tensor<2x4xf32> -> tensor<8xf32>
  %2 = ptc.gelu %1 : tensor<8xf32>
  return %2 : tensor<8xf32>
}
