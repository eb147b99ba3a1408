// ptc-run: executes a ptc plan (one training step per iteration) on the CPU
// or a GPU (--device): a TrainingSession (runtime/session) driven with the
// options (options: their table and checks), the session's hooks for
// evaluation, metrics and progress (runtime/session/step_log) and reports
// (runtime/session/run_reports); the --np launcher and its supervisor
// (launcher), the ranks' status files (rank_status).
//   ptc-run gpt.plan --data corpus.bin --steps 200 --metrics run.jsonl --save final.safetensors
//   ptc-run gpt.plan --dump-plan

#include "runtime/base/signal_handlers.h"
#include "runtime/comm/watchdog.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/session/checkpointing.h"
#include "runtime/session/run_reports.h"
#include "runtime/session/stop_request.h"
#include "runtime/session/throughput.h"
#include "runtime/session/training_session.h"
#include "tools/ptc-run/launcher.h"
#include "tools/ptc-run/options.h"
#include "tools/ptc-run/rank_status.h"
#include "runtime/session/step_log.h"

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
using namespace ptc;

bool gMultiRank = false;

// The stop signals (SIGUSR1, SIGTERM) are blocked before any library's
// initializer runs (OpenBLAS's and the CUDA libraries' take a few hundred
// milliseconds before main): one sent then waits, pending, until main has
// installed what takes it (the launcher's handler, a rank's stop thread, the
// status file's SIGTERM handler) and unblocks it, instead of killing the
// process silently. Threads the libraries start inherit the block.
void blockStopSignalsAtStart(int, char **, char **) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);
}
[[gnu::used, gnu::section(".preinit_array")]] void (*const kBlockStopSignalsAtStart)(
    int, char **, char **) = blockStopSignalsAtStart;

int fail(const std::string &message) {
  finishStatus(stepStarted() ? "error" : "error at start");
  // One write, so that lines of several ranks do not interleave.
  std::string line = "ptc-run: error: " +
                     (gMultiRank ? "rank " + std::to_string(worldRank()) + ": " : std::string()) +
                     message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  // Peers may be waiting in a collective: take the whole job down.
  if (gMultiRank)
    abortMpi(1);
  return 1;
}

} // namespace

