// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-keep-working-copies))" | FileCheck %s
// RUN: ptc-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(ptc-keep-working-copies))" | ptc-opt --split-input-file | FileCheck %s

// The conversions of an updated parameter read a working copy argument (the
// parameter's name, sharding and stage); AdamW and SGD write the new copy,
// returned into that argument. A parameter read in f32 only is left alone.
// CHECK-LABEL: func.func @kept
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<6x4xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[dp, _]>, ptc.stage = 1 : i64}
// CHECK-SAME: %[[F:[a-z0-9]+]]: tensor<6xf32> {ptc.param = "f"}
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<6x4xbf16> {ptc.sharding = #ptc.sharding<[dp, _]>, ptc.stage = 1 : i64, ptc.working_copy = "w"}
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<6xf16> {ptc.working_copy = "q"}
// CHECK-SAME: -> (tensor<6x4xf32> {ptc.update = "w"}, {{.*}}, tensor<6xf16>, tensor<6x4xbf16> {ptc.working_copy = "w"}, tensor<6xf16> {ptc.working_copy = "q"})
// CHECK-NOT: ptc.convert
// CHECK: ptc.matmul %[[W]], %[[W]]
// CHECK: %{{.*}}, %{{.*}}, %{{.*}}, %[[W2:.*]] = ptc.adamw_update %[[P]], {{.*}} {{{.*}}ptc.stage = 1 : i64{{.*}}} : tensor<6x4xf32> grad(tensor<6x4xbf16>), tensor<f32> working_copy(tensor<6x4xbf16>)
// CHECK: %{{.*}}, %{{.*}}, %[[Q2:.*]] = ptc.sgd_update {{.*}} : tensor<6xf32> working_copy(tensor<6xf16>)
// CHECK: ptc.sgd_update %[[F]], {{.*}} : tensor<6xf32>{{$}}
// CHECK: return {{.*}}, %[[W2]], %[[Q2]] :
func.func @kept(%p: tensor<6x4xf32> {ptc.param = "w", ptc.sharding = #ptc.sharding<[dp, _]>, ptc.stage = 1 : i64},
                %g: tensor<6x4xbf16> {ptc.input = "g"}, %m: tensor<6x4xf32> {ptc.state = "w.m"},
                %v: tensor<6x4xf32> {ptc.state = "w.v"}, %t: tensor<f32> {ptc.state = "step"},
                %q: tensor<6xf32> {ptc.param = "q"}, %h: tensor<6xf32> {ptc.input = "h"},
                %b: tensor<6xf32> {ptc.state = "q.b"}, %f: tensor<6xf32> {ptc.param = "f"},
                %fb: tensor<6xf32> {ptc.state = "f.b"})
    -> (tensor<6x4xf32> {ptc.update = "w"}, tensor<6x4xf32> {ptc.update = "w.m"}, tensor<6x4xf32> {ptc.update = "w.v"},
        tensor<6xf32> {ptc.update = "q"}, tensor<6xf32> {ptc.update = "q.b"}, tensor<6xf32> {ptc.update = "f"},
        tensor<4x4xbf16>, tensor<6xf16>) {
  %w16 = ptc.convert %p : tensor<6x4xf32> -> tensor<6x4xbf16>
  %w16b = ptc.convert %p : tensor<6x4xf32> -> tensor<6x4xbf16>
  %mm = ptc.matmul %w16, %w16b {transpose_lhs = true} : tensor<6x4xbf16>, tensor<6x4xbf16> -> tensor<4x4xbf16>
  %q16 = ptc.convert %q : tensor<6xf32> -> tensor<6xf16>
  %p2, %m2, %v2 = ptc.adamw_update %p, %g, %m, %v, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, ptc.stage = 1 : i64} : tensor<6x4xf32> grad(tensor<6x4xbf16>), tensor<f32>
  %q2, %b2 = ptc.sgd_update %q, %h, %b {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<6xf32>
  %f2, %fb2 = ptc.sgd_update %f, %h, %fb {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<6xf32>
  return %p2, %m2, %v2, %q2, %b2, %f2, %mm, %q16 : tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<4x4xbf16>, tensor<6xf16>
}

// -----

// Left alone: an update on the host (offloaded); conversions to two types; a
// conversion after the update (it reads the new value); an update whose new
// parameter is not written back.
// CHECK-LABEL: func.func @converted
// CHECK-NOT: working_copy
// CHECK-COUNT-5: ptc.convert
// CHECK-NOT: working_copy
func.func @converted(%p: tensor<4xf32> {ptc.param = "a", ptc.on_host}, %g: tensor<4xf32> {ptc.input = "g"},
                     %m: tensor<4xf32> {ptc.state = "a.m", ptc.on_host}, %v: tensor<4xf32> {ptc.state = "a.v", ptc.on_host},
                     %t: tensor<f32> {ptc.state = "step"},
                     %q: tensor<4xf32> {ptc.param = "b"}, %qm: tensor<4xf32> {ptc.state = "b.m"},
                     %r: tensor<4xf32> {ptc.param = "c"}, %rm: tensor<4xf32> {ptc.state = "c.m"},
                     %s: tensor<4xf32> {ptc.param = "d"}, %sm: tensor<4xf32> {ptc.state = "d.m"})
    -> (tensor<4xf32> {ptc.update = "a"}, tensor<4xf32> {ptc.update = "b"}, tensor<4xf32> {ptc.update = "c"},
        tensor<4xbf16>, tensor<4xbf16>, tensor<4xf16>, tensor<4xbf16>) {
  %a16 = ptc.convert %p : tensor<4xf32> -> tensor<4xbf16>
  %a2, %am2, %av2 = ptc.adamw_update %p, %g, %m, %v, %t {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, ptc.on_host} : tensor<4xf32>, tensor<f32>
  %b16 = ptc.convert %q : tensor<4xf32> -> tensor<4xbf16>
  %b16h = ptc.convert %q : tensor<4xf32> -> tensor<4xf16>
  %b2, %bm2 = ptc.sgd_update %q, %g, %qm {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>
  %c2, %cm2 = ptc.sgd_update %r, %g, %rm {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>
  %c16 = ptc.convert %r : tensor<4xf32> -> tensor<4xf16>
  %d16 = ptc.convert %s : tensor<4xf32> -> tensor<4xbf16>
  %d2, %dm2 = ptc.sgd_update %s, %g, %sm {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>
  %sum = ptc.add %a16, %b16 : tensor<4xbf16>, tensor<4xbf16> -> tensor<4xbf16>
  return %a2, %b2, %c2, %sum, %b16, %b16h, %d16 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xbf16>, tensor<4xbf16>, tensor<4xf16>, tensor<4xbf16>
}
