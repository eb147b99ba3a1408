//===- PtcOps.cpp - ptc operation verifiers, shape functions, builders ----===//

#include "dialects/ptc/PtcOps.h"
#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"
#include "kernels/common/dropout.h"
#include "kernels/common/shape_rules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <cstdio>
#include <limits>

using namespace mlir;
using namespace mlir::ptc;

std::optional<SegmentKind> mlir::ptc::getSegment(Operation *op) {
  auto seg = op->getAttrOfType<StringAttr>(PtcDialect::kSegmentAttrName);
  if (!seg)
    return std::nullopt;
  return ::ptc::schedule::lookupSegment(seg.getValue()).value_or(SegmentKind::Step);
}

int64_t mlir::ptc::getNumElements(ShapedType type) {
  // Saturates instead of wrapping: a type with more elements than int64
  // holds reads as INT64_MAX, which every size check then refuses.
  int64_t n = 1;
  for (int64_t d : type.getShape())
    if (llvm::MulOverflow(n, d, n))
      return std::numeric_limits<int64_t>::max();
  return n;
}

void mlir::ptc::replaceReturn(func::FuncOp func, ArrayRef<Value> results,
                              ArrayRef<DictionaryAttr> resultAttrs) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  OpBuilder b(ret);
  func::ReturnOp::create(b, ret.getLoc(), results);
  ret.erase();
  SmallVector<Type> types;
  for (Value v : results)
    types.push_back(v.getType());
  func.setType(b.getFunctionType(func.getArgumentTypes(), types));
  func.setAllResultAttrs(resultAttrs);
}

std::string mlir::ptc::shapeStr(ArrayRef<int64_t> shape) {
  return ::ptc::kernels::shapes::shapeText(shape);
}

namespace {

/// Maps a possibly negative axis into [0, rank), or fails.
FailureOr<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    return failure();
  return axis < 0 ? axis + rank : axis;
}

/// Shared tail of every verifier that has a shape function: the declared
/// result type must be the inferred one.
LogicalResult checkResultType(Operation *op, Type actual, FailureOr<RankedTensorType> inferred) {
  if (failed(inferred))
    return failure();
  if (actual != *inferred)
    return op->emitOpError() << "result type " << actual << " does not match the expected "
                             << *inferred;
  return success();
}

/// A shared shape rule's result (kernels/common/shape_rules.h) as a type of
/// `element`, or its message as the op's error.
FailureOr<RankedTensorType> typeOf(const ::ptc::kernels::shapes::Inferred &inferred, Type element,
                                   EmitErrorFn emitError) {
  if (!inferred.ok()) {
    emitError() << inferred.error;
    return failure();
  }
  return RankedTensorType::get(inferred.shape, element);
}

LogicalResult checkSameElementType(EmitErrorFn emitError, StringRef what, Type a, StringRef whatB,
                                   Type b) {
  if (a == b)
    return success();
  return emitError() << what << " element type " << a << " differs from " << whatB
                     << " element type " << b;
}
} // namespace

//===----------------------------------------------------------------------===//
// Shape functions
//===----------------------------------------------------------------------===//

FailureOr<RankedTensorType> mlir::ptc::inferBroadcastType(RankedTensorType lhs,
                                                          RankedTensorType rhs,
                                                          EmitErrorFn emitError) {
  if (failed(checkSameElementType(emitError, "lhs", lhs.getElementType(), "rhs",
                                  rhs.getElementType())))
    return failure();
  return typeOf(::ptc::kernels::shapes::broadcast(lhs.getShape(), rhs.getShape()),
                lhs.getElementType(), emitError);
}

Type mlir::ptc::inferBroadcastTypeOrFallback(Location loc, Value lhs, Value rhs) {
  auto lhsType = cast<RankedTensorType>(lhs.getType());
  auto inferred = inferBroadcastType(lhsType, cast<RankedTensorType>(rhs.getType()),
                                     [&] { return mlir::emitError(loc); });
  return succeeded(inferred) ? Type(*inferred) : Type(lhsType);
}

FailureOr<RankedTensorType> mlir::ptc::inferMatmulType(RankedTensorType lhs, RankedTensorType rhs,
                                                       bool transposeLhs, bool transposeRhs,
                                                       EmitErrorFn emitError) {
  if (failed(checkSameElementType(emitError, "lhs", lhs.getElementType(), "rhs",
                                  rhs.getElementType())))
    return failure();
  return typeOf(::ptc::kernels::shapes::matmul(lhs.getShape(), rhs.getShape(), transposeLhs,
                                               transposeRhs),
                lhs.getElementType(), emitError);
}

FailureOr<RankedTensorType> mlir::ptc::inferEmbeddingType(RankedTensorType table,
                                                          RankedTensorType indices,
                                                          EmitErrorFn emitError) {
  return typeOf(::ptc::kernels::shapes::embedding(table.getShape(), indices.getShape()),
                table.getElementType(), emitError);
}

