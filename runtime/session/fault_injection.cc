// Faults the tests inject into a training run (see fault_injection.h).

#include "runtime/session/fault_injection.h"

#include "runtime/base/hostfile.h"
#include "runtime/base/parse_number.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <vector>

namespace ptc {

namespace {
/// PTC_FAULT_LOSE_NODE: the last `lostRanks` slots of `hostfile` are taken
/// out of it and the first of those ranks dies.
void loseNode(const std::string &hostfile, int64_t lostRanks, int64_t step, int rank, int world) {
  std::string error;
  auto hosts = readHostfile(hostfile, error);
  if (!hosts || lostRanks < 1 || lostRanks >= world || totalSlots(*hosts) != world)
    return;
  const int firstLost = world - static_cast<int>(lostRanks);
  if (rank != firstLost)
    return;
  // The hosts' slots less the last `lostRanks` (a host left with none goes).
  std::ifstream in(hostfile);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  int64_t left = lostRanks;
  for (auto h = hosts->rbegin(); h != hosts->rend() && left > 0; ++h) {
    int64_t take = std::min(left, h->slots);
    left -= take;
    std::string &line = lines[static_cast<size_t>(h->line - 1)];
    line = take == h->slots ? "# " + line + "  (lost)"
                            : h->host + " slots=" + std::to_string(h->slots - take);
  }
  std::string text;
  for (const std::string &line : lines)
    text += line + "\n";
  const std::string tmp = hostfile + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), hostfile.c_str());
  std::fprintf(stderr, "ptc-run: fault injection: ranks %d-%d lost at step %lld (their slots left %s)\n",
               firstLost, world - 1, static_cast<long long>(step), hostfile.c_str());
  std::fflush(stderr);
  std::raise(SIGKILL);
}
} // namespace

FaultInjection FaultInjection::fromEnvironment() {
  FaultInjection f;
  if (const char *hang = std::getenv("PTC_FAULT_HANG_STEP"))
    f.hangStep_ = parseInteger(hang, 0).value_or(-1);
  if (const char *kill = std::getenv("PTC_FAULT_KILL")) {
    std::string spec = kill;
    size_t a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
    if (a != std::string::npos) {
      f.killRank_ = static_cast<int>(parseInteger(spec.substr(0, a), 0, INT32_MAX).value_or(-1));
      f.killStep_ = parseInteger(spec.substr(a + 1, b == std::string::npos ? b : b - a - 1), 0)
                        .value_or(-1);
      if (b != std::string::npos)
        f.killMarker_ = spec.substr(b + 1);
    }
  }
  if (const char *lose = std::getenv("PTC_FAULT_LOSE_NODE")) {
    std::string spec = lose;
    size_t a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
    if (b != std::string::npos) {
      f.loseStep_ = parseInteger(spec.substr(0, a), 0).value_or(-1);
      f.loseRanks_ = parseInteger(spec.substr(a + 1, b - a - 1), 1).value_or(0);
      f.loseHostfile_ = spec.substr(b + 1);
    }
  }
  if (const char *slow = std::getenv("PTC_FAULT_SLOW_STEP_MS"))
    f.slowMs_ = parseInteger(slow, 0, 60000).value_or(0);
  return f;
}

void FaultInjection::atStepStart(int64_t step, int rank, int worldSize) const {
  if (slowMs_ > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(slowMs_));
  if (step == loseStep_)
    loseNode(loseHostfile_, loseRanks_, step, rank, worldSize);
}

void FaultInjection::inStep(int64_t step, int rank) const {
  while (step == hangStep_)
    std::this_thread::sleep_for(std::chrono::seconds(1));
  if (step == killStep_ && rank == killRank_ &&
      (killMarker_.empty() || ::access(killMarker_.c_str(), F_OK) != 0)) {
    if (!killMarker_.empty())
      std::fclose(std::fopen(killMarker_.c_str(), "w"));
    std::fprintf(stderr, "ptc-run: fault injection: rank %d killed at step %lld\n", rank,
                 static_cast<long long>(step));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

} // namespace ptc
