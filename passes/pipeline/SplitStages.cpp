//===- SplitStages.cpp - cut a training step into pipeline chunks ---------===//

#include "passes/pipeline/Passes.h"

#include "dialects/ptc/PtcMesh.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <map>
#include <tuple>

namespace mlir::ptc {
#define GEN_PASS_DEF_SPLITSTAGESPASS
#include "passes/pipeline/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// ZeRO-3 gathers a parameter for each use (ptc.gather_use), so that in one
/// pass over the batch each copy lives only until its use and the backward
/// pass gathers again. In a step split into micro-batches (and stages) the
/// gathers depend on no micro-batch: they run once per step and live through
/// it, where per-use copies would only add up. One copy per parameter then
/// serves every use, as FSDP's reshard_after_forward=False does.
void mergePerUseGathers(func::FuncOp func) {
  std::map<std::tuple<void *, const void *, const void *>, Operation *> first;
  SmallVector<Operation *> merged;
  func.walk([&](AllGatherOp op) {
    if (!op->hasAttr(PtcDialect::kGatherUseAttrName))
      return;
    op->removeAttr(PtcDialect::kGatherUseAttrName);
    auto key = std::make_tuple(op->getOperand(0).getAsOpaquePointer(),
                               op->getAttrDictionary().getAsOpaquePointer(),
                               op->getResult(0).getType().getAsOpaquePointer());
    auto [it, inserted] = first.try_emplace(key, op.getOperation());
    if (inserted || it->second->getBlock() != op->getBlock())
      return;
    op->getResult(0).replaceAllUsesWith(it->second->getResult(0));
    merged.push_back(op);
  });
  for (Operation *op : merged)
    op->erase();
}

// Segments as ordered ints (a value's first consumer is the least of its
// users' segments).
constexpr int kForward = static_cast<int>(SegmentKind::Forward);
constexpr int kBackward = static_cast<int>(SegmentKind::Backward);
constexpr int kWeight = static_cast<int>(SegmentKind::Weight);
constexpr int kStep = static_cast<int>(SegmentKind::Step);
const char *segName(int s) { return ::ptc::schedule::segmentText(static_cast<SegmentKind>(s)); }

int64_t numel(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? getNumElements(t) : 0;
}

/// Relative cost of an op: its FLOPs where it says (CostOpInterface: matmuls,
/// attention), the elements it produces otherwise.
double costOf(Operation *op) {
  if (auto cost = dyn_cast<CostOpInterface>(op))
    return cost.getFlops();
  double elements = 0;
  for (Value v : op->getResults())
    elements += static_cast<double>(numel(v));
  return elements;
}

/// Splits one micro-batched training step into pipeline chunks, in phases
/// that each read what the earlier ones found (the members below).
struct Splitter {
  Splitter(func::FuncOp func, int ranks, int chunks, bool splitWeight, bool report)
      : func(func), block(func.getBody().front()), ranks(ranks), chunks(chunks),
        splitWeight(splitWeight), report(report), b(func.getContext()) {}
  func::FuncOp func;
  Block &block;
  int ranks, chunks;
  bool splitWeight;
  bool report;
  OpBuilder b;

  /// The ops (constants aside) in order, and their positions; collected
  /// again after a rewrite.
  SmallVector<Operation *> ops;
  llvm::DenseMap<Operation *, size_t> index;
  /// Ops that depend on the inputs (up to the micro-batch sums), those and
  /// what feeds them (run once per micro-batch), and the values of the former.
  llvm::DenseSet<Operation *> dependent, perMb;
  llvm::DenseSet<Value> inputDependent;
  /// The per-micro-batch ops of the backward pass.
  llvm::DenseSet<Operation *> backward;
  /// The forward pass's ops in order, and their positions.
  SmallVector<Operation *> fwd;
  llvm::DenseMap<Operation *, size_t> fwdIndex;
  /// Each op's chunk and segment; each parameter's and state's chunk.
  llvm::DenseMap<Operation *, int> chunk, seg;
  llvm::DenseMap<Value, int> home; // parameter / state arguments