FailureOr<RankedTensorType> mlir::ptc::inferCrossEntropyType(RankedTensorType logits,
                                                             RankedTensorType targets,
                                                             EmitErrorFn emitError) {
  return typeOf(::ptc::kernels::shapes::crossEntropy(logits.getShape(), targets.getShape()),
                logits.getElementType(), emitError);
}

FailureOr<RankedTensorType> mlir::ptc::inferTransposeType(RankedTensorType input,
                                                          ArrayRef<int64_t> permutation,
                                                          EmitErrorFn emitError) {
  return typeOf(::ptc::kernels::shapes::transpose(input.getShape(), permutation),
                input.getElementType(), emitError);
}

FailureOr<RankedTensorType> mlir::ptc::inferReduceType(RankedTensorType input,
                                                       ArrayRef<int64_t> axes, bool keepDims,
                                                       EmitErrorFn emitError) {
  int64_t rank = input.getRank();
  SmallVector<bool> reduced(rank, false);
  for (int64_t axis : axes) {
    FailureOr<int64_t> a = normalizeAxis(axis, rank);
    if (failed(a)) {
      emitError() << "axis " << axis << " is out of range for rank " << rank;
      return failure();
    }
    if (reduced[*a]) {
      emitError() << "axis " << axis << " is reduced twice";
      return failure();
    }
    reduced[*a] = true;
  }
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) {
    if (!reduced[i])
      shape.push_back(input.getDimSize(i));
    else if (keepDims)
      shape.push_back(1);
  }
  return RankedTensorType::get(shape, input.getElementType());
}

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

#define PTC_BINARY_VERIFIER(OP)                                                                    \
  LogicalResult OP::verify() {                                                                     \
    return checkResultType(*this, getType(),                                                       \
                           inferBroadcastType(getLhs().getType(), getRhs().getType(),              \
                                              [&] { return emitOpError(); }));                     \
  }
PTC_BINARY_VERIFIER(AddOp)
PTC_BINARY_VERIFIER(SubOp)
PTC_BINARY_VERIFIER(MulOp)
PTC_BINARY_VERIFIER(DivOp)
#undef PTC_BINARY_VERIFIER

LogicalResult MatmulOp::verify() {
  if (failed(checkResultType(*this, getType(),
                             inferMatmulType(getLhs().getType(), getRhs().getType(),
                                             getTransposeLhs(), getTransposeRhs(),
                                             [&] { return emitOpError(); }))))
    return failure();
  if (Value bias = getBias()) {
    auto type = cast<RankedTensorType>(bias.getType());
    RankedTensorType result = getType();
    if (type.getRank() != 1 || type.getDimSize(0) != result.getShape().back())
      return emitOpError() << "bias must be a vector of the result's last dimension ("
                           << result.getShape().back() << "), got " << type;
    if (type.getElementType() != result.getElementType())
      return emitOpError() << "bias element type " << type.getElementType()
                           << " differs from the result's " << result.getElementType();
  }
  return success();
}

void MatmulOp::build(OpBuilder &builder, OperationState &state, Value lhs, Value rhs,
                     bool transposeLhs, bool transposeRhs, Value bias) {
  auto lhsType = cast<RankedTensorType>(lhs.getType());
  auto inferred = inferMatmulType(lhsType, cast<RankedTensorType>(rhs.getType()), transposeLhs,
                                  transposeRhs, [&] { return mlir::emitError(state.location); });
  build(builder, state, succeeded(inferred) ? Type(*inferred) : Type(lhsType), lhs, rhs, bias,
        transposeLhs, transposeRhs);
}

namespace {
LogicalResult verifyAxis(Operation *op, int64_t axis, int64_t rank) {
  if (failed(normalizeAxis(axis, rank)))
    return op->emitOpError() << "axis " << axis << " is out of range for rank " << rank;
  return success();
}

/// Query [batch, heads, seq, head_dim] (seqMajor: [batch, seq, heads,
/// head_dim]); key and value the same with kv_heads dividing heads.
LogicalResult verifyAttentionOperands(Operation *op, RankedTensorType type,
                                      RankedTensorType kv, std::optional<llvm::APFloat> scale,
                                      bool seqMajor = false) {
  if (std::string why =
          ::ptc::kernels::shapes::attentionOperands(type.getShape(), kv.getShape(), seqMajor);
      !why.empty())
    return op->emitOpError() << why;
  if (kv.getElementType() != type.getElementType())
    return op->emitOpError() << "query and key must have the same element type";
  if (scale && !(scale->convertToDouble() > 0.0))
    return op->emitOpError() << "scale must be positive, got " << scale->convertToDouble();
  return success();
}
} // namespace

// `: type(query)` alone when key and value have the query's type, else
// `: type(query), type(key)` (grouped-query attention).
static ParseResult parseAttentionTypes(OpAsmParser &parser, Type &queryType, Type &keyType) {
  if (parser.parseType(queryType))
    return failure();
  keyType = queryType;
  if (succeeded(parser.parseOptionalComma()))
    return parser.parseType(keyType);
  return success();
}

static void printAttentionTypes(OpAsmPrinter &printer, Operation *, Type queryType, Type keyType) {
  printer << queryType;
  if (keyType != queryType)
    printer << ", " << keyType;
}

