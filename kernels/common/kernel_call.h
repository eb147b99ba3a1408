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
#include "kernels/common/types.h"

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>

namespace ptc::kernels {

/// One enumerator per row of op_table.def, in its order (the plan's OpCode
/// has the same values).
enum class OpKind : uint16_t {
#define PTC_PLAN_OP(op, ...) op,
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
};
inline constexpr size_t kNumOpKinds = 0
#define PTC_PLAN_OP(op, ...) +1
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
    ;

/// "RmsNorm", from op_table.def.
inline const char *opKindName(OpKind op) {
  static constexpr const char *kNames[] = {
#define PTC_PLAN_OP(op, ...) #op,
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
  };
  return static_cast<size_t>(op) < kNumOpKinds ? kNames[static_cast<size_t>(op)] : "?";
}

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
  int64_t integer(size_t i) const {
    assert(i < numInts);
    return ints[i];
  }
  float real(size_t i) const {
    assert(i < numFloats);
    return static_cast<float>(floats[i]);
  }
  Shape intList() const { return Shape(ints, ints + numInts); }
};

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
  const bool seqMajor = c.numInts > 0 && c.integer(0) == 1;
  const TensorView &q = c.input(0), &k = c.input(1);
  const int headsDim = seqMajor ? 2 : 1, seqDim = seqMajor ? 1 : 2;
  return {q.dim(0), q.dim(headsDim), k.dim(headsDim), q.dim(seqDim), q.dim(3), seqMajor};
}

/// The float inputs of an attention op, before its optional document
/// positions: q, k, v (CausalAttention, RingAttention), and the incoming
/// gradient (their gradients); qkv (CausalAttentionQkv) and its gradient.
inline size_t attentionFloatInputs(OpKind op) {
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
/// An attention call's document positions [batch, seq] (packed documents):
/// the input after its float ones when the call has it, else null.
inline const int32_t *documentPositions(const KernelCall &c) {
  const size_t index = attentionFloatInputs(c.op);
  return c.numInputs > index ? c.input(index).i32() : nullptr;
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

/// The rows of a table this rank holds: all `rows` (offset 0, total rows),
/// or, when the instruction's one integer names a mesh axis (a
/// vocabulary-parallel table), the rank's block [offset, offset + rows) of
/// `total` rows along that axis.
struct VocabularyBlock {
  int64_t offset, total;
};
inline VocabularyBlock vocabularyBlock(const KernelCall &c, int64_t rows) {
  if (c.numInts != 1)
    return {0, rows};
  const size_t axis = static_cast<size_t>(c.ints[0]);
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

struct KernelEntry {
  Kernel run = nullptr;
  AcceptsTypes accepts = onlyF32;
};

/// A backend's kernels by op kind. Kernel families add theirs
/// (`addNormalizationKernels(table)`); an op kind without an entry is one the
/// runtime runs itself (collectives, copies, the optimizer's updates).
class KernelTable {
public:
  void add(OpKind op, Kernel run, AcceptsTypes accepts = onlyF32) {
    entries_[static_cast<size_t>(op)] = {run, accepts};
  }
  const KernelEntry &operator[](OpKind op) const { return entries_[static_cast<size_t>(op)]; }

private:
  std::array<KernelEntry, kNumOpKinds> entries_{};
};

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_KERNEL_CALL_H
