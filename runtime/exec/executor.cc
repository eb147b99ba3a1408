// Executor: storage layout and the opcode -> kernel dispatch.

#include "runtime/exec/executor.h"

#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;
namespace k = kernels::cpu;

namespace {
uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
} // namespace

void fillNormal(float *out, int64_t n, double stddev, uint64_t seed, const std::string &name) {
  uint64_t state = seed * 0x100000001B3ull ^ 0xCBF29CE484222325ull;
  for (char c : name) // FNV-1a over the name
    state = (state ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  const double twoPi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller on two uniforms in (0, 1].
    double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(stddev * r * std::cos(twoPi * u2));
    if (i + 1 < n)
      out[i + 1] = static_cast<float>(stddev * r * std::sin(twoPi * u2));
  }
}

StatusOr<std::unique_ptr<Executor>> Executor::create(std::shared_ptr<const LoadedPlan> plan,
                                                     int pipelineRank,
                                                     std::unique_ptr<Device> device) {
  std::unique_ptr<Executor> ex(new Executor(plan));
  ex->dev_ = device ? std::move(device) : createCpuDevice();
  Device &dev = *ex->dev_;
  ex->staging_ = DeviceBuffer(&dev);
  ex->rowScratch_ = DeviceBuffer(&dev);
  const auto &tensors = plan->tensors();
  ex->storage_.assign(tensors.size(), nullptr);
  ex->ppRank_ = pipelineRank;
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
  // Persistent tensors (parameters, state, inputs, constants, outputs received
  // from another pipeline rank): one more allocation, 256-byte aligned slots.
  constexpr int64_t kSlotAlignment = 256;
  std::vector<int64_t> slot(tensors.size(), -1);
  int64_t block = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
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
    if (slot[i] < 0)
      continue;
    uint8_t *buf = *persistent + slot[i];
    ex->storage_[i] = buf;
    if (t.kind == TensorKind::Constant) {
      const auto *data = plan->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i))->data();
      int64_t elem = dtypeSize(t.dtype);
      std::vector<uint8_t> host(static_cast<size_t>(t.bytes));
      if (static_cast<int64_t>(data->size()) == t.bytes)
        std::memcpy(host.data(), data->data(), static_cast<size_t>(t.bytes));
      else // splat
        for (int64_t e = 0; e < t.numElements; ++e)
          std::memcpy(host.data() + e * elem, data->data(), static_cast<size_t>(elem));
      PTC_RETURN_IF_ERROR(dev.copy(buf, host.data(), t.bytes, CopyKind::HostToDevice));
    }
  }
  if (plan->pipelined())
    PTC_RETURN_IF_ERROR(ex->preparePipeline());
  ex->groupOptimizerUpdates();
  return ex;
}

