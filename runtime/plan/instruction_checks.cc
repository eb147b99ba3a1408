// The loader's check of one instruction: its operand counts, shapes, element
// types and attributes against the tensor table (the shape rule of each
// opcode), and where it may run (host or device). A plan is untrusted input;
// what passes here the kernels trust.

#include "runtime/plan/instruction_checks.h"

#include "runtime/base/checked_math.h"

#include "runtime/plan/plan_format.h"
#include "runtime/plan/plan_ops.h"

#include "kernels/common/elementwise.h"
#include "kernels/common/kernel_call.h"
#include "kernels/common/shape_rules.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <set>

namespace ptc {

using plan::DType;
using plan::OpCode;
using plan::ShapeRule;
using plan::TensorKind;
using Shape = std::vector<int64_t>;

std::string shapeStr(const Shape &s) { return kernels::shapes::shapeText(s); }

namespace {
/// Of verified shapes only: the loader has bounded their element counts
/// (checkedProduct), so no sub-product here overflows.
int64_t product(const Shape &s, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, s.size()); ++i)
    p *= s[i];
  return p;
}

/// Checks one instruction against the tensor table.
class InstructionChecker {
public:
  InstructionChecker(const plan::Instruction &inst, const std::vector<TensorInfo> &tensors,
                     const std::vector<int> &meshSizes)
      : inst_(inst), tensors_(tensors), meshSizes_(meshSizes) {
    if (inst.inputs())
      in_.assign(inputsOf(inst).begin(), inputsOf(inst).end());
    if (inst.outputs())
      out_.assign(outputsOf(inst).begin(), outputsOf(inst).end());
    if (inst.ints())
      ints_.assign(inst.ints()->begin(), inst.ints()->end());
    if (inst.floats())
      floats_.assign(inst.floats()->begin(), inst.floats()->end());
  }

  Status check();
  const std::vector<int32_t> &inputs() const { return in_; }
  const std::vector<int32_t> &outputs() const { return out_; }

private:
  template <typename... Parts> Status fail(const Parts &...parts) {
    return invalidArgument(parts...);
  }
  const Shape &in(size_t i) const { return tensors_[in_[i]].shape; }
  /// A named attribute (op_attrs.def) of the instruction's set.
  template <typename Attr> auto get(const Attr &a) const {
    return kernels::AttrReader{ints_.data(), ints_.size(), floats_.data(), floats_.size()}(a);
  }
  /// A 0-or-1 attribute.
  Status flag(const kernels::IntAttr &a) {
    const int64_t v = get(a);
    if (v != 0 && v != 1)
      return fail(a.name, " must be 0 or 1, got ", v);
    return Status::ok();
  }
  /// An attribute naming one of the plan's mesh axes (-1: none, where
  /// `noneAllowed`).
  Status meshAxis(int64_t axis, const char *what, bool noneAllowed = false) {
    if ((axis == -1 && noneAllowed) ||
        (axis >= 0 && axis < static_cast<int64_t>(meshSizes_.size())))
      return Status::ok();
    return fail(what, " ", axis, " is not an axis of the plan's mesh");
  }
  Status meshAxes(const Shape &axes) {
    for (int64_t a : axes)
      PTC_RETURN_IF_ERROR(meshAxis(a, "mesh axis"));
    return Status::ok();
  }
  /// The instruction's attribute counts against its set's (op_attrs.def).
  Status attributeCounts(kernels::AttrSet set);
  const Shape &out(size_t i) const { return tensors_[out_[i]].shape; }
  Status counts(size_t nIn, size_t nOut, size_t nInts = 0, size_t nFloats = 0);
  Status expectShape(const Shape &actual, const Shape &expected, const char *what);
  /// The result of a shape rule the dialect's verifiers share
  /// (kernels/common/shape_rules.h): `actual` must be its shape.
  Status expectInferred(const Shape &actual, const kernels::shapes::Inferred &inferred,
                        const char *what) {
    if (!inferred.ok())
      return fail(inferred.error);
    return expectShape(actual, inferred.shape, what);
  }
  /// `f32Scalar` (a tensor id, or -1): a float tensor that may be f32 beside
  /// 16-bit ones (a loss kept in f32 over bf16 logits).
  /// The last `uncheckedOutputs` outputs are left to the caller.
  Status dtypes(std::initializer_list<int> i32Inputs = {},
                std::initializer_list<int> i32Outputs = {}, int32_t f32Scalar = -1,
                size_t uncheckedOutputs = 0);
  Status matmul();
  Status reduce(const Shape &input, const Shape &reduced);
  /// `whole` is `parts` blocks of `block` along `dim` (parts = the axis size):
  /// AllGather and ShardSlice (`hasBlocks`: dim's blocks), ReduceScatter.
  Status blocked(const Shape &whole, const Shape &block, bool hasBlocks);
  /// Unary, UnaryGrad: a function the kernels implement.
  Status unaryFunction();
  /// MoE dispatch/combine: token-side [groups, tokens, dim] (or [tokens,
  /// dim]), [groups, tokens, k] indices, [experts, groups, capacity, dim]
  /// expert buffers (or [experts, capacity, dim]).
  Status moeShapes(const Shape &tokens, const Shape &indices, const Shape &experts,
                   const char *tokenName, const char *expertName) {
    size_t r = indices.size();
    if ((r != 2 && r != 3) || tokens.size() != r ||
        !std::equal(indices.begin(), indices.end() - 1, tokens.begin()))
      return fail("needs ", tokenName, " [groups, tokens, dim] or [tokens, dim] and indices of "
                  "its shape with k last, got ", shapeStr(tokens), " and ", shapeStr(indices));
    bool ok = experts.size() == r + 1 && experts[0] >= 1 && experts[r - 1] >= 1 &&
              experts.back() == tokens.back() && (r == 2 || experts[1] == indices[0]);
    if (!ok)
      return fail(expertName, " must be [experts, ", r == 3 ? "groups, " : "", "capacity, ",
                  tokens.back(), "], got ", shapeStr(experts));
    return Status::ok();
  }
  /// Attention: query [b, h, s, d]; key and value [b, kvh, s, d], kvh | h
  /// (seq_major: [b, s, h, d] and [b, s, kvh, d]).
  Status attentionShapes(bool seqMajor = false) {
    if (in(0).size() != 4)
      return fail("query must have rank 4, got ", shapeStr(in(0)));
    if (std::string why = kernels::shapes::attentionOperands(in(0), in(1), seqMajor); !why.empty())
      return fail(why);
    return expectShape(in(2), in(1), "value");
  }
  /// CausalAttention(Grad)'s optional seq_major (0 or 1).
  StatusOr<bool> seqMajor() {
    PTC_RETURN_IF_ERROR(flag(kernels::attr::Attention::seq_major));
    return get(kernels::attr::Attention::seq_major) == 1;
  }
  /// Attention's shapes: CausalAttention(Grad)'s in its layout, RingAttention(Grad)'s
  /// (whose only integer is its mesh axis) in the heads-major one.
  Status attentionOperands() {
    const bool ring = inst_.op() == OpCode::RingAttention || inst_.op() == OpCode::RingAttentionGrad;
    if (ring) {
      PTC_RETURN_IF_ERROR(attentionShapes());
      PTC_RETURN_IF_ERROR(documentPositions(in(0)[0], in(0)[2]));
      return meshAxis(get(kernels::attr::RingAttention::axis), "the sequence's mesh axis");
    }
    StatusOr<bool> layout = seqMajor();
    if (!layout.isOk())
      return layout.status();
    PTC_RETURN_IF_ERROR(attentionShapes(*layout));
    return documentPositions(in(0)[0], in(0)[*layout ? 1 : 2]);
  }
  /// Where an attention's document positions are, when it has them.
  int positionsInput() const {
    return static_cast<int>(
        kernels::attentionFloatInputs(static_cast<kernels::OpKind>(inst_.op()), in_.size()));
  }
  /// An attention's optional document positions [batch, seq] (i32), the
  /// input after its float ones when the instruction has it (packed documents).
  Status documentPositions(int64_t batch, int64_t seq) {
    const size_t index = static_cast<size_t>(positionsInput());
    if (in_.size() == index)
      return Status::ok();
    return expectShape(in(index), {batch, seq}, "document positions");
  }
  /// An attention's input count: its float inputs, or those and the document
  /// positions (checked before any input is read); a gradient's may add the
  /// forward's saved result and row statistics, a forward's outputs them.
  Status attentionInputs() {
    const auto op = static_cast<kernels::OpKind>(inst_.op());
    const size_t base = kernels::attentionBaseInputs(op);
    const bool saves = kernels::attentionReadsStats(op);
    if (in_.size() < base || in_.size() > base + (saves ? 3 : 1))
      return fail("expects ", base, " inputs, or ", base + 1, " with the document positions",
                  saves ? ", " + std::to_string(base + 2) +
                              " with the forward's saved result and row statistics, " +
                              std::to_string(base + 3) + " with both"
                        : std::string(),
                  "; has ", in_.size());
    if (kernels::attentionReturnsStats(op) && out_.size() != 1 && out_.size() != 2)
      return fail("expects 1 output, or 2 with the row statistics, has ", out_.size());
    return Status::ok();
  }
  /// The tensor id of an attention's row statistics, or -1: a forward's
  /// optional second output, a gradient's input after the saved result.
  int32_t attentionStats() const {
    const auto op = static_cast<kernels::OpKind>(inst_.op());
    if (kernels::attentionReturnsStats(op))
      return out_.size() == 2 ? out_[1] : -1;
    if (!kernels::hasSavedAttentionStats(op, in_.size()))
      return -1;
    return in_[kernels::attentionBaseInputs(op) + 1];
  }
  /// The row statistics, f32 [batch, heads, seq], and for a gradient the
  /// saved result, of the forward's result shape `result`.
  Status attentionStatsShapes(int64_t batch, int64_t heads, int64_t seq, const Shape &result) {
    const auto op = static_cast<kernels::OpKind>(inst_.op());
    const bool forward = kernels::attentionReturnsStats(op);
    const int32_t stats = attentionStats();
    if (stats < 0)
      return Status::ok();
    if (tensors_[stats].dtype != DType::F32)
      return fail("row statistics '", tensors_[stats].name, "' are ",
                  dtypeName(tensors_[stats].dtype), ", expected ", dtypeName(DType::F32));
    PTC_RETURN_IF_ERROR(expectShape(tensors_[stats].shape, {batch, heads, seq}, "row statistics"));
    if (forward)
      return Status::ok();
    // The forward's result or a reshape of it (the same elements in order).
    // (The incoming gradient, the input before it, has the result's shape.)
    const size_t at = kernels::attentionBaseInputs(op);
    if (tensors_[in_[at]].numElements != tensors_[in_[at - 1]].numElements)
      return fail("saved result ", shapeStr(in(at)), " is not the forward's result ",
                  shapeStr(result), " or a reshape of it");
    return Status::ok();
  }

