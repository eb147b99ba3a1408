//===- PlanMemory.cpp - lifetimes and arena offsets of temporaries --------===//

#include "passes/memory/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <limits>
#include <map>
#include <optional>

namespace mlir::ptc {
#define GEN_PASS_DEF_PLANMEMORYPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

int64_t mlir::ptc::getTensorBytes(RankedTensorType type) {
  int64_t bytes;
  if (llvm::MulOverflow(getNumElements(type),
                        static_cast<int64_t>((type.getElementTypeBitWidth() + 7) / 8), bytes))
    return std::numeric_limits<int64_t>::max(); // saturated, as getNumElements
  return bytes;
}

bool mlir::ptc::isInPlaceUpdate(Value value) {
  for (OpOperand &use : value.getUses()) {
    auto ret = dyn_cast<func::ReturnOp>(use.getOwner());
    if (!ret)
      continue;
    auto func = ret->getParentOfType<func::FuncOp>();
    if (func.getResultAttr(use.getOperandNumber(), PtcDialect::kUpdateAttrName) ||
        func.getResultAttr(use.getOperandNumber(), PtcDialect::kWorkingCopyAttrName))
      return true;
  }
  return false;
}

int64_t mlir::ptc::collectiveBufferBytes(Operation &op) {
  auto bytes = [](Value v) { return getTensorBytes(cast<RankedTensorType>(v.getType())); };
  int64_t c = 0;
  if (isa<AllReduceOp>(op))
    for (Value v : op.getOperands())
      c += bytes(v);
  else if (isa<AllGatherOp>(op))
    c = bytes(op.getResult(0));
  else if (isa<ReduceScatterOp>(op))
    c = bytes(op.getOperand(0));
  else if (isa<AllToAllOp>(op))
    c = 2 * bytes(op.getOperand(0));
  return c;
}

/// Arena offsets are multiples of this (ptc-run's loader checks 4; the
/// kernels' vector loads like 64; runtime/plan's kBucketAlignment is this).
static constexpr int64_t kAlignment = 64;

bool mlir::ptc::isInPlaceAllReduce(AllReduceOp op) {
  auto offsetOf = [](Value v) -> int64_t {
    Operation *def = v.getDefiningOp();
    auto offsets = def ? def->getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName) : nullptr;
    unsigned n = cast<OpResult>(v).getResultNumber();
    return offsets && n < offsets.size() ? offsets[n] : -1;
  };
  if (op.getInputs().empty() || !op->hasAttr(kOffsetsAttrName) ||
      isa<BlockArgument>(op.getInputs()[0]))
    return false;
  int64_t next = offsetOf(op.getInputs()[0]);
  for (auto [in, out] : llvm::zip(op.getInputs(), op.getResults())) {
    if (isa<BlockArgument>(in) || next < 0 || offsetOf(in) != next || offsetOf(out) != next)
      return false;
    next = static_cast<int64_t>(
        llvm::alignTo(next + getTensorBytes(cast<RankedTensorType>(in.getType())), kAlignment));
  }
  return true;
}

namespace {

struct Buffer {
  Value value;
  int64_t bytes;
  int64_t start, end; // op indices, inclusive
  int64_t offset = -1;
  int rank = -1;      // pipeline rank that holds it (-1: every rank)
};

/// The pipeline rank an op runs on (-1: every rank, or no pipeline).
int pipelineRankOf(Operation *op, int ranks) {
  auto stage = op->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName);
  return ranks <= 0 || !stage || stage.getInt() < 0 ? -1 : static_cast<int>(stage.getInt() % ranks);
}

struct PlanMemoryPass : mlir::ptc::impl::PlanMemoryPassBase<PlanMemoryPass> {
  using PlanMemoryPassBase::PlanMemoryPassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    Block &block = func.getBody().front();
    llvm::DenseMap<Operation *, int64_t> index;
    int64_t n = 0;
    for (Operation &op : block)
      index[&op] = n++;

