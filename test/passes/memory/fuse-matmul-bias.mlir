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

// -----

// A bias gradient (the upstream gradient summed over every dimension but the
// last) joins the weight gradient that reads the same gradient as its
// transposed lhs, reshaped to rank 2: at the product when every use of the
// sum comes after it (@at_product, bf16), or at the sum when a use of the sum
// comes first, the product's operand reshapes moved up with it
// (@at_sum); the sharding records of the two ops are concatenated.
// CHECK-LABEL: func.func @at_product
// CHECK-NOT: ptc.reduce_sum
// CHECK: %[[G:.+]] = ptc.reshape %arg0
// CHECK: %[[W:.+]], %[[B:.+]] = ptc.matmul_bias_grad %[[G]], %arg1 {ptc.backward, transpose_lhs = true} : tensor<16x6xbf16>, tensor<16x4xbf16> -> tensor<6x4xbf16>, tensor<6xbf16>
// CHECK: return %[[W]], %[[B]]
module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @at_product(%dy: tensor<2x8x6xbf16>, %x: tensor<16x4xbf16>) -> (tensor<6x4xbf16>, tensor<6xbf16>) {
    %db = ptc.reduce_sum %dy axes = [0, 1] {ptc.backward} : tensor<2x8x6xbf16> -> tensor<6xbf16>
    %g = ptc.reshape %dy {ptc.backward} : tensor<2x8x6xbf16> -> tensor<16x6xbf16>
    %dw = ptc.matmul %g, %x {ptc.backward, transpose_lhs = true} : tensor<16x6xbf16>, tensor<16x4xbf16> -> tensor<6x4xbf16>
    return %dw, %db : tensor<6x4xbf16>, tensor<6xbf16>
  }

  // CHECK-LABEL: func.func @at_sum
  // CHECK: %[[G:.+]] = ptc.reshape %arg0
  // CHECK: %[[X:.+]] = ptc.reshape %arg1
  // CHECK: %[[W:.+]], %[[B:.+]] = ptc.matmul_bias_grad %[[G]], %[[X]] {ptc.backward, ptc.shardings = ["w", "b"], transpose_lhs = true} : tensor<16x6xf32>, tensor<16x4xf32> -> tensor<6x4xf32>, tensor<6xf32>
  // CHECK: %[[S:.+]] = ptc.all_reduce %[[B]]
  // CHECK-NOT: ptc.matmul
  // CHECK: return %[[W]], %[[S]]
  func.func @at_sum(%dy: tensor<2x8x6xf32>, %xa: tensor<2x8x4xf32>) -> (tensor<6x4xf32>, tensor<6xf32>) {
    %db = ptc.reduce_sum %dy axes = [0, 1] {ptc.backward, ptc.shardings = ["b"]} : tensor<2x8x6xf32> -> tensor<6xf32>
    %s = ptc.all_reduce %db {axes = ["dp"]} : (tensor<6xf32>) -> tensor<6xf32>
    %x = ptc.reshape %xa {ptc.backward} : tensor<2x8x4xf32> -> tensor<16x4xf32>
    %g = ptc.reshape %dy {ptc.backward} : tensor<2x8x6xf32> -> tensor<16x6xf32>
    %dw = ptc.matmul %g, %x {ptc.backward, ptc.shardings = ["w"], transpose_lhs = true} : tensor<16x6xf32>, tensor<16x4xf32> -> tensor<6x4xf32>
    return %dw, %s : tensor<6x4xf32>, tensor<6xf32>
  }

  // A use of the sum before the product that cannot stay there (a conversion
  // whose own use comes later) moves behind the fused op when the product's
  // operands cannot move up (one is computed after the sum).
  // CHECK-LABEL: func.func @sunk
  // CHECK: %[[X:.+]] = ptc.gelu
  // CHECK: %[[W:.+]], %[[B:.+]] = ptc.matmul_bias_grad %arg0, %[[X]]
  // CHECK: %[[C:.+]] = ptc.convert %[[B]]
  // CHECK: return %[[W]], %[[C]]
  func.func @sunk(%g: tensor<16x6xbf16>, %xa: tensor<16x4xbf16>) -> (tensor<6x4xbf16>, tensor<6xf32>) {
    %db = ptc.reduce_sum %g axes = [0] : tensor<16x6xbf16> -> tensor<6xbf16>
    %c = ptc.convert %db : tensor<6xbf16> -> tensor<6xf32>
    %x = ptc.gelu %xa : tensor<16x4xbf16>
    %dw = ptc.matmul %g, %x {transpose_lhs = true} : tensor<16x6xbf16>, tensor<16x4xbf16> -> tensor<6x4xbf16>
    return %dw, %c : tensor<6x4xbf16>, tensor<6xf32>
  }
}

// -----

// Not fused: the product reads another tensor (sequence parallelism's
// gathered gradient); the sum keeps the first dimension; the product does not
// transpose its lhs; the two are in different pipeline stages; a use of the
// sum comes first and is not free to move (a collective) while an operand of
// the product is computed after the sum.
// CHECK-LABEL: func.func @bias_gradient_kept
// CHECK-COUNT-5: ptc.reduce_sum
// CHECK-NOT: ptc.matmul_bias_grad
module attributes {ptc.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @bias_gradient_kept(%dy: tensor<16x6xf32>, %other: tensor<16x6xf32>, %x: tensor<16x4xf32>, %y: tensor<6x4xf32>) -> (tensor<6x4xf32>, tensor<6xf32>, tensor<16xf32>, tensor<16x4xf32>, tensor<6xf32>, tensor<6x4xf32>, tensor<6xf32>, tensor<6x4xf32>, tensor<6xf32>) {
    %s0 = ptc.reduce_sum %dy axes = [0] : tensor<16x6xf32> -> tensor<6xf32>
    %w0 = ptc.matmul %other, %x {transpose_lhs = true} : tensor<16x6xf32>, tensor<16x4xf32> -> tensor<6x4xf32>
    %s1 = ptc.reduce_sum %dy axes = [1] : tensor<16x6xf32> -> tensor<16xf32>
    %w1 = ptc.matmul %dy, %y : tensor<16x6xf32>, tensor<6x4xf32> -> tensor<16x4xf32>
    %s2 = ptc.reduce_sum %other axes = [0] {ptc.stage = 0 : i64} : tensor<16x6xf32> -> tensor<6xf32>
    %w2 = ptc.matmul %other, %x {ptc.stage = 1 : i64, transpose_lhs = true} : tensor<16x6xf32>, tensor<16x4xf32> -> tensor<6x4xf32>
    %s3 = ptc.reduce_sum %x axes = [0] : tensor<16x4xf32> -> tensor<4xf32>
    %r3 = ptc.all_reduce %s3 {axes = ["dp"]} : (tensor<4xf32>) -> tensor<4xf32>
    %e3 = ptc.gelu %dy : tensor<16x6xf32>
    %w3 = ptc.matmul %x, %e3 {transpose_lhs = true} : tensor<16x4xf32>, tensor<16x6xf32> -> tensor<4x6xf32>
    %u3 = ptc.add %w3, %w3 : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
    %s4 = ptc.reduce_sum %dy axes = [0] : tensor<16x6xf32> -> tensor<6xf32>
    return %w0, %s0, %s1, %w1, %s2, %w2, %s4, %y, %s4 : tensor<6x4xf32>, tensor<6xf32>, tensor<16xf32>, tensor<16x4xf32>, tensor<6xf32>, tensor<6x4xf32>, tensor<6xf32>, tensor<6x4xf32>, tensor<6xf32>
  }
}
