// Pipeline schedules: per-rank action lists (forward / backward / weight-
// gradient of one model chunk for one micro-batch, send, receive), their
// generators (GPipe, 1F1B, interleaved 1F1B, ZB-H1), verification and a timing
// simulation. Shared by the compiler (ptc-schedule-pipeline builds, checks and
// reports a schedule) and the runtime (the plan loader checks the schedule it
// is given before running it). No MLIR, no MPI.
#ifndef PTC_RUNTIME_SCHEDULE_SCHEDULE_H
#define PTC_RUNTIME_SCHEDULE_SCHEDULE_H

#include "runtime/base/option_values.h"
#include "runtime/base/status.h"
#include "runtime/schedule/schedule_kinds.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ptc::schedule {

/// The pipeline schedules generate() builds.
enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZbH1 };

} // namespace ptc::schedule

namespace ptc {
PTC_OPTION_VALUES(schedule::ScheduleKind, "schedule",
                  {schedule::ScheduleKind::GPipe, "gpipe"},
                  {schedule::ScheduleKind::OneFOneB, "1f1b"},
                  {schedule::ScheduleKind::Interleaved1F1B, "interleaved-1f1b"},
                  {schedule::ScheduleKind::ZbH1, "zb-h1"})
} // namespace ptc

namespace ptc::schedule {

struct Action {
  ActionKind kind = ActionKind::Forward;
  int chunk = -1;   // compute actions: the model chunk
  int mb = -1;      // micro-batch; -1 for once-per-step transfers
  int channel = -1; // send / recv
  bool isCompute() const { return kind <= ActionKind::Weight; }
  Segment segment() const { return static_cast<Segment>(kind); }
};

/// A value produced by one chunk and used by another.
struct Channel {
  int from = 0, to = 0;                  // chunks
  Segment fromSegment = Segment::Forward; // producer segment (per micro-batch)
  Segment toSegment = Segment::Forward;   // first consumer segment
  bool perStep = false; // sent once per step before the micro-batches (a tied parameter)
  bool atEnd = false;   // per step, after the micro-batches (a gradient summed over them)
  int64_t bytes = 0;
};

struct Pipeline {
  int ranks = 1;        // pipeline ranks (the pp axis)
  int chunks = 1;       // model chunks: ranks x virtual stages; chunk c lives on rank c % ranks
  int microbatches = 1;
  bool splitWeight = false; // whether Weight actions exist (zero-bubble schedules)
  std::vector<Channel> channels;
  std::vector<std::vector<Action>> actions; // per pipeline rank, in execution order

  int rankOf(int chunk) const { return chunk % ranks; }
  int virtualStages() const { return chunks / ranks; }
};

/// "F c1 mb3", "SEND ch2 mb3", "RECV ch0 (per step)".
std::string describe(const Action &a);

/// Parses describe()'s output.
StatusOr<Action> parseAction(const std::string &text);

/// The schedule names generate() accepts.
const std::vector<std::string> &scheduleNames();

/// The schedule `name` names, or the error naming it and the known ones.
StatusOr<ScheduleKind> parseSchedule(const std::string &name);

/// OK for a name of scheduleNames(); otherwise parseSchedule's error.
Status checkScheduleName(const std::string &name);

/// Fills `p.actions` with schedule `name` ("gpipe", "1f1b", "interleaved-1f1b",
/// "zb-h1") for p.ranks, p.chunks and p.microbatches, sends right after the
/// action producing a value and receives right before the action consuming it.
/// Errors name the unsupported combination (e.g. interleaving with a
/// micro-batch count that is not a multiple of the rank count).
Status generate(ScheduleKind kind, Pipeline &p);
/// generate() of the schedule `name` names (an unknown name is the error).
Status generate(const std::string &name, Pipeline &p);

/// Checks that the action lists run correctly: every action valid for its
/// rank, every (chunk, segment, micro-batch) computed exactly once, every
/// receive matched by exactly one send, data dependencies in order on each
/// rank, and no deadlock (receives block, sends do not). The first problem is
/// the error.
Status verify(const Pipeline &p);

/// One compute action placed in simulated time.
struct Box {
  int rank;
  Action action;
  double start, end;
};

/// Timing of a simulation. With equal stages, per micro-batch a rank's
/// forward takes 1 unit, its backward 2 (1 + 1 with a weight split), each
/// chunk 1/v of that.
struct Report {
  double makespan = 0;
  double bubble = 0;                 // idle / makespan, averaged over ranks
  std::vector<double> busy;          // per rank
  std::vector<int> peakInFlight;       // per rank: most (chunk, mb) forwards awaiting their B
  std::vector<int> peakAwaitingWeight; // per rank: most (chunk, mb) B's awaiting their W
  std::vector<int64_t> sendBytes;    // per rank per step
  std::vector<Box> boxes;
};

/// Durations for simulate(): each chunk's forward, backward and weight-
/// gradient segment for one micro-batch (in any unit; empty: the equal stages
/// of Report), and the time a micro-batch's transfer takes between ranks (a
/// receive waits for its send plus this).
struct Timing {
  std::vector<double> forward, backward, weight; // per chunk, or empty
  double transfer = 0;
};

/// Simulates the action lists with `timing` (default: equal stages), after
/// verifying them unless the caller already has (`verified`: a planner
/// simulating one generated schedule with many timings).
StatusOr<Report> simulate(const Pipeline &p, const Timing &timing = {}, bool verified = false);

/// The closed-form bubble fraction of a schedule with equal stage times:
/// (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) interleaved; < 0 if none.
double closedFormBubble(ScheduleKind kind, int ranks, int virtualStages, int microbatches);

/// The classic pipeline diagram: one row per rank, one box per action.
std::string svg(const Pipeline &p, const Report &r, const std::string &title);

} // namespace ptc::schedule

#endif // PTC_RUNTIME_SCHEDULE_SCHEDULE_H