void Executor::groupOptimizerUpdates() {
  // Runs of consecutive f32 AdamW instructions with the same hyperparameters,
  // step and skip flag become one device call (multi-tensor apply).
  const auto &insts = *plan_->plan().instructions();
  uint32_t count = insts.size();
  groupEnd_.assign(count, 0);
  covered_.assign(count, false);
  std::vector<bool> allowed(count, !plan_->pipelined());
  for (uint32_t n : stepInstructions_)
    allowed[n] = true;
  auto isAdamF32 = [&](uint32_t n) {
    const plan::Instruction *i = insts.Get(n);
    if (!allowed[n] || i->op() != OpCode::AdamWUpdate)
      return false;
    for (const auto *ids : {i->inputs(), i->outputs()})
      for (int32_t id : *ids)
        if (plan_->tensor(id).dtype != plan::DType::F32)
          return false;
    // One launch runs the group's updates concurrently: only when they write
    // persistent tensors (in place), never arena memory another member reads.
    for (int32_t id : *i->outputs())
      if (plan_->tensor(id).kind == TensorKind::Temporary)
        return false;
    return true;
  };
  auto sameGroup = [&](uint32_t a, uint32_t b) {
    const plan::Instruction *x = insts.Get(a), *y = insts.Get(b);
    if (x->inputs()->size() != y->inputs()->size() || x->inputs()->Get(4) != y->inputs()->Get(4) ||
        (x->inputs()->size() > 5 && x->inputs()->Get(5) != y->inputs()->Get(5)))
      return false;
    for (flatbuffers::uoffset_t f = 0; f < 5; ++f)
      if (x->floats()->Get(f) != y->floats()->Get(f))
        return false;
    return true;
  };
  for (uint32_t n = 0; n < count; ++n) {
    if (!isAdamF32(n))
      continue;
    uint32_t m = n + 1;
    while (m < count && isAdamF32(m) && sameGroup(n, m))
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
  const auto &insts = *plan_->plan().instructions();
  std::vector<Device::AdamWTensor> tensors;
  for (uint32_t n = first; n < end; ++n) {
    const plan::Instruction *i = insts.Get(n);
    PTC_RETURN_IF_ERROR(awaitPending(*i));
    const auto &in = *i->inputs();
    const auto &out = *i->outputs();
    tensors.push_back({f32(in[0]), f32(in[1]), f32(in[2]), f32(in[3]), f32(out[0]), f32(out[1]),
                       f32(out[2]), plan_->tensor(in[0]).numElements});
  }
  const plan::Instruction *head = insts.Get(first);
  auto F = [&](flatbuffers::uoffset_t k) { return static_cast<float>(head->floats()->Get(k)); };
  const float *skip = head->inputs()->size() > 5 ? f32(head->inputs()->Get(5)) : nullptr;
  return dev_->adamwUpdateMany(tensors, f32(head->inputs()->Get(4)),
                               AdamWParams{F(0), F(1), F(2), F(3), F(4)}, skip);
}

Executor::~Executor() {
  stash_.clear();
  if (dev_) {
    (void)dev_->synchronize();
    for (void *p : buffers_)
      dev_->release(p);
  }
}

std::vector<int> Executor::coords() const {
  return comm_ ? comm_->coords() : std::vector<int>(plan_->meshSizes().size(), 0);
}

template <typename Fn>
void Executor::forEachLocalBox(const TensorInfo &t, const std::vector<int> &coords, Fn fn) const {
  // Per dimension the (whole offset, local offset, length) pieces this device holds.
  struct Piece {
    int64_t whole, local, len;
  };
  std::vector<std::vector<Piece>> pieces(t.shape.size());
  for (size_t d = 0; d < t.shape.size(); ++d) {
    int a = t.dimAxes.empty() ? -1 : t.dimAxes[d];
    if (a < 0) {
      pieces[d].push_back({0, 0, t.shape[d]});
      continue;
    }
    int64_t k = t.dimBlocks[d], p = plan_->meshSizes()[static_cast<size_t>(a)];
    int64_t whole = t.globalShape[d], piece = whole / (k * p);
    for (int64_t b = 0; b < k; ++b)
      pieces[d].push_back({b * (whole / k) + coords[static_cast<size_t>(a)] * piece, b * piece, piece});
  }
  std::vector<size_t> idx(t.shape.size(), 0);
  while (true) {
    std::vector<int64_t> wholeOff, localOff, box;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      wholeOff.push_back(pieces[d][idx[d]].whole);
      localOff.push_back(pieces[d][idx[d]].local);
      box.push_back(pieces[d][idx[d]].len);
    }
    fn(wholeOff, localOff, box);
    size_t d = t.shape.size();
    while (d > 0 && ++idx[d - 1] == pieces[d - 1].size())
      idx[--d] = 0;
    if (d == 0)
      return;
  }
}

Status Executor::loadFromWhole(int32_t id, const void *whole) {
  if (!holds(id))
    return Status::ok();
  const TensorInfo &t = plan_->tensor(id);
  // Cut the local part out on the host, then copy it over in one piece.
  void *local = data(id);
  std::vector<uint8_t> host;
  if (!dev_->hostAddressable()) {
    host.resize(static_cast<size_t>(t.bytes));
    local = host.data();
  }
  forEachLocalBox(t, coords(), [&](const auto &wholeOff, const auto &localOff, const auto &box) {
    k::copyBox(whole, t.globalShape, wholeOff, local, t.shape, localOff, box, dtypeSize(t.dtype));
  });
  if (!host.empty()) {
    PTC_RETURN_IF_ERROR(hostSync());
    return dev_->copy(data(id), host.data(), t.bytes, CopyKind::HostToDevice);
  }
  return Status::ok();
}

Status Executor::hostSync() {
  return commOnDevice() ? comm_->drain() : Status::ok();
}

std::vector<std::vector<int>> Executor::collectiveGroups(const LoadedPlan &plan) {
  std::set<std::vector<int>> groups;
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    const auto *ints = inst->ints();
    switch (inst->op()) {
    case OpCode::AllReduce:
    case OpCode::UnscaleGrads:
    case OpCode::ClipGradNorm:
      if (ints && ints->size() > 0)
        groups.insert(std::vector<int>(ints->begin(), ints->end()));
      break;
    case OpCode::AllGather:
    case OpCode::ReduceScatter:
    case OpCode::AllToAll:
    case OpCode::VocabParallelCrossEntropy:
    case OpCode::VocabParallelCrossEntropyGrad:
      groups.insert({static_cast<int>(ints->Get(0))});
      break;
    default:
      break;
    }
  }
  return {groups.begin(), groups.end()};
}

