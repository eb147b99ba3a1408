// Loads a plan file: FlatBuffers Verifier first, then semantic checks (format
// version, indices, shapes and dtypes of every instruction, arena bounds,
// def-before-use, no two live temporaries sharing arena bytes), so that
// execution never re-checks. The result is immutable.
#ifndef PTC_RUNTIME_PLAN_PLAN_LOADER_H
#define PTC_RUNTIME_PLAN_PLAN_LOADER_H

#include "runtime/base/mesh_text.h"
#include "runtime/base/status.h"
#include "runtime/plan/plan_generated.h"
#include "runtime/schedule/schedule.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

/// What a verified plan may hold. The bounds are far above any real model (a
/// 70B model's largest tensor has 1.1e9 elements) and keep every size the
/// runtime derives from a plan (bytes, global shapes, sums over tensors, batch
/// rows) inside int64.
// kMaxMeshAxisSize, kMaxMeshDevices: runtime/base/mesh_text.h (also the bounds of a mesh users
// write).
inline constexpr int64_t kMaxTensorElements = int64_t(1) << 40;
/// Of a tensor's global shape (the local shape times its mesh splits).
inline constexpr int64_t kMaxGlobalElements = int64_t(1) << 52;
/// The arena plus every tensor of one device.
inline constexpr int64_t kMaxDeviceBytes = int64_t(1) << 50;
inline constexpr int kMaxMicrobatches = 1 << 20;

/// Element size in bytes of a plan dtype.
int64_t dtypeSize(plan::DType dtype);
const char *dtypeName(plan::DType dtype);
const char *opcodeName(plan::OpCode op);

/// An instruction's input / output tensor ids. The lists are optional in the
/// schema (a valid FlatBuffer may omit an empty one): an absent list reads as
/// empty, so no code dereferences a missing vector.
inline const flatbuffers::Vector<int32_t> &emptyIds() {
  alignas(8) static const uint32_t kEmpty[2] = {0, 0}; // a length-0 vector
  return *reinterpret_cast<const flatbuffers::Vector<int32_t> *>(kEmpty);
}
inline const flatbuffers::Vector<int32_t> &inputsOf(const plan::Instruction &inst) {
  return inst.inputs() ? *inst.inputs() : emptyIds();
}
inline const flatbuffers::Vector<int32_t> &outputsOf(const plan::Instruction &inst) {
  return inst.outputs() ? *inst.outputs() : emptyIds();
}
const char *tensorKindName(plan::TensorKind kind);
/// "instruction #12 (Matmul at gpt.mlir:6:10)": how messages name instruction
/// `n` of a plan.
std::string describeInstruction(const plan::Instruction &inst, size_t n);

struct TensorInfo {
  std::string name;
  /// Mesh axis per dimension (-1: whole); empty for single-device plans.
  std::vector<int> dimAxes;
  /// Blocks per dimension (1: a plain split), with dimAxes.
  std::vector<int> dimBlocks;
  /// The whole tensor's shape (the local shape times the split factors).
  std::vector<int64_t> globalShape;
  plan::TensorKind kind;
  plan::DType dtype;
  std::vector<int64_t> shape;
  int64_t numElements = 1;
  int64_t bytes = 0;
  int64_t arenaOffset = -1;
  /// Lives in host memory (offload=optimizer); a host temporary has no arena offset.
  bool host = false;
  /// A WorkingCopy: the Parameter it holds the rounding of (else -1).
  int32_t copyOf = -1;
  /// A Parameter: its WorkingCopy (else -1; at most one, which its update writes).
  int32_t workingCopy = -1;
};

/// A verified plan: the raw bytes plus decoded tensor information.
class LoadedPlan {
public:
  /// Reads and verifies `path`.
  static StatusOr<std::shared_ptr<const LoadedPlan>> loadFile(const std::string &path);
  /// Verifies an in-memory plan (copied). `origin` names it in errors.
  static StatusOr<std::shared_ptr<const LoadedPlan>> loadBytes(std::vector<uint8_t> bytes,
                                                               const std::string &origin);

  const plan::Plan &plan() const { return *plan_; }
  const std::vector<TensorInfo> &tensors() const { return tensors_; }
  const TensorInfo &tensor(int32_t id) const { return tensors_[static_cast<size_t>(id)]; }
  /// Index of the tensor with this name and kind, or -1.
  int32_t findTensor(const std::string &name, plan::TensorKind kind) const;
  /// Index of the named output ("loss", "grad_norm", "grad:<param>"), or -1.
  int32_t findOutput(const std::string &name) const;
  const std::string &origin() const { return origin_; }
  /// Mesh axis names and sizes (empty for a single-device plan).
  const std::vector<std::string> &meshAxes() const { return meshAxes_; }
  const std::vector<int> &meshSizes() const { return meshSizes_; }