  LogicalResult run();

private:
  void collectOps() {
    ops.clear();
    index.clear();
    for (Operation &op : block.without_terminator())
      if (!isa<arith::ConstantOp>(op)) {
        index[&op] = ops.size();
        ops.push_back(&op);
      }
  }
  Operation *producer(Value v) const {
    Operation *def = v.getDefiningOp();
    return def && index.count(def) ? def : nullptr;
  }
  /// 1. Per-micro-batch ops; parameter-only work both sides read is copied
  /// for the step.
  LogicalResult findPerMicrobatchOps();
  /// 2. The backward pass among them.
  void findBackwardOps();
  /// 3. The forward pass cut into chunks (marked boundaries, or where one
  /// activation crosses, balancing cost); refuses chunks left without work.
  LogicalResult cutForward();
  /// 4. The chunks of the other per-micro-batch ops.
  void placeOtherPerMicrobatchOps();
  /// Parameters and state with their first per-micro-batch user.
  void placeParameters();
  /// 4b. Gradients summed from two chunks: summed per chunk, added per step.
  void sumSharedGradientsPerStep();
  /// 5. Once-per-step ops with their operands (buckets, clipping and the
  /// non-finite check split per pipeline rank).
  LogicalResult placeStepOps();
  /// 6. Segments (forward, backward, weight gradient, step).
  void assignSegments();
  /// 7. Send / receive channels between chunks, and the attributes that
  /// record the split.
  void connectChunks();
};

LogicalResult Splitter::run() {
  collectOps();
  if (failed(findPerMicrobatchOps()))
    return failure();
  findBackwardOps();
  if (failed(cutForward()))
    return failure();
  placeOtherPerMicrobatchOps();
  placeParameters();
  sumSharedGradientsPerStep();
  if (failed(placeStepOps()))
    return failure();
  assignSegments();
  connectChunks();
  return success();
}

LogicalResult Splitter::findPerMicrobatchOps() {
  // 1. Per-micro-batch ops: those depending on the inputs (up to the
  //    micro-batch sums) and those feeding them.
  for (BlockArgument arg : block.getArguments())
    if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName))
      inputDependent.insert(arg);
  for (Operation *op : ops) {
    if (!llvm::any_of(op->getOperands(), [&](Value v) { return inputDependent.contains(v); }))
      continue;
    dependent.insert(op);
    if (!isa<MicrobatchSumOp>(op))
      for (Value r : op->getResults())
        inputDependent.insert(r);
  }
  perMb = dependent;
  for (Operation *op : llvm::reverse(ops))
    if (perMb.contains(op))
      for (Value v : op->getOperands())
        if (Operation *def = producer(v))
          perMb.insert(def);
  for (Operation *op : ops)
    if (perMb.contains(op))
      for (Value v : op->getOperands())
        if (Operation *def = producer(v); def && !perMb.contains(def))
          return op->emitOpError() << "runs once per micro-batch but reads a value computed after "
                                      "the micro-batches";
  // Work that depends only on parameters or state (the dynamic loss scale)
  // and that both the micro-batches and the once-per-step ops read: the step
  // gets its own copy.
  {
    OpBuilder cb(func.getContext());
    bool cloned = false;
    for (Operation *op : ops) {
      if (!perMb.contains(op) || dependent.contains(op))
        continue;
      SmallVector<OpOperand *> stepUses;
      for (Value r : op->getResults())
        for (OpOperand &use : r.getUses())
          if (!perMb.contains(use.getOwner()) && !isa<func::ReturnOp>(use.getOwner()))
            stepUses.push_back(&use);
      if (stepUses.empty())
        continue;
      Operation *first = stepUses.front()->getOwner();
      for (OpOperand *use : stepUses)
        if (index.count(use->getOwner()) && index[use->getOwner()] < index[first])
          first = use->getOwner();
      cb.setInsertionPoint(first);
      Operation *copy = cb.clone(*op);
      for (OpOperand *use : stepUses)
        use->set(copy->getResult(cast<OpResult>(use->get()).getResultNumber()));
      cloned = true;
    }
    if (cloned)
      collectOps();
  }
  return success();
}

void Splitter::findBackwardOps() {
  // 2. Forward / backward: backward ops are those autodiff marked and what
  //    depends on them.
  for (Operation *op : ops) {
    if (!perMb.contains(op))
      continue;
    bool b = op->hasAttr(PtcDialect::kBackwardAttrName) || llvm::any_of(op->getOperands(), [&](Value v) {
               Operation *def = producer(v);
               return def && backward.contains(def);
             });
    if (b)
      backward.insert(op);
  }
}

