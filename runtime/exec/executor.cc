// Executor: storage layout, instruction order and the step; kernels in
// dispatch.cc, collectives in collectives.cc, tensor I/O in tensor_io.cc.

#include "runtime/exec/executor.h"
#include "runtime/plan/plan_ops.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

StatusOr<std::unique_ptr<Executor>> Executor::create(std::shared_ptr<const LoadedPlan> plan,
                                                     int pipelineRank,
                                                     std::unique_ptr<Device> device,
                                                     const std::string &offloadDir, int rank) {
  std::unique_ptr<Executor> ex(new Executor(plan));
  ex->dev_ = device ? std::move(device) : createCpuDevice();
  Device &dev = *ex->dev_;
  ex->staging_ = DeviceBuffer(&dev);
  ex->rowScratch_ = DeviceBuffer(&dev);
  ex->ringScratch_ = DeviceBuffer(&dev);
  const auto &tensors = plan->tensors();
  ex->storage_.assign(tensors.size(), nullptr);
  ex->ppRank_ = pipelineRank;
  // Dropout keys a micro-batch's rows by the order the batch is fed in
  // (loadMicrobatch): micro-batches within each data-parallel part.
  ex->random_.microbatches = plan->microbatches();
  for (const TensorInfo &t : tensors)
    if (t.kind == plan::TensorKind::Input) {
      ex->random_.dataParts = ex->dataParts(t);
      break;
    }
  ex->arenaBytes_ = plan->plan().arena_bytes();
  // A pipelined plan: this rank holds the tensors its chunks read and write.
  std::vector<bool> here(tensors.size(), true);
  if (plan->pipelined()) {
    const schedule::Pipeline &p = plan->pipeline();
    if (pipelineRank < 0 || pipelineRank >= p.ranks)
      return invalidArgument("pipeline rank ", pipelineRank, " outside [0, ", p.ranks, ")");
    ex->arenaBytes_ = plan->plan().pipeline()->arena_bytes()->Get(static_cast<flatbuffers::uoffset_t>(pipelineRank));
    here = plan->tensorsOnPipelineRank(pipelineRank);
  }
  std::vector<bool> isOutput(tensors.size(), false);
  if (plan->plan().outputs())
    for (const plan::Output *o : *plan->plan().outputs())
      isOutput[static_cast<size_t>(o->tensor())] = true;
  auto allocate = [&](int64_t bytes, const std::string &what) -> StatusOr<uint8_t *> {
    auto p = dev.allocate(bytes);
    if (!p.isOk())
      return Status(p.status().code(), "cannot allocate " + what + " on " + dev.describe() +
                                           ": " + p.status().message());
    ex->buffers_.push_back(*p);
    return static_cast<uint8_t *>(*p);
  };
  auto arena = allocate(ex->arenaBytes_, "the " + std::to_string(ex->arenaBytes_) + "-byte arena");
  if (!arena.isOk())
    return arena.status();
  // Offloaded tensors (parameters, state, the update's temporaries): host
  // memory, one allocation of 256-byte aligned slots.
  constexpr int64_t kSlotAlignment = 256;
  const bool offloaded = std::any_of(tensors.begin(), tensors.end(),
                                     [](const TensorInfo &t) { return t.host; });
  if (offloaded && !dev.hostAddressable())
    ex->hostDev_ = createCpuDevice();
  std::vector<int64_t> hostSlot(tensors.size(), -1);
  int64_t hostBlock = 0;
  // With an offload directory, the host model state (master weights and
  // optimizer state) goes to the file instead, in page-aligned slots.
  constexpr int64_t kFileAlignment = 4096;
  ex->fileRange_.assign(tensors.size(), {-1, 0});
  int64_t fileBlock = 0;
  auto inFile = [&](size_t i) {
    return !offloadDir.empty() && (tensors[i].kind == TensorKind::Parameter ||
                                   tensors[i].kind == TensorKind::OptimizerState);
  };
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].host && (here[i] || isOutput[i])) {
      ex->hostBytes_ += tensors[i].bytes;
      if (inFile(i)) {
        ex->fileRange_[i] = {fileBlock, tensors[i].bytes};
        fileBlock += (tensors[i].bytes + kFileAlignment - 1) / kFileAlignment * kFileAlignment;
        ex->fileBytes_ += tensors[i].bytes;
        continue;
      }
      hostSlot[i] = hostBlock;
      hostBlock += (tensors[i].bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    }
  if (!offloadDir.empty() && fileBlock == 0)
    return invalidArgument("--offload-dir: this plan keeps no model state in host memory (compile "
                           "it with offload=optimizer)");
  if (fileBlock > 0) {
    auto file = OffloadFile::create(offloadDir, "ptc-offload-rank-" + std::to_string(rank) + ".bin",
                                    fileBlock);
    if (!file.isOk())
      return file.status();
    // Not page-locked for a GPU (that would hold the whole file in memory):
    // its copies to the device go through pageable memory.
    ex->file_ = std::move(*file);
    for (size_t i = 0; i < tensors.size(); ++i)
      if (ex->fileRange_[i].first >= 0)
        ex->storage_[i] = ex->file_->data() + ex->fileRange_[i].first;
  }
  if (hostBlock > 0) {
    Device &host = ex->hostDevice();
    auto p = host.allocate(hostBlock);
    if (!p.isOk())
      return Status(p.status().code(), "cannot allocate " + std::to_string(hostBlock) +
                                           " bytes of offloaded tensors in host memory: " +
                                           p.status().message());
    ex->hostBuffers_.push_back(*p);
    if (ex->hostDev_) { // the device copies to and from it every step
      Status pinned = dev.pinHostMemory(*p, hostBlock);
      if (!pinned.isOk())
        return pinned;
      ex->pinned_ = true;
    }
    for (size_t i = 0; i < tensors.size(); ++i)
      if (hostSlot[i] >= 0)
        ex->storage_[i] = static_cast<uint8_t *>(*p) + hostSlot[i];
  }
  // Persistent tensors (parameters, state, inputs, constants, outputs received
  // from another pipeline rank): one more allocation, 256-byte aligned slots.
  std::vector<int64_t> slot(tensors.size(), -1);
  int64_t block = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (t.host)
      continue;
    if (t.kind == TensorKind::Temporary && here[i]) {
      if (t.arenaOffset + t.bytes > ex->arenaBytes_)
        return invalidArgument("tensor #", i, " at arena offset ", t.arenaOffset,
                               " lies outside pipeline rank ", pipelineRank, "'s ",
                               ex->arenaBytes_, "-byte arena");
      ex->storage_[i] = *arena + t.arenaOffset;
      continue;
    }
    if (!here[i] && !isOutput[i])
      continue;
    slot[i] = block;
    block += (t.bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    ex->persistentBytes_ += t.bytes;
  }
  auto persistent = allocate(block, std::to_string(block) + " bytes of parameters, state and inputs");
  if (!persistent.isOk())
    return persistent.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (slot[i] < 0 && hostSlot[i] < 0)
      continue;
    uint8_t *buf = static_cast<uint8_t *>(ex->storage_[i]);
    if (slot[i] >= 0)
      ex->storage_[i] = buf = *persistent + slot[i];
    if (t.kind == TensorKind::Constant) {
      const auto *data = plan->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i))->data();
      int64_t elem = dtypeSize(t.dtype);
      std::vector<uint8_t> host(static_cast<size_t>(t.bytes));
      if (static_cast<int64_t>(data->size()) == t.bytes)
        std::memcpy(host.data(), data->data(), static_cast<size_t>(t.bytes));
      else // splat
        for (int64_t e = 0; e < t.numElements; ++e)
          std::memcpy(host.data() + e * elem, data->data(), static_cast<size_t>(elem));
      PTC_RETURN_IF_ERROR(ex->deviceOf(static_cast<int32_t>(i))
                              .copy(buf, host.data(), t.bytes, CopyKind::HostToDevice));
    }
  }
  if (plan->pipelined())
    PTC_RETURN_IF_ERROR(ex->preparePipeline());
  ex->groupOptimizerUpdates();
  const auto &insts = *plan->plan().instructions();
  if (ex->file_) {
    ex->fileUses_.assign(insts.size(), {});
    ex->fileUseAt_.assign(tensors.size(), {});
    for (uint32_t n = 0; n < insts.size(); ++n) {
      for (const auto *list : {insts.Get(n)->inputs(), insts.Get(n)->outputs()})
        if (list)
          for (int32_t id : *list)
            if (ex->fileRange_[static_cast<size_t>(id)].first >= 0 &&
                std::find(ex->fileUses_[n].begin(), ex->fileUses_[n].end(), id) ==
                    ex->fileUses_[n].end())
              ex->fileUses_[n].push_back(id);
      for (int32_t id : ex->fileUses_[n])
        ex->fileUseAt_[static_cast<size_t>(id)].push_back(n);
    }
  }
  ex->writesState_.assign(insts.size(), false);
  // Point-to-point transfers always run (a skipped recv would leave its send
  // waiting); they carry the unchanged values during evaluation.
  for (uint32_t n = 0; n < insts.size(); ++n)
    for (int32_t id : outputsOf(*insts.Get(n))) {
      if (insts.Get(n)->op() == OpCode::Send || insts.Get(n)->op() == OpCode::Recv)
        break;
      TensorKind kind = plan->tensor(id).kind;
      if (kind == TensorKind::Parameter || kind == TensorKind::OptimizerState ||
          kind == TensorKind::WorkingCopy)
        ex->writesState_[n] = true;
    }
  ex->prepareKernels();
  return ex;
}

