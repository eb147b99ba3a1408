//===- Recompute.cpp - rematerialize forward values in the backward pass --===//

#include "passes/autodiff/Passes.h"
#include "runtime/base/option_values.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

#include <functional>

namespace mlir::ptc {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "passes/autodiff/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::Recompute;

namespace {
/// Ops whose recomputation costs little next to the matmuls around them.
bool isCheap(Operation *op) {
  return isa<AddOp, SubOp, MulOp, DivOp, ScaleOp, ConvertOp, ReshapeOp, TransposeOp, SliceOp,
             ConcatOp, RotaryOp, RotaryAtOp, CausalAttentionOp, SwigluOp,
             ElementwiseFunctionOpInterface>(op);
}

/// The transformer layer a parameter belongs to, from its name
/// (`transformer.h.3.attn.c_attn.weight`, `model.layers.3.mlp.up_proj.weight`).
std::optional<int64_t> layerOfName(StringRef s) {
  for (StringRef key : {".h.", ".layers."}) {
    size_t at = s.find(key);
    if (at == StringRef::npos)
      continue;
    StringRef digits = s.drop_front(at + key.size()).take_while([](char c) {
      return c >= '0' && c <= '9';
    });
    int64_t index;
    if (!digits.empty() && !digits.getAsInteger(10, index))
      return index;
  }
  return std::nullopt;
}

struct RecomputePass : mlir::ptc::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    if (layers < -1) {
      func.emitError() << "recompute-layers=" << layers.getValue()
                       << " must be a layer count >= 0 (or -1: every layer)";
      return signalPassFailure();
    }
    const std::optional<Recompute> kind = parseOption<Recompute>(mode);
    if (kind == Recompute::None && layers >= 0) {
      func.emitError() << "recompute-layers=" << layers.getValue()
                       << " needs recompute=selective or recompute=full";
      return signalPassFailure();
    }
    if (kind != Recompute::Full && kind != Recompute::Selective) {
      func.emitError() << "recompute must be " << ::ptc::optionChoices<Recompute>() << ", got '" << mode << "'";
      return signalPassFailure();
    }
    Block &block = func.getBody().front();
    Operation *firstBackward = nullptr;
    for (Operation &op : block)
      if (op.hasAttr(PtcDialect::kBackwardAttrName)) {
        firstBackward = &op;
        break;
      }
    if (!firstBackward)
      return; // not a differentiated step
    auto isForward = [&](Operation *op) {
      return op && op->getBlock() == &block && op->isBeforeInBlock(firstBackward) &&
             !isa<arith::ConstantOp>(op);
    };
    // The micro-batch sum of a forward value (the loss, an MoE layer's
    // metrics) is not a backward use: it keeps reading the forward value, so
    // that a pipeline's later chunk does not wait for a value recomputed in an
    // earlier chunk's backward pass (which runs after its own).
    auto backwardUses = [&](Value v) {
      SmallVector<OpOperand *> uses;
      for (OpOperand &use : v.getUses())
        if (use.getOwner()->hasAttr(PtcDialect::kBackwardAttrName) &&
            !isa<MicrobatchSumOp>(use.getOwner()))
          uses.push_back(&use);
      return uses;
    };

    // recompute-layers: only ops of the first N layers of each chunk.
    // A forward op is in layer i when it reads a parameter of layer i, in no
    // layer when it reads another parameter (embeddings, final norm, head),
    // and otherwise in the latest layer of its operands.
    std::function<bool(Operation *)> eligible = [](Operation *) { return true; };
    if (layers >= 0) {
      llvm::DenseMap<Operation *, int64_t> layerOf; // -1: in no layer
      int64_t count = 0;
      for (Operation &op : block) {
        if (!isForward(&op))
          continue;
        int64_t layer = -1;
        bool other = false, own = false;
        for (Value v : op.getOperands()) {
          if (auto arg = dyn_cast<BlockArgument>(v)) {
            auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                          PtcDialect::kParamAttrName);
            if (!name)
              continue;
            if (std::optional<int64_t> l = layerOfName(name.getValue())) {
              layer = own ? std::max(layer, *l) : *l;
              own = true;
            } else {
              other = true;
            }
          }
        }
        if (!own && !other)
          for (Value v : op.getOperands())
            if (Operation *d = v.getDefiningOp(); d && layerOf.count(d))
              layer = std::max(layer, layerOf[d]);
        if (!own && other)
          layer = -1;
        layerOf[&op] = layer;
        count = std::max(count, layer + 1);
      }
      if (count == 0 || count % chunks != 0 || layers > count / chunks) {
        func.emitError() << "recompute-layers=" << layers.getValue() << " needs "
                         << (count == 0
                                 ? std::string("transformer layers (parameters named "
                                               "transformer.h.<i>.* or model.layers.<i>.*); "
                                               "found none")
                                 : count % chunks != 0
                                       ? "the " + std::to_string(count) +
                                             " layers to split evenly over the " +
                                             std::to_string(chunks) + " pipeline chunks"
                                       : "at most the " + std::to_string(count / chunks) +
                                             " layers of a pipeline chunk");
        return signalPassFailure();
      }
      int64_t perChunk = count / chunks;
      eligible = [this, perChunk, layerOf = std::move(layerOf)](Operation *op) {
        auto it = layerOf.find(op);
        return it != layerOf.end() && it->second >= 0 && it->second % perChunk < layers;
      };
      func->setAttr("ptc.recompute_layers",
                    IntegerAttr::get(IntegerType::get(func.getContext(), 64), layers * chunks));
    }

