// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fuse-matmul-bias))" | FileCheck %s

// A linear layer's bias add becomes the matmul's third operand, wherever the
// bias comes from (an argument, or converted between the two ops); the ops'
// discardable attributes carry over; the bias may be the add's first operand.
// CHECK-LABEL: func.func @linear
// CHECK-NOT: ptc.add
// CHECK: %[[Y:.+]] = ptc.matmul %arg0, %arg1, %arg2 {ptc.stage = 1 : i64, transpose_rhs = true} : tensor<2x8x4xf32>, tensor<6x4xf32>, tensor<6xf32> -> tensor<2x8x6xf32>
// CHECK: %[[W:.+]] = ptc.convert %arg1
// CHECK: %[[B:.+]] = ptc.convert %arg4
// CHECK: %[[Z:.+]] = ptc.matmul %arg3, %[[W]], %[[B]] {transpose_rhs = true} : tensor<2x8x4xbf16>, tensor<6x4xbf16>, tensor<6xbf16> -> tensor<2x8x6xbf16>
// CHECK-NOT: ptc.add
// CHECK: return %[[Y]], %[[Z]]
func.func @linear(%x: tensor<2x8x4xf32>, %w: tensor<6x4xf32>, %b: tensor<6xf32>, %xh: tensor<2x8x4xbf16>, %bf: tensor<6xf32>) -> (tensor<2x8x6xf32>, tensor<2x8x6xbf16>) {
  %y = ptc.matmul %x, %w {ptc.stage = 1 : i64, transpose_rhs = true} : tensor<2x8x4xf32>, tensor<6x4xf32> -> tensor<2x8x6xf32>
  %yb = ptc.add %y, %b {ptc.stage = 1 : i64} : tensor<2x8x6xf32>, tensor<6xf32> -> tensor<2x8x6xf32>
  %wh = ptc.convert %w : tensor<6x4xf32> -> tensor<6x4xbf16>
  %z = ptc.matmul %xh, %wh {transpose_rhs = true} : tensor<2x8x4xbf16>, tensor<6x4xbf16> -> tensor<2x8x6xbf16>
  %bh = ptc.convert %bf : tensor<6xf32> -> tensor<6xbf16>
  %zb = ptc.add %bh, %z : tensor<6xbf16>, tensor<2x8x6xbf16> -> tensor<2x8x6xbf16>
  return %yb, %zb : tensor<2x8x6xf32>, tensor<2x8x6xbf16>
}

// -----

// Not fused: the matmul feeds something else too; the add's other operand is
// not a vector of the last dimension (a residual, a broadcast column); the
// two ops are in different pipeline stages.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-4: ptc.add
// CHECK-NOT: ptc.matmul %{{[^,]+}}, %{{[^,]+}}, %
func.func @kept(%x: tensor<2x8x4xf32>, %w: tensor<6x4xf32>, %b: tensor<6xf32>, %r: tensor<2x8x6xf32>, %c: tensor<8x1xf32>) -> (tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>) {
  %y0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x8x4xf32>, tensor<6x4xf32> -> tensor<2x8x6xf32>
  %a0 = ptc.add %y0, %b : tensor<2x8x6xf32>, tensor<6xf32> -> tensor<2x8x6xf32>
  %y1 = ptc.matmul %x, %w {transpose_rhs = true, ptc.backward} : tensor<2x8x4xf32>, tensor<6x4xf32> -> tensor<2x8x6xf32>
  %a1 = ptc.add %y1, %r {ptc.backward} : tensor<2x8x6xf32>, tensor<2x8x6xf32> -> tensor<2x8x6xf32>
  %y2 = ptc.matmul %x, %w {transpose_rhs = true, ptc.stage = 0 : i64} : tensor<2x8x4xf32>, tensor<6x4xf32> -> tensor<2x8x6xf32>
  %a2 = ptc.add %y2, %b {ptc.stage = 1 : i64} : tensor<2x8x6xf32>, tensor<6xf32> -> tensor<2x8x6xf32>
  %y3 = ptc.matmul %x, %w {transpose_rhs = true, ptc.chunk = 1 : i64} : tensor<2x8x4xf32>, tensor<6x4xf32> -> tensor<2x8x6xf32>
  %a3 = ptc.add %y3, %c {ptc.chunk = 1 : i64} : tensor<2x8x6xf32>, tensor<8x1xf32> -> tensor<2x8x6xf32>
  return %a0, %y0, %a1, %a2, %a3 : tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>
}
