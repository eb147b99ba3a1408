//===- PtcDialect.cpp - ptc dialect registration and attribute checks -----===//

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcOps.h"

#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ptc;

#include "dialects/ptc/PtcDialect.cpp.inc"
#include "dialects/ptc/PtcInterfaces.cpp.inc"

#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#define GET_ATTRDEF_CLASSES
#include "dialects/ptc/PtcAttrs.cpp.inc"

void PtcDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/ptc/PtcOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/ptc/PtcAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// #ptc.sharding<[dp, _, tp/3], partial(tp)>
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// #ptc.action<forward chunk 1 mb 3>, #ptc.action<send channel 2 mb 3>
//===----------------------------------------------------------------------===//

namespace {
constexpr StringLiteral kActionKindNames[] = {"forward", "backward", "weight", "send", "recv"};
} // namespace

Attribute ScheduleActionAttr::parse(AsmParser &parser, Type) {
  std::string kindName;
  if (parser.parseLess() || parser.parseKeywordOrString(&kindName))
    return {};
  const auto *found = llvm::find(kActionKindNames, kindName);
  if (found == std::end(kActionKindNames)) {
    parser.emitError(parser.getCurrentLocation())
        << "unknown schedule action '" << kindName
        << "' (expected forward, backward, weight, send or recv)";
    return {};
  }
  int64_t kind = found - std::begin(kActionKindNames), chunk = -1, mb = -1, channel = -1;
  while (failed(parser.parseOptionalGreater())) {
    std::string field;
    int64_t value;
    if (parser.parseKeywordOrString(&field) || parser.parseInteger(value))
      return {};
    if (field == "chunk")
      chunk = value;
    else if (field == "mb")
      mb = value;
    else if (field == "channel")
      channel = value;
    else {
      parser.emitError(parser.getCurrentLocation())
          << "unknown schedule action field '" << field << "' (expected chunk, mb or channel)";
      return {};
    }
  }
  return parser.getChecked<ScheduleActionAttr>(parser.getContext(), kind, chunk, mb, channel);
}

void ScheduleActionAttr::print(AsmPrinter &printer) const {
  printer << "<" << kActionKindNames[getKind()];
  if (isCompute())
    printer << " chunk " << getChunk();
  else
    printer << " channel " << getChannel();
  printer << " mb " << getMb() << ">";
}

LogicalResult ScheduleActionAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                         int64_t kind, int64_t chunk, int64_t mb,
                                         int64_t channel) {
  if (kind < Forward || kind > Recv)
    return emitError() << "#ptc.action kind " << kind << " is not an action";
  if (kind <= Weight ? chunk < 0 : channel < 0)
    return emitError() << "#ptc.action " << kActionKindNames[kind] << " needs a "
                       << (kind <= Weight ? "chunk" : "channel") << " >= 0";
  if (mb < -1)
    return emitError() << "#ptc.action micro-batch " << mb << " is below -1";
  return success();
}

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  MLIRContext *ctx = parser.getContext();
  SmallVector<StringAttr> axes, partial;
  SmallVector<int64_t> blocks;
  auto parseDim = [&]() -> ParseResult {
    if (succeeded(parser.parseOptionalKeyword("_"))) {
      axes.push_back(StringAttr::get(ctx, ""));
      blocks.push_back(1);
      return success();
    }
    std::string axis;
    if (parser.parseKeywordOrString(&axis))
      return failure();
    int64_t k = 1;
    if (succeeded(parser.parseOptionalSlash()) && parser.parseInteger(k))
      return failure();
    axes.push_back(StringAttr::get(ctx, axis));
    blocks.push_back(k);
    return success();
  };
  if (parser.parseLess() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, parseDim))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") ||
        parser.parseCommaSeparatedList(AsmParser::Delimiter::Paren, [&]() -> ParseResult {
          std::string axis;
          if (parser.parseKeywordOrString(&axis))
            return failure();
          partial.push_back(StringAttr::get(ctx, axis));
          return success();
        }))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<ShardingAttr>(ctx, axes, blocks, partial);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  // A compound axis ("dp*ep") is not a keyword: printed as a string.
  auto printAxis = [&](StringAttr axis) {
    if (axis.getValue().contains('*'))
      printer << '"' << axis.getValue() << '"';
    else
      printer << axis.getValue();
  };
  printer << "<[";
  for (auto [i, axis] : llvm::enumerate(getAxes())) {
    printer << (i ? ", " : "");
    if (axis.getValue().empty())
      printer << "_";
    else
      printAxis(axis);
    if (!axis.getValue().empty() && getBlocks()[i] > 1)
      printer << "/" << getBlocks()[i];
  }
  printer << "]";
  if (!getPartial().empty()) {
    printer << ", partial(";
    llvm::interleaveComma(getPartial(), printer, printAxis);
    printer << ")";
  }
  printer << ">";
}

