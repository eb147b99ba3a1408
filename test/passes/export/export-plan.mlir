// RUN: ptc-opt %s --ptc-compile="plan=%t.plan optimizer=sgd lr=0.5 momentum=0.25" -o /dev/null
// RUN: ptc-run %t.plan --dump-plan | FileCheck %s

// The tensor table: parameters with their initializers, optimizer state,
// inputs, arena temporaries, and the loss seed as a constant.
// CHECK: "format_version": 16,
// CHECK: "producer": "ptc-opt",
// Model FLOPs per step: 3x the forward matmul's 2*M*N*K = 2*2*3*4.
// CHECK: "model_flops": 144.0,
// CHECK: "optimizer": "sgd",
// CHECK: "arena_bytes": 256,
// CHECK: "arena_bytes_unshared": 384,
// CHECK: {"id":0,"name":"w","kind":"Parameter","dtype":"F32","shape":[3,4],"init":"Normal","init_std":0.5},
// CHECK: {"id":1,"name":"b","kind":"Parameter","dtype":"F32","shape":[3],"init":"Ones"},
// CHECK: {"id":2,"name":"w.momentum_buffer","kind":"OptimizerState","dtype":"F32","shape":[3,4]},
// CHECK: {"id":3,"name":"b.momentum_buffer","kind":"OptimizerState","dtype":"F32","shape":[3]},
// CHECK: {"id":4,"name":"x","kind":"Input","dtype":"F32","shape":[2,4]},
// CHECK: {"id":5,"name":"y","kind":"Input","dtype":"I32","shape":[2]},
// CHECK: {"id":6,"name":"t0","kind":"Temporary","dtype":"F32","shape":[2,3],"arena_offset":0},
// CHECK: {"id":7,"name":"constant","kind":"Constant","dtype":"F32","shape":[]},

// One instruction per op, with its source location (the bias add is the
// forward matmul's third input, the bias gradient the weight gradient's
// second output: ptc-fuse-matmul-bias; the loss the gradient's second output:
// ptc-fuse-cross-entropy-grad); the updates write their parameter
// and state in place (outputs = the argument tensors), each skipped when the
// gradients are not all finite (the AnyNonfinite flag).
// CHECK: "instructions": [
// CHECK-NEXT: {"op":"Matmul","inputs":[4,0,1],"outputs":[6],"ints":[0,1],"location":"{{.*}}export-plan.mlir:41:8"},
// CHECK-NEXT: {"op":"CrossEntropyGrad","inputs":[6,5,7],"outputs":[8,9],
// CHECK-NEXT: {"op":"Matmul","inputs":[8,4],"outputs":[10,11],"ints":[1,0],
// CHECK-NEXT: {"op":"AnyNonfinite","inputs":[10,11],"outputs":[12],"location":"optimizer:nonfinite"},
// CHECK-NEXT: {"op":"SgdUpdate","inputs":[0,10,2,12],"outputs":[0,2],"floats":[0.5,0.25,0.0],"location":"optimizer:w"},
// CHECK-NEXT: {"op":"SgdUpdate","inputs":[1,11,3,12],"outputs":[1,3],"floats":[0.5,0.25,0.0],"location":"optimizer:b"}
// CHECK-NEXT: ],
// CHECK-NEXT: "outputs": {"loss":9,"skipped":12}

func.func @train_step(%w: tensor<3x4xf32> {ptc.param = "w", ptc.init = "normal:0.5"},
                      %b: tensor<3xf32> {ptc.param = "b", ptc.init = "ones"},
                      %x: tensor<2x4xf32> {ptc.input = "x"}, %y: tensor<2xi32> {ptc.input = "y"}) -> tensor<f32> {
  %0 = ptc.matmul %x, %w {transpose_rhs = true} : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
  %1 = ptc.add %0, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %2 = ptc.cross_entropy %1, %y : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  return %2 : tensor<f32>
}
