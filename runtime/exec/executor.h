// The executor: owns the storage of every plan tensor on its device
// (persistent parameters/state/inputs/constants, and one arena for
// temporaries) and runs the plan's instructions in order, one device kernel
// call each (runtime/device: the CPU or a GPU).
#ifndef PTC_RUNTIME_EXEC_EXECUTOR_H
#define PTC_RUNTIME_EXEC_EXECUTOR_H

#include "runtime/base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/exec/offload_file.h"
#include "runtime/plan/pipeline_segments.h"
#include "runtime/plan/plan_loader.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

namespace ptc {

/// How a plan's instructions run on a backend's kernel table, by op kind:
/// natively (the entry, or for a group of optimizer updates its batched
/// form, takes their element types), widened to f32 (the
/// runtime converts their 16-bit tensors around the f32 kernel: two extra
/// passes over each), or by the runtime itself (collectives, transfers, the
/// host's instructions, what it composes from kernel pieces).
struct KernelCoverage {
  std::map<std::string, int64_t> native, widened, composed;
};
/// `table`'s coverage of `plan` (no device needed: entries decide by their
/// views' element types and shapes). An attention entry that asks cuDNN
/// counts as widened where cuDNN cannot run here.
KernelCoverage kernelCoverage(const LoadedPlan &plan, const kernels::KernelTable &table);
/// Three lines: each kind with its op kinds and counts.
std::string describe(const KernelCoverage &coverage);

class Executor {
public:
  /// `pipelineRank`: this process's coordinate on the plan's pipeline axis
  /// (it allocates and runs only that rank's chunks).
  /// `device`: where tensors live and kernels run (default: the CPU).
  /// `offloadDir`: keep the plan's host-resident model state (offload=
  /// optimizer's master weights and optimizer state) in a file there
  /// (runtime/exec/offload_file.h), named after `rank`.
  static StatusOr<std::unique_ptr<Executor>> create(std::shared_ptr<const LoadedPlan> plan,
                                                    int pipelineRank = 0,
                                                    std::unique_ptr<Device> device = nullptr,
                                                    const std::string &offloadDir = "",
                                                    int rank = 0);
  ~Executor();

  Device &device() { return *dev_; }

  const LoadedPlan &plan() const { return *plan_; }

  /// Storage of tensor `id` (plan tensor index) in device memory. Writing a
  /// parameter through it bypasses its working copy (WorkingCopy tensors):
  /// set parameters with loadLocal / loadFromWhole.
  void *data(int32_t id) { return storage_[static_cast<size_t>(id)]; }
  float *f32(int32_t id) { return static_cast<float *>(data(id)); }
  int32_t *i32(int32_t id) { return static_cast<int32_t *>(data(id)); }

  /// Initializes parameters from their plan initializers and zeroes optimizer
  /// state. Each tensor draws from its own stream seeded by (seed, name), so
  /// the values do not depend on the tensor order.
  Status initialize(uint64_t seed);

  /// A box of tensor `id` this rank holds: where it lies in the whole tensor
  /// and in the local one (a blocked split gives several per tensor).
  struct LocalBox {
    std::vector<int64_t> wholeOffset, localOffset, shape;
  };
  std::vector<LocalBox> localBoxes(int32_t id) const;

  /// Sets the local part of tensor `id` from its whole value (global shape).
  Status loadFromWhole(int32_t id, const void *whole);
  /// The same from f32 values, rounded once to the tensor's type (bf16 / f16).
  Status loadFromWholeF32(int32_t id, const float *whole);
  /// Sets the local part of tensor `id` from host bytes in its local layout.
  Status loadLocal(int32_t id, const void *local);
  /// Copies this rank's part of tensor `id` to host memory `out` (its bytes).
  Status readLocal(int32_t id, void *out);
  /// The first element of f32 tensor `id` (a loss, a norm), read to the host.
  StatusOr<float> scalar(int32_t id);
  /// A scalar this step computed on the host (a scheduled learning rate), or
  /// else scalar(id).
  StatusOr<float> hostScalar(int32_t id);
  /// The whole value of tensor `id` on rank 0 (collective: every rank calls
  /// it; other ranks get an empty vector).
  StatusOr<std::vector<float>> gatherWhole(int32_t id);

