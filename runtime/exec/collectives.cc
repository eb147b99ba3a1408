// Executor collectives: staging through the host or the device-resident
// communicator, gradient buckets, reduce-scatters, vocabulary-parallel
// cross-entropy and the generic collective dispatch.

#include "runtime/exec/executor.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

std::vector<std::vector<int>> Executor::collectiveGroups(const LoadedPlan &plan) {
  std::set<std::vector<int>> groups;
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    const auto *ints = inst->ints();
    switch (inst->op()) {
    case OpCode::AllReduce:
    case OpCode::UnscaleGrads:
    case OpCode::AnyNonfinite:
    case OpCode::ClipGradNorm:
      if (ints && ints->size() > 0)
        groups.insert(std::vector<int>(ints->begin(), ints->end()));
      break;
    case OpCode::AllGather:
    case OpCode::ReduceScatter:
    case OpCode::AllToAll:
    case OpCode::VocabParallelCrossEntropy:
    case OpCode::VocabParallelCrossEntropyGrad:
    case OpCode::RingAttention:
    case OpCode::RingAttentionGrad:
      groups.insert({static_cast<int>(ints->Get(0))});
      break;
    default:
      break;
    }
  }
  return {groups.begin(), groups.end()};
}

Status Executor::blocksForReduceScatter(const plan::Instruction &inst, void *staging,
                                        int64_t elementBytes) {
  const TensorInfo &src = plan_->tensor((inputsOf(inst))[0]);
  const TensorInfo &dst = plan_->tensor((outputsOf(inst))[0]);
  size_t dim = static_cast<size_t>(inst.ints()->Get(1));
  int parts = plan_->meshSizes()[static_cast<size_t>(inst.ints()->Get(0))];
  std::vector<int64_t> offsets(src.shape.size(), 0), zero(src.shape.size(), 0);
  for (int p = 0; p < parts; ++p) {
    offsets[dim] = p * dst.shape[dim];
    PTC_RETURN_IF_ERROR(dev_->copyBox(data((inputsOf(inst))[0]), src.shape, offsets,
                                      static_cast<uint8_t *>(staging) + p * dst.numElements * elementBytes,
                                      dst.shape, zero, dst.shape, elementBytes));
  }
  return Status::ok();
}

// ---- Collectives ------------------------------------------------------------
// A communicator works on host memory (MPI: device data goes through host
// copies unless the device is the CPU) or on device memory, enqueued on the
// device's communication stream (NCCL): then the communication stream waits
// for the compute work so far, and the compute stream waits for the
// collective only where an instruction reads its result (gradient buckets), so
// that reduction overlaps the rest of the backward pass.

bool Executor::commOnDevice() const { return comm_ && comm_->deviceResident(); }

StatusOr<void *> Executor::commView(const void *p, int64_t bytes, int slot, bool load) {
  if (dev_->hostAddressable() || commOnDevice())
    return const_cast<void *>(p);
  return hostStage(p, bytes, slot, load);
}

StatusOr<void *> Executor::hostStage(const void *p, int64_t bytes, int slot, bool load) {
  auto &host = hostStaging_[static_cast<size_t>(slot)];
  if (static_cast<int64_t>(host.size()) < bytes)
    host.resize(static_cast<size_t>(bytes));
  if (load)
    PTC_RETURN_IF_ERROR(dev_->copy(host.data(), p, bytes, CopyKind::DeviceToHost));
  return static_cast<void *>(host.data());
}

Status Executor::commWriteBack(void *p, void *view, int64_t bytes) {
  if (view == p)
    return Status::ok();
  return dev_->copy(p, view, bytes, CopyKind::HostToDevice);
}

Status Executor::reuseStaging() {
  // The staging buffer may still feed the previous collective.
  if (commOnDevice() && lastComm_ >= 0)
    return dev_->wait(StreamKind::Compute, lastComm_);
  return Status::ok();
}

Status Executor::enterComm() {
  if (!commOnDevice())
    return Status::ok();
  auto ev = dev_->record(StreamKind::Compute);
  if (!ev.isOk())
    return ev.status();
  return dev_->wait(StreamKind::Communication, *ev);
}

Status Executor::leaveComm(const std::vector<int32_t> &results, bool overlap) {
  if (!commOnDevice())
    return Status::ok();
  auto ev = dev_->record(StreamKind::Communication);
  if (!ev.isOk())
    return ev.status();
  lastComm_ = *ev;
  if (!overlap)
    return dev_->wait(StreamKind::Compute, *ev);
  for (int32_t id : results)
    pending_[id] = *ev;
  return Status::ok();
}

Status Executor::awaitTensor(int32_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end())
    return Status::ok();
  PTC_RETURN_IF_ERROR(dev_->wait(StreamKind::Compute, it->second));
  pending_.erase(it);
  return Status::ok();
}

