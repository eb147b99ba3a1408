// The kernels' op kinds: the plan's instruction set (op_table.def's rows,
// in order: the plan's OpCode has the same values), then the kernel pieces
// the runtime composes some instructions from. A leaf: no runtime types.
#ifndef PTC_KERNELS_COMMON_OP_KIND_H
#define PTC_KERNELS_COMMON_OP_KIND_H

#include <cstddef>
#include <cstdint>

namespace ptc::kernels {

/// The kernels the runtime composes some instructions from, around the
/// collectives between them: the vocabulary-parallel cross-entropy (row
/// maxima, sums and target logits combined over the group), ring attention
/// (one block of keys at a time) and the gradient norm (a sum of squares
/// over the group, then the clip). Kernel-table entries like the plan's ops,
/// numbered after them (never in a plan). Their calls:
///   RowMax: (logits [rows, classes]) -> (maxima [rows])
///   RowSumExp: (logits, maxima) -> (sums of exp(x - max) [rows])
///   TargetLogit: (logits, targets i32 [rows]) -> (target logits [rows], 0
///     where another rank holds the target); attributes: ClassBlock
///   LossFromParts: (maxima, sums, target logits) -> (mean loss [1])
///   VocabParallelGrad: (logits, targets, loss gradient [1], maxima, sums) ->
///     (the logits' gradient); attributes: ClassBlock
///   AttentionBlock: (q [batch, heads, rows, dim], k, v [batch, kv heads, keys,
///     dim][, first keys i32 [batch, rows]]) -> (acc [batch, heads, rows, dim],
///     row max, row sum [batch, heads, rows]), accumulated (online softmax);
///     attributes: AttentionBlock (causal, scale). First keys:
///     packed documents' first key of the block each query row sees.
///   AttentionBlockGrad: (q, k, v, o, g, lse[, first keys]) -> (dq, dk, dv),
///     accumulated; attributes: AttentionBlock
///   SumOfSquares: (tensors...) -> (the sum of squares of all elements [1])
///   ClipByNorm: (gradients..., sum of squares [1]) -> (clipped gradients...,
///     norm [1]): g * min(1, max_norm / (norm + 1e-6)), norm = sqrt(sum); the
///     norm may be the sum's memory; attributes: ClipByNorm (max_norm)
/// Each with its attribute set (op_attrs.def).
#define PTC_KERNEL_PIECES(X)                                                                       \
  X(RowMax, None) X(RowSumExp, None) X(TargetLogit, ClassBlock) X(LossFromParts, None)             \
      X(VocabParallelGrad, ClassBlock) X(AttentionBlock, AttentionBlock)                           \
      X(AttentionBlockGrad, AttentionBlock) X(SumOfSquares, None) X(ClipByNorm, ClipByNorm)

/// One enumerator per row of op_table.def, in its order (the plan's OpCode
/// has the same values), then the pieces above.
enum class OpKind : uint16_t {
#define PTC_PLAN_OP(op, ...) op,
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
#define PTC_KERNEL_PIECE(piece, ...) piece,
  PTC_KERNEL_PIECES(PTC_KERNEL_PIECE)
#undef PTC_KERNEL_PIECE
};
/// The plan's ops (op_table.def's rows).
inline constexpr size_t kNumPlanOps = 0
#define PTC_PLAN_OP(op, ...) +1
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
    ;
/// Every kind a kernel table has entries for: the plan's ops and the pieces.
inline constexpr size_t kNumOpKinds = kNumPlanOps
#define PTC_KERNEL_PIECE(piece, ...) +1
    PTC_KERNEL_PIECES(PTC_KERNEL_PIECE)
#undef PTC_KERNEL_PIECE
    ;

/// "RmsNorm", from op_table.def; "RowMax" for a piece.
inline const char *opKindName(OpKind op) {
  static constexpr const char *kNames[] = {
#define PTC_PLAN_OP(op, ...) #op,
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
#define PTC_KERNEL_PIECE(piece, ...) #piece,
      PTC_KERNEL_PIECES(PTC_KERNEL_PIECE)
#undef PTC_KERNEL_PIECE
  };
  return static_cast<size_t>(op) < kNumOpKinds ? kNames[static_cast<size_t>(op)] : "?";
}

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_OP_KIND_H
