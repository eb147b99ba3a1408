// Executor: pipelined plans. This rank runs its schedule's actions in order:
// a compute action runs one segment (forward / backward / weight gradients)
// of one chunk for one micro-batch; SEND / RECV move a channel's value for one
// micro-batch. Values that cross segments wait in the activation stash, keyed
// by (tensor, micro-batch): a producing segment copies them out, a consuming
// one copies them back into their arena place; the entry goes when its last
// consumer has it. Micro-batch sums accumulate in place. After the actions,
// the once-per-step instructions (gradient reduction, optimizer) run.

#include "runtime/exec/executor.h"

#include <chrono>
#include <cstring>
#include <set>

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

Status Executor::preparePipeline() {
  const schedule::Pipeline &p = plan_->pipeline();
  const auto &insts = *plan_->plan().instructions();
  const auto &tensors = plan_->tensors();
  auto mine = [&](const plan::Instruction *inst) {
    return inst->chunk() < 0 || p.rankOf(inst->chunk()) == ppRank_;
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
      accumulators_.push_back((outputsOf(*inst))[0]);
    if (inst->segment() == plan::Segment::Step) {
      if (inst->op() == OpCode::Recv)
        perStep.insert((outputsOf(*inst))[0]);
      if (inst->op() != OpCode::Send && inst->op() != OpCode::Recv) // those are actions
        stepInstructions_.push_back(n);
      continue;
    }
    for (int32_t id : outputsOf(*inst)) {
      if (inst->op() == OpCode::Recv) {
        (isPerStepRecv(*plan_, id) ? perStep : received).insert(id);
        continue;
      }
      if (inst->op() != OpCode::MicrobatchSum)
        producedIn[id] = {inst->chunk(), seg};
    }
    if (inst->op() == OpCode::Send || inst->op() == OpCode::Recv)
      continue;
    SegmentPlan &sp = segments_[{inst->chunk(), seg}];
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
        segments_[seg].readsInputs = true;
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
      segments_[seg].imports.push_back(id);
  for (auto &[id, seg] : producedIn) {
    int consumers = static_cast<int>(readers[id].size()) + sends[id];
    if (consumers > 0)
      segments_[seg].exports.push_back({id, consumers});
  }
  for (int32_t id : received)
    recvConsumers_[id] = static_cast<int>(readers[id].size());
  readers_ = readers;
  sendsOf_ = sends;
  // The next compute action after each action: a value its consumer reads
  // right away stays in the arena (no stash copies).
  const auto &actions = p.actions[static_cast<size_t>(ppRank_)];
  nextCompute_.assign(actions.size(), -1);
  for (int i = static_cast<int>(actions.size()) - 2; i >= 0; --i)
    nextCompute_[static_cast<size_t>(i)] = actions[static_cast<size_t>(i) + 1].isCompute()
                                               ? i + 1
                                               : nextCompute_[static_cast<size_t>(i) + 1];
  // Outputs produced on another pipeline rank come to rank 0 after each step.
  if (plan_->plan().outputs())
    for (const plan::Output *o : *plan_->plan().outputs())
      for (const plan::Instruction *inst : insts)
        for (int32_t id : outputsOf(*inst))
          if (id == o->tensor() && inst->chunk() >= 0 && p.rankOf(inst->chunk()) != 0)
            remoteOutputs_.push_back({id, p.rankOf(inst->chunk())});
  return Status::ok();
}

Status Executor::stash(int32_t tensor, int mb, const void *data, int consumers) {
  int64_t bytes = plan_->tensor(tensor).bytes;
  PTC_RETURN_IF_ERROR(awaitTensor(tensor)); // e.g. a tensor-parallel all-reduce's result
  Stashed &s = stash_[{tensor, mb}];
  if (s.bytes != 0)
    return error(StatusCode::kInternal, "tensor #", tensor, " of micro-batch ", mb,
                 " is stashed twice");
  PTC_RETURN_IF_ERROR(takeStashBuffer(s.buffer, bytes));
  PTC_RETURN_IF_ERROR(dev_->copy(s.buffer.data(), data, bytes, CopyKind::DeviceToDevice));
  s.bytes = bytes;
  s.consumers = consumers;
  stashBytes_ += bytes;
  stashPeak_ = std::max(stashPeak_, stashBytes_);
  return Status::ok();
}

Status Executor::unstash(int32_t tensor, int mb, void *out) {
  auto it = stash_.find({tensor, mb});
  if (it == stash_.end())
    return error(StatusCode::kInternal, "tensor #", tensor, " of micro-batch ", mb,
                 " is needed but was not produced or received");
  if (out)
    PTC_RETURN_IF_ERROR(
        dev_->copy(out, it->second.buffer.data(), it->second.bytes, CopyKind::DeviceToDevice));
  if (--it->second.consumers == 0) {
    stashBytes_ -= it->second.bytes;
    stashPool_.push_back(std::move(it->second.buffer));
    stash_.erase(it);
  }
  return Status::ok();
}

Status Executor::takeStashBuffer(DeviceBuffer &buffer, int64_t bytes) {
  // Reuse the smallest free buffer that fits: no allocation (and on a GPU no
  // cudaMalloc / cudaFree, which would synchronize the device) per micro-batch.
  auto best = stashPool_.end();
  for (auto it = stashPool_.begin(); it != stashPool_.end(); ++it)
    if (it->capacity() >= bytes && (best == stashPool_.end() || it->capacity() < best->capacity()))
      best = it;
  if (best != stashPool_.end()) {
    buffer = std::move(*best);
    stashPool_.erase(best);
    return Status::ok();
  }
  buffer = DeviceBuffer(dev_.get());
  return buffer.reserve(bytes);
}

Status Executor::loadMicrobatch(int mb) {
  // Micro-batch `mb` of data-parallel rank r is rows [r*B/dp + mb*b, ... + b)
  // of the whole batch (b = B / (dp * M)); DESIGN's batch order per rank.
  for (auto &[id, whole] : batches_) {
    const TensorInfo &t = plan_->tensor(id);
    int64_t rows = t.globalShape[0], rowBytes = dtypeSize(t.dtype);
    for (size_t d = 1; d < t.globalShape.size(); ++d)
      rowBytes *= t.globalShape[d];
    int parts = (!t.dimAxes.empty() && t.dimAxes[0] >= 0)
                    ? plan_->meshSizes()[static_cast<size_t>(t.dimAxes[0])]
                    : 1;
    int64_t b = rows / parts, perRank = b * plan_->microbatches();
    std::vector<uint8_t> part(static_cast<size_t>(rows * rowBytes));
    for (int r = 0; r < parts; ++r)
      std::memcpy(part.data() + r * b * rowBytes, whole.data() + (r * perRank + mb * b) * rowBytes,
                  static_cast<size_t>(b * rowBytes));
    PTC_RETURN_IF_ERROR(loadFromWhole(id, part.data()));
  }
  return Status::ok();
}

// Pipeline point-to-point goes through host memory unless the communicator
// moves device memory for it: sends must complete without waiting for the
// peer (MPI_Isend copies), which the schedules' deadlock check assumes. NCCL
// sends block until matched, so two stages that each send before receiving
// (1F1B's steady state) would wait on each other; NCCL therefore leaves p2p to
// its host (MPI) communicator.
StatusOr<void *> Executor::p2pView(const void *p, int64_t bytes, int slot, bool load) {
  if (dev_->hostAddressable())
    return const_cast<void *>(p);
  PTC_RETURN_IF_ERROR(hostSync());
  return hostStage(p, bytes, slot, load);
}

Status Executor::sendBytes(const void *p, int64_t bytes, int peer, int tag,
                           const std::string &what) {
  auto view = p2pView(p, bytes, 0, true);
  if (!view.isOk())
    return view.status();
  return comm_->send(*view, bytes, plan_->pipelineAxis(), peer, tag, what);
}

Status Executor::recvBytes(void *p, int64_t bytes, int peer, int tag, const std::string &what) {
  auto view = p2pView(p, bytes, 1, false);
  if (!view.isOk())
    return view.status();
  PTC_RETURN_IF_ERROR(comm_->recv(*view, bytes, plan_->pipelineAxis(), peer, tag, what));
  return commWriteBack(p, *view, bytes);
}

Status Executor::runAction(size_t index, std::vector<double> *profile) {
  const schedule::Pipeline &p = plan_->pipeline();
  const auto &actions = p.actions[static_cast<size_t>(ppRank_)];
  const schedule::Action &a = actions[index];
  if (a.kind == schedule::ActionKind::Send || a.kind == schedule::ActionKind::Recv) {
    const plan::Channel *ch = plan_->plan().pipeline()->channels()->Get(static_cast<flatbuffers::uoffset_t>(a.channel));
    bool isSend = a.kind == schedule::ActionKind::Send;
    int32_t tensor = isSend ? ch->send_tensor() : ch->recv_tensor();
    int64_t bytes = plan_->tensor(tensor).bytes;
    int peer = p.rankOf(isSend ? ch->to_chunk() : ch->from_chunk());
    std::string what = "channel " + std::to_string(a.channel) + " (chunk " +
                       std::to_string(ch->from_chunk()) + " -> " + std::to_string(ch->to_chunk()) +
                       (a.mb >= 0 ? ", micro-batch " + std::to_string(a.mb) : ", per step") + ")";
    int axis = plan_->pipelineAxis();
    if (isSend) {
      if (a.mb < 0) {
        if (comm_ && axis >= 0)
          return sendBytes(data(tensor), bytes, peer, a.channel, what);
        return Status::ok();
      }
      auto it = stash_.find({tensor, a.mb});
      if (it == stash_.end())
        return error(StatusCode::kInternal, "nothing to send on ", what);
      if (comm_ && axis >= 0)
        PTC_RETURN_IF_ERROR(sendBytes(it->second.buffer.data(), bytes, peer, a.channel, what));
      return unstash(tensor, a.mb, nullptr);
    }
    if (!comm_ || axis < 0)
      return error(StatusCode::kInternal, "a pipelined plan needs a communicator to receive ", what);
    if (a.mb < 0)
      return recvBytes(data(tensor), bytes, peer, a.channel, what);
    // Received straight into a stash entry.
    Stashed &s = stash_[{tensor, a.mb}];
    if (s.bytes != 0)
      return error(StatusCode::kInternal, what, " is received twice");
    PTC_RETURN_IF_ERROR(takeStashBuffer(s.buffer, bytes));
    PTC_RETURN_IF_ERROR(recvBytes(s.buffer.data(), bytes, peer, a.channel, what));
    s.bytes = bytes;
    s.consumers = recvConsumers_[tensor];
    stashBytes_ += bytes;
    stashPeak_ = std::max(stashPeak_, stashBytes_);
    return Status::ok();
  }
  auto it = segments_.find({a.chunk, static_cast<int>(a.kind)});
  if (it == segments_.end())
    return Status::ok(); // an empty segment (e.g. no input gradient on the first chunk)
  SegmentPlan &sp = it->second;
  if (sp.readsInputs)
    PTC_RETURN_IF_ERROR(loadMicrobatch(a.mb));
  for (int32_t id : sp.imports)
    if (!direct_.erase({id, a.mb}))
      PTC_RETURN_IF_ERROR(unstash(id, a.mb, data(id)));
  for (uint32_t n : sp.instructions)
    PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  // A value whose only consumer is the next compute action (same micro-batch)
  // stays where it is: between the two only transfers run, which do not
  // touch the arena's per-micro-batch values.
  int next = nextCompute_[index];
  std::pair<int, int> nextSegment{-2, -2};
  if (next >= 0 && actions[static_cast<size_t>(next)].mb == a.mb)
    nextSegment = {actions[static_cast<size_t>(next)].chunk,
                   static_cast<int>(actions[static_cast<size_t>(next)].kind)};
  for (auto [id, consumers] : sp.exports) {
    const auto &readers = readers_[id];
    if (consumers == 1 && sendsOf_[id] == 0 && readers.size() == 1 &&
        *readers.begin() == nextSegment)
      direct_.insert({id, a.mb});
    else
      PTC_RETURN_IF_ERROR(stash(id, a.mb, data(id), consumers));
  }
  return Status::ok();
}

Status Executor::runPipelined(std::vector<double> *profile) {
  const schedule::Pipeline &p = plan_->pipeline();
  for (int32_t id : accumulators_)
    PTC_RETURN_IF_ERROR(dev_->zero(data(id), plan_->tensor(id).bytes));
  trace_.clear();
  auto start = std::chrono::steady_clock::now();
  auto us = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - start).count();
  };
  const auto &actions = p.actions[static_cast<size_t>(ppRank_)];
  for (size_t i = 0; i < actions.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = runAction(i, profile);
    if (!s.isOk())
      return Status(s.code(), "pipeline rank " + std::to_string(ppRank_) + " action #" +
                                  std::to_string(i) + " (" + schedule::describe(actions[i]) +
                                  "): " + s.message());
    if (tracing_)
      trace_.push_back({schedule::describe(actions[i]), us(t0),
                        us(std::chrono::steady_clock::now()) - us(t0)});
  }
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->flushSends());
  if (!stash_.empty() || !direct_.empty())
    return error(StatusCode::kInternal, stash_.size() + direct_.size(),
                 " stashed values were never consumed (first: tensor #",
                 stash_.empty() ? direct_.begin()->first : stash_.begin()->first.first,
                 " of micro-batch ",
                 stash_.empty() ? direct_.begin()->second : stash_.begin()->first.second, ")");
  auto t0 = std::chrono::steady_clock::now();
  for (uint32_t n : stepInstructions_)
    PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  if (tracing_)
    trace_.push_back({"optimizer step", us(t0), us(std::chrono::steady_clock::now()) - us(t0)});
  return shareOutputs();
}

Status Executor::shareOutputs() {
  int axis = plan_->pipelineAxis();
  if (!comm_ || axis < 0)
    return Status::ok();
  for (auto [id, from] : remoteOutputs_) {
    const std::string what = "output tensor #" + std::to_string(id);
    if (ppRank_ == from)
      PTC_RETURN_IF_ERROR(sendBytes(data(id), plan_->tensor(id).bytes, 0, 30000 + id % 2000, what));
    else if (ppRank_ == 0)
      PTC_RETURN_IF_ERROR(recvBytes(data(id), plan_->tensor(id).bytes, from, 30000 + id % 2000, what));
  }
  return comm_->flushSends();
}

} // namespace ptc
