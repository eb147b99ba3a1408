//===- PtcOps.h - ptc dialect and operations --------------------*- C++ -*-===//
//
// The ptc dialect, its operations, and the shape functions that both verify
// ops and infer result types for builders.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_DIALECTS_PTC_PTCOPS_H
#define PTC_DIALECTS_PTC_PTCOPS_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "kernels/common/kernel_call.h"
#include "runtime/schedule/schedule_kinds.h"

#include "dialects/ptc/PtcDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/ptc/PtcAttrs.h.inc"

namespace mlir::ptc {
class ShardingRuleContext;

/// Batch dimension markers of MicrobatchOpInterface::inferBatchDim: no batch,
/// a mean over the batch, a sum over the batch (a loss).
constexpr int kNoBatch = -1, kBatchMean = -2, kBatchSum = -3;
/// The diagnostic of an op that cannot be split into micro-batches.
InFlightDiagnostic emitMicrobatchError(Operation *op, const Twine &why);

/// Sharding rules shared by op families (PtcShardingRules.cpp).
LogicalResult activationShardingRule(Operation *op, ShardingRuleContext &ctx);
LogicalResult activationGradShardingRule(Operation *op, ShardingRuleContext &ctx);

/// An op's instruction in the executable plan (PlanInstructionOpInterface):
/// an opcode of kernels/common/op_table.def, its attributes set by name
/// (kernels/common/op_attrs.def: `set(attr::Rotary::theta, 1e4)`), and for
/// Unary / UnaryGrad the activation.
struct PlanInstruction {
  explicit PlanInstruction(::ptc::kernels::OpKind opcode, std::string function = {})
      : opcode(opcode), attrs(::ptc::kernels::attrSetOf(opcode)), function(std::move(function)) {}
  template <typename Attr, typename Value> PlanInstruction &set(const Attr &attr, const Value &v) {
    attrs.set(attr, v);
    return *this;
  }
  ::ptc::kernels::OpKind opcode;
  ::ptc::kernels::AttrValues attrs;
  std::string function;
};
/// The index of a mesh axis by name, for attributes that name one (-1
/// without a mesh).
using MeshAxisIndexFn = llvm::function_ref<int64_t(StringRef)>;

/// The facts every row normalization shares (the Ptc_RowNormOp and
/// Ptc_RowNormGradOp classes of the ODS; operands: input, weight[, bias] or
/// input, weight, result gradient): the verifier, the batch dimension
/// (PtcMicrobatchRules.cpp) and the sharding rules (PtcShardingRules.cpp).
LogicalResult verifyRowNorm(Operation *op, double epsilon);

/// Positions of tokens (decoding's places in the cache, packed documents'
/// places in their document): `positions` must be [batch, tokens] of `rows`,
/// whose tokens run along dimension `tokenDim` ([batch, heads, tokens, dim]:
/// 2; seq-major [batch, tokens, heads, dim]: 1).
LogicalResult verifyTokenPositions(Operation *op, RankedTensorType rows,
                                   RankedTensorType positions, int64_t tokenDim = 2);
/// An attention's row statistics (ptc-save-attention-stats): `stats` f32
/// [batch, heads, seq]; a gradient's `savedResult` (given with them, never
/// alone): the forward's result (of type `resultType`) or a reshape of it.
LogicalResult verifyAttentionStats(Operation *op, Value stats, Value savedResult,
                                   Type resultType, int64_t batch, int64_t heads, int64_t seq);
FailureOr<int> rowNormBatchDim(Operation *op, ArrayRef<int> operandDims);
LogicalResult rowNormShardingRule(Operation *op, ShardingRuleContext &ctx);
LogicalResult rowNormGradShardingRule(Operation *op, ShardingRuleContext &ctx);
} // namespace mlir::ptc

namespace mlir::OpTrait {
/// Marks a normalization of every row along the last dimension (LayerNorm,
/// RMSNorm): `ptc-recompute`'s `full` policy keeps their inputs, the
/// residual stream.
template <typename ConcreteType>
class RowNormalization : public TraitBase<ConcreteType, RowNormalization> {};
} // namespace mlir::OpTrait

#include "dialects/ptc/PtcInterfaces.h.inc"

namespace mlir::ptc {

/// Produces the diagnostic a shape function reports through.
using EmitErrorFn = llvm::function_ref<InFlightDiagnostic()>;

// Shape functions. Each checks its operands and returns the result type, or
// emits one diagnostic through `emitError` and fails. Op verifiers and builders
// share them, so a builder can never produce a type its verifier rejects.
FailureOr<RankedTensorType> inferBroadcastType(RankedTensorType lhs, RankedTensorType rhs,
                                               EmitErrorFn emitError);
FailureOr<RankedTensorType> inferMatmulType(RankedTensorType lhs, RankedTensorType rhs,
                                            bool transposeLhs, bool transposeRhs,
                                            EmitErrorFn emitError);
FailureOr<RankedTensorType> inferEmbeddingType(RankedTensorType table, RankedTensorType indices,
                                               EmitErrorFn emitError);
FailureOr<RankedTensorType> inferCrossEntropyType(RankedTensorType logits,
                                                  RankedTensorType targets,
                                                  EmitErrorFn emitError);
FailureOr<RankedTensorType> inferTransposeType(RankedTensorType input,
                                               ArrayRef<int64_t> permutation,
                                               EmitErrorFn emitError);
FailureOr<RankedTensorType> inferReduceType(RankedTensorType input, ArrayRef<int64_t> axes,
                                            bool keepDims, EmitErrorFn emitError);

/// A shape as `4x8x16` (or `scalar` for rank 0), for diagnostics.
std::string shapeStr(ArrayRef<int64_t> shape);

/// The input of rotary embeddings (`ptc.rotary`, `ptc.rotary_at`): [batch,
/// heads, seq, head_dim] with an even head_dim, and theta > 1.
LogicalResult verifyRotaryInput(Operation *op, RankedTensorType input, double theta);

/// Checks a cross-entropy's logits/targets and that `loss` (its result, or
/// the gradient of its result) is the scalar it produces; `what` names it.
/// With `f32OverNarrowLogits`, an f32 scalar over bf16 / f16 logits is one too.
LogicalResult verifyCrossEntropyLoss(Operation *op, RankedTensorType logits,
                                     RankedTensorType targets, Type loss, StringRef what,
                                     bool f32OverNarrowLogits = false);

/// For builders: the inferred type, or (after reporting the problem at `loc`)
/// the lhs type, so that the op still exists and fails verification.
Type inferBroadcastTypeOrFallback(Location loc, Value lhs, Value rhs);

/// Replaces `func`'s return with one returning `results`, with one attribute
/// dictionary per result, and updates the function type.
void replaceReturn(func::FuncOp func, ArrayRef<Value> results,
                   ArrayRef<DictionaryAttr> resultAttrs);

/// Number of elements of a statically shaped tensor type (INT64_MAX when the
/// product overflows).
int64_t getNumElements(ShapedType type);

/// The part of a split training step an op belongs to (its `ptc.segment`,
/// set by ptc-split-stages): the schedule's segments, whose list the plan's
/// Segment enum is generated from (runtime/schedule/schedule_kinds.def).
using SegmentKind = ::ptc::schedule::Segment;
/// None: the op carries no segment.
std::optional<SegmentKind> getSegment(Operation *op);

} // namespace mlir::ptc

#define GET_OP_CLASSES
#include "dialects/ptc/PtcOps.h.inc"

#endif // PTC_DIALECTS_PTC_PTCOPS_H
