// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-fuse-cross-entropy-grad))" | FileCheck %s

// One step: the loss is only returned, so the fused op takes the gradient's
// place and attributes; it reads the narrow logits with an f32 loss and seed.
// CHECK-LABEL: func.func @at_gradient
// CHECK-NOT: ptc.cross_entropy %
// CHECK: %[[SEED:.+]] = arith.constant {ptc.backward, ptc.loss_seed}
// CHECK-NEXT: %[[G:.+]], %[[LOSS:.+]] = ptc.cross_entropy_with_grad %arg0, %arg1, %[[SEED]] {ptc.backward} : tensor<2x8x16xbf16>, tensor<2x8xi32>, tensor<f32> -> tensor<f32>
// CHECK-NOT: ptc.cross_entropy_grad
// CHECK: return %[[LOSS]], %[[G]]
func.func @at_gradient(%logits: tensor<2x8x16xbf16>, %t: tensor<2x8xi32>) -> (tensor<f32>, tensor<2x8x16xbf16>) {
  %loss = ptc.cross_entropy %logits, %t : tensor<2x8x16xbf16>, tensor<2x8xi32> -> tensor<f32>
  %seed = arith.constant {ptc.backward, ptc.loss_seed} dense<1.0> : tensor<f32>
  %g = ptc.cross_entropy_grad %logits, %t, %seed {ptc.backward} : tensor<2x8x16xbf16>, tensor<2x8xi32>, tensor<f32>
  return %loss, %g : tensor<f32>, tensor<2x8x16xbf16>
}

// -----

// Micro-batches: the loss is scaled in the forward segment, before the
// gradient, so the fused op takes the loss's place; the seed's chain (a
// constant scaled by 1 / micro-batches) is cloned there with the loss's
// segment and stage, and the old chain goes.
// CHECK-LABEL: func.func @at_loss
// CHECK: %[[C:.+]] = arith.constant {ptc.loss_seed, ptc.segment = "forward", ptc.stage = 0 : i64} dense<1.000000e+00>
// CHECK-NEXT: %[[S:.+]] = ptc.scale %[[C]] by 5.000000e-01 {ptc.segment = "forward", ptc.stage = 0 : i64}
// CHECK-NEXT: %[[G:.+]], %[[LOSS:.+]] = ptc.cross_entropy_with_grad %arg0, %arg1, %[[S]] {ptc.segment = "forward", ptc.stage = 0 : i64}
// CHECK-NEXT: ptc.scale %[[LOSS]] by 5.000000e-01
// CHECK-NOT: arith.constant
// CHECK-NOT: ptc.scale
// CHECK: return {{.*}}, %[[G]]
func.func @at_loss(%logits: tensor<1x8x16xf32>, %t: tensor<1x8xi32>) -> (tensor<f32>, tensor<1x8x16xf32>) {
  %loss = ptc.cross_entropy %logits, %t {ptc.segment = "forward", ptc.stage = 0 : i64} : tensor<1x8x16xf32>, tensor<1x8xi32> -> tensor<f32>
  %mean = ptc.scale %loss by 0.5 {ptc.segment = "forward", ptc.stage = 0 : i64} : tensor<f32>
  %cst = arith.constant {ptc.backward, ptc.loss_seed} dense<1.0> : tensor<f32>
  %seed = ptc.scale %cst by 0.5 {ptc.backward, ptc.segment = "backward", ptc.stage = 0 : i64} : tensor<f32>
  %g = ptc.cross_entropy_grad %logits, %t, %seed {ptc.backward, ptc.segment = "backward", ptc.stage = 0 : i64} : tensor<1x8x16xf32>, tensor<1x8xi32>, tensor<f32>
  return %mean, %g : tensor<f32>, tensor<1x8x16xf32>
}

// -----

// Stays apart: the loss is read before the gradient and the seed comes from a
// tensor computed after the loss (not a scalar chain to clone).
// CHECK-LABEL: func.func @seed_after_loss
// CHECK-NOT: ptc.cross_entropy_with_grad
// CHECK: ptc.cross_entropy %arg0, %arg1
// CHECK: ptc.cross_entropy_grad %arg0, %arg1
func.func @seed_after_loss(%logits: tensor<2x8x16xf32>, %t: tensor<2x8xi32>, %x: tensor<2x8x16xf32>) -> (tensor<f32>, tensor<2x8x16xf32>) {
  %loss = ptc.cross_entropy %logits, %t : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %mean = ptc.scale %loss by 0.5 : tensor<f32>
  %y = ptc.scale %x by 2.0 : tensor<2x8x16xf32>
  %seed = ptc.cross_entropy %y, %t : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %g = ptc.cross_entropy_grad %logits, %t, %seed : tensor<2x8x16xf32>, tensor<2x8xi32>, tensor<f32>
  return %mean, %g : tensor<f32>, tensor<2x8x16xf32>
}

// -----