  const plan::Instruction &inst_;
  const std::vector<TensorInfo> &tensors_;
  const std::vector<int> &meshSizes_;
  std::vector<int32_t> in_, out_;
  std::vector<int64_t> ints_;
  std::vector<double> floats_;
};

/// "2", "1 to 3", "at least 1".
std::string countText(size_t least, size_t most) {
  if (most == kernels::kUnboundedAttrs)
    return least == 0 ? "any number of" : "at least " + std::to_string(least);
  return least == most ? std::to_string(least)
                       : std::to_string(least) + " to " + std::to_string(most);
}

Status InstructionChecker::attributeCounts(kernels::AttrSet set) {
  const kernels::AttrCounts c = kernels::attrCounts(set);
  if (ints_.size() >= c.minInts && ints_.size() <= c.maxInts && floats_.size() >= c.minFloats &&
      floats_.size() <= c.maxFloats)
    return Status::ok();
  std::string names;
  for (const kernels::AttrInfo &a : kernels::kAttrTable)
    if (a.set == set)
      names += std::string(names.empty() ? "" : ", ") + a.name;
  return fail("expects ", countText(c.minInts, c.maxInts), " integer and ",
              countText(c.minFloats, c.maxFloats), " float attributes, has ", ints_.size(),
              " and ", floats_.size(), " (", names.empty() ? "none" : names, ")");
}

Status InstructionChecker::counts(size_t nIn, size_t nOut, size_t nInts, size_t nFloats) {
  if (in_.size() != nIn || out_.size() != nOut)
    return fail("expects ", nIn, " inputs and ", nOut, " outputs, has ", in_.size(), " and ",
                out_.size());
  if (ints_.size() != nInts || floats_.size() != nFloats)
    return fail("expects ", nInts, " integer and ", nFloats, " float attributes, has ",
                ints_.size(), " and ", floats_.size());
  return Status::ok();
}

Status InstructionChecker::expectShape(const Shape &actual, const Shape &expected,
                                       const char *what) {
  if (actual != expected)
    return fail(what, " has shape ", shapeStr(actual), ", expected ", shapeStr(expected));
  return Status::ok();
}

