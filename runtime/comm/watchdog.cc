// See watchdog.h.

#include "runtime/comm/watchdog.h"

#include <chrono>
#include <thread>

namespace ptc {

namespace {
std::function<std::string()> &timeoutNote() {
  static std::function<std::string()> note;
  return note;
}
} // namespace

void setCollectiveTimeoutNote(std::function<std::string()> note) {
  timeoutNote() = std::move(note);
}

std::string collectiveTimeoutNote() {
  std::string text = timeoutNote() ? timeoutNote()() : "";
  return text.empty() ? "" : "; " + text;
}

Status waitForCollective(const std::function<CollectiveProgress()> &poll,
                         const std::function<void()> &abort, const std::string &what, int rank,
                         const WatchdogOptions &options) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(options.timeoutSeconds);
  for (int spins = 0;; ++spins) {
    CollectiveProgress p = poll();
    if (p.kind == CollectiveProgress::kDone)
      return Status::ok();
    if (p.kind == CollectiveProgress::kFailed) {
      abort();
      return error(StatusCode::kInternal, what, " failed on rank ", rank, ": ", p.error,
                   " (communicator aborted)");
    }
    if (Clock::now() > deadline) {
      abort();
      return error(StatusCode::kInternal, what, " did not complete within ",
                   options.timeoutSeconds, " s on rank ", rank,
                   ": a peer rank died or stopped responding (communicator aborted)",
                   collectiveTimeoutNote());
    }
    if (spins > 1000)
      std::this_thread::sleep_for(std::chrono::duration<double>(options.pollIntervalSeconds));
  }
}

} // namespace ptc
