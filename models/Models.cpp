//===- Models.cpp - helpers shared by the model builders ------------------===//

#include "models/ModelBuilder.h"

#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace mlir::ptc;

int64_t mlir::ptc::countElements(const std::vector<TensorSpec> &specs) {
  int64_t total = 0;
  for (const TensorSpec &s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape)
      n *= d;
    total += n;
  }
  return total;
}

Type mlir::ptc::floatType(MLIRContext &context, ::ptc::FloatDtype dtype) {
  Builder b(&context);
  switch (dtype) {
  case ::ptc::FloatDtype::Bf16:
    return b.getBF16Type();
  case ::ptc::FloatDtype::F16:
    return b.getF16Type();
  case ::ptc::FloatDtype::F32:
    break;
  }
  return b.getF32Type();
}

std::vector<ModelBuilder::Input> ModelBuilder::tokenInputs(MLIRContext &context, int64_t batch,
                                                           int64_t seq, bool documents) {
  Type i32 = IntegerType::get(&context, 32);
  std::vector<Input> inputs = {{{"tokens", {batch, seq}}, i32}, {{"targets", {batch, seq}}, i32}};
  if (documents)
    inputs.push_back({{"positions", {batch, seq}}, i32});
  return inputs;
}

ModelBuilder::ModelBuilder(MLIRContext &context, Type floatType,
                           const std::vector<TensorSpec> &params,
                           const std::vector<Input> &inputs)
    : b(&context), ftype(floatType) {
  context.loadDialect<PtcDialect, func::FuncDialect, arith::ArithDialect>();
  Location moduleLoc = NameLoc::get(b.getStringAttr("train_step"));
  module = ModuleOp::create(moduleLoc);

  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  for (const TensorSpec &p : params) {
    argTypes.push_back(RankedTensorType::get(p.shape, floatType));
    SmallVector<NamedAttribute> attrs{
        b.getNamedAttr(PtcDialect::kParamAttrName, b.getStringAttr(p.name))};
    if (!p.init.empty())
      attrs.push_back(b.getNamedAttr(PtcDialect::kInitAttrName, b.getStringAttr(p.init)));
    if (p.experts > 0)
      attrs.push_back(
          b.getNamedAttr(PtcDialect::kExpertsAttrName, b.getI64IntegerAttr(p.experts)));
    argAttrs.push_back(b.getDictionaryAttr(attrs));
  }
  for (const Input &in : inputs) {
    argTypes.push_back(RankedTensorType::get(in.spec.shape, in.elementType));
    argAttrs.push_back(b.getDictionaryAttr(
        b.getNamedAttr(PtcDialect::kInputAttrName, b.getStringAttr(in.spec.name))));
  }
  auto funcType = b.getFunctionType(argTypes, {});
  b.setInsertionPointToEnd(module->getBody());
  func = func::FuncOp::create(b, moduleLoc, "train_step", funcType);
  func.setAllArgAttrs(argAttrs);
  Block *entry = func.addEntryBlock();
  for (auto [i, p] : llvm::enumerate(params))
    args[p.name] = entry->getArgument(i);
  for (auto [i, in] : llvm::enumerate(inputs))
    args[in.spec.name] = entry->getArgument(params.size() + i);
  b.setInsertionPointToStart(entry);
}

Location ModelBuilder::loc(const Twine &scope) {
  return NameLoc::get(b.getStringAttr(scope));
}

Value ModelBuilder::param(StringRef name) const {
  auto it = args.find(name);
  assert(it != args.end() && "model builder asked for an undeclared parameter");
  return it->second;
}

Value ModelBuilder::input(StringRef name) const { return param(name); }

Value ModelBuilder::linear(Value x, StringRef prefix, bool bias) {
  Location l = loc(prefix);
  Value y = MatmulOp::create(b, l, x, param((prefix + ".weight").str()),
                             /*transposeLhs=*/false, /*transposeRhs=*/true);
  if (bias)
    y = AddOp::create(b, l, y, param((prefix + ".bias").str()));
  return y;
}

Value ModelBuilder::addState(StringRef name, Type type, ArrayRef<NamedAttribute> attrs) {
  unsigned at = 0;
  for (unsigned i = 0; i < func.getNumArguments(); ++i)
    if (func.getArgAttr(i, PtcDialect::kParamAttrName) || func.getArgAttr(i, PtcDialect::kStateAttrName))
      at = i + 1;
  SmallVector<NamedAttribute> all{b.getNamedAttr(PtcDialect::kStateAttrName, b.getStringAttr(name))};
  all.append(attrs.begin(), attrs.end());
  if (failed(func.insertArgument(at, type, b.getDictionaryAttr(all), func.getLoc())))
    return Value();
  Value arg = func.getArgument(at);
  args[name] = arg;
  return arg;
}

Value ModelBuilder::expertLinear(Value x, StringRef prefix, bool bias) {
  Location l = loc(prefix);
  Value y = MatmulOp::create(b, l, x, param((prefix + ".weight").str()),
                             /*transposeLhs=*/false, /*transposeRhs=*/true);
  if (!bias)
    return y;
  Value bv = param((prefix + ".bias").str()); // [E, out] -> [E, 1, out]
  auto bt = cast<RankedTensorType>(bv.getType());
  return AddOp::create(b, l, y, reshape(bv, {bt.getDimSize(0), 1, bt.getDimSize(1)}, l));
}

Value ModelBuilder::reshape(Value x, ArrayRef<int64_t> shape, Location l) {
  auto type = RankedTensorType::get(shape, cast<RankedTensorType>(x.getType()).getElementType());
  return ReshapeOp::create(b, l, type, x);
}

llvm::Expected<OwningOpRef<ModuleOp>> ModelBuilder::finish(Value loss) {
  SmallVector<Value> results{loss};
  for (auto &[name, v] : metrics)
    results.push_back(v);
  func::ReturnOp::create(b, loc("loss"), results);
  func.setType(b.getFunctionType(func.getArgumentTypes(), ValueRange(results).getTypes()));
  for (auto [i, m] : llvm::enumerate(metrics))
    func.setResultAttr(static_cast<unsigned>(i + 1), PtcDialect::kMetricAttrName,
                       b.getStringAttr(m.first));
  if (failed(verify(*module)))
    return llvm::createStringError("the generated model does not verify (see the diagnostics above)");
  return std::move(module);
}