  /// The model's saving information (JSON text, runtime/io/model_info.h), or "".
  std::string modelInfo() const {
    return plan_->model_info() ? plan_->model_info()->str() : std::string();
  }
  /// Whether some instruction of the plan is a `code`.
  bool hasInstruction(plan::OpCode code) const;
  /// Micro-batches per step (1: none).
  int microbatches() const { return microbatches_; }
  /// Whether the plan runs a schedule of actions (micro-batches or stages).
  bool pipelined() const { return plan_->pipeline() != nullptr; }
  /// The verified schedule (pipelined plans).
  const schedule::Pipeline &pipeline() const { return pipeline_; }
  /// Mesh axis of the pipeline ranks (-1: none).
  int pipelineAxis() const { return ppAxis_; }
  /// Which tensors a process of pipeline rank `rank` holds: those its
  /// instructions read or write, the parameters/state it owns, constants
  /// (all tensors when the plan is not pipelined).
  std::vector<bool> tensorsOnPipelineRank(int rank) const;
  /// The pipeline rank that runs instruction `inst` (-1: every rank, or the
  /// plan is not pipelined).
  int pipelineRankOf(const plan::Instruction &inst) const {
    return pipelined() && inst.chunk() >= 0 ? pipeline_.rankOf(inst.chunk()) : -1;
  }
  /// Whether instruction `inst` runs on pipeline rank `rank`.
  bool runsOnPipelineRank(const plan::Instruction &inst, int rank) const {
    int own = pipelineRankOf(inst);
    return own < 0 || own == rank;
  }

private:
  Status verify();
  Status verifyPipeline();
  int microbatches_ = 1;
  int ppAxis_ = -1;
  schedule::Pipeline pipeline_;
  std::vector<uint8_t> bytes_;
  const plan::Plan *plan_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::vector<std::string> meshAxes_;
  std::vector<int> meshSizes_;
  std::string origin_;
};

/// The exclusive upper bound of the ids in i32 tensor `tensor`, from the
/// instructions that read it (embedding rows, cross-entropy classes, number of
/// experts), or -1 when no instruction bounds it.
int64_t idUpperBound(const LoadedPlan &plan, int32_t tensor);

/// Whether an all-reduce bucket sums in place: the compiler laid its operands
/// back to back in the arena, each at the next kBucketAlignment-byte boundary,
/// and gave each result its operand's memory (see PlanMemory), so no staging
/// buffer is needed: the block from the first operand to the end of the last
/// one is reduced as it is, padding included.
inline constexpr int64_t kBucketAlignment = 64;
bool allReduceInPlace(const LoadedPlan &plan, const plan::Instruction &inst);
/// The bytes of that block.
int64_t inPlaceBucketBytes(const LoadedPlan &plan, const plan::Instruction &inst);

/// What the compiler's memory report predicts a rank allocates: persistent
/// tensors (parameters, state, inputs, constants), the arena, and the
/// collectives' staging buffer (collectiveStagingBytes), of pipeline rank
/// `pipelineRank` for a pipelined plan (its activation stash is dynamic and
/// not included).
int64_t predictedPeakBytes(const LoadedPlan &plan, int pipelineRank = 0);
/// Bytes of the largest collective a pipeline rank's instructions run (an
/// all-reduce's buckets, an all-gather's result, a reduce-scatter's input,
/// both buffers of an all-to-all).
int64_t largestCollectiveBytes(const LoadedPlan &plan, int pipelineRank = 0);
/// The staging buffer ptc-run allocates for those collectives: the largest,
/// leaving out all-reduce buckets that sum in place (allReduceInPlace).
int64_t collectiveStagingBytes(const LoadedPlan &plan, int pipelineRank = 0);
/// Bytes of the tensors a pipeline rank keeps in host memory (offloaded).
int64_t predictedHostBytes(const LoadedPlan &plan, int pipelineRank = 0);

/// The plan as JSON (for --dump-plan and FileCheck tests).
std::string planToJson(const LoadedPlan &plan);

} // namespace ptc

#endif // PTC_RUNTIME_PLAN_PLAN_LOADER_H