Status Executor::readLocal(int32_t id, void *out) {
  PTC_RETURN_IF_ERROR(hostSync());
  return dev_->copy(out, data(id), plan_->tensor(id).bytes, CopyKind::DeviceToHost);
}

StatusOr<float> Executor::scalar(int32_t id) {
  float value = 0.0f;
  Status s = hostSync();
  if (s.isOk())
    s = dev_->copy(&value, data(id), sizeof value, CopyKind::DeviceToHost);
  if (!s.isOk())
    return s;
  return value;
}

StatusOr<std::vector<float>> Executor::gatherWhole(int32_t id) {
  const TensorInfo &t = plan_->tensor(id);
  bool sharded = std::any_of(t.dimAxes.begin(), t.dimAxes.end(), [](int a) { return a >= 0; });
  // In a pipelined plan the tensor lives on its pipeline rank's processes.
  int home = plan_->pipelined()
                 ? plan_->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(id))->pp_rank()
                 : -1;
  int axis = plan_->pipelineAxis();
  if (home > 0 && axis >= 0)
    sharded = true;
  std::vector<float> mine(static_cast<size_t>(t.numElements));
  if (holds(id))
    PTC_RETURN_IF_ERROR(readLocal(id, mine.data()));
  if (!comm_ || !sharded) {
    if (comm_ && comm_->rank() != 0)
      return std::vector<float>();
    return mine;
  }
  int world = comm_->worldSize();
  std::vector<float> all(comm_->rank() == 0 ? static_cast<size_t>(t.numElements * world) : 0);
  PTC_RETURN_IF_ERROR(comm_->gatherToRoot(mine.data(), t.bytes, all.data()));
  if (comm_->rank() != 0)
    return std::vector<float>();
  int64_t wholeCount = 1;
  for (int64_t d : t.globalShape)
    wholeCount *= d;
  std::vector<float> whole(static_cast<size_t>(wholeCount));
  for (int r = 0; r < world; ++r) {
    if (home >= 0 && axis >= 0 && comm_->mesh().coords(r)[static_cast<size_t>(axis)] != home)
      continue;
    const float *local = all.data() + static_cast<int64_t>(r) * t.numElements;
    forEachLocalBox(t, comm_->mesh().coords(r),
                    [&](const auto &wholeOff, const auto &localOff, const auto &box) {
                      k::copyBox(local, t.shape, localOff, whole.data(), t.globalShape, wholeOff,
                                 box, sizeof(float));
                    });
  }
  return whole;
}

Status Executor::initialize(uint64_t seed) {
  const auto &tensors = plan_->tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (!storage_[i])
      continue;
    if (t.kind == TensorKind::OptimizerState) {
      PTC_RETURN_IF_ERROR(dev_->zero(storage_[i], t.bytes));
      continue;
    }
    if (t.kind != TensorKind::Parameter)
      continue;
    const plan::Tensor *pt = plan_->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
    int64_t wholeCount = 1;
    for (int64_t d : t.globalShape)
      wholeCount *= d;
    // Draw the whole tensor and keep the local part: every layout gets the
    // single-device values.
    std::vector<float> whole(static_cast<size_t>(wholeCount), 0.0f);
    switch (pt->init()) {
    case plan::InitKind::Normal:
      fillNormal(whole.data(), wholeCount, pt->init_std(), seed, t.name);
      break;
    case plan::InitKind::Ones:
      std::fill(whole.begin(), whole.end(), 1.0f);
      break;
    default:
      break;
    }
    PTC_RETURN_IF_ERROR(loadFromWhole(static_cast<int32_t>(i), whole.data()));
  }
  return Status::ok();
}