// A variadic operand list's types, none at all allowed (`: -> T` for an
// empty ptc.any_nonfinite: a pipeline rank that joins the flag only).
static ParseResult parseTypesOrNone(OpAsmParser &parser, SmallVectorImpl<Type> &types) {
  Type first;
  OptionalParseResult got = parser.parseOptionalType(first);
  if (!got.has_value())
    return success();
  if (failed(*got))
    return failure();
  types.push_back(first);
  while (succeeded(parser.parseOptionalComma()))
    if (parser.parseType(types.emplace_back()))
      return failure();
  return success();
}

static void printTypesOrNone(OpAsmPrinter &printer, Operation *, TypeRange types) {
  llvm::interleaveComma(types, printer);
}

// An optimizer update's types: `type(param)` when the gradient has it, else
// `type(param) grad(type)` (a narrower float gradient for an f32 parameter).
static ParseResult parseOptimizerTypes(OpAsmParser &parser, Type &paramType, Type &gradType) {
  if (parser.parseType(paramType))
    return failure();
  gradType = paramType;
  if (failed(parser.parseOptionalKeyword("grad")))
    return success();
  return failure(parser.parseLParen() || parser.parseType(gradType) || parser.parseRParen());
}

static void printOptimizerTypes(OpAsmPrinter &printer, Operation *, Type paramType,
                                Type gradType) {
  printer << paramType;
  if (gradType != paramType)
    printer << " grad(" << gradType << ")";
}

LogicalResult mlir::ptc::verifyRowNorm(Operation *op, double epsilon) {
  // A forward normalization has a bias when it has three operands, its
  // gradient when it has three results.
  const bool bias = op->hasTrait<OpTrait::RowNormalization>() ? op->getNumOperands() == 3
                                                                : op->getNumResults() == 3;
  auto input = cast<RankedTensorType>(op->getOperand(0).getType());
  auto weight = cast<RankedTensorType>(op->getOperand(1).getType());
  if (input.getRank() < 1)
    return op->emitOpError() << "input must have rank >= 1";
  if (weight.getRank() != 1 || weight.getDimSize(0) != input.getShape().back())
    return op->emitOpError() << (bias ? "weight and bias" : "weight") << " must have shape ["
                             << input.getShape().back() << "] (the normalized dimension), got "
                             << shapeStr(weight.getShape());
  if (failed(checkSameElementType([&] { return op->emitOpError(); }, "input",
                                  input.getElementType(), "weight", weight.getElementType())))
    return failure();
  if (!(epsilon > 0.0))
    return op->emitOpError() << "epsilon must be positive, got " << epsilon;
  return success();
}

LogicalResult mlir::ptc::verifyRotaryInput(Operation *op, RankedTensorType type, double theta) {
  if (type.getRank() != 4 || type.getDimSize(3) % 2 != 0)
    return op->emitOpError() << "input must have shape [batch, heads, seq, head_dim] with an even "
                                "head_dim, got "
                             << shapeStr(type.getShape());
  if (!(theta > 1.0))
    return op->emitOpError() << "theta must be greater than 1, got " << theta;
  return success();
}

LogicalResult RotaryOp::verify() {
  return verifyRotaryInput(*this, getType(), getTheta().convertToDouble());
}

LogicalResult DropoutOp::verify() {
  const double p = getP().convertToDouble();
  if (!(p >= 0.0 && p < 1.0))
    return emitOpError() << "p must be in [0, 1), got " << p;
  const int64_t stream = getStreamAttr().getInt();
  if (stream < 0 || stream > INT32_MAX)
    return emitOpError() << "stream must be in [0, 2^31), got " << stream;
  if (getInput().getType().getRank() > ::ptc::kernels::DropoutMask::kMaxRank)
    return emitOpError() << "takes inputs of rank <= " << ::ptc::kernels::DropoutMask::kMaxRank
                         << ", got rank " << getInput().getType().getRank();
  return success();
}

LogicalResult SoftmaxOp::verify() {
  return verifyAxis(*this, getAxis(), getInput().getType().getRank());
}

LogicalResult mlir::ptc::verifyTokenPositions(Operation *op, RankedTensorType rows,
                                              RankedTensorType positions, int64_t tokenDim) {
  if (positions.getRank() != 2 || positions.getDimSize(0) != rows.getDimSize(0) ||
      positions.getDimSize(1) != rows.getDimSize(tokenDim))
    return op->emitOpError() << "positions must have shape [batch, tokens] = ["
                             << rows.getDimSize(0) << ", " << rows.getDimSize(tokenDim)
                             << "], got " << shapeStr(positions.getShape());
  return success();
}

/// A document mask's positions (packed documents), when the op has them.
static LogicalResult verifyDocumentPositions(Operation *op, Value positions,
                                             RankedTensorType query, int64_t seqDim) {
  return positions ? verifyTokenPositions(op, query, cast<RankedTensorType>(positions.getType()),
                                          seqDim)
                   : success();
}

