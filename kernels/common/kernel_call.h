// The device boundary: how the runtime calls a kernel. One KernelCall per
// plan instruction, whatever the backend: the op kind (a row of op_table.def),
// tensor views that carry their element type, the instruction's integer and
// float attributes. Each backend fills a KernelTable, one entry per op kind,
// from its kernel families (kernels/cpu, kernels/cuda); an entry says which
// element types it computes in natively, and the runtime widens the
// low-precision views of a call an entry does not accept to f32 (one rounding
// of each low-precision result at the end).
//
// A leaf, like the rest of kernels/common: no runtime types.
#ifndef PTC_KERNELS_COMMON_KERNEL_CALL_H
#define PTC_KERNELS_COMMON_KERNEL_CALL_H

#include "kernels/common/dropout.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/error.h"
#include "kernels/common/op_attrs.h"
#include "kernels/common/types.h"

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

namespace ptc::kernels {

/// A tensor on the device: its memory, element type and shape.
struct TensorView {
  void *data = nullptr;
  DType dtype = DType::F32;
  const Shape *shape = nullptr;
  int64_t elements = 0;

  float *f32() const {
    assert(dtype == DType::F32);
    return static_cast<float *>(data);
  }
  int32_t *i32() const {
    assert(dtype == DType::I32);
    return static_cast<int32_t *>(data);
  }
  /// Dimension `i` (negative: from the back).
  int64_t dim(int i) const {
    return (*shape)[static_cast<size_t>(i < 0 ? static_cast<int>(shape->size()) + i : i)];
  }
  size_t rank() const { return shape->size(); }
  /// Elements per row of the last dimension, and the number of such rows.
  int64_t rows() const { return elements / dim(-1); }
  int64_t bytes() const { return elements * dtypeBytes(dtype); }
};

/// One instruction as a kernel sees it. `backend` is the backend's own launch
/// context (kernels/cuda: stream, cuBLAS handle, scratch, error record; null
/// on the CPU).
struct KernelCall {
  OpKind op{};
  const TensorView *in = nullptr;
  size_t numInputs = 0;
  TensorView *out = nullptr;
  size_t numOutputs = 0;
  const int64_t *ints = nullptr;
  size_t numInts = 0;
  const double *floats = nullptr;
  size_t numFloats = 0;
  /// Unary / UnaryGrad: the activation.
  UnaryFunction function{};
  /// The rank's coordinate along each mesh axis and the axes' sizes (for
  /// attributes that name a mesh axis: a vocabulary-parallel table's block).
  const int64_t *meshCoords = nullptr;
  const int64_t *meshSizes = nullptr;
  /// Dropout: the seed, step and micro-batch its masks are keyed by.
  const RandomContext *random = nullptr;
  void *backend = nullptr;

  const TensorView &input(size_t i) const {
    assert(i < numInputs);
    return in[i];
  }
  const TensorView &output(size_t i) const {
    assert(i < numOutputs);
    return out[i];
  }
  /// A named attribute (op_attrs.def) of the call's op kind's set; an
  /// absent optional one reads as its fallback.
  template <typename Attr> auto attr(const Attr &a) const {
    assert(attrSetOf(op) == a.set && "an attribute of another op's set");
    return AttrReader{ints, numInts, floats, numFloats}(a);
  }
};

/// The data pointers of `count` views as `T` (const float *, float *, const
/// void *), and their element counts: what kernels over a list of tensors
/// (sums of squares, clipping, unscaling) take.
template <typename T> std::vector<T> viewPointers(const TensorView *views, size_t count) {
  std::vector<T> out;
  for (size_t i = 0; i < count; ++i)
    out.push_back(static_cast<T>(views[i].data));
  return out;
}
inline std::vector<int64_t> viewSizes(const TensorView *views, size_t count) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < count; ++i)
    out.push_back(views[i].elements);
  return out;
}
/// Their float types (views of float tensors).
inline std::vector<FloatType> viewFloatTypes(const TensorView *views, size_t count) {
  std::vector<FloatType> out;
  for (size_t i = 0; i < count; ++i)
    out.push_back(floatTypeOf(views[i].dtype));
  return out;
}