void Executor::groupOptimizerUpdates() {
  // Runs of consecutive f32 AdamW (or SGD) instructions with the same
  // hyperparameters, step, skip flag and scheduled learning rate become one
  // device call (multi-tensor apply).
  const auto &insts = *plan_->plan().instructions();
  uint32_t count = insts.size();
  groupEnd_.assign(count, 0);
  covered_.assign(count, false);
  std::vector<bool> allowed(count, !plan_->pipelined());
  for (uint32_t n : stepInstructions_)
    allowed[n] = true;
  // Every tensor f32, except a gradient in bf16 / f16 where the device reads
  // it so (ptc-fuse-gradient-widening's updates under mixed precision) and
  // the working copy the update writes (ptc-keep-working-copies).
  auto isBatchableUpdate = [&](uint32_t n) {
    const plan::Instruction *i = insts.Get(n);
    if (!allowed[n] || (i->op() != OpCode::AdamWUpdate && i->op() != OpCode::SgdUpdate))
      return false;
    // A device whose batched update reads bf16 / f16 gradients (widened as read).
    const kernels::KernelEntry &entry =
        deviceFor(*i).kernelTable()[static_cast<kernels::OpKind>(i->op())];
    const bool lowGradOk = !i->on_host() && entry.runBatch && entry.batchAccepts(typedCall(*i));
    for (const auto *ids : {&inputsOf(*i), &outputsOf(*i)})
      for (int32_t id : *ids) {
        const plan::DType t = plan_->tensor(id).dtype;
        if (t == plan::DType::F32)
          continue;
        const bool isGrad = ids == &inputsOf(*i) && inputsOf(*i).size() > 1 && id == inputsOf(*i)[1];
        const bool isCopy = plan_->tensor(id).kind == TensorKind::WorkingCopy;
        if (!((isGrad || isCopy) && lowGradOk && (t == plan::DType::BF16 || t == plan::DType::F16)))
          return false;
      }
    // One launch runs the group's updates concurrently: only when they write
    // persistent tensors (in place), never arena memory another member reads.
    for (int32_t id : outputsOf(*i))
      if (plan_->tensor(id).kind == TensorKind::Temporary)
        return false;
    return true;
  };
  auto sameGroup = [&](uint32_t a, uint32_t b) {
    const plan::Instruction *x = insts.Get(a), *y = insts.Get(b);
    if (x->on_host() != y->on_host() || x->op() != y->op())
      return false;
    // The same step (AdamW's input 4), skip flag and scheduled learning rate
    // (the inputs after each tensor's own), and the same attributes
    // (hyperparameters).
    const auto &xi = inputsOf(*x), &yi = inputsOf(*y);
    if (xi.size() != yi.size())
      return false;
    const flatbuffers::uoffset_t own = x->op() == OpCode::AdamWUpdate ? 4 : 3;
    for (flatbuffers::uoffset_t k = own; k < xi.size(); ++k)
      if (xi.Get(k) != yi.Get(k))
        return false;
    auto ints = [](const plan::Instruction *i) {
      return i->ints() ? std::vector<int64_t>(i->ints()->begin(), i->ints()->end())
                       : std::vector<int64_t>{};
    };
    auto floats = [](const plan::Instruction *i) {
      return i->floats() ? std::vector<double>(i->floats()->begin(), i->floats()->end())
                         : std::vector<double>{};
    };
    return ints(x) == ints(y) && floats(x) == floats(y);
  };
  for (uint32_t n = 0; n < count; ++n) {
    if (!isBatchableUpdate(n))
      continue;
    uint32_t m = n + 1;
    while (m < count && isBatchableUpdate(m) && sameGroup(n, m))
      ++m;
    if (m - n >= 2) {
      groupEnd_[n] = m;
      for (uint32_t k = n + 1; k < m; ++k)
        covered_[k] = true;
    }
    n = m - 1;
  }
}

