// The shape rules of the op set that hold in the IR and in a plan alike, in
// one place: the dialect's verifiers and shape functions (dialects/ptc, on
// MLIR types) and the plan loader (runtime/plan, on untrusted plans) call
// these, so a rule and its message cannot drift apart. Each takes shapes as
// plain dimension lists and returns the result shape, or a message that
// names what does not fit (the caller adds the op or instruction).
//
// A leaf, like the rest of kernels/common: no MLIR, no runtime types.
#ifndef PTC_KERNELS_COMMON_SHAPE_RULES_H
#define PTC_KERNELS_COMMON_SHAPE_RULES_H

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

namespace ptc::kernels::shapes {

/// A shape's dimensions, viewed: a std::vector<int64_t>, an
/// llvm::ArrayRef<int64_t>, any contiguous container of int64_t.
class Dims {
public:
  template <typename Container>
  Dims(const Container &c) : data_(std::data(c)), rank_(std::size(c)) {}
  Dims(const int64_t *data, size_t rank) : data_(data), rank_(rank) {}
  size_t rank() const { return rank_; }
  int64_t operator[](size_t i) const { return data_[i]; }
  const int64_t *begin() const { return data_; }
  const int64_t *end() const { return data_ + rank_; }

private:
  const int64_t *data_;
  size_t rank_;
};

/// "8x64", or "scalar" for rank 0.
inline std::string shapeText(Dims s) {
  if (s.rank() == 0)
    return "scalar";
  std::string out;
  for (size_t i = 0; i < s.rank(); ++i)
    out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

/// A rule's result: the shape, or why there is none.
struct Inferred {
  std::vector<int64_t> shape;
  std::string error; ///< empty when the operands fit
  bool ok() const { return error.empty(); }
  static Inferred failure(std::string why) { return {{}, std::move(why)}; }
};

/// Elementwise binary ops: numpy broadcasting, trailing dimensions aligned.
inline Inferred broadcast(Dims a, Dims b) {
  const size_t rank = std::max(a.rank(), b.rank());
  Inferred r;
  r.shape.resize(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t x = i + a.rank() >= rank ? a[i + a.rank() - rank] : 1;
    const int64_t y = i + b.rank() >= rank ? b[i + b.rank() - rank] : 1;
    if (x != y && x != 1 && y != 1)
      return Inferred::failure("operand shapes " + shapeText(a) + " and " + shapeText(b) +
                               " do not broadcast: dimension " + std::to_string(i) +
                               " of the result would need both " + std::to_string(x) + " and " +
                               std::to_string(y));
    r.shape[i] = x == 1 ? y : x;
  }
  return r;
}

/// Broadcast: `input` broadcast to `target` (whose shape the result is).
inline std::string broadcastTo(Dims input, Dims target) {
  const Inferred both = broadcast(input, target);
  if (!both.ok())
    return both.error;
  if (!std::equal(both.shape.begin(), both.shape.end(), target.begin(), target.end()))
    return "cannot broadcast " + shapeText(input) + " to " + shapeText(target);
  return "";
}

/// Matmul: lhs [..., m, k] (transposed: [..., k, m]), rhs [k, n] shared or
/// batched like lhs (transposed: [..., n, k]) -> [..., m, n].
inline Inferred matmul(Dims lhs, Dims rhs, bool transposeLhs, bool transposeRhs) {
  const size_t rank = lhs.rank(), rr = rhs.rank();
  if (rank < 2)
    return Inferred::failure("lhs must have rank >= 2, got rank " + std::to_string(rank));
  if (rr != 2 && rr != rank)
    return Inferred::failure("rhs must have rank 2 or the rank of lhs (" + std::to_string(rank) +
                             "), got rank " + std::to_string(rr));
  if (rr == rank)
    for (size_t i = 0; i + 2 < rank; ++i)
      if (lhs[i] != rhs[i])
        return Inferred::failure("batch dimension " + std::to_string(i) + " differs: lhs has " +
                                 std::to_string(lhs[i]) + ", rhs has " + std::to_string(rhs[i]));
  const int64_t m = lhs[rank - (transposeLhs ? 1 : 2)], kl = lhs[rank - (transposeLhs ? 2 : 1)];
  const int64_t kr = rhs[rr - (transposeRhs ? 1 : 2)], n = rhs[rr - (transposeRhs ? 2 : 1)];
  if (kl != kr)
    return Inferred::failure("contracting dimensions differ: lhs has " + std::to_string(kl) +
                             ", rhs has " + std::to_string(kr) + " (lhs " + shapeText(lhs) +
                             (transposeLhs ? " transposed" : "") + ", rhs " + shapeText(rhs) +
                             (transposeRhs ? " transposed" : "") + ")");
  Inferred r;
  r.shape.assign(lhs.begin(), lhs.end() - 2);
  r.shape.push_back(m);
  r.shape.push_back(n);
  return r;
}

/// A matmul's bias gradient (ptc.matmul_bias_grad, a Matmul's second
/// output): the sums of a rank-2 lhs over its contracted dimension, one per
/// row of the product ([m]; the product itself is `matmul`'s rule).
inline Inferred matmulBiasGrad(Dims lhs, Dims rhs, bool transposeLhs) {
  if (lhs.rank() != 2 || rhs.rank() != 2)
    return Inferred::failure("a bias gradient's product takes rank-2 operands, got lhs " +
                             shapeText(lhs) + " and rhs " + shapeText(rhs));
  Inferred r;
  r.shape.push_back(lhs[transposeLhs ? 1 : 0]);
  return r;
}

/// Transpose: the input's dimensions in the order of `permutation`.
inline Inferred transpose(Dims input, Dims permutation) {
  const size_t rank = input.rank();
  std::vector<bool> seen(rank, false);
  bool valid = permutation.rank() == rank;
  for (size_t i = 0; valid && i < permutation.rank(); ++i) {
    const int64_t p = permutation[i];
    valid = p >= 0 && p < static_cast<int64_t>(rank) && !seen[static_cast<size_t>(p)];
    if (valid)
      seen[static_cast<size_t>(p)] = true;
  }
  if (!valid) {
    std::string list;
    for (size_t i = 0; i < permutation.rank(); ++i)
      list += (i ? ", " : "") + std::to_string(permutation[i]);
    return Inferred::failure("permutation [" + list + "] is not a permutation of the " +
                             std::to_string(rank) + " input dimensions");
  }
  Inferred r;
  for (int64_t p : permutation)
    r.shape.push_back(input[static_cast<size_t>(p)]);
  return r;
}

/// Cross-entropy: logits [..., classes] against targets [...] -> the mean
/// loss (a scalar).
inline Inferred crossEntropy(Dims logits, Dims targets) {
  if (logits.rank() != targets.rank() + 1)
    return Inferred::failure("logits must have one more dimension (classes) than targets, got "
                             "logits " + shapeText(logits) + " and targets " + shapeText(targets));
  for (size_t i = 0; i < targets.rank(); ++i)
    if (logits[i] != targets[i])
      return Inferred::failure("dimension " + std::to_string(i) + " differs: logits have " +
                               std::to_string(logits[i]) + ", targets have " +
                               std::to_string(targets[i]));
  return {};
}

/// Embedding: table [rows, dim] and ids [...] -> [..., dim].
inline Inferred embedding(Dims table, Dims ids) {
  if (table.rank() != 2)
    return Inferred::failure("table must have rank 2 ([rows, dim]), got rank " +
                             std::to_string(table.rank()));
  Inferred r;
  r.shape.assign(ids.begin(), ids.end());
  r.shape.push_back(table[1]);
  return r;
}

/// Attention's operands: query [batch, heads, seq, head_dim] (seqMajor:
/// [batch, seq, heads, head_dim]); key and value the same with kv heads
/// dividing the query heads (grouped-query attention). "" when they fit.
inline std::string attentionOperands(Dims query, Dims kv, bool seqMajor) {
  const char *layout = seqMajor ? "[batch, seq, heads, head_dim]" : "[batch, heads, seq, head_dim]";
  if (query.rank() != 4)
    return std::string("operands must have shape ") + layout + ", got rank " +
           std::to_string(query.rank());
  const size_t headsDim = seqMajor ? 2 : 1, seqDim = seqMajor ? 1 : 2;
  if (kv.rank() != 4 || kv[0] != query[0] || kv[seqDim] != query[seqDim] || kv[3] != query[3])
    return std::string("key and value must have shape ") +
           (seqMajor ? "[batch, seq, kv_heads, head_dim]" : "[batch, kv_heads, seq, head_dim]") +
           " with the query's batch, seq and head_dim (" + shapeText(query) + "), got " +
           shapeText(kv);
  const int64_t heads = query[headsDim], kvHeads = kv[headsDim];
  if (kvHeads < 1 || heads % kvHeads != 0)
    return "the " + std::to_string(kvHeads) + " key/value heads must divide the " +
           std::to_string(heads) + " query heads (grouped-query attention)";
  return "";
}

} // namespace ptc::kernels::shapes

#endif // PTC_KERNELS_COMMON_SHAPE_RULES_H
