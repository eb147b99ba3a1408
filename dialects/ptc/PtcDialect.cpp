//===- PtcDialect.cpp - ptc dialect registration and attribute checks -----===//

#include "dialects/ptc/PtcOps.h"

#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ptc;

#include "dialects/ptc/PtcDialect.cpp.inc"

void PtcDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/ptc/PtcOps.cpp.inc"
      >();
}

/// Checks `ptc.param` / `ptc.input` on function arguments: a non-empty string
/// name, a statically shaped tensor, and no name used twice in one function.
LogicalResult PtcDialect::verifyRegionArgAttribute(Operation *op, unsigned regionIndex,
                                                   unsigned argIndex, NamedAttribute attr) {
  StringRef attrName = attr.getName().strref();
  if (attrName != kParamAttrName && attrName != kInputAttrName)
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

  Type argType = func.getArgumentTypes()[argIndex];
  auto tensorType = dyn_cast<RankedTensorType>(argType);
  if (!tensorType || !tensorType.hasStaticShape())
    return op->emitError() << "argument #" << argIndex << " ('" << name.getValue()
                           << "') must be a statically shaped tensor, got " << argType;
  if (attrName == kParamAttrName && !isa<FloatType>(tensorType.getElementType()))
    return op->emitError() << "parameter '" << name.getValue()
                           << "' must have a floating-point element type, got "
                           << tensorType.getElementType();

  // Names identify tensors in plans, checkpoints and safetensors files.
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
    if (i == argIndex)
      continue;
    for (StringRef other : {kParamAttrName, kInputAttrName}) {
      auto otherName = func.getArgAttrOfType<StringAttr>(i, other);
      if (otherName && otherName == name) {
        if (i < argIndex)
          return success(); // reported once, at the later argument
        return op->emitError() << "tensor name '" << name.getValue()
                               << "' is used by arguments #" << argIndex << " and #" << i;
      }
    }
  }
  return success();
}