LogicalResult mlir::ptc::verifyAttentionStats(Operation *op, Value stats, Value savedResult,
                                             Type resultType, int64_t batch, int64_t heads,
                                             int64_t seq) {
  if (!stats && !savedResult)
    return success();
  // A forward returns the statistics; a gradient reads them with the result.
  const bool forward = stats && stats.getDefiningOp() == op;
  if (!stats || (!forward && !savedResult))
    return op->emitOpError() << "takes the forward's saved result and row statistics together";
  // The forward's result or a reshape of it (the same elements in the same
  // order: the output projection's input, which the backward keeps anyway).
  if (savedResult) {
    auto saved = cast<RankedTensorType>(savedResult.getType());
    auto want = cast<RankedTensorType>(resultType);
    if (saved.getElementType() != want.getElementType() ||
        saved.getNumElements() != want.getNumElements())
      return op->emitOpError() << "expects the saved result to be the forward result " << want
                               << " or a reshape of it, got " << saved;
  }
  auto type = cast<RankedTensorType>(stats.getType());
  if (type.getShape() != ArrayRef<int64_t>{batch, heads, seq})
    return op->emitOpError() << "expects row statistics of shape [batch, heads, seq] = ["
                             << batch << ", " << heads << ", " << seq << "], got "
                             << shapeStr(type.getShape());
  return success();
}

LogicalResult CausalAttentionOp::verify() {
  if (failed(verifyAttentionOperands(*this, getQuery().getType(), getKey().getType(), getScale(),
                                     getSeqMajor())))
    return failure();
  RankedTensorType q = getQuery().getType();
  if (failed(verifyAttentionStats(*this, getStats(), Value(), q, q.getDimSize(0),
                                  q.getDimSize(getHeadsDim()), q.getDimSize(getSeqDim()))))
    return failure();
  return verifyDocumentPositions(*this, getPositions(), getQuery().getType(), getSeqDim());
}

double CausalAttentionOp::getScaleOrDefault() {
  if (std::optional<llvm::APFloat> scale = getScale())
    return scale->convertToDouble();
  return 1.0 / std::sqrt(static_cast<double>(getQuery().getType().getDimSize(3)));
}

/// qkv [batch, seq, (heads + 2 * kv_heads) * head_dim] against the attention
/// result [batch, seq, heads, head_dim] (the forward's result, the gradient's
/// incoming gradient): the kv heads that fill the rest, and divide heads.
static LogicalResult verifyFusedQkv(Operation *op, RankedTensorType qkv,
                                    RankedTensorType result, StringRef resultName) {
  if (qkv.getRank() != 3 || result.getRank() != 4)
    return op->emitOpError() << "expects qkv of rank 3 and a " << resultName
                             << " of rank 4, got " << qkv << " and " << result;
  if (qkv.getElementType() != result.getElementType())
    return op->emitOpError() << "expects qkv and the " << resultName
                             << " to have one element type, got " << qkv << " and " << result;
  ArrayRef<int64_t> q = qkv.getShape(), r = result.getShape();
  if (q[0] != r[0] || q[1] != r[1])
    return op->emitOpError() << "expects the " << resultName << "'s batch and sequence ("
                             << r[0] << ", " << r[1] << ") to be qkv's (" << q[0] << ", "
                             << q[1] << ")";
  const int64_t heads = r[2], dim = r[3], width = q[2];
  if (heads <= 0 || dim <= 0 || width % dim != 0 || width / dim <= heads ||
      (width / dim - heads) % 2 != 0 || heads % ((width / dim - heads) / 2) != 0)
    return op->emitOpError() << "expects qkv's last dimension " << width << " to be (" << heads
                             << " heads + 2 * kv_heads) * " << dim
                             << " with kv_heads dividing the heads";
  return success();
}

LogicalResult CausalAttentionQkvOp::verify() {
  RankedTensorType r = getResult().getType();
  if (failed(verifyFusedQkv(*this, getQkv().getType(), r, "result")) ||
      failed(verifyAttentionStats(*this, getStats(), Value(), r, r.getDimSize(0),
                                  r.getDimSize(2), r.getDimSize(1))))
    return failure();
  return verifyDocumentPositions(*this, getPositions(), r, 1);
}

LogicalResult CausalAttentionQkvGradOp::verify() {
  RankedTensorType g = getGrad().getType();
  if (failed(verifyFusedQkv(*this, getQkv().getType(), g, "gradient")) ||
      failed(verifyAttentionStats(*this, getSavedStats(), getSavedResult(), g, g.getDimSize(0),
                                  g.getDimSize(2), g.getDimSize(1))))
    return failure();
  return verifyDocumentPositions(*this, getPositions(), g, 1);
}

