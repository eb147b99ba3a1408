// Executor collectives: staging through the host or the device-resident
// communicator, gradient buckets, reduce-scatters, vocabulary-parallel
// cross-entropy and the generic collective dispatch.

#include "runtime/exec/executor.h"
#include "runtime/device/kernel_launch.h"
#include "runtime/plan/plan_ops.h"


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
    std::vector<int64_t> axes = meshAxesOf(*inst);
    if (!axes.empty())
      groups.insert(std::vector<int>(axes.begin(), axes.end()));
  }
  return {groups.begin(), groups.end()};
}

Status Executor::blocksForReduceScatter(const plan::Instruction &inst, void *staging,
                                        int64_t elementBytes) {
  const TensorInfo &src = plan_->tensor((inputsOf(inst))[0]);
  const TensorInfo &dst = plan_->tensor((outputsOf(inst))[0]);
  const auto dim = static_cast<size_t>(plan::attrOf(inst, kernels::attr::ReduceScatter::dim));
  const int parts = plan_->meshSizes()[static_cast<size_t>(
      plan::attrOf(inst, kernels::attr::ReduceScatter::axis))];
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
  const std::vector<int64_t> meshAxes = plan::attrOf(inst, kernels::attr::MeshAxes::axes);
  const std::vector<int> axes(meshAxes.begin(), meshAxes.end());
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
  const int axis = static_cast<int>(plan::attrOf(inst, kernels::attr::ReduceScatter::axis));
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
  const int axis = static_cast<int>(plan::attrOf(inst, kernels::attr::VocabAxis::axis));
  int64_t classes = logits.shape.back(), rows = logits.numElements / classes;
  int64_t offset = coords()[static_cast<size_t>(axis)] * classes;
  int64_t total = classes * plan_->meshSizes()[static_cast<size_t>(axis)];
  std::string what = "cross-entropy at " + std::string(inst.location() ? inst.location()->c_str() : "");
  // Row maxima, sums and target logits: three rows-long device vectors.
  PTC_RETURN_IF_ERROR(rowScratch_.reserve(3 * rows * 4));
  float *mx = static_cast<float *>(rowScratch_.data()), *sum = mx + rows, *target = sum + rows;
  // The logits (and the gradient) in their storage type, or f32 copies of
  // them (runWidened) where the pieces do not take it.
  const void *x = data(in[0]);
  const kernels::DType type = widening_ ? kernels::DType::F32
                                        : static_cast<kernels::DType>(logits.dtype);
  const int32_t *t = i32(in[1]);
  Device &d = *dev_;
  const Shape rowsShape{rows};
  const kernels::DType i32 = kernels::DType::I32;
  PTC_RETURN_IF_ERROR(KernelLaunch(kernels::OpKind::RowMax)
                          .in(x, logits.shape, type)
                          .out(mx, rowsShape)
                          .launch(d));
  if (comm_)
    PTC_RETURN_IF_ERROR(allReduceSmall(mx, rows, {axis}, /*max=*/true, what));
  PTC_RETURN_IF_ERROR(KernelLaunch(kernels::OpKind::RowSumExp)
                          .in(x, logits.shape, type)
                          .in(mx, rowsShape)
                          .out(sum, rowsShape)
                          .launch(d));
  if (comm_)
    PTC_RETURN_IF_ERROR(allReduceSmall(sum, rows, {axis}, /*max=*/false, what));
  void *out = data(outputsOf(inst)[0]);
  // The loss: the forward's only output, or the gradient's second
  // (ptc.vocab_parallel_cross_entropy_with_grad: the rows' maxima and sums
  // serve both).
  const bool forward = inst.op() == OpCode::VocabParallelCrossEntropy;
  void *loss = forward ? out : outputsOf(inst).size() > 1 ? data(outputsOf(inst)[1]) : nullptr;
  if (loss) {
    PTC_RETURN_IF_ERROR(KernelLaunch(kernels::OpKind::TargetLogit)
                            .in(x, logits.shape, type)
                            .in(t, rowsShape, i32)
                            .out(target, rowsShape)
                            .set(kernels::attr::ClassBlock::first_class, offset)
                            .set(kernels::attr::ClassBlock::classes, total)
                            .launch(d));
    if (comm_)
      PTC_RETURN_IF_ERROR(allReduceSmall(target, rows, {axis}, /*max=*/false, what));
    PTC_RETURN_IF_ERROR(KernelLaunch(kernels::OpKind::LossFromParts)
                            .in(mx, rowsShape)
                            .in(sum, rowsShape)
                            .in(target, rowsShape)
                            .out(loss, {1})
                            .launch(d));
    if (forward)
      return Status::ok();
  }
  return KernelLaunch(kernels::OpKind::VocabParallelGrad)
      .in(x, logits.shape, type)
      .in(t, rowsShape, i32)
      .in(f32(in[2]), {1})
      .in(mx, rowsShape)
      .in(sum, rowsShape)
      .out(out, logits.shape, type)
      .set(kernels::attr::ClassBlock::first_class, offset)
      .set(kernels::attr::ClassBlock::classes, total)
      .launch(d);
}

