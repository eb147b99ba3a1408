// Executor kernel dispatch: a plan instruction as a KernelCall to its
// device's kernel table (the optimizer's updates and loss scaling's flags
// too), or one of the instructions the executor runs itself: collectives,
// the learning-rate schedule and loss scale on the host, and those it
// composes from kernel pieces around collectives (the vocabulary-parallel
// loss, ring attention, the clipped gradient norm).

#include "runtime/exec/executor.h"
#include "runtime/device/kernel_launch.h"
#include "runtime/plan/plan_ops.h"

#include "kernels/common/lr_schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

namespace {
static_assert(static_cast<size_t>(OpCode::MAX) + 1 == kernels::kNumPlanOps,
              "the plan's OpCode and the kernels' OpKind are both op_table.def's rows");

/// Instructions that move a collective's bytes as they are stored (bf16 on the wire).
bool movesStoredBytes(OpCode op) {
  return op == OpCode::ShardSlice || op == OpCode::AllGather || op == OpCode::AllToAll;
}

/// Where a KernelCall's views and attributes live (the call points into them).
struct CallStorage {
  std::vector<kernels::TensorView> &in, &out;
  std::vector<int64_t> &ints;
  std::vector<double> &floats;
};

/// Instruction `inst` as a kernel receives it: typed views of its tensors
/// (element type, f32 for a 16-bit one when `widened`; shape; the data
/// `dataOf` gives), its attributes and activation function, kept in `s`.
template <typename DataOf>
kernels::KernelCall instructionCall(const LoadedPlan &plan, const plan::Instruction &inst,
                                    bool widened, DataOf dataOf, CallStorage s) {
  auto views = [&](const flatbuffers::Vector<int32_t> *ids, std::vector<kernels::TensorView> &out) {
    out.clear();
    if (!ids)
      return;
    for (int32_t id : *ids) {
      const TensorInfo &t = plan.tensor(id);
      auto dtype = static_cast<kernels::DType>(t.dtype);
      if (widened && kernels::isLowPrecision(dtype)) // runWidened's f32 copy
        dtype = kernels::DType::F32;
      out.push_back({dataOf(id), dtype, &t.shape, t.numElements});
    }
  };
  views(inst.inputs(), s.in);
  views(inst.outputs(), s.out);
  s.ints.clear();
  if (inst.ints())
    s.ints.assign(inst.ints()->begin(), inst.ints()->end());
  s.floats.clear();
  if (inst.floats())
    s.floats.assign(inst.floats()->begin(), inst.floats()->end());
  kernels::KernelCall call = kernels::makeKernelCall(static_cast<kernels::OpKind>(inst.op()),
                                                     s.in, s.out, s.ints, s.floats);
  if (inst.function()) // Unary / UnaryGrad: the loader checked the name
    call.function = *kernels::lookupUnaryFunction(inst.function()->string_view());
  return call;
}
} // namespace

KernelCoverage kernelCoverage(const LoadedPlan &plan, const kernels::KernelTable &table) {
  KernelCoverage coverage;
  std::vector<kernels::TensorView> in, out;
  std::vector<int64_t> ints, coords(plan.meshSizes().size(), 0), sizes;
  std::vector<double> floats;
  for (int64_t s : plan.meshSizes())
    sizes.push_back(s);
  auto noData = [](int32_t) -> void * { return nullptr; };
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    const std::string name = opcodeName(inst->op());
    const kernels::KernelEntry &entry = table[static_cast<kernels::OpKind>(inst->op())];
    if (inst->on_host() || !entry.run) { // the runtime's own (or the host CPU's)
      ++coverage.composed[name];
      continue;
    }
    kernels::KernelCall call =
        instructionCall(plan, *inst, /*widened=*/false, noData, {in, out, ints, floats});
    call.meshCoords = coords.data();
    call.meshSizes = sizes.data();
    // A batched form that takes it: the executor runs such updates as groups.
    const bool native =
        entry.accepts(call) || (entry.runBatch && entry.batchAccepts(call));
    ++(native ? coverage.native : coverage.widened)[name];
  }
  return coverage;
}

