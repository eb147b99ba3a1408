// ptc.dropout under every split: its rule passes the input's split through and
// records it on the partitioned op (`layout`), from which each device computes
// its elements' global indices; the gradient is the same dropout (same
// stream) of the result's gradient; the plan carries the stream and, per
// dimension, blocks and mesh axes. The VJP against finite differences (the
// masks are fixed for a step).
// RUN: ptc-opt %s --ptc-compile="mesh=dp:2,tp:2 sequence-parallel=true" | FileCheck %s --check-prefix=TP
// RUN: ptc-opt %s --ptc-compile="mesh=dp:2 microbatches=2" | FileCheck %s --check-prefix=MB
// RUN: ptc-opt %s --ptc-compile="plan=%t.plan mesh=dp:2,tp:2" -o /dev/null
// RUN: ptc-run %t.plan --dump-plan | FileCheck %s --check-prefix=PLAN
// RUN: ptc-opt %s --ptc-compile="plan=%t.grad.plan optimizer=none" -o /dev/null
// RUN: ptc-gradcheck %t.grad.plan | FileCheck %s --check-prefix=GRAD

// TP: ptc.dropout %{{.*}} {layout = #ptc.sharding<[dp, tp, _]>, p = 2.500000e-01 : f64,{{.*}} stream = 0 : i64} : tensor<2x2x16xf32>
// TP: ptc.dropout %{{.*}} {layout = #ptc.sharding<[dp, _, tp]>, p = 5.000000e-01 : f64,{{.*}} stream = 1 : i64} : tensor<2x4x32xf32>
// The gradient: the same stream on the partial sums of the row-parallel product's input gradient.
// TP: ptc.dropout %{{.*}} {layout = #ptc.sharding<[dp, _, _]>, p = 5.000000e-01 : f64,{{.*}}partial(tp){{.*}} stream = 1 : i64} : tensor<2x4x64xf32>
// MB: ptc.dropout %{{.*}} {layout = #ptc.sharding<[dp, _, _]>, p = 2.500000e-01 : f64,{{.*}} stream = 0 : i64} : tensor<1x4x16xf32>
// PLAN: "op":"Dropout"{{.*}}"ints":[0,1,1,0,1,0,1,0]{{.*}}"floats":[0.25]
// PLAN: "op":"Dropout"{{.*}}"ints":[1,1,1,0,1,0,1,1,1]{{.*}}"floats":[0.5]
// PLAN: "op":"Dropout"{{.*}}"ints":[1,1,1,0,1,0,1,0]{{.*}}"floats":[0.5]
// GRAD: gradcheck: passed
func.func @mlp(%w1: tensor<64x16xf32> {ptc.param = "up.weight", ptc.init = "normal:0.1"},
               %w2: tensor<16x64xf32> {ptc.param = "down.weight", ptc.init = "normal:0.1"},
               %x: tensor<4x4x16xf32> {ptc.input = "x"}, %y: tensor<4x4xi32> {ptc.input = "labels"}) -> tensor<f32> {
  %d = ptc.dropout %x {p = 0.25 : f64, stream = 0 : i64} : tensor<4x4x16xf32>
  %h = ptc.matmul %d, %w1 {transpose_rhs = true} : tensor<4x4x16xf32>, tensor<64x16xf32> -> tensor<4x4x64xf32>
  %a = ptc.gelu %h : tensor<4x4x64xf32>
  %a2 = ptc.dropout %a {p = 0.5 : f64, stream = 1 : i64} : tensor<4x4x64xf32>
  %o = ptc.matmul %a2, %w2 {transpose_rhs = true} : tensor<4x4x64xf32>, tensor<16x64xf32> -> tensor<4x4x16xf32>
  %l = ptc.cross_entropy %o, %y : tensor<4x4x16xf32>, tensor<4x4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