LogicalResult Splitter::cutForward() {
  // 3. Cut the forward ops where one activation crosses, balancing cost.
  for (Operation *op : ops)
    if (perMb.contains(op) && !backward.contains(op))
      fwd.push_back(op);
  for (auto [i, op] : llvm::enumerate(fwd))
    fwdIndex[op] = i;
  size_t n = fwd.size();
  // Where values cross: a layer boundary is where the fewest activations do.
  // Small values that run alongside the activations (an MoE layer's
  // auxiliary loss, summed after the last layer) cross many boundaries and do
  // not mark one: only values of at least 1/64 of the largest crossing
  // value's elements count. The small ones are sent with the activation.
  auto lastUse = [&](size_t i, Value r) {
    size_t last = i;
    for (Operation *user : r.getUsers())
      if (auto it = fwdIndex.find(user); it != fwdIndex.end())
        last = std::max(last, it->second);
    return last;
  };
  auto elementsOf = [](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t ? std::max<int64_t>(getNumElements(t), 1) : 1;
  };
  int64_t largest = 0;
  for (auto [i, op] : llvm::enumerate(fwd))
    if (dependent.contains(op))
      for (Value r : op->getResults())
        if (lastUse(i, r) > i)
          largest = std::max(largest, elementsOf(r));
  SmallVector<int> crossing(n + 1, 0);
  for (auto [i, op] : llvm::enumerate(fwd)) {
    if (!dependent.contains(op))
      continue; // parameter-only work moves to its users' chunk
    for (Value r : op->getResults()) {
      if (elementsOf(r) * 64 < largest)
        continue;
      size_t last = lastUse(i, r);
      for (size_t k = i + 1; k <= last; ++k)
        ++crossing[k];
    }
  }
  SmallVector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costOf(fwd[i]);
  // User-marked boundaries (`ptc.stage_boundary` on a forward op: a new chunk
  // starts there) win over the cost model.
  SmallVector<size_t> marked;
  for (size_t k = 0; k < n; ++k)
    if (fwd[k]->hasAttr(PtcDialect::kStageBoundaryAttrName))
      marked.push_back(k);
  if (!marked.empty()) {
    if (static_cast<int>(marked.size()) != chunks - 1 || marked.front() == 0)
      return fwd[marked.front()]->emitOpError()
             << "is one of " << marked.size() << " ops marked 'ptc.stage_boundary', but "
             << chunks << " pipeline chunks need " << chunks - 1
             << " boundaries, none at the first forward op";
    for (size_t i = 0; i < n; ++i)
      chunk[fwd[i]] = static_cast<int>(llvm::count_if(marked, [&](size_t c) { return c <= i; }));
  }
  SmallVector<size_t> candidates;
  int best = INT_MAX;
  for (size_t k = 1; k < n; ++k)
    if (dependent.contains(fwd[k]) && crossing[k] > 0)
      best = std::min(best, crossing[k]);
  for (size_t k = 1; k < n; ++k)
    if (dependent.contains(fwd[k]) && crossing[k] == best)
      candidates.push_back(k);
  if (!marked.empty()) {
    // chunks assigned above
  } else if (static_cast<int>(candidates.size()) < chunks - 1)
    return func.emitError() << "cannot cut the forward pass into " << chunks
                            << " pipeline chunks: it has only " << candidates.size()
                            << " places where a single activation crosses (between layers); use "
                               "fewer stages or virtual stages";
  SmallVector<size_t> cuts;
  size_t from = 0;
  for (int j = 1; j < chunks && marked.empty(); ++j) {
    double target = prefix[n] * j / chunks;
    size_t lastAllowed = candidates.size() - static_cast<size_t>(chunks - j);
    size_t pick = from;
    for (size_t c = from; c <= lastAllowed; ++c)
      if (std::abs(prefix[candidates[c]] - target) < std::abs(prefix[candidates[pick]] - target))
        pick = c;
    cuts.push_back(candidates[pick]);
    from = pick + 1;
  }
  if (marked.empty())
    for (size_t i = 0; i < n; ++i)
      chunk[fwd[i]] = static_cast<int>(llvm::count_if(cuts, [&](size_t c) { return c <= i; }));
  // A forward op after a cut that reads only earlier chunks' values and feeds
  // no forward op (an MoE layer's metric, scaled for the micro-batches after
  // the last layer) stays with what it reads, so that the once-per-step work
  // reading it (that layer's expert-bias update) is on the same rank.
  for (Operation *op : fwd) {
    if (!dependent.contains(op) ||
        llvm::any_of(op->getUsers(), [&](Operation *u) { return fwdIndex.count(u) != 0; }))
      continue;
    int c = -1;
    for (Value v : op->getOperands())
      if (Operation *d = producer(v); d && dependent.contains(d) && chunk.count(d))
        c = std::max(c, chunk[d]);
    if (c >= 0 && c < chunk[op])
      chunk[op] = c;
  }

  // Per chunk: share of the forward cost, and where it starts.
  SmallVector<double> cost(static_cast<size_t>(chunks), 0.0);
  SmallVector<Operation *> firstOp(static_cast<size_t>(chunks), nullptr);
  for (size_t i = 0; i < n; ++i) {
    size_t c = static_cast<size_t>(chunk[fwd[i]]);
    cost[c] += costOf(fwd[i]);
    if (!firstOp[c])
      firstOp[c] = fwd[i];
  }
  auto shareText = [](double share) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", 100.0 * share);
    return std::string(text);
  };
  // More chunks than the model can fill: a chunk left (nearly) without work
  // makes its rank idle while the schedule counts it busy. The cuts are the
  // compiler's choice here (not marked), so the layout asked for cannot take
  // effect as meant.
  if (marked.empty() && prefix[n] > 0)
    for (int c = 0; c < chunks; ++c)
      if (cost[static_cast<size_t>(c)] < 0.005 * prefix[n]) {
        InFlightDiagnostic d = func.emitError()
                               << "pipeline chunk " << c << " of " << chunks << " (rank " << c % ranks
                               << ") would hold "
                               << shareText(cost[static_cast<size_t>(c)] / prefix[n])
                               << " of the forward cost: " << ranks << " pipeline ranks";
        if (chunks != ranks)
          d << " x " << chunks / ranks << " virtual stages";
        d << " are more chunks than this model's layers can fill; use fewer pipeline ranks or "
             "virtual stages (or mark the stage boundaries)";
        return d;
      }

  if (report) {
    auto &os = llvm::outs();
    os << "ptc-split-stages @" << func.getSymName() << ": " << chunks << " chunks on " << ranks
       << " pipeline ranks, " << (marked.empty() ? "cut where one activation crosses"
                                                 : "cut at the marked boundaries")
       << "\n";
    for (int c = 0; c < chunks; ++c) {
      os << llvm::format("  chunk %d (rank %d): %5.1f%% of the forward cost, from ", c,
                         c % ranks, 100.0 * cost[static_cast<size_t>(c)] / std::max(prefix[n], 1.0));
      if (Operation *op = firstOp[static_cast<size_t>(c)])
        os << op->getName() << " at " << op->getLoc();
      os << "\n";
    }
    os.flush();
  }
  return success();
}