std::string describe(const KernelCoverage &coverage) {
  std::string text;
  auto line = [&](const char *what, const std::map<std::string, int64_t> &kinds) {
    int64_t total = 0;
    std::string list;
    for (const auto &[name, count] : kinds) {
      total += count;
      list += (list.empty() ? "" : ", ") + name + (count > 1 ? " x" + std::to_string(count) : "");
    }
    text += std::string(what) + ": " + std::to_string(total) + " instructions" +
            (list.empty() ? "" : " (" + list + ")") + "\n";
  };
  line("native", coverage.native);
  line("widened to f32", coverage.widened);
  line("run by the runtime", coverage.composed);
  return text;
}

kernels::KernelCall Executor::kernelCall(const plan::Instruction &inst) {
  kernels::KernelCall call = typedCall(inst);
  if (callMeshSizes_.empty()) {
    std::vector<int> c = coords();
    callMeshCoords_.assign(c.begin(), c.end());
    callMeshSizes_.assign(plan_->meshSizes().begin(), plan_->meshSizes().end());
  }
  call.meshCoords = callMeshCoords_.data();
  call.meshSizes = callMeshSizes_.data();
  call.random = &random_;
  return call;
}

void Executor::prepareKernels() {
  for (const plan::Instruction *inst : *plan_->plan().instructions()) {
    // Another pipeline rank's instruction: its tensors have no storage here.
    const auto &out = outputsOf(*inst);
    if (out.size() > 0 && !data(out[0]))
      continue;
    if ((inst->op() == OpCode::VocabParallelCrossEntropy ||
         inst->op() == OpCode::VocabParallelCrossEntropyGrad) &&
        vocabLossNative(*inst))
      nativeVocabLosses_.insert(inst);
    const kernels::KernelEntry &entry =
        deviceFor(*inst).kernelTable()[static_cast<kernels::OpKind>(inst->op())];
    if (entry.run)
      (void)entry.accepts(typedCall(*inst));
  }
}

kernels::KernelCall Executor::typedCall(const plan::Instruction &inst) {
  return instructionCall(*plan_, inst, widening_, [&](int32_t id) { return data(id); },
                         {callInputs_, callOutputs_, callInts_, callFloats_});
}

Status Executor::runWidened(const plan::Instruction &inst, const std::function<Status()> &body) {
  // bf16 / f16 storage, f32 math: the body sees f32 copies of the
  // instruction's low-precision tensors, and its low-precision results are
  // rounded back once.
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  auto dtypeOf = [&](int32_t id) { return static_cast<kernels::DType>(plan_->tensor(id).dtype); };
  auto isLow = [&](int32_t id) { return kernels::isLowPrecision(dtypeOf(id)); };
  std::vector<int32_t> low;
  for (const auto *ids : {&in, &out})
    for (int32_t id : *ids)
      if (isLow(id) && std::find(low.begin(), low.end(), id) == low.end())
        low.push_back(id);
  if (low.empty())
    return body();
  // The copies live on the device (the loader refuses low-precision tensors
  // in host instructions).
  Device &d = *dev_;
  while (widened_.size() < low.size())
    widened_.emplace_back(dev_.get());
  for (size_t i = 0; i < low.size(); ++i)
    PTC_RETURN_IF_ERROR(widened_[i].reserve(plan_->tensor(low[i]).numElements * 4));
  std::vector<void *> saved;
  for (size_t i = 0; i < low.size(); ++i) {
    const TensorInfo &t = plan_->tensor(low[i]);
    PTC_RETURN_IF_ERROR(d.convertFloat(data(low[i]), kernels::floatTypeOf(dtypeOf(low[i])),
                                       widened_[i].data(), FloatType::F32, t.numElements));
    saved.push_back(storage_[static_cast<size_t>(low[i])]);
    storage_[static_cast<size_t>(low[i])] = widened_[i].data();
  }
  widening_ = true;
  Status status = body();
  widening_ = false;
  for (size_t i = 0; i < low.size(); ++i) {
    storage_[static_cast<size_t>(low[i])] = saved[i];
    if (status.isOk() && std::find(out.begin(), out.end(), low[i]) != out.end())
      status = d.convertFloat(widened_[i].data(), FloatType::F32, data(low[i]),
                              kernels::floatTypeOf(dtypeOf(low[i])),
                              plan_->tensor(low[i]).numElements);
  }
  return status;
}

