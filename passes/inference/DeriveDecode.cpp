//===- DeriveDecode.cpp - a forward-only decode function from a model -----===//
//
// Turns the training model (forward pass + loss, before autodiff) into the
// function that runs new tokens against a key/value cache and returns their
// logits (see Passes.td). Two dimensions are tracked from the `tokens` input
// through every op that needs them: the batch (tokens' dimension 0) and the
// sequence (dimension 1), each with the op's micro-batch rule (how an op
// carries a per-example dimension is how it carries a per-token one). Every
// value that has them is resized to `batch` x `tokens`; attention, rotary
// embeddings and position tables, which read the position of a token rather
// than carry it, are rewritten to read `positions`.
//
//===----------------------------------------------------------------------===//

#include "passes/inference/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

#include "llvm/ADT/SetVector.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_DERIVEDECODEPASS
#include "passes/inference/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
constexpr int kNone = kNoBatch;

/// Per value: where the tokens' batch and sequence dimensions are (kNone:
/// not carried; the same dimension: merged, batch x sequence rows) and their
/// sizes in the model (the sequence's is an MoE buffer's capacity there).
struct Dims {
  int batch = kNone, seq = kNone;
  int64_t batchSize = 0, seqSize = 0;
  bool merged() const { return batch != kNone && batch == seq; }
};

int64_t prefixProduct(ArrayRef<int64_t> shape, int d) {
  int64_t p = 1;
  for (int i = 0; i < d; ++i)
    p *= shape[i];
  return p;
}

struct Deriver {
  Deriver(func::FuncOp func, int64_t tokens, int64_t context, int64_t batch)
      : func(func), tokens(tokens), context(context), batch(batch) {}
  func::FuncOp func;
  int64_t tokens, context, batch;
  int64_t seq = 0; // the model's sequence length
  llvm::DenseMap<Value, Dims> dims;
  BlockArgument positions;

  InFlightDiagnostic error(Operation *op) {
    return op->emitOpError() << "cannot be derived for decoding (ptc-derive-decode): ";
  }

  /// The dimension a per-example / per-token dimension of `op`'s operands
  /// lands on in its results, by the op's micro-batch rule; kNone when no
  /// operand carries it. Errors name the op.
  FailureOr<int> carry(Operation *op, ArrayRef<int> in, StringRef what) {
    if (llvm::all_of(in, [](int d) { return d < 0; }))
      return kNone;
    auto rule = dyn_cast<MicrobatchOpInterface>(op);
    if (!rule)
      return error(op) << "ptc has no rule for how it carries the " << what << " dimension";
    std::string why;
    FailureOr<int> d = failure();
    {
      ScopedDiagnosticHandler capture(op->getContext(), [&](Diagnostic &diag) {
        why = diag.str();
        return success();
      });
      d = rule.inferBatchDim(in, 1);
    }
    if (failed(d)) {
      StringRef reason(why);
      if (size_t colon = reason.find(": "); colon != StringRef::npos)
        reason = reason.drop_front(colon + 2);
      return error(op) << "its " << what << " dimension: " << reason;
    }
    if (*d < 0)
      return error(op) << "it reduces over the " << what << " dimension";
    return *d;
  }