void Splitter::placeOtherPerMicrobatchOps() {
  // 4. Chunks of the other per-micro-batch ops: backward ops join the lowest
  //    chunk among the activations and gradients they read; ops that read only
  //    parameters (and the forward parameter-only ops) join their first user.
  auto chunkOfValue = [&](Value v) -> int {
    Operation *def = producer(v);
    if (!def || !inputDependent.contains(v) || !chunk.count(def))
      return -1;
    return chunk[def];
  };
  llvm::DenseMap<int64_t, Operation *> forwardById;
  for (Operation *op : fwd)
    if (auto id = op->getAttrOfType<IntegerAttr>(PtcDialect::kForwardIdAttrName))
      forwardById[id.getInt()] = op;
  for (Operation *op : ops) {
    if (!backward.contains(op))
      continue;
    if (auto id = op->getAttrOfType<IntegerAttr>(PtcDialect::kVjpOfAttrName))
      if (Operation *f = forwardById.lookup(id.getInt()); f && dependent.contains(f)) {
        chunk[op] = chunk[f];
        continue;
      }
    int c = INT_MAX;
    for (Value v : op->getOperands())
      if (int k = chunkOfValue(v); k >= 0)
        c = std::min(c, k);
    if (isa<MicrobatchSumOp>(op)) // with its operand, whatever it is
      if (Operation *def = producer(op->getOperand(0)); def && chunk.count(def))
        c = chunk[def];
    if (c != INT_MAX)
      chunk[op] = c;
  }
  for (Operation *op : llvm::reverse(ops)) {
    if (!perMb.contains(op) || (chunk.count(op) && dependent.contains(op)))
      continue;
    int c = INT_MAX;
    for (Value r : op->getResults())
      for (Operation *user : r.getUsers())
        if (auto it = chunk.find(user); it != chunk.end() && perMb.contains(user))
          c = std::min(c, it->second);
    chunk[op] = c == INT_MAX ? (chunk.count(op) ? chunk[op] : 0) : c;
  }
  for (Operation *op : ops)
    if (perMb.contains(op) && dependent.contains(op) && !chunk.count(op))
      chunk[op] = 0;
  // A backward op computed from constants alone (the loss seed scaled for the
  // micro-batches) that several chunks read: each chunk gets its own copy. A
  // shared one would live in the lowest chunk, whose backward runs last, and
  // a later chunk's backward (an MoE auxiliary loss's gradient beside the
  // cross-entropy's) would wait for it forever.
  {
    OpBuilder cb(func.getContext());
    bool cloned = false;
    for (Operation *op : ops) {
      if (!perMb.contains(op) || dependent.contains(op) || !backward.contains(op) ||
          op->getNumRegions() != 0 ||
          !llvm::all_of(op->getOperands(), [](Value v) {
            return v.getDefiningOp<arith::ConstantOp>() != nullptr;
          }))
        continue;
      llvm::DenseMap<int, Operation *> copies{{chunk[op], op}};
      for (Value r : op->getResults())
        for (OpOperand &use : llvm::make_early_inc_range(r.getUses())) {
          auto it = chunk.find(use.getOwner());
          if (it == chunk.end() || !perMb.contains(use.getOwner()) || it->second == chunk[op])
            continue;
          Operation *&copy = copies[it->second];
          if (!copy) {
            cb.setInsertionPoint(op);
            copy = cb.clone(*op);
            chunk[copy] = it->second;
            perMb.insert(copy);
            backward.insert(copy);
            cloned = true;
          }
          use.set(copy->getResult(cast<OpResult>(r).getResultNumber()));
        }
    }
    if (cloned)
      collectOps();
  }
}

