// What a loaded plan predicts about memory: the device bytes of a pipeline
// rank at its peak (arena, persistent tensors, collective staging), its host
// bytes, the collectives' buffers, and the largest id a tensor may hold.
// ptc-run compares a run with these; the compiler's report predicts the same.

#include "runtime/plan/plan_loader.h"

#include "runtime/plan/plan_format.h"
#include "runtime/plan/plan_ops.h"

#include <algorithm>

namespace ptc {

using plan::OpCode;
using plan::TensorKind;
using Shape = std::vector<int64_t>;

int64_t idUpperBound(const LoadedPlan &loaded, int32_t tensor) {
  // Vocabulary-parallel ops hold 1/n of the rows or classes (n: their mesh axis).
  auto splitOf = [&](const plan::Instruction &inst) -> int64_t {
    int64_t axis = -1;
    if (inst.op() == OpCode::VocabParallelCrossEntropy ||
        inst.op() == OpCode::VocabParallelCrossEntropyGrad)
      axis = plan::attrOf(inst, kernels::attr::VocabAxis::axis);
    if (inst.op() == OpCode::Embedding || inst.op() == OpCode::EmbeddingGrad)
      axis = plan::attrOf(inst, kernels::attr::Embedding::vocab_axis);
    return axis >= 0 ? loaded.meshSizes()[static_cast<size_t>(axis)] : 1;
  };
  int64_t bound = -1;
  auto tighten = [&](int64_t b) { bound = bound < 0 ? b : std::min(bound, b); };
  for (const plan::Instruction *inst : *loaded.plan().instructions()) {
    const auto &in = inputsOf(*inst);
    auto shape = [&](size_t i) -> const Shape & {
      return loaded.tensor(in[static_cast<flatbuffers::uoffset_t>(i)]).shape;
    };
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[static_cast<flatbuffers::uoffset_t>(i)] != tensor)
        continue;
      switch (inst->op()) {
      case OpCode::Embedding:
        if (i == 1)
          tighten(shape(0)[0] * splitOf(*inst));
        break;
      case OpCode::CrossEntropy:
      case OpCode::CrossEntropyGrad:
      case OpCode::VocabParallelCrossEntropy:
      case OpCode::VocabParallelCrossEntropyGrad:
        if (i == 1)
          tighten(shape(0).back() * splitOf(*inst));
        break;
      case OpCode::EmbeddingGrad:
        if (i == 0)
          tighten(loaded.tensor((outputsOf(*inst))[0]).shape[0] * splitOf(*inst));
        break;
      default:
        break;
      }
    }
  }
  return bound;
}


int64_t predictedHostBytes(const LoadedPlan &loaded, int pipelineRank) {
  std::vector<bool> here = loaded.tensorsOnPipelineRank(pipelineRank);
  int64_t total = 0;
  for (size_t i = 0; i < loaded.tensors().size(); ++i)
    if (loaded.tensors()[i].host && here[i])
      total += loaded.tensors()[i].bytes;
  return total;
}

bool allReduceInPlace(const LoadedPlan &loaded, const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const auto &out = outputsOf(inst);
  if (inst.op() != OpCode::AllReduce || in.size() != out.size() || in.size() == 0)
    return false;
  int64_t next = loaded.tensor(in[0]).arenaOffset;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorInfo &a = loaded.tensor(in[i]), &r = loaded.tensor(out[i]);
    if (a.host || r.host || a.arenaOffset < 0 || a.arenaOffset != next ||
        r.arenaOffset != a.arenaOffset || r.bytes != a.bytes)
      return false;
    next = (a.arenaOffset + a.bytes + kBucketAlignment - 1) / kBucketAlignment * kBucketAlignment;
  }
  return true;
}

int64_t inPlaceBucketBytes(const LoadedPlan &loaded, const plan::Instruction &inst) {
  const auto &in = inputsOf(inst);
  const TensorInfo &first = loaded.tensor(in[0]), &last = loaded.tensor(in[in.size() - 1]);
  return last.arenaOffset + last.bytes - first.arenaOffset;
}

namespace {
/// The largest collective's bytes; `staged`: only what needs the staging
/// buffer (an in-place bucket needs none).
int64_t largestCollective(const LoadedPlan &loaded, int pipelineRank, bool staged) {
  int64_t comm = 0;
  for (const plan::Instruction *inst : *loaded.plan().instructions()) {
    if (!loaded.runsOnPipelineRank(*inst, pipelineRank))
      continue;
    auto bytesOf = [&](int32_t id) { return loaded.tensor(id).bytes; };
    int64_t c = 0;
    switch (inst->op()) {
    case OpCode::AllReduce:
      if (!staged || !allReduceInPlace(loaded, *inst))
        for (int32_t id : inputsOf(*inst))
          c += bytesOf(id);
      break;
    case OpCode::AllGather:
      c = bytesOf((outputsOf(*inst))[0]);
      break;
    case OpCode::ReduceScatter:
      c = bytesOf((inputsOf(*inst))[0]);
      break;
    case OpCode::AllToAll:
      c = 2 * bytesOf((inputsOf(*inst))[0]);
      break;
    default:
      break;
    }
    comm = std::max(comm, c);
  }
  return comm;
}
} // namespace

int64_t largestCollectiveBytes(const LoadedPlan &loaded, int pipelineRank) {
  return largestCollective(loaded, pipelineRank, /*staged=*/false);
}

int64_t collectiveStagingBytes(const LoadedPlan &loaded, int pipelineRank) {
  return largestCollective(loaded, pipelineRank, /*staged=*/true);
}

int64_t predictedPeakBytes(const LoadedPlan &loaded, int pipelineRank) {
  int64_t total = loaded.plan().arena_bytes();
  if (loaded.pipelined())
    total = loaded.plan().pipeline()->arena_bytes()->Get(static_cast<flatbuffers::uoffset_t>(pipelineRank));
  std::vector<bool> here = loaded.tensorsOnPipelineRank(pipelineRank);
  for (size_t i = 0; i < loaded.tensors().size(); ++i)
    if (loaded.tensors()[i].kind != TensorKind::Temporary && !loaded.tensors()[i].host && here[i])
      total += loaded.tensors()[i].bytes;
  if (loaded.plan().outputs()) // another pipeline rank's outputs, received after each step
    for (const plan::Output *o : *loaded.plan().outputs())
      if (!here[static_cast<size_t>(o->tensor())])
        total += loaded.tensor(o->tensor()).bytes;
  return total + collectiveStagingBytes(loaded, pipelineRank);
}

} // namespace ptc
