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
constexpr size_t kAlignment = 64;

uint8_t *allocateAligned(int64_t bytes) {
  size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlignment - 1) /
                kAlignment * kAlignment;
  void *p = std::aligned_alloc(kAlignment, size);
  if (p)
    std::memset(p, 0, size);
  return static_cast<uint8_t *>(p);
}

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
                                                     int pipelineRank) {
  std::unique_ptr<Executor> ex(new Executor(plan));
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
  uint8_t *arena = allocateAligned(ex->arenaBytes_);
  if (!arena)
    return error(StatusCode::kInternal, "cannot allocate the ", ex->arenaBytes_, "-byte arena");
  ex->buffers_.emplace_back(arena, std::free);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (t.kind == TensorKind::Temporary && here[i]) {
      if (t.arenaOffset + t.bytes > ex->arenaBytes_)
        return invalidArgument("tensor #", i, " at arena offset ", t.arenaOffset,
                               " lies outside pipeline rank ", pipelineRank, "'s ",
                               ex->arenaBytes_, "-byte arena");
      ex->storage_[i] = arena + t.arenaOffset;
      continue;
    }
    if (!here[i] && !isOutput[i])
      continue;
    uint8_t *buf = allocateAligned(t.bytes);
    if (!buf)
      return error(StatusCode::kInternal, "cannot allocate ", t.bytes, " bytes for '", t.name, "'");
    ex->buffers_.emplace_back(buf, std::free);
    ex->storage_[i] = buf;
    ex->persistentBytes_ += t.bytes;
    if (t.kind == TensorKind::Temporary)
      continue; // another pipeline rank's output, received after each step
    if (t.kind == TensorKind::Constant) {
      const auto *data = plan->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i))->data();
      int64_t elem = dtypeSize(t.dtype);
      if (static_cast<int64_t>(data->size()) == t.bytes)
        std::memcpy(buf, data->data(), static_cast<size_t>(t.bytes));
      else // splat
        for (int64_t e = 0; e < t.numElements; ++e)
          std::memcpy(buf + e * elem, data->data(), static_cast<size_t>(elem));
    }
  }
  if (plan->pipelined())
    PTC_RETURN_IF_ERROR(ex->preparePipeline());
  return ex;
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

void Executor::loadFromWhole(int32_t id, const void *whole) {
  if (!holds(id))
    return;
  const TensorInfo &t = plan_->tensor(id);
  forEachLocalBox(t, coords(), [&](const auto &wholeOff, const auto &localOff, const auto &box) {
    k::copyBox(whole, t.globalShape, wholeOff, data(id), t.shape, localOff, box,
               dtypeSize(t.dtype));
  });
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
  if (!comm_ || !sharded) {
    if (comm_ && comm_->rank() != 0)
      return std::vector<float>();
    return std::vector<float>(f32(id), f32(id) + t.numElements);
  }
  int world = comm_->worldSize();
  std::vector<float> all(comm_->rank() == 0 ? static_cast<size_t>(t.numElements * world) : 0);
  std::vector<float> none(holds(id) ? 0 : static_cast<size_t>(t.numElements));
  PTC_RETURN_IF_ERROR(comm_->gatherToRoot(holds(id) ? data(id) : none.data(), t.bytes, all.data()));
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

void Executor::initialize(uint64_t seed) {
  const auto &tensors = plan_->tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (!storage_[i])
      continue;
    if (t.kind == TensorKind::OptimizerState) {
      std::memset(storage_[i], 0, static_cast<size_t>(t.bytes));
      continue;
    }
    if (t.kind != TensorKind::Parameter)
      continue;
    const plan::Tensor *pt = plan_->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
    float *p = static_cast<float *>(storage_[i]);
    switch (pt->init()) {
    case plan::InitKind::Normal: {
      // Draw the whole tensor and keep the local part: every layout gets the
      // single-device values.
      int64_t wholeCount = 1;
      for (int64_t d : t.globalShape)
        wholeCount *= d;
      if (wholeCount == t.numElements) {
        fillNormal(p, t.numElements, pt->init_std(), seed, t.name);
      } else {
        std::vector<float> whole(static_cast<size_t>(wholeCount));
        fillNormal(whole.data(), wholeCount, pt->init_std(), seed, t.name);
        loadFromWhole(static_cast<int32_t>(i), whole.data());
      }
      break;
    }
    case plan::InitKind::Ones:
      std::fill(p, p + t.numElements, 1.0f);
      break;
    default:
      std::fill(p, p + t.numElements, 0.0f);
      break;
    }
  }
}