Status Executor::awaitPending(const plan::Instruction &inst) {
  if (pending_.empty())
    return Status::ok();
  for (const auto *ids : {&inputsOf(inst), &outputsOf(inst)})
    for (int32_t id : *ids)
      PTC_RETURN_IF_ERROR(awaitTensor(id));
  return Status::ok();
}

int64_t Executor::heldBytes(int32_t id) const {
  const TensorInfo &t = plan_->tensor(id);
  return widening_ && kernels::isLowPrecision(static_cast<kernels::DType>(t.dtype)) ? t.numElements * 4
                                                                                    : t.bytes;
}

Status Executor::runBucketAllReduce(const plan::Instruction &inst, bool bf16) {
  // One bucket: pack, sum once, unpack; or, where the compiler laid the
  // bucket out back to back with each result on its operand (PlanMemory),
  // sum it where it is.
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  std::string what = inst.location() ? inst.location()->str() : "";
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  int64_t total = 0;
  for (int32_t id : in)
    total += heldBytes(id);
  // The group's sum of the `total` bytes at `block`, in place.
  auto sumAt = [&](void *block) -> Status {
    PTC_RETURN_IF_ERROR(enterComm());
    auto view = commView(block, total, 0, true);
    if (!view.isOk())
      return view.status();
    std::string bucket = "a " + std::to_string(total) + "-byte " + (bf16 ? "bf16 " : "") +
                         "bucket at " + what;
    PTC_RETURN_IF_ERROR(
        bf16 ? comm_->allReduceSumBf16(static_cast<uint16_t *>(*view), total / 2, axes, bucket)
             : comm_->allReduceSum(static_cast<float *>(*view), total / 4, axes, bucket));
    return commWriteBack(block, *view, total);
  };
  if (!widening_ && allReduceInPlace(*plan_, inst)) { // (widened f16 copies are not laid out so)
    if (!comm_)
      return Status::ok(); // one rank: the sum is the operand, already in place
    total = inPlaceBucketBytes(*plan_, inst); // the padding between operands too
    PTC_RETURN_IF_ERROR(sumAt(data(in[0])));
    return leaveComm(std::vector<int32_t>(out.begin(), out.end()), /*overlap=*/true);
  }
  PTC_RETURN_IF_ERROR(reuseStaging());
  PTC_RETURN_IF_ERROR(staging_.reserve(total));
  uint8_t *staging = static_cast<uint8_t *>(staging_.data());
  int64_t off = 0;
  for (int32_t id : in) {
    PTC_RETURN_IF_ERROR(dev_->copy(staging + off, data(id), heldBytes(id), CopyKind::DeviceToDevice));
    off += heldBytes(id);
  }
  if (comm_)
    PTC_RETURN_IF_ERROR(sumAt(staging));
  // Unpacked on the stream the sum ran on.
  StreamKind stream = commOnDevice() ? StreamKind::Communication : StreamKind::Compute;
  off = 0;
  std::vector<int32_t> results;
  for (int32_t id : out) {
    PTC_RETURN_IF_ERROR(dev_->copyOn(stream, data(id), staging + off, heldBytes(id)));
    off += heldBytes(id);
    results.push_back(id);
  }
  return leaveComm(results, /*overlap=*/true);
}

Status Executor::runReduceScatter(const plan::Instruction &inst, bool bf16) {
  // Lay the input out as one contiguous block per group member, then sum-scatter.
  const TensorInfo &src = plan_->tensor((inputsOf(inst))[0]);
  int32_t outId = (outputsOf(inst))[0];
  const TensorInfo &dst = plan_->tensor(outId);
  int axis = static_cast<int>(inst.ints()->Get(0));
  std::string what = "'" + src.name + "' at " + (inst.location() ? inst.location()->str() : "");
  const int32_t inId = (inputsOf(inst))[0];
  const int64_t srcBytes = heldBytes(inId), dstBytes = heldBytes(outId);
  PTC_RETURN_IF_ERROR(reuseStaging());
  PTC_RETURN_IF_ERROR(staging_.reserve(srcBytes));
  PTC_RETURN_IF_ERROR(blocksForReduceScatter(inst, staging_.data(), srcBytes / src.numElements));
  if (!comm_)
    return dev_->copy(data(outId), staging_.data(), dstBytes, CopyKind::DeviceToDevice);
  PTC_RETURN_IF_ERROR(enterComm());
  auto in = commView(staging_.data(), srcBytes, 0, true);
  if (!in.isOk())
    return in.status();
  auto outView = commView(data(outId), dstBytes, 1, false);
  if (!outView.isOk())
    return outView.status();
  PTC_RETURN_IF_ERROR(
      bf16 ? comm_->reduceScatterSumBf16(static_cast<const uint16_t *>(*in),
                                         static_cast<uint16_t *>(*outView), dst.numElements, axis,
                                         what)
           : comm_->reduceScatterSum(static_cast<const float *>(*in),
                                     static_cast<float *>(*outView), dst.numElements, axis, what));
  PTC_RETURN_IF_ERROR(commWriteBack(data(outId), *outView, dstBytes));
  return leaveComm({outId}, /*overlap=*/true);
}

