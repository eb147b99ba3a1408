// Every diagnostic of the gradient and optimizer op verifiers and of the
// argument/result role attributes, one case each.
// RUN: ptc-opt %s -split-input-file -verify-diagnostics

func.func @broadcast_shrink(%x: tensor<4x3xf32>) -> tensor<4x1xf32> {
  // expected-error @+1 {{'ptc.broadcast' op cannot broadcast 4x3 to 4x1}}
  %0 = ptc.broadcast %x : tensor<4x3xf32> -> tensor<4x1xf32>
  return %0 : tensor<4x1xf32>
}

// -----

func.func @broadcast_incompatible(%x: tensor<3xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.broadcast' op operand shapes 3 and 4 do not broadcast}}
  %0 = ptc.broadcast %x : tensor<3xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @pad_rank(%x: tensor<4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'ptc.pad' op input, result and offsets must have the same rank}}
  %0 = ptc.pad %x offsets = [0] : tensor<4xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

func.func @pad_bounds(%x: tensor<4xf32>) -> tensor<6xf32> {
  // expected-error @+1 {{'ptc.pad' op padded region of dimension 0 (offset 3, size 4) exceeds the result size 6}}
  %0 = ptc.pad %x offsets = [3] : tensor<4xf32> -> tensor<6xf32>
  return %0 : tensor<6xf32>
}

// -----

func.func @softmax_grad_axis(%y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'ptc.softmax_grad' op axis -3 is out of range for rank 2}}
  %0 = ptc.softmax_grad %y, %y {axis = -3 : i64} : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @layer_norm_grad_weight(%x: tensor<4x8xf32>, %w: tensor<4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'ptc.layer_norm_grad' op weight and bias must have shape [8] (the normalized dimension), got 4}}
  %dx, %dw, %db = ptc.layer_norm_grad %x, %w, %x : tensor<4x8xf32>, tensor<4xf32>
  return %dx : tensor<4x8xf32>
}

// -----

func.func @attention_grad_rank(%q: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'ptc.causal_attention_grad' op operands must have shape [batch, heads, seq, head_dim], got rank 2}}
  %dq, %dk, %dv = ptc.causal_attention_grad %q, %q, %q, %q : tensor<4x8xf32>
  return %dq : tensor<4x8xf32>
}

// -----

func.func @embedding_grad_table(%ids: tensor<8xi32>, %g: tensor<8x4xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'ptc.embedding_grad' op table must have rank 2 ([rows, dim]), got rank 1}}
  %0 = ptc.embedding_grad %ids, %g : tensor<8xi32>, tensor<8x4xf32> -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

func.func @embedding_grad_shape(%ids: tensor<8xi32>, %g: tensor<8x4xf32>) -> tensor<64x3xf32> {
  // expected-error @+1 {{'ptc.embedding_grad' op grad type 'tensor<8x4xf32>' does not match the expected 'tensor<8x3xf32>'}}
  %0 = ptc.embedding_grad %ids, %g : tensor<8xi32>, tensor<8x4xf32> -> tensor<64x3xf32>
  return %0 : tensor<64x3xf32>
}

// -----

func.func @cross_entropy_grad_rank(%l: tensor<8xf32>, %t: tensor<8xi32>, %g: tensor<f32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.cross_entropy_grad' op logits must have one more dimension (classes) than targets, got logits 8 and targets 8}}
  %0 = ptc.cross_entropy_grad %l, %t, %g : tensor<8xf32>, tensor<8xi32>, tensor<f32>
  return %0 : tensor<8xf32>
}

// -----

