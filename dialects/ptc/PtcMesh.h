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

/// A parsed sharding annotation: per dimension the mesh axis (-1: whole) and
/// the block count. "tp/3" splits each of the dimension's 3 equal blocks over
/// tp (a fused QKV projection keeps every head's q, k and v on one device).
struct ShardingSpec {
  SmallVector<int> axes;
  SmallVector<int> blocks;
};

/// Parses "[dp, _, tp/3]" for a tensor of `rank`.
FailureOr<ShardingSpec> parseShardingSpec(StringRef spec, const MeshInfo &mesh, int64_t rank,
                                          EmitErrorFn emitError);

/// A sharding annotation, typed (#ptc.sharding<[dp, _]>) or as text ("[dp, _]"),
/// resolved against `mesh` for a tensor of `rank`.
FailureOr<ShardingSpec> getShardingSpec(Attribute attr, const MeshInfo &mesh, int64_t rank,
                                        EmitErrorFn emitError);
/// The typed attribute of a spec (and its partial-sum axes).
ShardingAttr getShardingAttr(MLIRContext *context, const MeshInfo &mesh, ArrayRef<int> axes,
                             ArrayRef<int> blocks, ArrayRef<int> partial = {});
/// "[dp, _, tp/3]": the text of a sharding attribute's dimensions (messages).
std::string shardingText(ShardingAttr attr);

/// Checks the optional `vocab_axis` of an embedding (or its gradient).
LogicalResult verifyVocabAxis(Operation *op, std::optional<StringRef> axis);

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCMESH_H
