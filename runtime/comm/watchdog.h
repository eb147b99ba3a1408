// Waiting for asynchronous collectives without ever hanging silently: poll
// their progress until they finish, fail, or overrun a deadline; on failure
// or timeout abort the communicator (so that no later call blocks on it) and
// report the collective and the rank. Used by the NCCL communicator; kept
// free of CUDA and NCCL so that its logic is tested on any machine.
#ifndef PTC_RUNTIME_COMM_WATCHDOG_H
#define PTC_RUNTIME_COMM_WATCHDOG_H

#include "runtime/base/status.h"

#include <functional>
#include <string>

namespace ptc {

/// One look at an outstanding collective.
struct CollectiveProgress {
  enum Kind { kDone, kPending, kFailed } kind = kPending;
  std::string error; // kFailed: what the library reported
};

struct WatchdogOptions {
  double timeoutSeconds = 300.0;
  /// Sleep between polls once a collective has been pending for a while.
  double pollIntervalSeconds = 50e-6;
};

/// Polls `poll` until kDone (ok), kFailed, or the timeout; in the last two
/// cases calls `abort` once and returns an error naming `what` (e.g.
/// "all_reduce of a 4096-byte bucket at gpt.mlir:12 over mesh axes {dp}") and
/// `rank`.
Status waitForCollective(const std::function<CollectiveProgress()> &poll,
                         const std::function<void()> &abort, const std::string &what, int rank,
                         const WatchdogOptions &options);

/// A note for every collective-timeout error, made when the timeout fires
/// (ptc-run's: which ranks are elsewhere in the step, from the launcher's
/// status files). Process-wide; empty function or text: no note.
void setCollectiveTimeoutNote(std::function<std::string()> note);
/// "; " + the note, or "" when there is none.
std::string collectiveTimeoutNote();

} // namespace ptc

#endif // PTC_RUNTIME_COMM_WATCHDOG_H