/// Every operand and result is f32 except the listed i32 ones (ids).
Status InstructionChecker::dtypes(std::initializer_list<int> i32Inputs,
                                  std::initializer_list<int> i32Outputs, int32_t f32Scalar,
                                  size_t uncheckedOutputs) {
  // Ids are i32; every float tensor of one instruction has one float dtype
  // (f32, or bf16 / f16 in mixed precision; ptc.convert changes it), but for
  // an f32 `f32Scalar`.
  std::optional<DType> floatType;
  auto check = [&](int32_t id, bool ids, const std::string &what) -> Status {
    DType d = tensors_[id].dtype;
    if (ids ? d != DType::I32 : d == DType::I32)
      return fail(what, " is ", dtypeName(d), ", expected ", ids ? "i32" : "a float type");
    if (id == f32Scalar && d == DType::F32)
      return Status::ok();
    if (!ids && floatType && d != *floatType)
      return fail(what, " is ", dtypeName(d), ", but the instruction's other float tensors are ",
                  dtypeName(*floatType));
    if (!ids)
      floatType = d;
    return Status::ok();
  };
  bool convert = inst_.op() == OpCode::Convert;
  for (size_t i = 0; i < in_.size(); ++i) {
    bool ids = std::find(i32Inputs.begin(), i32Inputs.end(), static_cast<int>(i)) != i32Inputs.end();
    PTC_RETURN_IF_ERROR(check(in_[i], ids, "input #" + std::to_string(i) + " ('" + tensors_[in_[i]].name + "')"));
  }
  if (convert)
    floatType.reset();
  for (size_t i = 0; i + uncheckedOutputs < out_.size(); ++i) {
    bool ids = std::find(i32Outputs.begin(), i32Outputs.end(), static_cast<int>(i)) != i32Outputs.end();
    PTC_RETURN_IF_ERROR(check(out_[i], ids, "output #" + std::to_string(i)));
  }
  return Status::ok();
}

Status InstructionChecker::matmul() {
  // (lhs, rhs[, bias]) -> (result[, bias gradient]), not both optional ones.
  const bool bias = in_.size() >= 3, biasGrad = out_.size() >= 2;
  if (bias && biasGrad)
    return fail("takes a bias or gives a bias gradient, not both");
  PTC_RETURN_IF_ERROR(counts(bias ? 3 : 2, biasGrad ? 2 : 1, 2, 0));
  const bool transposeLhs = get(kernels::attr::Matmul::transpose_lhs) != 0;
  const kernels::shapes::Inferred result = kernels::shapes::matmul(
      in(0), in(1), transposeLhs, get(kernels::attr::Matmul::transpose_rhs) != 0);
  if (result.ok() && bias)
    PTC_RETURN_IF_ERROR(expectShape(in(2), {result.shape.back()}, "bias"));
  PTC_RETURN_IF_ERROR(expectInferred(out(0), result, "result"));
  if (biasGrad)
    return expectInferred(out(1), kernels::shapes::matmulBiasGrad(in(0), in(1), transposeLhs),
                          "bias gradient");
  return Status::ok();
}

Status InstructionChecker::reduce(const Shape &input, const Shape &reduced) {
  std::set<int64_t> axes;
  for (int64_t a : get(kernels::attr::Reduction::axes)) {
    if (a < 0 || a >= static_cast<int64_t>(input.size()) || !axes.insert(a).second)
      return fail("reduction axis ", a, " is invalid for rank ", input.size());
  }
  int64_t kept = 1;
  for (size_t i = 0; i < input.size(); ++i)
    if (!axes.count(static_cast<int64_t>(i)))
      kept *= input[i];
  if (product(reduced) != kept)
    return fail("reduced tensor has ", product(reduced), " elements, expected ", kept);
  return Status::ok();
}

Status InstructionChecker::blocked(const Shape &whole, const Shape &block, bool hasBlocks) {
  namespace attr = kernels::attr;
  const int64_t axis = get(hasBlocks ? attr::BlockedAxis::axis : attr::ReduceScatter::axis);
  const int64_t dim = get(hasBlocks ? attr::BlockedAxis::dim : attr::ReduceScatter::dim);
  const int64_t blocks = hasBlocks ? get(attr::BlockedAxis::blocks) : 1;
  PTC_RETURN_IF_ERROR(meshAxis(axis, "mesh axis"));
  int64_t parts = meshSizes_[static_cast<size_t>(axis)];
  if (whole.size() != block.size() || dim < 0 || dim >= static_cast<int64_t>(whole.size()))
    return fail("dim ", dim, " is out of range or the ranks differ");
  if (blocks < 1 || block[static_cast<size_t>(dim)] % blocks != 0)
    return fail("blocks ", blocks, " do not divide dim ", dim);
  for (size_t d = 0; d < whole.size(); ++d)
    if (whole[d] != (static_cast<int64_t>(d) == dim ? block[d] * parts : block[d]))
      return fail("shapes ", shapeStr(whole), " and ", shapeStr(block), " are not ", parts,
                  " blocks along dim ", dim);
  return Status::ok();
}

Status InstructionChecker::unaryFunction() {
  if (!inst_.function())
    return fail("names no elementwise function (known: ", kernels::unaryFunctionList(), ")");
  std::string_view name = inst_.function()->string_view();
  if (!kernels::lookupUnaryFunction(name))
    return fail("names the unknown elementwise function '", name, "' (known: ",
                kernels::unaryFunctionList(), ")");
  return Status::ok();
}