void Splitter::placeParameters() {
  // Parameters and state live with their first per-micro-batch user.
  for (BlockArgument arg : block.getArguments()) {
    int c = INT_MAX;
    for (Operation *user : arg.getUsers())
      if (perMb.contains(user))
        c = std::min(c, chunk[user]);
    if (c != INT_MAX)
      home[arg] = c;
  }
  // Optimizer state with its parameter (an update of primitive ops, Muon's,
  // reads a state argument with no other value of the rank beside it).
  {
    llvm::StringMap<BlockArgument> params;
    for (BlockArgument arg : block.getArguments())
      if (auto n = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kParamAttrName))
        params[n.getValue()] = arg;
    for (BlockArgument arg : block.getArguments()) {
      auto of = func.getArgAttrOfType<DictionaryAttr>(arg.getArgNumber(), PtcDialect::kStateOfAttrName);
      auto name = of ? of.getAs<StringAttr>("param") : StringAttr();
      if (!name || home.count(arg))
        continue;
      if (auto it = home.find(params.lookup(name.getValue())); it != home.end())
        home[arg] = it->second;
    }
  }
}

void Splitter::sumSharedGradientsPerStep() {
  // 4b. A gradient that adds contributions of two chunks (the tied embedding's)
  //     is summed over the micro-batches on each chunk first and added once
  //     per step: one transfer per step instead of one per micro-batch.
  SmallVector<MicrobatchSumOp> sums;
  for (Operation *op : ops)
    if (auto ms = dyn_cast<MicrobatchSumOp>(op))
      sums.push_back(ms);
  for (MicrobatchSumOp ms : sums) {
    auto add = ms.getInput().getDefiningOp<AddOp>();
    if (!add || !add->hasOneUse() || !chunk.count(add))
      continue;
    Operation *l = add.getLhs().getDefiningOp(), *r = add.getRhs().getDefiningOp();
    if (!l || !r || !chunk.count(l) || !chunk.count(r) || chunk[l] == chunk[r])
      continue;
    b.setInsertionPoint(ms);
    auto sumL = MicrobatchSumOp::create(b, ms.getLoc(), add.getLhs());
    auto sumR = MicrobatchSumOp::create(b, ms.getLoc(), add.getRhs());
    auto total = AddOp::create(b, add.getLoc(), sumL.getResult(), sumR.getResult());
    for (Operation *o : {sumL.getOperation(), sumR.getOperation()}) {
      perMb.insert(o);
      backward.insert(o);
    }
    chunk[sumL] = chunk[l];
    chunk[sumR] = chunk[r];
    chunk[total] = chunk[add];
    ms.getResult().replaceAllUsesWith(total.getResult());
    for (Operation *dead : {ms.getOperation(), add.getOperation()}) {
      perMb.erase(dead);
      dependent.erase(dead);
      backward.erase(dead);
      chunk.erase(dead);
      index.erase(dead);
    }
    ms.erase();
    add.erase();
  }
  collectOps();
}

