#include "tools/ptc-run/launcher.h"

#include "runtime/base/exit_codes.h"
#include "runtime/base/hostfile.h"
#include "runtime/base/parse_number.h"
#include "runtime/base/self_path.h"
#include "runtime/base/signal_handlers.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/plan/plan_loader.h"
#include "tools/ptc-run/rank_status.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

namespace ptc {

int ranksOnThisNode() {
  for (const char *var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char *v = std::getenv(var))
      if (auto n = parseInteger(v, 1, INT32_MAX))
        return static_cast<int>(*n);
  // srun: SLURM_STEP_TASKS_PER_NODE lists the tasks of each node in node
  // order, runs compressed ("2(x3),1"); SLURM_NODEID is this node's index.
  if (const char *v = std::getenv("SLURM_STEP_TASKS_PER_NODE")) {
    int64_t node = 0;
    if (const char *id = std::getenv("SLURM_NODEID"))
      node = parseInteger(id, 0, INT32_MAX).value_or(0);
    std::stringstream list(v);
    for (std::string item; std::getline(list, item, ',');) {
      size_t x = item.find("(x");
      auto tasks = parseInteger(item.substr(0, x), 1, INT32_MAX);
      auto repeat = x == std::string::npos
                        ? std::optional<int64_t>(1)
                        : parseInteger(item.substr(x + 2, item.size() - x - 3), 1, INT32_MAX);
      if (!tasks || !repeat)
        break;
      if (node < *repeat)
        return static_cast<int>(*tasks);
      node -= *repeat;
    }
  }
  return 1;
}

int launcherRank() {
  for (const char *var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char *v = std::getenv(var))
      return static_cast<int>(parseInteger(v, 0, INT32_MAX).value_or(0));
  return 0;
}

namespace {
/// "rank 3" -> "rank *": the ranks' copies of one error compare equal.
std::string withoutRankNumbers(const std::string &line, std::vector<int> *ranks) {
  std::string out;
  for (size_t i = 0; i < line.size();) {
    if (line.compare(i, 5, "rank ") == 0 && i + 5 < line.size() && std::isdigit(static_cast<unsigned char>(line[i + 5]))) {
      size_t j = i + 5;
      while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j])))
        ++j;
      if (ranks && ranks->empty())
        ranks->push_back(
            static_cast<int>(parseInteger(line.substr(i + 5, j - i - 5), 0, INT32_MAX).value_or(-1)));
      out += "rank *";
      i = j;
    } else {
      out += line[i++];
    }
  }
  return out;
}

// A stop request: SIGUSR1 or SIGTERM to the launcher, from its first
// instruction on, becomes SIGUSR1 to mpirun, which Open MPI forwards to every
// rank (a clean stop at the next step boundary with a checkpoint); then the
// launcher does not restart the job. The handler only notes it:
// forwardStopWhenReady passes it on once the ranks can take it.
volatile std::sig_atomic_t gStopRequested = 0;

extern "C" void noteStop(int) { gStopRequested = 1; }

/// The launcher's watch on the ranks' heartbeats (their status files): a rank
/// frozen where no collective timeout can see it (SIGSTOP while MPI starts
/// up, whose waits have no timeout) ends the job after `limitSeconds`, named.
struct FreezeWatch {
  std::string statusDir; // "" when the ranks keep no status files
  int ranks = 0;
  double limitSeconds = 0;
  std::string planPath;
};