Status Executor::runOptimizerGroup(uint32_t first, uint32_t end) {
  // With the model state in a file: element ranges of at most
  // kFileBucketBytes of it (the updates are elementwise, so a large tensor splits
  // too), each read ahead while the previous one updates and released after
  // its update, at most kFileBucketsInFlight being written back at a time.
  if (file_) {
    struct Piece {
      uint32_t inst;
      int64_t begin, end; // elements
    };
    std::vector<Piece> pieces;
    const auto &all = *plan_->plan().instructions();
    for (uint32_t n = first; n < end; ++n) {
      int64_t count = plan_->tensor(inputsOf(*all.Get(n))[0]).numElements;
      int64_t perElement = 0;
      for (int32_t id : fileUses_[n])
        perElement += dtypeSize(plan_->tensor(id).dtype);
      int64_t chunk = std::max<int64_t>(1, kFileBucketBytes / std::max<int64_t>(perElement, 1));
      for (int64_t b = 0; b < count; b += chunk)
        pieces.push_back({n, b, std::min(count, b + chunk)});
    }
    // The file ranges a piece reads and writes (param, moments: inputs 0, 2,
    // 3 and outputs 0-2, where they live in the file).
    auto forRanges = [&](const Piece &p, auto fn) {
      const plan::Instruction *i = all.Get(p.inst);
      for (const auto *list : {i->inputs(), i->outputs()})
        for (int32_t id : *list) {
          const auto &r = fileRange_[static_cast<size_t>(id)];
          if (r.first < 0)
            continue;
          int64_t elem = dtypeSize(plan_->tensor(id).dtype);
          fn(r.first + p.begin * elem, (p.end - p.begin) * elem);
        }
    };
    size_t from = 0;
    auto bucketEnd = [&](size_t k) {
      int64_t bytes = 0;
      size_t e = k;
      while (e < pieces.size() && (e == k || bytes < kFileBucketBytes)) {
        forRanges(pieces[e], [&](int64_t, int64_t len) { bytes += len; });
        ++e;
      }
      return e;
    };
    size_t to = bucketEnd(0);
    for (size_t k = from; k < to; ++k)
      forRanges(pieces[k], [&](int64_t off, int64_t len) { file_->prefetch(off, len); });
    while (from < pieces.size()) {
      size_t next = bucketEnd(to);
      for (size_t k = to; k < next; ++k)
        forRanges(pieces[k], [&](int64_t off, int64_t len) { file_->prefetch(off, len); });
      for (size_t k = from; k < to; ++k)
        PTC_RETURN_IF_ERROR(runOptimizerBucket(pieces[k].inst, pieces[k].inst + 1, pieces[k].begin,
                                               pieces[k].end));
      if (measureFile_)
        file_->residentBytes(); // the high-water mark, measured
      for (size_t k = from; k < to; ++k)
        forRanges(pieces[k], [&](int64_t off, int64_t len) { file_->release(off, len); });
      // The writes bound what stays in memory, not the update's speed.
      file_->drainTo(kFileBucketsInFlight);
      from = to;
      to = next;
    }
    return Status::ok();
  }
  return runOptimizerBucket(first, end);
}