  /// Where a reshape puts the batch and sequence of its input: dimensions
  /// kept (same prefix product and size), merged into one (batch x
  /// sequence rows) or split back out of one.
  FailureOr<Dims> reshapeDims(ReshapeOp op, Dims in) {
    ArrayRef<int64_t> src = op.getInput().getType().getShape(), dst = op.getType().getShape();
    Dims out = in;
    out.batch = out.seq = kNone;
    auto find = [&](int64_t prefix, int64_t size) -> int {
      for (size_t e = 0; e < dst.size(); ++e)
        if (prefixProduct(dst, static_cast<int>(e)) == prefix && dst[e] == size)
          return static_cast<int>(e);
      return kNone;
    };
    if (in.merged()) {
      int64_t p = prefixProduct(src, in.batch);
      if (int e = find(p, src[in.batch]); e != kNone) {
        out.batch = out.seq = e;
      } else if (int e = find(p, in.batchSize);
                 e != kNone && e + 1 < static_cast<int>(dst.size()) && dst[e + 1] == in.seqSize) {
        out.batch = e;
        out.seq = e + 1;
      }
    } else {
      out.batch = find(prefixProduct(src, in.batch), src[in.batch]);
      out.seq = find(prefixProduct(src, in.seq), src[in.seq]);
      if ((out.batch == kNone || out.seq == kNone) && in.seq == in.batch + 1) {
        int e = find(prefixProduct(src, in.batch), src[in.batch] * src[in.seq]);
        out.batch = out.seq = e;
      }
    }
    if (out.batch == kNone || out.seq == kNone)
      return error(op) << "it reshapes " << op.getInput().getType() << " to " << op.getType()
                       << ", mixing the tokens' batch or sequence with other dimensions";
    return out;
  }

  /// Analysis on the unchanged function: the dimensions of every value that
  /// the logits depend on.
  LogicalResult analyze(ArrayRef<Operation *> ops) {
    for (Operation *op : ops) {
      SmallVector<int> b, s;
      std::optional<Dims> first; // of the first operand that carries them
      for (Value v : op->getOperands()) {
        auto it = dims.find(v);
        b.push_back(it == dims.end() ? kNone : it->second.batch);
        s.push_back(it == dims.end() ? kNone : it->second.seq);
        if (it != dims.end() && !first)
          first = it->second;
      }
      if (!first)
        continue;
      Dims out = *first;
      if (isa<CausalAttentionOp, RotaryOp, RotaryAtOp>(op)) {
        if (auto rot = dyn_cast<RotaryOp>(op); rot && rot.getInverse())
          return error(op) << "an inverse rotation in the forward pass";
        if (auto rot = dyn_cast<RotaryAtOp>(op); rot && rot.getInverse())
          return error(op) << "an inverse rotation in the forward pass";
        // The float operands (packed documents' positions follow them).
        const size_t heads = isa<CausalAttentionOp>(op) ? 3 : 1;
        for (auto [bi, si] : llvm::zip(ArrayRef(b).take_front(heads), ArrayRef(s).take_front(heads)))
          if (bi != 0 || si != 2)
            return error(op) << "its operands must be [batch, heads, sequence, head_dim] of the "
                                "tokens";
      } else if (auto reshape = dyn_cast<ReshapeOp>(op)) {
        FailureOr<Dims> d = reshapeDims(reshape, *first);
        if (failed(d))
          return failure();
        out = *d;
      } else if (auto dispatch = dyn_cast<MoeDispatchOp>(op)) {
        // [groups = batch, tokens, dim] -> [experts, batch, capacity, dim]. A
        // call's tokens fill at most `tokens` slots of an expert (each token
        // picks distinct experts): capacity `tokens` drops nothing.
        if (b[0] != 0 || s[0] != 1 || b[1] != 0 || s[1] != 1)
          return error(op) << "its routing groups must be the sequences of the batch "
                              "([batch, sequence, dim] tokens)";
        out.batch = 1;
        out.seq = 2;
        out.seqSize = dispatch.getType().getDimSize(2);
      } else if (isa<MoeCombineOp>(op)) {
        if (b[0] != 1 || s[0] != 2 || b[1] != 0 || s[1] != 1 || b[2] != 0 || s[2] != 1)
          return error(op) << "expects expert buffers [experts, batch, capacity, dim] and "
                              "[batch, sequence, k] routing";
        out = dims.lookup(op->getOperand(1));
      } else {
        FailureOr<int> bd = carry(op, b, "batch");
        if (failed(bd))
          return failure();
        FailureOr<int> sd = carry(op, s, "sequence");
        if (failed(sd))
          return failure();
        out.batch = *bd;
        out.seq = *sd;
        if ((out.batch == kNone) != (out.seq == kNone))
          return error(op) << "it keeps only one of the batch and sequence dimensions";
      }
      if (out.batch != kNone)
        for (Value r : op->getResults())
          dims[r] = out;
    }
    return success();
  }