  /// Evaluation: the next steps run without any instruction that writes a
  /// parameter or optimizer state (updates, the step count, the loss scale),
  /// so the loss is the model's on the batch and nothing changes.
  void setEvaluating(bool on) {
    evaluating_ = on;
    random_.training = !on && !inference_;
  }
  /// A forward-only run (generation): dropout is the identity.
  void setInference(bool on) {
    inference_ = on;
    random_.training = !on && !evaluating_;
  }

  /// The seed and step index the next step's dropout masks are keyed by
  /// (kernels/common/dropout.h): the run's seed, and the step's index from
  /// the run's start (a resumed run goes on from its checkpoint's step).
  void setRandomKey(uint64_t seed, int64_t step) {
    random_.seed = seed;
    random_.step = step;
  }

  /// Sets input `id` for the next step from the whole global batch (all
  /// micro-batches; rows = micro-batch rows x micro-batches).
  Status setInput(int32_t id, const void *wholeBatch);

  /// Runs one training step: every instruction once, or for a pipelined plan
  /// this rank's schedule (compute actions over the micro-batches, sends and
  /// receives) and then its once-per-step instructions. With `profile` (one
  /// entry per opcode), adds each instruction's time to its opcode: its wall
  /// time on the host, or on a device that runs kernels asynchronously the
  /// compute stream's time between marks around it, read at the step's end
  /// (no wait per instruction; a collective on the communication stream
  /// counts the compute stream's wait for it).
  Status step(std::vector<double> *profile = nullptr);

  /// Where ring attention's time goes (context parallelism), summed over its
  /// instructions since the executor was made: the blocks' compute, the time
  /// spent handing blocks to the next rank and waiting for the previous
  /// rank's (the transfer the compute did not hide), the rest (layout moves
  /// and the softmax's normalization), and the bytes it passed on. With
  /// `PTC_RING_SERIAL=1` in the environment each transfer completes before the
  /// step's compute (no overlap): a benchmark's reference for what the
  /// overlap hides.
  struct RingProfile {
    int64_t instructions = 0;
    double seconds = 0, computeSeconds = 0, transferSeconds = 0, bytes = 0;
    /// Attention FLOPs of the blocks (query-key pairs the causal mask leaves,
    /// 4 x head dim each; the gradient's blocks 2.5x): the load balance.
    double flops = 0;
  };
  const RingProfile &ringProfile() const { return ringProfile_; }

  /// Whether tensor `id` has storage on this rank (pipelined plans hold only
  /// their chunks' tensors).
  bool holds(int32_t id) const { return storage_[static_cast<size_t>(id)] != nullptr; }

  /// Records one event per schedule action (pipelined plans) or instruction
  /// (name, start from the step's start, duration; us).
  struct TraceEvent {
    std::string name;
    double startUs, durationUs;
  };
  void setTracing(bool on) { tracing_ = on; }
  /// A trace event's time: microseconds from `start` (the step's).
  static double microsecondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
        .count();
  }
  const std::vector<TraceEvent> &trace() const { return trace_; }
  /// Most bytes the activation stash held at once (pipelined plans).
  int64_t stashPeakBytes() const { return stashPeak_; }
  /// The stash peak this rank's schedule needs, simulated on the plan (the
  /// compiler's prediction; 0 for a plan without pipeline).
  int64_t predictedStashBytes() const {
    return plan_->pipelined() ? simulateStashPeak(*plan_, pipeline_, ppRank_) : 0;
  }

  /// Where the executor stores the index of the instruction it is running
  /// (before it starts it): a launcher that maps this memory from a file
  /// can say where a rank that stopped responding stopped. Not owned; null:
  /// none.
  void setProgress(std::atomic<int32_t> *instruction) { progress_ = instruction; }

  /// The communicator for the plan's collectives (none: every mesh axis has
  /// size 1, or the plan has no mesh). Not owned.
  void setCommunicator(Communicator *comm) {
    comm_ = comm;
    callMeshSizes_.clear(); // the kernel calls' mesh coordinates are the communicator's
  }

