// Stopping a training run cleanly when asked: a signal (Slurm's --signal
// before the time limit, `scancel --signal=USR1`, a Kubernetes pod's SIGTERM,
// a preemption) requests a stop; the ranks agree on the first step boundary
// after any of them was signalled, write a checkpoint there and end with
// kExitStopped (runtime/base/exit_codes.h), so that a requeued or restarted job resumes from it.
#ifndef PTC_RUNTIME_SESSION_STOP_REQUEST_H
#define PTC_RUNTIME_SESSION_STOP_REQUEST_H

#include "runtime/base/exit_codes.h"
#include "runtime/session/training_session.h"

#include <vector>

namespace ptc {

/// Makes `signals` request a stop: they are blocked in the calling thread and
/// in the threads it creates afterwards (call it before creating any), and a
/// thread of its own waits for them. A second signal while the stop is
/// pending ends the process at once, as the signal's default action would.
void installStopSignals(const std::vector<int> &signals);

/// The signal that requested a stop in this process (0: none yet).
int stopSignal();

/// The signal's name without "SIG" ("USR1", "TERM"; the number otherwise).
std::string signalName(int signal);

/// Ends the run at the first step boundary at which any rank has been asked
/// to stop (collective: every rank asks its peers at every boundary, a
/// one-integer all-reduce, so all of them stop after the same step). Put it
/// after the checkpoint hook: a checkpoint due at that boundary is written
/// first.
class StopHook : public SessionHook {
public:
  Status afterStep(TrainingSession &session, const StepResult &r) override;
  bool endsRun() const override { return stoppedAfter_ >= 0; }
  /// The steps completed when the run stopped (-1: it did not).
  int64_t stoppedAfter() const { return stoppedAfter_; }

private:
  int64_t stoppedAfter_ = -1;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_STOP_REQUEST_H