bool Executor::vocabLossNative(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  const TensorInfo &logits = plan_->tensor(in[0]);
  const auto type = static_cast<kernels::DType>(logits.dtype);
  if (!kernels::isLowPrecision(type))
    return false;
  const bool grad = inst.op() == OpCode::VocabParallelCrossEntropyGrad;
  // The loss, or the loss's gradient (and the loss given with it): f32 (a
  // 16-bit one is widened).
  if (plan_->tensor(grad ? in[2] : out[0]).dtype != plan::DType::F32 ||
      (grad && out.size() > 1 && plan_->tensor(out[1]).dtype != plan::DType::F32))
    return false;
  const int64_t classes = logits.shape.back(), rows = logits.numElements / classes;
  const Shape rowsShape{rows};
  // Probes (no data): the pieces' entries for the logits' type.
  const bool loss = !grad || out.size() > 1;
  return KernelLaunch(kernels::OpKind::RowMax)
             .in(nullptr, logits.shape, type)
             .out(nullptr, rowsShape)
             .acceptedBy(*dev_) &&
         KernelLaunch(kernels::OpKind::RowSumExp)
             .in(nullptr, logits.shape, type)
             .in(nullptr, rowsShape)
             .out(nullptr, rowsShape)
             .acceptedBy(*dev_) &&
         (!grad || KernelLaunch(kernels::OpKind::VocabParallelGrad)
                       .in(nullptr, logits.shape, type)
                       .in(nullptr, rowsShape, kernels::DType::I32)
                       .in(nullptr, {1})
                       .in(nullptr, rowsShape)
                       .in(nullptr, rowsShape)
                       .out(nullptr, logits.shape, type)
                       .acceptedBy(*dev_)) &&
         (!loss || KernelLaunch(kernels::OpKind::TargetLogit)
                       .in(nullptr, logits.shape, type)
                       .in(nullptr, rowsShape, kernels::DType::I32)
                       .out(nullptr, rowsShape)
                       .acceptedBy(*dev_));
}

Status Executor::runCollective(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  namespace attr = kernels::attr;
  std::string what = inst.location() ? inst.location()->str() : "";
  Device &d = deviceFor(inst); // the host for a host ShardSlice
  switch (inst.op()) {
  case OpCode::AllReduce:
    return runBucketAllReduce(inst, /*bf16=*/false);
  case OpCode::ReduceScatter:
    return runReduceScatter(inst, /*bf16=*/false);
  case OpCode::AllGather: {
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    const int axis = static_cast<int>(plan::attrOf(inst, attr::BlockedAxis::axis));
    const int64_t dim = plan::attrOf(inst, attr::BlockedAxis::dim);
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
    int64_t blocks = plan::attrOf(inst, attr::BlockedAxis::blocks),
            local = src.shape[static_cast<size_t>(dim)];
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
    const int axis = static_cast<int>(plan::attrOf(inst, attr::AllToAll::axis));
    const auto split = static_cast<size_t>(plan::attrOf(inst, attr::AllToAll::split_dim));
    const auto concat = static_cast<size_t>(plan::attrOf(inst, attr::AllToAll::concat_dim));
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
    const int64_t dim = plan::attrOf(inst, attr::BlockedAxis::dim);
    const auto axis = static_cast<size_t>(plan::attrOf(inst, attr::BlockedAxis::axis));
    int coord = comm_ ? comm_->coords()[axis] : 0;
    int64_t blocks = plan::attrOf(inst, attr::BlockedAxis::blocks),
            local = dst.shape[static_cast<size_t>(dim)];
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