  /// Every set of mesh axes the plan's collectives run over (communicators
  /// that build their groups up front need the whole list on every rank).
  static std::vector<std::vector<int>> collectiveGroups(const LoadedPlan &plan);

  /// Bytes of the arena and of persistent storage.
  int64_t arenaBytes() const { return arenaBytes_; }
  int64_t persistentBytes() const { return persistentBytes_; }
  /// Bytes of the tensors kept in host memory (offload=optimizer), not
  /// counted in the two above.
  int64_t hostBytes() const { return hostBytes_; }
  /// Of those, the bytes kept in the offload file (0 without one).
  int64_t fileBytes() const { return fileBytes_; }
  /// High-water mark of the buffer collectives pack and unpack through.
  int64_t communicationBytes() const { return staging_.capacity(); }

private:
  std::unordered_map<int32_t, float> hostScalars_; // host copies of host-computed scalars
  bool evaluating_ = false, inference_ = false;
  /// What dropout's masks are keyed by besides the elements (the micro-batch
  /// of the compute action running now).
  kernels::RandomContext random_;
  std::atomic<int32_t> *progress_ = nullptr;
  std::vector<bool> writesState_; // per instruction: writes a parameter or optimizer state
  explicit Executor(std::shared_ptr<const LoadedPlan> plan) : plan_(std::move(plan)) {}
  // First members: destroyed last, after every DeviceBuffer below.
  std::unique_ptr<Device> dev_;
  /// Offloaded plans on a discrete device: the host CPU, which holds the
  /// plan's host tensors and runs its host instructions (null otherwise:
  /// the device's own memory is host memory).
  std::unique_ptr<Device> hostDev_;
  Device &hostDevice() { return hostDev_ ? *hostDev_ : *dev_; }
  /// Where tensor `id` lives / where an instruction runs.
  Device &deviceOf(int32_t id) {
    return plan_->tensor(id).host ? hostDevice() : *dev_;
  }
  Device &deviceFor(const plan::Instruction &inst) {
    return inst.on_host() ? hostDevice() : *dev_;
  }
  std::vector<void *> hostBuffers_; // hostDevice() allocations: the host tensors
  bool pinned_ = false;             // hostBuffers_ page-locked for dev_
  bool asyncTransfers_ = false;     // host-device copies in flight since the last synchronize
  /// Waits for the copies in flight (and the collectives before them).
  Status finishTransfers();
  int64_t hostBytes_ = 0;
  int64_t fileBytes_ = 0;
  /// NVMe offload: the file, each tensor's range in it ({-1, 0}: not in
  /// it), and per instruction the file tensors it reads or writes, read
  /// ahead a few instructions before and released after a use that is not
  /// followed by another soon.
  std::unique_ptr<OffloadFile> file_;
  std::vector<std::pair<int64_t, int64_t>> fileRange_;
  std::vector<std::vector<int32_t>> fileUses_;
  std::vector<std::vector<uint32_t>> fileUseAt_; // per tensor: the instructions using it
  void prefetchFileTensors(uint32_t from, uint32_t to);
  void afterFileWrite(int32_t id);
  /// Rounds parameter `param` into its working copy, if it has one (after the
  /// parameter was set from outside a step).
  Status roundWorkingCopy(int32_t param);
  bool fileWritten_ = false; // a step ran: the file holds more than its zeros
  bool measureFile_ = false;
  void releaseFileTensors(uint32_t n, uint32_t end);
  Status run(const plan::Instruction &inst);
  /// Multi-tensor optimizer groups: groupEnd_[n] != 0 for the first
  /// instruction of a group (one past its last), covered_ for the others.
  void groupOptimizerUpdates();
  Status runOptimizerGroup(uint32_t first, uint32_t end);
  Status runOptimizerBucket(uint32_t first, uint32_t end, int64_t begin = 0, int64_t stop = -1);
  static constexpr uint32_t kFileLookahead = 8;              // instructions read ahead
  static constexpr int64_t kFileBucketBytes = int64_t{64} << 20; // optimizer state per bucket
  static constexpr size_t kFileBucketsInFlight = 2;                // releases queued at most
public:
  /// NVMe offload: the most bytes of the file seen resident in host memory
  /// (after each use; 0 without a file).
  int64_t filePeakResidentBytes() const { return file_ ? file_->peakResidentBytes() : 0; }
  /// Measure the file's residency after each use (off by default: each
  /// measurement is a pass over the file's pages).
  void measureFileResidency(bool on) { measureFile_ = on; }
private:
  std::vector<uint32_t> groupEnd_;
  std::vector<bool> covered_;
  /// An instruction: through its device's kernel table (widened to f32
  /// where the entry does not take its element types), else runHostOp.
  Status runKernel(const plan::Instruction &inst);
  /// The instructions the executor runs itself: on the host, or composed
  /// from kernel pieces and collectives.
  Status runHostOp(const plan::Instruction &inst);
  /// An optimizer update's scheduled learning rate (the host's value this
  /// step), which its call carries in its `lr` attribute where its kernel reads it;
  /// nothing for other instructions and unscheduled updates.
  StatusOr<std::optional<double>> scheduledLr(const plan::Instruction &inst);
  /// After UnscaleGrads / AnyNonfinite: their flag's maximum over the
  /// instruction's mesh axes.
  Status reduceFlag(const plan::Instruction &inst);
  /// The (weighted) sum of squares over the group, then the clip.
  Status runClipGradNorm(const plan::Instruction &inst);
  /// Runs `body` with the instruction's bf16 / f16 tensors replaced by f32
  /// copies, rounding its low-precision results back.
  Status runWidened(const plan::Instruction &inst, const std::function<Status()> &body);
  /// The instruction as its kernel sees it (views into the buffers below,
  /// valid until the next call).
  kernels::KernelCall kernelCall(const plan::Instruction &inst);
  /// kernelCall without the mesh coordinates (which a kernel reads only when it runs).
  kernels::KernelCall typedCall(const plan::Instruction &inst);
  /// Asks every instruction's kernel, once at load, whether it takes the
  /// instruction's element types and shapes: a kernel that builds per-shape
  /// state (the CPU's oneDNN matmul primitives) builds it then, not in a step.
  void prepareKernels();
  std::vector<kernels::TensorView> callInputs_, callOutputs_;
  std::vector<int64_t> callInts_, callMeshCoords_, callMeshSizes_;
  std::vector<double> callFloats_;
  bool widening_ = false; // inside runWidened: low-precision tensors are f32 copies
  /// The bytes tensor `id`'s storage holds now: an f32 copy's while
  /// runWidened has put one in place of a bf16 / f16 tensor (the collectives
  /// of f16 values sum those copies), else the plan's.
  int64_t heldBytes(int32_t id) const;
  /// Lays a reduce-scatter's input out as one contiguous block per group member.
  Status blocksForReduceScatter(const plan::Instruction &inst, void *staging, int64_t elementBytes);
  std::vector<DeviceBuffer> widened_; // f32 copies of bf16 / f16 tensors

