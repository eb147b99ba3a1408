//===- PtcDecodeOps.td - ops of forward-only decode plans -------*- tablegen -*-===//
//
// The ops ptc-derive-decode (passes/inference) puts in the prefill and decode
// functions it derives from a training model: attention that reads and
// appends a key/value cache, and rotary embeddings at given positions. They
// have no gradient (decode plans are forward-only).
//
//===----------------------------------------------------------------------===//

#ifndef PTC_DECODE_OPS_TD
#define PTC_DECODE_OPS_TD

def Ptc_CachedAttentionOp : Ptc_Op<"cached_attention", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    AllTypesMatch<["query", "result"]>, AllTypesMatch<["key", "value"]>,
    AllTypesMatch<["key_cache", "value_cache", "new_key_cache", "new_value_cache"]>]> {
  let summary = "causal attention of new tokens over a key/value cache";
  let description = [{
    `query` has shape `[batch, heads, tokens, head_dim]`, `key` and `value`
    `[batch, kv_heads, tokens, head_dim]` (the new tokens' projections,
    `kv_heads` dividing `heads` as in `ptc.causal_attention`), the caches
    `[batch, kv_heads, context, head_dim]` and `positions` `[batch, tokens]`
    the absolute position of each new token (`i32`, below `context`).

    The new caches are the old ones with row `positions[b, t]` of batch entry
    `b` replaced by the new token's key (value). Query `(b, t)` then attends
    over the cache rows `0 .. positions[b, t]` of the new caches, with the
    scale of `ptc.causal_attention` (default `1 / sqrt(head_dim)`): for a
    prompt at positions `0 .. tokens-1` over empty caches the result is
    `ptc.causal_attention` of the prompt, and one token at position `p` sees
    the `p` tokens before it as they were cached. The rows a query may see
    must have been written (by this op or an earlier call); the plan writes
    the new caches in place of the old ones.

    ```mlir
    %o, %kc2, %vc2 = ptc.cached_attention %q, %k, %v, %kc, %vc, %pos
        : tensor<1x4x1x32xf32>, tensor<1x4x1x32xf32>, tensor<1x4x256x32xf32>, tensor<1x1xi32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$query, Ptc_FloatTensor:$key, Ptc_FloatTensor:$value,
                       Ptc_FloatTensor:$key_cache, Ptc_FloatTensor:$value_cache,
                       Ptc_IdTensor:$positions, OptionalAttr<F64Attr>:$scale);
  let results = (outs Ptc_FloatTensor:$result, Ptc_FloatTensor:$new_key_cache,
                      Ptc_FloatTensor:$new_value_cache);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $key_cache `,` $value_cache `,` $positions attr-dict `:`
    type($query) `,` type($key) `,` type($key_cache) `,` type($positions)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The scale applied to query * key^T: the attribute, or 1/sqrt(head_dim).
    double getScaleOrDefault();
  }];
}

def Ptc_RotaryAtOp : Ptc_Op<"rotary_at", [DeclareOpInterfaceMethods<Ptc_PlanInstructionOpInterface>, DeclareOpInterfaceMethods<Ptc_ShardingRuleOpInterface>, Pure,
    DeclareOpInterfaceMethods<Ptc_MicrobatchOpInterface>, DeclareOpInterfaceMethods<Ptc_DifferentiableOpInterface>,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "rotary position embedding at given positions";
  let description = [{
    `ptc.rotary` with the position of row `(b, h, t)` read from
    `positions[b, t]` (`i32`, shape `[batch, tokens]`) instead of being `t`:
    the rotation of new tokens that continue a cached sequence, and of packed
    documents, whose positions restart at each document. With `inverse`, the
    rotation goes the other way (its gradient). With `seq_major`, the input
    is `[batch, tokens, heads, head_dim]` (as `ptc.rotary`'s).

    ```mlir
    %q2 = ptc.rotary_at %q, %pos {theta = 1.000000e+04 : f64} : tensor<1x8x1x16xf32>, tensor<1x1xi32>
    ```
  }];
  let arguments = (ins Ptc_FloatTensor:$input, Ptc_IdTensor:$positions,
                       DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                       DefaultValuedAttr<BoolAttr, "false">:$inverse,
                       DefaultValuedAttr<BoolAttr, "false">:$seq_major);
  let results = (outs Ptc_FloatTensor:$result);
  let assemblyFormat = "$input `,` $positions attr-dict `:` type($input) `,` type($positions)";
  let hasVerifier = 1;
}

#endif // PTC_DECODE_OPS_TD
