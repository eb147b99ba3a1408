#include "runtime/plan/arena_liveness.h"

#include "runtime/plan/plan_loader.h"
#include "runtime/plan/plan_ops.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <string>
#include <utility>
#include <vector>

namespace ptc {
namespace {

using plan::OpCode;
using plan::TensorKind;

/// A range of arena bytes and the instructions over which it is live
/// (inclusive; the instruction count stands for the end of the step).
struct Occupant {
  int64_t lo = 0, hi = 0; // bytes [lo, hi)
  int64_t start = 0, end = 0;
  int rank = -1;          // pipeline rank (-1: every rank)
  int32_t tensor = -1;    // the tensor it stands for
  int64_t bucket = -1;    // or the padding of the in-place bucket at this instruction
};

/// Disjoint sets of tensors that share bytes by design (reshape views,
/// in-place bucket results).
struct Sets {
  std::vector<int32_t> parent;
  explicit Sets(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int32_t find(int32_t x) {
    while (parent[static_cast<size_t>(x)] != x)
      x = parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  }
  void unite(int32_t a, int32_t b) { parent[static_cast<size_t>(find(a))] = find(b); }
};

} // namespace

Status verifyArenaLiveness(const LoadedPlan &loaded) {
  const auto &insts = *loaded.plan().instructions();
  const std::vector<TensorInfo> &tensors = loaded.tensors();
  const auto n = static_cast<int64_t>(insts.size()); // "the end of the step"
  auto inArena = [&](int32_t id) {
    const TensorInfo &t = tensors[static_cast<size_t>(id)];
    return t.kind == TensorKind::Temporary && !t.host && t.arenaOffset >= 0;
  };
  auto inst = [&](int64_t i) { return insts.Get(static_cast<flatbuffers::uoffset_t>(i)); };

  // Segments of a pipelined plan: (chunk, segment) of each instruction that
  // runs inside one (-1: none), and each segment's first and last instruction.
  std::vector<int> segmentOf(insts.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> segmentSpan;
  if (loaded.pipelined()) {
    std::map<std::pair<int32_t, int>, int> ids;
    for (int64_t i = 0; i < n; ++i) {
      const plan::Instruction &in = *inst(i);
      if (in.segment() == plan::Segment::Step || in.op() == OpCode::Send)
        continue;
      auto [it, added] =
          ids.try_emplace({in.chunk(), static_cast<int>(in.segment())}, static_cast<int>(segmentSpan.size()));
      if (added)
        segmentSpan.push_back({i, i});
      segmentSpan[static_cast<size_t>(it->second)].second = i;
      segmentOf[static_cast<size_t>(i)] = it->second;
    }
  }

  // Each temporary's writer and lifetime.
  constexpr int64_t kNone = -1;
  std::vector<int64_t> def(tensors.size(), kNone), start(tensors.size(), 0), end(tensors.size(), 0);
  std::vector<int> rank(tensors.size(), -1);
  for (int64_t i = 0; i < n; ++i)
    for (int32_t id : outputsOf(*inst(i))) {
      auto t = static_cast<size_t>(id);
      if (!inArena(id) || def[t] != kNone)
        continue;
      const plan::Instruction &in = *inst(i);
      def[t] = start[t] = end[t] = i;
      rank[t] = loaded.pipelineRankOf(in);
      int seg = segmentOf[static_cast<size_t>(i)];
      // (verifyPipeline checked each Recv's channel.)
      bool perStepRecv = in.op() == OpCode::Recv &&
                         loaded.pipeline()
                             .channels[static_cast<size_t>(
                                 plan::attrOf(in, kernels::attr::Channel::channel))]
                             .perStep;
      if (in.op() == OpCode::MicrobatchSum || perStepRecv) { // the whole step
        start[t] = 0;
        end[t] = n;
      } else if (in.op() == OpCode::Recv && seg >= 0) { // received before the segment runs
        start[t] = segmentSpan[static_cast<size_t>(seg)].first;
      }
    }
  for (int64_t i = 0; i < n; ++i) {
    const plan::Instruction &in = *inst(i);
    int seg = segmentOf[static_cast<size_t>(i)];
    auto touch = [&](int32_t id) {
      auto t = static_cast<size_t>(id);
      if (def[t] == kNone)
        return;
      end[t] = std::max(end[t], i);
      int own = segmentOf[static_cast<size_t>(def[t])];
      // Handed on from its segment: copied out after the segment's last op.
      if (own >= 0 && (in.op() == OpCode::Send || (seg >= 0 && seg != own)))
        end[t] = std::max(end[t], segmentSpan[static_cast<size_t>(own)].second);
      // Read in another segment: copied in before that segment's first op.
      if (seg >= 0 && seg != own)
        start[t] = std::min(start[t], segmentSpan[static_cast<size_t>(seg)].first);
    };
    for (int32_t id : inputsOf(in))
      touch(id);
    for (int32_t id : outputsOf(in))
      touch(id);
  }
  if (loaded.plan().outputs())
    for (const plan::Output *out : *loaded.plan().outputs())
      if (def[static_cast<size_t>(out->tensor())] != kNone)
        end[static_cast<size_t>(out->tensor())] = n;

  // Tensors that share bytes by design become one occupant; the padding of
  // an in-place bucket is an occupant at its all-reduce.
  Sets sets(tensors.size());
  std::vector<Occupant> occupants;
  for (int64_t i = 0; i < n; ++i) {
    const plan::Instruction &in = *inst(i);
    const auto &ins = inputsOf(in);
    const auto &outs = outputsOf(in);
    if (in.op() == OpCode::Reshape && ins.size() == 1 && outs.size() == 1 && inArena(ins[0]) &&
        inArena(outs[0]) && loaded.tensor(ins[0]).arenaOffset == loaded.tensor(outs[0]).arenaOffset)
      sets.unite(outs[0], ins[0]);
    if (!allReduceInPlace(loaded, in))
      continue;
    for (flatbuffers::uoffset_t k = 0; k < ins.size(); ++k) {
      sets.unite(outs[k], ins[k]);
      const TensorInfo &a = loaded.tensor(ins[k]);
      int64_t padEnd = k + 1 < ins.size() ? loaded.tensor(ins[k + 1]).arenaOffset : a.arenaOffset + a.bytes;
      if (a.arenaOffset + a.bytes < padEnd)
        occupants.push_back({a.arenaOffset + a.bytes, padEnd, i, i, loaded.pipelineRankOf(in), -1, i});
    }
  }
  std::vector<int64_t> occupantOf(tensors.size(), kNone);
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (def[t] == kNone)
      continue;
    auto root = static_cast<size_t>(sets.find(static_cast<int32_t>(t)));
    const TensorInfo &info = tensors[t];
    if (occupantOf[root] == kNone) {
      occupantOf[root] = static_cast<int64_t>(occupants.size());
      occupants.push_back({info.arenaOffset, info.arenaOffset + info.bytes, start[t], end[t],
                           rank[t], static_cast<int32_t>(t), -1});
      continue;
    }
    Occupant &o = occupants[static_cast<size_t>(occupantOf[root])];
    o.hi = std::max(o.hi, info.arenaOffset + info.bytes);
    o.start = std::min(o.start, start[t]);
    o.end = std::max(o.end, end[t]);
    if (o.rank != rank[t])
      o.rank = -1;
  }

  auto describe = [&](const Occupant &o) {
    std::string what =
        o.tensor >= 0
            ? "tensor #" + std::to_string(o.tensor) + " ('" + loaded.tensor(o.tensor).name + "')"
            : "the padding of the in-place bucket of instruction #" + std::to_string(o.bucket);
    return what + " at arena bytes [" + std::to_string(o.lo) + ", " + std::to_string(o.hi) +
           "), live from instruction #" + std::to_string(o.start) + " to " +
           (o.end >= n ? std::string("the end of the step") : "#" + std::to_string(o.end));
  };

  // Sweep over time: the occupants live at once, per pipeline rank (slot 0:
  // every rank), are disjoint, so each newcomer meets at most its neighbours.
  const int ranks = loaded.pipelined() ? std::max(loaded.pipeline().ranks, 1) : 1;
  std::vector<std::map<int64_t, size_t>> live(static_cast<size_t>(ranks) + 1);
  std::vector<size_t> order(occupants.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return occupants[a].start != occupants[b].start ? occupants[a].start < occupants[b].start : a < b;
  });
  auto laterEnd = [&](size_t a, size_t b) { return occupants[a].end > occupants[b].end; };
  std::priority_queue<size_t, std::vector<size_t>, decltype(laterEnd)> ending(laterEnd);
  auto slotOf = [](const Occupant &o) { return static_cast<size_t>(o.rank + 1); };
  for (size_t x : order) {
    const Occupant &o = occupants[x];
    while (!ending.empty() && occupants[ending.top()].end < o.start) {
      const Occupant &gone = occupants[ending.top()];
      live[slotOf(gone)].erase(gone.lo);
      ending.pop();
    }
    for (size_t slot = 0; slot < live.size(); ++slot) {
      if (o.rank >= 0 && slot != 0 && slot != slotOf(o))
        continue; // another pipeline rank's memory
      // The live occupant at or after o.lo, and the one before it.
      const auto &m = live[slot];
      auto next = m.lower_bound(o.lo);
      for (auto it : {next, next == m.begin() ? m.end() : std::prev(next)}) {
        if (it == m.end())
          continue;
        const Occupant &other = occupants[it->second];
        if (other.lo < o.hi && o.lo < other.hi) {
          int64_t at = std::min(std::max(o.start, other.start), n - 1);
          return invalidArgument("the memory plan overlaps live temporaries: ", describe(o),
                                 " shares bytes with ", describe(other), "; both are live at ",
                                 describeInstruction(*inst(at), static_cast<size_t>(at)));
        }
      }
    }
    live[slotOf(o)].emplace(o.lo, x);
    ending.push(x);
  }
  return Status::ok();
}

} // namespace ptc