/// A call of `op` on views and attributes held in containers (vectors,
/// arrays) that outlive it.
template <typename Inputs, typename Outputs, typename Ints, typename Floats>
KernelCall makeKernelCall(OpKind op, const Inputs &in, Outputs &out, const Ints &ints,
                          const Floats &floats) {
  KernelCall call;
  call.op = op;
  call.in = std::data(in);
  call.numInputs = std::size(in);
  call.out = std::data(out);
  call.numOutputs = std::size(out);
  call.ints = std::data(ints);
  call.numInts = std::size(ints);
  call.floats = std::data(floats);
  call.numFloats = std::size(floats);
  return call;
}

/// A CausalAttention(Grad) call's sizes whatever its tensors' layout: query
/// [batch, heads, seq, dim] and key/value [batch, kvHeads, seq, dim], or, with
/// the optional integer seq_major = 1, [batch, seq, heads (kvHeads), dim].
struct AttentionDims {
  int64_t batch, heads, kvHeads, seq, dim;
  bool seqMajor;
};
inline AttentionDims attentionDims(const KernelCall &c) {
  const bool seqMajor = c.attr(attr::Attention::seq_major) == 1;
  const TensorView &q = c.input(0), &k = c.input(1);
  const int headsDim = seqMajor ? 2 : 1, seqDim = seqMajor ? 1 : 2;
  return {q.dim(0), q.dim(headsDim), k.dim(headsDim), q.dim(seqDim), q.dim(3), seqMajor};
}

/// An attention call's softmax scale, whichever attention op it is.
inline double attentionScale(const KernelCall &c) {
  switch (c.op) {
  case OpKind::CausalAttention:
  case OpKind::CausalAttentionGrad:
    return c.attr(attr::Attention::scale);
  case OpKind::RingAttention:
  case OpKind::RingAttentionGrad:
    return c.attr(attr::RingAttention::scale);
  case OpKind::AttentionBlock:
  case OpKind::AttentionBlockGrad:
    return c.attr(attr::AttentionBlock::scale);
  default: // CausalAttentionQkv(Grad), CachedAttention
    return c.attr(attr::ScaledAttention::scale);
  }
}

/// The float inputs every call of an attention op has, before the optional
/// ones: q, k, v (CausalAttention, RingAttention), and the incoming gradient
/// (their gradients); qkv (CausalAttentionQkv) and its gradient.
inline size_t attentionBaseInputs(OpKind op) {
  switch (op) {
  case OpKind::CausalAttentionQkv:
    return 1;
  case OpKind::CausalAttentionQkvGrad:
    return 2;
  case OpKind::CausalAttentionGrad:
  case OpKind::RingAttentionGrad:
    return 4;
  default:
    return 3;
  }
}
/// The attention forwards that may return their rows' softmax statistics
/// (ptc-save-attention-stats) as a second output.
inline bool attentionReturnsStats(OpKind op) {
  return op == OpKind::CausalAttention || op == OpKind::CausalAttentionQkv ||
         op == OpKind::RingAttention;
}
/// The attention gradients that may read them with the forward's result.
inline bool attentionReadsStats(OpKind op) {
  return op == OpKind::CausalAttentionGrad || op == OpKind::CausalAttentionQkvGrad ||
         op == OpKind::RingAttentionGrad;
}
/// Whether an attention gradient of `numInputs` inputs reads the forward's
/// saved result and row statistics (ptc-save-attention-stats): they come
/// after the incoming gradient, (..., grad, result, stats[, positions]), so
/// that the counts tell them from the document positions.
inline bool hasSavedAttentionStats(OpKind op, size_t numInputs) {
  return attentionReadsStats(op) && numInputs >= attentionBaseInputs(op) + 2;
}
/// The float inputs of an attention call before its optional document
/// positions: the base ones and, for a gradient, the saved result and stats.
inline size_t attentionFloatInputs(OpKind op, size_t numInputs) {
  return attentionBaseInputs(op) + (hasSavedAttentionStats(op, numInputs) ? 2 : 0);
}
/// An attention call's document positions [batch, seq] (packed documents):
/// the input after its float ones when the call has it, else null.
inline const int32_t *documentPositions(const KernelCall &c) {
  const size_t index = attentionFloatInputs(c.op, c.numInputs);
  return c.numInputs > index ? c.input(index).i32() : nullptr;
}

