// Pipeline segments of a rank and the simulation of its activation stash.
#include "runtime/plan/pipeline_segments.h"

#include <algorithm>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

namespace {
bool isPerStepRecv(const LoadedPlan &plan, int32_t tensor) {
  for (const plan::Channel *ch : *plan.plan().pipeline()->channels())
    if (ch->recv_tensor() == tensor)
      return ch->per_step();
  return false;
}
} // namespace

StatusOr<PipelineSegments> derivePipelineSegments(const LoadedPlan &plan, int ppRank) {
  PipelineSegments out;
  const schedule::Pipeline &p = plan.pipeline();
  const auto &insts = *plan.plan().instructions();
  const auto &tensors = plan.tensors();
  auto mine = [&](const plan::Instruction *inst) {
    return inst->chunk() < 0 || p.rankOf(inst->chunk()) == ppRank;
  };
  // Where each temporary is produced: (chunk, segment), or a receive.
  std::map<int32_t, std::pair<int, int>> producedIn;
  std::set<int32_t> received, perStep;
  for (uint32_t n = 0; n < insts.size(); ++n) {
    const plan::Instruction *inst = insts.Get(n);
    if (!mine(inst))
      continue;
    int seg = static_cast<int>(inst->segment());
    if (inst->op() == OpCode::MicrobatchSum)
      out.accumulators.push_back((outputsOf(*inst))[0]);
    if (inst->segment() == plan::Segment::Step) {
      if (inst->op() == OpCode::Recv)
        perStep.insert((outputsOf(*inst))[0]);
      if (inst->op() != OpCode::Send && inst->op() != OpCode::Recv) // those are actions
        out.stepInstructions.push_back(n);
      continue;
    }
    for (int32_t id : outputsOf(*inst)) {
      if (inst->op() == OpCode::Recv) {
        (isPerStepRecv(plan, id) ? perStep : received).insert(id);
        continue;
      }
      if (inst->op() != OpCode::MicrobatchSum)
        producedIn[id] = {inst->chunk(), seg};
    }
    if (inst->op() == OpCode::Send || inst->op() == OpCode::Recv)
      continue;
    PipelineSegments::Segment &sp = out.segments[{inst->chunk(), seg}];
    sp.instructions.push_back(n);
  }
  // Imports and exports of each segment.
  std::map<int32_t, std::set<std::pair<int, int>>> readers;
  std::map<int32_t, int> sends;
  for (uint32_t n = 0; n < insts.size(); ++n) {
    const plan::Instruction *inst = insts.Get(n);
    if (!mine(inst))
      continue;
    for (int32_t id : inputsOf(*inst)) {
      const TensorInfo &t = tensors[static_cast<size_t>(id)];
      bool perMb = t.kind == TensorKind::Temporary && !perStep.count(id) &&
                   (producedIn.count(id) || received.count(id));
      if (inst->segment() == plan::Segment::Step) {
        if (perMb)
          return invalidArgument("instruction #", n, " (", opcodeName(inst->op()),
                                 ") runs once per step but reads the per-micro-batch tensor #", id,
                                 " without a micro-batch sum");
        continue;
      }
      std::pair<int, int> seg{inst->chunk(), static_cast<int>(inst->segment())};
      if (t.kind == TensorKind::Input)
        out.segments[seg].readsInputs = true;
      if (!perMb)
        continue;
      if (inst->op() == OpCode::Send) {
        ++sends[id];
        continue;
      }
      if (received.count(id) || producedIn[id] != seg)
        readers[id].insert(seg);
    }
  }
  for (auto &[id, segs] : readers)
    for (const auto &seg : segs)
      out.segments[seg].imports.push_back(id);
  for (auto &[id, seg] : producedIn) {
    int consumers = static_cast<int>(readers[id].size()) + sends[id];
    if (consumers > 0)
      out.segments[seg].exports.push_back({id, consumers});
  }
  for (int32_t id : received)
    out.recvConsumers[id] = static_cast<int>(readers[id].size());
  out.readers = readers;
  out.sends = sends;
  // The next compute action after each action: a value its consumer reads
  // right away stays in the arena (no stash copies).
  const auto &actions = p.actions[static_cast<size_t>(ppRank)];
  out.nextCompute.assign(actions.size(), -1);
  for (int i = static_cast<int>(actions.size()) - 2; i >= 0; --i)
    out.nextCompute[static_cast<size_t>(i)] = actions[static_cast<size_t>(i) + 1].isCompute()
                                               ? i + 1
                                               : out.nextCompute[static_cast<size_t>(i) + 1];
  return out;
}

bool PipelineSegments::passesDirectly(const schedule::Pipeline &p, int ppRank, size_t index,
                                      int32_t tensor, int consumers) const {
  // A value whose only consumer is the next compute action (same micro-batch)
  // stays where it is: between the two only transfers run, which do not
  // touch the arena's per-micro-batch values.
  const auto &actions = p.actions[static_cast<size_t>(ppRank)];
  int next = nextCompute[index];
  if (next < 0 || actions[static_cast<size_t>(next)].mb != actions[index].mb)
    return false;
  std::pair<int, int> nextSegment{actions[static_cast<size_t>(next)].chunk,
                                  static_cast<int>(actions[static_cast<size_t>(next)].kind)};
  auto r = readers.find(tensor);
  auto s = sends.find(tensor);
  return consumers == 1 && (s == sends.end() || s->second == 0) && r != readers.end() &&
         r->second.size() == 1 && *r->second.begin() == nextSegment;
}

int64_t simulateStashPeak(const LoadedPlan &plan, const PipelineSegments &segments, int ppRank) {
  const schedule::Pipeline &p = plan.pipeline();
  const auto &actions = p.actions[static_cast<size_t>(ppRank)];
  std::map<std::pair<int32_t, int>, int> waiting; // (tensor, mb) -> consumers left
  std::set<std::pair<int32_t, int>> direct;
  int64_t bytes = 0, peak = 0;
  auto put = [&](int32_t tensor, int mb, int consumers) {
    waiting[{tensor, mb}] = consumers;
    bytes += plan.tensor(tensor).bytes;
    peak = std::max(peak, bytes);
  };
  auto take = [&](int32_t tensor, int mb) {
    auto it = waiting.find({tensor, mb});
    if (it != waiting.end() && --it->second == 0) {
      bytes -= plan.tensor(tensor).bytes;
      waiting.erase(it);
    }
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const schedule::Action &a = actions[i];
    if (a.kind == schedule::ActionKind::Send || a.kind == schedule::ActionKind::Recv) {
      if (a.mb < 0)
        continue; // per-step transfers use the tensor's own place
      const plan::Channel *ch =
          plan.plan().pipeline()->channels()->Get(static_cast<flatbuffers::uoffset_t>(a.channel));
      if (a.kind == schedule::ActionKind::Send) {
        take(ch->send_tensor(), a.mb);
      } else {
        auto c = segments.recvConsumers.find(ch->recv_tensor());
        put(ch->recv_tensor(), a.mb, c == segments.recvConsumers.end() ? 0 : c->second);
      }
      continue;
    }
    auto it = segments.segments.find({a.chunk, static_cast<int>(a.kind)});
    if (it == segments.segments.end())
      continue;
    for (int32_t id : it->second.imports)
      if (!direct.erase({id, a.mb}))
        take(id, a.mb);
    for (auto [id, consumers] : it->second.exports) {
      if (segments.passesDirectly(p, ppRank, i, id, consumers))
        direct.insert({id, a.mb});
      else
        put(id, a.mb, consumers);
    }
  }
  return peak;
}

} // namespace ptc