  // Collectives (see executor.cc).
  bool commOnDevice() const;
  StatusOr<void *> commView(const void *p, int64_t bytes, int slot, bool load);
  /// Host staging buffer `slot` holding `bytes` (a copy of device `p` when `load`).
  StatusOr<void *> hostStage(const void *p, int64_t bytes, int slot, bool load);
  Status commWriteBack(void *p, void *view, int64_t bytes);
  Status reuseStaging();
  Status enterComm();
  Status leaveComm(const std::vector<int32_t> &results, bool overlap);
  Status awaitPending(const plan::Instruction &inst);
  /// The compute stream waits for the collective writing tensor `id`, if any.
  Status awaitTensor(int32_t id);
  /// Before the host blocks on the device: collectives must finish (or fail
  /// by timeout) first, or a dead peer would hang the copy.
  Status hostSync();
  Status runBucketAllReduce(const plan::Instruction &inst, bool bf16);
  Status runReduceScatter(const plan::Instruction &inst, bool bf16);
  Status allReduceSmall(float *values, int64_t count, const std::vector<int> &axes, bool max,
                        const std::string &what);
  std::map<int32_t, Event> pending_; // collective results the compute stream has not waited for
  Event lastComm_ = -1;
  std::vector<uint8_t> hostStaging_[2];
  DeviceBuffer rowScratch_;
  Status runCollective(const plan::Instruction &inst);
  Status runVocabParallelCrossEntropy(const plan::Instruction &inst);
  /// Whether the vocabulary-parallel loss (or its gradient) runs on its
  /// low-precision logits as they are: bf16 / f16 logits, f32 scalars, and the
  /// device's pieces take the logits' type (else runWidened widens them).
  bool vocabLossNative(const plan::Instruction &inst);
  /// The vocabulary-parallel losses that do (decided once, by prepareKernels).
  std::set<const plan::Instruction *> nativeVocabLosses_;
  /// Ring attention (context parallelism) and its gradient: key/value blocks
  /// passed around the ring of the instruction's mesh axis (see collectives.cc).
  Status runRingAttention(const plan::Instruction &inst);
  DeviceBuffer ringScratch_;
  RingProfile ringProfile_;
  const bool ringSerial_ = [] {
    const char *v = std::getenv("PTC_RING_SERIAL");
    return v && std::string(v) == "1";
  }();
  /// Calls fn(wholeOffsets, localOffsets, box) for every box of tensor `t`'s
  /// local part that a device at `coords` holds.
  template <typename Fn>
  void forEachLocalBox(const TensorInfo &t, const std::vector<int> &coords, Fn fn) const;
  std::vector<int> coords() const;