LogicalResult Splitter::placeStepOps() {
  // 5. Once-per-step ops: with their operands; all-reduce buckets and norm
  //    clipping split per pipeline rank.
  auto rankOfChunk = [&](int c) { return c < 0 ? -1 : c % ranks; };
  auto stepChunk = [&](Value v) -> int {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      auto it = home.find(arg);
      return it == home.end() ? -1 : it->second;
    }
    Operation *def = v.getDefiningOp(); // also the per-rank ops made below
    return def && chunk.count(def) ? chunk[def] : -1;
  };
  SmallVector<Operation *> erase;
  // The non-finite gradient check (ptc.any_nonfinite) split
  // per pipeline rank: its flag, the same on every rank (a maximum over pp),
  // as each rank computes it; an op that reads it takes its own rank's.
  llvm::DenseMap<Value, std::map<int, Value>> flagOfRank;
  // A check's axes (dp, tp: what the gradients it reads are split over) and pp.
  auto withPipeline = [&](std::optional<ArrayAttr> axes) {
    SmallVector<StringRef> names;
    if (axes)
      for (Attribute a : *axes)
        names.push_back(cast<StringAttr>(a).getValue());
    names.push_back(meshAxisName(MeshAxisRole::Pipeline));
    return b.getStrArrayAttr(names);
  };
  for (Operation *op : ops) {
    if (perMb.contains(op))
      continue;
    if (isa<AllReduceOp, ClipGradNormOp, AnyNonfiniteOp>(op)) {
      // Group operands by the pipeline rank that holds them.
      std::map<int, SmallVector<unsigned>> byRank;
      for (auto [i, v] : llvm::enumerate(op->getOperands()))
        byRank[rankOfChunk(stepChunk(v))].push_back(static_cast<unsigned>(i));
      if (byRank.size() > 1 && byRank.count(-1))
        return op->emitOpError() << "mixes values of no pipeline stage with staged ones";
      // The checks reduce over pp: every pipeline rank takes part, one whose
      // stages hold none of their gradients (all of its layers' parameters on
      // other ranks: a stage of the LM head alone) with an empty part.
      if (ranks > 1 && isa<ClipGradNormOp, AnyNonfiniteOp>(op) && !byRank.count(-1))
        for (int r = 0; r < ranks; ++r)
          byRank[r];
      if (byRank.size() == 1) {
        chunk[op] = stepChunk(op->getOperand(byRank.begin()->second.front()));
        if (auto clip = dyn_cast<ClipGradNormOp>(op); clip && ranks > 1)
          clip.setAxesAttr(withPipeline(clip.getAxes()));
        if (auto any = dyn_cast<AnyNonfiniteOp>(op); any && ranks > 1) {
          any.setAxesAttr(withPipeline(any.getAxes()));
          flagOfRank[any.getFlag()][byRank.begin()->first] = any.getFlag();
        }
        continue;
      }
      b.setInsertionPoint(op);
      bool first = true;
      for (auto &[rank, idx] : byRank) {
        SmallVector<Value> operands;
        int c = idx.empty() ? rank : INT_MAX; // an empty part: the rank's first chunk
        for (unsigned i : idx) {
          operands.push_back(op->getOperand(i));
          c = std::min(c, stepChunk(op->getOperand(i)));
        }
        Operation *part;
        if (auto ar = dyn_cast<AllReduceOp>(op)) {
          part = AllReduceOp::create(b, op->getLoc(), ValueRange(operands), ar.getAxes());
        } else if (auto any = dyn_cast<AnyNonfiniteOp>(op)) {
          part = AnyNonfiniteOp::create(b, op->getLoc(), any.getFlag().getType(), operands,
                                        withPipeline(any.getAxes()));
          flagOfRank[any.getFlag()][rank] = part->getResult(0);
        } else {
          auto clip = cast<ClipGradNormOp>(op);
          SmallVector<Type> types;
          for (Value v : operands)
            types.push_back(v.getType());
          types.push_back(clip.getNorm().getType());
          // The stage's gradients keep their weights (each lives on one pipeline rank).
          DenseF64ArrayAttr weights;
          if (std::optional<ArrayRef<double>> all = clip.getWeights()) {
            SmallVector<double> mine;
            for (unsigned i : idx)
              mine.push_back((*all)[i]);
            weights = b.getDenseF64ArrayAttr(mine);
          }
          part = ClipGradNormOp::create(b, op->getLoc(), types, operands, clip.getMaxNormAttr(),
                                        withPipeline(clip.getAxes()), weights);
          if (first) // every rank computes the same norm; keep rank 0's
            clip.getNorm().replaceAllUsesWith(part->getResults().back());
        }
        if (!isa<AnyNonfiniteOp>(op)) // result i is operand i's
          for (auto [k, i] : llvm::enumerate(idx))
            op->getResult(i).replaceAllUsesWith(part->getResult(static_cast<unsigned>(k)));
        for (NamedAttribute a : op->getDiscardableAttrs())
          part->setAttr(a.getName(), a.getValue());
        chunk[part] = c;
        seg[part] = kStep;
        first = false;
      }
      erase.push_back(op);
      continue;
    }
    if (chunk.count(op))
      continue; // placed above (a per-step sum of two chunks' gradients)
    int c = -1;
    std::optional<int> rank;
    for (Value v : op->getOperands()) {
      if (flagOfRank.count(v))
        continue; // the reader's own rank's copy, below
      int k = stepChunk(v);
      if (k < 0)
        continue;
      if (rank && *rank != rankOfChunk(k)) {
        if (isa<UnscaleGradsOp>(op))
          return op->emitOpError() << "dynamic loss scaling is not supported with pipeline "
                                      "stages yet (use a static loss-scale)";
        return op->emitOpError() << "runs once per step but reads values of pipeline ranks "
                                 << *rank << " and " << rankOfChunk(k);
      }
      rank = rankOfChunk(k);
      c = c < 0 ? k : std::min(c, k);
    }
    for (OpOperand &use : op->getOpOperands()) {
      auto it = flagOfRank.find(use.get());
      if (it == flagOfRank.end())
        continue;
      auto own = it->second.find(rank.value_or(-1));
      if (own == it->second.end())
        return op->emitOpError() << "reads the non-finite gradient flag but holds no value of "
                                    "a pipeline rank that computes it";
      use.set(own->second);
    }
    chunk[op] = c;
  }
  // What still reads a split flag (the step's `ptc.skipped` result) reads
  // rank 0's, as the clipped norm (outputs are read on pipeline rank 0).
  for (auto &[flag, copies] : flagOfRank)
    if (flag != copies.begin()->second)
      flag.replaceAllUsesWith(copies.begin()->second);
  for (Operation *op : erase) {
    chunk.erase(op);
    op->erase();
  }
  return success();
}

