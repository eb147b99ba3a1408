//===- PtcSharding.h - shardings and what a sharding rule sees --*- C++ -*-===//
//
// The sharding lattice of ptc-shard (per dimension a mesh axis, optionally
// blocked, plus pending partial sums) and the context an op's
// ShardingRuleOpInterface::inferShardingRule reads and fills.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_DIALECTS_PTC_PTCSHARDING_H
#define PTC_DIALECTS_PTC_PTCSHARDING_H

#include "dialects/ptc/PtcMesh.h"

#include <string>

namespace mlir::ptc {

/// Module attribute: how attention runs under context parallelism ("ring",
/// the default, or "ulysses"); set by ptc-compile's cp-attention option.
inline constexpr llvm::StringLiteral kCpAttentionAttrName = "ptc.cp_attention";

/// What a sharding rule reads (global types, current shardings, which values
/// derive from user annotations, the mesh) and decides (`want`, `out`,
/// rescales). Implemented by ptc-propagate-sharding.
class ShardingRuleContext {
public:
  virtual ~ShardingRuleContext() = default;

  /// The global (unpartitioned) type of a value.
  virtual RankedTensorType globalType(Value v) const = 0;
  /// The current sharding of an operand.
  virtual const Sharding &sharding(Value v) const = 0;
  /// Whether `v`'s sharding derives from a user annotation.
  virtual bool isAnnotated(Value v) const = 0;
  /// Reports two user annotations that meet at `op` and disagree (success
  /// when at most one of `a`, `b` derives from an annotation).
  virtual LogicalResult conflict(Operation *op, Value a, Value b) = 0;
  virtual const MeshInfo &mesh() const = 0;

  int64_t axisSize(int a) const { return a < 0 ? 1 : mesh().size(a); }
  /// Whether a dimension of `s` is split over an axis sharing a mesh axis
  /// with `a` (compound axes overlap their components).
  bool uses(const Sharding &s, int a) const {
    return a >= 0 && llvm::any_of(s.dims, [&](const DimShard &d) {
             return d.axis >= 0 && mesh().overlaps(d.axis, a);
           });
  }
  /// Axis `a` without the mesh axes of `b` (dp*ep without ep: dp), or -1
  /// when nothing (or no known axis) remains.
  int without(int a, int b) const {
    SmallVector<int, 2> rest;
    for (int p : mesh().parts(a))
      if (!mesh().overlaps(p, b))
        rest.push_back(p);
    return mesh().axisOf(rest);
  }
  int64_t rank(Value v) const { return globalType(v).getRank(); }
  /// The product of the sizes of `axes`.
  int64_t shardFactor(ArrayRef<int> axes) const {
    int64_t f = 1;
    for (int a : axes)
      f *= axisSize(a);
    return f;
  }

  // Decisions. `want` starts as the operands' current shardings; `out` starts
  // empty and gets one entry per result.
  SmallVector<Sharding> want;
  SmallVector<Sharding> out;
  SmallVector<double> scale;        // per result: multiply by this after the op
  SmallVector<double> operandScale; // per operand: multiply by this before the op
  /// Set by a rule whose op computes differently once partitioned (a
  /// cross-entropy whose classes are split plainly over an axis: the axis,
  /// for its vocabulary-parallel form); the op's `partition` method reads it.
  Attribute partitionedForm;
  /// A result the rule wants resharded right after the op, and why (the
  /// vocabulary-parallel lookup of sequence parallelism: its partial output
  /// reduce-scattered back to the split its ids arrived with).
  struct Then {
    unsigned result;
    Sharding target;
    std::string why;
  };
  SmallVector<Then> then;

  /// Operand `i` must be a complete sum (non-linear use).
  void full(unsigned i) { want[i].partial.clear(); }
  /// Operand `i` must be whole on every device.
  void replicate(unsigned i, int64_t rank) { want[i] = Sharding::replicated(rank); }
  /// Operand `i` must be split like `s` (and complete).
  void like(unsigned i, const Sharding &s) { want[i] = s.withoutPartial(); }
};

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCSHARDING_H