  /// A position table added along the tokens' sequence: a `[seq, dim]`
  /// parameter whose rows are the positions. Looked up at `positions`.
  FailureOr<Value> positionalOperand(Operation *op, OpOperand &operand, Dims resultDims,
                                     OpBuilder &b) {
    auto type = cast<RankedTensorType>(operand.get().getType());
    int64_t rank = cast<RankedTensorType>(op->getResult(0).getType()).getRank();
    int64_t aligned = resultDims.seq - (rank - type.getRank());
    if (aligned < 0 || type.getDimSize(aligned) == 1)
      return Value(); // broadcast along the sequence: not positional
    auto arg = dyn_cast<BlockArgument>(operand.get());
    if (!arg || !func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName) ||
        type.getRank() != 2 || aligned != 0 || resultDims.batch != resultDims.seq - 1)
      return error(op) << "operand #" << operand.getOperandNumber() << " of type " << type
                       << " is indexed by the sequence position; only a [seq, dim] parameter "
                          "added to [batch, seq, dim] tokens is known (a learned position table)";
    if (type.getDimSize(0) < context)
      return error(op) << "the position table '"
                       << func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                            PtcDialect::kParamAttrName)
                              .getValue()
                       << "' has " << type.getDimSize(0) << " rows, fewer than the context of "
                       << context << " positions";
    return EmbeddingOp::create(b, op->getLoc(), arg, positions).getResult();
  }

  /// The caches' name: the attention's module as its query projection's
  /// parameter names it ("transformer.h.0.attn" of
  /// "transformer.h.0.attn.c_attn.weight"), else its location's name, else
  /// "attention.<index>".
  std::string cacheName(CausalAttentionOp op, unsigned index) {
    Value v = op.getQuery();
    for (int hops = 0; hops < 16 && v.getDefiningOp(); ++hops) {
      Operation *def = v.getDefiningOp();
      if (auto mm = dyn_cast<MatmulOp>(def)) {
        if (auto arg = dyn_cast<BlockArgument>(mm.getRhs()))
          if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                           PtcDialect::kParamAttrName)) {
            StringRef module = name.getValue().rsplit('.').first.rsplit('.').first;
            if (!module.empty() && module != name.getValue())
              return module.str();
          }
        break;
      }
      v = def->getOperand(0);
    }
    if (auto name = dyn_cast<NameLoc>(op->getLoc()))
      return name.getName().str();
    return "attention." + std::to_string(index);
  }

  LogicalResult run() {
    Block &block = func.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    BlockArgument tokensArg, documentPositions;
    for (BlockArgument arg : block.getArguments())
      if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                        PtcDialect::kInputAttrName)) {
        if (name.getValue() == "tokens")
          tokensArg = arg;
        else if (name.getValue() == "positions")
          documentPositions = arg; // packed documents: [batch, seq] like the tokens
      }
    if (!tokensArg)
      return func.emitError() << "has no 'tokens' input: ptc-derive-decode derives decoding from "
                                 "a language model over token ids";
    auto tokensType = cast<RankedTensorType>(tokensArg.getType());
    if (tokensType.getRank() != 2)
      return func.emitError() << "input 'tokens' must be [batch, seq], got " << tokensType;
    seq = tokensType.getDimSize(1);
    if (context == 0)
      context = seq;
    if (tokens < 1 || batch < 1 || context < 1)
      return func.emitError() << "tokens, batch and context must be at least 1, got tokens="
                              << tokens << " batch=" << batch << " context=" << context;
    if (tokens > context)
      return func.emitError() << tokens << " tokens do not fit a context of " << context
                              << " positions";

    SmallVector<CrossEntropyOp> losses;
    func.walk([&](CrossEntropyOp op) { losses.push_back(op); });
    if (losses.size() != 1)
      return func.emitError() << "needs exactly one ptc.cross_entropy (the next-token loss whose "
                                 "logits to return), found "
                              << losses.size();
    Value logits = losses[0].getLogits();

    // The ops the logits need, in order.
    llvm::SetVector<Operation *> needed;
    SmallVector<Value> work{logits};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      Operation *def = v.getDefiningOp();
      if (!def || !needed.insert(def))
        continue;
      for (Value o : def->getOperands())
        work.push_back(o);
    }
    SmallVector<Operation *> ops;
    for (Operation &op : block.without_terminator())
      if (needed.contains(&op))
        ops.push_back(&op);

    dims[tokensArg] = {0, 1, tokensType.getDimSize(0), seq};
    if (documentPositions)
      dims[documentPositions] = dims[tokensArg];
    if (failed(analyze(ops)))
      return failure();
    Dims logitDims = dims.lookup(logits);
    auto logitsType = cast<RankedTensorType>(logits.getType());
    if (!dims.count(logits) || logitDims.batch != 0 || logitDims.seq != 1 ||
        logitsType.getRank() != 3)
      return losses[0].emitOpError() << "logits must be [batch, seq, vocab] of the tokens to "
                                        "derive decoding, got "
                                     << logitsType;

    // The new inputs.
    MLIRContext *ctx = func.getContext();
    OpBuilder b(ctx);
    Type i32 = IntegerType::get(ctx, 32);
    auto ids = RankedTensorType::get({batch, tokens}, i32);
    tokensArg.setType(ids);
    if (documentPositions) {
      // A model of packed documents reads each token's position in its
      // document: a prompt is one document, so those are the positions in
      // the cache.
      documentPositions.setType(ids);
      positions = documentPositions;
    } else {
      unsigned posIndex = tokensArg.getArgNumber() + 1;
      if (failed(func.insertArgument(posIndex, ids,
                                     b.getDictionaryAttr({b.getNamedAttr(
                                         PtcDialect::kInputAttrName, b.getStringAttr("positions"))}),
                                     func.getLoc())))
        return failure();
      positions = block.getArgument(posIndex);
    }

    // Resize, and rewrite what reads positions.
    SmallVector<std::pair<std::string, Value>> caches; // (state name, updated cache)
    llvm::StringMap<unsigned> names;
    unsigned attentionIndex = 0;
    for (Operation *op : ops) {
      for (Value r : op->getResults()) {
        auto it = dims.find(r);
        if (it == dims.end())
          continue;
        auto type = cast<RankedTensorType>(r.getType());
        SmallVector<int64_t> shape(type.getShape());
        if (it->second.merged()) {
          shape[it->second.batch] = batch * tokens;
        } else {
          shape[it->second.batch] = batch;
          shape[it->second.seq] = tokens;
        }
        r.setType(RankedTensorType::get(shape, type.getElementType()));
      }
      b.setInsertionPoint(op);
      Dims out = dims.lookup(op->getResult(0));
      if (isa<AddOp, SubOp, MulOp, DivOp>(op) && dims.count(op->getResult(0)))
        for (OpOperand &operand : op->getOpOperands()) {
          if (dims.count(operand.get()))
            continue;
          FailureOr<Value> lookup = positionalOperand(op, operand, out, b);
          if (failed(lookup))
            return failure();
          if (*lookup) {
            // [batch, tokens, dim] now matches the other operand.
            operand.set(*lookup);
          }
        }
      if (auto rot = dyn_cast<RotaryOp>(op)) {
        Value at = RotaryAtOp::create(b, rot.getLoc(), rot.getType(), rot.getInput(), positions,
                                      rot.getThetaAttr(), b.getBoolAttr(false),
                                      rot.getSeqMajorAttr());
        rot.getResult().replaceAllUsesWith(at);
        rot->erase();
        continue;
      }
      if (auto attn = dyn_cast<CausalAttentionOp>(op)) {
        auto kv = cast<RankedTensorType>(attn.getKey().getType());
        auto cacheType = RankedTensorType::get(
            {batch, kv.getDimSize(1), context, kv.getDimSize(3)}, kv.getElementType());
        std::string base = cacheName(attn, attentionIndex++);
        if (unsigned n = names[base]++; n > 0)
          base += "." + std::to_string(n);
        Value cacheArgs[2];
        const char *parts[] = {"key_cache", "value_cache"};
        for (auto [i, part] : llvm::enumerate(parts)) {
          unsigned index = func.getNumArguments();
          std::string name = base + "." + part;
          if (failed(func.insertArgument(index, cacheType,
                                         b.getDictionaryAttr({b.getNamedAttr(
                                             PtcDialect::kStateAttrName, b.getStringAttr(name))}),
                                         attn.getLoc())))
            return failure();
          cacheArgs[i] = block.getArgument(index);
        }
        auto cached = CachedAttentionOp::create(
            b, attn.getLoc(), TypeRange{attn.getResult().getType(), cacheType, cacheType}, attn.getQuery(),
            attn.getKey(), attn.getValue(), cacheArgs[0], cacheArgs[1], positions,
            attn.getScaleAttr());
        attn.getResult().replaceAllUsesWith(cached.getResult());
        caches.push_back({base + ".key_cache", cached.getNewKeyCache()});
        caches.push_back({base + ".value_cache", cached.getNewValueCache()});
        attn->erase();
      }
    }

    // Return the logits and the updated caches; drop what only the loss needed.
    SmallVector<Value> results{logits};
    for (auto &[name, v] : caches)
      results.push_back(v);
    b.setInsertionPoint(ret);
    auto newRet = func::ReturnOp::create(b, ret.getLoc(), results);
    ret->erase();
    SmallVector<Operation *> all;
    for (Operation &op : block.without_terminator())
      all.push_back(&op);
    for (Operation *op : llvm::reverse(all))
      if (op->use_empty() && isPure(op))
        op->erase();
    for (Operation &op : block.without_terminator())
      if (op.use_empty())
        return error(&op) << "its result is unused once the loss is gone, and it is not pure";
    llvm::BitVector unused(func.getNumArguments());
    for (BlockArgument arg : block.getArguments())
      if (arg.use_empty() && func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName))
        unused.set(arg.getArgNumber());
    if (failed(func.eraseArguments(unused)))
      return failure();
    func.setFunctionType(
        FunctionType::get(ctx, block.getArgumentTypes(), newRet.getOperandTypes()));
    SmallVector<DictionaryAttr> resultAttrs;
    resultAttrs.push_back(
        b.getDictionaryAttr({b.getNamedAttr(PtcDialect::kLogitsAttrName, b.getUnitAttr())}));
    for (auto &[name, v] : caches)
      resultAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr(PtcDialect::kUpdateAttrName, b.getStringAttr(name))}));
    func.setAllResultAttrs(resultAttrs);
    return success();
  }
};

struct DeriveDecodePass : mlir::ptc::impl::DeriveDecodePassBase<DeriveDecodePass> {
  using DeriveDecodePassBase::DeriveDecodePassBase;
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    // Generation runs the model in evaluation mode: dropout is the identity.
    func.walk([](DropoutOp op) {
      op.getResult().replaceAllUsesWith(op.getInput());
      op.erase();
    });
    Deriver d(func, tokens, context, batch);
    if (failed(d.run()))
      return signalPassFailure();
    if (failed(verify(func)))
      return signalPassFailure();
  }
};
} // namespace