void Splitter::assignSegments() {
  // 6. Segments (weight-gradient split: backward ops the chunk's outgoing
  //    gradients do not need).
  for (Operation &o : block.without_terminator()) {
    Operation *op = &o;
    if (isa<arith::ConstantOp>(op) || seg.count(op))
      continue;
    seg[op] = !perMb.contains(op) ? kStep : backward.contains(op) ? kBackward : kForward;
  }
  if (splitWeight) {
    llvm::DenseSet<Operation *> needed;
    for (Operation *op : llvm::reverse(ops)) {
      if (!backward.contains(op))
        continue;
      bool need = needed.contains(op);
      for (Value r : op->getResults())
        for (Operation *user : r.getUsers())
          if (perMb.contains(user) && chunk.lookup(user) != chunk[op])
            need = true;
      if (!need) {
        seg[op] = kWeight;
        continue;
      }
      needed.insert(op);
      for (Value v : op->getOperands())
        if (Operation *def = producer(v); def && backward.contains(def) && chunk[def] == chunk[op])
          needed.insert(def);
    }
  }
}

void Splitter::connectChunks() {
  // 7. Channels: a per-micro-batch value used by another chunk, and a
  //    parameter used away from its home chunk (sent once per step).
  int64_t channel = 0;
  auto mark = [&](Operation *op, int c, int s) {
    op->setAttr(PtcDialect::kStageAttrName, b.getI64IntegerAttr(c));
    op->setAttr(PtcDialect::kSegmentAttrName, b.getStringAttr(segName(s)));
  };
  auto connect = [&](Value v, int fromChunk, int fromSeg, bool perStep, Operation *after) {
    std::map<int, SmallVector<OpOperand *>> usesByChunk;
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (!perMb.contains(user) || isa<SendOp>(user))
        continue;
      if (chunk[user] != fromChunk)
        usesByChunk[chunk[user]].push_back(&use);
    }
    for (auto &[to, uses] : usesByChunk) {
      Operation *firstUser = uses.front()->getOwner();
      int toSeg = kWeight;
      for (OpOperand *use : uses) {
        if (index.count(use->getOwner()) &&
            index[use->getOwner()] < index[firstUser])
          firstUser = use->getOwner();
        toSeg = std::min(toSeg, seg[use->getOwner()]);
      }
      if (perStep)
        b.setInsertionPointToStart(&block);
      else
        b.setInsertionPointAfter(after);
      auto send = SendOp::create(b, v.getLoc(), v, channel, to, perStep);
      mark(send, fromChunk, fromSeg);
      if (perStep)
        b.setInsertionPointAfter(send);
      else
        b.setInsertionPoint(firstUser);
      auto recv = RecvOp::create(b, v.getLoc(), v.getType(), channel, fromChunk, perStep);
      mark(recv, to, perStep ? kForward : toSeg);
      for (OpOperand *use : uses)
        use->set(recv.getResult());
      ++channel;
    }
  };
  // Parameters are sent once per step. An input that several chunks read
  // (packed documents' positions: every attention reads them) is not sent:
  // each pipeline rank that reads it loads its micro-batches from the data.
  for (BlockArgument arg : block.getArguments())
    if (auto it = home.find(arg);
        it != home.end() && !func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName))
      connect(arg, it->second, kForward, /*perStep=*/true, nullptr);
  for (Operation *op : ops) {
    if (!perMb.contains(op) || !chunk.count(op))
      continue;
    for (Value r : op->getResults())
      connect(r, chunk[op], seg[op], /*perStep=*/false, op);
  }
  // Once-per-step values of another pipeline rank: sent after the
  // micro-batches.
  for (Operation *op : ops) {
    if (perMb.contains(op) || !chunk.count(op) || chunk[op] < 0)
      continue;
    for (OpOperand &use : op->getOpOperands()) {
      Operation *def = use.get().getDefiningOp();
      if (!def || !chunk.count(def) || chunk[def] < 0 ||
          chunk[def] % ranks == chunk[op] % ranks)
        continue;
      b.setInsertionPointAfter(def);
      auto send = SendOp::create(b, def->getLoc(), use.get(), channel, chunk[op], true, true);
      mark(send, chunk[def], kStep);
      b.setInsertionPoint(op);
      auto recv = RecvOp::create(b, def->getLoc(), use.get().getType(), channel, chunk[def], true,
                                 true);
      mark(recv, chunk[op], kStep);
      use.set(recv.getResult());
      ++channel;
    }
  }
  for (auto [op, c] : chunk)
    mark(op, c, seg[op]);
  func.walk([](Operation *op) {
    op->removeAttr(PtcDialect::kForwardIdAttrName);
    op->removeAttr(PtcDialect::kVjpOfAttrName);
  });
  // One update of the argument attributes (per argument would be quadratic).
  SmallVector<DictionaryAttr> argAttrs;
  func.getAllArgAttrs(argAttrs);
  for (auto [arg, c] : home) {
    unsigned i = cast<BlockArgument>(arg).getArgNumber();
    NamedAttrList attrs(argAttrs[i]);
    attrs.set(PtcDialect::kStageAttrName, b.getI64IntegerAttr(c));
    argAttrs[i] = attrs.getDictionary(func.getContext());
  }
  func.setAllArgAttrs(argAttrs);

  func->setAttr(PtcDialect::kPipelineAttrName,
                b.getDictionaryAttr({b.getNamedAttr("ranks", b.getI64IntegerAttr(ranks)),
                                     b.getNamedAttr("chunks", b.getI64IntegerAttr(chunks)),
                                     b.getNamedAttr("split_weight", b.getBoolAttr(splitWeight))}));
}

