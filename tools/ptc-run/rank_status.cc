#include "tools/ptc-run/rank_status.h"

#include "tools/ptc-run/launcher.h"

#include "runtime/base/temp_dir.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

namespace ptc {
namespace {
// Rank status for the --np launcher (PTC_STATUS_DIR/rank-R, 64 bytes): a
// 32-byte text line of what this rank is doing, rewritten in place
// ("starting", "step 41" while step 41 runs, counted from 1, "after step 41"
// between steps, then "error", "done", or, from the SIGTERM handler when the launcher
// stops it, "stopped"), and at byte 32 the index of the instruction it runs
// (int32, -1 before the first), which the executor stores into the mapped
// file as it goes. A rank that died or froze without a word (SIGKILL, the
// out-of-memory killer, SIGSTOP, a hung device) leaves "step N" and its
// instruction behind: that is how its peers' collective timeouts and the
// launcher name it and where it stopped. At byte 40 a heartbeat (int64,
// CLOCK_MONOTONIC milliseconds) that a thread of the rank refreshes every
// 100 ms: a frozen process (SIGSTOP, a stopped VM) stops refreshing it even
// when it was stopped inside the collective its peers wait in.
constexpr size_t kStatusBytes = 64, kStatusInstructionOffset = 32, kStatusHeartbeatOffset = 40;
int gStatusFd = -1;
bool gStatusFinal = false;                   // "error" or "done" written
std::atomic<int32_t> *gInstruction = nullptr; // in the mapped status file
std::atomic<int64_t> *gHeartbeat = nullptr;   // in the mapped status file

} // namespace

int64_t monotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void writeStatus(const char *text) {
  if (gStatusFd < 0)
    return;
  char line[32];
  std::memset(line, ' ', sizeof line);
  std::memcpy(line, text, std::min(std::strlen(text), sizeof line - 1));
  line[sizeof line - 1] = '\n';
  (void)!::pwrite(gStatusFd, line, sizeof line, 0);
}

extern "C" void onTerminate(int sig) {
  if (gStatusFd >= 0) {
    static const char stopped[33] = "stopped                        \n";
    (void)!::pwrite(gStatusFd, stopped, 32, 0);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

/// Whether this rank began a training step.
bool gStepStarted = false;

void finishStatus(const char *text) {
  writeStatus(text);
  gStatusFinal = true;
}

std::atomic<int32_t> *statusInstructionSlot() { return gInstruction; }

bool stepStarted() { return gStepStarted; }

void openStatus() {
  const char *dir = std::getenv("PTC_STATUS_DIR");
  if (!dir || !*dir)
    return;
  std::string path = std::string(dir) + "/rank-" + std::to_string(launcherRank());
  gStatusFd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (gStatusFd >= 0 && ::ftruncate(gStatusFd, kStatusBytes) == 0) {
    void *map = ::mmap(nullptr, kStatusBytes, PROT_READ | PROT_WRITE, MAP_SHARED, gStatusFd, 0);
    if (map != MAP_FAILED) {
      gInstruction = new (static_cast<char *>(map) + kStatusInstructionOffset) std::atomic<int32_t>(-1);
      gHeartbeat = new (static_cast<char *>(map) + kStatusHeartbeatOffset) std::atomic<int64_t>(monotonicMs());
      std::thread([] {
        while (true) {
          gHeartbeat->store(monotonicMs(), std::memory_order_relaxed);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }).detach();
    }
  }
  writeStatus("starting");
  std::signal(SIGTERM, onTerminate);
  // Any exit through the C++ runtime (an error return included) is not silent.
  std::atexit([] {
    if (!gStatusFinal)
      writeStatus("exited");
  });
}

RankStatus readRankStatus(const std::string &dir, int rank) {
  RankStatus s;
  std::ifstream in(dir + "/rank-" + std::to_string(rank), std::ios::binary);
  char bytes[kStatusBytes] = {};
  in.read(bytes, sizeof bytes);
  size_t n = static_cast<size_t>(in.gcount());
  if (n == 0)
    return s;
  s.present = true;
  s.text.assign(bytes, std::min<size_t>(n, kStatusInstructionOffset));
  while (!s.text.empty() && (s.text.back() == ' ' || s.text.back() == '\n' || s.text.back() == '\0'))
    s.text.pop_back();
  if (n >= kStatusInstructionOffset + sizeof(int32_t))
    std::memcpy(&s.instruction, bytes + kStatusInstructionOffset, sizeof(int32_t));
  if (n >= kStatusHeartbeatOffset + sizeof(int64_t))
    std::memcpy(&s.heartbeatMs, bytes + kStatusHeartbeatOffset, sizeof(int64_t));
  return s;
}

/// "instruction #87 (AllReduce at gpt.mlir:12:5)", from the plan when it has it.
std::string describeInstructionOf(const LoadedPlan *plan, int32_t n) {
  if (plan && n >= 0 && static_cast<size_t>(n) < plan->plan().instructions()->size())
    return describeInstruction(*plan->plan().instructions()->Get(static_cast<flatbuffers::uoffset_t>(n)),
                               static_cast<size_t>(n));
  return "instruction #" + std::to_string(n);
}

/// Whether a status says the rank is alive and working: starting, in a step
/// ("step 11") or between steps ("after step 10": its hooks, an evaluation, a
/// checkpoint).
bool liveStatus(const std::string &text) {
  return text == "starting" || text.rfind("step ", 0) == 0 || text.rfind("after step ", 0) == 0;
}

/// What a rank is doing, to follow "rank 1 is ": "at step 11, instruction #87
/// (...)", "after step 10", "starting", or its status in quotes.
std::string whereRankIs(const RankStatus &s, const LoadedPlan *plan) {
  std::string instruction =
      s.instruction >= 0 ? ", " + describeInstructionOf(plan, s.instruction) : "";
  if (s.text.rfind("step ", 0) == 0)
    return "at " + s.text + instruction;
  if (s.text.rfind("after step ", 0) == 0)
    return s.text + instruction;
  if (s.text == "starting")
    return s.text;
  return "in status '" + s.text + "'";
}

/// For a collective timeout on this rank: the ranks whose heartbeat stopped
/// (frozen) or whose status differs from its own (elsewhere in the step, or
/// gone); the rank that stopped responding is one of them.
std::string ranksElsewhere(const std::string &dir, int self, int worldSize,
                           const LoadedPlan *plan) {
  RankStatus own = readRankStatus(dir, self);
  std::string out;
  int listed = 0, more = 0;
  for (int r = 0; r < worldSize; ++r) {
    if (r == self)
      continue;
    RankStatus s = readRankStatus(dir, r);
    int64_t silentMs = s.heartbeatMs >= 0 ? monotonicMs() - s.heartbeatMs : 0;
    // A live rank whose heartbeat stopped is frozen, whenever it was stopped:
    // start-up and the time between steps included.
    bool frozen = liveStatus(s.text) && silentMs > 1000;
    if (!s.present || (!frozen && s.text == own.text && s.instruction == own.instruction))
      continue;
    if (listed++ == 8) {
      ++more;
      continue;
    }
    char silent[64] = "";
    if (frozen)
      std::snprintf(silent, sizeof silent, " (frozen: no heartbeat for %.1f s)", silentMs / 1000.0);
    out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
           (liveStatus(s.text) ? " is " + whereRankIs(s, plan) : " has status '" + s.text + "'") +
           silent;
  }
  if (more)
    out += "; and " + std::to_string(more) + " more ranks";
  if (out.empty())
    return "every rank's status file shows it " + whereRankIs(own, plan);
  return "this rank is " + whereRankIs(own, plan) + "; " + out;
}

std::string frozenRank(const std::string &dir, int ranks, int64_t limitMs, const LoadedPlan *plan) {
  for (int r = 0; r < ranks; ++r) {
    RankStatus s = readRankStatus(dir, r);
    if (!s.present || s.heartbeatMs < 0 || !liveStatus(s.text))
      continue;
    int64_t silentMs = monotonicMs() - s.heartbeatMs;
    if (silentMs <= limitMs)
      continue;
    char silent[64];
    std::snprintf(silent, sizeof silent, " (frozen: no heartbeat for %.1f s)", silentMs / 1000.0);
    return "rank " + std::to_string(r) + " is " + whereRankIs(s, plan) + silent;
  }
  return "";
}

Status StatusBeacon::beforeStep(TrainingSession &, int64_t step) {
  gStepStarted = true;
  if (gInstruction) // the previous step's last instruction is not this step's
    gInstruction->store(-1, std::memory_order_relaxed);
  char text[32];
  std::snprintf(text, sizeof text, "step %lld", static_cast<long long>(step + 1));
  writeStatus(text);
  return Status::ok();
}

Status StatusBeacon::afterStep(TrainingSession &, const StepResult &result) {
  if (gInstruction)
    gInstruction->store(-1, std::memory_order_relaxed);
  char text[32];
  std::snprintf(text, sizeof text, "after step %lld", static_cast<long long>(result.step + 1));
  writeStatus(text);
  return Status::ok();
}

/// After a failed job: the ranks that stopped without a word (killed or
/// frozen), from their status files, with the step and instruction where they
/// stopped.
void reportSilentDeaths(const std::string &dir, int ranks, const std::string &planPath) {
  std::shared_ptr<const LoadedPlan> plan;
  for (int r = 0; r < ranks; ++r) {
    RankStatus s = readRankStatus(dir, r);
    if (!liveStatus(s.text))
      continue;
    if (!plan && s.instruction >= 0)
      if (auto loaded = LoadedPlan::loadFile(planPath); loaded.isOk())
        plan = *loaded;
    std::cerr << "ptc-run: rank " << r << " stopped without reporting an error, "
              << (s.text == "starting" ? std::string("while starting")
                                       : whereRankIs(s, plan.get()))
              << " (killed by a signal such as SIGKILL or the out-of-memory killer, or frozen: "
                 "SIGSTOP, a hung device); mpirun stopped the other ranks\n";
  }
}

std::string makeStatusDirectory() {
  auto dir = makeTempDirectory("ptc-run-status-");
  if (dir.isOk())
    return *dir;
  std::cerr << "ptc-run: warning: for the ranks' status files, " << dir.status().message()
            << ": a rank that dies without a word will not be named\n";
  return "";
}

} // namespace ptc
