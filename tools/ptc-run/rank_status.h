// The rank status files of ptc-run's --np launcher (PTC_STATUS_DIR/rank-R):
// each rank says what it is doing (its step, the instruction it runs, a
// heartbeat); its peers read them to name the rank a collective waits for,
// and the launcher to name a rank that died without a word.
#ifndef PTC_TOOLS_PTC_RUN_RANK_STATUS_H
#define PTC_TOOLS_PTC_RUN_RANK_STATUS_H

#include "runtime/plan/plan_loader.h"
#include "runtime/session/training_session.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace ptc {

/// CLOCK_MONOTONIC in milliseconds (the heartbeat's clock).
int64_t monotonicMs();

/// Opens this rank's status file when the launcher set PTC_STATUS_DIR ("starting";
/// a heartbeat thread; SIGTERM from mpirun writes "stopped"; an exit that wrote
/// no final status writes "exited"). Without PTC_STATUS_DIR, status calls do nothing.
void openStatus();
/// Rewrites the status line ("step 41", "error", ...).
void writeStatus(const char *text);
/// Writes a final status ("done", "error", "error at start", "stopped").
void finishStatus(const char *text);
/// Where the executor stores the index of the instruction it runs (null
/// without a status file).
std::atomic<int32_t> *statusInstructionSlot();
/// Whether this rank began a training step (an error before one is a startup
/// error, which a restart would repeat).
bool stepStarted();

/// What a rank's status file says.
struct RankStatus {
  bool present = false;
  std::string text;      // "starting", "step 41", "after step 41", "error", ...
  int32_t instruction = -1;
  int64_t heartbeatMs = -1; // CLOCK_MONOTONIC of its last heartbeat
};
RankStatus readRankStatus(const std::string &dir, int rank);

/// For a collective timeout on rank `self`: the ranks whose heartbeat stopped
/// (frozen) or whose status differs from its own.
std::string ranksElsewhere(const std::string &dir, int self, int worldSize,
                           const LoadedPlan *plan);

/// For the launcher's freeze watch: the first rank that is live (starting or in
/// a step) and whose heartbeat has been silent for more than `limitMs`, as "rank
/// 1 is starting (frozen: no heartbeat for 65.2 s)"; "" when there is none.
/// A freeze before any collective (MPI's start-up waits without a timeout)
/// ends the job this way.
std::string frozenRank(const std::string &dir, int ranks, int64_t limitMs, const LoadedPlan *plan);

/// After a failed job: the ranks that stopped without a word, with the step
/// and instruction where they stopped (on stderr).
void reportSilentDeaths(const std::string &dir, int ranks, const std::string &planPath);

/// A fresh directory in $TMPDIR (or /tmp) for the ranks' status files, or ""
/// after a warning: the job then runs, but a rank that dies without a word
/// is named by mpirun alone.
std::string makeStatusDirectory();

/// Marks each step in the rank's status file, numbered from 1 as the
/// progress lines are: "step 11" while it runs, "after step 11" once it is done.
class StatusBeacon : public SessionHook {
public:
  Status beforeStep(TrainingSession &, int64_t step) override;
  Status afterStep(TrainingSession &, const StepResult &result) override;
};

} // namespace ptc

#endif // PTC_TOOLS_PTC_RUN_RANK_STATUS_H
