#include "runtime/session/step_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace ptc {
namespace {
int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
} // namespace

StepWatchdog::StepWatchdog(double timeoutSeconds, int rank, std::function<void()> beforeExit)
    : timeout_(timeoutSeconds), rank_(rank), beforeExit_(std::move(beforeExit)) {
  if (timeout_ > 0)
    thread_ = std::thread([this] { watch(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable())
    thread_.join();
}

void StepWatchdog::begin(int64_t step) {
  startedUs_ = nowUs();
  step_ = step;
}

void StepWatchdog::watch() {
  auto tick = std::chrono::duration<double>(std::min(1.0, timeout_ / 10));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return done_; })) {
    int64_t step = step_;
    if (step >= 0 && nowUs() - startedUs_ > static_cast<int64_t>(timeout_ * 1e6)) {
      char line[256];
      int n = std::snprintf(line, sizeof line,
                            "ptc-run: error: rank %d: step %lld has not finished after %g s "
                            "(--step-timeout): a device or a peer stopped responding\n",
                            rank_, static_cast<long long>(step), timeout_);
      std::fwrite(line, 1, static_cast<size_t>(n), stderr);
      std::fflush(stderr);
      if (beforeExit_)
        beforeExit_();
      std::_Exit(1); // the launcher takes the other ranks down
    }
  }
}

} // namespace ptc