void Executor::prefetchFileTensors(uint32_t from, uint32_t to) {
  for (uint32_t n = from; n < to && n < fileUses_.size(); ++n)
    for (int32_t id : fileUses_[n]) {
      const auto &r = fileRange_[static_cast<size_t>(id)];
      file_->prefetch(r.first, r.second);
    }
}

void Executor::releaseFileTensors(uint32_t n, uint32_t end) {
  // A tensor goes back to the file unless an instruction soon after uses it
  // again (the next step's uses are far: the step ends in between).
  for (uint32_t m = n; m < end; ++m)
    for (int32_t id : fileUses_[m]) {
      const std::vector<uint32_t> &uses = fileUseAt_[static_cast<size_t>(id)];
      auto next = std::upper_bound(uses.begin(), uses.end(), end - 1);
      if (next != uses.end() && *next < end + kFileLookahead)
        continue;
      const auto &r = fileRange_[static_cast<size_t>(id)];
      file_->release(r.first, r.second);
    }
}

Status Executor::runOptimizerBucket(uint32_t first, uint32_t end, int64_t begin, int64_t stop) {
  // One AdamWUpdate (SgdUpdate) call per instruction, launched together: its
  // parameter, gradient and moments (momentum) as views of elements [begin,
  // stop) (stop < 0: all of each), the step, skip flag and learning rate the
  // group shares.
  const auto &insts = *plan_->plan().instructions();
  const plan::Instruction *head = insts.Get(first);
  const auto op = static_cast<kernels::OpKind>(head->op());
  const flatbuffers::uoffset_t own = op == kernels::OpKind::AdamWUpdate ? 4 : 3;
  std::vector<double> floats(head->floats()->begin(), head->floats()->end());
  StatusOr<std::optional<double>> lr = scheduledLr(*head);
  if (!lr.isOk())
    return lr.status();
  if (*lr)
    floats[kernels::learningRateSlot(op)] = **lr;
  const size_t count = end - first;
  std::vector<Shape> ranges(count);
  std::vector<std::vector<kernels::TensorView>> ins(count), outs(count);
  std::vector<std::vector<int64_t>> ints(count); // scheduled_lr: the lr is the last input
  std::vector<kernels::KernelCall> calls;
  for (uint32_t n = first; n < end; ++n) {
    const plan::Instruction *i = insts.Get(n);
    PTC_RETURN_IF_ERROR(awaitPending(*i));
    const size_t k = n - first;
    const int64_t off = stop >= 0 ? begin : 0;
    const int64_t elements = stop >= 0 ? stop - begin : plan_->tensor(inputsOf(*i)[0]).numElements;
    ranges[k] = {elements};
    auto view = [&](int32_t id, bool range) -> kernels::TensorView {
      const TensorInfo &t = plan_->tensor(id);
      const auto dtype = static_cast<kernels::DType>(t.dtype);
      if (!range)
        return {data(id), dtype, &t.shape, t.numElements};
      return {static_cast<char *>(data(id)) + off * kernels::dtypeBytes(dtype), dtype, &ranges[k],
              elements};
    };
    const auto &in = inputsOf(*i);
    for (flatbuffers::uoffset_t j = 0; j < in.size(); ++j)
      ins[k].push_back(view(in[j], j < own));
    for (int32_t id : outputsOf(*i))
      outs[k].push_back(view(id, true));
    if (i->ints())
      ints[k].assign(i->ints()->begin(), i->ints()->end());
    calls.push_back(kernels::makeKernelCall(op, ins[k], outs[k], ints[k], floats));
  }
  return deviceFor(*head).launchBatch(calls.data(), calls.size());
}