// Stays apart: a loss of other targets than the gradient's.
// CHECK-LABEL: func.func @other_targets
// CHECK-NOT: ptc.cross_entropy_with_grad
func.func @other_targets(%logits: tensor<2x8x16xf32>, %t: tensor<2x8xi32>, %t2: tensor<2x8xi32>) -> (tensor<f32>, tensor<2x8x16xf32>) {
  %loss = ptc.cross_entropy %logits, %t2 : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %g = ptc.cross_entropy_grad %logits, %t, %one : tensor<2x8x16xf32>, tensor<2x8xi32>, tensor<f32>
  return %loss, %g : tensor<f32>, tensor<2x8x16xf32>
}

// -----

// Stays apart, and nothing is cloned: the seed's scalar chain has one operand
// that can be made before the loss (a constant) and one that cannot (a
// tensor's loss computed after it).
// CHECK-LABEL: func.func @half_a_chain
// CHECK-NOT: ptc.cross_entropy_with_grad
// CHECK-NOT: arith.constant
// CHECK: ptc.cross_entropy %arg0, %arg1
// CHECK-NEXT: ptc.scale
// CHECK-NEXT: ptc.scale
// CHECK-NEXT: ptc.cross_entropy %
// CHECK-NEXT: arith.constant
// CHECK-NEXT: ptc.add
// CHECK-NEXT: ptc.cross_entropy_grad
func.func @half_a_chain(%logits: tensor<2x8x16xf32>, %t: tensor<2x8xi32>, %x: tensor<2x8x16xf32>) -> (tensor<f32>, tensor<2x8x16xf32>) {
  %loss = ptc.cross_entropy %logits, %t : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %mean = ptc.scale %loss by 0.5 : tensor<f32>
  %y = ptc.scale %x by 2.0 : tensor<2x8x16xf32>
  %late = ptc.cross_entropy %y, %t : tensor<2x8x16xf32>, tensor<2x8xi32> -> tensor<f32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %seed = ptc.add %one, %late : tensor<f32>, tensor<f32> -> tensor<f32>
  %g = ptc.cross_entropy_grad %logits, %t, %seed : tensor<2x8x16xf32>, tensor<2x8xi32>, tensor<f32>
  return %mean, %g : tensor<f32>, tensor<2x8x16xf32>
}

// -----

// The vocabulary-parallel pair over the same axes: one
// ptc.vocab_parallel_cross_entropy_with_grad at the gradient, with its axes.
// A pair over other axes stays apart.
// CHECK-LABEL: func.func @vocab_parallel
// CHECK: %[[OTHER:.+]] = ptc.vocab_parallel_cross_entropy %arg0, %arg1 {axes = ["dp"]}
// CHECK: %[[SEED:.+]] = arith.constant {ptc.backward, ptc.loss_seed}
// CHECK-NEXT: %[[G:.+]], %[[LOSS:.+]] = ptc.vocab_parallel_cross_entropy_with_grad %arg0, %arg1, %[[SEED]] {axes = ["tp"], ptc.backward} : tensor<2x4x16xbf16>, tensor<2x4xi32>, tensor<f32> -> tensor<f32>
// CHECK-NEXT: %[[G2:.+]] = ptc.vocab_parallel_cross_entropy_grad %arg0, %arg1, %[[SEED]] {axes = ["tp"]
// CHECK: return %[[LOSS]], %[[G]], %[[OTHER]], %[[G2]]
module attributes {ptc.mesh = {axes = ["tp", "dp"], shape = array<i64: 2, 2>}} {
  func.func @vocab_parallel(%logits: tensor<2x4x16xbf16>, %t: tensor<2x4xi32>) -> (tensor<f32>, tensor<2x4x16xbf16>, tensor<f32>, tensor<2x4x16xbf16>) {
    %l = ptc.vocab_parallel_cross_entropy %logits, %t {axes = ["tp"]} : tensor<2x4x16xbf16>, tensor<2x4xi32> -> tensor<f32>
    %other = ptc.vocab_parallel_cross_entropy %logits, %t {axes = ["dp"]} : tensor<2x4x16xbf16>, tensor<2x4xi32> -> tensor<f32>
    %seed = arith.constant {ptc.backward, ptc.loss_seed} dense<1.0> : tensor<f32>
    %g = ptc.vocab_parallel_cross_entropy_grad %logits, %t, %seed {axes = ["tp"], ptc.backward} : tensor<2x4x16xbf16>, tensor<2x4xi32>, tensor<f32>
    %g2 = ptc.vocab_parallel_cross_entropy_grad %logits, %t, %seed {axes = ["tp"], ptc.backward} : tensor<2x4x16xbf16>, tensor<2x4xi32>, tensor<f32>
    return %l, %g, %other, %g2 : tensor<f32>, tensor<2x4x16xbf16>, tensor<f32>, tensor<2x4x16xbf16>
  }
}
