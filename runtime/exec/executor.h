// The CPU executor: owns the storage of every plan tensor (persistent
// parameters/state/inputs/constants, and one arena for temporaries) and runs
// the plan's instructions in order, one kernel call each.
#ifndef PTC_RUNTIME_EXEC_EXECUTOR_H
#define PTC_RUNTIME_EXEC_EXECUTOR_H

#include "runtime/base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/plan/plan_loader.h"

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

class Executor {
public:
  /// `pipelineRank`: this process's coordinate on the plan's pipeline axis
  /// (it allocates and runs only that rank's chunks).
  static StatusOr<std::unique_ptr<Executor>> create(std::shared_ptr<const LoadedPlan> plan,
                                                    int pipelineRank = 0);

  const LoadedPlan &plan() const { return *plan_; }

  /// Raw storage of tensor `id` (plan tensor index).
  void *data(int32_t id) { return storage_[static_cast<size_t>(id)]; }
  float *f32(int32_t id) { return static_cast<float *>(data(id)); }
  int32_t *i32(int32_t id) { return static_cast<int32_t *>(data(id)); }

  /// Initializes parameters from their plan initializers and zeroes optimizer
  /// state. Each tensor draws from its own stream seeded by (seed, name), so
  /// the values do not depend on the tensor order.
  void initialize(uint64_t seed);

  /// Sets the local part of tensor `id` from its whole value (global shape).
  void loadFromWhole(int32_t id, const void *whole);
  /// The whole value of tensor `id` on rank 0 (collective: every rank calls
  /// it; other ranks get an empty vector).
  StatusOr<std::vector<float>> gatherWhole(int32_t id);

  /// Sets input `id` for the next step from the whole global batch (all
  /// micro-batches; rows = micro-batch rows x micro-batches).
  void setInput(int32_t id, const void *wholeBatch);

  /// Runs one training step: every instruction once, or for a pipelined plan
  /// this rank's schedule (compute actions over the micro-batches, sends and
  /// receives) and then its once-per-step instructions. With `profile` (one
  /// entry per opcode), adds each instruction's wall time to its opcode.
  Status step(std::vector<double> *profile = nullptr);

  /// Whether tensor `id` has storage on this rank (pipelined plans hold only
  /// their chunks' tensors).
  bool holds(int32_t id) const { return storage_[static_cast<size_t>(id)] != nullptr; }

  /// Records one event per schedule action (name, start, duration in us).
  struct TraceEvent {
    std::string name;
    double startUs, durationUs;
  };
  void setTracing(bool on) { tracing_ = on; }
  const std::vector<TraceEvent> &trace() const { return trace_; }
  /// Most bytes the activation stash held at once (pipelined plans).
  int64_t stashPeakBytes() const { return stashPeak_; }

  /// The communicator for the plan's collectives (none: every mesh axis has
  /// size 1, or the plan has no mesh). Not owned.
  void setCommunicator(Communicator *comm) { comm_ = comm; }

  /// Bytes of the arena and of persistent storage.
  int64_t arenaBytes() const { return arenaBytes_; }
  int64_t persistentBytes() const { return persistentBytes_; }
  /// High-water mark of the buffer collectives pack and unpack through.
  int64_t communicationBytes() const {
    return static_cast<int64_t>(staging_.capacity() * sizeof(float));
  }

private:
  explicit Executor(std::shared_ptr<const LoadedPlan> plan) : plan_(std::move(plan)) {}
  Status run(const plan::Instruction &inst);
  Status runKernel(const plan::Instruction &inst);
  Status runBf16Reduction(const plan::Instruction &inst);
  /// Lays a reduce-scatter's input out as one contiguous block per group member.
  void blocksForReduceScatter(const plan::Instruction &inst, void *staging, size_t elementBytes);
  std::vector<uint16_t> staging16_;
  std::vector<std::vector<float>> widened_; // f32 copies of bf16 / f16 tensors

  Status runCollective(const plan::Instruction &inst);
  Status runVocabParallelCrossEntropy(const plan::Instruction &inst);
  /// Calls fn(wholeOffsets, localOffsets, box) for every box of tensor `t`'s
  /// local part that a device at `coords` holds.
  template <typename Fn>
  void forEachLocalBox(const TensorInfo &t, const std::vector<int> &coords, Fn fn) const;
  std::vector<int> coords() const;

  /// Pipelined plans.
  struct SegmentPlan {
    std::vector<uint32_t> instructions;
    std::vector<int32_t> imports;                 // read here, produced by another segment
    std::vector<std::pair<int32_t, int>> exports; // produced here: (tensor, consumers elsewhere)
    bool readsInputs = false;
  };
  struct Stashed {
    std::vector<uint8_t> bytes;
    int consumers = 0;
  };
  Status preparePipeline();
  Status runPipelined(std::vector<double> *profile);
  Status runInstruction(uint32_t n, std::vector<double> *profile);
  Status runAction(size_t index, std::vector<double> *profile);
  void loadMicrobatch(int mb);
  Status stash(int32_t tensor, int mb, const void *data, int consumers);
  Status unstash(int32_t tensor, int mb, void *out);
  Status shareOutputs();

  std::shared_ptr<const LoadedPlan> plan_;
  Communicator *comm_ = nullptr;
  int ppRank_ = 0;
  std::map<std::pair<int, int>, SegmentPlan> segments_; // (chunk, segment)
  std::vector<uint32_t> stepInstructions_;
  std::vector<int32_t> accumulators_;
  std::map<int32_t, int> recvConsumers_;
  std::map<int32_t, std::set<std::pair<int, int>>> readers_; // tensor -> segments importing it
  std::map<int32_t, int> sendsOf_;                           // tensor -> send instructions
  std::vector<int> nextCompute_;                             // per action: next compute action
  std::set<std::pair<int32_t, int>> direct_; // (tensor, mb) left in the arena for the next action
  std::map<std::pair<int32_t, int>, Stashed> stash_;
  int64_t stashBytes_ = 0, stashPeak_ = 0;
  std::map<int32_t, std::vector<uint8_t>> batches_; // input -> whole batch
  std::vector<std::pair<int32_t, int>> remoteOutputs_; // (output tensor, producing pipeline rank)
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  std::vector<float> staging_;
  std::vector<std::unique_ptr<uint8_t[], void (*)(void *)>> buffers_;
  std::vector<void *> storage_;
  int64_t arenaBytes_ = 0, persistentBytes_ = 0;
};

/// Deterministic N(0, std) values for tensor `name` under `seed`.
void fillNormal(float *out, int64_t n, double stddev, uint64_t seed, const std::string &name);

} // namespace ptc

#endif // PTC_RUNTIME_EXEC_EXECUTOR_H
