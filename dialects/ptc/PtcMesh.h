//===- PtcMesh.h - the device mesh and sharding specs -----------*- C++ -*-===//

#ifndef PTC_DIALECTS_PTC_PTCMESH_H
#define PTC_DIALECTS_PTC_PTCMESH_H

#include "dialects/ptc/PtcOps.h"

#include <string>

namespace mlir::ptc {

/// A mesh: named axes with sizes, devices numbered row-major (last axis fastest).
struct MeshInfo {
  SmallVector<std::string> axes;
  SmallVector<int64_t> sizes;

  int64_t numDevices() const;
  /// Index of axis `name`, or -1.
  int axisIndex(StringRef name) const;
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

/// Checks the optional `vocab_axis` of an embedding (or its gradient).
LogicalResult verifyVocabAxis(Operation *op, std::optional<StringRef> axis);

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCMESH_H
