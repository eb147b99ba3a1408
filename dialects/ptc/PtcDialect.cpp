//===- PtcDialect.cpp - ptc dialect registration and attribute checks -----===//

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcOps.h"

#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ptc;

#include "dialects/ptc/PtcDialect.cpp.inc"
#include "dialects/ptc/PtcInterfaces.cpp.inc"

void PtcDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/ptc/PtcOps.cpp.inc"
      >();
}

LogicalResult PtcDialect::parseInit(StringRef spec, StringRef &kind, double &stddev) {
  stddev = 0.0;
  if (spec == "zeros" || spec == "ones") {
    kind = spec;
    return success();
  }
  if (!spec.consume_front("normal:") || spec.getAsDouble(stddev) || !(stddev > 0.0))
    return failure();
  kind = "normal";
  return success();
}

/// Checks argument roles (`ptc.param`, `ptc.input`, `ptc.state`) and
/// `ptc.init`: non-empty string names, statically shaped tensors, float
/// parameters and state, and no name used twice in one function.
LogicalResult PtcDialect::verifyRegionArgAttribute(Operation *op, unsigned regionIndex,
                                                   unsigned argIndex, NamedAttribute attr) {
  StringRef attrName = attr.getName().strref();
  const StringLiteral roles[] = {kParamAttrName, kInputAttrName, kStateAttrName};
  bool isRole = llvm::is_contained(roles, attrName);
  if (attrName == PtcDialect::kStageAttrName) { // the pipeline chunk holding the parameter (ptc-split-stages)
    if (!isa<IntegerAttr>(attr.getValue()))
      return op->emitError() << "'ptc.stage' on argument #" << argIndex << " must be an integer";
    return success();
  }
  if (attrName == kShardingAttrName) {
    auto spec = dyn_cast<StringAttr>(attr.getValue());
    if (!spec)
      return op->emitError() << "'ptc.sharding' on argument #" << argIndex
                             << " must be a string such as \"[dp, _]\"";
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto type = func ? dyn_cast<RankedTensorType>(func.getArgumentTypes()[argIndex]) : nullptr;
    FailureOr<MeshInfo> mesh = getEnclosingMesh(op);
    if (type && succeeded(mesh) &&
        failed(parseShardingSpec(spec.getValue(), *mesh, type.getRank(), [&] {
          return op->emitError() << "argument #" << argIndex << ": ";
        })))
      return failure();
    return success(); // checked against the mesh by ptc-shard when the module has none yet
  }
  if (!isRole && attrName != kInitAttrName)
    return op->emitError() << "unknown ptc argument attribute '" << attrName
                           << "' on argument #" << argIndex;

  auto name = dyn_cast<StringAttr>(attr.getValue());
  if (!name || name.getValue().empty())
    return op->emitError() << "'" << attrName << "' on argument #" << argIndex
                           << " must be a non-empty string";

  // MLIR verifies argument attributes of function-like ops only.
  auto func = dyn_cast<FunctionOpInterface>(op);
  if (!func)
    return success();

  if (attrName == kInitAttrName) {
    StringRef kind;
    double stddev;
    if (failed(parseInit(name.getValue(), kind, stddev)))
      return op->emitError() << "'ptc.init' on argument #" << argIndex << " must be \"zeros\", "
                             << "\"ones\" or \"normal:<std>\" with std > 0, got \""
                             << name.getValue() << "\"";
    if (!func.getArgAttr(argIndex, kParamAttrName))
      return op->emitError() << "'ptc.init' on argument #" << argIndex
                             << " needs a 'ptc.param' on the same argument";
    return success();
  }

  Type argType = func.getArgumentTypes()[argIndex];
  auto tensorType = dyn_cast<RankedTensorType>(argType);
  if (!tensorType || !tensorType.hasStaticShape())
    return op->emitError() << "argument #" << argIndex << " ('" << name.getValue()
                           << "') must be a statically shaped tensor, got " << argType;
  if (attrName != kInputAttrName && !isa<FloatType>(tensorType.getElementType()))
    return op->emitError() << (attrName == kParamAttrName ? "parameter" : "optimizer state")
                           << " '" << name.getValue()
                           << "' must have a floating-point element type, got "
                           << tensorType.getElementType();
  for (StringRef other : roles)
    if (other != attrName && func.getArgAttr(argIndex, other))
      return op->emitError() << "argument #" << argIndex << " has both '" << attrName
                             << "' and '" << other << "'";

  // Names identify tensors in plans, checkpoints and safetensors files.
  for (unsigned i = argIndex + 1, e = func.getNumArguments(); i < e; ++i)
    for (StringRef other : roles)
      if (func.getArgAttrOfType<StringAttr>(i, other) == name)
        return op->emitError() << "tensor name '" << name.getValue()
                               << "' is used by arguments #" << argIndex << " and #" << i;
  return success();
}

/// Checks result roles: `ptc.loss` (unit, rank-0 float), `ptc.grad_norm`
/// (unit), `ptc.grad` / `ptc.update` (names of arguments of the function).
LogicalResult PtcDialect::verifyRegionResultAttribute(Operation *op, unsigned regionIndex,
                                                      unsigned resultIndex, NamedAttribute attr) {
  StringRef attrName = attr.getName().strref();
  auto func = dyn_cast<FunctionOpInterface>(op);
  if (!func)
    return success();
  Type resultType = func.getResultTypes()[resultIndex];
  if (attrName == kLossAttrName || attrName == kGradNormAttrName || attrName == kLossScaleAttrName) {
    auto t = dyn_cast<RankedTensorType>(resultType);
    if (!isa<UnitAttr>(attr.getValue()) || !t || t.getRank() != 0 ||
        !isa<FloatType>(t.getElementType()))
      return op->emitError() << "'" << attrName << "' on result #" << resultIndex
                             << " must be a unit attribute on a scalar float tensor";
    return success();
  }
  if (attrName != kGradAttrName && attrName != kUpdateAttrName)
    return op->emitError() << "unknown ptc result attribute '" << attrName << "' on result #"
                           << resultIndex;
  auto name = dyn_cast<StringAttr>(attr.getValue());
  if (!name)
    return op->emitError() << "'" << attrName << "' on result #" << resultIndex
                           << " must name an argument";
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
    auto param = func.getArgAttrOfType<StringAttr>(i, kParamAttrName);
    auto state = func.getArgAttrOfType<StringAttr>(i, kStateAttrName);
    if (param != name && (attrName == kGradAttrName || state != name))
      continue;
    if (func.getArgumentTypes()[i] != resultType)
      return op->emitError() << "result #" << resultIndex << " ('" << attrName << "' of '"
                             << name.getValue() << "') has type " << resultType
                             << " but the argument has type " << func.getArgumentTypes()[i];
    return success();
  }
  return op->emitError() << "'" << attrName << "' on result #" << resultIndex << " names '"
                         << name.getValue() << "', which is not "
                         << (attrName == kGradAttrName ? "a parameter" : "a parameter or state")
                         << " of the function";
}
