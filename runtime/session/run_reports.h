// What ptc-run prints about a run besides its progress: the schedule trace
// of the last step (Chrome trace / Perfetto JSON), the time per op kind, and
// the memory this rank allocated against the compiler's prediction.

#ifndef PTC_RUNTIME_SESSION_RUN_REPORTS_H
#define PTC_RUNTIME_SESSION_RUN_REPORTS_H

#include "runtime/session/training_session.h"

#include <string>
#include <vector>

namespace ptc {

/// Gathers every rank's traced schedule actions or instructions (TrainingSession::traceFrom)
/// and, on the leader, writes them to `path`: one row per rank, times in us.
Status writeStepTrace(TrainingSession &session, const std::string &path);
/// The time per step by op kind, largest first, from TrainingSession::setProfile
/// over `steps` steps (`skippedFirst`: the first step was not counted).
void printOpProfile(const std::vector<double> &opTimes, int64_t steps, bool skippedFirst);
/// Where the leader's ring attention spent its time per step
/// (Executor::ringProfile) and every rank's blocks' FLOPs (gathered: every
/// rank calls it); nothing printed when the plan has no ring attention.
Status printRingProfile(TrainingSession &session, int64_t steps);
/// This rank's allocation against the plan's predicted peak (and the offload
/// file, host memory and pipeline stash where the plan has them).
void printMemoryReport(TrainingSession &session);
/// printMemoryReport on the first process of each pipeline rank (dp, tp
/// coordinates 0; the leader without pipeline stages): one line per rank.
void printMemoryReportPerPipelineRank(TrainingSession &session);

} // namespace ptc

#endif // PTC_RUNTIME_SESSION_RUN_REPORTS_H
