//===- Passes.td - forward-only functions for inference ----*- tablegen -*-===//

#ifndef PTC_PASSES_INFERENCE_PASSES_TD
#define PTC_PASSES_INFERENCE_PASSES_TD

include "mlir/Pass/PassBase.td"

def DeriveDecodePass : Pass<"ptc-derive-decode", "::mlir::func::FuncOp"> {
  let summary = "Derive a forward-only prefill / decode function with a key/value cache from a training model";
  let description = [{
    Runs on the model as `ptc-model` (or an importer) writes it: forward pass
    and loss, global shapes, before `ptc-autodiff`. The result is the
    function that runs `tokens` new tokens of `batch` sequences whose earlier
    tokens are in a key/value cache of `context` positions, and returns their
    next-token logits:

    - the loss goes: the function returns the logits that fed the
      cross-entropy (`ptc.logits`, `[batch, tokens, vocab]`), and only the ops
      they need stay (an MoE auxiliary loss, metrics and `targets` go too);
    - `tokens` becomes `[batch, tokens]`, and a second input `positions`
      (`[batch, tokens]`, `i32`) gives each new token's absolute position;
      every value that carries the batch or the sequence of the tokens is
      resized along them (the dimensions are tracked through each op by its
      micro-batch rule, `MicrobatchOpInterface`);
    - each `ptc.causal_attention` becomes a `ptc.cached_attention` over a
      key cache and a value cache (`[batch, kv_heads, context, head_dim]`,
      arguments with `ptc.state = "<attention>.key_cache"` that the function
      returns updated, `ptc.update`: the plan writes them in place);
    - each `ptc.rotary` becomes a `ptc.rotary_at` the positions, and a
      learned position table added to the tokens' sequence (`[seq, dim]`, a
      parameter) becomes a `ptc.embedding` lookup of the positions.

    `tokens=1` is the decode step, `tokens=P` the prefill of a P-token
    prompt: the same cache serves both. An op whose result mixes positions
    (a reduction over the sequence, an MoE routing group spanning tokens) is
    an error naming it. The result compiles like a training model without
    autodiff (`ptc-compile-decode`): sharding (tp splits heads, and the caches
    with them), memory planning, export.
  }];
  let options = [
    Option<"tokens", "tokens", "int64_t", /*default=*/"1",
           "New tokens per call (1: decode; the prompt length: prefill)">,
    Option<"context", "context", "int64_t", /*default=*/"0",
           "Positions the key/value cache holds (0: the model's sequence length)">,
    Option<"batch", "batch", "int64_t", /*default=*/"1", "Sequences generated together">
  ];
}

#endif // PTC_PASSES_INFERENCE_PASSES_TD
