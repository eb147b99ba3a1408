// A model written with ptc.swiglu: under tp the gate and up projections are
// column-parallel and the down projection row-parallel (the Megatron defaults
// see the gated product), swiglu and its gradient split like the gate; under
// micro-batches it is split like its inputs; the plan names the GatedUnary
// kernels with the silu function.
// RUN: ptc-opt %s --ptc-compile="mesh=tp:2" | FileCheck %s --check-prefix=TP
// RUN: ptc-opt %s --ptc-compile="mesh=dp:2 microbatches=2" | FileCheck %s --check-prefix=MB
// RUN: ptc-opt %s --ptc-compile="plan=%t.plan" -o /dev/null
// RUN: ptc-run %t.plan --dump-plan | FileCheck %s --check-prefix=PLAN

// TP: ptc.param = "gate.weight", ptc.sharding = #ptc.sharding<[tp, _]>
// TP: ptc.param = "up.weight", ptc.sharding = #ptc.sharding<[tp, _]>
// TP: ptc.param = "down.weight", ptc.sharding = #ptc.sharding<[_, tp]>
// TP: ptc.swiglu %{{.*}}, %{{.*}} : tensor<8x32xf32>
// TP: ptc.swiglu_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x32xf32>
// MB: ptc.swiglu %{{.*}}, %{{.*}} : tensor<2x64xf32>
// PLAN: "op":"GatedUnary"{{.*}}"function":"silu"
// PLAN: "op":"GatedUnaryGrad"{{.*}}"function":"silu"
func.func @mlp(%wg: tensor<64x16xf32> {ptc.param = "gate.weight", ptc.init = "normal:0.1"},
               %wu: tensor<64x16xf32> {ptc.param = "up.weight", ptc.init = "normal:0.1"},
               %wd: tensor<16x64xf32> {ptc.param = "down.weight", ptc.init = "normal:0.1"},
               %x: tensor<8x16xf32> {ptc.input = "x"}, %y: tensor<8xi32> {ptc.input = "labels"}) -> tensor<f32> {
  %g = ptc.matmul %x, %wg {transpose_rhs = true} : tensor<8x16xf32>, tensor<64x16xf32> -> tensor<8x64xf32>
  %u = ptc.matmul %x, %wu {transpose_rhs = true} : tensor<8x16xf32>, tensor<64x16xf32> -> tensor<8x64xf32>
  %h = ptc.swiglu %g, %u : tensor<8x64xf32>
  %o = ptc.matmul %h, %wd {transpose_rhs = true} : tensor<8x64xf32>, tensor<16x64xf32> -> tensor<8x16xf32>
  %l = ptc.cross_entropy %o, %y : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  return %l : tensor<f32>
}
