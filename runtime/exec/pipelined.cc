// Executor: pipelined plans. This rank runs its schedule's actions in order:
// a compute action runs one segment (forward / backward / weight gradients)
// of one chunk for one micro-batch; SEND / RECV move a channel's value for one
// micro-batch. Values that cross segments wait in the activation stash, keyed
// by (tensor, micro-batch): a producing segment copies them out, a consuming
// one copies them back into their arena place; the entry goes when its last
// consumer has it. Micro-batch sums accumulate in place. After the actions,
// the once-per-step instructions (gradient reduction, optimizer) run.

#include "runtime/exec/executor.h"
#include "runtime/plan/pipeline_segments.h"

#include <chrono>
#include <cstring>
#include <set>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

Status Executor::preparePipeline() {
  const schedule::Pipeline &p = plan_->pipeline();
  const auto &insts = *plan_->plan().instructions();
  // The rank's segments, imports and exports (shared with the compiler's
  // stash prediction).
  auto derived = derivePipelineSegments(*plan_, ppRank_);
  if (!derived.isOk())
    return derived.status();
  pipeline_ = std::move(*derived);
  stepInstructions_ = pipeline_.stepInstructions;
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

int Executor::dataParts(const TensorInfo &t) const {
  return (!t.dimAxes.empty() && t.dimAxes[0] >= 0)
             ? plan_->meshSizes()[static_cast<size_t>(t.dimAxes[0])]
             : 1;
}

Status Executor::loadMicrobatch(int mb) {
  // Micro-batch `mb` of data-parallel rank r is rows [r*B/dp + mb*b, ... + b)
  // of the whole batch (b = B / (dp * M)); DESIGN's batch order per rank.
  for (auto &[id, whole] : batches_) {
    const TensorInfo &t = plan_->tensor(id);
    int64_t rows = t.globalShape[0], rowBytes = dtypeSize(t.dtype);
    for (size_t d = 1; d < t.globalShape.size(); ++d)
      rowBytes *= t.globalShape[d];
    int parts = dataParts(t);
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
    s.consumers = pipeline_.recvConsumers[tensor];
    stashBytes_ += bytes;
    stashPeak_ = std::max(stashPeak_, stashBytes_);
    return Status::ok();
  }
  auto it = pipeline_.segments.find({a.chunk, static_cast<int>(a.kind)});
  if (it == pipeline_.segments.end())
    return Status::ok(); // an empty segment (e.g. no input gradient on the first chunk)
  PipelineSegments::Segment &sp = it->second;
  random_.microbatch = a.mb < 0 ? 0 : a.mb;
  if (sp.readsInputs)
    PTC_RETURN_IF_ERROR(loadMicrobatch(a.mb));
  for (int32_t id : sp.imports)
    if (!direct_.erase({id, a.mb}))
      PTC_RETURN_IF_ERROR(unstash(id, a.mb, data(id)));
  for (uint32_t n : sp.instructions)
    PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  // A value whose only consumer is the next compute action stays in the arena.
  for (auto [id, consumers] : sp.exports) {
    if (pipeline_.passesDirectly(p, ppRank_, index, id, consumers))
      direct_.insert({id, a.mb});
    else
      PTC_RETURN_IF_ERROR(stash(id, a.mb, data(id), consumers));
  }
  return Status::ok();
}

Status Executor::runPipelined(std::vector<double> *profile) {
  const schedule::Pipeline &p = plan_->pipeline();
  for (int32_t id : pipeline_.accumulators)
    PTC_RETURN_IF_ERROR(dev_->zero(data(id), plan_->tensor(id).bytes));
  trace_.clear();
  const auto start = std::chrono::steady_clock::now();
  const auto &actions = p.actions[static_cast<size_t>(ppRank_)];
  for (size_t i = 0; i < actions.size(); ++i) {
    const double t0 = microsecondsSince(start);
    Status s = runAction(i, profile);
    if (!s.isOk())
      return Status(s.code(), "pipeline rank " + std::to_string(ppRank_) + " action #" +
                                  std::to_string(i) + " (" + schedule::describe(actions[i]) +
                                  "): " + s.message());
    if (tracing_)
      trace_.push_back({schedule::describe(actions[i]), t0, microsecondsSince(start) - t0});
  }
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->flushSends());
  if (!stash_.empty() || !direct_.empty())
    return error(StatusCode::kInternal, stash_.size() + direct_.size(),
                 " stashed values were never consumed (first: tensor #",
                 stash_.empty() ? direct_.begin()->first : stash_.begin()->first.first,
                 " of micro-batch ",
                 stash_.empty() ? direct_.begin()->second : stash_.begin()->first.second, ")");
  const double t0 = microsecondsSince(start);
  for (uint32_t n : stepInstructions_)
    PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  if (tracing_)
    trace_.push_back({"optimizer step", t0, microsecondsSince(start) - t0});
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