Status Executor::allReduceSmall(float *values, int64_t count, const std::vector<int> &axes,
                                bool max, const std::string &what) {
  // Per-row or scalar reductions that the next kernel needs at once.
  PTC_RETURN_IF_ERROR(enterComm());
  auto view = commView(values, count * 4, 0, true);
  if (!view.isOk())
    return view.status();
  float *v = static_cast<float *>(*view);
  PTC_RETURN_IF_ERROR(max ? comm_->allReduceMax(v, count, axes, what)
                          : comm_->allReduceSum(v, count, axes, what));
  PTC_RETURN_IF_ERROR(commWriteBack(values, v, count * 4));
  return leaveComm({}, /*overlap=*/false);
}

Status Executor::runVocabParallelCrossEntropy(const plan::Instruction &inst) {
  // Megatron's parallel cross-entropy: each device holds a block of classes;
  // the row maximum, sum of exponentials and target logit are combined over
  // the group, so no device needs all logits.
  const auto &in = inputsOf(inst);
  const TensorInfo &logits = plan_->tensor(in[0]);
  int axis = static_cast<int>(inst.ints()->Get(0));
  int64_t classes = logits.shape.back(), rows = logits.numElements / classes;
  int64_t offset = coords()[static_cast<size_t>(axis)] * classes;
  int64_t total = classes * plan_->meshSizes()[static_cast<size_t>(axis)];
  std::string what = "cross-entropy at " + std::string(inst.location() ? inst.location()->c_str() : "");
  // Row maxima, sums and target logits: three rows-long device vectors.
  PTC_RETURN_IF_ERROR(rowScratch_.reserve(3 * rows * 4));
  float *mx = static_cast<float *>(rowScratch_.data()), *sum = mx + rows, *target = sum + rows;
  const float *x = f32(in[0]);
  const int32_t *t = i32(in[1]);
  Device &d = *dev_;
  PTC_RETURN_IF_ERROR(d.rowMax(x, rows, classes, mx));
  if (comm_)
    PTC_RETURN_IF_ERROR(allReduceSmall(mx, rows, {axis}, /*max=*/true, what));
  PTC_RETURN_IF_ERROR(d.rowSumExp(x, rows, classes, mx, sum));
  if (comm_)
    PTC_RETURN_IF_ERROR(allReduceSmall(sum, rows, {axis}, /*max=*/false, what));
  float *out = f32((outputsOf(inst))[0]);
  if (inst.op() == OpCode::VocabParallelCrossEntropy) {
    PTC_RETURN_IF_ERROR(d.targetLogit(x, t, rows, classes, offset, total, target));
    if (comm_)
      PTC_RETURN_IF_ERROR(allReduceSmall(target, rows, {axis}, /*max=*/false, what));
    return d.lossFromParts(mx, sum, target, rows, out);
  }
  return d.vocabParallelGrad(x, t, f32(in[2]), mx, sum, rows, classes, offset, total, out);
}