/// Until `done`: every 250 ms, a rank frozen for longer than the watch's limit
/// is named on stderr and mpirun (`child`) is stopped (SIGTERM, which it passes
/// on to the ranks and, a stopped rank included, ends them; SIGKILL 30 s later
/// when it has not ended).
void watchForFrozenRanks(const FreezeWatch &watch, pid_t child, const std::atomic<bool> &done) {
  const int64_t limitMs = static_cast<int64_t>(watch.limitSeconds * 1000);
  int64_t stoppedAt = -1;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (stoppedAt >= 0) {
      if (monotonicMs() - stoppedAt > 30000) {
        ::kill(child, SIGKILL);
        return;
      }
      continue;
    }
    std::string frozen = frozenRank(watch.statusDir, watch.ranks, limitMs, nullptr);
    if (frozen.empty())
      continue;
    std::shared_ptr<const LoadedPlan> plan;
    if (auto loaded = LoadedPlan::loadFile(watch.planPath); loaded.isOk())
      plan = *loaded;
    frozen = frozenRank(watch.statusDir, watch.ranks, limitMs, plan.get());
    std::string text = "ptc-run: error: " + (frozen.empty() ? std::string("a rank froze") : frozen) +
                       ": stopping the job (the launcher's freeze limit is " +
                       std::to_string(static_cast<int>(watch.limitSeconds)) + " s)\n";
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
    ::kill(child, SIGTERM);
    stoppedAt = monotonicMs();
  }
}

/// Until `done`: once a stop was requested, SIGUSR1 to mpirun (`child`) as
/// soon as every rank can take it, which is when each rank's status file
/// exists (a rank writes it after installing its stop handler; one signalled
/// before would die of the signal, and mpirun before its own set-up too).
/// Without status files, after mpirun's first second.
void forwardStopWhenReady(const FreezeWatch &watch, pid_t child, const std::atomic<bool> &done) {
  const int64_t started = monotonicMs();
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!gStopRequested)
      continue;
    bool ready = !watch.statusDir.empty() || monotonicMs() - started > 1000;
    for (int r = 0; r < watch.ranks && ready && !watch.statusDir.empty(); ++r)
      ready = readRankStatus(watch.statusDir, r).present;
    if (ready) {
      ::kill(child, SIGUSR1);
      return;
    }
  }
}