int runMain(int argc, char **argv) {
  RunOptions o;
  if (std::optional<int> done = parseRunOptions(argc, argv, o))
    return *done;
  if (o.tf32)
    setenv("PTC_CUDA_TF32", "1", 1); // read by the CUDA device
  if (o.has("--np"))
    return launchWithMpirun(argc, argv, o.ranks, o.maxRestarts, o.checkpointDir, o.planPath,
                            o.hostfile, o.collectiveTimeout);
#ifdef _OPENMP
  // Every kernel's threads, GEMMs included (kernels/cpu/matmul.cc splits
  // them over OpenMP's threads).
  if (o.has("--threads"))
    omp_set_num_threads(static_cast<int>(o.threads));
  else if (!std::getenv("OMP_NUM_THREADS"))
    omp_set_num_threads(defaultKernelThreads());
#endif
  const std::string &planPath = o.planPath;
  const int64_t steps = o.steps;

  if (o.dumpPlan || o.has("--kernel-coverage")) {
    unblockSignals({SIGUSR1, SIGTERM}); // their default actions
    const kernels::KernelTable *table = nullptr;
    if (o.has("--kernel-coverage") && !(table = kernelTableOf(o.kernelCoverage)))
      return fail(o.kernelCoverage == "cuda"
                      ? std::string("--kernel-coverage cuda: this build has no CUDA backend")
                      : "--kernel-coverage takes cpu or cuda, got '" + o.kernelCoverage + "'");
    auto loaded = LoadedPlan::loadFile(planPath);
    if (!loaded.isOk())
      return fail(loaded.status().message());
    if (o.dumpPlan)
      std::cout << planToJson(**loaded) << "\n";
    if (table)
      std::cout << "kernel coverage of " << planPath << " on " << o.kernelCoverage << ":\n"
                << describe(kernelCoverage(**loaded, *table));
    return 0;
  }
  // SIGUSR1 (and SIGTERM, but from the --np launcher's mpirun, which sends it
  // to stop the ranks after one failed) stops at the next step boundary with
  // a checkpoint. Before any thread starts (the status heartbeat's, MPI's).
  if (const char *dir = std::getenv("PTC_STATUS_DIR"); dir && *dir) {
    installStopSignals({SIGUSR1});
    openStatus(); // under --np: this rank's status for the launcher
    unblockSignals({SIGTERM}); // now taken by the status file's handler
  } else {
    installStopSignals({SIGUSR1, SIGTERM});
  }
  // More ranks on this node than cores (srun on an oversubscribed node, where
  // Open MPI, not started by its own mpirun, does not know it): waiting ranks
  // yield the core instead of spinning on it (2.2x the tokens/s of 4 ranks
  // on 2 cores).
  if (ranksOnThisNode() > static_cast<int>(std::thread::hardware_concurrency()))
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  SessionOptions options;
  options.planPath = planPath;
  options.dataPath = o.data;
  options.dataBlend = o.dataBlend;
  options.initPath = o.init;
  options.offloadDir = o.offloadDir;
  if (o.has("--shuffle"))
    options.shuffleSeed = static_cast<uint64_t>(o.shuffle);
  options.device = o.device;
  options.comm = o.commBackend;
  options.seed = static_cast<uint64_t>(o.seed);
  options.collectiveTimeout = o.collectiveTimeout;
  options.stepTimeout = o.stepTimeout;
  options.stopOnNonfinite = o.nonfiniteAction == NonfiniteAction::Stop;
  options.maxSkippedSteps = o.maxSkippedSteps;
  options.instructionProgress = statusInstructionSlot();
  // The watchdog's message is this rank's error: the status file says so, and
  // the launcher does not report the rank as dead without a word.
  options.onStepTimeout = [] {
    finishStatus("error");
      };
  FailureScope scope = FailureScope::ThisRank;
  auto created = TrainingSession::create(options, &scope);
  if (!created.isOk()) {
    if (scope == FailureScope::ThisRank || !launchedByMpi())
      return fail(created.status().message());
    // Every rank found the problem: each (or rank 0, for one they share)
    // reports it, and all leave cleanly.
    finishStatus("error at start");
        if (scope == FailureScope::EachRank || worldRank() == 0) {
      std::string line = "ptc-run: error: " + created.status().message() + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
    }
    finalizeMpi();
    return 1;
  }
  TrainingSession &session = **created;
  gMultiRank = session.communicator() && session.communicator()->worldSize() > 1;
  // A collective that times out names the ranks elsewhere in the step (the
  // frozen or dead one among them), from the launcher's status files.
  if (const char *dir = std::getenv("PTC_STATUS_DIR"); dir && *dir && gMultiRank) {
    std::shared_ptr<const LoadedPlan> shared = session.sharedPlan();
    int self = session.communicator()->rank(), world = session.communicator()->worldSize();
    setCollectiveTimeoutNote([dirPath = std::string(dir), shared, self, world] {
      return ranksElsewhere(dirPath, self, world, shared.get());
    });
  }
  const LoadedPlan &plan = session.plan();
  const bool leader = session.leader();
  if (leader)
    for (const std::string &name : session.unusedInitTensors())
      std::cerr << "ptc-run: warning: --init '" << options.initPath << "': skipped tensor "
                << name << "\n";
  if (leader)
    std::cout << "ptc-run: " << planPath << ": " << session.describe() << "\n";
  if (const char *result = std::getenv("PTC_RESULT_FILE"); result && *result && leader)
    std::ofstream(result) << "started\n";

  session.executor().measureFileResidency(o.memoryReport);
  std::vector<double> opTimes;
  if (o.profile)
    session.setProfile(&opTimes, /*skipFirst=*/steps > 1);
  if (!o.trace.empty())
    session.traceFrom(steps - 1);
  // --resume: parameters, optimizer state and the step count of the newest
  // complete checkpoint (any layout); the data continues at that step.
  int64_t first = 0;
  if (o.has("--resume")) {
    std::vector<std::string> warnings;
    auto resumed = resumeFromCheckpoint(session, o.resume, &warnings);
    if (!resumed.isOk())
      return fail(resumed.status().message());
    first = *resumed;
    if (leader) {
      for (const std::string &w : warnings)
        std::cerr << "ptc-run: warning: " << w << "\n";
      std::cout << "ptc-run: resumed from " << o.resume << " at step " << first << "\n";
    }
    if (first > steps)
      return fail("the checkpoint is at step " + std::to_string(first) + ", beyond --steps " +
                  std::to_string(steps));
  }
  MetricsWriter metrics;
  if (leader) {
    Status s = Status::ok();
    if (o.has("--metrics"))
      s = metrics.openJsonLines(o.metrics, first > 0);
    if (s.isOk() && o.has("--metrics-csv"))
      s = metrics.openCsv(o.metricsCsv, first > 0);
    int removed = 0;
    if (s.isOk() && o.has("--tensorboard"))
      s = metrics.openTensorBoard(o.tensorboard, first > 0, &removed);
    if (s.isOk() && removed > 0)
      std::cout << "ptc-run: a fresh run: removed " << removed << " TensorBoard event "
                << (removed == 1 ? "file" : "files") << " of an earlier run from " << o.tensorboard
                << " (as the CSV and JSON lines start over)\n";
    if (!s.isOk())
      return fail(s.message());
  }
  // TFLOP/s and MFU: the plan's model FLOPs over the step time, against the
  // peak given or measured (every rank at once, so each measures its share
  // of a node's cores as it trains).
  ThroughputBasis basis;
  basis.modelFlops = plan.plan().model_flops();
  basis.ranks = session.communicator() ? session.communicator()->worldSize() : 1;
  basis.lastStep = steps - 1;
  basis.tokens = session.data() != nullptr;
  basis.peakTflops = o.peakTflops;
  const bool wantsFigures = o.logEvery > 0 || o.has("--metrics") ||
                            o.has("--metrics-csv") || o.has("--tensorboard");
  if (basis.modelFlops > 0 && o.peakTflops == 0.0 && wantsFigures) {
    Device &device = session.executor().device();
    auto peak = matmulPeak(device, matmulComputeType(plan, device), basis.ranks, defaultPeakCacheFile(),
                           /*update=*/leader);
    if (!peak.isOk())
      return fail("measuring the device's peak for MFU: " + peak.status().message() +
                  " (give it with --peak-tflops)");
    basis.peakTflops = peak->tflops;
    if (leader)
      std::printf("ptc-run: model %.4g FLOPs per step; MFU against %.3g TFLOP/s per device (%s)\n",
                  basis.modelFlops, basis.peakTflops, peak->what.c_str());
  } else if (leader && basis.modelFlops > 0 && o.peakTflops > 0.0) {
    std::printf("ptc-run: model %.4g FLOPs per step; MFU against %.3g TFLOP/s per device (given)\n",
                basis.modelFlops, basis.peakTflops);
  }
  std::fflush(stdout);
  metrics.setBasis(basis);
  ProgressPrinter progress(leader ? o.logEvery : 0, steps);
  progress.setBasis(basis);
  progress.setFirst(first);
  LossScaleTracker lossScale;
  std::optional<TokenData> evalData;
  if (o.has("--eval-data")) {
    if (!session.data())
      return fail("--eval-data needs a language model trained from token files");
    auto loaded = TokenData::load(std::vector<std::string>{o.evalData}, session.seq(),
                                  session.vocab());
    if (!loaded.isOk())
      return fail(loaded.status().message());
    evalData = std::move(*loaded);
  }
  if (evalData && leader && o.evalEvery > steps - first)
    std::cerr << "ptc-run: warning: --eval-every " << o.evalEvery << " is more than this run's "
              << steps - first << " steps: only the evaluation after the last step runs\n";
  EvalHook eval(evalData ? &*evalData : nullptr, o.evalEvery, o.evalSteps, steps - 1);
  metrics.setEval(&eval);
  progress.setEval(&eval);
  StatusBeacon beacon;
  std::vector<SessionHook *> hooks{&beacon, &eval, &metrics, &progress, &lossScale};
  const std::string &checkpointDir = o.checkpointDir;
  CheckpointHook checkpoints(checkpointDir, o.checkpointEvery, static_cast<int>(o.keepLast),
                             o.asyncCheckpoint);
  if (!checkpointDir.empty())
    hooks.push_back(&checkpoints);
  StopHook stop; // last: a checkpoint due at the boundary is written first
  hooks.push_back(&stop);
  if (Status s = session.run(first, steps - first, hooks); !s.isOk())
    return fail(s.message());
  if (stop.stoppedAfter() >= 0 && stop.stoppedAfter() < steps) {
    // Stopped on request: the checkpoint of this boundary, then kExitStopped.
    const int64_t at = stop.stoppedAfter();
    if (!checkpointDir.empty()) {
      Status s = checkpoints.finishPending(session);
      if (s.isOk() && checkpoints.lastSaved() != at)
        s = saveCheckpoint(session, checkpointDir, at, static_cast<int>(o.keepLast));
      if (!s.isOk())
        return fail(s.message());
    }
    if (leader) {
      std::string why = stopSignal() ? "SIG" + signalName(stopSignal()) : "a signal to another rank";
      std::cout << "ptc-run: stopped by " << why << " after step " << at << " of " << steps;
      if (checkpointDir.empty())
        std::cout << "; no --checkpoint-dir, so nothing was saved\n";
      else
        std::cout << "; checkpoint in " << checkpointDir << "/" << checkpointStepName(at)
                  << " (continue with --resume " << checkpointDir << "); exit status "
                  << kExitStopped << "\n";
      std::cout << std::flush;
    }
    finishStatus("stopped");
        finalizeMpi();
    return kExitStopped;
  }
  // The end of the run is a checkpoint too (unless the last step just wrote one).
  if (!checkpointDir.empty()) {
    Status s = checkpoints.finishPending(session);
    if (s.isOk() && steps > first && checkpoints.lastSaved() != steps)
      s = saveCheckpoint(session, checkpointDir, steps, static_cast<int>(o.keepLast));
    if (!s.isOk())
      return fail(s.message());
    if (leader) {
      std::cout << "ptc-run: checkpoint of step " << steps << " in " << checkpointDir << "/"
                << checkpointStepName(steps) << "\n";
      if (checkpoints.saves() > 0)
        std::printf("ptc-run: %lld %s during the run%s held training up %.3f s in all "
                    "(%.1f ms each)\n",
                    static_cast<long long>(checkpoints.saves()),
                    checkpoints.saves() == 1 ? "checkpoint" : "checkpoints", o.asyncCheckpoint ? " (async)" : "",
                    checkpoints.blockedSeconds(),
                    1e3 * checkpoints.blockedSeconds() / static_cast<double>(checkpoints.saves()));
    }
  }

  if (!o.trace.empty())
    if (Status s = writeStepTrace(session, o.trace); !s.isOk())
      return fail(s.message());
  if (lossScale.active() && leader)
    std::cout << "dynamic loss scale: " << lossScale.last() << " at the last step; "
              << lossScale.skipped() << " of the steps before it overflowed and were skipped\n";
  if (o.profile && session.profiledSteps() > 0 && leader)
    printOpProfile(opTimes, session.profiledSteps(), steps > session.profiledSteps());
  if (o.profile)
    if (Status s = printRingProfile(session, steps); !s.isOk())
      return fail(s.message());
  if (o.memoryReport)
    printMemoryReportPerPipelineRank(session);

  if (o.has("--save")) {
    Status s = session.saveParameters(o.save,
                                      {{"format", "pt"},
                                       {"producer", "ptc-run"},
                                       {"steps", std::to_string(steps)}},
                                      o.maxShardMb * 1000 * 1000);
    if (!s.isOk())
      return fail(s.message());
    if (leader) {
      int64_t count = 0;
      for (const TensorInfo &t : plan.tensors())
        count += t.kind == plan::TensorKind::Parameter;
      std::cout << "ptc-run: saved " << count << " parameters to " << o.save << "\n";
    }
  }
  // For a launcher whose own status cannot be trusted (Slurm 22.05's srun
  // exits 0 when a step fails to launch): the leader's word that the ranks
  // started (above) and that the run ended.
  if (const char *result = std::getenv("PTC_RESULT_FILE"); result && *result && leader)
    std::ofstream(result) << "done " << steps << "\n";
  finishStatus("done");
    finalizeMpi();
  return 0;
}

// One place for whatever escaped as an exception (a library's, or a bug's):
// an error message and status 1, never an abort.
int main(int argc, char **argv) {
  try {
    return runMain(argc, argv);
  } catch (const std::exception &e) {
    return fail(std::string("internal error: ") + e.what());
  } catch (...) {
    return fail("internal error: an unknown exception");
  }
}