LogicalResult MatmulBiasGradOp::verify() {
  if (failed(checkResultType(*this, getResult().getType(),
                             inferMatmulType(getLhs().getType(), getRhs().getType(),
                                             getTransposeLhs(), getTransposeRhs(),
                                             [&] { return emitOpError(); }))))
    return failure();
  RankedTensorType lhs = getLhs().getType(), biasGrad = getBiasGrad().getType();
  ::ptc::kernels::shapes::Inferred sums = ::ptc::kernels::shapes::matmulBiasGrad(
      lhs.getShape(), getRhs().getType().getShape(), getTransposeLhs());
  if (!sums.ok())
    return emitOpError() << sums.error;
  if (biasGrad.getShape() != ArrayRef<int64_t>(sums.shape) ||
      biasGrad.getElementType() != lhs.getElementType())
    return emitOpError() << "bias gradient must be " << lhs.getElementType() << " ["
                         << sums.shape[0] << "] (lhs summed over its contracted dimension), got "
                         << biasGrad;
  return success();
}

LogicalResult EmbeddingOp::verify() {
  if (failed(verifyVocabAxis(*this, getVocabAxis())))
    return failure();
  return checkResultType(*this, getType(),
                         inferEmbeddingType(getTable().getType(), getIndices().getType(),
                                            [&] { return emitOpError(); }));
}

void EmbeddingOp::build(OpBuilder &builder, OperationState &state, Value table, Value indices) {
  auto tableType = cast<RankedTensorType>(table.getType());
  auto inferred = inferEmbeddingType(tableType, cast<RankedTensorType>(indices.getType()),
                                     [&] { return mlir::emitError(state.location); });
  build(builder, state, succeeded(inferred) ? Type(*inferred) : Type(tableType), table, indices,
        StringAttr());
}

LogicalResult CrossEntropyOp::verify() {
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(), getType(),
                                "result", /*f32OverNarrowLogits=*/true);
}

void CrossEntropyOp::build(OpBuilder &builder, OperationState &state, Value logits,
                           Value targets) {
  auto logitsType = cast<RankedTensorType>(logits.getType());
  auto inferred = inferCrossEntropyType(logitsType, cast<RankedTensorType>(targets.getType()),
                                        [&] { return mlir::emitError(state.location); });
  build(builder, state,
        succeeded(inferred) ? Type(*inferred)
                            : Type(RankedTensorType::get({}, logitsType.getElementType())),
        logits, targets);
}

LogicalResult ReshapeOp::verify() {
  int64_t in = getNumElements(getInput().getType()), out = getNumElements(getType());
  if (in != out)
    return emitOpError() << "cannot reshape " << shapeStr(getInput().getType().getShape()) << " ("
                         << in << " elements) to " << shapeStr(getType().getShape()) << " ("
                         << out << " elements)";
  return success();
}

LogicalResult TransposeOp::verify() {
  return checkResultType(*this, getType(),
                         inferTransposeType(getInput().getType(), getPermutation(),
                                            [&] { return emitOpError(); }));
}

void TransposeOp::build(OpBuilder &builder, OperationState &state, Value input,
                        ArrayRef<int64_t> permutation) {
  auto inputType = cast<RankedTensorType>(input.getType());
  auto inferred = inferTransposeType(inputType, permutation,
                                     [&] { return mlir::emitError(state.location); });
  build(builder, state, succeeded(inferred) ? Type(*inferred) : Type(inputType), input,
        builder.getDenseI64ArrayAttr(permutation));
}

LogicalResult SliceOp::verify() {
  RankedTensorType input = getInput().getType(), result = getType();
  ArrayRef<int64_t> offsets = getOffsets();
  if (result.getRank() != input.getRank())
    return emitOpError() << "result rank " << result.getRank() << " differs from input rank "
                         << input.getRank();
  if (static_cast<int64_t>(offsets.size()) != input.getRank())
    return emitOpError() << "expected " << input.getRank() << " offsets, got " << offsets.size();
  for (int64_t i = 0; i < input.getRank(); ++i) {
    if (offsets[i] < 0 || offsets[i] > input.getDimSize(i) - result.getDimSize(i)) // (no overflow)
      return emitOpError() << "slice of dimension " << i << " (offset " << offsets[i]
                           << ", size " << result.getDimSize(i) << ") exceeds its size "
                           << input.getDimSize(i);
  }
  return success();
}

LogicalResult ConcatOp::verify() {
  // ODS already rejects an empty input list.
  auto first = cast<RankedTensorType>(getInputs().front().getType());
  int64_t rank = first.getRank();
  FailureOr<int64_t> axis = normalizeAxis(getAxis(), rank);
  if (failed(axis))
    return emitOpError() << "axis " << getAxis() << " is out of range for rank " << rank;
  SmallVector<int64_t> shape(first.getShape());
  shape[*axis] = 0;
  for (auto [i, value] : llvm::enumerate(getInputs())) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getRank() != rank)
      return emitOpError() << "input #" << i << " has rank " << type.getRank()
                           << ", expected " << rank;
    for (int64_t d = 0; d < rank; ++d) {
      if (d != *axis && type.getDimSize(d) != shape[d])
        return emitOpError() << "input #" << i << " has size " << type.getDimSize(d)
                             << " in dimension " << d << ", expected " << shape[d];
    }
    shape[*axis] += type.getDimSize(*axis);
  }
  return checkResultType(*this, getType(), RankedTensorType::get(shape, first.getElementType()));
}