/// The softmax statistics of a causal attention call: each query row's
/// log-sum-exp of its scaled scores (f32 [batch, heads, seq], whatever the
/// operands' layout), written by the forward call as its optional second
/// output and read by the gradient call with the forward's result, so that
/// the backward pass does not recompute the forward (ptc-save-attention-stats).
struct SavedAttentionStats {
  const TensorView *result = nullptr; // the forward's result in the gradient's layout (or a
                                      // reshape of it: the same memory)
  const float *lse = nullptr;         // [batch, heads, seq]
  explicit operator bool() const { return lse != nullptr; }
};
inline SavedAttentionStats savedAttentionStats(const KernelCall &c) {
  if (!hasSavedAttentionStats(c.op, c.numInputs))
    return {};
  const size_t at = attentionBaseInputs(c.op);
  return {&c.input(at), c.input(at + 1).f32()};
}
/// The row statistics a forward attention call writes (its optional second
/// output), or null.
inline float *attentionStatsOutput(const KernelCall &c) {
  return attentionReturnsStats(c.op) && c.numOutputs > 1 ? c.output(1).f32() : nullptr;
}

/// A vocabulary-parallel loss piece's operand types apart from the logits'
/// own (input 0): the i32 targets (input 1, except RowSumExp's f32 maxima),
/// the rest f32, one output, VocabParallelGrad's gradient in the logits' type.
inline bool vocabPieceOperandTypes(const KernelCall &c) {
  const DType logits = c.input(0).dtype;
  for (size_t i = 1; i < c.numInputs; ++i)
    if (c.input(i).dtype != (c.op != OpKind::RowSumExp && i == 1 ? DType::I32 : DType::F32))
      return false;
  const DType out = c.op == OpKind::VocabParallelGrad ? logits : DType::F32;
  return c.numOutputs == 1 && c.output(0).dtype == out;
}

/// Whether a Rotary / RotaryAt's input is [batch, seq, heads, head_dim] (else [batch, heads,
/// seq, head_dim]).
inline bool rotarySeqMajor(const KernelCall &c) {
  return c.op == OpKind::RotaryAt ? c.attr(attr::RotaryAt::seq_major) != 0
                                  : c.attr(attr::Rotary::seq_major) != 0;
}
/// The position of the input's first row: with a mesh axis, this device's
/// block of the sequence starts there.
inline int64_t rotaryFirstPosition(const KernelCall &c) {
  const int64_t axis = c.op == OpKind::Rotary ? c.attr(attr::Rotary::seq_axis) : -1;
  if (axis < 0)
    return 0;
  return c.meshCoords[axis] * c.input(0).dim(rotarySeqMajor(c) ? 1 : 2);
}

/// CausalAttentionQkv(Grad): qkv [batch, seq, width] with width = (heads + 2
/// kvHeads) * dim, against `heads` [batch, seq, heads, dim] (the forward's
/// result, the gradient's incoming gradient). The query, key and value are
/// column blocks of qkv at element offsets 0, kOffset and vOffset.
struct FusedQkvDims {
  AttentionDims dims;
  int64_t width, kOffset, vOffset;
};
/// Whether `width` columns are (heads + 2 kvHeads) * dim with kvHeads > 0
/// dividing heads (the plan loader's check before fusedQkvDims may run).
inline bool fusedQkvWidthFits(int64_t heads, int64_t dim, int64_t width) {
  if (heads <= 0 || dim <= 0 || width % dim != 0 || width / dim <= heads ||
      (width / dim - heads) % 2 != 0)
    return false;
  return heads % ((width / dim - heads) / 2) == 0;
}
inline FusedQkvDims fusedQkvDims(const TensorView &qkv, const TensorView &heads) {
  const int64_t h = heads.dim(2), d = heads.dim(3), width = qkv.dim(2);
  const int64_t kv = (width / d - h) / 2;
  return {{qkv.dim(0), h, kv, qkv.dim(1), d, true}, width, h * d, (h + kv) * d};
}

