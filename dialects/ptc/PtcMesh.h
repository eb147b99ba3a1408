//===- PtcMesh.h - the device mesh and sharding specs -----------*- C++ -*-===//

#ifndef PTC_DIALECTS_PTC_PTCMESH_H
#define PTC_DIALECTS_PTC_PTCMESH_H

#include "dialects/ptc/PtcOps.h"

#include <string>

namespace mlir::ptc {

/// What a mesh axis parallelizes. Every axis name a mesh may use is one entry
/// of `meshAxisKinds()` (PtcDist.cpp); passes look axes up by role, so a new
/// kind of parallelism is one entry there plus the rules that use it.
enum class MeshAxisRole { Data, Tensor, Pipeline, Expert, Context };

struct MeshAxisKind {
  MeshAxisRole role;
  StringRef name;        // the axis name in meshes and sharding specs ("dp")
  StringRef description; // for messages ("data parallelism")
  bool implemented;      // false: naming it is an error, not a silent replica
};

/// The axis kinds ptc knows, in documentation order.
ArrayRef<MeshAxisKind> meshAxisKinds();
/// The kind of axis `name`, or null.
const MeshAxisKind *lookupMeshAxisKind(StringRef name);
/// The axis name of a role ("dp" for Data).
StringRef meshAxisName(MeshAxisRole role);

/// A mesh: named axes with sizes, devices numbered row-major (last axis fastest).
///
/// Besides its own axes, a mesh has compound axes: one dimension split over
/// several mesh axes at once, the first one major (the batch of an expert-
/// parallel mesh is split over dp x ep). Shardings name them by index
/// `axes.size() + i`; they exist only in the compiler (collectives and plans
/// name the component axes).
struct MeshInfo {
  SmallVector<std::string> axes;
  SmallVector<int64_t> sizes;
  SmallVector<SmallVector<int, 2>> compounds;

  /// The mesh axes an axis or compound index stands for ({a} for a mesh axis).
  SmallVector<int, 2> parts(int a) const;
  /// The number of pieces axis `a` (mesh axis or compound) splits a dimension into.
  int64_t size(int a) const;
  /// "dp" or "dp*ep" (messages, sharding text).
  std::string name(int a) const;
  /// Whether axes `a` and `b` share a mesh axis.
  bool overlaps(int a, int b) const;
  /// The axis or compound index of the mesh axes `parts` (major first), or -1.
  int axisOf(ArrayRef<int> parts) const;
  /// The axis that splits the batch: dp, ep, or the compound dp*ep when the
  /// mesh has both (expert parallelism carved out of data parallelism), or -1.
  int batchAxis() const;

  int64_t numDevices() const;
  /// Index of axis `name`, or -1.
  int axisIndex(StringRef name) const;
  /// Index of the axis with `role`, or -1.
  int axisIndex(MeshAxisRole role) const { return axisIndex(meshAxisName(role)); }
  /// Size of the axis with `role` (1 when the mesh has none).
  int64_t axisSize(MeshAxisRole role) const {
    int a = axisIndex(role);
    return a < 0 ? 1 : sizes[static_cast<size_t>(a)];
  }
  /// Builds the module attribute value.
  DictionaryAttr toAttr(MLIRContext *context) const;
};

/// Parses "dp:2,tp:2" (the ptc-compile / ptc-shard option syntax).
FailureOr<MeshInfo> parseMeshSpec(StringRef spec, EmitErrorFn emitError);
/// Reads and checks a `ptc.mesh` attribute value.
FailureOr<MeshInfo> parseMeshAttr(Attribute attr, EmitErrorFn emitError);
/// The mesh of the module enclosing `op`, if it has one (failure: no mesh or invalid).
FailureOr<MeshInfo> getEnclosingMesh(Operation *op);

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
  /// The positions [batch, tokens] of this value's rows, split as its batch
  /// (dimension 0) and its tokens (dimension `tokenDim`) are.
  Sharding tokenPositions(int tokenDim) const {
    Sharding pos = replicated(2);
    pos.dims[0] = dims[0];
    pos.dims[1] = dims[tokenDim];
    return pos;
  }
};

/// Adds `axis` to a sorted set of partial-sum axes.
inline void addPartial(SmallVector<int> &partial, int axis) {
  if (!llvm::is_contained(partial, axis)) {
    partial.push_back(axis);
    llvm::sort(partial);
  }
}

/// Parses "[dp, _, tp/3]" (the text form of a user annotation) for a tensor
/// of `rank`.
FailureOr<Sharding> parseShardingText(StringRef spec, const MeshInfo &mesh, int64_t rank,
                                      EmitErrorFn emitError);

/// The typed attribute of `sharding` (a compound axis by its "dp*ep" name):
/// what the sharding passes write between phases.
ShardingAttr getShardingAttr(MLIRContext *context, const MeshInfo &mesh, const Sharding &sharding);
/// The sharding an attribute (typed, or the text of user annotations) states
/// for a tensor of `rank`, partial sums included.
FailureOr<Sharding> getSharding(Attribute attr, const MeshInfo &mesh, int64_t rank,
                                EmitErrorFn emitError);

/// "[dp, _, tp/3]": the text of a sharding attribute's dimensions (messages).
std::string shardingText(ShardingAttr attr);

/// Checks the optional `vocab_axis` of an embedding (or its gradient).
LogicalResult verifyVocabAxis(Operation *op, std::optional<StringRef> axis);

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCMESH_H
