// TrainingSession: a plan trained on this process's device, from plan to
// device, communicator, executor, data and parameters, and the step loop with
// hooks (metrics, progress, checkpoints and schedules plug in there). ptc-run
// and ptc-gradcheck are flag parsing around it.
#ifndef PTC_RUNTIME_SESSION_TRAINING_SESSION_H
#define PTC_RUNTIME_SESSION_TRAINING_SESSION_H

#include "runtime/base/option_values.h"
#include "runtime/comm/communicator.h"
#include "runtime/exec/executor.h"
#include "runtime/io/array_data.h"
#include "runtime/io/token_data.h"
#include "runtime/plan/plan_loader.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ptc {

struct SessionOptions {
  std::string planPath;
  std::string dataPath;        // token files for 'tokens' / 'targets' (uint16 .bin or ptc's
                               // uint16/uint32 form; files separated by commas: one stream),
                               // or FILE.safetensors: one named array per input (any model)
  std::string dataBlend;       // instead of dataPath: "W1 PATH1 W2 PATH2 ..." (Megatron's blend)
  std::string initPath;        // safetensors parameters (empty: the plan's initializers)
  std::string offloadDir;      // offload=optimizer plans: model state in a file there (NVMe)
  std::optional<uint64_t> shuffleSeed; // token windows in a seeded order (TokenData)
  std::string device = "auto"; // cpu, cpu-discrete, cuda, auto
  CommBackend comm = CommBackend::Auto;
  uint64_t seed = 1337;        // the plan's initializers
  /// Seconds a collective may take (0: defaultCollectiveTimeout of the plan
  /// for the step's collectives and kControlTimeout for the coordinating
  /// ones; a value: both).
  double collectiveTimeout = 0;
  double stepTimeout = 3600.0; // 0: off
  /// A step whose loss or gradients are not finite: the plan skips its update
  /// (plans compiled with skip-nonfinite, the default); the run warns and goes
  /// on, or with this stops with an error naming the step.
  bool stopOnNonfinite = false;
  int64_t maxSkippedSteps = 10; // such steps in a row that stop the run (0: no limit)
  /// Runs when the step watchdog ends the process (before it exits).
  std::function<void()> onStepTimeout;
  /// Where the executor writes the instruction it is running (Executor::setProgress).
  std::atomic<int32_t> *instructionProgress = nullptr;
  bool needsData = true;       // false: inputs are set by the caller (ptc-gradcheck)
  /// A forward-only decode plan (ptc-compile-decode): it returns 'logits'
  /// instead of a loss; the caller sets its inputs (ptc-generate).
  bool inference = false;
};

/// The collective timeout a plan gets by default: 60 s (a rank that waits
/// for a peer's compute, a first step's warm-up) plus its largest collective
/// moved at 10 MB/s, a rate far below any interconnect's (a 25 MB bucket:
/// 62.5 s; a 1 GB ZeRO-3 gather: 160 s).
double defaultCollectiveTimeout(const LoadedPlan &plan, int pipelineRank = 0);
/// `requested` when it is > 0, else the default of the plan (the largest over
/// its pipeline ranks, so that every rank waits as long).
double stepCollectiveTimeout(const LoadedPlan &plan, double requested);
/// The default for collectives that coordinate ranks (the plan check, the
/// checkpoint agreement), where one rank may write a checkpoint's shards
/// while the others wait: 600 s.
inline constexpr double kControlTimeout = 600.0;

/// How a failure ends a multi-rank job: only this rank saw it (the job must be
/// aborted, or peers would wait forever); every rank saw a problem of its own
/// (each reports it and leaves cleanly); every rank saw the same one (rank 0
/// reports it, all leave cleanly).
enum class FailureScope { ThisRank, EachRank, AllRanks };

/// The device is created by createDevice (runtime/device/device.h).
/// The communicator of a plan's mesh: MPI when launched by mpirun/srun (or
/// the plan needs several ranks), NCCL on top for a CUDA device (`comm`: mpi,
/// nccl, auto). Null for a single-process run. Checks that every rank runs
/// the same collectives.
/// `planName` names the plan in messages.
StatusOr<std::unique_ptr<Communicator>> createCommunicator(const LoadedPlan &plan,
                                                           const std::string &planName,
                                                           Device &device, CommBackend comm,
                                                           double collectiveTimeout,
                                                           FailureScope *scope = nullptr);

/// This process's rank among those on its node (OpenMPI, MPICH, Slurm).
int localRank();

/// Whether a --save path names a directory (ends in '/' or is one).
bool isDirectoryTarget(const std::string &path);

/// What one training step produced.
struct StepResult {
  int64_t step = 0;
  float loss = 0.0f;
  std::optional<float> gradNorm;  // plans clipping gradients (NaN on a skipped step)
  std::optional<float> lossScale; // plans with dynamic loss scaling
  std::optional<float> lr;        // plans with a learning-rate schedule (this step's rate)
  bool skipped = false;           // the plan skipped this step's update (non-finite gradients)
  double seconds = 0.0;           // this step
  double elapsedSeconds = 0.0;    // since the run started
  int64_t tokens = 0;             // tokens of the global batch
  /// The plan's metrics ("metric:<name>" outputs, e.g. an MoE layer's
  /// tokens_per_expert), whole; filled on rank 0 (empty elsewhere).
  std::vector<std::pair<std::string, std::vector<float>>> metrics;
};

class TrainingSession;