/// The input layout of an AdamWUpdate / SgdUpdate: the fixed inputs (AdamW:
/// param, grad, exp_avg, exp_avg_sq, step; SGD: param, grad, momentum), then
/// the skip flag of dynamic loss scaling if present (the outputs then get the
/// inputs' values), then, with scheduled_lr = 1, the scheduled learning rate.
/// Indices are -1 where absent. The plan loader checks an instruction against
/// it. Their kernels read the step's learning rate from the `lr` attribute:
/// the runtime puts the scheduled value there.
struct UpdateInputs {
  size_t fixed = 0;
  int skip = -1, lr = -1;
};
inline UpdateInputs updateInputs(OpKind op, size_t numInputs, const int64_t *ints,
                                 size_t numInts) {
  UpdateInputs u;
  const bool adamw = op == OpKind::AdamWUpdate;
  u.fixed = adamw ? 5 : 3;
  const bool scheduled =
      attrValue(adamw ? attr::AdamWUpdate::scheduled_lr : attr::SgdUpdate::scheduled_lr, ints,
                numInts) != 0;
  if (numInputs > u.fixed + (scheduled ? 1 : 0))
    u.skip = static_cast<int>(u.fixed);
  if (scheduled)
    u.lr = static_cast<int>(numInputs) - 1;
  return u;
}
inline UpdateInputs updateInputs(const KernelCall &c) {
  return updateInputs(c.op, c.numInputs, c.ints, c.numInts);
}
/// Where an update's floats hold its learning rate (the runtime puts the
/// step's scheduled value there).
inline size_t learningRateSlot(OpKind op) {
  return op == OpKind::AdamWUpdate ? attr::AdamWUpdate::lr.index : attr::SgdUpdate::lr.index;
}

/// The rows of a table this rank holds: all `rows` (offset 0, total rows),
/// or, when the instruction's vocab_axis names a mesh axis (a
/// vocabulary-parallel table), the rank's block [offset, offset + rows) of
/// `total` rows along that axis.
struct VocabularyBlock {
  int64_t offset, total;
};
inline VocabularyBlock vocabularyBlock(const KernelCall &c, int64_t rows) {
  const int64_t vocabAxis = c.attr(attr::Embedding::vocab_axis);
  if (vocabAxis < 0)
    return {0, rows};
  const auto axis = static_cast<size_t>(vocabAxis);
  return {c.meshCoords[axis] * rows, rows * c.meshSizes[axis]};
}

/// The routing of an MoE instruction, from its `[groups, tokens, k]` (or
/// `[tokens, k]`) indices and `[experts, groups, capacity, dim]` (or
/// `[experts, capacity, dim]`) expert buffers.
struct MoeRouting {
  int64_t groups, tokens, k, experts, capacity, dim;
};
inline MoeRouting moeRouting(const TensorView &indices, const TensorView &experts) {
  return {indices.rank() == 3 ? indices.dim(0) : 1, indices.dim(-2), indices.dim(-1),
          experts.dim(0), experts.dim(-2), experts.dim(-1)};
}

using Kernel = KernelResult (*)(const KernelCall &);
/// Whether a kernel computes this call as it is (its views' element types).
using AcceptsTypes = bool (*)(const KernelCall &);

/// The default of an entry: no view in bf16 or f16.
inline bool onlyF32(const KernelCall &call) {
  for (size_t i = 0; i < call.numInputs; ++i)
    if (isLowPrecision(call.in[i].dtype))
      return false;
  for (size_t i = 0; i < call.numOutputs; ++i)
    if (isLowPrecision(call.out[i].dtype))
      return false;
  return true;
}

/// Kernels that only move bytes, or convert: any element type.
inline bool anyTypes(const KernelCall &) { return true; }

/// Several calls of one op kind in one launch (a GPU's multi-tensor apply of
/// a parameter group's optimizer updates); the runtime guarantees they share
/// every input but their own tensors (AdamWUpdate: inputs 4 on) and their
/// attributes, and that no call reads another's outputs.
using BatchKernel = KernelResult (*)(const KernelCall *calls, size_t count);

struct KernelEntry {
  Kernel run = nullptr;
  AcceptsTypes accepts = onlyF32;
  /// Optional: the batched form and the element types it takes.
  BatchKernel runBatch = nullptr;
  AcceptsTypes batchAccepts = onlyF32;
};

/// A backend's kernels by op kind. Kernel families add theirs
/// (`addNormalizationKernels(table)`); an op kind without an entry is one the
/// runtime runs itself (collectives, copies, loss scaling, the schedule).
class KernelTable {
public:
  void add(OpKind op, Kernel run, AcceptsTypes accepts = onlyF32) {
    KernelEntry &e = entries_[static_cast<size_t>(op)];
    e.run = run;
    e.accepts = accepts;
  }
  void addBatch(OpKind op, BatchKernel run, AcceptsTypes accepts = onlyF32) {
    KernelEntry &e = entries_[static_cast<size_t>(op)];
    e.runBatch = run;
    e.batchAccepts = accepts;
  }
  const KernelEntry &operator[](OpKind op) const { return entries_[static_cast<size_t>(op)]; }

private:
  std::array<KernelEntry, kNumOpKinds> entries_{};
};

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_KERNEL_CALL_H