Status Executor::runRingAttention(const plan::Instruction &inst) {
  // Rank r of the axis' n holds block r of the sequence. For causal balance
  // (every rank the same work) the blocks are first rearranged in halves:
  // with the sequence in 2n halves, rank r works on halves r and 2n-1-r
  // (each rank's contiguous block is halves 2r and 2r+1), held half-major
  // ([2][batch, heads, half, dim]). Step s of the ring: the key/value halves
  // of rank (r - s) mod n are here; each query half sees the key halves
  // before it whole and its own causally, merged by the online-softmax rule;
  // then every rank's key/value halves move one rank on. The gradient runs
  // the ring twice: once for the rows' statistics (o, log-sum-exp), once with
  // the halves' dk, dv travelling along, which a last move brings home; the
  // results go back to the contiguous blocks.
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  const bool grad = inst.op() == OpCode::RingAttentionGrad;
  const TensorInfo &qt = plan_->tensor(in[0]), &kt = plan_->tensor(in[1]);
  const int axis = static_cast<int>(inst.ints()->Get(0));
  const double scale = inst.floats()->Get(0);
  const int n = plan_->meshSizes()[static_cast<size_t>(axis)];
  const int r = coords()[static_cast<size_t>(axis)];
  const std::string what = std::string("ring attention at ") +
                           (inst.location() ? inst.location()->c_str() : "");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  struct Timed { // the instruction's whole time, however it returns
    RingProfile &p;
    Clock::time_point t0 = Clock::now();
    ~Timed() {
      ++p.instructions;
      p.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  } timed{ringProfile_};
  if (n > 1 && !comm_)
    return error(StatusCode::kInternal, what, ": the plan's mesh axis has ", n,
                 " ranks but no communicator");
  const int64_t block = qt.shape[2];
  // Halves when the block splits in two (else whole blocks, unbalanced).
  const int parts = n > 1 && block % 2 == 0 ? 2 : 1;
  const int64_t len = block / parts; // rows of one part
  const int64_t batch = qt.shape[0], heads = qt.shape[1], kvHeads = kt.shape[1],
                dim = qt.shape[3];
  const Shape partShape{batch, heads, len, dim};
  const int64_t qPart = batch * heads * len * dim, kvPart = batch * kvHeads * len * dim;
  // f32 throughout (low-precision tensors arrive widened: runWidened).
  const int64_t qBytes = qt.numElements * 4, kvBytes = kt.numElements * 4,
                rows = batch * heads * block;
  const int64_t rowBytes = rows * 4, rowsPart = batch * heads * len;
  Device &d = *dev_;
  // The sequence part a rank's slot holds: contiguous block r is parts
  // (parts*r, parts*r+1); the balanced layout puts parts r and 2n-1-r here.
  auto heldPart = [&](int rank, int slot) { return parts == 1 ? rank : slot == 0 ? rank : 2 * n - 1 - rank; };

  // Host staging for moves between layouts and ranks.
  std::vector<float> hostA, hostB;
  // Contiguous [b, h, block, d] (device) <-> balanced half-major (device).
  // `heads_` is the tensor's head count; `toBalanced` picks the direction.
  // `width`: elements per row (the head dim; 1 for the document positions).
  auto rearrange = [&](const float *src, float *dst, int64_t headCount, bool toBalanced,
                       int tagBase, int64_t width) -> Status {
    const int64_t elems = batch * headCount * block * width, partElems = elems / parts;
    const int64_t bytes = elems * 4;
    if (parts == 1)
      return d.copy(dst, src, bytes, CopyKind::DeviceToDevice);
    // Host memory devices are read and written in place; others through
    // host copies.
    const bool inPlace = d.hostAddressable();
    const float *from = src;
    float *to = dst;
    if (!inPlace) {
      hostA.resize(static_cast<size_t>(elems));
      hostB.resize(static_cast<size_t>(elems));
      PTC_RETURN_IF_ERROR(d.copy(hostA.data(), src, bytes, CopyKind::DeviceToHost));
      from = hostA.data();
      to = hostB.data();
    }
    std::vector<float> message(static_cast<size_t>(partElems));
    // The rows of part `slot` of the contiguous block, packed.
    auto pack = [&](const float *in, int slot, float *out) {
      for (int64_t bh = 0; bh < batch * headCount; ++bh)
        std::memcpy(out + bh * len * width, in + (bh * block + slot * len) * width,
                    static_cast<size_t>(len * width) * 4);
    };
    auto unpack = [&](const float *in, int slot, float *out) {
      for (int64_t bh = 0; bh < batch * headCount; ++bh)
        std::memcpy(out + (bh * block + slot * len) * width, in + bh * len * width,
                    static_cast<size_t>(len * width) * 4);
    };
    for (int slot = 0; slot < 2; ++slot) {
      // The global part this slot holds, and where it goes (the balanced
      // layout is half-major: each part is contiguous there).
      int part, peer, peerSlot;
      const float *out = message.data();
      if (toBalanced) {
        part = 2 * r + slot;
        peer = part < n ? part : 2 * n - 1 - part;
        peerSlot = part < n ? 0 : 1;
        pack(from, slot, message.data());
      } else {
        part = heldPart(r, slot);
        peer = part / 2;
        peerSlot = part % 2;
        out = from + slot * partElems;
      }
      PTC_RETURN_IF_ERROR(comm_->send(out, partElems * 4, axis, peer, tagBase + peerSlot, what));
    }
    for (int slot = 0; slot < 2; ++slot) {
      int part = toBalanced ? heldPart(r, slot) : 2 * r + slot;
      int peer = toBalanced ? part / 2 : (part < n ? part : 2 * n - 1 - part);
      if (toBalanced) {
        PTC_RETURN_IF_ERROR(comm_->recv(to + slot * partElems, partElems * 4, axis, peer,
                                        tagBase + slot, what));
      } else {
        PTC_RETURN_IF_ERROR(comm_->recv(message.data(), partElems * 4, axis, peer, tagBase + slot, what));
        unpack(message.data(), slot, to);
      }
    }
    return inPlace ? Status::ok() : d.copy(dst, hostB.data(), bytes, CopyKind::HostToDevice);
  };

  // Packed documents: the block's positions (input 3, the gradient's 4).
  const size_t positionsInput =
      kernels::attentionFloatInputs(static_cast<kernels::OpKind>(inst.op()));
  const bool documents = in.size() > positionsInput;
  const int64_t positionBytes = batch * block * 4, firstKeyBytes = batch * len * 4;
  // q, (g), acc, o, dq | row max, sum, lse | k, v x2 | dk, dv x2 | balanced k, v copies
  // | (documents) balanced positions, a pair's first keys
  const int64_t total = (grad ? 5 : 3) * qBytes + 3 * rowBytes + (grad ? 10 : 6) * kvBytes +
                        (documents ? positionBytes + firstKeyBytes : 0);
  PTC_RETURN_IF_ERROR(ringScratch_.reserve(total));
  auto *base = static_cast<uint8_t *>(ringScratch_.data());
  auto carve = [&](int64_t bytes) {
    float *p = reinterpret_cast<float *>(base);
    base += bytes;
    return p;
  };
  float *q = carve(qBytes), *acc = carve(qBytes), *o = carve(qBytes);
  float *g = grad ? carve(qBytes) : nullptr, *dq = grad ? carve(qBytes) : nullptr;
  float *mx = carve(rowBytes), *sum = carve(rowBytes), *lse = carve(rowBytes);
  // Each key/value pair is carved one after the other: the ring moves a pair at once.
  float *kv[2][2] = {{carve(kvBytes), carve(kvBytes)}, {carve(kvBytes), carve(kvBytes)}};
  float *home[2] = {carve(kvBytes), carve(kvBytes)};
  float *dkv[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  if (grad)
    for (auto &pair : dkv)
      pair[0] = carve(kvBytes), pair[1] = carve(kvBytes);
  float *positionsBalanced = documents ? carve(positionBytes) : nullptr;
  auto *firstKeys = documents ? reinterpret_cast<int32_t *>(carve(firstKeyBytes)) : nullptr;
  // Moving a key/value pair (carved one after the other: 2 x kvBytes from
  // `pair`) one rank on along the ring into `into`, in two halves so that the
  // transfer overlaps the step's compute: `post` sends (the communicator
  // copies the data and returns at once), `finish` receives. A
  // device-resident communicator (NCCL) instead runs the step's send/recv on
  // the communication stream after the compute that produced the blocks, and
  // `finish` makes the compute that reads them wait for it.
  const int64_t pairBytes = 2 * kvBytes;
  const bool onDevice = n > 1 && commOnDevice();
  std::map<int, Event> shifted; // tag -> the communication stream's event
  auto post = [&](float *pair, float *into, int tag) -> Status {
    const Clock::time_point t0 = Clock::now();
    if (onDevice) {
      PTC_RETURN_IF_ERROR(enterComm());
      PTC_RETURN_IF_ERROR(comm_->ringShift(pair, into, pairBytes, axis, tag, what));
      auto ev = d.record(StreamKind::Communication);
      if (!ev.isOk())
        return ev.status();
      shifted[tag] = *ev;
    } else {
      auto view = commView(pair, pairBytes, 0, /*load=*/true);
      if (!view.isOk())
        return view.status();
      PTC_RETURN_IF_ERROR(comm_->send(*view, pairBytes, axis, (r + 1) % n, tag, what));
    }
    ringProfile_.bytes += static_cast<double>(pairBytes);
    ringProfile_.transferSeconds += since(t0);
    return Status::ok();
  };
  auto finish = [&](float *into, int tag) -> Status {
    const Clock::time_point t0 = Clock::now();
    if (onDevice) {
      PTC_RETURN_IF_ERROR(d.wait(StreamKind::Compute, shifted.at(tag)));
      shifted.erase(tag);
    } else {
      auto view = commView(into, pairBytes, 1, /*load=*/false);
      if (!view.isOk())
        return view.status();
      PTC_RETURN_IF_ERROR(comm_->recv(*view, pairBytes, axis, (r + n - 1) % n, tag, what));
      PTC_RETURN_IF_ERROR(commWriteBack(into, *view, pairBytes));
    }
    ringProfile_.transferSeconds += since(t0);
    return Status::ok();
  };
  auto move = [&](float *pair, float *into, int tag) -> Status {
    PTC_RETURN_IF_ERROR(post(pair, into, tag));
    return finish(into, tag);
  };
  double flopsWeight = 1.0; // the gradient's blocks count 2.5x the forward's
  // Packed documents: the global index of each held query row's document
  // start ([slot][batch][len]), from the positions in the balanced layout.
  std::vector<int64_t> documentStart;
  std::vector<int32_t> hostFirstKeys;
  if (documents) {
    // The positions move like a [batch, 1, block, 1] tensor (4-byte elements).
    PTC_RETURN_IF_ERROR(rearrange(reinterpret_cast<const float *>(data(in[positionsInput])),
                                  positionsBalanced, 1, true, 9016, 1));
    std::vector<int32_t> held(static_cast<size_t>(batch * block));
    PTC_RETURN_IF_ERROR(d.copy(held.data(), positionsBalanced, positionBytes, CopyKind::DeviceToHost));
    documentStart.resize(held.size());
    for (int a = 0; a < parts; ++a)
      for (int64_t bt = 0; bt < batch; ++bt)
        for (int64_t t = 0; t < len; ++t) {
          const size_t at = static_cast<size_t>((a * batch + bt) * len + t);
          const int64_t global = heldPart(r, a) * len + t;
          if (held[at] < 0 || held[at] > global)
            return error(StatusCode::kInvalidArgument, what, ": document position ", held[at],
                         " of token ", global, " (batch entry ", bt, ") is outside [0, ", global,
                         "]");
          documentStart[at] = global - held[at];
        }
    hostFirstKeys.resize(static_cast<size_t>(batch * len));
  }
  // Every (query part, key part) pair a ring step holds: `fn(qSlot, kSlot, causal,
  // firstKeys)` for the pairs the causal (and document) mask does not hide whole.
  auto pairs = [&](int src, const std::function<Status(int, int, bool, const int32_t *)> &fn)
      -> Status {
    const Clock::time_point t0 = Clock::now();
    for (int a = 0; a < parts; ++a)
      for (int b = 0; b < parts; ++b) {
        int qPartIndex = heldPart(r, a), kPartIndex = heldPart(src, b);
        if (kPartIndex > qPartIndex)
          continue;
        const bool diagonal = kPartIndex == qPartIndex;
        double visible = diagonal ? 0.5 * static_cast<double>(len) * static_cast<double>(len + 1)
                                  : static_cast<double>(len) * static_cast<double>(len);
        const int32_t *keysFrom = nullptr;
        if (documents) {
          // Each row's first key in this key part; the pair is skipped when
          // every row's document starts after it.
          const int64_t keyOffset = kPartIndex * len;
          visible = 0;
          for (int64_t bt = 0; bt < batch; ++bt)
            for (int64_t t = 0; t < len; ++t) {
              const int64_t start =
                  documentStart[static_cast<size_t>((a * batch + bt) * len + t)] - keyOffset;
              const int64_t first = std::clamp<int64_t>(start, 0, len);
              const int64_t end = diagonal ? t + 1 : len;
              hostFirstKeys[static_cast<size_t>(bt * len + t)] = static_cast<int32_t>(first);
              visible += static_cast<double>(std::max<int64_t>(end - first, 0));
            }
          visible /= static_cast<double>(batch); // per batch entry, as the count above
          if (visible == 0)
            continue;
          PTC_RETURN_IF_ERROR(d.copy(firstKeys, hostFirstKeys.data(), firstKeyBytes,
                                     CopyKind::HostToDevice));
          keysFrom = firstKeys;
        }
        ringProfile_.flops += flopsWeight * 4.0 * static_cast<double>(batch * heads * dim) * visible;
        PTC_RETURN_IF_ERROR(fn(a, b, diagonal, keysFrom));
      }
    ringProfile_.computeSeconds += since(t0);
    return Status::ok();
  };

  PTC_RETURN_IF_ERROR(rearrange(f32(in[0]), q, heads, true, 9000, dim));
  PTC_RETURN_IF_ERROR(rearrange(f32(in[1]), home[0], kvHeads, true, 9002, dim));
  PTC_RETURN_IF_ERROR(rearrange(f32(in[2]), home[1], kvHeads, true, 9004, dim));
  // Forward: the rows' online softmax over the parts they see.
  {
    PTC_RETURN_IF_ERROR(d.zero(acc, qBytes));
    PTC_RETURN_IF_ERROR(d.zero(sum, rowBytes));
    std::vector<float> minusInf(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    PTC_RETURN_IF_ERROR(d.copy(mx, minusInf.data(), rowBytes, CopyKind::HostToDevice));
    PTC_RETURN_IF_ERROR(d.copy(kv[0][0], home[0], kvBytes, CopyKind::DeviceToDevice));
    PTC_RETURN_IF_ERROR(d.copy(kv[0][1], home[1], kvBytes, CopyKind::DeviceToDevice));
    for (int s = 0, cur = 0; s < n; ++s, cur ^= 1) {
      const int src = (r - s + n) % n;
      if (s + 1 < n) // on its way while this step computes
        PTC_RETURN_IF_ERROR(post(kv[cur][0], kv[cur ^ 1][0], 9100 + s));
      if (s + 1 < n && ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9100 + s));
      PTC_RETURN_IF_ERROR(pairs(src, [&](int a, int b, bool causal, const int32_t *keysFrom) {
        return d.attentionBlock(q + a * qPart, kv[cur][0] + b * kvPart, kv[cur][1] + b * kvPart,
                                partShape, kvHeads, len, scale, causal, acc + a * qPart,
                                mx + a * rowsPart, sum + a * rowsPart, keysFrom);
      }));
      if (s + 1 < n && !ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9100 + s));
    }
    // o = acc / sum, lse = max + log(sum): rows of the host copies.
    std::vector<float> hAcc(static_cast<size_t>(rows * dim)), hMx(static_cast<size_t>(rows)),
        hSum(static_cast<size_t>(rows));
    PTC_RETURN_IF_ERROR(d.copy(hAcc.data(), acc, qBytes, CopyKind::DeviceToHost));
    PTC_RETURN_IF_ERROR(d.copy(hMx.data(), mx, rowBytes, CopyKind::DeviceToHost));
    PTC_RETURN_IF_ERROR(d.copy(hSum.data(), sum, rowBytes, CopyKind::DeviceToHost));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < dim; ++c)
        hAcc[static_cast<size_t>(i * dim + c)] /= hSum[static_cast<size_t>(i)];
      hMx[static_cast<size_t>(i)] += std::log(hSum[static_cast<size_t>(i)]);
    }
    PTC_RETURN_IF_ERROR(d.copy(o, hAcc.data(), qBytes, CopyKind::HostToDevice));
    PTC_RETURN_IF_ERROR(d.copy(lse, hMx.data(), rowBytes, CopyKind::HostToDevice));
  }
  if (!grad) {
    PTC_RETURN_IF_ERROR(rearrange(o, f32(out[0]), heads, false, 9006, dim));
    return n > 1 ? comm_->flushSends() : Status::ok();
  }
  // Backward: dq here; each part's dk, dv travel with it.
  flopsWeight = 2.5;
  PTC_RETURN_IF_ERROR(rearrange(f32(in[3]), g, heads, true, 9008, dim));
  PTC_RETURN_IF_ERROR(d.zero(dq, qBytes));
  PTC_RETURN_IF_ERROR(d.copy(kv[0][0], home[0], kvBytes, CopyKind::DeviceToDevice));
  PTC_RETURN_IF_ERROR(d.copy(kv[0][1], home[1], kvBytes, CopyKind::DeviceToDevice));
  PTC_RETURN_IF_ERROR(d.zero(dkv[0][0], kvBytes));
  PTC_RETURN_IF_ERROR(d.zero(dkv[0][1], kvBytes));
  int cur = 0;
  for (int s = 0; s < n; ++s) {
    const int src = (r - s + n) % n;
    // The keys and values leave before this step's compute; their gradients
    // (which it adds to) after it.
    if (s + 1 < n)
      PTC_RETURN_IF_ERROR(post(kv[cur][0], kv[cur ^ 1][0], 9200 + s));
    if (s + 1 < n && ringSerial_)
      PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9200 + s));
    PTC_RETURN_IF_ERROR(pairs(src, [&](int a, int b, bool causal, const int32_t *keysFrom) {
      return d.attentionBlockGrad(q + a * qPart, kv[cur][0] + b * kvPart, kv[cur][1] + b * kvPart,
                                  o + a * qPart, g + a * qPart, lse + a * rowsPart, partShape,
                                  kvHeads, len, scale, causal, dq + a * qPart,
                                  dkv[cur][0] + b * kvPart, dkv[cur][1] + b * kvPart, keysFrom);
    }));
    if (s + 1 < n) {
      PTC_RETURN_IF_ERROR(post(dkv[cur][0], dkv[cur ^ 1][0], 9250 + s));
      if (!ringSerial_)
        PTC_RETURN_IF_ERROR(finish(kv[cur ^ 1][0], 9200 + s));
      PTC_RETURN_IF_ERROR(finish(dkv[cur ^ 1][0], 9250 + s));
      cur ^= 1;
    }
  }
  // Here: the gradients of rank r + 1's parts; one more move brings every part home.
  if (n > 1)
    PTC_RETURN_IF_ERROR(move(dkv[cur][0], home[0], 9300));
  else {
    PTC_RETURN_IF_ERROR(d.copy(home[0], dkv[cur][0], kvBytes, CopyKind::DeviceToDevice));
    PTC_RETURN_IF_ERROR(d.copy(home[1], dkv[cur][1], kvBytes, CopyKind::DeviceToDevice));
  }
  PTC_RETURN_IF_ERROR(rearrange(dq, f32(out[0]), heads, false, 9010, dim));
  PTC_RETURN_IF_ERROR(rearrange(home[0], f32(out[1]), kvHeads, false, 9012, dim));
  PTC_RETURN_IF_ERROR(rearrange(home[1], f32(out[2]), kvHeads, false, 9014, dim));
  return n > 1 ? comm_->flushSends() : Status::ok();
}