Status InstructionChecker::check() {
  for (int32_t id : in_)
    if (id < 0 || static_cast<size_t>(id) >= tensors_.size())
      return fail("input tensor index ", id, " is out of range");
  for (int32_t id : out_) {
    if (id < 0 || static_cast<size_t>(id) >= tensors_.size())
      return fail("output tensor index ", id, " is out of range");
    TensorKind kind = tensors_[id].kind;
    if (kind == TensorKind::Input || kind == TensorKind::Constant)
      return fail("writes ", tensorKindName(kind), " tensor '", tensors_[id].name, "'");
  }
  OpCode op = static_cast<OpCode>(inst_.op());
  // What the op table fixes for every instruction of this opcode; the rules
  // below check what depends on the instruction (shapes, variadic operands).
  const plan::OpInfo *info = plan::lookupOp(op);
  if (!info)
    return fail("has unknown opcode ", static_cast<int>(op));
  if ((info->inputs >= 0 && in_.size() != static_cast<size_t>(info->inputs)) ||
      (info->outputs >= 0 && out_.size() != static_cast<size_t>(info->outputs)))
    return fail("expects ", info->inputs < 0 ? in_.size() : static_cast<size_t>(info->inputs),
                " inputs and ", info->outputs < 0 ? out_.size() : static_cast<size_t>(info->outputs),
                " outputs, has ", in_.size(), " and ", out_.size());
  PTC_RETURN_IF_ERROR(attributeCounts(info->attrs));
  namespace attr = kernels::attr;
  switch (info->rule) {
  case ShapeRule::Broadcasting:

 {
    PTC_RETURN_IF_ERROR(dtypes());
    return expectInferred(out(0), kernels::shapes::broadcast(in(0), in(1)), "result");
  }
  case ShapeRule::GatedActivation:
  case ShapeRule::GatedActivationGrad:
    // (gate, up[, grad]) -> result or (gate grad, up grad), all of one shape.
    PTC_RETURN_IF_ERROR(unaryFunction());
    PTC_RETURN_IF_ERROR(dtypes());
    for (size_t i = 1; i < in_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(in(i), in(0), i == 1 ? "up" : "gradient"));
    for (size_t i = 0; i < out_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(out(i), in(0), "result"));
    return Status::ok();
  case ShapeRule::Activation:
    PTC_RETURN_IF_ERROR(unaryFunction());
    [[fallthrough]];
  case ShapeRule::SameShape:
    PTC_RETURN_IF_ERROR(dtypes());
    return expectShape(out(0), in(0), "result");
  case ShapeRule::Matmul:
    PTC_RETURN_IF_ERROR(dtypes());
    return matmul();
  case ShapeRule::RowNorm:
 {
    // Inputs: x, weight[, bias] over x's last dimension.
    const bool bias = in_.size() == 3;
    PTC_RETURN_IF_ERROR(dtypes());
    if (in(0).empty())
      return fail("input must have rank >= 1");
    PTC_RETURN_IF_ERROR(expectShape(in(1), {in(0).back()}, "weight"));
    if (bias)
      PTC_RETURN_IF_ERROR(expectShape(in(2), {in(0).back()}, "bias"));
    return expectShape(out(0), in(0), "result");
  }
  case ShapeRule::Softmax:
    PTC_RETURN_IF_ERROR(dtypes());
    if (get(attr::Axis::axis) < 0 || get(attr::Axis::axis) >= static_cast<int64_t>(in(0).size()))
      return fail("axis ", get(attr::Axis::axis), " is out of range");
    return expectShape(out(0), in(0), "result");
  case ShapeRule::Dropout: {
    PTC_RETURN_IF_ERROR(dtypes());
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "result"));
    if (!(get(attr::Dropout::p) >= 0.0 && get(attr::Dropout::p) < 1.0))
      return fail("p must be in [0, 1), got ", get(attr::Dropout::p));
    if (in(0).size() > static_cast<size_t>(kernels::DropoutMask::kMaxRank))
      return fail("input has rank ", in(0).size(), "; dropout takes rank <= ",
                  kernels::DropoutMask::kMaxRank);
    // The layout: per dimension its blocks, axis count, the axes.
    const int64_t stream = get(attr::Dropout::stream);
    if (stream < 0 || stream > INT32_MAX)
      return fail("expects a random stream in [0, 2^31), got ", stream);
    const Shape layout = get(attr::Dropout::layout);
    size_t k = 0;
    for (size_t d = 0; d < in(0).size(); ++d) {
      if (k + 2 > layout.size())
        return fail("integers describe ", d, " of the input's ", in(0).size(), " dimensions");
      const int64_t blocks = layout[k], axes = layout[k + 1];
      k += 2;
      if (blocks < 1 || in(0)[d] % blocks != 0)
        return fail("dimension ", d, " (", in(0)[d], ") is not ", blocks, " equal blocks");
      if (axes < 0 || k + static_cast<size_t>(axes) > layout.size())
        return fail("dimension ", d, " names ", axes, " mesh axes the integers do not hold");
      for (int64_t a = 0; a < axes; ++a, ++k)
        if (layout[k] < 0 || layout[k] >= static_cast<int64_t>(meshSizes_.size()))
          return fail("dimension ", d, "'s mesh axis ", layout[k], " is not an axis of the plan's mesh");
    }
    if (k != layout.size())
      return fail("has ", layout.size() - k, " integers more than its ", in(0).size(),
                  " dimensions describe");
    return Status::ok();
  }
  case ShapeRule::Rotary:
    PTC_RETURN_IF_ERROR(dtypes());
    if (in(0).size() != 4 || in(0)[3] % 2 != 0)
      return fail("input must be [batch, heads, seq, head_dim] (or [batch, seq, heads, head_dim] "
                  "seq-major) with an even head_dim, got ",
                  shapeStr(in(0)));
    PTC_RETURN_IF_ERROR(flag(attr::Rotary::inverse));
    PTC_RETURN_IF_ERROR(
        meshAxis(get(attr::Rotary::seq_axis), "the sequence's mesh axis", /*noneAllowed=*/true));
    PTC_RETURN_IF_ERROR(flag(attr::Rotary::seq_major));
    if (!(get(attr::Rotary::theta) > 1.0))
      return fail("theta must be greater than 1, got ", get(attr::Rotary::theta));
    return expectShape(out(0), in(0), "result");
  case ShapeRule::Attention: {
    PTC_RETURN_IF_ERROR(attentionInputs());
    PTC_RETURN_IF_ERROR(dtypes({positionsInput()}, {}, attentionStats()));
    PTC_RETURN_IF_ERROR(attentionOperands());
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "result"));
    // Ring attention is heads-major (no layout attribute).
    const bool sm = op != OpCode::RingAttention && get(attr::Attention::seq_major) == 1;
    return attentionStatsShapes(in(0)[0], in(0)[sm ? 2 : 1], in(0)[sm ? 1 : 2], in(0));
  }
  case ShapeRule::AttentionQkv:
  case ShapeRule::AttentionQkvGrad: {
    // qkv [batch, seq, (heads + 2 kv_heads) * head_dim] -> [batch, seq, heads,
    // head_dim]; the gradient: (qkv, that gradient) -> qkv's shape.
    const bool grad = info->rule == ShapeRule::AttentionQkvGrad;
    PTC_RETURN_IF_ERROR(attentionInputs());
    PTC_RETURN_IF_ERROR(dtypes({positionsInput()}, {}, attentionStats()));
    if (grad && out_.size() != 1)
      return fail("expects 1 output, has ", out_.size());
    const Shape &qkv = in(0), &heads = grad ? in(1) : out(0);
    if (qkv.size() != 3 || heads.size() != 4 || heads[0] != qkv[0] || heads[1] != qkv[1])
      return fail("expects qkv [batch, seq, width] and [batch, seq, heads, head_dim], got ",
                  shapeStr(qkv), " and ", shapeStr(heads));
    PTC_RETURN_IF_ERROR(documentPositions(qkv[0], qkv[1]));
    const int64_t h = heads[2], d = heads[3], w = qkv[2];
    if (!kernels::fusedQkvWidthFits(h, d, w))
      return fail("qkv's width ", w, " is not (", h, " heads + 2 * kv_heads) * ", d,
                  " with kv_heads dividing the heads");
    if (get(attr::ScaledAttention::scale) <= 0.0)
      return fail("scale must be positive, got ", get(attr::ScaledAttention::scale));
    PTC_RETURN_IF_ERROR(attentionStatsShapes(qkv[0], h, qkv[1], heads));
    return grad ? expectShape(out(0), qkv, "result") : Status::ok();
  }
  case ShapeRule::CachedAttention: {
    // query, key, value, key cache, value cache, positions -> result, caches.
    PTC_RETURN_IF_ERROR(dtypes({5}));
    PTC_RETURN_IF_ERROR(attentionShapes());
    const Shape &kv = in(1), &cache = in(3);
    if (cache.size() != 4 || cache[0] != kv[0] || cache[1] != kv[1] || cache[3] != kv[3] ||
        cache[2] < kv[2])
      return fail("caches must be [batch, kv_heads, context, head_dim] for keys ", shapeStr(kv),
                  ", got ", shapeStr(cache));
    PTC_RETURN_IF_ERROR(expectShape(in(4), cache, "value cache"));
    PTC_RETURN_IF_ERROR(expectShape(in(5), {kv[0], kv[2]}, "positions"));
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "result"));
    PTC_RETURN_IF_ERROR(expectShape(out(1), cache, "new key cache"));
    return expectShape(out(2), cache, "new value cache");
  }
  case ShapeRule::RotaryAt: {
    PTC_RETURN_IF_ERROR(dtypes({1}));
    if (in(0).size() != 4 || in(0)[3] % 2 != 0)
      return fail("input must be [batch, heads, tokens, head_dim] (or [batch, tokens, heads, "
                  "head_dim] seq-major) with an even head_dim, got ",
                  shapeStr(in(0)));
    PTC_RETURN_IF_ERROR(flag(attr::RotaryAt::inverse));
    PTC_RETURN_IF_ERROR(flag(attr::RotaryAt::seq_major));
    const bool seqMajor = get(attr::RotaryAt::seq_major) == 1;
    PTC_RETURN_IF_ERROR(expectShape(in(1), {in(0)[0], in(0)[seqMajor ? 1 : 2]}, "positions"));
    if (!(get(attr::RotaryAt::theta) > 1.0))
      return fail("theta must be greater than 1, got ", get(attr::RotaryAt::theta));
    return expectShape(out(0), in(0), "result");
  }
  case ShapeRule::Embedding: {
    PTC_RETURN_IF_ERROR(
        meshAxis(get(attr::Embedding::vocab_axis), "the vocabulary's mesh axis", true));
    PTC_RETURN_IF_ERROR(dtypes({1}));
    return expectInferred(out(0), kernels::shapes::embedding(in(0), in(1)), "result");
  }
  case ShapeRule::CrossEntropy:

 {
    // logits, targets[, the loss gradient]; a vocabulary-parallel one names
    // the mesh axis of its classes. CrossEntropyGrad may give the loss too,
    // as its second output (ptc.cross_entropy_with_grad), and so may
    // VocabParallelCrossEntropyGrad (ptc.vocab_parallel_cross_entropy_with_grad).
    bool grad = in_.size() == 3, vocab = info->attrs == kernels::AttrSet::VocabAxis;
    const bool lossToo =
        op == OpCode::CrossEntropyGrad || op == OpCode::VocabParallelCrossEntropyGrad;
    const bool withLoss = lossToo && out_.size() == 2;
    if (out_.size() != 1 && !withLoss)
      return fail("expects 1 output", lossToo ? ", or 2 with the loss" : "", ", has ",
                  out_.size());
    if (vocab)
      PTC_RETURN_IF_ERROR(meshAxis(get(attr::VocabAxis::axis), "the classes' mesh axis"));
    // The loss over bf16 / f16 logits (whole or vocabulary-parallel) may keep
    // its scalar (the loss, or its gradient) in f32 (ptc-fuse-loss-widening);
    // the fused one both (the loss is checked apart).
    PTC_RETURN_IF_ERROR(dtypes({1}, {}, grad ? in_[2] : out_[0], withLoss ? 1 : 0));
    const Shape &logits = in(0);
    if (auto loss = kernels::shapes::crossEntropy(logits, in(1)); !loss.ok())
      return fail(loss.error);
    if (grad)
      PTC_RETURN_IF_ERROR(expectShape(in(2), {}, "loss gradient"));
    if (withLoss) {
      // The loss is f32 or of the logits' type, as CrossEntropy's.
      const DType lossType = tensors_[out_[1]].dtype, logitsType = tensors_[in_[0]].dtype;
      if (lossType != DType::F32 && lossType != logitsType)
        return fail("loss is ", dtypeName(lossType), ", expected ", dtypeName(DType::F32),
                    " or the logits' ", dtypeName(logitsType));
      PTC_RETURN_IF_ERROR(expectShape(out(1), {}, "loss"));
    }
    return expectShape(out(0), grad ? logits : Shape{}, "result");
  }
  case ShapeRule::Transfer:
    if (tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("a transfer changes the dtype");
    return expectShape(out(0), in(0), "result");
  case ShapeRule::Reshape:
    if (tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("reshape changes the dtype");
    if (product(in(0)) != product(out(0)))
      return fail("reshape changes the element count from ", product(in(0)), " to ",
                  product(out(0)));
    return Status::ok();
  case ShapeRule::Transpose: {
    const Shape permutation = get(attr::Permutation::permutation);
    if (in_.size() != 1 || out_.size() != 1 || permutation.size() != in(0).size())
      return fail("expects one input, one output and a permutation of its rank");
    if (tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("transpose changes the dtype");
    return expectInferred(out(0), kernels::shapes::transpose(in(0), permutation), "result");
  }
  case ShapeRule::Slice:
  case ShapeRule::Pad:
 {
    const Shape offsets = get(attr::Offsets::offsets);
    if (in_.size() != 1 || out_.size() != 1 || offsets.size() != in(0).size() ||
        out(0).size() != in(0).size())
      return fail("expects one input, one output of the same rank and one offset per dimension");
    if (tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("changes the dtype");
    const bool slice = info->rule == ShapeRule::Slice;
    const Shape &small = slice ? out(0) : in(0);
    const Shape &big = slice ? in(0) : out(0);
    for (size_t i = 0; i < small.size(); ++i)
      if (offsets[i] < 0 || small[i] > big[i] || offsets[i] > big[i] - small[i]) // (no overflow)
        return fail("region of dimension ", i, " is out of bounds");
    return Status::ok();
  }
  case ShapeRule::Concat: {
    if (in_.empty() || out_.size() != 1)
      return fail("expects inputs and one output");
    const int64_t axis = get(attr::Axis::axis);
    Shape expected = in(0);
    if (axis < 0 || axis >= static_cast<int64_t>(expected.size()))
      return fail("axis ", axis, " is out of range");
    expected[axis] = 0;
    for (size_t i = 0; i < in_.size(); ++i) {
      if (in(i).size() != expected.size() || tensors_[in_[i]].dtype != tensors_[out_[0]].dtype)
        return fail("input #", i, " does not match");
      for (size_t d = 0; d < expected.size(); ++d)
        if (static_cast<int64_t>(d) != axis && in(i)[d] != expected[d])
          return fail("input #", i, " does not match in dimension ", d);
      expected[axis] += in(i)[axis];
    }
    return expectShape(out(0), expected, "result");
  }
  case ShapeRule::Reduction:

    if (in_.size() != 1 || out_.size() != 1)
      return fail("expects one input and one output");
    PTC_RETURN_IF_ERROR(dtypes());
    return reduce(in(0), out(0));
  case ShapeRule::ReductionMaxGrad:
    if (in_.size() != 2 || out_.size() != 1)
      return fail("expects two inputs and one output");
    PTC_RETURN_IF_ERROR(dtypes());
    PTC_RETURN_IF_ERROR(reduce(in(0), in(1)));
    return expectShape(out(0), in(0), "result");
  case ShapeRule::TopKGate: {
    // Inputs: logits, and optionally the selection bias [experts].
    PTC_RETURN_IF_ERROR(counts(in_.size() == 2 ? 2 : 1, 2, 2, 0));
    PTC_RETURN_IF_ERROR(dtypes({}, {1}));
    const int64_t k = get(attr::TopKGate::k);
    if (in(0).size() < 2 || k < 1 || k > in(0).back())
      return fail("needs [..., experts] logits and 1 <= k <= experts");
    if (in_.size() == 2 && in(1) != Shape{in(0).back()})
      return fail("needs a selection bias of one value per expert, got ", shapeStr(in(1)));
    Shape expected(in(0).begin(), in(0).end() - 1);
    expected.push_back(k);
    PTC_RETURN_IF_ERROR(expectShape(out(0), expected, "weights"));
    return expectShape(out(1), expected, "indices");
  }
  case ShapeRule::TopKGateGrad:
    PTC_RETURN_IF_ERROR(dtypes({1}));
    if (in(0).size() < 2 || in(1).size() != in(0).size() ||
        !std::equal(in(0).begin(), in(0).end() - 1, in(1).begin()) || in(1).back() > in(0).back())
      return fail("needs [..., experts] logits and [..., k] indices");
    PTC_RETURN_IF_ERROR(expectShape(in(2), in(1), "weights gradient"));
    return expectShape(out(0), in(0), "result");
  case ShapeRule::ExpertLoad: {
    PTC_RETURN_IF_ERROR(dtypes({0}));
    size_t r = in(0).size();
    if ((r != 2 && r != 3) || out(0).size() != r - 1 || out(0).back() < 1 ||
        (r == 3 && out(0)[0] != in(0)[0]))
      return fail("needs [groups, tokens, k] (or [tokens, k]) indices and a [groups, experts] "
                  "(or [experts]) result, got ", shapeStr(in(0)), " and ", shapeStr(out(0)));
    return Status::ok();
  }
  case ShapeRule::MoeDispatch:
    PTC_RETURN_IF_ERROR(dtypes({1}));
    return moeShapes(in(0), in(1), out(0), "input", "result");
  case ShapeRule::MoeDispatchGrad:
    PTC_RETURN_IF_ERROR(dtypes({1}));
    return moeShapes(out(0), in(1), in(0), "result", "gradient");
  case ShapeRule::MoeCombine:
 {
    // expert outputs, weights, indices[, the gradient].
    bool grad = in_.size() == 4;
    PTC_RETURN_IF_ERROR(dtypes({2}));
    if (in(2) != in(1))
      return fail("needs weights and indices of one shape");
    PTC_RETURN_IF_ERROR(moeShapes(grad ? in(3) : out(0), in(2), in(0), grad ? "gradient" : "result",
                                  "expert_output"));
    if (!grad)
      return Status::ok();
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "expert_output gradient"));
    return expectShape(out(1), in(1), "weights gradient");
  }
  case ShapeRule::Broadcast: {
    PTC_RETURN_IF_ERROR(dtypes());
    if (std::string why = kernels::shapes::broadcastTo(in(0), out(0)); !why.empty())
      return fail(why);
    return Status::ok();
  }
  case ShapeRule::ActivationGrad:
    PTC_RETURN_IF_ERROR(unaryFunction());
    [[fallthrough]];
  case ShapeRule::SoftmaxGrad:
    PTC_RETURN_IF_ERROR(dtypes());
    if (info->rule == ShapeRule::SoftmaxGrad &&
        (get(attr::Axis::axis) < 0 || get(attr::Axis::axis) >= static_cast<int64_t>(in(0).size())))
      return fail("axis ", get(attr::Axis::axis), " is out of range");
    PTC_RETURN_IF_ERROR(expectShape(in(1), in(0), "gradient"));
    return expectShape(out(0), in(0), "result");
  case ShapeRule::RowNormGrad:
 {
    // Inputs x, weight, dy; outputs dx, dweight[, dbias].
    const bool bias = out_.size() == 3;
    PTC_RETURN_IF_ERROR(dtypes());
    if (in(0).empty())
      return fail("input must have rank >= 1");
    PTC_RETURN_IF_ERROR(expectShape(in(1), {in(0).back()}, "weight"));
    PTC_RETURN_IF_ERROR(expectShape(in(2), in(0), "gradient"));
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "input gradient"));
    PTC_RETURN_IF_ERROR(expectShape(out(1), in(1), "weight gradient"));
    if (bias)
      PTC_RETURN_IF_ERROR(expectShape(out(2), in(1), "bias gradient"));
    return Status::ok();
  }
  case ShapeRule::AttentionGrad: {
    PTC_RETURN_IF_ERROR(attentionInputs());
    PTC_RETURN_IF_ERROR(dtypes({positionsInput()}, {}, attentionStats()));
    PTC_RETURN_IF_ERROR(attentionOperands());
    PTC_RETURN_IF_ERROR(expectShape(in(3), in(0), "gradient"));
    PTC_RETURN_IF_ERROR(expectShape(out(0), in(0), "query gradient"));
    PTC_RETURN_IF_ERROR(expectShape(out(1), in(1), "key gradient"));
    PTC_RETURN_IF_ERROR(expectShape(out(2), in(1), "value gradient"));
    const bool sm = op != OpCode::RingAttentionGrad && get(attr::Attention::seq_major) == 1;
    return attentionStatsShapes(in(0)[0], in(0)[sm ? 2 : 1], in(0)[sm ? 1 : 2], in(0));
  }
  case ShapeRule::EmbeddingGrad: {
    PTC_RETURN_IF_ERROR(
        meshAxis(get(attr::Embedding::vocab_axis), "the vocabulary's mesh axis", true));
    PTC_RETURN_IF_ERROR(dtypes({0}));
    if (out(0).size() != 2)
      return fail("table gradient must have rank 2");
    Shape expected = in(0);
    expected.push_back(out(0)[1]);
    return expectShape(in(1), expected, "gradient");
  }
  case ShapeRule::OptimizerUpdate:
 {
    bool adam = op == OpCode::AdamWUpdate; // else SgdUpdate
    PTC_RETURN_IF_ERROR(flag(adam ? attr::AdamWUpdate::scheduled_lr : attr::SgdUpdate::scheduled_lr));
    const plan::UpdateInputs layout = plan::updateInputs(inst_);
    const size_t expected = layout.fixed + (layout.skip >= 0) + (layout.lr >= 0);
    // One more output: the parameter's working copy (ptc-keep-working-copies).
    const size_t base = adam ? 3 : 2;
    const bool copies = out_.size() == base + 1;
    PTC_RETURN_IF_ERROR(counts(expected, copies ? base + 1 : base, ints_.size(), adam ? 5 : 3));
    if (copies) {
      const TensorInfo &copy = tensors_[out_[base]];
      if (copy.kind != TensorKind::WorkingCopy || copy.copyOf != in_[0])
        return fail("output #", base, " ('", copy.name, "') is not the working copy of parameter '",
                    tensors_[in_[0]].name, "'");
      if (out_[0] != in_[0])
        return fail("writes a working copy but not its parameter in place");
    }
    if (layout.skip >= 0)
      PTC_RETURN_IF_ERROR(expectShape(in(static_cast<size_t>(layout.skip)), {}, "skip flag"));
    if (layout.lr >= 0)
      PTC_RETURN_IF_ERROR(expectShape(in(static_cast<size_t>(layout.lr)), {}, "scheduled learning rate"));
    // The parameter, its gradient and state share one float type (bf16 for a
    // model built in bf16), except that an f32 parameter's gradient may be
    // bf16 or f16 (ptc-fuse-gradient-widening: widened as it is read); the
    // step count, skip flag and rate are f32 scalars.
    for (size_t i = 0; i < in_.size(); ++i) {
      DType want = i < (adam ? 4u : 3u) ? tensors_[in_[0]].dtype : DType::F32;
      DType have = tensors_[in_[i]].dtype;
      const bool narrowGrad = i == 1 && want == DType::F32 &&
                              (have == DType::BF16 || have == DType::F16);
      if (have != want && !narrowGrad)
        return fail("input #", i, " ('", tensors_[in_[i]].name, "') is ", dtypeName(have),
                    ", expected ", dtypeName(want),
                    i == 1 && want == DType::F32 ? " (or bf16 / f16)" : "");
    }
    if (tensors_[in_[0]].dtype == DType::I32)
      return fail("the parameter is i32, expected a float type");
    for (size_t i = 0; i < base; ++i)
      if (tensors_[out_[i]].dtype != tensors_[in_[0]].dtype)
        return fail("output #", i, " is ", dtypeName(tensors_[out_[i]].dtype), ", expected ",
                    dtypeName(tensors_[in_[0]].dtype));
    for (size_t i = 1; i < (adam ? 4u : 3u); ++i)
      PTC_RETURN_IF_ERROR(expectShape(in(i), in(0), "operand"));
    if (adam)
      PTC_RETURN_IF_ERROR(expectShape(in(4), {}, "step"));
    for (size_t i = 0; i < out_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(out(i), in(0), "result"));
    return Status::ok();
  }
  case ShapeRule::LrSchedule:
    PTC_RETURN_IF_ERROR(dtypes());
    PTC_RETURN_IF_ERROR(expectShape(in(0), {}, "step"));
    PTC_RETURN_IF_ERROR(expectShape(out(0), {}, "result"));
  {
    const int64_t kind = get(attr::LrSchedule::kind), warmup = get(attr::LrSchedule::warmup_steps),
                  decay = get(attr::LrSchedule::decay_steps);
    const double lr = get(attr::LrSchedule::lr), minLr = get(attr::LrSchedule::min_lr);
    if (kind < 0 || kind > 2)
      return fail("schedule kind ", kind, " is not 0 (constant), 1 (cosine) or 2 (linear)");
    if (warmup < 0 || (kind != 0 && decay <= warmup))
      return fail("needs 0 <= warmup_steps < decay_steps, got ", warmup, " and ", decay);
    if (!(lr >= 0.0) || !(minLr >= 0.0) || minLr > lr)
      return fail("needs 0 <= min_lr <= lr, got lr ", lr, " and min_lr ", minLr);
    return Status::ok();
  }
  case ShapeRule::AllReduce: {
    const Shape axes = get(attr::MeshAxes::axes);
    if (in_.empty() || out_.size() != in_.size() || axes.empty())
      return fail("expects n inputs, n outputs and mesh axes");
    PTC_RETURN_IF_ERROR(dtypes());
    std::set<int64_t> seen;
    for (int64_t a : axes)
      if (a < 0 || a >= static_cast<int64_t>(meshSizes_.size()) || !seen.insert(a).second)
        return fail("mesh axis ", a, " is invalid for a ", meshSizes_.size(), "-axis mesh");
    for (size_t i = 0; i < in_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(out(i), in(i), "result"));
    return Status::ok();
  }
  case ShapeRule::AllGather:
    if (in_.size() != 1 || out_.size() != 1 || tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("expects one input and one output of the same dtype");
    return blocked(out(0), in(0), /*hasBlocks=*/true);
  case ShapeRule::ReduceScatter:
    if (in_.size() != 1 || out_.size() != 1)
      return fail("expects one input and one output");
    PTC_RETURN_IF_ERROR(dtypes());
    return blocked(in(0), out(0), /*hasBlocks=*/false);
  case ShapeRule::AllToAll: {
    const int64_t axis = get(attr::AllToAll::axis);
    if (in_.size() != 1 || out_.size() != 1)
      return fail("expects one input and one output");
    PTC_RETURN_IF_ERROR(meshAxis(axis, "mesh axis"));
    PTC_RETURN_IF_ERROR(dtypes());
    const int64_t p = meshSizes_[static_cast<size_t>(axis)], split = get(attr::AllToAll::split_dim),
                  concat = get(attr::AllToAll::concat_dim);
    int64_t rank = static_cast<int64_t>(in(0).size());
    if (split < 0 || split >= rank || concat < 0 || concat >= rank || split == concat ||
        out(0).size() != in(0).size() || in(0)[static_cast<size_t>(split)] % p != 0)
      return fail("invalid split/concat dims");
    Shape expected = in(0);
    expected[static_cast<size_t>(split)] /= p;
    expected[static_cast<size_t>(concat)] *= p;
    return expectShape(out(0), expected, "result");
  }
  case ShapeRule::ShardSlice:
    if (in_.size() != 1 || out_.size() != 1 || tensors_[in_[0]].dtype != tensors_[out_[0]].dtype)
      return fail("expects one input and one output of the same dtype");
    return blocked(in(0), out(0), /*hasBlocks=*/true);
  case ShapeRule::LossScale:
    PTC_RETURN_IF_ERROR(dtypes());
    PTC_RETURN_IF_ERROR(expectShape(in(0), {}, "exponent"));
    return expectShape(out(0), {}, "scale");
  case ShapeRule::LossScaleUpdate:
    PTC_RETURN_IF_ERROR(dtypes());
    if (get(attr::LossScaleUpdate::window) < 1)
      return fail("window must be >= 1, got ", get(attr::LossScaleUpdate::window));
    for (size_t i = 0; i < 3; ++i)
      PTC_RETURN_IF_ERROR(expectShape(in(i), {}, "operand"));
    return Status::ok();
  case ShapeRule::UnscaleGrads:
    if (in_.size() < 2 || out_.size() != in_.size())
      return fail("expects n gradients and the scale, n results and the overflow flag");
    PTC_RETURN_IF_ERROR(dtypes());
    PTC_RETURN_IF_ERROR(meshAxes(get(attr::MeshAxes::axes)));
    for (size_t i = 0; i + 1 < in_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(out(i), in(i), "unscaled gradient"));
    PTC_RETURN_IF_ERROR(expectShape(in(in_.size() - 1), {}, "scale"));
    return expectShape(out(out_.size() - 1), {}, "overflow flag");
  case ShapeRule::AnyNonfinite:
    // None: the flag of a rank that holds no gradient, joining its axes'
    // maximum (a pipeline rank without parameters).
    if (in_.empty() && get(attr::MeshAxes::axes).empty())
      return fail("expects at least one tensor to check, or mesh axes whose flag it joins");
    // Any float tensors (a bf16 model's bf16 gradients), an f32 flag.
    for (size_t i = 0; i < in_.size(); ++i)
      if (tensors_[in_[i]].dtype == DType::I32)
        return fail("input #", i, " ('", tensors_[in_[i]].name, "') is i32, expected a float type");
    if (tensors_[out_[0]].dtype != DType::F32)
      return fail("output #0 is ", dtypeName(tensors_[out_[0]].dtype), ", expected F32");
    PTC_RETURN_IF_ERROR(meshAxes(get(attr::MeshAxes::axes)));
    return expectShape(out(0), {}, "flag");
  case ShapeRule::Channel:
    return Status::ok(); // the table fixes its operands; the schedule checks its channel
  case ShapeRule::MicrobatchSum:
    PTC_RETURN_IF_ERROR(dtypes());
    if (tensors_[out_[0]].kind != TensorKind::Temporary)
      return fail("must accumulate into a temporary");
    return expectShape(out(0), in(0), "result");
  case ShapeRule::ClipGradNorm: {
    const std::vector<double> weights = get(attr::ClipGradNorm::weights);
    // n = 0: a rank that holds no gradient joins its axes' sum (a pipeline
    // rank without parameters).
    if ((in_.empty() && get(attr::ClipGradNorm::axes).empty()) || out_.size() != in_.size() + 1 ||
        (!weights.empty() && weights.size() != in_.size()))
      return fail("expects n gradients (at least one without mesh axes), n + 1 results and "
                  "max_norm (and a weight per gradient)");
    for (size_t i = 0; i < weights.size(); ++i)
      if (!(weights[i] > 0.0 && weights[i] <= 1.0))
        return fail("weight #", i, " is ", weights[i], ", not in (0, 1]");
    PTC_RETURN_IF_ERROR(meshAxes(get(attr::ClipGradNorm::axes)));
    PTC_RETURN_IF_ERROR(dtypes());
    for (size_t i = 0; i < in_.size(); ++i)
      PTC_RETURN_IF_ERROR(expectShape(out(i), in(i), "clipped gradient"));
    return expectShape(out(in_.size()), {}, "norm");
  }
  }
  return fail("has no shape rule (opcode ", static_cast<int>(inst_.op()), ")");
}