struct SplitStagesPass : mlir::ptc::impl::SplitStagesPassBase<SplitStagesPass> {
  using SplitStagesPassBase::SplitStagesPassBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::optional<MeshInfo> mesh;
    int pp = 1;
    if (module->hasAttr(PtcDialect::kMeshAttrName)) {
      FailureOr<MeshInfo> m = getEnclosingMesh(module);
      if (failed(m))
        return signalPassFailure();
      mesh = *m;
      if (int a = mesh->axisIndex(MeshAxisRole::Pipeline); a >= 0)
        pp = static_cast<int>(mesh->sizes[a]);
    }
    int ranks = stages > 0 ? static_cast<int>(stages) : pp;
    if (ranks != pp && ranks > 1) {
      module.emitError() << "stages = " << ranks << " needs a mesh axis 'pp' of that size (mesh "
                         << (mesh ? "has pp = " + std::to_string(pp) : std::string("is absent"))
                         << ")";
      return signalPassFailure();
    }
    if (virtualStages < 1 || (virtualStages > 1 && ranks < 2)) {
      module.emitError() << "virtual-stages = " << static_cast<int>(virtualStages)
                         << (virtualStages < 1 ? " must be >= 1" : " needs at least 2 pipeline ranks");
      return signalPassFailure();
    }
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      if (!func->hasAttr(PtcDialect::kMicrobatchesAttrName)) {
        func.emitError() << "has no micro-batches; run ptc-microbatch before ptc-autodiff";
        return signalPassFailure();
      }
      mergePerUseGathers(func);
      Splitter s(func, ranks, ranks * static_cast<int>(virtualStages), splitWeight, report);
      if (failed(s.run()))
        return signalPassFailure();
    }
  }
};
} // namespace