Status Executor::runInstruction(uint32_t n, std::vector<double> *profile) {
  const plan::Instruction *inst = plan_->plan().instructions()->Get(n);
  if (covered_[n]) // ran with the optimizer group it belongs to
    return Status::ok();
  auto t0 = std::chrono::steady_clock::now();
  Status status;
  if (groupEnd_[n] != 0) {
    status = runOptimizerGroup(n, groupEnd_[n]);
  } else {
    status = awaitPending(*inst);
    if (status.isOk())
      status = run(*inst);
  }
  // Kernels on a GPU run asynchronously: a profile waits for each.
  if (profile && status.isOk() && !dev_->hostAddressable())
    status = dev_->synchronize();
  if (profile) {
    size_t op = static_cast<size_t>(inst->op());
    if (profile->size() <= op)
      profile->resize(op + 1, 0.0);
    (*profile)[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!status.isOk()) {
    std::string loc = inst->location() ? inst->location()->str() : "";
    return Status(status.code(), "instruction #" + std::to_string(n) + " (" +
                                     opcodeName(inst->op()) + (loc.empty() ? "" : " at " + loc) +
                                     "): " + status.message());
  }
  return Status::ok();
}

Status Executor::setInput(int32_t id, const void *wholeBatch) {
  if (!plan_->pipelined())
    return loadFromWhole(id, wholeBatch);
  const TensorInfo &t = plan_->tensor(id);
  int64_t bytes = t.bytes;
  for (size_t d = 0; d < t.shape.size(); ++d)
    bytes = bytes / t.shape[d] * t.globalShape[d];
  bytes *= plan_->microbatches();
  auto &buf = batches_[id];
  buf.assign(static_cast<const uint8_t *>(wholeBatch), static_cast<const uint8_t *>(wholeBatch) + bytes);
  return Status::ok();
}

Status Executor::step(std::vector<double> *profile) {
  if (plan_->pipelined())
    PTC_RETURN_IF_ERROR(runPipelined(profile));
  else
    for (uint32_t n = 0, e = plan_->plan().instructions()->size(); n < e; ++n)
      PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->drain());
  Status s = dev_->synchronize();
  if (!s.isOk())
    return Status(s.code(), "the step's work on " + dev_->describe() + " failed: " + s.message());
  // Nothing waits on this step's events any more.
  pending_.clear();
  lastComm_ = -1;
  dev_->recycleEvents();
  return Status::ok();
}

namespace {
FloatType floatTypeOf(plan::DType d) {
  return d == plan::DType::BF16 ? FloatType::BF16
         : d == plan::DType::F16 ? FloatType::F16
                                 : FloatType::F32;
}
bool isLowPrecision(plan::DType d) { return d == plan::DType::BF16 || d == plan::DType::F16; }
} // namespace

Status Executor::run(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  if (inst.op() == OpCode::Convert) {
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    return dev_->convertFloat(data(in[0]), floatTypeOf(src.dtype), data(out[0]),
                              floatTypeOf(dst.dtype), src.numElements);
  }
  // Mixed precision: bf16 / f16 storage, f32 math. Ops that only move bytes
  // run on the stored type; the others see f32 copies of their low-precision
  // tensors, and their low-precision results are rounded back.
  switch (inst.op()) {
  case OpCode::Reshape:
  case OpCode::Transpose:
  case OpCode::Slice:
  case OpCode::Concat:
  case OpCode::ShardSlice:
  case OpCode::AllGather:
    return runKernel(inst);
  case OpCode::AllReduce:
  case OpCode::ReduceScatter:
    // bf16 gradient reduction: bf16 on the wire.
    if (plan_->tensor(in[0]).dtype == plan::DType::BF16)
      return inst.op() == OpCode::AllReduce ? runBucketAllReduce(inst, /*bf16=*/true)
                                            : runReduceScatter(inst, /*bf16=*/true);
    break;
  default:
    break;
  }
  // fp32 instructions (the common case) go straight to their kernel.
  auto isLow = [&](int32_t id) { return isLowPrecision(plan_->tensor(id).dtype); };
  if (std::none_of(in.begin(), in.end(), isLow) && std::none_of(out.begin(), out.end(), isLow))
    return runKernel(inst);
  if (inst.op() == OpCode::Matmul && !dev_->hostAddressable()) {
    // bf16 / f16 operands and result: tensor cores with f32 accumulation.
    plan::DType t = plan_->tensor(out[0]).dtype;
    if (plan_->tensor(in[0]).dtype == t && plan_->tensor(in[1]).dtype == t) {
      Status s = dev_->matmulLowPrecision(floatTypeOf(t), data(in[0]), plan_->tensor(in[0]).shape,
                                          data(in[1]), plan_->tensor(in[1]).shape, data(out[0]),
                                          inst.ints()->Get(0) != 0, inst.ints()->Get(1) != 0);
      if (s.code() != StatusCode::kUnimplemented)
        return s;
    }
  }
  std::vector<int32_t> low;
  for (const auto *ids : {&in, &out})
    for (int32_t id : *ids)
      if (isLow(id) && std::find(low.begin(), low.end(), id) == low.end())
        low.push_back(id);
  while (widened_.size() < low.size())
    widened_.emplace_back(dev_.get());
  for (size_t i = 0; i < low.size(); ++i)
    PTC_RETURN_IF_ERROR(widened_[i].reserve(plan_->tensor(low[i]).numElements * 4));
  std::vector<void *> saved;
  for (size_t i = 0; i < low.size(); ++i) {
    const TensorInfo &t = plan_->tensor(low[i]);
    PTC_RETURN_IF_ERROR(dev_->convertFloat(data(low[i]), floatTypeOf(t.dtype), widened_[i].data(),
                                           FloatType::F32, t.numElements));
    saved.push_back(storage_[static_cast<size_t>(low[i])]);
    storage_[static_cast<size_t>(low[i])] = widened_[i].data();
  }
  Status status = runKernel(inst);
  for (size_t i = 0; i < low.size(); ++i) {
    storage_[static_cast<size_t>(low[i])] = saved[i];
    if (status.isOk() && std::find(out.begin(), out.end(), low[i]) != out.end())
      status = dev_->convertFloat(widened_[i].data(), FloatType::F32, data(low[i]),
                                  floatTypeOf(plan_->tensor(low[i]).dtype),
                                  plan_->tensor(low[i]).numElements);
  }
  return status;
}

