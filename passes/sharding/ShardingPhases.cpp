//===- ShardingPhases.cpp - helpers both sharding phases use --------------===//

#include "passes/sharding/ShardingPhases.h"

#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::ptc;

std::string sharding::describe(func::FuncOp func, Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    for (StringRef role : {PtcDialect::kParamAttrName, PtcDialect::kStateAttrName,
                           PtcDialect::kInputAttrName})
      if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), role))
        return "'" + name.str() + "'";
    return "argument #" + std::to_string(arg.getArgNumber());
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "the result of " << v.getDefiningOp()->getName() << " at " << v.getLoc();
  return s;
}

std::string sharding::text(const MeshInfo &mesh, const Sharding &s) {
  std::string out = "[";
  for (auto [i, a] : llvm::enumerate(s.dims))
    out += (i ? ", " : "") +
           (a.axis < 0 ? std::string("_")
                       : mesh.name(a.axis) + (a.blocks > 1 ? "/" + std::to_string(a.blocks) : ""));
  out += "]";
  if (!s.partial.empty()) {
    out += " partial(";
    for (auto [i, a] : llvm::enumerate(s.partial))
      out += (i ? ", " : "") + mesh.name(a);
    out += ")";
  }
  return out;
}

FailureOr<RankedTensorType> sharding::localType(func::FuncOp func, const MeshInfo &mesh, Value v,
                                                RankedTensorType g, const Sharding &s,
                                                Operation *where) {
  SmallVector<int64_t> shape(g.getShape());
  for (auto [d, ds] : llvm::enumerate(s.dims)) {
    int a = ds.axis;
    if (a < 0)
      continue;
    if (shape[d] % (mesh.size(a) * ds.blocks) != 0) {
      InFlightDiagnostic diag = where ? where->emitOpError() : mlir::emitError(v.getLoc());
      diag << describe(func, v) << " dimension " << d << " (size " << shape[d]
           << ") is not divisible by mesh axis '" << mesh.name(a) << "' (size " << mesh.size(a)
           << ")" << (ds.blocks > 1 ? " times its " + std::to_string(ds.blocks) + " blocks" : "");
      return failure();
    }
    shape[d] /= mesh.size(a);
  }
  return RankedTensorType::get(shape, g.getElementType());
}

Sharding sharding::normalizePartial(const MeshInfo &mesh, const Sharding &s) {
  Sharding normalized = s;
  normalized.partial.clear();
  for (int a : s.partial)
    for (int p : mesh.parts(a))
      addPartial(normalized.partial, p);
  return normalized;
}

bool sharding::isFusedUpdate(Operation *op) { return isa<FusedUpdateOpInterface>(op); }
