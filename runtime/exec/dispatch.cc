// Executor kernel dispatch: one device call per opcode.

#include "runtime/exec/executor.h"
#include "runtime/plan/plan_ops.h"

#include "kernels/common/lr_schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;

namespace {
/// The activation a Unary / UnaryGrad instruction names (the loader checked it).
UnaryFunction unaryFunctionOf(const plan::Instruction &inst) {
  return *kernels::lookupUnaryFunction(inst.function()->string_view());
}

/// The routing of an MoE instruction, from its `[groups, tokens, k]` (or
/// `[tokens, k]`) indices and `[experts, groups, capacity, dim]` (or
/// `[experts, capacity, dim]`) expert buffers (the loader checked them).
struct MoeShape {
  int64_t groups, tokens, k, experts, capacity, dim;
};
MoeShape moeShape(const Shape &indices, const Shape &experts) {
  size_t r = indices.size();
  return {r == 3 ? indices[0] : 1, indices[r - 2],          indices[r - 1],
          experts[0],              experts[experts.size() - 2], experts.back()};
}
} // namespace

Status Executor::runKernel(const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
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
  Device &d = deviceFor(inst);

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
  case OpCode::RmsNorm: {
    int64_t cols = IS(0).back();
    return d.rmsNorm(I(0), I(1), O(0), N(0) / cols, cols, F(0));
  }
  case OpCode::RmsNormGrad: {
    int64_t cols = IS(0).back();
    return d.rmsNormGrad(I(0), I(1), I(2), O(0), O(1), N(0) / cols, cols, F(0));
  }
  case OpCode::Rotary:
    return d.rotary(I(0), O(0), IS(0), inst.floats()->Get(0), ints()[0] != 0);
  case OpCode::CausalAttention:
    return d.causalAttention(I(0), I(1), I(2), O(0), IS(0), IS(1)[1], F(0));
  case OpCode::CausalAttentionGrad:
    return d.causalAttentionGrad(I(0), I(1), I(2), I(3), O(0), O(1), O(2), IS(0), IS(1)[1],
                                 F(0));
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
    int64_t experts = IS(0).back();
    const float *bias = in.size() > 1 ? I(1) : nullptr;
    return d.topKGate(I(0), bias, N(0) / experts, experts, a[0], a[1] != 0, O(0), i32(out[1]));
  }
  case OpCode::TopKGateGrad: {
    int64_t experts = IS(0).back();
    return d.topKGateGrad(I(0), ids(1), I(2), N(0) / experts, experts, IS(1).back(),
                          ints()[0] != 0, O(0));
  }
  case OpCode::ExpertLoad: {
    const Shape &is = IS(0);
    size_t r = is.size();
    return d.expertLoad(ids(0), r == 3 ? is[0] : 1, is[r - 2], is[r - 1], OS(0).back(), O(0));
  }
  case OpCode::MoeDispatch: {
    MoeShape m = moeShape(IS(1), OS(0));
    return d.moeDispatch(I(0), ids(1), m.groups, m.tokens, m.k, m.dim, m.experts, m.capacity,
                         O(0));
  }
  case OpCode::MoeDispatchGrad: {
    MoeShape m = moeShape(IS(1), IS(0));
    return d.moeDispatchGrad(I(0), ids(1), m.groups, m.tokens, m.k, m.dim, m.experts,
                             m.capacity, O(0));
  }
  case OpCode::MoeCombine: {
    MoeShape m = moeShape(IS(2), IS(0));
    return d.moeCombine(I(0), I(1), ids(2), m.groups, m.tokens, m.k, m.dim, m.experts,
                        m.capacity, O(0));
  }
  case OpCode::MoeCombineGrad: {
    MoeShape m = moeShape(IS(2), IS(0));
    return d.moeCombineGrad(I(0), I(1), ids(2), I(3), m.groups, m.tokens, m.k, m.dim, m.experts,
                            m.capacity, O(0), O(1));
  }
  case OpCode::AdamWUpdate:
  case OpCode::SgdUpdate: {
    // Optional inputs after the fixed ones: the overflow flag of dynamic loss
    // scaling (the step then changes nothing), then (ints [1]) the scheduled
    // learning rate, computed on the host this step by its LrSchedule.
    const bool adam = inst.op() == OpCode::AdamWUpdate;
    const plan::UpdateInputs layout = plan::updateInputs(inst);
    const float *skip = layout.skip >= 0 ? I(static_cast<size_t>(layout.skip)) : nullptr;
    float lr = F(0);
    if (layout.lr >= 0) {
      auto value = hostScalar(in[static_cast<flatbuffers::uoffset_t>(layout.lr)]);
      if (!value.isOk())
        return value.status();
      lr = *value;
    }
    if (adam)
      return d.adamwUpdate(I(0), I(1), I(2), I(3), I(4), AdamWParams{lr, F(1), F(2), F(3), F(4)},
                           N(0), skip, O(0), O(1), O(2));
    return d.sgdUpdate(I(0), I(1), I(2), lr, F(1), F(2), N(0), skip, O(0), O(1));
  }
  case OpCode::LrSchedule: {
    // Once per step on a scalar: computed on the host, kept there for the
    // updates (no device round trip per parameter).
    auto step = scalar(in[0]);
    if (!step.isOk())
      return step.status();
    auto a = ints();
    float value = static_cast<float>(kernels::scheduledLr(
        static_cast<kernels::LrScheduleKind>(a[0]), inst.floats()->Get(0), inst.floats()->Get(1),
        a[1], a[2], static_cast<double>(*step)));
    hostScalars_[out[0]] = value;
    return d.copy(O(0), &value, sizeof value, CopyKind::HostToDevice);
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
  case OpCode::Transfer:
    return error(StatusCode::kInternal, "host-device transfers run as copies (Executor::run)");
  }
  return error(StatusCode::kUnimplemented, "opcode ", static_cast<int>(inst.op()),
               " has no kernel on ", d.describe());
}

} // namespace ptc
