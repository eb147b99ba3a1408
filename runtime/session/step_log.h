// Per-step hooks of a training run (ptc-run's): the evaluation, the metrics files (JSON lines,
// CSV, TensorBoard) and the progress line. Steps count from 1 everywhere: the
// progress line, "eval after step N", the metrics files and checkpoints'
// step-N.
#ifndef PTC_RUNTIME_SESSION_STEP_LOG_H
#define PTC_RUNTIME_SESSION_STEP_LOG_H

#include "runtime/io/scalar_log.h"
#include "runtime/io/token_data.h"
#include "runtime/session/training_session.h"

#include <fstream>
#include <optional>
#include <string>

namespace ptc {

/// Every N steps, the mean loss over the first K batches of --eval-data
/// (forward and backward without updates: nothing changes).
class EvalHook : public SessionHook {
public:
  /// Evaluates after every `every`-th step and after the run's last step
  /// (`lastStep`), so that a run shorter than `every` still ends with one.
  EvalHook(const TokenData *data, int64_t every, int64_t batches, int64_t lastStep)
      : data_(data), every_(every), batches_(batches), finalStep_(lastStep) {}
  Status afterStep(TrainingSession &session, const StepResult &r) override;
  /// The eval loss computed after step `step`, if any.
  std::optional<float> at(int64_t step) const {
    return step == lastStep_ ? std::optional<float>(lastLoss_) : std::nullopt;
  }

private:
  const TokenData *data_;
  int64_t every_, batches_, finalStep_;
  int64_t lastStep_ = -1;
  float lastLoss_ = 0.0f;
};

/// What a step's figures are computed against: the plan's model FLOPs per
/// step and rank count, the device's peak (0: unknown), the run's last step.
struct ThroughputBasis {
  double modelFlops = 0.0;
  int ranks = 1;
  double peakTflops = 0.0;
  int64_t lastStep = 0; ///< 0-based
  bool tokens = true;   ///< token data (tok/s) or arrays (examples/s)
};

/// One step's own scalars, in the order the CSV columns take: step, loss, lr,
/// grad_norm, loss_scale, tokens_per_s (examples_per_s for array data),
/// tflops_per_device, mfu, elapsed_s, eval_loss.
ScalarRow stepScalars(const StepResult &r, const ThroughputBasis &basis,
                      std::optional<float> evalLoss);
/// The plan's metrics as scalars (the CSV's and TensorBoard's further
/// columns): a scalar as it is, a vector as NAME_min, NAME_max, NAME_mean.
ScalarRow metricScalars(const StepResult &r);

/// The metrics files of the leader rank: --metrics (JSON lines), --metrics-csv, --tensorboard.
class MetricsWriter : public SessionHook {
public:
  void setEval(const EvalHook *eval) { eval_ = eval; }
  void setBasis(const ThroughputBasis &basis) { basis_ = basis; }
  /// `append`: a resumed run adds its steps to the files of the run it continues.
  Status openJsonLines(const std::string &path, bool append);
  Status openCsv(const std::string &path, bool append) { csvOpen_ = true; return csv_.open(path, append); }
  /// `append` as openJsonLines'; `removed`: earlier runs' event files a fresh run removed.
  Status openTensorBoard(const std::string &dir, bool append, int *removed = nullptr) {
    tbOpen_ = true;
    return tb_.open(dir, append, removed);
  }
  Status afterStep(TrainingSession &, const StepResult &r) override;

private:
  void writeJsonLine(const StepResult &r, const ScalarRow &fixed);
  std::ofstream jsonl_;
  CsvScalarLog csv_;
  TensorBoardLog tb_;
  bool csvOpen_ = false, tbOpen_ = false;
  ThroughputBasis basis_;
  const EvalHook *eval_ = nullptr;
};

/// "step    100/1000 | loss 2.9383 |     31241 tok/s | 0.41 TFLOP/s, MFU 9.1% | 1.6 s, ETA 14.9 s
/// | lr 1.0e-03 | grad norm 0.412 | MoE load max/mean 1.21" every N steps (the
/// parts a plan has).
class ProgressPrinter : public SessionHook {
public:
  ProgressPrinter(int64_t every, int64_t steps) : every_(every), steps_(steps) {}
  void setEval(const EvalHook *eval) { eval_ = eval; }
  void setBasis(const ThroughputBasis &basis) { basis_ = basis; }
  /// A resumed run starts at step `first`.
  void setFirst(int64_t first) { lastStep_ = first; }
  Status afterStep(TrainingSession &session, const StepResult &r) override;

private:
  int64_t every_, steps_, lastStep_ = 0;
  double lastElapsed_ = 0.0;
  ThroughputBasis basis_;
  const EvalHook *eval_ = nullptr;
};

/// Dynamic loss scaling: a lower scale than the last step's means that step
/// overflowed and was skipped.
class LossScaleTracker : public SessionHook {
public:
  Status afterStep(TrainingSession &, const StepResult &r) override;
  bool active() const { return active_; }
  float last() const { return last_; }
  int64_t skipped() const { return skipped_; }

private:
  bool active_ = false;
  float last_ = 0.0f;
  int64_t skipped_ = 0;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_STEP_LOG_H
