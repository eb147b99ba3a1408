//===- ModelBlocks.cpp - a model file's repeated blocks, and cutting them -===//

#include "planner/ModelBlocks.h"

#include "dialects/ptc/PtcOps.h"

#include "llvm/ADT/BitVector.h"

#include <map>
#include <set>
#include <string>

using namespace mlir;
using namespace mlir::ptc;

namespace ptc::planner {

std::optional<FileBlocks> findBlocks(func::FuncOp func) {
  // Parameters by (prefix, index): the first numeric component of the name.
  std::map<std::string, std::map<int64_t, std::set<std::string>>> byPrefix;
  std::map<std::string, std::vector<std::pair<BlockArgument, int64_t>>> argsOf;
  for (BlockArgument arg : func.getArguments()) {
    auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kParamAttrName);
    if (!name)
      continue;
    SmallVector<StringRef> parts;
    name.getValue().split(parts, '.');
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      int64_t index;
      if (parts[i].getAsInteger(10, index) || index < 0)
        continue;
      std::string prefix, rest;
      for (size_t j = 0; j < i; ++j)
        prefix += parts[j].str() + ".";
      for (size_t j = i + 1; j < parts.size(); ++j)
        rest += (j > i + 1 ? "." : "") + parts[j].str();
      byPrefix[prefix][index].insert(rest);
      argsOf[prefix].push_back({arg, index});
      break;
    }
  }
  const std::string *best = nullptr;
  for (auto &[prefix, blocks] : byPrefix)
    if (!best || blocks.size() > byPrefix[*best].size())
      best = &prefix;
  if (!best)
    return std::nullopt;
  auto &blocks = byPrefix[*best];
  FileBlocks fb;
  fb.layers = static_cast<int64_t>(blocks.size());
  if (fb.layers < 2 || blocks.rbegin()->first != fb.layers - 1)
    return std::nullopt;
  for (auto &[index, rest] : blocks)
    if (rest != blocks.begin()->second)
      return std::nullopt;
  for (auto &[arg, index] : argsOf[*best])
    fb.layerOf[arg] = index;
  SmallVector<Operation *> ops;
  for (Operation &op : func.getBody().front().without_terminator())
    ops.push_back(&op);
  std::vector<int64_t> direct(ops.size(), -1);
  fb.begin.assign(static_cast<size_t>(fb.layers), ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    for (Value v : ops[i]->getOperands())
      if (auto arg = dyn_cast<BlockArgument>(v); arg && fb.layerOf.count(arg)) {
        int64_t l = fb.layerOf[arg];
        if (direct[i] >= 0 && direct[i] != l)
          return std::nullopt;
        direct[i] = l;
        fb.begin[static_cast<size_t>(l)] = std::min(fb.begin[static_cast<size_t>(l)], i);
      }
  fb.length = fb.begin[1] - std::min(fb.begin[1], fb.begin[0]);
  if (fb.length == 0)
    return std::nullopt;
  for (int64_t l = 0; l < fb.layers; ++l) {
    size_t b = fb.begin[static_cast<size_t>(l)];
    if (b + fb.length > ops.size() ||
        (l + 1 < fb.layers && fb.begin[static_cast<size_t>(l + 1)] != b + fb.length))
      return std::nullopt;
    for (size_t j = 0; j < fb.length; ++j) {
      Operation *op = ops[b + j], *first = ops[fb.begin[0] + j];
      if (op->getName() != first->getName() || op->getNumResults() != first->getNumResults() ||
          (direct[b + j] >= 0 && direct[b + j] != l))
        return std::nullopt;
    }
  }
  // Nothing outside the regions reads a block's parameters.
  size_t end = fb.begin.back() + fb.length;
  for (size_t i = 0; i < ops.size(); ++i)
    if ((i < fb.begin[0] || i >= end) && direct[i] >= 0)
      return std::nullopt;
  return fb;
}

/// `module` (one function, blocks `fb`) cut to its first `keep` blocks: what
/// followed the last block now reads the corresponding results of block
/// keep - 1. Null when the cut does not close (a later op reads an earlier
/// block's values).
OwningOpRef<ModuleOp> truncateBlocks(ModuleOp module, const FileBlocks &fb, int64_t keep) {
  OwningOpRef<ModuleOp> out(cast<ModuleOp>(module->clone()));
  func::FuncOp func;
  for (auto f : out->getOps<func::FuncOp>())
    if (!f.isExternal())
      func = f;
  if (!func)
    return nullptr;
  SmallVector<Operation *> ops;
  for (Operation &op : func.getBody().front().without_terminator())
    ops.push_back(&op);
  const size_t lastBegin = fb.begin.back(), keptBegin = fb.begin[static_cast<size_t>(keep - 1)];
  const size_t end = lastBegin + fb.length;
  llvm::DenseMap<Operation *, size_t> indexOf;
  for (size_t i = 0; i < ops.size(); ++i)
    indexOf[ops[i]] = i;
  // What follows the blocks (and the return) reads block keep - 1 instead of the last.
  SmallVector<Operation *> readers(ops.begin() + static_cast<long>(end), ops.end());
  readers.push_back(func.getBody().front().getTerminator());
  for (Operation *reader : readers)
    for (OpOperand &operand : reader->getOpOperands()) {
      Operation *def = operand.get().getDefiningOp();
      if (!def)
        continue;
      size_t i = indexOf.lookup(def);
      if (i < fb.begin[0] || i >= end)
        continue;
      if (i < lastBegin)
        return nullptr;
      Operation *same = ops[keptBegin + (i - lastBegin)];
      operand.set(same->getResult(cast<OpResult>(operand.get()).getResultNumber()));
    }
  for (size_t i = end; i-- > fb.begin[static_cast<size_t>(keep)];)
    if (ops[i]->use_empty())
      ops[i]->erase();
    else
      return nullptr;
  // The cut blocks' parameters go with them.
  llvm::BitVector unused(func.getNumArguments());
  for (BlockArgument arg : func.getArguments())
    if (arg.use_empty() && func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName))
      unused.set(arg.getArgNumber());
  if (failed(func.eraseArguments(unused)))
    return nullptr;
  return out;
}

} // namespace ptc::planner
