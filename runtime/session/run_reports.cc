// ptc-run's reports: schedule trace, per-op profile, memory against prediction.

#include "runtime/session/run_reports.h"

#include "runtime/plan/plan_ops.h"

#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

namespace ptc {

/// Chrome trace event format: one row (tid) per rank, times in us.
Status writeStepTrace(TrainingSession &session, const std::string &path) {
  Communicator *comm = session.communicator();
  std::string mine;
  // A name is an action ("F c0 mb1") or an op and the model's location,
  // whose file name may hold any bytes: a JSON string (invalid UTF-8 replaced).
  auto quoted = [](const std::string &s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  for (const Executor::TraceEvent &e : session.executor().trace()) {
    char times[128];
    std::snprintf(times, sizeof times, "\"ph\":\"X\",\"ts\":%.1f,\"dur\":%.1f,\"pid\":0,\"tid\":%d},\n",
                  e.startUs, e.durationUs, session.rank());
    // The category: the name's first word (an action's kind, or the op).
    mine += "{\"name\":" + quoted(e.name) + ",\"cat\":" + quoted(e.name.substr(0, e.name.find(' '))) +
            "," + times;
  }
  std::vector<std::string> all{mine};
  if (comm) {
    auto gathered = comm->allGatherStrings(mine);
    if (!gathered.isOk())
      return gathered.status();
    all = *gathered;
  }
  if (!session.leader())
    return Status::ok();
  std::ofstream out(path, std::ios::trunc);
  if (!out)
    return invalidArgument("cannot write trace file '", path, "'");
  out << "{\"traceEvents\":[\n";
  for (size_t r = 0; r < all.size(); ++r)
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << r
        << ",\"args\":{\"name\":\"rank " << r << "\"}},\n" << all[r];
  out << "{\"name\":\"end\",\"ph\":\"i\",\"ts\":0,\"pid\":0,\"tid\":0,\"s\":\"g\"}]}\n";
  std::cout << "ptc-run: wrote trace of the last step to " << path << "\n";
  return Status::ok();
}

void printOpProfile(const std::vector<double> &opTimes, int64_t steps, bool skippedFirst) {
  std::vector<std::pair<double, int>> rows;
  double total = 0;
  for (size_t op = 0; op < opTimes.size(); ++op)
    if (opTimes[op] > 0) {
      rows.push_back({opTimes[op], static_cast<int>(op)});
      total += opTimes[op];
    }
  std::sort(rows.rbegin(), rows.rend());
  std::cout << "profile: time per step by op kind (" << steps << (steps == 1 ? " step" : " steps")
            << (skippedFirst ? ", the first step's one-time setup left out" : "") << ")\n";
  for (auto [t, op] : rows) {
    char line[128];
    std::snprintf(line, sizeof line, "  %-22s %8.3f ms  %5.1f%%",
                  opcodeName(static_cast<plan::OpCode>(op)), 1e3 * t / static_cast<double>(steps),
                  100.0 * t / total);
    std::cout << line << "\n";
  }
}

Status printRingProfile(TrainingSession &session, int64_t steps) {
  const Executor::RingProfile &ring = session.executor().ringProfile();
  // Every rank's blocks' FLOPs: the ring's causal load balance.
  std::vector<std::string> flops{std::to_string(ring.flops)};
  if (Communicator *comm = session.communicator()) {
    auto gathered = comm->allGatherStrings(flops[0]);
    if (!gathered.isOk())
      return gathered.status();
    flops = *gathered;
  }
  if (!session.leader() || ring.instructions == 0 || steps <= 0)
    return Status::ok();
  const double perStep = 1e3 / static_cast<double>(steps);
  const double other = ring.seconds - ring.computeSeconds - ring.transferSeconds;
  char line[320];
  std::snprintf(line, sizeof line,
                "ring attention (this rank): %.3f ms per step in %lld instructions: blocks %.3f ms, "
                "passing and waiting for blocks %.3f ms (%.2f MB passed on), layout and "
                "normalization %.3f ms\n",
                ring.seconds * perStep, static_cast<long long>(ring.instructions / steps),
                ring.computeSeconds * perStep, ring.transferSeconds * perStep,
                ring.bytes / static_cast<double>(steps) / 1e6, other * perStep);
  std::cout << line;
  double lo = 0, hi = 0;
  std::cout << "ring attention FLOPs per step by rank:";
  for (size_t r = 0; r < flops.size(); ++r) {
    const double f = std::strtod(flops[r].c_str(), nullptr) / static_cast<double>(steps);
    if (f <= 0)
      continue; // a rank without ring attention (another pipeline stage's)
    lo = lo == 0 ? f : std::min(lo, f);
    hi = std::max(hi, f);
    std::snprintf(line, sizeof line, " %zu: %.4g", r, f);
    std::cout << line;
  }
  std::snprintf(line, sizeof line, " (max / min %.4f)\n", lo > 0 ? hi / lo : 0.0);
  std::cout << line;
  return Status::ok();
}

void printMemoryReport(TrainingSession &session) {
  // Everything ptc-run allocates for the plan is known up front; the process
  // peak adds code, MPI and BLAS buffers.
  Executor &ex = session.executor();
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  int64_t allocated = ex.persistentBytes() + ex.arenaBytes() + ex.communicationBytes();
  int64_t predicted = predictedPeakBytes(session.plan(), session.pipelineRank());
  char line[512];
  std::snprintf(line, sizeof line,
                "memory (rank %d): allocated %lld B (tensors %lld + arena %lld + "
                "communication %lld), predicted %lld B (%.1f%% off); process peak RSS %lld KiB%s\n",
                session.rank(),
                static_cast<long long>(allocated), static_cast<long long>(ex.persistentBytes()),
                static_cast<long long>(ex.arenaBytes()),
                static_cast<long long>(ex.communicationBytes()), static_cast<long long>(predicted),
                predicted ? 100.0 * static_cast<double>(allocated - predicted) / static_cast<double>(predicted) : 0.0,
                static_cast<long long>(usage.ru_maxrss),
                session.plan().pipelined()
                    ? ("; pipeline rank " + std::to_string(session.pipelineRank())).c_str()
                    : "");
  std::cout << line << std::flush;
  if (int64_t scratch = ex.device().scratchBytes(); scratch > 0)
    std::cout << "memory (rank " << session.rank() << "): kernel scratch " << scratch
              << " B on the device beside the plan's tensors (cuDNN workspaces, padded "
                 "products; not in the prediction), allocated + scratch "
              << allocated + scratch << " B" << std::endl;
  if (ex.fileBytes() > 0)
    std::cout << "memory (rank " << session.rank() << "): offload file " << ex.fileBytes()
              << " B (master weights and optimizer state), at most " << ex.filePeakResidentBytes()
              << " B of it resident in host memory (measured with mincore after each use)\n"
              << std::flush;
  if (int64_t host = predictedHostBytes(session.plan(), session.pipelineRank()); host > 0 || ex.hostBytes() > 0)
    std::cout << "memory (rank " << session.rank() << "): offloaded to host memory "
              << ex.hostBytes() << " B, predicted " << host
              << " B (master weights, optimizer state, the update's temporaries)\n"
              << std::flush;
  if (session.plan().pipelined())
    std::cout << "memory (rank " << session.rank() << "): activation stash peak "
              << ex.stashPeakBytes() << " B, predicted " << ex.predictedStashBytes()
              << " B (values waiting between segments and micro-batches)\n"
              << std::flush;
}

void printMemoryReportPerPipelineRank(TrainingSession &session) {
  bool first = session.leader();
  if (Communicator *c = session.communicator(); c && session.plan().pipelined()) {
    first = true;
    for (size_t a = 0; a < c->coords().size(); ++a)
      if (static_cast<int>(a) != session.plan().pipelineAxis() && c->coords()[a] != 0)
        first = false;
  }
  if (first)
    printMemoryReport(session);
}

} // namespace ptc
