// Faults the tests inject into a training run through the environment, read
// once when the run starts: a step that never finishes (PTC_FAULT_HANG_STEP),
// a rank killed when a step starts (PTC_FAULT_KILL), a node lost for good
// (PTC_FAULT_LOSE_NODE) and a slow machine (PTC_FAULT_SLOW_STEP_MS). Without
// those variables nothing happens. TrainingSession::run calls the two hooks.
#ifndef PTC_RUNTIME_SESSION_FAULT_INJECTION_H
#define PTC_RUNTIME_SESSION_FAULT_INJECTION_H

#include <cstdint>
#include <string>

namespace ptc {

class FaultInjection {
public:
  /// The faults the environment asks for (a malformed value asks for none).
  static FaultInjection fromEnvironment();

  /// When step `step` starts, before the session's hooks: the slow step's
  /// sleep; a lost node (the last ranks' slots taken out of the hostfile, the
  /// first of those ranks killed).
  void atStepStart(int64_t step, int rank, int worldSize) const;
  /// Inside step `step`, under the step watchdog: the hang, the kill.
  void inStep(int64_t step, int rank) const;

private:
  int64_t hangStep_ = -1;
  /// PTC_FAULT_KILL=RANK:STEP[:MARKER]: rank RANK dies (SIGKILL) when step
  /// STEP starts; with MARKER, only while that file does not exist (it is
  /// created first), so a restarted job passes the step.
  int killRank_ = -1;
  int64_t killStep_ = -1;
  std::string killMarker_;
  /// PTC_FAULT_LOSE_NODE=STEP:RANKS:HOSTFILE: a node of RANKS ranks is gone
  /// for good when step STEP starts: the last RANKS slots of HOSTFILE (the
  /// inventory the launcher reads) go, and the first of those ranks dies
  /// (SIGKILL); once: only while the file's slots equal the ranks running.
  int64_t loseStep_ = -1, loseRanks_ = 0;
  std::string loseHostfile_;
  /// PTC_FAULT_SLOW_STEP_MS=N: every step takes N ms longer (a test that
  /// signals a run mid-way does not race a fast machine).
  int64_t slowMs_ = 0;
};

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_FAULT_INJECTION_H