  /// Pipelined plans.
  struct Stashed {
    DeviceBuffer buffer;
    int64_t bytes = 0;
    int consumers = 0;
  };
  Status preparePipeline();
  Status runPipelined(std::vector<double> *profile);
  Status runInstruction(uint32_t n, std::vector<double> *profile);
  Status runAction(size_t index, std::vector<double> *profile);
  Status loadMicrobatch(int mb);
  /// How many data-parallel parts input `t`'s rows are dealt to (its first
  /// dimension's mesh axis size; 1 when whole).
  int dataParts(const TensorInfo &t) const;
  Status stash(int32_t tensor, int mb, const void *data, int consumers);
  Status takeStashBuffer(DeviceBuffer &buffer, int64_t bytes);
  std::vector<DeviceBuffer> stashPool_; // freed stash buffers, reused
  Status unstash(int32_t tensor, int mb, void *out);
  Status shareOutputs();
  /// Point-to-point along the pipeline axis (staged through host memory on GPUs).
  StatusOr<void *> p2pView(const void *p, int64_t bytes, int slot, bool load);
  Status sendBytes(const void *p, int64_t bytes, int peer, int tag, const std::string &what);
  Status recvBytes(void *p, int64_t bytes, int peer, int tag, const std::string &what);

  std::shared_ptr<const LoadedPlan> plan_;
  Communicator *comm_ = nullptr;
  int ppRank_ = 0;
  PipelineSegments pipeline_; // this pipeline rank's segments, imports, exports
  std::vector<uint32_t> stepInstructions_;
  std::set<std::pair<int32_t, int>> direct_; // (tensor, mb) left in the arena for the next action
  std::map<std::pair<int32_t, int>, Stashed> stash_;
  int64_t stashBytes_ = 0, stashPeak_ = 0;
  std::map<int32_t, std::vector<uint8_t>> batches_; // input -> whole batch
  std::vector<std::pair<int32_t, int>> remoteOutputs_; // (output tensor, producing pipeline rank)
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  /// A profile on a device that runs kernels asynchronously: each
  /// instruction's marks on the compute stream, read after the step's
  /// synchronize (no wait per instruction).
  struct TimedInstruction {
    size_t op;
    Event start, end;
  };
  std::vector<TimedInstruction> timedProfile_;
  Status addTimedProfile(std::vector<double> &profile);
  static void addToProfile(std::vector<double> &profile, size_t op, double seconds);
  DeviceBuffer staging_;
  std::vector<void *> buffers_; // device allocations: the arena, persistent tensors
  std::vector<void *> storage_;
  int64_t arenaBytes_ = 0, persistentBytes_ = 0;
};

/// Deterministic N(0, std) values for tensor `name` under `seed`.
void fillNormal(float *out, int64_t n, double stddev, uint64_t seed, const std::string &name);

} // namespace ptc

#endif // PTC_RUNTIME_EXEC_EXECUTOR_H
