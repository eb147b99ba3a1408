//===- KeepWorkingCopies.cpp - updates write the bf16 working copies -----===//

#include "passes/memory/Passes.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_KEEPWORKINGCOPIESPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// A parameter whose low-precision conversions can read a kept working copy.
struct Candidate {
  BlockArgument param;
  StringAttr name;
  SmallVector<ConvertOp> converts;
  Operation *update = nullptr;
};

/// The parameter `arg`'s conversions and update, where they qualify: every
/// conversion to one bf16 / f16 type before the update, in the function's
/// block; one device update (AdamW or SGD) writing the new parameter back in
/// place. The conversions to replace leave out those a pipeline send reads.
std::optional<Candidate> candidateOf(func::FuncOp func, BlockArgument arg,
                                     const llvm::DenseMap<Value, unsigned> &writtenBack) {
  unsigned i = arg.getArgNumber();
  auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kParamAttrName);
  if (!name || isOnHost(arg) ||
      !cast<RankedTensorType>(arg.getType()).getElementType().isF32())
    return std::nullopt;
  Candidate c{arg, name, {}, nullptr};
  Type low;
  for (Operation *user : arg.getUsers()) {
    if (auto convert = dyn_cast<ConvertOp>(user)) {
      Type element = convert.getType().getElementType();
      if (!element.isBF16() && !element.isF16())
        continue; // another reader of the f32 weight
      if (low && element != low)
        return std::nullopt;
      low = element;
      // A pipeline send of the converted weight (a tied weight another stage
      // reads) keeps its conversion: the schedule sends values its
      // micro-batch produces.
      if (llvm::none_of(convert->getUsers(), [](Operation *u) { return isa<SendOp>(u); }))
        c.converts.push_back(convert);
      continue;
    }
    auto update = dyn_cast<FusedUpdateOpInterface>(user);
    if (!update || update.getParam() != arg)
      continue;
    if (c.update || update.getWorkingCopy() || user->hasAttr(PtcDialect::kOnHostAttrName))
      return std::nullopt;
    c.update = user;
  }
  if (c.converts.empty() || !c.update)
    return std::nullopt;
  Block *block = &func.getBody().front();
  for (ConvertOp convert : c.converts)
    if (convert->getBlock() != block || !convert->isBeforeInBlock(c.update))
      return std::nullopt;
  auto back = writtenBack.find(c.update->getResult(0));
  if (back == writtenBack.end())
    return std::nullopt;
  auto target = func.getResultAttrOfType<StringAttr>(back->second, PtcDialect::kUpdateAttrName);
  if (target != name)
    return std::nullopt;
  return c;
}

struct KeepWorkingCopiesPass
    : mlir::ptc::impl::KeepWorkingCopiesPassBase<KeepWorkingCopiesPass> {
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    Block &block = func.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    llvm::DenseMap<Value, unsigned> writtenBack;
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      if (func.getResultAttr(i, PtcDialect::kUpdateAttrName))
        writtenBack.try_emplace(v, static_cast<unsigned>(i));
    SmallVector<Candidate> candidates;
    for (BlockArgument arg : block.getArguments())
      if (std::optional<Candidate> c = candidateOf(func, arg, writtenBack))
        candidates.push_back(std::move(*c));
    MLIRContext *ctx = func.getContext();
    for (Candidate &c : candidates) {
      const unsigned p = c.param.getArgNumber();
      auto copyType = cast<RankedTensorType>(c.converts.front().getType());
      // The copy's argument: the parameter's name, sharding and stage.
      NamedAttrList attrs;
      attrs.set(PtcDialect::kWorkingCopyAttrName, c.name);
      for (StringRef carried : {PtcDialect::kShardingAttrName, PtcDialect::kStageAttrName})
        if (Attribute a = func.getArgAttr(p, carried))
          attrs.set(carried, a);
      const unsigned at = func.getNumArguments();
      if (failed(func.insertArgument(at, copyType, attrs.getDictionary(ctx), c.param.getLoc()))) {
        signalPassFailure();
        return;
      }
      BlockArgument copy = func.getArgument(at);
      for (ConvertOp convert : c.converts) {
        convert.getResult().replaceAllUsesWith(copy);
        convert.erase();
      }
      // The update again with the working copy as its last result (the same
      // operands, properties and discardable attributes).
      Operation *old = c.update;
      OpBuilder b(old);
      OperationState state(old->getLoc(), old->getName());
      state.addOperands(old->getOperands());
      state.addTypes(old->getResultTypes());
      state.addTypes(copyType);
      state.propertiesAttr = old->getPropertiesAsAttribute();
      state.addAttributes(old->getDiscardableAttrDictionary().getValue());
      Operation *now = b.create(state);
      for (auto [from, to] : llvm::zip(old->getResults(), now->getResults()))
        from.replaceAllUsesWith(to);
      old->erase();
      Value newCopy = cast<FusedUpdateOpInterface>(now).getWorkingCopy();
      // Written back into the copy's argument after the step.
      const unsigned result = func.getNumResults();
      NamedAttrList resultAttrs;
      resultAttrs.set(PtcDialect::kWorkingCopyAttrName, c.name);
      if (failed(func.insertResult(result, copyType, resultAttrs.getDictionary(ctx)))) {
        signalPassFailure();
        return;
      }
      ret->insertOperands(result, newCopy);
    }
  }
};
} // namespace