Status Executor::blocksForReduceScatter(const plan::Instruction &inst, void *staging,
                                        int64_t elementBytes) {
  const TensorInfo &src = plan_->tensor((*inst.inputs())[0]);
  const TensorInfo &dst = plan_->tensor((*inst.outputs())[0]);
  size_t dim = static_cast<size_t>(inst.ints()->Get(1));
  int parts = plan_->meshSizes()[static_cast<size_t>(inst.ints()->Get(0))];
  std::vector<int64_t> offsets(src.shape.size(), 0), zero(src.shape.size(), 0);
  for (int p = 0; p < parts; ++p) {
    offsets[dim] = p * dst.shape[dim];
    PTC_RETURN_IF_ERROR(dev_->copyBox(data((*inst.inputs())[0]), src.shape, offsets,
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
  for (const auto *ids : {inst.inputs(), inst.outputs()})
    for (int32_t id : *ids)
      PTC_RETURN_IF_ERROR(awaitTensor(id));
  return Status::ok();
}

Status Executor::runBucketAllReduce(const plan::Instruction &inst, bool bf16) {
  // One bucket: pack, sum once, unpack.
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  std::string what = inst.location() ? inst.location()->str() : "";
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  int64_t total = 0;
  for (int32_t id : in)
    total += plan_->tensor(id).bytes;
  PTC_RETURN_IF_ERROR(reuseStaging());
  PTC_RETURN_IF_ERROR(staging_.reserve(total));
  uint8_t *staging = static_cast<uint8_t *>(staging_.data());
  int64_t off = 0;
  for (int32_t id : in) {
    PTC_RETURN_IF_ERROR(dev_->copy(staging + off, data(id), plan_->tensor(id).bytes,
                                   CopyKind::DeviceToDevice));
    off += plan_->tensor(id).bytes;
  }
  if (comm_) {
    PTC_RETURN_IF_ERROR(enterComm());
    auto view = commView(staging, total, 0, true);
    if (!view.isOk())
      return view.status();
    std::string bucket = "a " + std::to_string(total) + "-byte " + (bf16 ? "bf16 " : "") +
                         "bucket at " + what;
    PTC_RETURN_IF_ERROR(bf16 ? comm_->allReduceSumBf16(static_cast<uint16_t *>(*view), total / 2,
                                                        axes, bucket)
                             : comm_->allReduceSum(static_cast<float *>(*view), total / 4, axes,
                                                   bucket));
    PTC_RETURN_IF_ERROR(commWriteBack(staging, *view, total));
  }
  // Unpacked on the stream the sum ran on.
  StreamKind stream = commOnDevice() ? StreamKind::Communication : StreamKind::Compute;
  off = 0;
  std::vector<int32_t> results;
  for (int32_t id : out) {
    PTC_RETURN_IF_ERROR(dev_->copyOn(stream, data(id), staging + off, plan_->tensor(id).bytes));
    off += plan_->tensor(id).bytes;
    results.push_back(id);
  }
  return leaveComm(results, /*overlap=*/true);
}

Status Executor::runReduceScatter(const plan::Instruction &inst, bool bf16) {
  // Lay the input out as one contiguous block per group member, then sum-scatter.
  const TensorInfo &src = plan_->tensor((*inst.inputs())[0]);
  int32_t outId = (*inst.outputs())[0];
  const TensorInfo &dst = plan_->tensor(outId);
  int axis = static_cast<int>(inst.ints()->Get(0));
  std::string what = "'" + src.name + "' at " + (inst.location() ? inst.location()->str() : "");
  PTC_RETURN_IF_ERROR(reuseStaging());
  PTC_RETURN_IF_ERROR(staging_.reserve(src.bytes));
  PTC_RETURN_IF_ERROR(blocksForReduceScatter(inst, staging_.data(), dtypeSize(src.dtype)));
  if (!comm_)
    return dev_->copy(data(outId), staging_.data(), dst.bytes, CopyKind::DeviceToDevice);
  PTC_RETURN_IF_ERROR(enterComm());
  auto in = commView(staging_.data(), src.bytes, 0, true);
  if (!in.isOk())
    return in.status();
  auto outView = commView(data(outId), dst.bytes, 1, false);
  if (!outView.isOk())
    return outView.status();
  PTC_RETURN_IF_ERROR(
      bf16 ? comm_->reduceScatterSumBf16(static_cast<const uint16_t *>(*in),
                                         static_cast<uint16_t *>(*outView), dst.numElements, axis,
                                         what)
           : comm_->reduceScatterSum(static_cast<const float *>(*in),
                                     static_cast<float *>(*outView), dst.numElements, axis, what));
  PTC_RETURN_IF_ERROR(commWriteBack(data(outId), *outView, dst.bytes));
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

namespace {
/// The activation a Unary / UnaryGrad instruction names (the loader checked it).
UnaryFunction unaryFunctionOf(const plan::Instruction &inst) {
  return *kernels::lookupUnaryFunction(inst.function()->string_view());
}
} // namespace

Status Executor::runKernel(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  auto T = [&](int32_t id) -> const TensorInfo & { return plan_->tensor(id); };
  auto I = [&](size_t i) { return f32(in[static_cast<flatbuffers::uoffset_t>(i)]); };
  auto O = [&](size_t i) { return f32(out[static_cast<flatbuffers::uoffset_t>(i)]); };
  auto IS = [&](size_t i) -> const Shape & { return T(in[static_cast<flatbuffers::uoffset_t>(i)]).shape; };
  auto OS = [&](size_t i) -> const Shape & { return T(out[static_cast<flatbuffers::uoffset_t>(i)]).shape; };
  auto N = [&](size_t i) { return T(in[static_cast<flatbuffers::uoffset_t>(i)]).numElements; };
  auto ints = [&]() {
    return inst.ints() ? std::vector<int64_t>(inst.ints()->begin(), inst.ints()->end())
                       : std::vector<int64_t>();
  };
  auto F = [&](size_t i) { return static_cast<float>(inst.floats()->Get(static_cast<flatbuffers::uoffset_t>(i))); };
  auto ids = [&](size_t i) { return i32(in[static_cast<flatbuffers::uoffset_t>(i)]); };
  Device &d = *dev_;

  switch (inst.op()) {
  case OpCode::Add:
  case OpCode::Sub:
  case OpCode::Mul:
  case OpCode::Div: {
    BinaryOp kind = inst.op() == OpCode::Add   ? BinaryOp::Add
                    : inst.op() == OpCode::Sub ? BinaryOp::Sub
                    : inst.op() == OpCode::Mul ? BinaryOp::Mul
                                               : BinaryOp::Div;
    return d.binary(kind, I(0), IS(0), I(1), IS(1), O(0), OS(0));
  }
  case OpCode::Scale:
    return d.scale(I(0), O(0), N(0), F(0));
  case OpCode::Unary:
    return d.unary(unaryFunctionOf(inst), I(0), O(0), N(0));
  case OpCode::Convert:
  case OpCode::Reshape:
    return d.copy(data(out[0]), data(in[0]), T(in[0]).bytes, CopyKind::DeviceToDevice);
  case OpCode::Matmul: {
    auto a = ints();
    return d.matmul(I(0), IS(0), I(1), IS(1), O(0), a[0] != 0, a[1] != 0);
  }
  case OpCode::LayerNorm: {
    int64_t cols = IS(0).back();
    return d.layerNorm(I(0), I(1), I(2), O(0), N(0) / cols, cols, F(0));
  }
  case OpCode::LayerNormGrad: {
    int64_t cols = IS(0).back();
    return d.layerNormGrad(I(0), I(1), I(2), O(0), O(1), O(2), N(0) / cols, cols, F(0));
  }
  case OpCode::Softmax:
    return d.softmax(I(0), O(0), IS(0), ints()[0]);
  case OpCode::SoftmaxGrad:
    return d.softmaxGrad(I(0), I(1), O(0), IS(0), ints()[0]);
  case OpCode::CausalAttention:
    return d.causalAttention(I(0), I(1), I(2), O(0), IS(0), F(0));
  case OpCode::CausalAttentionGrad:
    return d.causalAttentionGrad(I(0), I(1), I(2), I(3), O(0), O(1), O(2), IS(0), F(0));
  case OpCode::Embedding:
  case OpCode::EmbeddingGrad: {
    // A vocabulary-parallel table is this device's block of rows.
    bool grad = inst.op() == OpCode::EmbeddingGrad;
    int64_t rows = grad ? OS(0)[0] : IS(0)[0], dim = grad ? OS(0)[1] : IS(0)[1];
    int64_t offset = 0, total = rows;
    if (inst.ints() && inst.ints()->size() == 1) {
      size_t axis = static_cast<size_t>(inst.ints()->Get(0));
      offset = coords()[axis] * rows;
      total = rows * plan_->meshSizes()[axis];
    }
    return grad ? d.embeddingGrad(ids(0), N(0), I(1), O(0), rows, dim, offset, total)
                : d.embedding(I(0), rows, dim, ids(1), N(1), O(0), offset, total);
  }
  case OpCode::VocabParallelCrossEntropy:
  case OpCode::VocabParallelCrossEntropyGrad:
    return runVocabParallelCrossEntropy(inst);
  case OpCode::CrossEntropy: {
    int64_t classes = IS(0).back();
    return d.crossEntropy(I(0), ids(1), N(0) / classes, classes, O(0));
  }
  case OpCode::CrossEntropyGrad: {
    int64_t classes = IS(0).back();
    return d.crossEntropyGrad(I(0), ids(1), I(2), N(0) / classes, classes, O(0));
  }
  case OpCode::Transpose:
    return d.transpose(data(in[0]), IS(0), data(out[0]), ints(), dtypeSize(T(in[0]).dtype));
  case OpCode::Slice:
    return d.copyBox(data(in[0]), IS(0), ints(), data(out[0]), OS(0),
                     Shape(OS(0).size(), 0), OS(0), dtypeSize(T(in[0]).dtype));
  case OpCode::Pad:
    return d.pad(I(0), IS(0), O(0), OS(0), ints());
  case OpCode::Concat: {
    std::vector<const void *> ptrs;
    std::vector<Shape> shapes;
    for (size_t i = 0; i < in.size(); ++i) {
      ptrs.push_back(data(in[static_cast<flatbuffers::uoffset_t>(i)]));
      shapes.push_back(IS(i));
    }
    return d.concat(ptrs, shapes, data(out[0]), ints()[0], dtypeSize(T(out[0]).dtype));
  }
  case OpCode::ReduceSum:
  case OpCode::ReduceMean:
  case OpCode::ReduceMax: {
    ReduceOp kind = inst.op() == OpCode::ReduceSum    ? ReduceOp::Sum
                    : inst.op() == OpCode::ReduceMean ? ReduceOp::Mean
                                                      : ReduceOp::Max;
    return d.reduce(kind, I(0), IS(0), ints(), O(0));
  }
  case OpCode::ReduceMaxGrad:
    return d.reduceMaxGrad(I(0), IS(0), ints(), I(1), O(0));
  case OpCode::Broadcast:
    return d.broadcastTo(I(0), IS(0), O(0), OS(0));
  case OpCode::UnaryGrad:
    return d.unaryGrad(unaryFunctionOf(inst), I(0), I(1), O(0), N(0));
  case OpCode::TopKGate: {
    auto a = ints();
    return d.topKGate(I(0), IS(0)[0], IS(0)[1], a[0], a[1] != 0, O(0), i32(out[1]));
  }
  case OpCode::TopKGateGrad:
    return d.topKGateGrad(I(0), ids(1), I(2), IS(0)[0], IS(0)[1], IS(1)[1], ints()[0] != 0, O(0));
  case OpCode::MoeDispatch:
    return d.moeDispatch(I(0), ids(1), IS(1)[0], IS(1)[1], IS(0)[1], OS(0)[0], OS(0)[1], O(0));
  case OpCode::MoeDispatchGrad:
    return d.moeDispatchGrad(I(0), ids(1), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0], IS(0)[1],
                             O(0));
  case OpCode::MoeCombine:
    return d.moeCombine(I(0), I(1), ids(2), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0], IS(0)[1],
                        O(0));
  case OpCode::MoeCombineGrad:
    return d.moeCombineGrad(I(0), I(1), ids(2), I(3), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0],
                            IS(0)[1], O(0), O(1));
  case OpCode::AdamWUpdate: {
    // An optional 6th input: the overflow flag of dynamic loss scaling (the
    // step then changes nothing).
    const float *skip = in.size() > 5 ? I(5) : nullptr;
    return d.adamwUpdate(I(0), I(1), I(2), I(3), I(4), AdamWParams{F(0), F(1), F(2), F(3), F(4)},
                         N(0), skip, O(0), O(1), O(2));
  }
  case OpCode::SgdUpdate: {
    const float *skip = in.size() > 3 ? I(3) : nullptr;
    return d.sgdUpdate(I(0), I(1), I(2), F(0), F(1), F(2), N(0), skip, O(0), O(1));
  }
  case OpCode::LossScale: {
    // Once per step on a scalar: computed on the host.
    auto exponent = scalar(in[0]);
    if (!exponent.isOk())
      return exponent.status();
    float value = static_cast<float>(F(0) * std::exp2(static_cast<double>(*exponent)));
    return d.copy(O(0), &value, sizeof value, CopyKind::HostToDevice);
  }
  case OpCode::LossScaleUpdate: {
    float state[3];
    for (size_t i = 0; i < 3; ++i) {
      auto v = scalar(in[static_cast<flatbuffers::uoffset_t>(i)]);
      if (!v.isOk())
        return v.status();
      state[i] = *v;
    }
    float exponent = state[0], good = state[1];
    if (state[2] != 0.0f) {
      exponent -= 1.0f;
      good = 0.0f;
    } else if ((good += 1.0f) >= static_cast<float>(inst.ints()->Get(0))) {
      exponent += 1.0f;
      good = 0.0f;
    }
    PTC_RETURN_IF_ERROR(d.copy(O(0), &exponent, sizeof exponent, CopyKind::HostToDevice));
    return d.copy(O(1), &good, sizeof good, CopyKind::HostToDevice);
  }
  case OpCode::UnscaleGrads: {
    size_t n = in.size() - 1;
    std::vector<const float *> grads;
    std::vector<float *> outs;
    std::vector<int64_t> sizes;
    for (size_t t = 0; t < n; ++t) {
      grads.push_back(I(t));
      outs.push_back(O(t));
      sizes.push_back(N(t));
    }
    PTC_RETURN_IF_ERROR(d.unscale(grads, sizes, outs, I(n), O(n)));
    if (inst.ints() && inst.ints()->size() > 0 && comm_) {
      std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
      return allReduceSmall(O(n), 1, axes, /*max=*/true, "the gradient overflow flag");
    }
    return Status::ok();
  }
  case OpCode::AllReduce:
  case OpCode::AllGather:
  case OpCode::ShardSlice:
  case OpCode::ReduceScatter:
  case OpCode::AllToAll:
    return runCollective(inst);
  case OpCode::ClipGradNorm: {
    std::vector<const float *> grads;
    std::vector<float *> outs;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < in.size(); ++i) {
      grads.push_back(I(i));
      outs.push_back(O(i));
      sizes.push_back(N(i));
    }
    // The norm output holds the sum of squares until the clip replaces it.
    float *norm = O(in.size());
    PTC_RETURN_IF_ERROR(d.sumOfSquares(grads, sizes, norm));
    if (inst.ints() && inst.ints()->size() > 0 && comm_) {
      // The other gradients live on other ranks (pipeline stages): sum there too.
      std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
      PTC_RETURN_IF_ERROR(allReduceSmall(norm, 1, axes, /*max=*/false, "the gradient norm"));
    }
    return d.clipByNorm(grads, sizes, outs, F(0), norm, norm);
  }
  case OpCode::MicrobatchSum:
    return d.binary(BinaryOp::Add, O(0), OS(0), I(0), IS(0), O(0), OS(0));
  case OpCode::Send:
  case OpCode::Recv:
    return error(StatusCode::kInternal, "point-to-point instructions run as schedule actions");
  }
  return error(StatusCode::kUnimplemented, "opcode ", static_cast<int>(inst.op()),
               " has no kernel on ", d.describe());
}

Status Executor::runVocabParallelCrossEntropy(const plan::Instruction &inst) {
  // Megatron's parallel cross-entropy: each device holds a block of classes;
  // the row maximum, sum of exponentials and target logit are combined over
  // the group, so no device needs all logits.
  const auto &in = *inst.inputs();
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
  float *out = f32((*inst.outputs())[0]);
  if (inst.op() == OpCode::VocabParallelCrossEntropy) {
    PTC_RETURN_IF_ERROR(d.targetLogit(x, t, rows, classes, offset, total, target));
    if (comm_)
      PTC_RETURN_IF_ERROR(allReduceSmall(target, rows, {axis}, /*max=*/false, what));
    return d.lossFromParts(mx, sum, target, rows, out);
  }
  return d.vocabParallelGrad(x, t, f32(in[2]), mx, sum, rows, classes, offset, total, out);
}

Status Executor::runCollective(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  std::string what = inst.location() ? inst.location()->str() : "";
  Device &d = *dev_;
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
