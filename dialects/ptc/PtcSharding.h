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

/// How one dimension is split: over mesh axis `axis` (-1: whole), as
/// `blocks` equal blocks each split over the axis (1: a plain split).
/// Converts to and from the axis index so that rules read like integers.
struct DimShard {
  int axis = -1;
  int blocks = 1;
  DimShard(int axis = -1, int blocks = 1) : axis(axis), blocks(axis < 0 ? 1 : blocks) {}
  operator int() const { return axis; }
  bool operator==(const DimShard &o) const { return axis == o.axis && blocks == o.blocks; }
  bool operator!=(const DimShard &o) const { return !(*this == o); }
};

/// One mesh axis (or none) per dimension, and the axes over which the value is
/// a partial sum.
struct Sharding {
  SmallVector<DimShard> dims;
  SmallVector<int> partial; // sorted, unique
  bool operator==(const Sharding &o) const { return dims == o.dims && partial == o.partial; }
  bool operator!=(const Sharding &o) const { return !(*this == o); }
  static Sharding replicated(int64_t rank) { return {SmallVector<DimShard>(rank), {}}; }
  bool hasAxis(int a) const {
    return llvm::any_of(dims, [&](const DimShard &d) { return d.axis == a; });
  }
  Sharding withoutPartial() const { return {dims, {}}; }
};

/// Adds `axis` to a sorted set of partial-sum axes.
inline void addPartial(SmallVector<int> &partial, int axis) {
  if (!llvm::is_contained(partial, axis)) {
    partial.push_back(axis);
    llvm::sort(partial);
  }
}

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

/// The typed attribute of `sharding` (a compound axis by its "dp*ep" name):
/// what the sharding passes write between phases.
ShardingAttr getShardingAttr(MLIRContext *context, const MeshInfo &mesh, const Sharding &sharding);
/// The sharding an attribute (typed, or the text of user annotations) states
/// for a tensor of `rank`, partial sums included.
FailureOr<Sharding> getSharding(Attribute attr, const MeshInfo &mesh, int64_t rank,
                                EmitErrorFn emitError);

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCSHARDING_H
