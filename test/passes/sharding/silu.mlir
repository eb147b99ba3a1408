// ptc.silu needs no case in any pass: its ODS class gives it the activation
// sharding rule, batch dimension and plan lowering. A SiLU MLP under tp is
// column- then row-parallel (the Megatron defaults see an activation), under
// micro-batches it is split like its input, and the plan names the kernel.
// RUN: ptc-opt %s --ptc-compile="mesh=tp:2" | FileCheck %s --check-prefix=TP
// RUN: ptc-opt %s --ptc-compile="mesh=dp:2 microbatches=2" | FileCheck %s --check-prefix=MB
// RUN: ptc-opt %s --ptc-compile="plan=%t.plan" -o /dev/null
// RUN: ptc-run %t.plan --dump-plan | FileCheck %s --check-prefix=PLAN

// TP: ptc.param = "up.weight", ptc.sharding = #ptc.sharding<[tp, _]>
// TP: ptc.param = "down.weight", ptc.sharding = #ptc.sharding<[_, tp]>
// TP: ptc.silu %{{.*}} : tensor<8x32xf32>
// TP: ptc.silu_grad %{{.*}}, %{{.*}} : tensor<8x32xf32>
// MB: ptc.silu %{{.*}} : tensor<2x64xf32>
// PLAN: "op":"Unary"{{.*}}"function":"silu"
// PLAN: "op":"UnaryGrad"{{.*}}"function":"silu"
func.func @mlp(%w1: tensor<64x16xf32> {ptc.param = "up.weight", ptc.init = "normal:0.1"},
               %w2: tensor<16x64xf32> {ptc.param = "down.weight", ptc.init = "normal:0.1"},
               %x: tensor<8x16xf32> {ptc.input = "x"}, %y: tensor<8xi32> {ptc.input = "labels"}) -> tensor<f32> {
  %h = ptc.matmul %x, %w1 {transpose_rhs = true} : tensor<8x16xf32>, tensor<64x16xf32> -> tensor<8x64xf32>
  %a = ptc.silu %h : tensor<8x64xf32>
  %o = ptc.matmul %a, %w2 {transpose_rhs = true} : tensor<8x64xf32>, tensor<16x64xf32> -> tensor<8x16xf32>
  %l = ptc.cross_entropy %o, %y : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  return %l : tensor<f32>
}