#define PTC_REDUCE_VERIFIER(OP)                                                                    \
  LogicalResult OP::verify() {                                                                     \
    return checkResultType(*this, getType(),                                                       \
                           inferReduceType(getInput().getType(), getAxes(), getKeepDims(),         \
                                           [&] { return emitOpError(); }));                        \
  }
PTC_REDUCE_VERIFIER(ReduceSumOp)
PTC_REDUCE_VERIFIER(ReduceMeanOp)
PTC_REDUCE_VERIFIER(ReduceMaxOp)
#undef PTC_REDUCE_VERIFIER

namespace {
/// Checks top-k router shapes: `[..., experts]` logits and `[..., k]`
/// weights/indices (k <= experts).
LogicalResult verifyGateShapes(Operation *op, RankedTensorType logits, RankedTensorType choices,
                               StringRef what) {
  if (logits.getRank() < 2)
    return op->emitOpError() << "logits must have shape [tokens, experts] or [groups, tokens, "
                                "experts], got rank "
                             << logits.getRank();
  ArrayRef<int64_t> ls = logits.getShape(), cs = choices.getShape();
  if (cs.size() != ls.size() || cs.drop_back() != ls.drop_back() || cs.back() > ls.back())
    return op->emitOpError() << what << " must have shape " << shapeStr(ls.drop_back())
                             << " + [k] with k <= " << ls.back() << ", got " << shapeStr(cs);
  return success();
}

/// "[16, k]": a shape's leading dimensions and a named last one.
std::string withLast(ArrayRef<int64_t> leading, StringRef last) {
  std::string out = "[";
  for (int64_t d : leading)
    out += std::to_string(d) + ", ";
  return out + last.str() + "]";
}

/// Checks MoE routing indices: `[tokens, k]` or `[groups, tokens, k]`.
LogicalResult verifyRoutingIndices(Operation *op, RankedTensorType indices) {
  if (indices.getRank() != 2 && indices.getRank() != 3)
    return op->emitOpError() << "indices must have shape [tokens, k] or [groups, tokens, k], got "
                             << shapeStr(indices.getShape());
  return success();
}

/// Checks expert-side buffers against the indices: `[experts, groups,
/// capacity, dim]` (or `[experts, capacity, dim]` for `[tokens, k]` indices),
/// with `dim` when known (>= 0).
LogicalResult verifyExpertSide(Operation *op, StringRef name, RankedTensorType experts,
                               RankedTensorType indices, int64_t dim) {
  int64_t r = indices.getRank();
  std::string groups = r == 3 ? std::to_string(indices.getDimSize(0)) + ", " : "";
  std::string want = "[experts, " + groups + "capacity, " +
                     (dim >= 0 ? std::to_string(dim) : std::string("dim")) + "]";
  if (experts.getRank() != r + 1 || (r == 3 && experts.getDimSize(1) != indices.getDimSize(0)) ||
      (dim >= 0 && experts.getShape().back() != dim))
    return op->emitOpError() << name << " must have shape " << want << ", got "
                             << shapeStr(experts.getShape());
  if (experts.getDimSize(0) < 1 || experts.getDimSize(r - 1) < 1)
    return op->emitOpError() << name
                             << " needs at least one expert and a capacity of at least one, got "
                             << shapeStr(experts.getShape());
  return success();
}

/// Combine and its gradient: routing indices, weights of their shape and of
/// the expert buffers' element type, and expert buffers that match them.
LogicalResult verifyCombineRouting(Operation *op, RankedTensorType experts,
                                   RankedTensorType weights, RankedTensorType indices) {
  if (failed(verifyRoutingIndices(op, indices)))
    return failure();
  if (weights.getShape() != indices.getShape())
    return op->emitOpError() << "indices shape " << shapeStr(indices.getShape())
                             << " differs from weights shape " << shapeStr(weights.getShape());
  if (failed(checkSameElementType([&] { return op->emitOpError(); }, "weights",
                                  weights.getElementType(), "expert_output",
                                  experts.getElementType())))
    return failure();
  return verifyExpertSide(op, "expert_output", experts, indices, -1);
}

/// The token-side type of `indices` with `dim` features: `[..., tokens, dim]`.
RankedTensorType tokenSideType(RankedTensorType indices, int64_t dim, Type element) {
  SmallVector<int64_t> shape(indices.getShape().drop_back());
  shape.push_back(dim);
  return RankedTensorType::get(shape, element);
}
} // namespace

LogicalResult TopKGateOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (logits.getRank() < 2)
    return emitOpError() << "logits must have shape [tokens, experts] or [groups, tokens, "
                            "experts], got rank "
                         << logits.getRank();
  int64_t experts = logits.getShape().back();
  int64_t k = getKAttr().getInt();
  if (k < 1 || k > experts)
    return emitOpError() << "k = " << k << " must be in [1, " << experts
                         << "] (the number of experts)";
  SmallVector<int64_t> expected(logits.getShape().drop_back());
  expected.push_back(k);
  auto weightsType = RankedTensorType::get(expected, logits.getElementType());
  if (getWeights().getType() != weightsType)
    return emitOpError() << "weights must be " << weightsType << ", got "
                         << getWeights().getType();
  if (getIndices().getType().getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "indices must have shape " << shapeStr(expected) << ", got "
                         << shapeStr(getIndices().getType().getShape());
  if (Value bias = getSelectionBias()) {
    auto bt = cast<RankedTensorType>(bias.getType());
    if (bt.getRank() != 1 || bt.getDimSize(0) != experts || !bt.getElementType().isF32())
      return emitOpError() << "selection_bias must be tensor<" << experts << "xf32> (one per "
                           << "expert), got " << bt;
  }
  return success();
}

