// Executor tensor I/O: initializers, whole <-> local copies of sharded
// tensors (load, gather), inputs and scalar reads.

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

std::vector<Executor::LocalBox> Executor::localBoxes(int32_t id) const {
  std::vector<LocalBox> boxes;
  if (!holds(id))
    return boxes;
  forEachLocalBox(plan_->tensor(id), coords(),
                  [&](const auto &wholeOff, const auto &localOff, const auto &box) {
                    boxes.push_back({wholeOff, localOff, box});
                  });
  return boxes;
}

void Executor::afterFileWrite(int32_t id) {
  // Written outside a step (initializers, weights, a checkpoint): back to
  // the file now, so that loading a model larger than memory stays bounded.
  if (!file_ || fileRange_[static_cast<size_t>(id)].first < 0)
    return;
  const auto &r = fileRange_[static_cast<size_t>(id)];
  file_->release(r.first, r.second);
  file_->drain();
}

Status Executor::roundWorkingCopy(int32_t param) {
  // The working copy of parameter `param` (ptc-keep-working-copies): its
  // rounding, as the update writes it each step.
  const int32_t copy = plan_->tensor(param).workingCopy;
  if (copy < 0 || !holds(copy))
    return Status::ok();
  const TensorInfo &t = plan_->tensor(copy);
  return deviceOf(param).convertFloat(data(param), FloatType::F32, data(copy),
                                      kernels::floatTypeOf(static_cast<kernels::DType>(t.dtype)),
                                      t.numElements);
}

Status Executor::loadLocal(int32_t id, const void *local) {
  if (!holds(id))
    return Status::ok();
  PTC_RETURN_IF_ERROR(hostSync());
  PTC_RETURN_IF_ERROR(
      deviceOf(id).copy(data(id), local, plan_->tensor(id).bytes, CopyKind::HostToDevice));
  afterFileWrite(id);
  return roundWorkingCopy(id);
}

Status Executor::loadFromWhole(int32_t id, const void *whole) {
  if (!holds(id))
    return Status::ok();
  const TensorInfo &t = plan_->tensor(id);
  // Cut the local part out on the host, then copy it over in one piece.
  void *local = data(id);
  std::vector<uint8_t> host;
  if (!deviceOf(id).hostAddressable()) {
    host.resize(static_cast<size_t>(t.bytes));
    local = host.data();
  }
  forEachLocalBox(t, coords(), [&](const auto &wholeOff, const auto &localOff, const auto &box) {
    k::copyBox(whole, t.globalShape, wholeOff, local, t.shape, localOff, box, dtypeSize(t.dtype));
  });
  if (!host.empty()) {
    PTC_RETURN_IF_ERROR(hostSync());
    PTC_RETURN_IF_ERROR(deviceOf(id).copy(data(id), host.data(), t.bytes, CopyKind::HostToDevice));
  }
  afterFileWrite(id);
  return roundWorkingCopy(id);
}

Status Executor::readLocal(int32_t id, void *out) {
  PTC_RETURN_IF_ERROR(hostSync());
  return deviceOf(id).copy(out, data(id), plan_->tensor(id).bytes, CopyKind::DeviceToHost);
}

StatusOr<float> Executor::scalar(int32_t id) {
  // A model built in bf16 / f16 has a low-precision loss: widen it.
  const plan::DType dtype = plan_->tensor(id).dtype;
  const size_t bytes = dtype == plan::DType::F32 ? 4 : 2;
  uint8_t raw[4] = {0, 0, 0, 0};
  Status s = hostSync();
  if (s.isOk())
    s = deviceOf(id).copy(raw, data(id), static_cast<int64_t>(bytes), CopyKind::DeviceToHost);
  if (!s.isOk())
    return s;
  float value = 0.0f;
  if (dtype == plan::DType::F32)
    std::memcpy(&value, raw, 4);
  else
    k::convertFloat(raw, dtype == plan::DType::BF16 ? kernels::FloatType::BF16 : kernels::FloatType::F16,
                    &value, kernels::FloatType::F32, 1);
  return value;
}

StatusOr<float> Executor::hostScalar(int32_t id) {
  if (auto it = hostScalars_.find(id); it != hostScalars_.end())
    return it->second;
  return scalar(id);
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
  if (holds(id)) {
    if (t.dtype == plan::DType::F32) {
      PTC_RETURN_IF_ERROR(readLocal(id, mine.data()));
    } else { // bf16 / f16 parameters: gathered and saved as f32
      std::vector<uint8_t> raw(static_cast<size_t>(t.bytes));
      PTC_RETURN_IF_ERROR(readLocal(id, raw.data()));
      k::convertFloat(raw.data(),
                      t.dtype == plan::DType::BF16 ? kernels::FloatType::BF16 : kernels::FloatType::F16,
                      mine.data(), kernels::FloatType::F32, t.numElements);
    }
  }
  if (!comm_ || !sharded) {
    if (comm_ && comm_->rank() != 0)
      return std::vector<float>();
    return mine;
  }
  int world = comm_->worldSize();
  std::vector<float> all(comm_->rank() == 0 ? static_cast<size_t>(t.numElements * world) : 0);
  PTC_RETURN_IF_ERROR(comm_->gatherToRoot(mine.data(), t.numElements * 4, all.data()));
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
      // A new offload file reads as zeros already: its pages stay untouched.
      if (!(file_ && fileRange_[i].first >= 0 && !fileWritten_))
        PTC_RETURN_IF_ERROR(deviceOf(static_cast<int32_t>(i)).zero(storage_[i], t.bytes));
      afterFileWrite(static_cast<int32_t>(i));
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
    PTC_RETURN_IF_ERROR(loadFromWholeF32(static_cast<int32_t>(i), whole.data()));
  }
  return Status::ok();
}

Status Executor::loadFromWholeF32(int32_t id, const float *whole) {
  const TensorInfo &t = plan_->tensor(id);
  if (t.dtype == plan::DType::F32)
    return loadFromWhole(id, whole);
  // A parameter of a model built in bf16 / f16: round the f32 values once.
  int64_t count = 1;
  for (int64_t d : t.globalShape)
    count *= d;
  std::vector<uint8_t> narrow(static_cast<size_t>(count * dtypeSize(t.dtype)));
  k::convertFloat(whole, kernels::FloatType::F32, narrow.data(),
                  t.dtype == plan::DType::BF16 ? kernels::FloatType::BF16 : kernels::FloatType::F16,
                  count);
  return loadFromWhole(id, narrow.data());
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

} // namespace ptc