/// Offload: a host instruction runs on the host CPU and touches only host
/// tensors; a device instruction only device tensors; a Transfer crosses.
/// Communication and the ops the executor runs with the device's streams or
/// with the host's per-step scalars stay on the device.
} // namespace

Status checkPlacement(const plan::Instruction &inst, const std::vector<TensorInfo> &tensors) {
  auto side = [](bool host) { return host ? "a host" : "a device"; };
  bool onHost = inst.on_host();
  if (onHost) {
    switch (inst.op()) {
    case OpCode::Transfer:
    case OpCode::AllReduce:
    case OpCode::AllGather:
    case OpCode::ReduceScatter:
    case OpCode::AllToAll:
    case OpCode::VocabParallelCrossEntropy:
    case OpCode::VocabParallelCrossEntropyGrad:
    case OpCode::Send:
    case OpCode::Recv:
    case OpCode::MicrobatchSum:
    case OpCode::ClipGradNorm:
    case OpCode::UnscaleGrads:
    case OpCode::AnyNonfinite:
    case OpCode::LossScale:
    case OpCode::LossScaleUpdate:
    case OpCode::LrSchedule:
      return invalidArgument(opcodeName(inst.op()), " cannot run on the host");
    default:
      break;
    }
    // The host runs f32 (and i32) kernels; only a conversion sees bf16 / f16.
    if (inst.op() != OpCode::Convert)
      for (const auto *ids : {&inputsOf(inst), &outputsOf(inst)})
        for (int32_t id : *ids) {
          plan::DType d = tensors[static_cast<size_t>(id)].dtype;
          if (d == plan::DType::BF16 || d == plan::DType::F16)
            return invalidArgument("a host instruction on the low-precision tensor '",
                                   tensors[static_cast<size_t>(id)].name, "'");
        }
  }
  if (inst.op() == OpCode::Transfer)
    return Status::ok();
  for (const auto *ids : {&inputsOf(inst), &outputsOf(inst)})
    for (int32_t id : *ids) {
      const TensorInfo &t = tensors[static_cast<size_t>(id)];
      if (t.host != onHost)
        return invalidArgument(side(onHost), " instruction reads or writes ", side(t.host),
                               " tensor ('", t.name, "', tensor #", id,
                               "); only a Transfer crosses between host and device");
    }
  return Status::ok();
}

Status checkInstruction(const plan::Instruction &inst, const std::vector<TensorInfo> &tensors,
                        const std::vector<int> &meshSizes) {
  return InstructionChecker(inst, tensors, meshSizes).check();
}

} // namespace ptc