LogicalResult ExpertLoadOp::verify() {
  ArrayRef<int64_t> is = getIndices().getType().getShape(), rs = getType().getShape();
  if (is.size() != 2 && is.size() != 3)
    return emitOpError() << "indices must have shape [tokens, k] or [groups, tokens, k], got "
                         << shapeStr(is);
  if (rs.size() != is.size() - 1 || rs.back() < 1 || (is.size() == 3 && rs[0] != is[0]))
    return emitOpError() << "result must have shape "
                         << (is.size() == 3 ? "[" + std::to_string(is[0]) + ", experts]"
                                            : std::string("[experts]"))
                         << ", got " << shapeStr(rs);
  if (!getType().getElementType().isF32())
    return emitOpError() << "result must be f32, got " << getType().getElementType();
  return success();
}

LogicalResult MoeDispatchOp::verify() {
  RankedTensorType input = getInput().getType(), indices = getIndices().getType();
  if (input.getRank() != 2 && input.getRank() != 3)
    return emitOpError() << "input must have shape [tokens, dim] or [groups, tokens, dim], got rank "
                         << input.getRank();
  if (indices.getRank() != input.getRank() ||
      indices.getShape().drop_back() != input.getShape().drop_back())
    return emitOpError() << "indices must have shape "
                         << withLast(input.getShape().drop_back(), "k") << ", got "
                         << shapeStr(indices.getShape());
  if (failed(verifyExpertSide(*this, "result", getType(), indices, input.getShape().back())))
    return failure();
  return checkSameElementType([&] { return emitOpError(); }, "result",
                              getType().getElementType(), "input", input.getElementType());
}

LogicalResult MoeCombineOp::verify() {
  RankedTensorType experts = getExpertOutput().getType(), indices = getIndices().getType();
  if (failed(verifyCombineRouting(*this, experts, getWeights().getType(), indices)))
    return failure();
  return checkResultType(*this, getType(),
                         tokenSideType(indices, experts.getShape().back(), experts.getElementType()));
}

//===----------------------------------------------------------------------===//
// Gradient ops
//===----------------------------------------------------------------------===//

LogicalResult BroadcastOp::verify() {
  RankedTensorType input = getInput().getType(), result = getType();
  if (failed(checkSameElementType([&] { return emitOpError(); }, "input", input.getElementType(),
                                  "result", result.getElementType())))
    return failure();
  if (std::string why = ::ptc::kernels::shapes::broadcastTo(input.getShape(), result.getShape());
      !why.empty())
    return emitOpError() << why;
  return success();
}

LogicalResult PadOp::verify() {
  RankedTensorType input = getInput().getType(), result = getType();
  ArrayRef<int64_t> offsets = getOffsets();
  if (result.getRank() != input.getRank() ||
      static_cast<int64_t>(offsets.size()) != input.getRank())
    return emitOpError() << "input, result and offsets must have the same rank";
  for (int64_t i = 0; i < input.getRank(); ++i)
    if (offsets[i] < 0 || offsets[i] > result.getDimSize(i) - input.getDimSize(i)) // (no overflow)
      return emitOpError() << "padded region of dimension " << i << " (offset " << offsets[i]
                           << ", size " << input.getDimSize(i) << ") exceeds the result size "
                           << result.getDimSize(i);
  return success();
}

LogicalResult SoftmaxGradOp::verify() {
  return verifyAxis(*this, getAxis(), getOutput().getType().getRank());
}

LogicalResult CausalAttentionGradOp::verify() {
  if (failed(verifyAttentionOperands(*this, getQuery().getType(), getKey().getType(), getScale(),
                                     getSeqMajor())))
    return failure();
  RankedTensorType q = getQuery().getType();
  if (failed(verifyAttentionStats(*this, getSavedStats(), getSavedResult(), q, q.getDimSize(0),
                                  q.getDimSize(getHeadsDim()), q.getDimSize(getSeqDim()))))
    return failure();
  return verifyDocumentPositions(*this, getPositions(), getQuery().getType(), getSeqDim());
}

double CausalAttentionGradOp::getScaleOrDefault() {
  if (std::optional<llvm::APFloat> scale = getScale())
    return scale->convertToDouble();
  return 1.0 / std::sqrt(static_cast<double>(getQuery().getType().getDimSize(3)));
}

