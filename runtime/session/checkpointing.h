// Saving and resuming a training job through distributed checkpoints
// (runtime/io/dist_checkpoint.h): every rank writes the boxes of parameters
// and optimizer state it owns (each box once: replicas are deduplicated), the
// leader writes the metadata and publishes the checkpoint atomically; a
// resume reads, in any layout, the boxes each tensor of this rank overlaps.
#ifndef PTC_RUNTIME_SESSION_CHECKPOINTING_H
#define PTC_RUNTIME_SESSION_CHECKPOINTING_H

#include "runtime/session/training_session.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ptc {

/// Writes the checkpoint of `steps` completed steps into `dir` (collective:
/// every rank calls it). `keepLast` > 0 prunes older complete checkpoints
/// after the new one is published. Fault injection for the tests:
/// PTC_FAULT_CHECKPOINT_KILL=STEPS kills rank 0 with SIGKILL after the shards
/// of that checkpoint are written, before it is published.
Status saveCheckpoint(TrainingSession &session, const std::string &dir, int64_t steps,
                      int keepLast);

/// Loads the newest complete checkpoint under `dir` (or `dir` itself) into the
/// session and returns its step count: the index of the next step. A
/// checkpoint of another model (parameter names or shapes) is an error naming
/// the first difference; optimizer state the plan lacks or lacks in the
/// checkpoint, and a different optimizer, are `warnings` (missing state
/// starts from zero). Incomplete checkpoint directories are reported there too.
StatusOr<int64_t> resumeFromCheckpoint(TrainingSession &session, const std::string &dir,
                                       std::vector<std::string> *warnings);

struct ShardSnapshot;

/// A checkpoint between its phases: prepared and snapshotted at a step
/// boundary, its shard written (possibly on a thread), then published.
struct PendingCheckpoint {
  std::string dir, tmp;
  int64_t steps = 0;
  std::unique_ptr<ShardSnapshot> snapshot;
  std::string shard; // this rank's shard description, or "error:..."
  ~PendingCheckpoint();
};

/// Saves a checkpoint every `every` steps. With `async`, the step boundary
/// only copies this rank's boxes to host memory; a background thread writes
/// them and the next step boundary (or finishPending at the end) publishes
/// the checkpoint, so a crash in between leaves the previous one.
class CheckpointHook : public SessionHook {
public:
  CheckpointHook(std::string dir, int64_t every, int keepLast, bool async = false)
      : dir_(std::move(dir)), every_(every), keepLast_(keepLast), async_(async) {}
  ~CheckpointHook() override;
  Status afterStep(TrainingSession &session, const StepResult &r) override;
  /// Writes the checkpoint of `steps` now (async: starts it).
  Status save(TrainingSession &session, int64_t steps);
  /// Waits for an asynchronous checkpoint and publishes it (collective).
  Status finishPending(TrainingSession &session);
  /// The step count of the last checkpoint written (-1: none).
  int64_t lastSaved() const { return pending_ ? pending_->steps : lastSaved_; }
  /// Time the training loop waited for checkpoints, and how many it took.
  double blockedSeconds() const { return blockedSeconds_; }
  int64_t saves() const { return saves_; }

private:
  std::string dir_;
  int64_t every_;
  int keepLast_;
  bool async_;
  int64_t lastSaved_ = -1;
  std::unique_ptr<PendingCheckpoint> pending_;
  std::thread writer_;
  double blockedSeconds_ = 0.0;
  int64_t saves_ = 0;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_CHECKPOINTING_H