/// Runs mpirun (`exec` in a child) and forwards the ranks' stderr, printing
/// each error or warning once per job: the same line from other ranks
/// (differing only in rank numbers) is counted, and one line at the end
/// names those ranks; `watch` ends a job with a frozen rank. Returns the wait
/// status, or -1 when it cannot fork.
template <typename Exec>
int runJob(std::vector<std::string> &full, Exec &exec, const FreezeWatch &watch) {
  int fds[2];
  if (::pipe(fds) != 0)
    return -1;
  pid_t child = fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (child == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    exec(full);
    std::_Exit(127);
  }
  ::close(fds[1]);
  std::atomic<bool> jobDone{false};
  std::thread watcher, stopper(forwardStopWhenReady, std::cref(watch), child, std::cref(jobDone));
  if (!watch.statusDir.empty())
    watcher = std::thread(watchForFrozenRanks, std::cref(watch), child, std::cref(jobDone));
  std::map<std::string, std::vector<int>> repeats; // first line -> the other ranks' numbers
  std::vector<std::string> order;
  std::string pending;
  char buf[4096];
  auto forward = [&](const std::string &line) {
    bool message = line.rfind("ptc-run: error:", 0) == 0 || line.rfind("ptc-run: warning:", 0) == 0;
    if (message) {
      std::vector<int> rank;
      std::string key = withoutRankNumbers(line, &rank);
      auto it = repeats.find(key);
      if (it != repeats.end()) {
        if (!rank.empty())
          it->second.push_back(rank[0]);
        else
          it->second.push_back(-1);
        return;
      }
      repeats[key];
      order.push_back(key);
    }
    std::string out = line + "\n";
    std::fwrite(out.data(), 1, out.size(), stderr);
    std::fflush(stderr);
  };
  while (true) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      forward(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty())
    forward(pending);
  ::close(fds[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  jobDone = true;
  if (watcher.joinable())
    watcher.join();
  stopper.join();
  for (const std::string &key : order) {
    std::vector<int> others = repeats[key];
    if (others.empty())
      continue;
    std::sort(others.begin(), others.end());
    std::string names;
    int unnamed = 0;
    for (int r : others)
      if (r < 0)
        ++unnamed;
      else
        names += (names.empty() ? "" : ", ") + std::to_string(r);
    std::cerr << "ptc-run: (the message above was also reported by "
              << (names.empty() ? std::to_string(unnamed) + " other rank" + (unnamed > 1 ? "s" : "")
                                : "rank" + std::string(others.size() > 1 ? "s " : " ") + names +
                                      (unnamed ? " and " + std::to_string(unnamed) + " more" : ""))
              << ")\n";
  }
  return status;
}

} // namespace

/// `ptc-run --np N ARGS...` re-executes itself under mpirun with N ranks.
/// With `--max-restarts R` it supervises the job instead (as torchrun does):
/// when the job fails (a rank died, a peer error), every rank is gone (mpirun
/// ends them all), the failure is logged, and the job starts again from the
/// latest checkpoint of --checkpoint-dir, at most R times.
int launchWithMpirun(int argc, char **argv, int64_t jobRanks, int64_t maxRestarts,
                     const std::string &checkpointDir, const std::string &planPath,
                     const std::string &hostfile, double collectiveTimeout) {
  // First (they were blocked since before main): a stop request is never lost.
  handleSignals({SIGUSR1, SIGTERM}, noteStop);
  unblockSignals({SIGUSR1, SIGTERM});
  const int ranks = static_cast<int>(jobRanks); // 1 to kMaxMeshDevices: checked by the caller
  const std::string np = std::to_string(ranks);
  std::vector<std::string> args{"mpirun", "-np", np};
  if (!hostfile.empty())
    args.insert(args.begin() + 1, {"--hostfile", hostfile});
  std::filesystem::path self = selfExecutable();
  args.push_back(self.empty() ? std::string(argv[0]) : self.string());
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--np" || a == "--max-restarts" || a == "--hostfile" ||
        (maxRestarts > 0 && a == "--resume")) {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  // Local convenience: allow root and more ranks than cores (OpenMPI).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  // The ranks' own errors say what failed; Open MPI's MPI_ABORT and "job
  // aborted" banners (0.8-1.1 KB) repeat it. OMPI_MCA_orte_execute_quiet=0
  // brings them back.
  setenv("OMPI_MCA_orte_execute_quiet", "1", 0);
  auto exec = [&np](std::vector<std::string> &full) {
    std::vector<char *> cargs;
    for (std::string &a : full)
      cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execvp("mpirun", cargs.data());
    std::cerr << "ptc-run: error: cannot start mpirun for --np " << np << ": "
              << std::strerror(errno) << "\n";
  };
  // The ranks' status files, to name a rank that dies without a word.
  std::string statusDir = makeStatusDirectory();
  if (!statusDir.empty())
    setenv("PTC_STATUS_DIR", statusDir.c_str(), 1);
  // When the job is over, every rank gone: the status files, and checkpoints
  // a rank was writing when the job failed (never read; a restart writes anew).
  auto cleanup = [&] {
    if (!statusDir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(statusDir, ec);
    }
    if (!checkpointDir.empty())
      removeTemporaryCheckpoints(checkpointDir);
  };
  // The ranks the hostfile's hosts can take now: too few to start or restart
  // the job is kExitTooFewRanks (ptc-train's elastic mode re-plans on it).
  auto tooFewRanks = [&](const char *when) -> int {
    if (hostfile.empty())
      return 0;
    std::string error;
    auto hosts = readHostfile(hostfile, error);
    if (!hosts) {
      std::cerr << "ptc-run: error: " << error << "\n";
      return 1;
    }
    if (totalSlots(*hosts) >= ranks)
      return 0;
    std::cerr << "ptc-run: " << totalSlots(*hosts) << (totalSlots(*hosts) == 1 ? " rank is" : " ranks are")
              << " available (the slots of "
              << hostfile << ", " << hosts->size() << (hosts->size() == 1 ? " host" : " hosts")
              << ") but the plan needs " << ranks << ": " << when
              << " (ptc-train --elastic re-plans for the ranks there are)\n";
    return kExitTooFewRanks;
  };
  if (int rc = tooFewRanks("cannot start the job"))
    return rc;
  // The freeze limit: past the collective timeout (the default's 60 s when none
  // is given), so that a peer's collective timeout, which names both sides,
  // normally comes first.
  FreezeWatch watch{statusDir, ranks, (collectiveTimeout > 0 ? collectiveTimeout : 60.0) + 10.0,
                    planPath};
  auto stoppedOnRequest = [](int status) {
    return WIFEXITED(status) && WEXITSTATUS(status) == kExitStopped;
  };
  if (maxRestarts <= 0) {
    int status = runJob(args, exec, watch);
    if (status < 0)
      exec(args); // cannot supervise: run mpirun in place
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !stoppedOnRequest(status) &&
        !statusDir.empty())
      reportSilentDeaths(statusDir, ranks, planPath);
    cleanup();
    if (WIFEXITED(status))
      return WEXITSTATUS(status) == 127 ? 1 : WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
  } else {
    // The first attempt resumes only if the user asked to (--resume).
    std::string resumeFrom;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--resume")
        resumeFrom = argv[i + 1];
    for (int64_t attempt = 0;; ++attempt) {
      if (attempt > 0 && gStopRequested) { // asked while the failed job ended
        std::cerr << "ptc-run: the job was asked to stop: not restarting\n";
        cleanup();
        return kExitStopped;
      }
      std::vector<std::string> full = args;
      if (!resumeFrom.empty()) {
        full.push_back("--resume");
        full.push_back(resumeFrom);
      }
      int status = runJob(full, exec, watch);
      if (status < 0) {
        std::cerr << "ptc-run: error: cannot fork mpirun: " << std::strerror(errno) << "\n";
        return 1;
      }
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        cleanup();
        return 0;
      }
      if (stoppedOnRequest(status) || gStopRequested) {
        std::cerr << "ptc-run: the job was asked to stop: not restarting\n";
        cleanup();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (!statusDir.empty())
        reportSilentDeaths(statusDir, ranks, planPath);
      std::string cause = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
      if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
        std::cerr << "ptc-run: the job failed with a usage error (exit status 2): not restarting\n";
        cleanup();
        return 2;
      }
      // A rank that failed while starting (its plan, data or weights) and no
      // rank that began a step: a restart would fail the same way.
      if (!statusDir.empty()) {
        bool startError = false, stepped = false;
        for (int r = 0; r < ranks; ++r) {
          RankStatus st = readRankStatus(statusDir, r);
          startError |= st.text == "error at start";
          stepped |= st.text.rfind("step ", 0) == 0 || st.text.rfind("after step ", 0) == 0 ||
                     st.text == "error" || st.text == "done";
        }
        if (startError && !stepped) {
          std::cerr << "ptc-run: the job failed before its first step (" << cause
                    << "), as a restart would again: not restarting\n";
          cleanup();
          return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        }
      }
      if (attempt >= maxRestarts) {
        std::cerr << "ptc-run: the job failed (" << cause << ") and all " << maxRestarts
                  << " restarts are used: giving up\n";
        cleanup();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      }
      if (int rc = tooFewRanks("not restarting")) {
        cleanup();
        return rc;
      }
      std::vector<std::string> ignored;
      auto latest = findCheckpoint(checkpointDir, &ignored);
      resumeFrom = latest.isOk() ? checkpointDir : "";
      std::cerr << "ptc-run: the job failed (" << cause << "); restart " << attempt + 1 << " of "
                << maxRestarts << (latest.isOk() ? " from the checkpoint " + *latest
                                                 : std::string(" from the beginning (no checkpoint yet)"))
                << "\n"
                << std::flush;
    }
  }
  return 1;
}

} // namespace ptc