LogicalResult ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   ArrayRef<StringAttr> axes, ArrayRef<int64_t> blocks,
                                   ArrayRef<StringAttr> partial) {
  if (axes.size() != blocks.size())
    return emitError() << "#ptc.sharding needs one block count per dimension";
  for (auto [axis, k] : llvm::zip(axes, blocks))
    if (k < 1 || (axis.getValue().empty() && k != 1))
      return emitError() << "#ptc.sharding: " << k << " blocks of dimension split over '"
                         << axis.getValue() << "' (blocks must be >= 1, and 1 for '_')";
  for (StringAttr a : partial)
    if (a.getValue().empty())
      return emitError() << "#ptc.sharding: an empty partial-sum axis";
  return success();
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

namespace {
constexpr StringLiteral kRoles[] = {PtcDialect::kParamAttrName, PtcDialect::kInputAttrName,
                                    PtcDialect::kStateAttrName};

// MLIR calls the verifier hooks below once per attribute. The checks that
// need the whole function (unique names, result names) run once, from the
// hook of its first named argument or result, over a name index built once:
// scanning every argument from every hook made verification (which follows
// every pass) quadratic in the parameter count.

/// Whether no argument before `argIndex` has a role (stops at the first that
/// has one: argument 0, in every model ptc writes).
bool isFirstRoleArgument(FunctionOpInterface func, unsigned argIndex) {
  for (unsigned i = 0; i < argIndex; ++i)
    if (DictionaryAttr attrs = func.getArgAttrDict(i))
      for (StringRef role : kRoles)
        if (attrs.get(role))
          return false;
  return true;
}

/// Names identify tensors in plans, checkpoints and safetensors files: no
/// name twice among a function's arguments, whatever their roles.
LogicalResult verifyUniqueArgumentNames(FunctionOpInterface func) {
  llvm::StringMap<unsigned> first;
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
    DictionaryAttr attrs = func.getArgAttrDict(i);
    if (!attrs)
      continue;
    for (StringRef role : kRoles)
      if (auto name = attrs.getAs<StringAttr>(role)) {
        auto [it, inserted] = first.try_emplace(name.getValue(), i);
        if (!inserted)
          return func->emitError() << "tensor name '" << name.getValue()
                                   << "' is used by arguments #" << it->second << " and #" << i;
      }
  }
  return success();
}

/// `ptc.grad` names a parameter, `ptc.update` a parameter or state, each of
/// the result's type.
LogicalResult verifyResultNames(FunctionOpInterface func) {
  llvm::StringMap<unsigned> params, states;
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
    if (DictionaryAttr attrs = func.getArgAttrDict(i)) {
      if (auto name = attrs.getAs<StringAttr>(PtcDialect::kParamAttrName))
        params.try_emplace(name.getValue(), i);
      if (auto name = attrs.getAs<StringAttr>(PtcDialect::kStateAttrName))
        states.try_emplace(name.getValue(), i);
    }
  for (unsigned r = 0, e = func.getNumResults(); r < e; ++r) {
    DictionaryAttr attrs = func.getResultAttrDict(r);
    if (!attrs)
      continue;
    for (StringRef attrName : {PtcDialect::kGradAttrName, PtcDialect::kUpdateAttrName}) {
      auto name = attrs.getAs<StringAttr>(attrName);
      if (!name)
        continue;
      std::optional<unsigned> match;
      if (auto it = params.find(name.getValue()); it != params.end())
        match = it->second;
      if (auto it = states.find(name.getValue());
          attrName == PtcDialect::kUpdateAttrName && it != states.end() &&
          (!match || it->second < *match))
        match = it->second;
      Type resultType = func.getResultTypes()[r];
      if (!match)
        return func->emitError()
               << "'" << attrName << "' on result #" << r << " names '" << name.getValue()
               << "', which is not "
               << (attrName == PtcDialect::kGradAttrName ? "a parameter" : "a parameter or state")
               << " of the function";
      if (func.getArgumentTypes()[*match] != resultType)
        return func->emitError() << "result #" << r << " ('" << attrName << "' of '"
                                 << name.getValue() << "') has type " << resultType
                                 << " but the argument has type "
                                 << func.getArgumentTypes()[*match];
    }
  }
  return success();
}

/// Whether no result before `resultIndex` names an argument.
bool isFirstNamedResult(FunctionOpInterface func, unsigned resultIndex) {
  for (unsigned r = 0; r < resultIndex; ++r)
    if (DictionaryAttr attrs = func.getResultAttrDict(r))
      if (attrs.get(PtcDialect::kGradAttrName) || attrs.get(PtcDialect::kUpdateAttrName))
        return false;
  return true;
}
} // namespace

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
    if (!isa<StringAttr, ShardingAttr>(attr.getValue()))
      return op->emitError() << "'ptc.sharding' on argument #" << argIndex
                             << " must be a #ptc.sharding<[dp, _]> (or its text, \"[dp, _]\")";
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto type = func ? dyn_cast<RankedTensorType>(func.getArgumentTypes()[argIndex]) : nullptr;
    FailureOr<MeshInfo> mesh = getEnclosingMesh(op);
    if (type && succeeded(mesh) &&
        failed(getSharding(attr.getValue(), *mesh, type.getRank(), [&] {
          return op->emitError() << "argument #" << argIndex << ": ";
        })))
      return failure();
    return success(); // checked against the mesh by ptc-shard when the module has none yet
  }
  if (attrName == kReshardOnEntryAttrName) {
    if (!isa<ShardingAttr>(attr.getValue()))
      return op->emitError() << "'ptc.reshard_on_entry' on argument #" << argIndex
                             << " must be a #ptc.sharding<[...]>";
    return success();
  }
  if (attrName == kGatherPerUseAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'ptc.gather_per_use' on argument #" << argIndex
                             << " takes no value";
    return success();
  }
  if (attrName == kBiasBalancingAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    auto load = dict ? dict.getAs<StringAttr>("load") : StringAttr();
    auto rate = dict ? dict.getAs<FloatAttr>("rate") : FloatAttr();
    if (!load || load.getValue().empty() || !rate || !(rate.getValueAsDouble() > 0.0))
      return op->emitError() << "'ptc.bias_balancing' on argument #" << argIndex
                             << " must be {load = \"<metric name>\", rate = <positive float>}";
    if (func && !func.getArgAttr(argIndex, kStateAttrName))
      return op->emitError() << "'ptc.bias_balancing' on argument #" << argIndex
                             << " needs a 'ptc.state' on the same argument";
    return success();
  }
  if (attrName == kStateOfAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    auto param = dict ? dict.getAs<StringAttr>("param") : StringAttr();
    Attribute dropped = dict ? dict.get("dropped_dim") : Attribute();
    auto droppedDim = dyn_cast_or_null<IntegerAttr>(dropped);
    auto type = func ? dyn_cast<RankedTensorType>(func.getArgumentTypes()[argIndex]) : nullptr;
    if (!param || param.getValue().empty() || (dropped && !droppedDim) ||
        dict.size() != (dropped ? 2u : 1u))
      return op->emitError() << "'ptc.state_of' on argument #" << argIndex
                             << " must be {param = \"<parameter name>\"} or {param = \"<name>\", "
                                "dropped_dim = <dimension>}";
    if (droppedDim && (droppedDim.getInt() < 0 || (type && droppedDim.getInt() > type.getRank())))
      return op->emitError() << "'ptc.state_of' on argument #" << argIndex << ": dropped_dim "
                             << droppedDim.getInt() << " is not a dimension of the parameter";
    if (func && !func.getArgAttr(argIndex, kStateAttrName))
      return op->emitError() << "'ptc.state_of' on argument #" << argIndex
                             << " needs a 'ptc.state' on the same argument";
    return success();
  }
  if (attrName == kWorkingCopyAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto param = dyn_cast<StringAttr>(attr.getValue());
    if (!param || param.getValue().empty())
      return op->emitError() << "'ptc.working_copy' on argument #" << argIndex
                             << " must name a parameter";
    if (!func)
      return success();
    for (StringRef role : roles)
      if (func.getArgAttr(argIndex, role))
        return op->emitError() << "argument #" << argIndex << " has both 'ptc.working_copy' and '"
                               << role << "'";
    auto copy = dyn_cast<RankedTensorType>(func.getArgumentTypes()[argIndex]);
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
      auto name = func.getArgAttrOfType<StringAttr>(i, kParamAttrName);
      if (!name || name != param)
        continue;
      auto type = cast<RankedTensorType>(func.getArgumentTypes()[i]);
      if (!copy || copy.getShape() != type.getShape() || !type.getElementType().isF32() ||
          !(copy.getElementType().isBF16() || copy.getElementType().isF16()))
        return op->emitError() << "'ptc.working_copy' argument #" << argIndex << " of type "
                               << func.getArgumentTypes()[argIndex] << " must be parameter '"
                               << param.getValue() << "' (" << type << ") in bf16 or f16";
      return success();
    }
    return op->emitError() << "'ptc.working_copy' on argument #" << argIndex << " names '"
                           << param.getValue() << "', which is not a parameter of the function";
  }
  if (attrName == kOnHostAttrName) { // offloaded to host memory (ptc-offload-optimizer)
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'ptc.on_host' on argument #" << argIndex << " takes no value";
    if (func && !func.getArgAttr(argIndex, kParamAttrName) && !func.getArgAttr(argIndex, kStateAttrName))
      return op->emitError() << "'ptc.on_host' on argument #" << argIndex
                             << " needs a parameter or state ('ptc.param' / 'ptc.state')";
    return success();
  }
  if (attrName == kExpertsAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto count = dyn_cast<IntegerAttr>(attr.getValue());
    auto type = func ? dyn_cast<RankedTensorType>(func.getArgumentTypes()[argIndex]) : nullptr;
    if (!count || count.getInt() < 1)
      return op->emitError() << "'ptc.experts' on argument #" << argIndex
                             << " must be a positive integer (the expert count)";
    if (func && !func.getArgAttr(argIndex, kParamAttrName))
      return op->emitError() << "'ptc.experts' on argument #" << argIndex
                             << " needs a 'ptc.param' on the same argument";
    // (After ptc-shard the type is the local one: ep splits dimension 0.)
    bool local = func && func.getArgAttr(argIndex, kShardingAttrName);
    if (type && (type.getRank() < 1 || (!local && type.getDimSize(0) != count.getInt())))
      return op->emitError() << "'ptc.experts' = " << count.getInt() << " on argument #"
                             << argIndex << " must be its dimension 0, got type " << type;
    return success();
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
  if (llvm::is_contained(tensorType.getShape(), 0))
    return op->emitError() << "argument #" << argIndex << " ('" << name.getValue()
                           << "') has a zero-size dimension, " << argType
                           << ": ptc tensors are never empty";
  if (attrName != kInputAttrName && !isa<FloatType>(tensorType.getElementType()))
    return op->emitError() << (attrName == kParamAttrName ? "parameter" : "optimizer state")
                           << " '" << name.getValue()
                           << "' must have a floating-point element type, got "
                           << tensorType.getElementType();
  for (StringRef other : roles)
    if (other != attrName && func.getArgAttr(argIndex, other))
      return op->emitError() << "argument #" << argIndex << " has both '" << attrName
                             << "' and '" << other << "'";

  if (isFirstRoleArgument(func, argIndex))
    return verifyUniqueArgumentNames(func);
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
  if (attrName == kLossAttrName || attrName == kGradNormAttrName || attrName == kLossScaleAttrName ||
      attrName == kLrAttrName || attrName == kSkippedAttrName) {
    auto t = dyn_cast<RankedTensorType>(resultType);
    if (!isa<UnitAttr>(attr.getValue()) || !t || t.getRank() != 0 ||
        !isa<FloatType>(t.getElementType()))
      return op->emitError() << "'" << attrName << "' on result #" << resultIndex
                             << " must be a unit attribute on a scalar float tensor";
    return success();
  }
  if (attrName == kMetricAttrName) {
    auto t = dyn_cast<RankedTensorType>(resultType);
    auto name = dyn_cast<StringAttr>(attr.getValue());
    if (!name || name.getValue().empty() || !t || !isa<FloatType>(t.getElementType()))
      return op->emitError() << "'ptc.metric' on result #" << resultIndex
                             << " must name a float tensor result";
    return success();
  }
  if (attrName == kLogitsAttrName) {
    auto t = dyn_cast<RankedTensorType>(resultType);
    if (!isa<UnitAttr>(attr.getValue()) || !t || t.getRank() < 2 ||
        !isa<FloatType>(t.getElementType()))
      return op->emitError() << "'ptc.logits' on result #" << resultIndex
                             << " must be a unit attribute on a float tensor [..., vocab]";
    return success();
  }
  if (attrName == kWorkingCopyAttrName) { // the new working copy of the named parameter
    auto param = dyn_cast<StringAttr>(attr.getValue());
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      if (param && func.getArgAttr(i, kWorkingCopyAttrName) == param) {
        if (func.getArgumentTypes()[i] != resultType)
          return op->emitError() << "result #" << resultIndex << " ('ptc.working_copy' of '"
                                 << param.getValue() << "') has type " << resultType
                                 << " but the working copy argument has type "
                                 << func.getArgumentTypes()[i];
        return success();
      }
    return op->emitError() << "'ptc.working_copy' on result #" << resultIndex
                           << " must name a parameter that has a working copy argument";
  }
  if (attrName != kGradAttrName && attrName != kUpdateAttrName)
    return op->emitError() << "unknown ptc result attribute '" << attrName << "' on result #"
                           << resultIndex;
  auto name = dyn_cast<StringAttr>(attr.getValue());
  if (!name)
    return op->emitError() << "'" << attrName << "' on result #" << resultIndex
                           << " must name an argument";
  if (isFirstNamedResult(func, resultIndex))
    return verifyResultNames(func);
  return success();
}