Status Executor::runKernel(const plan::Instruction &inst) {
  Device &d = deviceFor(inst);
  const kernels::KernelEntry &entry = d.kernelTable()[static_cast<kernels::OpKind>(inst.op())];
  if (entry.run) {
    StatusOr<std::optional<double>> lr = scheduledLr(inst);
    if (!lr.isOk())
      return lr.status();
    // The instruction's call, with the step's learning rate where it has one.
    auto call = [&] {
      kernels::KernelCall c = kernelCall(inst);
      if (*lr)
        callFloats_[kernels::learningRateSlot(c.op)] = **lr;
      return c;
    };
    const kernels::KernelCall whole = call();
    if (entry.accepts(whole))
      PTC_RETURN_IF_ERROR(d.launch(whole));
    else
      PTC_RETURN_IF_ERROR(runWidened(inst, [&] { return d.launch(call()); }));
    return reduceFlag(inst);
  }
  if (movesStoredBytes(inst.op()) || nativeVocabLosses_.count(&inst))
    return runHostOp(inst);
  return runWidened(inst, [&] { return runHostOp(inst); });
}

StatusOr<std::optional<double>> Executor::scheduledLr(const plan::Instruction &inst) {
  if (inst.op() != OpCode::AdamWUpdate && inst.op() != OpCode::SgdUpdate)
    return std::optional<double>();
  const plan::UpdateInputs layout = plan::updateInputs(inst);
  if (layout.lr < 0)
    return std::optional<double>();
  // Computed on the host this step by its LrSchedule.
  auto value = hostScalar(inputsOf(inst)[static_cast<flatbuffers::uoffset_t>(layout.lr)]);
  if (!value.isOk())
    return value.status();
  return std::optional<double>(*value);
}

Status Executor::reduceFlag(const plan::Instruction &inst) {
  // Loss scaling's overflow flags: the kernel's, then the maximum over the
  // instruction's mesh axes (every rank skips the step or none).
  const char *what = inst.op() == OpCode::UnscaleGrads   ? "the gradient overflow flag"
                     : inst.op() == OpCode::AnyNonfinite ? "the non-finite gradient flag"
                                                         : nullptr;
  const std::vector<int64_t> meshAxes = plan::meshAxesOf(inst);
  if (!what || meshAxes.empty() || !comm_)
    return Status::ok();
  const auto &out = outputsOf(inst);
  const std::vector<int> axes(meshAxes.begin(), meshAxes.end());
  return allReduceSmall(f32(out[out.size() - 1]), 1, axes, /*max=*/true, what);
}

Status Executor::runHostOp(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  auto O = [&](size_t i) { return f32(out[static_cast<flatbuffers::uoffset_t>(i)]); };
  namespace attr = kernels::attr;
  Device &d = deviceFor(inst);

  switch (inst.op()) {
  case OpCode::VocabParallelCrossEntropy:
  case OpCode::VocabParallelCrossEntropyGrad:
    return runVocabParallelCrossEntropy(inst);
  case OpCode::RingAttention:
  case OpCode::RingAttentionGrad:
    return runRingAttention(inst);
  case OpCode::LrSchedule: {
    // Once per step on a scalar: computed on the host, kept there for the
    // updates (no device round trip per parameter).
    auto step = scalar(in[0]);
    if (!step.isOk())
      return step.status();
    float value = static_cast<float>(kernels::scheduledLr(
        static_cast<kernels::LrScheduleKind>(plan::attrOf(inst, attr::LrSchedule::kind)),
        plan::attrOf(inst, attr::LrSchedule::lr), plan::attrOf(inst, attr::LrSchedule::min_lr),
        plan::attrOf(inst, attr::LrSchedule::warmup_steps),
        plan::attrOf(inst, attr::LrSchedule::decay_steps), static_cast<double>(*step)));
    hostScalars_[out[0]] = value;
    return d.copy(O(0), &value, sizeof value, CopyKind::HostToDevice);
  }
  case OpCode::LossScale: {
    // Once per step on a scalar: computed on the host.
    auto exponent = scalar(in[0]);
    if (!exponent.isOk())
      return exponent.status();
    float value = static_cast<float>(static_cast<float>(plan::attrOf(inst, attr::LossScale::initial)) *
                                     std::exp2(static_cast<double>(*exponent)));
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
    } else if ((good += 1.0f) >=
               static_cast<float>(plan::attrOf(inst, attr::LossScaleUpdate::window))) {
      exponent += 1.0f;
      good = 0.0f;
    }
    PTC_RETURN_IF_ERROR(d.copy(O(0), &exponent, sizeof exponent, CopyKind::HostToDevice));
    return d.copy(O(1), &good, sizeof good, CopyKind::HostToDevice);
  }
  case OpCode::AllReduce:
  case OpCode::AllGather:
  case OpCode::ShardSlice:
  case OpCode::ReduceScatter:
  case OpCode::AllToAll:
    return runCollective(inst);
  case OpCode::ClipGradNorm:
    return runClipGradNorm(inst);
  case OpCode::Send:
  case OpCode::Recv:
    return error(StatusCode::kInternal, "point-to-point instructions run as schedule actions");
  case OpCode::Transfer:
    return error(StatusCode::kInternal, "host-device transfers run as copies (Executor::run)");
  default:
    break;
  }
  return error(StatusCode::kUnimplemented, "opcode ", kernels::opKindName(static_cast<kernels::OpKind>(inst.op())),
               " has no kernel on ", d.describe());
}