Status Executor::runInstruction(uint32_t n, std::vector<double> *profile) {
  const plan::Instruction *inst = plan_->plan().instructions()->Get(n);
  auto t0 = std::chrono::steady_clock::now();
  Status status = run(*inst);
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

void Executor::setInput(int32_t id, const void *wholeBatch) {
  if (!plan_->pipelined()) {
    loadFromWhole(id, wholeBatch);
    return;
  }
  const TensorInfo &t = plan_->tensor(id);
  int64_t bytes = t.bytes;
  for (size_t d = 0; d < t.shape.size(); ++d)
    bytes = bytes / t.shape[d] * t.globalShape[d];
  bytes *= plan_->microbatches();
  auto &buf = batches_[id];
  buf.assign(static_cast<const uint8_t *>(wholeBatch), static_cast<const uint8_t *>(wholeBatch) + bytes);
}

Status Executor::step(std::vector<double> *profile) {
  if (plan_->pipelined())
    return runPipelined(profile);
  for (uint32_t n = 0, e = plan_->plan().instructions()->size(); n < e; ++n)
    PTC_RETURN_IF_ERROR(runInstruction(n, profile));
  return Status::ok();
}

namespace {
k::FloatType floatTypeOf(plan::DType d) {
  return d == plan::DType::BF16 ? k::FloatType::BF16
         : d == plan::DType::F16 ? k::FloatType::F16
                                 : k::FloatType::F32;
}
bool isLowPrecision(plan::DType d) { return d == plan::DType::BF16 || d == plan::DType::F16; }
} // namespace

Status Executor::run(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  if (inst.op() == OpCode::Convert) {
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    k::convertFloat(data(in[0]), floatTypeOf(src.dtype), data(out[0]), floatTypeOf(dst.dtype),
                    src.numElements);
    return Status::ok();
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
      return runBf16Reduction(inst);
    break;
  default:
    break;
  }
  // fp32 instructions (the common case) go straight to their kernel.
  auto isLow = [&](int32_t id) { return isLowPrecision(plan_->tensor(id).dtype); };
  if (std::none_of(in.begin(), in.end(), isLow) && std::none_of(out.begin(), out.end(), isLow))
    return runKernel(inst);
  std::vector<int32_t> low;
  for (const auto *ids : {&in, &out})
    for (int32_t id : *ids)
      if (isLow(id) && std::find(low.begin(), low.end(), id) == low.end())
        low.push_back(id);
  if (widened_.size() < low.size())
    widened_.resize(low.size());
  std::vector<void *> saved;
  for (size_t i = 0; i < low.size(); ++i) {
    const TensorInfo &t = plan_->tensor(low[i]);
    widened_[i].resize(static_cast<size_t>(t.numElements));
    k::convertFloat(data(low[i]), floatTypeOf(t.dtype), widened_[i].data(), k::FloatType::F32,
                    t.numElements);
    saved.push_back(storage_[static_cast<size_t>(low[i])]);
    storage_[static_cast<size_t>(low[i])] = widened_[i].data();
  }
  Status status = runKernel(inst);
  for (size_t i = 0; i < low.size(); ++i) {
    storage_[static_cast<size_t>(low[i])] = saved[i];
    if (std::find(out.begin(), out.end(), low[i]) != out.end())
      k::convertFloat(widened_[i].data(), k::FloatType::F32, data(low[i]),
                      floatTypeOf(plan_->tensor(low[i]).dtype), plan_->tensor(low[i]).numElements);
  }
  return status;
}

void Executor::blocksForReduceScatter(const plan::Instruction &inst, void *staging,
                                      size_t elementBytes) {
  const TensorInfo &src = plan_->tensor((*inst.inputs())[0]);
  const TensorInfo &dst = plan_->tensor((*inst.outputs())[0]);
  size_t dim = static_cast<size_t>(inst.ints()->Get(1));
  int parts = plan_->meshSizes()[static_cast<size_t>(inst.ints()->Get(0))];
  std::vector<int64_t> offsets(src.shape.size(), 0);
  for (int p = 0; p < parts; ++p) {
    offsets[dim] = p * dst.shape[dim];
    k::sliceCopy(data((*inst.inputs())[0]), src.shape,
                 static_cast<uint8_t *>(staging) + p * dst.numElements * static_cast<int64_t>(elementBytes),
                 dst.shape, offsets, elementBytes, /*toSmall=*/true);
  }
}

Status Executor::runBf16Reduction(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  std::string what = inst.location() ? inst.location()->str() : "";
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  if (inst.op() == OpCode::AllReduce) {
    int64_t total = 0;
    for (int32_t id : in)
      total += plan_->tensor(id).numElements;
    staging16_.resize(static_cast<size_t>(total));
    int64_t off = 0;
    for (int32_t id : in) {
      std::memcpy(staging16_.data() + off, data(id), static_cast<size_t>(plan_->tensor(id).bytes));
      off += plan_->tensor(id).numElements;
    }
    if (comm_)
      PTC_RETURN_IF_ERROR(comm_->allReduceSumBf16(staging16_.data(), total, axes,
                                                  "a " + std::to_string(total * 2) +
                                                      "-byte bf16 bucket at " + what));
    off = 0;
    for (int32_t id : out) {
      std::memcpy(data(id), staging16_.data() + off, static_cast<size_t>(plan_->tensor(id).bytes));
      off += plan_->tensor(id).numElements;
    }
    return Status::ok();
  }
  const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
  staging16_.resize(static_cast<size_t>(src.numElements));
  blocksForReduceScatter(inst, staging16_.data(), sizeof(uint16_t));
  if (comm_)
    return comm_->reduceScatterSumBf16(staging16_.data(), static_cast<uint16_t *>(data(out[0])),
                                       dst.numElements, axes[0], "'" + src.name + "' at " + what);
  std::memcpy(data(out[0]), staging16_.data(), static_cast<size_t>(dst.bytes));
  return Status::ok();
}

Status Executor::runKernel(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  auto T = [&](int32_t id) -> const TensorInfo & { return plan_->tensor(id); };
  auto I = [&](size_t i) { return f32(in[static_cast<flatbuffers::uoffset_t>(i)]); };
  auto O = [&](size_t i) { return f32(out[static_cast<flatbuffers::uoffset_t>(i)]); };
  auto IS = [&](size_t i) -> const k::Shape & { return T(in[static_cast<flatbuffers::uoffset_t>(i)]).shape; };
  auto OS = [&](size_t i) -> const k::Shape & { return T(out[static_cast<flatbuffers::uoffset_t>(i)]).shape; };
  auto N = [&](size_t i) { return T(in[static_cast<flatbuffers::uoffset_t>(i)]).numElements; };
  auto ints = [&]() {
    return inst.ints() ? std::vector<int64_t>(inst.ints()->begin(), inst.ints()->end())
                       : std::vector<int64_t>();
  };
  auto F = [&](size_t i) { return static_cast<float>(inst.floats()->Get(static_cast<flatbuffers::uoffset_t>(i))); };
  auto ids = [&](size_t i) { return i32(in[static_cast<flatbuffers::uoffset_t>(i)]); };

  switch (inst.op()) {
  case OpCode::Add:
  case OpCode::Sub:
  case OpCode::Mul:
  case OpCode::Div: {
    k::Binary kind = inst.op() == OpCode::Add   ? k::Binary::Add
                     : inst.op() == OpCode::Sub ? k::Binary::Sub
                     : inst.op() == OpCode::Mul ? k::Binary::Mul
                                                : k::Binary::Div;
    k::binary(kind, I(0), IS(0), I(1), IS(1), O(0), OS(0));
    return Status::ok();
  }
  case OpCode::Scale:
    k::scale(I(0), O(0), N(0), F(0));
    return Status::ok();
  case OpCode::Gelu:
    k::gelu(I(0), O(0), N(0));
    return Status::ok();
  case OpCode::Relu:
    k::relu(I(0), O(0), N(0));
    return Status::ok();
  case OpCode::Convert:
  case OpCode::Reshape:
    k::copy(data(in[0]), data(out[0]), T(in[0]).bytes);
    return Status::ok();
  case OpCode::Matmul: {
    auto a = ints();
    k::matmul(I(0), IS(0), I(1), IS(1), O(0), a[0] != 0, a[1] != 0);
    return Status::ok();
  }
  case OpCode::LayerNorm: {
    int64_t cols = IS(0).back();
    k::layerNorm(I(0), I(1), I(2), O(0), N(0) / cols, cols, F(0));
    return Status::ok();
  }
  case OpCode::LayerNormGrad: {
    int64_t cols = IS(0).back();
    k::layerNormGrad(I(0), I(1), I(2), O(0), O(1), O(2), N(0) / cols, cols, F(0));
    return Status::ok();
  }
  case OpCode::Softmax:
    k::softmax(I(0), O(0), IS(0), ints()[0]);
    return Status::ok();
  case OpCode::SoftmaxGrad:
    k::softmaxGrad(I(0), I(1), O(0), IS(0), ints()[0]);
    return Status::ok();
  case OpCode::CausalAttention:
    k::causalAttention(I(0), I(1), I(2), O(0), IS(0), F(0));
    return Status::ok();
  case OpCode::CausalAttentionGrad:
    k::causalAttentionGrad(I(0), I(1), I(2), I(3), O(0), O(1), O(2), IS(0), F(0));
    return Status::ok();
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
    return grad ? k::embeddingGrad(ids(0), N(0), I(1), O(0), rows, dim, offset, total)
                : k::embedding(I(0), rows, dim, ids(1), N(1), O(0), offset, total);
  }
  case OpCode::VocabParallelCrossEntropy:
  case OpCode::VocabParallelCrossEntropyGrad:
    return runVocabParallelCrossEntropy(inst);
  case OpCode::CrossEntropy: {
    int64_t classes = IS(0).back();
    return k::crossEntropy(I(0), ids(1), N(0) / classes, classes, O(0));
  }
  case OpCode::CrossEntropyGrad: {
    int64_t classes = IS(0).back();
    return k::crossEntropyGrad(I(0), ids(1), I(2), N(0) / classes, classes, O(0));
  }
  case OpCode::Transpose:
    k::transpose(data(in[0]), IS(0), data(out[0]), ints(), dtypeSize(T(in[0]).dtype));
    return Status::ok();
  case OpCode::Slice:
    k::sliceCopy(data(in[0]), IS(0), data(out[0]), OS(0), ints(), dtypeSize(T(in[0]).dtype),
                 /*toSmall=*/true);
    return Status::ok();
  case OpCode::Pad:
    k::pad(I(0), IS(0), O(0), OS(0), ints());
    return Status::ok();
  case OpCode::Concat: {
    std::vector<const void *> ptrs;
    std::vector<k::Shape> shapes;
    for (size_t i = 0; i < in.size(); ++i) {
      ptrs.push_back(data(in[static_cast<flatbuffers::uoffset_t>(i)]));
      shapes.push_back(IS(i));
    }
    k::concat(ptrs, shapes, data(out[0]), ints()[0], dtypeSize(T(out[0]).dtype));
    return Status::ok();
  }
  case OpCode::ReduceSum:
  case OpCode::ReduceMean:
  case OpCode::ReduceMax: {
    k::Reduce kind = inst.op() == OpCode::ReduceSum    ? k::Reduce::Sum
                     : inst.op() == OpCode::ReduceMean ? k::Reduce::Mean
                                                       : k::Reduce::Max;
    k::reduce(kind, I(0), IS(0), ints(), O(0));
    return Status::ok();
  }
  case OpCode::ReduceMaxGrad:
    k::reduceMaxGrad(I(0), IS(0), ints(), I(1), O(0));
    return Status::ok();
  case OpCode::Broadcast:
    k::broadcastTo(I(0), IS(0), O(0), OS(0));
    return Status::ok();
  case OpCode::GeluGrad:
    k::geluGrad(I(0), I(1), O(0), N(0));
    return Status::ok();
  case OpCode::ReluGrad:
    k::reluGrad(I(0), I(1), O(0), N(0));
    return Status::ok();
  case OpCode::TopKGate: {
    auto a = ints();
    k::topKGate(I(0), IS(0)[0], IS(0)[1], a[0], a[1] != 0, O(0), i32(out[1]));
    return Status::ok();
  }
  case OpCode::TopKGateGrad:
    return k::topKGateGrad(I(0), ids(1), I(2), IS(0)[0], IS(0)[1], IS(1)[1], ints()[0] != 0, O(0));
  case OpCode::MoeDispatch:
    return k::moeDispatch(I(0), ids(1), IS(1)[0], IS(1)[1], IS(0)[1], OS(0)[0], OS(0)[1], O(0));
  case OpCode::MoeDispatchGrad:
    return k::moeDispatchGrad(I(0), ids(1), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0], IS(0)[1],
                              O(0));
  case OpCode::MoeCombine:
    return k::moeCombine(I(0), I(1), ids(2), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0], IS(0)[1],
                         O(0));
  case OpCode::MoeCombineGrad:
    return k::moeCombineGrad(I(0), I(1), ids(2), I(3), IS(1)[0], IS(1)[1], IS(0)[2], IS(0)[0],
                             IS(0)[1], O(0), O(1));
  case OpCode::AdamWUpdate:
  case OpCode::SgdUpdate: {
    bool adam = inst.op() == OpCode::AdamWUpdate;
    size_t base = adam ? 5 : 3;
    if (in.size() > base && *I(base) != 0.0f) {
      // Dynamic loss scaling found an overflow: the step changes nothing
      // (outputs that are not the inputs themselves get their values).
      const size_t from[] = {0, 2, 3};
      for (size_t o = 0; o < out.size(); ++o)
        if (out[static_cast<flatbuffers::uoffset_t>(o)] != in[static_cast<flatbuffers::uoffset_t>(from[o])])
          std::memcpy(O(o), I(from[o]), static_cast<size_t>(N(from[o])) * sizeof(float));
      return Status::ok();
    }
    if (adam)
      k::adamwUpdate(I(0), I(1), I(2), I(3), *I(4), k::AdamW{F(0), F(1), F(2), F(3), F(4)}, N(0),
                     O(0), O(1), O(2));
    else
      k::sgdUpdate(I(0), I(1), I(2), F(0), F(1), F(2), N(0), O(0), O(1));
    return Status::ok();
  }
  case OpCode::LossScale:
    *O(0) = static_cast<float>(F(0) * std::exp2(static_cast<double>(*I(0))));
    return Status::ok();
  case OpCode::LossScaleUpdate: {
    float exponent = *I(0), good = *I(1);
    if (*I(2) != 0.0f) {
      exponent -= 1.0f;
      good = 0.0f;
    } else if ((good += 1.0f) >= static_cast<float>(inst.ints()->Get(0))) {
      exponent += 1.0f;
      good = 0.0f;
    }
    *O(0) = exponent;
    *O(1) = good;
    return Status::ok();
  }
  case OpCode::UnscaleGrads: {
    size_t n = in.size() - 1;
    float inv = 1.0f / *I(n);
    float found = 0.0f;
    for (size_t t = 0; t < n; ++t) {
      const float *g = I(t);
      float *u = O(t);
      int64_t count = N(t);
      int bad = 0;
#pragma omp parallel for reduction(| : bad) if (count > 32768)
      for (int64_t i = 0; i < count; ++i) {
        bad |= !std::isfinite(g[i]);
        u[i] = g[i] * inv;
      }
      if (bad)
        found = 1.0f;
    }
    if (inst.ints() && inst.ints()->size() > 0 && comm_) {
      std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
      PTC_RETURN_IF_ERROR(comm_->allReduceMax(&found, 1, axes, "the gradient overflow flag"));
    }
    *O(n) = found;
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
    double total = k::sumOfSquares(grads, sizes);
    if (inst.ints() && inst.ints()->size() > 0 && comm_) {
      // The other gradients live on other ranks (pipeline stages): sum there too.
      std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
      float partial = static_cast<float>(total);
      PTC_RETURN_IF_ERROR(comm_->allReduceSum(&partial, 1, axes, "the gradient norm"));
      total = partial;
    }
    *O(in.size()) = k::clipByNorm(grads, sizes, outs, F(0), total);
    return Status::ok();
  }
  case OpCode::MicrobatchSum: {
    float *acc = O(0);
    const float *x = I(0);
    for (int64_t i = 0, e = N(0); i < e; ++i)
      acc[i] += x[i];
    return Status::ok();
  }
  case OpCode::Send:
  case OpCode::Recv:
    return error(StatusCode::kInternal, "point-to-point instructions run as schedule actions");
  }
  return error(StatusCode::kUnimplemented, "opcode ", static_cast<int>(inst.op()),
               " has no CPU kernel");
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
  std::vector<float> mx(static_cast<size_t>(rows)), sum(static_cast<size_t>(rows)),
      target(static_cast<size_t>(rows));
  const float *x = f32(in[0]);
  k::rowMax(x, rows, classes, mx.data());
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->allReduceMax(mx.data(), rows, {axis}, what));
  k::rowSumExp(x, rows, classes, mx.data(), sum.data());
  if (comm_)
    PTC_RETURN_IF_ERROR(comm_->allReduceSum(sum.data(), rows, {axis}, what));
  float *out = f32((*inst.outputs())[0]);
  if (inst.op() == OpCode::VocabParallelCrossEntropy) {
    PTC_RETURN_IF_ERROR(k::targetLogit(x, i32(in[1]), rows, classes, offset, total, target.data()));
    if (comm_)
      PTC_RETURN_IF_ERROR(comm_->allReduceSum(target.data(), rows, {axis}, what));
    double loss = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      loss += std::log(static_cast<double>(sum[static_cast<size_t>(r)])) + mx[static_cast<size_t>(r)] -
              target[static_cast<size_t>(r)];
    *out = static_cast<float>(loss / static_cast<double>(rows));
    return Status::ok();
  }
  const int32_t *t = i32(in[1]);
  const float scale = *f32(in[2]) / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] < 0 || t[r] >= total)
      return invalidArgument("target ", t[r], " at position ", r, " is outside [0, ", total, ")");
    float inv = scale / sum[static_cast<size_t>(r)];
    for (int64_t c = 0; c < classes; ++c)
      out[r * classes + c] = std::exp(x[r * classes + c] - mx[static_cast<size_t>(r)]) * inv;
    int64_t local = static_cast<int64_t>(t[r]) - offset;
    if (local >= 0 && local < classes)
      out[r * classes + local] -= scale;
  }
  return Status::ok();
}

