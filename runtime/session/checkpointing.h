// Saving and resuming a training job through distributed checkpoints
// (runtime/io/dist_checkpoint.h): every rank writes the boxes of parameters
// and optimizer state it owns (each box once: replicas are deduplicated), the
// leader writes the metadata and publishes the checkpoint atomically; a
// resume reads, in any layout, the boxes each tensor of this rank overlaps.
#ifndef PTC_RUNTIME_SESSION_CHECKPOINTING_H
#define PTC_RUNTIME_SESSION_CHECKPOINTING_H

#include "runtime/session/training_session.h"

#include <string>
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

/// Saves a checkpoint every `every` steps (and none in between).
class CheckpointHook : public SessionHook {
public:
  CheckpointHook(std::string dir, int64_t every, int keepLast)
      : dir_(std::move(dir)), every_(every), keepLast_(keepLast) {}
  Status afterStep(TrainingSession &session, const StepResult &r) override;
  /// The step count of the last checkpoint written (-1: none).
  int64_t lastSaved() const { return lastSaved_; }

private:
  std::string dir_;
  int64_t every_;
  int keepLast_;
  int64_t lastSaved_ = -1;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_CHECKPOINTING_H