Status Executor::runClipGradNorm(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  Device &d = deviceFor(inst);
  const size_t n = in.size();
  auto gradient = [&](KernelLaunch &call, size_t i) {
    const int32_t id = in[static_cast<flatbuffers::uoffset_t>(i)];
    call.in(data(id), {plan_->tensor(id).numElements});
  };
  // The norm output holds the sum of squares until the clip replaces it.
  float *norm = f32(out[static_cast<flatbuffers::uoffset_t>(n)]);
  const std::vector<double> weights = plan::attrOf(inst, kernels::attr::ClipGradNorm::weights);
  if (weights.empty()) {
    KernelLaunch sum(kernels::OpKind::SumOfSquares);
    for (size_t i = 0; i < n; ++i)
      gradient(sum, i);
    PTC_RETURN_IF_ERROR(sum.out(norm, {1}).launch(d));
  } else {
    // Weighted: each gradient's sum of squares counts 1 / its copies in the
    // group (a split gradient's pieces once, a replicated one once in all).
    // One device sum per weight, in the order they first appear, combined on
    // the host in that order (repeatable).
    std::vector<float> weightOf;
    std::vector<size_t> groupOf(n);
    for (size_t i = 0; i < n; ++i) {
      const auto w = static_cast<float>(weights[i]);
      auto at = std::find(weightOf.begin(), weightOf.end(), w);
      groupOf[i] = static_cast<size_t>(at - weightOf.begin());
      if (at == weightOf.end())
        weightOf.push_back(w);
    }
    PTC_RETURN_IF_ERROR(rowScratch_.reserve(static_cast<int64_t>(weightOf.size()) * 4));
    float *partial = static_cast<float *>(rowScratch_.data());
    for (size_t g = 0; g < weightOf.size(); ++g) {
      KernelLaunch sum(kernels::OpKind::SumOfSquares);
      for (size_t i = 0; i < n; ++i)
        if (groupOf[i] == g)
          gradient(sum, i);
      PTC_RETURN_IF_ERROR(sum.out(partial + g, {1}).launch(d));
    }
    std::vector<float> host(weightOf.size());
    PTC_RETURN_IF_ERROR(d.copy(host.data(), partial, static_cast<int64_t>(host.size()) * 4,
                               CopyKind::DeviceToHost));
    float total = 0;
    for (size_t g = 0; g < host.size(); ++g)
      total += weightOf[g] * host[g];
    PTC_RETURN_IF_ERROR(d.copy(norm, &total, 4, CopyKind::HostToDevice));
  }
  if (const std::vector<int64_t> meshAxes = plan::meshAxesOf(inst); !meshAxes.empty() && comm_) {
    // The other gradients live on other ranks (pipeline stages): sum there too.
    const std::vector<int> axes(meshAxes.begin(), meshAxes.end());
    PTC_RETURN_IF_ERROR(allReduceSmall(norm, 1, axes, /*max=*/false, "the gradient norm"));
  }
  KernelLaunch clip(kernels::OpKind::ClipByNorm);
  for (size_t i = 0; i < n; ++i)
    gradient(clip, i);
  clip.in(norm, {1});
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = out[static_cast<flatbuffers::uoffset_t>(i)];
    clip.out(data(id), {plan_->tensor(id).numElements});
  }
  return clip.out(norm, {1})
      .set(kernels::attr::ClipByNorm::max_norm,
           plan::attrOf(inst, kernels::attr::ClipGradNorm::max_norm))
      .launch(d);
}

} // namespace ptc