Executor::~Executor() {
  stash_.clear();
  if (dev_) {
    (void)dev_->synchronize();
    for (void *p : buffers_)
      dev_->release(p);
    for (void *p : hostBuffers_) {
      if (pinned_)
        dev_->unpinHostMemory(p);
      hostDevice().release(p);
    }
  }
}

std::vector<int> Executor::coords() const {
  return comm_ ? comm_->coords() : std::vector<int>(plan_->meshSizes().size(), 0);
}

Status Executor::hostSync() {
  return commOnDevice() ? comm_->drain() : Status::ok();
}

Status Executor::runInstruction(uint32_t n, std::vector<double> *profile) {
  const plan::Instruction *inst = plan_->plan().instructions()->Get(n);
  if (covered_[n]) // ran with the optimizer group it belongs to
    return Status::ok();
  if (progress_)
    progress_->store(static_cast<int32_t>(n), std::memory_order_relaxed);
  if (evaluating_ && writesState_[n])
    return Status::ok();
  auto t0 = std::chrono::steady_clock::now();
  // A profile of asynchronous kernels marks the compute stream around the
  // instruction (host instructions keep the wall clock: they block it).
  const bool timed = profile && !dev_->hostAddressable() && !inst->on_host();
  Event start = 0;
  if (timed) {
    StatusOr<Event> e = dev_->recordTimed(StreamKind::Compute);
    if (!e.isOk())
      return Status(e.status().code(), describeInstruction(*inst, n) +
                                           ": marking the profile: " + e.status().message());
    start = *e;
  }
  Status status;
  // A host instruction may read the destination of a copy to the host, or
  // overwrite the source of a copy to the device (a micro-batch's working
  // copy), still in flight: every copy finishes first (collectives too, or a
  // dead peer would hang the wait).
  if (inst->on_host() && asyncTransfers_)
    status = finishTransfers();
  const uint32_t end = groupEnd_[n] != 0 ? groupEnd_[n] : n + 1;
  if (file_ && groupEnd_[n] == 0) // a group reads ahead in buckets of its own
    prefetchFileTensors(n, std::min<uint32_t>(end + kFileLookahead, static_cast<uint32_t>(covered_.size())));
  if (status.isOk() && groupEnd_[n] != 0) {
    status = runOptimizerGroup(n, groupEnd_[n]);
  } else if (status.isOk()) {
    status = awaitPending(*inst);
    if (status.isOk())
      status = run(*inst);
  }
  if (file_ && status.isOk() && groupEnd_[n] == 0 && !fileUses_[n].empty()) {
    if (measureFile_)
      file_->residentBytes();
    releaseFileTensors(n, end);
    file_->drainTo(kFileBucketsInFlight * 8);
  }
  if (profile && status.isOk()) {
    const size_t op = static_cast<size_t>(inst->op());
    if (timed) { // read at the step's end
      StatusOr<Event> end = dev_->recordTimed(StreamKind::Compute);
      if (end.isOk())
        timedProfile_.push_back({op, start, *end});
      else
        status = Status(end.status().code(), "marking the profile: " + end.status().message());
    } else {
      addToProfile(*profile, op,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (!status.isOk())
    return Status(status.code(), describeInstruction(*inst, n) + ": " + status.message());
  return Status::ok();
}

Status Executor::finishTransfers() {
  PTC_RETURN_IF_ERROR(hostSync());
  PTC_RETURN_IF_ERROR(dev_->synchronize());
  asyncTransfers_ = false;
  return Status::ok();
}

Status Executor::step(std::vector<double> *profile) {
  fileWritten_ = true;
  timedProfile_.clear(); // a failed step's marks are gone with its events
  if (plan_->pipelined()) {
    PTC_RETURN_IF_ERROR(runPipelined(profile));
  } else if (!tracing_) {
    for (uint32_t n = 0, e = plan_->plan().instructions()->size(); n < e; ++n)
      PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  } else {
    // One event per instruction, named by its op and the model's line.
    trace_.clear();
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t n = 0, e = plan_->plan().instructions()->size(); n < e; ++n) {
      const double t0 = microsecondsSince(start);
      PTC_RETURN_IF_ERROR(runInstruction(n, profile));
      if (covered_[n]) // ran with its optimizer group's first instruction
        continue;
      const plan::Instruction *inst = plan_->plan().instructions()->Get(n);
      std::string name = opcodeName(inst->op());
      if (inst->location())
        name += " " + inst->location()->str();
      trace_.push_back({std::move(name), t0, microsecondsSince(start) - t0});
    }
  }
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->drain());
  Status s = dev_->synchronize();
  if (!s.isOk())
    return Status(s.code(), "the step's work on " + dev_->describe() + " failed: " + s.message());
  if (profile)
    PTC_RETURN_IF_ERROR(addTimedProfile(*profile));
  // Nothing waits on this step's events any more.
  pending_.clear();
  asyncTransfers_ = false;
  lastComm_ = -1;
  dev_->recycleEvents();
  return Status::ok();
}

void Executor::addToProfile(std::vector<double> &profile, size_t op, double seconds) {
  if (profile.size() <= op)
    profile.resize(op + 1, 0.0);
  profile[op] += seconds;
}

Status Executor::addTimedProfile(std::vector<double> &profile) {
  for (const TimedInstruction &t : timedProfile_) {
    StatusOr<double> seconds = dev_->secondsBetween(t.start, t.end);
    if (!seconds.isOk())
      return Status(seconds.status().code(),
                    "reading the profile's marks: " + seconds.status().message());
    addToProfile(profile, t.op, *seconds);
  }
  timedProfile_.clear();
  return Status::ok();
}

Status Executor::run(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  if (inst.op() == OpCode::Transfer) {
    // Between host and device memory (offload): the tensors' sides say which way.
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    if (src.host && dst.host)
      return hostDevice().copy(data(out[0]), data(in[0]), src.bytes, CopyKind::DeviceToDevice);
    if (!src.host && !dst.host)
      return dev_->copy(data(out[0]), data(in[0]), src.bytes, CopyKind::DeviceToDevice);
    if (!pinned_) {
      if (!src.host) // the host waits for the copy: pending collectives first
        PTC_RETURN_IF_ERROR(hostSync());
      return dev_->copy(data(out[0]), data(in[0]), src.bytes,
                        src.host ? CopyKind::HostToDevice : CopyKind::DeviceToHost);
    }
    // Between page-locked host memory and the device, on the communication
    // stream and overlapped with the compute stream's work: after the work
    // queued so far (which produced the source, or may still read the arena
    // memory the copy overwrites). Device instructions that read a copy's
    // result wait for it (pending_); host instructions wait for every copy in
    // flight (runInstruction).
    auto before = dev_->record(StreamKind::Compute);
    if (!before.isOk())
      return before.status();
    PTC_RETURN_IF_ERROR(dev_->wait(StreamKind::Communication, *before));
    PTC_RETURN_IF_ERROR(src.host ? dev_->copyToDeviceOn(StreamKind::Communication, data(out[0]),
                                                        data(in[0]), src.bytes)
                                 : dev_->copyToHostOn(StreamKind::Communication, data(out[0]),
                                                      data(in[0]), src.bytes));
    auto done = dev_->record(StreamKind::Communication);
    if (!done.isOk())
      return done.status();
    if (src.host)
      pending_[out[0]] = *done;
    asyncTransfers_ = true;
    return Status::ok();
  }
  // bf16 gradient reduction: bf16 on the wire.
  if ((inst.op() == OpCode::AllReduce || inst.op() == OpCode::ReduceScatter) &&
      plan_->tensor(in[0]).dtype == plan::DType::BF16)
    return inst.op() == OpCode::AllReduce ? runBucketAllReduce(inst, /*bf16=*/true)
                                          : runReduceScatter(inst, /*bf16=*/true);
  return runKernel(inst);
}

} // namespace ptc