LogicalResult EmbeddingGradOp::verify() {
  if (failed(verifyVocabAxis(*this, getVocabAxis())))
    return failure();
  RankedTensorType table = getType();
  auto expected = inferEmbeddingType(table, getIndices().getType(), [&] { return emitOpError(); });
  if (failed(expected))
    return failure();
  if (*expected != getGrad().getType())
    return emitOpError() << "grad type " << getGrad().getType() << " does not match the expected "
                         << *expected;
  return success();
}

LogicalResult mlir::ptc::verifyCrossEntropyLoss(Operation *op, RankedTensorType logits,
                                                 RankedTensorType targets, Type loss,
                                                 StringRef what, bool f32OverNarrowLogits) {
  auto expected = inferCrossEntropyType(logits, targets, [&] { return op->emitOpError(); });
  if (failed(expected))
    return failure();
  // bf16 / f16 logits with an f32 loss: the kernels compute in f32 either way
  // (ptc-fuse-loss-widening drops the widened copy of the logits).
  if (f32OverNarrowLogits && loss == expected->clone(Float32Type::get(op->getContext())))
    return success();
  if (*expected != loss)
    return op->emitOpError() << what << " type " << loss << " does not match the expected "
                             << *expected;
  return success();
}

LogicalResult CrossEntropyGradOp::verify() {
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                getGrad().getType(), "grad", /*f32OverNarrowLogits=*/true);
}

LogicalResult CrossEntropyWithGradOp::verify() {
  if (failed(verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                    getLoss().getType(), "loss", /*f32OverNarrowLogits=*/true)))
    return failure();
  return verifyCrossEntropyLoss(*this, getLogits().getType(), getTargets().getType(),
                                getGrad().getType(), "grad", /*f32OverNarrowLogits=*/true);
}

LogicalResult ReduceMaxGradOp::verify() {
  auto reduced = inferReduceType(getInput().getType(), getAxes(), getKeepDims(),
                                 [&] { return emitOpError(); });
  if (failed(reduced))
    return failure();
  if (*reduced != getGrad().getType())
    return emitOpError() << "grad type " << getGrad().getType() << " does not match the expected "
                         << *reduced;
  return success();
}

LogicalResult TopKGateGradOp::verify() {
  if (failed(verifyGateShapes(*this, getLogits().getType(), getIndices().getType(), "indices")))
    return failure();
  if (getWeightsGrad().getType().getShape() != getIndices().getType().getShape())
    return emitOpError() << "weights_grad must have the shape of indices "
                         << shapeStr(getIndices().getType().getShape()) << ", got "
                         << shapeStr(getWeightsGrad().getType().getShape());
  return checkSameElementType([&] { return emitOpError(); }, "weights_grad",
                              getWeightsGrad().getType().getElementType(), "logits",
                              getLogits().getType().getElementType());
}

LogicalResult MoeDispatchGradOp::verify() {
  RankedTensorType grad = getGrad().getType(), indices = getIndices().getType();
  if (failed(verifyRoutingIndices(*this, indices)) ||
      failed(verifyExpertSide(*this, "grad", grad, indices, -1)))
    return failure();
  return checkResultType(*this, getType(),
                         tokenSideType(indices, grad.getShape().back(), grad.getElementType()));
}

LogicalResult MoeCombineGradOp::verify() {
  RankedTensorType experts = getExpertOutput().getType(), indices = getIndices().getType();
  if (failed(verifyCombineRouting(*this, experts, getWeights().getType(), indices)))
    return failure();
  auto tokens = tokenSideType(indices, experts.getShape().back(), experts.getElementType());
  if (tokens != getGrad().getType())
    return emitOpError() << "grad type " << getGrad().getType() << " does not match the expected "
                         << tokens;
  return success();
}

//===----------------------------------------------------------------------===//
// Costs (CostOpInterface)
//===----------------------------------------------------------------------===//

double MatmulOp::getFlops() {
  RankedTensorType lhs = getLhs().getType();
  int64_t k = getTransposeLhs() ? lhs.getDimSize(lhs.getRank() - 2)
                                : lhs.getDimSize(lhs.getRank() - 1);
  return 2.0 * static_cast<double>(getNumElements(getResult().getType())) *
         static_cast<double>(k);
}

double MatmulBiasGradOp::getFlops() {
  RankedTensorType lhs = getLhs().getType();
  int64_t k = lhs.getDimSize(getTransposeLhs() ? 0 : 1);
  // The product's (the sums ride along: what a memory-bound reduction cost).
  return 2.0 * static_cast<double>(getNumElements(getResult().getType())) *
         static_cast<double>(k);
}

double CausalAttentionOp::getFlops() {
  // Scores and weighted values: 2 multiply-adds per (query, key, feature),
  // counting every key (as the stage balancer always has).
  RankedTensorType q = getQuery().getType();
  int64_t keys = q.getDimSize(getSeqDim());
  return 2.0 * static_cast<double>(getNumElements(q)) * static_cast<double>(keys);
}

InFlightDiagnostic mlir::ptc::emitMicrobatchError(Operation *op, const Twine &why) {
  return op->emitOpError() << "cannot be split into micro-batches: " << why;
}

#define GET_OP_CLASSES
#include "dialects/ptc/PtcOps.cpp.inc"