func.func @cross_entropy_grad_type(%l: tensor<8x4xf32>, %t: tensor<8xi32>, %g: tensor<f16>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.cross_entropy_grad' op grad type 'tensor<f16>' does not match the expected 'tensor<f32>'}}
  %0 = ptc.cross_entropy_grad %l, %t, %g : tensor<8x4xf32>, tensor<8xi32>, tensor<f16>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @reduce_max_grad_axis(%x: tensor<8x4xf32>, %g: tensor<8xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.reduce_max_grad' op axis 2 is out of range for rank 2}}
  %0 = ptc.reduce_max_grad %x, %g axes = [2] : tensor<8x4xf32>, tensor<8xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @reduce_max_grad_type(%x: tensor<8x4xf32>, %g: tensor<4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.reduce_max_grad' op grad type 'tensor<4xf32>' does not match the expected 'tensor<8xf32>'}}
  %0 = ptc.reduce_max_grad %x, %g axes = [1] : tensor<8x4xf32>, tensor<4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @top_k_grad_logits(%l: tensor<8xf32>, %e: tensor<8x1xi32>, %g: tensor<8x1xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'ptc.top_k_gate_grad' op logits must have shape [tokens, experts] or [groups, tokens, experts], got rank 1}}
  %0 = ptc.top_k_gate_grad %l, %e, %g : tensor<8xf32>, tensor<8x1xi32>, tensor<8x1xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @top_k_grad_shapes(%l: tensor<8x4xf32>, %e: tensor<8x2xi32>, %g: tensor<8x1xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.top_k_gate_grad' op weights_grad must have the shape of indices 8x2, got 8x1}}
  %0 = ptc.top_k_gate_grad %l, %e, %g : tensor<8x4xf32>, tensor<8x2xi32>, tensor<8x1xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @top_k_grad_type(%l: tensor<8x4xf32>, %e: tensor<8x2xi32>, %g: tensor<8x2xbf16>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.top_k_gate_grad' op weights_grad element type 'bf16' differs from logits element type 'f32'}}
  %0 = ptc.top_k_gate_grad %l, %e, %g : tensor<8x4xf32>, tensor<8x2xi32>, tensor<8x2xbf16>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @dispatch_grad_rank(%g: tensor<4x8xf32>, %e: tensor<8x2xi32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch_grad' op grad must have shape [experts, capacity, dim], got 4x8}}
  %0 = ptc.moe_dispatch_grad %g, %e : tensor<4x8xf32>, tensor<8x2xi32> -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

func.func @dispatch_grad_indices(%g: tensor<4x2x8xf32>, %e: tensor<8xi32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch_grad' op indices must have shape [tokens, k] or [groups, tokens, k], got 8}}
  %0 = ptc.moe_dispatch_grad %g, %e : tensor<4x2x8xf32>, tensor<8xi32> -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

func.func @dispatch_grad_result(%g: tensor<4x2x8xf32>, %e: tensor<8x2xi32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'ptc.moe_dispatch_grad' op result type 'tensor<8x4xf32>' does not match the expected 'tensor<8x8xf32>'}}
  %0 = ptc.moe_dispatch_grad %g, %e : tensor<4x2x8xf32>, tensor<8x2xi32> -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @combine_grad_operands(%o: tensor<4x2xf32>, %w: tensor<8x2xf32>, %e: tensor<8x2xi32>, %g: tensor<8x2xf32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'ptc.moe_combine_grad' op expert_output must have shape [experts, capacity, dim], got 4x2}}
  %do, %dw = ptc.moe_combine_grad %o, %w, %e, %g : tensor<4x2xf32>, tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x2xf32>
  return %do : tensor<4x2xf32>
}

// -----

func.func @combine_grad_type(%o: tensor<4x2x3xf32>, %w: tensor<8x2xf32>, %e: tensor<8x2xi32>, %g: tensor<8x2xf32>) -> tensor<4x2x3xf32> {
  // expected-error @+1 {{'ptc.moe_combine_grad' op grad type 'tensor<8x2xf32>' does not match the expected 'tensor<8x3xf32>'}}
  %do, %dw = ptc.moe_combine_grad %o, %w, %e, %g : tensor<4x2x3xf32>, tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x2xf32>
  return %do : tensor<4x2x3xf32>
}

// -----

func.func @adamw_lr(%p: tensor<4xf32>, %t: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.adamw_update' op lr = -1 must be in [0, inf)}}
  %a, %b, %c = ptc.adamw_update %p, %p, %p, %p, %t {lr = -1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<f32>
  return %a : tensor<4xf32>
}

// -----

func.func @adamw_beta(%p: tensor<4xf32>, %t: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.adamw_update' op beta2 = 1 must be in [0, 1)}}
  %a, %b, %c = ptc.adamw_update %p, %p, %p, %p, %t {lr = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 1.0 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<f32>
  return %a : tensor<4xf32>
}

// -----

func.func @adamw_eps(%p: tensor<4xf32>, %t: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.adamw_update' op eps = 0 must be in (0, inf)}}
  %a, %b, %c = ptc.adamw_update %p, %p, %p, %p, %t {lr = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.9 : f64, eps = 0.0 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<f32>
  return %a : tensor<4xf32>
}

// -----

func.func @adamw_grad_shape(%p: tensor<4xf32>, %g: tensor<5xbf16>, %t: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.adamw_update' op gradient shape 'tensor<5xbf16>' differs from the parameter's 'tensor<4xf32>'}}
  %a, %b, %c = ptc.adamw_update %p, %g, %p, %p, %t {lr = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.9 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32> grad(tensor<5xbf16>), tensor<f32>
  return %a : tensor<4xf32>
}

// -----

func.func @sgd_wider_grad(%p: tensor<4xbf16>, %g: tensor<4xf32>) -> tensor<4xbf16> {
  // expected-error @+1 {{'ptc.sgd_update' op gradient type 'tensor<4xf32>' must be the parameter's, or bf16 / f16 for an f32 parameter, not for 'tensor<4xbf16>'}}
  %a, %b = ptc.sgd_update %p, %g, %p {lr = 1.0 : f64, momentum = 0.5 : f64, weight_decay = 0.0 : f64} : tensor<4xbf16> grad(tensor<4xf32>)
  return %a : tensor<4xbf16>
}

// -----

func.func @sgd_momentum(%p: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.sgd_update' op momentum = -0.5 must be in [0, inf)}}
  %a, %b = ptc.sgd_update %p, %p, %p {lr = 1.0 : f64, momentum = -0.5 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

func.func @clip_count(%g: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.clip_grad_norm' op expected 1 clipped results, got 2}}
  %c:2, %n = ptc.clip_grad_norm %g {max_norm = 1.0 : f64} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<f32>)
  return %n : tensor<f32>
}

// -----

func.func @clip_type(%g: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.clip_grad_norm' op clipped result #0 must have the type of grad #0, 'tensor<4xf32>'}}
  %c, %n = ptc.clip_grad_norm %g {max_norm = 1.0 : f64} : (tensor<4xf32>) -> (tensor<2xf32>, tensor<f32>)
  return %n : tensor<f32>
}

// -----

func.func @clip_norm(%g: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'ptc.clip_grad_norm' op max_norm = 0 must be in (0, inf)}}
  %c, %n = ptc.clip_grad_norm %g {max_norm = 0.0 : f64} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>)
  return %n : tensor<f32>
}

// -----

// expected-error @+1 {{'ptc.init' on argument #0 must be "zeros", "ones" or "normal:<std>" with std > 0, got "normal:-1"}}
func.func @init_spec(%w: tensor<4xf32> {ptc.param = "w", ptc.init = "normal:-1"}) {
  return
}

// -----

// expected-error @+1 {{'ptc.init' on argument #0 needs a 'ptc.param' on the same argument}}
func.func @init_without_param(%x: tensor<4xf32> {ptc.input = "x", ptc.init = "zeros"}) {
  return
}

// -----

// expected-error @+1 {{optimizer state 'm' must have a floating-point element type, got 'i32'}}
func.func @state_int(%m: tensor<4xi32> {ptc.state = "m"}) {
  return
}

// -----

// expected-error @+1 {{argument #0 has both 'ptc.param' and 'ptc.state'}}
func.func @two_roles(%w: tensor<4xf32> {ptc.param = "w", ptc.state = "s"}) {
  return
}

// -----

// expected-error @+1 {{'ptc.state_of' on argument #0 must be {param = "<parameter name>"} or {param = "<name>", dropped_dim = <dimension>}}}
func.func @state_of_no_param(%m: tensor<4xf32> {ptc.state = "m", ptc.state_of = {dropped_dim = 0 : i64}}) {
  return
}

// -----

// expected-error @+1 {{'ptc.state_of' on argument #0: dropped_dim -1 is not a dimension of the parameter}}
func.func @state_of_bad_dim(%m: tensor<4xf32> {ptc.state = "m", ptc.state_of = {param = "w", dropped_dim = -1 : i64}}) {
  return
}

// -----

// expected-error @+1 {{'ptc.state_of' on argument #0 needs a 'ptc.state' on the same argument}}
func.func @state_of_without_state(%m: tensor<4xf32> {ptc.state_of = {param = "w"}}) {
  return
}

// -----

// expected-error @+1 {{'ptc.loss' on result #0 must be a unit attribute on a scalar float tensor}}
func.func @loss_not_scalar(%a: tensor<4xf32>) -> (tensor<4xf32> {ptc.loss}) {
  return %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{unknown ptc result attribute 'ptc.gradient' on result #0}}
func.func @unknown_result_attr(%a: tensor<4xf32>) -> (tensor<4xf32> {ptc.gradient = "a"}) {
  return %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{'ptc.grad' on result #0 must name an argument}}
func.func @grad_not_string(%a: tensor<4xf32> {ptc.param = "a"}) -> (tensor<4xf32> {ptc.grad = 1 : i64}) {
  return %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{result #0 ('ptc.grad' of 'a') has type 'tensor<2xf32>' but the argument has type 'tensor<4xf32>'}}
func.func @grad_type(%a: tensor<4xf32> {ptc.param = "a"}, %b: tensor<2xf32>) -> (tensor<2xf32> {ptc.grad = "a"}) {
  return %b : tensor<2xf32>
}

// -----

// expected-error @+1 {{'ptc.update' on result #0 names 'z', which is not a parameter or state of the function}}
func.func @update_unknown(%a: tensor<4xf32> {ptc.param = "a"}) -> (tensor<4xf32> {ptc.update = "z"}) {
  return %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{'ptc.grad' on result #0 names 's', which is not a parameter of the function}}
func.func @grad_of_state(%s: tensor<4xf32> {ptc.state = "s"}) -> (tensor<4xf32> {ptc.grad = "s"}) {
  return %s : tensor<4xf32>
}

// -----

// A working copy is the f32 parameter's shape in bf16 or f16.
func.func @adamw_working_copy_shape(%p: tensor<4xf32>, %t: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.adamw_update' op working copy 'tensor<5xbf16>' must be an f32 parameter's shape in bf16 or f16, for 'tensor<4xf32>'}}
  %a, %b, %c, %w = ptc.adamw_update %p, %p, %p, %p, %t {lr = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.9 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<f32> working_copy(tensor<5xbf16>)
  return %a : tensor<4xf32>
}

// -----

func.func @sgd_working_copy_type(%p: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'ptc.sgd_update' op working copy 'tensor<4xf32>' must be an f32 parameter's shape in bf16 or f16, for 'tensor<4xf32>'}}
  %a, %b, %w = ptc.sgd_update %p, %p, %p {lr = 0.1 : f64, momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<4xf32> working_copy(tensor<4xf32>)
  return %a : tensor<4xf32>
}

// -----

// A working copy argument names a parameter of the function, whose type it
// rounds.
// expected-error @+1 {{'ptc.working_copy' on argument #1 names 'v', which is not a parameter of the function}}
func.func @working_copy_of_nothing(%p: tensor<4xf32> {ptc.param = "w"}, %c: tensor<4xbf16> {ptc.working_copy = "v"}) {
  return
}

// -----

// expected-error @+1 {{'ptc.working_copy' argument #1 of type 'tensor<2x2xbf16>' must be parameter 'w' ('tensor<4xf32>') in bf16 or f16}}
func.func @working_copy_shape(%p: tensor<4xf32> {ptc.param = "w"}, %c: tensor<2x2xbf16> {ptc.working_copy = "w"}) {
  return
}

// -----

// expected-error @+1 {{result #0 ('ptc.working_copy' of 'w') has type 'tensor<4xf16>' but the working copy argument has type 'tensor<4xbf16>'}}
func.func @working_copy_result(%p: tensor<4xf32> {ptc.param = "w"}, %c: tensor<4xbf16> {ptc.working_copy = "w"},
                               %h: tensor<4xf16>) -> (tensor<4xf16> {ptc.working_copy = "w"}) {
  return %h : tensor<4xf16>
}