Status Executor::runCollective(const plan::Instruction &inst) {
  const auto &in = *inst.inputs();
  const auto &out = *inst.outputs();
  std::vector<int> axes(inst.ints()->begin(), inst.ints()->end());
  std::string what = inst.location() ? inst.location()->str() : "";
  switch (inst.op()) {
  case OpCode::AllReduce: {
    // One bucket: pack, sum once, unpack.
    int64_t total = 0;
    for (int32_t id : in)
      total += plan_->tensor(id).numElements;
    staging_.resize(static_cast<size_t>(total));
    int64_t off = 0;
    for (int32_t id : in) {
      std::memcpy(staging_.data() + off, data(id), static_cast<size_t>(plan_->tensor(id).numElements) * sizeof(float));
      off += plan_->tensor(id).numElements;
    }
    if (comm_)
      PTC_RETURN_IF_ERROR(comm_->allReduceSum(staging_.data(), total, {axes.begin(), axes.end()},
                                              "a " + std::to_string(total * 4) + "-byte bucket at " + what));
    off = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      int32_t id = out[static_cast<flatbuffers::uoffset_t>(i)];
      std::memcpy(data(id), staging_.data() + off, static_cast<size_t>(plan_->tensor(id).numElements) * sizeof(float));
      off += plan_->tensor(id).numElements;
    }
    return Status::ok();
  }
  case OpCode::AllGather: {
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    int axis = axes[0];
    int64_t dim = inst.ints()->Get(1);
    int parts = plan_->meshSizes()[static_cast<size_t>(axis)];
    staging_.resize(static_cast<size_t>(src.numElements * parts));
    if (comm_)
      PTC_RETURN_IF_ERROR(comm_->allGather(data(in[0]), staging_.data(), src.bytes, axis,
                                           "'" + src.name + "' at " + what));
    else
      std::memcpy(staging_.data(), data(in[0]), static_cast<size_t>(src.bytes));
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
        k::copyBox(reinterpret_cast<const uint8_t *>(staging_.data()) + p * src.bytes, src.shape, srcOff, data(out[0]),
                   dst.shape, dstOff, box, dtypeSize(src.dtype));
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
    std::vector<int64_t> box = src.shape;
    box[split] /= parts;
    int64_t blockElems = src.numElements / parts;
    staging_.resize(static_cast<size_t>(2 * src.numElements));
    float *send = staging_.data(), *recv = staging_.data() + src.numElements;
    std::vector<int64_t> zero(src.shape.size(), 0), off(src.shape.size(), 0);
    for (int p = 0; p < parts; ++p) {
      off.assign(src.shape.size(), 0);
      off[split] = p * box[split];
      k::copyBox(data(in[0]), src.shape, off, send + p * blockElems, box, zero, box, sizeof(float));
    }
    if (comm_)
      PTC_RETURN_IF_ERROR(comm_->allToAll(send, recv, blockElems * 4, axis,
                                          "'" + src.name + "' at " + what));
    else
      std::memcpy(recv, send, static_cast<size_t>(src.numElements) * sizeof(float));
    for (int p = 0; p < parts; ++p) {
      off.assign(src.shape.size(), 0);
      off[concat] = p * box[concat];
      k::copyBox(recv + p * blockElems, box, zero, data(out[0]), dst.shape, off, box, sizeof(float));
    }
    return Status::ok();
  }
  case OpCode::ReduceScatter: {
    // Lay the input out as one contiguous block per group member, then sum-scatter.
    const TensorInfo &src = plan_->tensor(in[0]), &dst = plan_->tensor(out[0]);
    int axis = axes[0];
    staging_.resize(static_cast<size_t>(src.numElements));
    blocksForReduceScatter(inst, staging_.data(), sizeof(float));
    if (comm_)
      return comm_->reduceScatterSum(staging_.data(), f32(out[0]), dst.numElements, axis,
                                     "'" + src.name + "' at " + what);
    std::memcpy(data(out[0]), staging_.data(), static_cast<size_t>(dst.numElements) * sizeof(float));
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
      k::copyBox(data(in[0]), src.shape, srcOff, data(out[0]), dst.shape, dstOff, box,
                 dtypeSize(src.dtype));
    }
    return Status::ok();
  }
  }
}

} // namespace ptc