Status Executor::runCollective(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  std::string what = inst.location() ? inst.location()->str() : "";
  Device &d = deviceFor(inst); // the host for a host ShardSlice
  switch (inst.op()) {
  case OpCode::AllReduce:
    return runBucketAllReduce(inst, /*bf16=*/false);
  case OpCode::ReduceScatter:
    return runReduceScatter(inst, /*bf16=*/false);
  case OpCode::AllGather: {
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    int axis = axes[0];
    int64_t dim = inst.ints()->Get(1);
    int parts = plan_->meshSizes()[static_cast<size_t>(axis)];
    PTC_RETURN_IF_ERROR(reuseStaging());
    PTC_RETURN_IF_ERROR(staging_.reserve(src.bytes * parts));
    uint8_t *staging = static_cast<uint8_t *>(staging_.data());
    if (comm_) {
      PTC_RETURN_IF_ERROR(enterComm());
      auto inView = commView(data(in[0]), src.bytes, 0, true);
      if (!inView.isOk())
        return inView.status();
      auto outView = commView(staging, src.bytes * parts, 1, false);
      if (!outView.isOk())
        return outView.status();
      PTC_RETURN_IF_ERROR(comm_->allGather(*inView, *outView, src.bytes, axis,
                                           "'" + src.name + "' at " + what));
      PTC_RETURN_IF_ERROR(commWriteBack(staging, *outView, src.bytes * parts));
      PTC_RETURN_IF_ERROR(leaveComm({}, /*overlap=*/false));
    } else {
      PTC_RETURN_IF_ERROR(d.copy(staging, data(in[0]), src.bytes, CopyKind::DeviceToDevice));
    }
    // Rank p's block b goes to b * (whole / blocks) + p * piece along dim.
    int64_t blocks = inst.ints()->Get(2), local = src.shape[static_cast<size_t>(dim)];
    int64_t piece = local / blocks, whole = dst.shape[static_cast<size_t>(dim)];
    std::vector<int64_t> srcOff(src.shape.size(), 0), dstOff(src.shape.size(), 0);
    std::vector<int64_t> box = src.shape;
    box[static_cast<size_t>(dim)] = piece;
    for (int p = 0; p < parts; ++p)
      for (int64_t b = 0; b < blocks; ++b) {
        srcOff[static_cast<size_t>(dim)] = b * piece;
        dstOff[static_cast<size_t>(dim)] = b * (whole / blocks) + p * piece;
        PTC_RETURN_IF_ERROR(d.copyBox(staging + p * src.bytes, src.shape, srcOff, data(out[0]),
                                      dst.shape, dstOff, box, dtypeSize(src.dtype)));
      }
    return Status::ok();
  }
  case OpCode::AllToAll: {
    // Pack block r of split_dim for member r, exchange, unpack member r's block
    // at block r of concat_dim.
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    int axis = axes[0];
    size_t split = static_cast<size_t>(inst.ints()->Get(1)), concat = static_cast<size_t>(inst.ints()->Get(2));
    int parts = plan_->meshSizes()[static_cast<size_t>(axis)];
    int64_t elem = dtypeSize(src.dtype);
    std::vector<int64_t> box = src.shape;
    box[split] /= parts;
    int64_t blockBytes = src.bytes / parts;
    PTC_RETURN_IF_ERROR(reuseStaging());
    PTC_RETURN_IF_ERROR(staging_.reserve(2 * src.bytes));
    uint8_t *send = static_cast<uint8_t *>(staging_.data()), *recv = send + src.bytes;
    std::vector<int64_t> zero(src.shape.size(), 0), off(src.shape.size(), 0);
    for (int p = 0; p < parts; ++p) {
      off.assign(src.shape.size(), 0);
      off[split] = p * box[split];
      PTC_RETURN_IF_ERROR(d.copyBox(data(in[0]), src.shape, off, send + p * blockBytes, box, zero,
                                    box, elem));
    }
    if (comm_) {
      PTC_RETURN_IF_ERROR(enterComm());
      auto sendView = commView(send, src.bytes, 0, true);
      if (!sendView.isOk())
        return sendView.status();
      auto recvView = commView(recv, src.bytes, 1, false);
      if (!recvView.isOk())
        return recvView.status();
      PTC_RETURN_IF_ERROR(comm_->allToAll(*sendView, *recvView, blockBytes, axis,
                                          "'" + src.name + "' at " + what));
      PTC_RETURN_IF_ERROR(commWriteBack(recv, *recvView, src.bytes));
      PTC_RETURN_IF_ERROR(leaveComm({}, /*overlap=*/false));
    } else {
      PTC_RETURN_IF_ERROR(d.copy(recv, send, src.bytes, CopyKind::DeviceToDevice));
    }
    for (int p = 0; p < parts; ++p) {
      off.assign(src.shape.size(), 0);
      off[concat] = p * box[concat];
      PTC_RETURN_IF_ERROR(d.copyBox(recv + p * blockBytes, box, zero, data(out[0]), dst.shape,
                                    off, box, elem));
    }
    return Status::ok();
  }
  default: { // ShardSlice: this rank's block, no communication
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    int64_t dim = inst.ints()->Get(1);
    int coord = comm_ ? comm_->coords()[static_cast<size_t>(axes[0])] : 0;
    int64_t blocks = inst.ints()->Get(2), local = dst.shape[static_cast<size_t>(dim)];
    int64_t piece = local / blocks, whole = src.shape[static_cast<size_t>(dim)];
    std::vector<int64_t> srcOff(src.shape.size(), 0), dstOff(src.shape.size(), 0);
    std::vector<int64_t> box = dst.shape;
    box[static_cast<size_t>(dim)] = piece;
    for (int64_t b = 0; b < blocks; ++b) {
      srcOff[static_cast<size_t>(dim)] = b * (whole / blocks) + coord * piece;
      dstOff[static_cast<size_t>(dim)] = b * piece;
      PTC_RETURN_IF_ERROR(d.copyBox(data(in[0]), src.shape, srcOff, data(out[0]), dst.shape,
                                    dstOff, box, dtypeSize(src.dtype)));
    }
    return Status::ok();
  }
  }
}

} // namespace ptc
