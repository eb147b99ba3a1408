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

/// Parses a sharding annotation "[dp, _, tp]" for a tensor of `rank`: the
/// mesh axis index per dimension (-1 for `_`).
FailureOr<SmallVector<int>> parseShardingSpec(StringRef spec, const MeshInfo &mesh, int64_t rank,
                                              EmitErrorFn emitError);

} // namespace mlir::ptc

#endif // PTC_DIALECTS_PTC_PTCMESH_H
