// Ends the process with an error when a training step runs longer than its
// timeout: whatever the step waits for (a GPU kernel, a driver, a peer outside
// any collective timeout), a run never hangs silently.
#ifndef PTC_RUNTIME_SESSION_STEP_WATCHDOG_H
#define PTC_RUNTIME_SESSION_STEP_WATCHDOG_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace ptc {

class StepWatchdog {
public:
  /// `timeoutSeconds` <= 0: off. `rank` names this process in the message.
  /// `beforeExit` runs on the watchdog's thread after the message and before
  /// the process ends (a launcher's status file marks the rank's error there).
  StepWatchdog(double timeoutSeconds, int rank, std::function<void()> beforeExit = {});
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog &) = delete;
  StepWatchdog &operator=(const StepWatchdog &) = delete;

  void begin(int64_t step);
  void end() { step_ = -1; }

private:
  void watch();
  double timeout_;
  int rank_;
  std::function<void()> beforeExit_;
  std::atomic<int64_t> step_{-1}, startedUs_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false; // guarded by mutex_
  std::thread thread_;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_STEP_WATCHDOG_H