/// Called around every step of TrainingSession::run; a failed Status ends the run.
class SessionHook {
public:
  virtual ~SessionHook() = default;
  virtual Status beforeStep(TrainingSession &, int64_t /*step*/) { return Status::ok(); }
  virtual Status afterStep(TrainingSession &, const StepResult &) { return Status::ok(); }
  virtual Status afterRun(TrainingSession &) { return Status::ok(); }
  /// Asked after every step's afterStep calls: true ends the run there, with
  /// success and without afterRun (a stop requested by a signal).
  virtual bool endsRun() const { return false; }
};

class TrainingSession {
public:
  static StatusOr<std::unique_ptr<TrainingSession>> create(const SessionOptions &options,
                                                           FailureScope *scope = nullptr);

  /// Feeds step `step`'s batch, runs it and reads its outputs.
  StatusOr<StepResult> runStep(int64_t step);
  /// The mean loss over `batches` batches of `data` (batch e in the standard
  /// order of that file), run without updating anything (Executor::setEvaluating).
  StatusOr<float> evaluate(const TokenData &data, int64_t batches);

  /// Steps [first, first + steps) with the hooks and the step watchdog.
  Status run(int64_t first, int64_t steps, const std::vector<SessionHook *> &hooks);

  /// Parameters from a safetensors file of whole tensors or a Hugging Face
  /// model directory (index + shards; every rank keeps its part); bf16 and
  /// f16 tensors widen to f32; refuses NaN and Inf. Tensors of a file the plan
  /// has no use for are listed in `unused`; in a directory they are an error.
  Status loadParameters(const std::string &path, std::vector<std::string> *unused = nullptr);
  /// The tensors of SessionOptions::initPath that no parameter took.
  const std::vector<std::string> &unusedInitTensors() const { return unusedInitTensors_; }
  /// Gathers every parameter whole; the leader writes them (others return ok):
  /// one safetensors file, or for a directory (`path` ending in '/' or an
  /// existing directory) Hugging Face's sharded form with shards of at most
  /// `maxShardBytes`.
  Status saveParameters(const std::string &path,
                        const std::map<std::string, std::string> &metadata,
                        int64_t maxShardBytes = int64_t{5} * 1000 * 1000 * 1000);

  const LoadedPlan &plan() const { return *plan_; }
  const SessionOptions &options() const { return options_; }
  std::shared_ptr<const LoadedPlan> sharedPlan() const { return plan_; }
  Executor &executor() { return *executor_; }
  Communicator *communicator() { return comm_.get(); }
  bool leader() const { return !comm_ || comm_->rank() == 0; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int pipelineRank() const { return pipelineRank_; }
  const TokenData *data() const { return data_ ? &*data_ : nullptr; }
  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  /// The bound of token ids the model takes (token data).
  int64_t vocab() const { return vocab_; }
  /// "437760 parameters, batch 8 x seq 64, ... device cpu (2 threads)".
  std::string describe() const;
  /// Per-step time by opcode, accumulated (null: off). With `skipFirst` the
  /// first step this session runs is not counted (it creates the matmul
  /// primitives and touches the arena's pages: one-time costs).
  void setProfile(std::vector<double> *opTimes, bool skipFirst = false) {
    profile_ = opTimes;
    profileSkip_ = skipFirst ? 1 : 0;
  }
  /// The steps whose times `setProfile`'s vector holds.
  int64_t profiledSteps() const { return std::max<int64_t>(0, stepsRun_ - profileSkip_); }
  /// Record schedule actions of the steps from `step` on (pipelined plans).
  void traceFrom(int64_t step) { traceFrom_ = step; }

private:
  TrainingSession() = default;
  Status setUp(const SessionOptions &options, FailureScope &scope);

  SessionOptions options_;
  std::shared_ptr<const LoadedPlan> plan_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Executor> executor_;
  std::optional<TokenData> data_;
  std::optional<ArrayData> arrays_;          // --data FILE.safetensors
  std::vector<int32_t> arrayIds_;            // the inputs it feeds, in its order
  std::vector<std::vector<uint8_t>> arrayBatches_;
  std::string deviceText_;
  double collectiveTimeout_ = 0; // as requested (0: the plan's default)
  int pipelineRank_ = 0;
  int32_t lossId_ = -1, gradNormId_ = -1, lossScaleId_ = -1, lrId_ = -1, skippedId_ = -1,
          tokensId_ = -1, targetsId_ = -1, positionsId_ = -1;
  /// Packed documents: the plan's end-of-document token (its 'positions'
  /// input restarts after it), or -1.
  int64_t documentEnd_ = -1;
  /// Fills and sets the 'positions' input of packed documents from `tokens`
  /// [batch_, seq_] (nothing without it).
  Status setDocumentPositions(const int32_t *tokens);
  int64_t skippedInARow_ = 0; // steps with non-finite gradients, the latest ones
  /// Checks a step's loss and gradients (ptc-run --on-nonfinite).
  Status checkFinite(const StepResult &r);
  std::vector<std::pair<std::string, int32_t>> metricIds_;
  int64_t batch_ = 0, seq_ = 0, vocab_ = 65536;
  std::vector<int32_t> wholeTokens_, wholeTargets_, wholePositions_;
  std::vector<double> *profile_ = nullptr;
  int64_t profileSkip_ = 0, stepsRun_ = 0;
  int64_t traceFrom_ = -1;
  double elapsedBase_ = 0.0;
  std::vector<std::string> unusedInitTensors_;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_TRAINING_SESSION_H