    // Pipelined steps: buffers of different pipeline ranks never conflict;
    // micro-batch accumulators and per-step receives live the whole step.
    int ranks = 0;
    if (auto pipeline = func->getAttrOfType<DictionaryAttr>(PtcDialect::kPipelineAttrName))
      ranks = static_cast<int>(cast<IntegerAttr>(pipeline.get("ranks")).getInt());
    // A segment (chunk, forward/backward/weight) of a pipelined step runs as a
    // whole, after copying in the values it reads from other segments and
    // the values it receives: those are live from the segment's first op.
    using SegmentKey = std::pair<int64_t, SegmentKind>; // (chunk, segment)
    std::map<SegmentKey, int64_t> firstOfSegment;
    auto segmentOf = [](Operation *op) -> std::optional<SegmentKey> {
      auto stage = op->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName);
      std::optional<SegmentKind> seg = getSegment(op);
      if (!stage || !seg || *seg == SegmentKind::Step || isa<SendOp>(op))
        return std::nullopt;
      return SegmentKey{stage.getInt(), *seg};
    };
    std::map<SegmentKey, int64_t> lastOfSegment;
    for (Operation &op : block)
      if (auto seg = segmentOf(&op)) {
        firstOfSegment.try_emplace(*seg, index[&op]);
        lastOfSegment[*seg] = index[&op];
      }
    // ... and what a segment hands on (to another segment or a send) is
    // copied out after its last op.
    auto liveUntil = [&](Operation *op, Value r, int64_t end) {
      auto own = segmentOf(op);
      if (!own)
        return end;
      for (Operation *user : r.getUsers())
        if (isa<SendOp>(user) || (segmentOf(user) && segmentOf(user) != own))
          return std::max(end, lastOfSegment[*own]);
      return end;
    };
    auto liveFrom = [&](Operation *op, Value r) {
      int64_t start = index[op];
      auto own = segmentOf(op);
      if (own && isa<RecvOp>(op))
        start = firstOfSegment[*own];
      for (Operation *user : r.getUsers())
        if (auto seg = segmentOf(user); seg && seg != own)
          start = std::min(start, firstOfSegment[*seg]);
      return start;
    };

    SmallVector<Buffer> buffers;
    llvm::DenseMap<Value, size_t> bufferOf;
    for (Operation &op : block) {
      if (isa<arith::ConstantOp, func::ReturnOp>(op))
        continue;
      for (Value r : op.getResults()) {
        auto type = dyn_cast<RankedTensorType>(r.getType());
        if (!type || !type.hasStaticShape()) {
          op.emitOpError() << "result of type " << r.getType()
                           << " has no static size for memory planning";
          return signalPassFailure();
        }
        // The plan format's bound on one device's tensor (the runtime's
        // loader refuses more): a product past it would also overflow the
        // byte counts below.
        if (getNumElements(type) > (int64_t{1} << 40)) {
          op.emitOpError() << "result of type " << r.getType()
                           << " has more than 2^40 elements on one device";
          return signalPassFailure();
        }
        if (isInPlaceUpdate(r) || isOnHost(r)) // host values live outside the arena
          continue;
        int64_t end = index[&op];
        for (Operation *user : r.getUsers())
          end = std::max(end, index[user]);
        end = liveUntil(&op, r, end);
        // A reshape of an arena value is a view of the same bytes: it shares
        // its operand's buffer, which then lives as long as either.
        if (auto reshape = dyn_cast<ReshapeOp>(op)) {
          auto source = bufferOf.find(reshape.getInput());
          if (source != bufferOf.end()) {
            size_t shared = source->second; // before the insertion below rehashes
            bufferOf[r] = shared;
            buffers[shared].end = std::max(buffers[shared].end, end);
            buffers[shared].start = std::min(buffers[shared].start, liveFrom(&op, r));
            continue;
          }
        }
        int64_t start = liveFrom(&op, r);
        if (isa<MicrobatchSumOp>(op)) { // accumulates over the step's actions
          start = 0;
          end = n;
        }
        if (auto recv = dyn_cast<RecvOp>(op); recv && recv.getPerStep()) {
          start = 0;
          end = n;
        }
        bufferOf[r] = buffers.size();
        buffers.push_back({r, getTensorBytes(type), start, end, -1, pipelineRankOf(&op, ranks)});
      }
    }

    // A bucket all-reduce whose operands die at it sums in place: each result
    // shares its operand's memory and the operands lie back to back in one
    // block, each at the next 64-byte boundary (as DDP's flat gradient
    // buckets), so the runtime reduces the block where it is (the few padding
    // bytes with it), without packing it into a staging buffer and back.
    // The block is live from its first operand's definition to its last
    // result's last use.
    // Grouping extends the operands' lifetimes, so it is kept only where the
    // predicted peak (arena + staging buffer) does not grow: both layouts are
    // placed and compared below.
    // The ungrouped layout is the buffers made so far, all placed, with the
    // value-to-buffer map as it is before the results are redirected.
    const size_t ungroupedCount = buffers.size();
    llvm::DenseMap<Value, size_t> ungroupedBufferOf;
    llvm::SmallPtrSet<Operation *, 4> inPlace;
    constexpr size_t kNoGroup = std::numeric_limits<size_t>::max();
    SmallVector<std::pair<size_t, int64_t>> groupOf(buffers.size(), {kNoGroup, 0});
    SmallVector<bool> placed(buffers.size(), true);
    llvm::DenseMap<size_t, size_t> sharedWith; // result's buffer -> its operand's
    for (Operation &op : block) {
      auto reduce = dyn_cast<AllReduceOp>(op);
      if (!reduce || reduce.getInputs().size() < 2)
        continue;
      const int64_t at = index[&op];
      SmallVector<size_t> members, shared;
      for (auto [in, out] : llvm::zip(reduce.getInputs(), reduce.getResults())) {
        auto input = bufferOf.find(in), result = bufferOf.find(out);
        if (input == bufferOf.end() || result == bufferOf.end())
          break;
        const Buffer &a = buffers[input->second], &r = buffers[result->second];
        if (a.end != at || a.bytes != r.bytes || a.rank != r.rank ||
            a.rank != buffers[bufferOf.lookup(reduce.getInputs()[0])].rank ||
            groupOf[input->second].first != kNoGroup)
          break;
        groupOf[input->second] = {kNoGroup - 1, 0}; // taken (an operand twice breaks)
        members.push_back(input->second);
        shared.push_back(result->second);
      }
      if (members.size() != reduce.getInputs().size()) {
        for (size_t member : members)
          groupOf[member] = {kNoGroup, 0};
        continue;
      }
      Buffer group{reduce.getInputs()[0], 0, std::numeric_limits<int64_t>::max(), 0, -1,
                   buffers[members[0]].rank};
      const size_t g = buffers.size();
      for (auto [member, result] : llvm::zip(members, shared)) {
        groupOf[member] = {g, group.bytes};
        group.bytes += llvm::alignTo(buffers[member].bytes, kAlignment);
        group.start = std::min(group.start, buffers[member].start);
        group.end = std::max(group.end, buffers[result].end);
        placed[member] = placed[result] = false;
      }
      for (auto [member, result] : llvm::zip(members, shared))
        sharedWith[result] = member;
      inPlace.insert(&op);
      buffers.push_back(group);
      groupOf.push_back({kNoGroup, 0});
      placed.push_back(true);
    }

    // The results (and any reshape views of them) name their operands' memory.
    if (!sharedWith.empty()) {
      ungroupedBufferOf = bufferOf;
      for (auto &entry : bufferOf)
        if (auto it = sharedWith.find(entry.second); it != sharedWith.end())
          entry.second = it->second;
    }

    // Largest first, each at the lowest offset free over its whole lifetime;
    // returns the arena's bytes and the bytes without reuse. Places `buffers`
    // (the grouped layout or the ungrouped copy), those marked in `placed`.
    auto place = [&](SmallVector<Buffer> &buffers, ArrayRef<bool> placed) {
      SmallVector<size_t> order;
      for (size_t i = 0; i < buffers.size(); ++i)
        if (placed[i])
          order.push_back(i);
      llvm::sort(order, [&](size_t a, size_t b) {
        return buffers[a].bytes != buffers[b].bytes ? buffers[a].bytes > buffers[b].bytes : a < b;
      });
      // Placed buffers by pipeline rank (slot 0: every rank), so that a buffer
      // meets only those that can share its memory, and by time: level k cuts
      // the step into blocks of kTimeBlock * 8^k ops and holds the buffers whose
      // lifetime spans at most 4 such blocks, listed in each block they touch.
      // A buffer then meets the placed ones near its lifetime instead of every
      // placed buffer (which was quadratic in the op count); the set it meets
      // and so every offset are the same.
      constexpr int64_t kTimeBlock = 32, kLevelRatio = 8;
      int64_t lastTime = 0;
      for (const Buffer &buf : buffers)
        lastTime = std::max(lastTime, buf.end);
      SmallVector<int64_t> blockSize{kTimeBlock};
      while (blockSize.back() * 4 <= lastTime + 1)
        blockSize.push_back(blockSize.back() * kLevelRatio);
      auto levelOf = [&](const Buffer &b) {
        size_t k = 0;
        while (k + 1 < blockSize.size() && b.end - b.start + 1 > 4 * blockSize[k])
          ++k;
        return k;
    };
    size_t slots = static_cast<size_t>(std::max(ranks, 0)) + 1;
    auto slotOf = [](const Buffer &b) { return static_cast<size_t>(b.rank + 1); };
    // placedIn[slot][level][block]: the placed buffers there. Per slot and
    // level, a segment tree over the blocks keeps, for every node, the merged
    // union of the offset ranges of the buffers in its blocks: the blocks that
    // lie inside a buffer's lifetime hold only buffers that overlap it, and
    // since memory is reused over time the union over many blocks stays a few
    // ranges, which stand for all of them (merging overlapping ranges does not
    // change the lowest free offset). Only the blocks at the two ends of a
    // lifetime are searched buffer by buffer.
    using Ranges = SmallVector<std::pair<int64_t, int64_t>, 2>; // sorted, disjoint
    struct Level {
      std::vector<SmallVector<size_t, 4>> buffers; // per block
      size_t leaves = 1;
      std::vector<Ranges> tree; // node 1 is the root; leaf b is node leaves + b
    };
    std::vector<std::vector<Level>> placedIn(slots);
    for (auto &levels : placedIn)
      for (int64_t size : blockSize) {
        Level level;
        size_t blocks = static_cast<size_t>(lastTime / size + 1);
        level.buffers.resize(blocks);
        while (level.leaves < blocks)
          level.leaves *= 2;
        level.tree.resize(2 * level.leaves);
        levels.push_back(std::move(level));
      }
    auto addToRanges = [](Ranges &ranges, int64_t lo, int64_t hi) {
      auto it = llvm::lower_bound(ranges, std::make_pair(lo, lo));
      if (it != ranges.begin() && std::prev(it)->second >= lo)
        --it;
      auto first = it;
      while (it != ranges.end() && it->first <= hi) {
        lo = std::min(lo, it->first);
        hi = std::max(hi, it->second);
        ++it;
      }
      it = ranges.erase(first, it);
      ranges.insert(it, {lo, hi});
    };
    // Buffers live over the whole step (micro-batch accumulators, per-step
    // receives) overlap every other: per slot, the union of their offset
    // ranges, kept merged (a few ranges, since they pack), stands for all of
    // them. Merging overlapping ranges does not change the lowest free offset.
    std::vector<std::map<int64_t, int64_t>> wholeStep(slots);
    auto addRange = [](std::map<int64_t, int64_t> &ranges, int64_t lo, int64_t hi) {
      auto it = ranges.upper_bound(lo);
      if (it != ranges.begin() && std::prev(it)->second >= lo) {
        --it;
        lo = it->first;
        hi = std::max(hi, it->second);
        it = ranges.erase(it);
      }
      while (it != ranges.end() && it->first <= hi) {
        hi = std::max(hi, it->second);
        it = ranges.erase(it);
      }
      ranges.emplace(lo, hi);
    };
    std::vector<size_t> seenAt(buffers.size(), 0);
    size_t query = 0;
    int64_t arena = 0, unshared = 0;
    for (size_t i : order) {
      Buffer &buf = buffers[i];
      int64_t size = llvm::alignTo(buf.bytes, kAlignment);
      unshared += size;
      SmallVector<std::pair<int64_t, int64_t>> busy;
      ++query;
      for (size_t slot = 0; slot < slots; ++slot) {
        if (buf.rank >= 0 && slot != 0 && slot != slotOf(buf))
          continue; // another pipeline rank's memory
        for (auto [lo, hi] : wholeStep[slot])
          busy.push_back({lo, hi});
        for (auto [k, level] : llvm::enumerate(placedIn[slot])) {
          int64_t bs = blockSize[k];
          int64_t first = buf.start / bs, last = buf.end / bs;
          // Blocks [innerFrom, innerTo] lie inside the lifetime.
          int64_t innerFrom = first * bs >= buf.start ? first : first + 1;
          int64_t innerTo = (last + 1) * bs - 1 <= buf.end ? last : last - 1;
          for (size_t lo = static_cast<size_t>(innerFrom) + level.leaves,
                      hi = static_cast<size_t>(innerTo) + level.leaves + 1;
               innerFrom <= innerTo && lo < hi; lo /= 2, hi /= 2) {
            if (lo & 1)
              busy.append(level.tree[lo].begin(), level.tree[lo].end()), ++lo;
            if (hi & 1)
              --hi, busy.append(level.tree[hi].begin(), level.tree[hi].end());
          }
          for (int64_t t : {first, last}) {
            if (t >= innerFrom && t <= innerTo)
              continue;
            for (size_t j : level.buffers[static_cast<size_t>(t)]) {
              if (seenAt[j] == query)
                continue;
              seenAt[j] = query;
              const Buffer &other = buffers[j];
              if (other.start <= buf.end && buf.start <= other.end)
                busy.push_back(
                    {other.offset, other.offset + llvm::alignTo(other.bytes, kAlignment)});
            }
            if (first == last)
              break;
          }
        }
      }
      llvm::sort(busy);
      int64_t offset = 0;
      for (auto [lo, hi] : busy) {
        if (offset + size <= lo)
          break;
        offset = std::max(offset, hi);
      }
      buf.offset = offset;
      arena = std::max(arena, offset + size);
      if (buf.start == 0 && buf.end >= lastTime) {
        addRange(wholeStep[slotOf(buf)], offset, offset + size);
        continue;
      }
      size_t k = levelOf(buf);
      Level &level = placedIn[slotOf(buf)][k];
      for (int64_t t = buf.start / blockSize[k]; t <= buf.end / blockSize[k]; ++t) {
        level.buffers[static_cast<size_t>(t)].push_back(i);
        for (size_t node = static_cast<size_t>(t) + level.leaves; node >= 1; node /= 2)
          addToRanges(level.tree[node], offset, offset + size);
      }
    }
      return std::make_pair(arena, unshared);
    };
    // The staging buffer ptc-run allocates: the largest collective that is
    // not an in-place bucket.
    auto staging = [&](const llvm::SmallPtrSetImpl<Operation *> &skip) {
      int64_t bytes = 0;
      for (Operation &op : block)
        if (!skip.contains(&op))
          bytes = std::max(bytes, collectiveBufferBytes(op));
      return bytes;
    };
    auto [arena, unshared] = place(buffers, placed);
    if (!inPlace.empty()) {
      // (place() sets the offset of every buffer it places: the copied
      // offsets of the first placement are not read.)
      SmallVector<Buffer> alone(buffers.begin(), buffers.begin() + ungroupedCount);
      SmallVector<bool> all(alone.size(), true);
      auto [arenaAlone, unsharedAlone] = place(alone, all);
      const llvm::SmallPtrSet<Operation *, 1> none;
      if (arenaAlone + staging(none) < arena + staging(inPlace)) {
        buffers = std::move(alone);
        bufferOf = ungroupedBufferOf;
        groupOf.assign(buffers.size(), {kNoGroup, 0});
        arena = arenaAlone;
        unshared = unsharedAlone;
      }
    }

    for (size_t i = 0; i < buffers.size(); ++i)
      if (groupOf[i].first != kNoGroup)
        buffers[i].offset = buffers[groupOf[i].first].offset + groupOf[i].second;

    Builder b(&getContext());
    for (Operation &op : block) {
      if (isa<arith::ConstantOp, func::ReturnOp>(op))
        continue;
      SmallVector<int64_t> offsets;
      for (Value r : op.getResults()) {
        auto it = bufferOf.find(r);
        offsets.push_back(it == bufferOf.end() ? -1 : buffers[it->second].offset);
      }
      op.setAttr(kOffsetsAttrName, b.getDenseI64ArrayAttr(offsets));
    }
    func->setAttr(kArenaBytesAttrName, b.getI64IntegerAttr(arena));
    if (ranks > 0) {
      SmallVector<int64_t> perRank(static_cast<size_t>(ranks), 0);
      for (const Buffer &buf : buffers)
        for (int r = 0; r < ranks && buf.offset >= 0; ++r)
          if (buf.rank < 0 || buf.rank == r)
            perRank[static_cast<size_t>(r)] = std::max(
                perRank[static_cast<size_t>(r)], buf.offset + static_cast<int64_t>(llvm::alignTo(buf.bytes, kAlignment)));
      func->setAttr(kArenaBytesPerRankAttrName, b.getDenseI64ArrayAttr(perRank));
    }
    func->setAttr(kArenaBytesUnsharedAttrName, b.getI64IntegerAttr(unshared));
    if (report) {
      llvm::outs() << "ptc-plan-memory @" << func.getSymName() << ": " << buffers.size()
                   << " buffers, arena " << arena << " bytes (" << unshared
                   << " without reuse)\n";
      llvm::outs().flush();
    }
  }
};
} // namespace