    // The values to keep whatever the mode: the residual stream (norm inputs)
    // and the logits (recomputing the LM head would cost a whole matmul).
    llvm::DenseSet<Value> kept;
    for (Operation &op : block) {
      if (!isForward(&op))
        continue;
      if (op.hasTrait<OpTrait::RowNormalization>())
        kept.insert(op.getOperand(0));
      if (isa<CrossEntropyOp>(op))
        kept.insert(op.getOperand(0));
    }
    // The forward values the backward pass reads, and which of them to recompute.
    llvm::DenseSet<Value> saved, recompute;
    for (Operation &op : block)
      if (isForward(&op))
        for (Value r : op.getResults())
          if (!backwardUses(r).empty())
            saved.insert(r);
    // Selective: a value can be rebuilt from what the backward pass has anyway
    // (arguments, constants, kept values, saved values that stay saved)
    // through cheap ops only. Decided in program order, so an operand's fate
    // is known before its users'.
    llvm::DenseMap<Value, bool> available;
    std::function<bool(Value)> isAvailable = [&](Value o) -> bool {
      Operation *d = o.getDefiningOp();
      if (!isForward(d) || kept.contains(o))
        return true;
      if (saved.contains(o) && !recompute.contains(o))
        return true;
      if (auto it = available.find(o); it != available.end())
        return it->second;
      bool ok = isCheap(d) && llvm::all_of(d->getOperands(), isAvailable);
      available[o] = ok;
      return ok;
    };
    for (Operation &op : block) {
      if (!isForward(&op))
        continue;
      for (Value v : op.getResults()) {
        if (!saved.contains(v) || kept.contains(v) || isa<CrossEntropyOp, EmbeddingOp>(op) ||
            !eligible(&op))
          continue;
        if (kind == Recompute::Full ||
            (isCheap(&op) && llvm::all_of(op.getOperands(), isAvailable)))
          recompute.insert(v);
      }
    }
    if (recompute.empty())
      return;
    func->setAttr("ptc.recompute", StringAttr::get(func.getContext(), mode));

    // Clone each chosen value (and, in full mode, the forward values it needs
    // that are not kept) right before its first backward use.
    OpBuilder b(func.getContext());
    llvm::DenseMap<Value, Value> clones;
    std::function<Value(Value)> cloneOf = [&](Value v) -> Value {
      if (auto it = clones.find(v); it != clones.end())
        return it->second;
      Operation *def = v.getDefiningOp();
      if (!isForward(def) || kept.contains(v) || (saved.contains(v) && !recompute.contains(v)) ||
          isa<EmbeddingOp>(def))
        return v;
      IRMapping map;
      for (Value o : def->getOperands())
        map.map(o, cloneOf(o));
      Operation *copy = b.clone(*def, map);
      copy->setAttr(PtcDialect::kBackwardAttrName, b.getUnitAttr());
      copy->setAttr("ptc.recomputed", b.getUnitAttr());
      if (Attribute id = def->getAttr(PtcDialect::kForwardIdAttrName)) {
        copy->removeAttr(PtcDialect::kForwardIdAttrName);
        copy->setAttr(PtcDialect::kVjpOfAttrName, id);
      }
      for (auto [from, to] : llvm::zip(def->getResults(), copy->getResults()))
        clones[from] = to;
      return clones[v];
    };
    // In program order of the first backward use, so clones precede their users.
    SmallVector<std::pair<Operation *, Value>> order;
    for (Value v : recompute) {
      auto uses = backwardUses(v);
      Operation *first = uses.front()->getOwner();
      for (OpOperand *u : uses)
        if (u->getOwner()->isBeforeInBlock(first))
          first = u->getOwner();
      order.push_back({first, v});
    }
    llvm::sort(order, [](const auto &x, const auto &y) { return x.first->isBeforeInBlock(y.first); });
    for (auto &[first, v] : order) {
      b.setInsertionPoint(first);
      Value c = cloneOf(v);
      for (OpOperand *use : backwardUses(v))
        if (use->getOwner() != c.getDefiningOp() && !use->getOwner()->hasAttr("ptc.recomputed"))
          use->set(c);
    }
  }
};
} // namespace
