// ptc-run: executes a ptc plan (one training step per iteration) on the CPU
// or a GPU (--device): flag parsing around a TrainingSession
// (runtime/session), with hooks for metrics and progress (step_log), the
// --np launcher and its supervisor (launcher), the ranks' status files
// (rank_status).
//   ptc-run gpt.plan --data corpus.bin --steps 200 --metrics run.jsonl --save final.safetensors
//   ptc-run gpt.plan --dump-plan

#include "runtime/base/parse_number.h"
#include "runtime/comm/watchdog.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/io/durable_file.h"
#include "runtime/session/checkpointing.h"
#include "runtime/session/stop_request.h"
#include "runtime/session/throughput.h"
#include "tools/ptc-run/launcher.h"
#include "tools/ptc-run/rank_status.h"
#include "tools/ptc-run/step_log.h"
#include "runtime/session/training_session.h"


#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
using namespace ptc;

const char *kUsage = R"(usage: ptc-run PLAN [options]
  --data FILE         token file (nanoGPT's uint16 .bin, or ptc-tokenize's uint16/uint32 form
                      with a header; memory-mapped; A.bin,B.bin: one stream) feeding the
                      'tokens'/'targets' inputs, or FILE.safetensors: one array per plan input,
                      first dimension the example
  --data-blend "W1 A.bin W2 B.bin ..."  weighted datasets instead of --data (Megatron's blend:
                      each sample from the dataset furthest behind its share of the weights)
  --shuffle SEED      token windows in a seeded order (each once per epoch; resumes exactly)
  --eval-data FILE    validation tokens: every --eval-every N steps (default 100) and after
                      the last step, the mean loss of --eval-steps K batches (default 10) of
                      FILE, updating nothing, as eval_loss in the metrics and the progress
  --steps N           training steps to run (default 100)
  --init PATH         initial parameters from a safetensors file or a Hugging Face model
                      directory (index + shards; F32, BF16, F16) (default: the plan's initializers)
  --seed S            seed of the plan's initializers (default 1337)
  --save PATH         write the final parameters as safetensors; PATH/ (or an existing
                      directory): Hugging Face's sharded form (index + shards)
  --max-shard-mb N    largest shard of a --save directory in MB (default 5000, as HF's 5GB)
  --checkpoint-dir D  distributed checkpoints (parameters, optimizer state, step) in D, written
                      atomically: D/step-NNNNNNNN/ (each rank its shards + metadata.json), D/latest
  --checkpoint-every N  a checkpoint every N steps (and at the end of the run)
  --keep-last K       keep the K newest checkpoints (older ones pruned after a new one is complete)
  --async-checkpoint  the step boundary copies the shards to host memory; a background thread
                      writes them and the next boundary publishes the checkpoint
  --resume D          continue from the newest complete checkpoint in D (any layout, rank count)
                      SIGUSR1 (any rank, or the --np launcher) or SIGTERM (not under --np's mpirun)
                      stops the run at the next step boundary with a checkpoint: exit status 75
  --max-restarts R    with --np: restart a failed job from its latest checkpoint, at most R times
  --hostfile FILE     with --np: mpirun's hosts (Open MPI syntax, HOST slots=N); too few slots
                      to start or restart the job ends it with status 76 (ptc-train re-plans)
  --metrics FILE      write one JSON line per step: step, loss, tokens_per_s, elapsed_s[, grad_norm]
                      [, loss_scale][, lr (plans with an lr-schedule)][, tflops_per_device, mfu]
                      [, eval_loss][, the plan's metrics]
  --metrics-csv FILE  the same scalars as a CSV table (header row: step, loss, lr, grad_norm,
                      loss_scale, tokens_per_s, tflops_per_device, mfu, elapsed_s, eval_loss, ...)
  --tensorboard DIR   the same scalars as TensorBoard event files in DIR (train/..., eval/loss)
  --log-every N       progress line every N steps (default 10; 0: none): loss, throughput,
                      model TFLOP/s per device and MFU, elapsed time and ETA, lr, grad norm,
                      the most unbalanced MoE layer
  --peak-tflops T     the device's peak for MFU, in TFLOP/s (default: measured at start with
                      the device's own matmul, in the plan's compute precision)
  --device D          cpu, cuda or auto (default auto: cuda when a GPU is visible, else cpu);
                      with several ranks per node, rank r uses GPU (local rank mod GPUs);
                      cpu-discrete: the CPU reached only through copies, as a GPU is (testing)
  --offload-dir DIR   offload=optimizer plans: keep the master weights and optimizer state in a
                      file in DIR (NVMe) instead of host memory, read ahead before their use and
                      written back and dropped from memory after it (ZeRO-Infinity)
  --tf32              let f32 matmuls on a GPU use TF32 tensor cores (faster, ~1e-3 relative)
  --comm C            collectives over mpi, nccl or auto (default auto: NCCL on the device's
                      communication stream with --device cuda, else MPI)
  --threads N         kernel threads (default: OMP_NUM_THREADS, else the node's cores divided
                      by the ranks on it, at most the cores this process may use)
  --profile           print the time spent per op kind at the end
  --memory-report     print the memory this rank allocated against the compiler's prediction
  --dump-plan         print the verified plan as JSON and exit
  --trace FILE        write a Chrome-trace / Perfetto JSON timeline of every rank's schedule
                      actions (pipelined plans; the last step)
  --np N              start N local ranks with mpirun (an SPMD plan needs as many as its mesh)
  --collective-timeout S  fail a collective that does not finish within S seconds (default:
                      60 s plus the plan's largest collective at 10 MB/s for the step's
                      collectives, 600 s for coordination such as checkpoint agreement)
  --step-timeout S    end the run with an error when one training step takes more than S
                      seconds, whatever it waits for (a device, a peer; default 3600; 0: off)
)";

bool gMultiRank = false;

/// The kernels' threads when --threads is not given: the node's cores shared
/// by the ranks on it, and no more than the cores this process may run on (a
/// launcher that binds each rank to a core or a socket narrows its affinity
/// mask). An oversubscribed node (more ranks than cores) gets one thread per
/// rank instead of every core per rank.
int defaultThreads() {
  int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : hardware;
  return std::max(1, std::min(allowed, hardware / ranksOnThisNode()));
}

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

/// Chrome trace event format: one row (tid) per rank, times in us.
Status writeTrace(TrainingSession &session, const std::string &path) {
  Communicator *comm = session.communicator();
  std::string mine;
  for (const Executor::TraceEvent &e : session.executor().trace()) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"name\":\"%s\",\"cat\":\"%c\",\"ph\":\"X\",\"ts\":%.1f,\"dur\":%.1f,"
                  "\"pid\":0,\"tid\":%d},\n",
                  e.name.c_str(), e.name[0], e.startUs, e.durationUs, session.rank());
    mine += line;
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

void printProfile(const std::vector<double> &opTimes, int64_t steps) {
  std::vector<std::pair<double, int>> rows;
  double total = 0;
  for (size_t op = 0; op < opTimes.size(); ++op)
    if (opTimes[op] > 0) {
      rows.push_back({opTimes[op], static_cast<int>(op)});
      total += opTimes[op];
    }
  std::sort(rows.rbegin(), rows.rend());
  std::cout << "profile: time per step by op kind\n";
  for (auto [t, op] : rows) {
    char line[128];
    std::snprintf(line, sizeof line, "  %-22s %8.3f ms  %5.1f%%",
                  opcodeName(static_cast<plan::OpCode>(op)), 1e3 * t / static_cast<double>(steps),
                  100.0 * t / total);
    std::cout << line << "\n";
  }
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

int64_t parseInt(const std::string &flag, const char *value, bool &ok) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(value, &end, 10);
  if (end == value || !end || *end || v < 0 || errno == ERANGE) {
    std::cerr << "ptc-run: error: " << flag << " expects a non-negative integer below 2^63, got '"
              << value << "'\n";
    ok = false;
  }
  return v;
}

/// A positive number of seconds, all of `value` (no trailing text).
double parseSeconds(const std::string &flag, const std::string &value, bool allowZero, bool &ok) {
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end || errno == ERANGE || !std::isfinite(v) ||
      !(allowZero ? v >= 0 : v > 0)) {
    std::cerr << "ptc-run: error: " << flag << " expects a number of seconds "
              << (allowZero ? ">= 0 (0: off)" : "> 0") << ", got '" << value << "'\n";
    ok = false;
  }
  return v;
}
} // namespace

int runMain(int argc, char **argv) {
  std::map<std::string, std::string> opts;
  std::string planPath;
  bool dumpPlan = false, profile = false, memoryReport = false, asyncCheckpoint = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--dump-plan") {
      dumpPlan = true;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--memory-report") {
      memoryReport = true;
    } else if (a == "--async-checkpoint") {
      asyncCheckpoint = true;
    } else if (a == "--tf32") {
      setenv("PTC_CUDA_TF32", "1", 1); // read by the CUDA device
    } else if (a.rfind("--", 0) == 0) {
      static const char *known[] = {"--data", "--data-blend", "--steps", "--init", "--seed", "--save",
                                    "--checkpoint-dir", "--checkpoint-every", "--keep-last",
                                    "--resume", "--max-restarts", "--shuffle", "--eval-data",
                                    "--eval-every", "--eval-steps",
                                    "--metrics", "--metrics-csv", "--tensorboard",
                                    "--peak-tflops", "--log-every", "--threads", "--np", "--offload-dir",
                                    "--collective-timeout", "--trace", "--device", "--comm", "--step-timeout",
                                    "--max-shard-mb", "--hostfile"};
      if (std::find_if(std::begin(known), std::end(known), [&](const char *k) { return a == k; }) ==
          std::end(known)) {
        std::cerr << "ptc-run: error: unknown option '" << a << "' (see ptc-run --help)\n";
        return 2;
      }
      if (i + 1 >= argc) {
        std::cerr << "ptc-run: error: " << a << " needs a value\n";
        return 2;
      }
      opts[a] = argv[++i];
    } else if (planPath.empty()) {
      planPath = a;
    } else {
      std::cerr << "ptc-run: error: unexpected argument '" << a << "' (see ptc-run --help)\n";
      return 2;
    }
  }
  if (planPath.empty()) {
    std::cerr << "ptc-run: error: no plan given (usage: ptc-run PLAN [options]; see ptc-run --help)\n";
    return 2;
  }
  const std::string tracePath = opts.count("--trace") ? opts["--trace"] : "";
  const std::string deviceName = opts.count("--device") ? opts["--device"] : "auto";
  const std::string commName = opts.count("--comm") ? opts["--comm"] : "auto";
  if (commName != "auto" && commName != "mpi" && commName != "nccl") {
    std::cerr << "ptc-run: error: unknown --comm '" << commName << "' (expected mpi, nccl or auto)\n";
    return 2;
  }
  bool ok = true;
  if (opts.count("--np")) {
    int64_t np = parseInt("--np", opts["--np"].c_str(), ok);
    if (!ok)
      return 2;
    if (np < 1 || np > kMaxMeshDevices) {
      std::cerr << "ptc-run: error: --np " << np << " must be 1 to " << kMaxMeshDevices
                << " ranks\n";
      return 2;
    }
    int64_t restarts = opts.count("--max-restarts")
                           ? parseInt("--max-restarts", opts["--max-restarts"].c_str(), ok)
                           : 0;
    if (!ok)
      return 2;
    if (restarts < 0 || (restarts > 0 && !opts.count("--checkpoint-dir"))) {
      std::cerr << "ptc-run: error: --max-restarts needs a non-negative count and "
                   "--checkpoint-dir (restarts resume from its latest checkpoint)\n";
      return 2;
    }
    return launchWithMpirun(argc, argv, opts["--np"], restarts,
                            opts.count("--checkpoint-dir") ? opts["--checkpoint-dir"] : "",
                            planPath, opts.count("--hostfile") ? opts["--hostfile"] : "");
  }
  double timeout = opts.count("--collective-timeout")
                       ? parseSeconds("--collective-timeout", opts["--collective-timeout"], false, ok)
                       : 0.0; // the plan's default (defaultCollectiveTimeout)
  double stepTimeout = opts.count("--step-timeout")
                           ? parseSeconds("--step-timeout", opts["--step-timeout"], true, ok)
                           : 3600.0;
  int64_t steps = opts.count("--steps") ? parseInt("--steps", opts["--steps"].c_str(), ok) : 100;
  // Step indices times the batch index the data (token windows, rows): 2^40
  // steps keep every such product inside int64.
  if (ok && steps > (int64_t{1} << 40)) {
    std::cerr << "ptc-run: error: --steps " << steps << " is more than 2^40 steps\n";
    ok = false;
  }
  int64_t shuffleSeed =
      opts.count("--shuffle") ? parseInt("--shuffle", opts["--shuffle"].c_str(), ok) : 0;
  int64_t evalEvery =
      opts.count("--eval-every") ? parseInt("--eval-every", opts["--eval-every"].c_str(), ok) : 100;
  int64_t evalSteps =
      opts.count("--eval-steps") ? parseInt("--eval-steps", opts["--eval-steps"].c_str(), ok) : 10;
  if (ok && (evalEvery < 1 || evalSteps < 1)) {
    std::cerr << "ptc-run: error: --eval-every and --eval-steps must be at least 1\n";
    ok = false;
  }
  if (ok && (opts.count("--eval-every") || opts.count("--eval-steps")) && !opts.count("--eval-data")) {
    std::cerr << "ptc-run: error: --eval-every and --eval-steps need --eval-data\n";
    ok = false;
  }
  int64_t checkpointEvery =
      opts.count("--checkpoint-every")
          ? parseInt("--checkpoint-every", opts["--checkpoint-every"].c_str(), ok)
          : 0;
  int64_t keepLast =
      opts.count("--keep-last") ? parseInt("--keep-last", opts["--keep-last"].c_str(), ok) : 0;
  if (ok && (checkpointEvery < 0 || keepLast < 0 || keepLast > (1 << 20))) {
    std::cerr << "ptc-run: error: --checkpoint-every and --keep-last must be non-negative\n";
    ok = false;
  }
  if (ok && (checkpointEvery > 0 || keepLast > 0) && !opts.count("--checkpoint-dir")) {
    std::cerr << "ptc-run: error: --checkpoint-every and --keep-last need --checkpoint-dir\n";
    ok = false;
  }
  if (ok && (opts.count("--max-restarts") || opts.count("--hostfile"))) {
    std::cerr << "ptc-run: error: " << (opts.count("--max-restarts") ? "--max-restarts" : "--hostfile")
              << " is for a job ptc-run launches: use it with --np\n";
    ok = false;
  }
  int64_t maxShardMb =
      opts.count("--max-shard-mb") ? parseInt("--max-shard-mb", opts["--max-shard-mb"].c_str(), ok)
                                   : 5000;
  if (ok && (maxShardMb < 1 || maxShardMb > (int64_t{1} << 40))) {
    std::cerr << "ptc-run: error: --max-shard-mb " << maxShardMb << " must be at least 1\n";
    ok = false;
  }
  int64_t seed = opts.count("--seed") ? parseInt("--seed", opts["--seed"].c_str(), ok) : 1337;
  int64_t logEvery =
      opts.count("--log-every") ? parseInt("--log-every", opts["--log-every"].c_str(), ok) : 10;
  if (opts.count("--threads")) {
    int64_t threads = parseInt("--threads", opts["--threads"].c_str(), ok);
    // More threads than this is a typo, not a configuration (OpenMP aborts
    // when it cannot create them).
    int64_t most = 16 * std::max<int64_t>(1, std::thread::hardware_concurrency());
    if (ok && (threads < 1 || threads > most)) {
      std::cerr << "ptc-run: error: --threads " << threads << " is outside [1, " << most
                << "] (16 x the " << std::thread::hardware_concurrency()
                << " hardware threads here)\n";
      ok = false;
    }
    if (ok && threads > 0) {
#ifdef _OPENMP
      // Every kernel's threads, GEMMs included (kernels/cpu/matmul.cc splits
      // them over OpenMP's threads and keeps OpenBLAS single-threaded).
      omp_set_num_threads(static_cast<int>(threads));
#endif
    }
  }
#ifdef _OPENMP
  if (!opts.count("--threads") && !std::getenv("OMP_NUM_THREADS"))
    omp_set_num_threads(defaultThreads());
#endif
  if (!ok)
    return 2;

  if (dumpPlan) {
    auto loaded = LoadedPlan::loadFile(planPath);
    if (!loaded.isOk())
      return fail(loaded.status().message());
    std::cout << planToJson(**loaded) << "\n";
    return 0;
  }
  // SIGUSR1 (and SIGTERM, but from the --np launcher's mpirun, which sends it
  // to stop the ranks after one failed) stops at the next step boundary with
  // a checkpoint. Before any thread starts (the status heartbeat's, MPI's).
  if (const char *dir = std::getenv("PTC_STATUS_DIR"); dir && *dir)
    installStopSignals({SIGUSR1});
  else
    installStopSignals({SIGUSR1, SIGTERM});
  openStatus(); // under --np: this rank's status for the launcher
  // More ranks on this node than cores (srun on an oversubscribed node, where
  // Open MPI, not started by its own mpirun, does not know it): waiting ranks
  // yield the core instead of spinning on it (2.2x the tokens/s of 4 ranks
  // on 2 cores).
  if (ranksOnThisNode() > static_cast<int>(std::thread::hardware_concurrency()))
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  SessionOptions options;
  options.planPath = planPath;
  options.dataPath = opts.count("--data") ? opts["--data"] : "";
  options.dataBlend = opts.count("--data-blend") ? opts["--data-blend"] : "";
  if (opts.count("--data") && opts.count("--data-blend")) {
    std::cerr << "ptc-run: error: --data and --data-blend both name the training data; give one\n";
    return 2;
  }
  options.initPath = opts.count("--init") ? opts["--init"] : "";
  options.offloadDir = opts.count("--offload-dir") ? opts["--offload-dir"] : "";
  if (opts.count("--shuffle"))
    options.shuffleSeed = static_cast<uint64_t>(shuffleSeed);
  options.device = deviceName;
  options.comm = commName;
  options.seed = static_cast<uint64_t>(seed);
  options.collectiveTimeout = timeout;
  options.stepTimeout = stepTimeout;
  options.instructionProgress = statusInstructionSlot();
  // The watchdog's message is this rank's error: the status file says so, and
  // the launcher does not report the rank as dead without a word.
  options.onStepTimeout = [] {
    finishStatus("error");
      };
  // Outputs are checked before any work: a path in a missing directory, or
  // one that is not a regular file, fails now rather than after the run.
  double peakTflops = 0.0;
  if (opts.count("--peak-tflops")) {
    const std::string &v = opts["--peak-tflops"];
    char *end = nullptr;
    peakTflops = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end || !std::isfinite(peakTflops) || peakTflops <= 0) {
      std::cerr << "ptc-run: error: --peak-tflops expects a positive number of TFLOP/s, got '" << v
                << "'\n";
      return 2;
    }
  }
  for (const char *flag : {"--save", "--metrics", "--metrics-csv", "--trace"})
    if (opts.count(flag))
      if (Status s = std::string(flag) == "--save" && isDirectoryTarget(opts[flag])
                         ? checkOutputDirectory(opts[flag], flag)
                         : checkOutputPath(opts[flag], flag);
          !s.isOk()) {
        std::cerr << "ptc-run: error: " << s.message() << "\n";
        return 2;
      }
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

  session.executor().measureFileResidency(memoryReport);
  std::vector<double> opTimes;
  if (profile)
    session.setProfile(&opTimes);
  if (!tracePath.empty())
    session.traceFrom(steps - 1);
  // --resume: parameters, optimizer state and the step count of the newest
  // complete checkpoint (any layout); the data continues at that step.
  int64_t first = 0;
  if (opts.count("--resume")) {
    std::vector<std::string> warnings;
    auto resumed = resumeFromCheckpoint(session, opts["--resume"], &warnings);
    if (!resumed.isOk())
      return fail(resumed.status().message());
    first = *resumed;
    if (leader) {
      for (const std::string &w : warnings)
        std::cerr << "ptc-run: warning: " << w << "\n";
      std::cout << "ptc-run: resumed from " << opts["--resume"] << " at step " << first << "\n";
    }
    if (first > steps)
      return fail("the checkpoint is at step " + std::to_string(first) + ", beyond --steps " +
                  std::to_string(steps));
  }
  MetricsWriter metrics;
  if (leader) {
    Status s = Status::ok();
    if (opts.count("--metrics"))
      s = metrics.openJsonLines(opts["--metrics"], first > 0);
    if (s.isOk() && opts.count("--metrics-csv"))
      s = metrics.openCsv(opts["--metrics-csv"], first > 0);
    if (s.isOk() && opts.count("--tensorboard"))
      s = metrics.openTensorBoard(opts["--tensorboard"]);
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
  basis.peakTflops = peakTflops;
  const bool wantsFigures = logEvery > 0 || opts.count("--metrics") ||
                            opts.count("--metrics-csv") || opts.count("--tensorboard");
  if (basis.modelFlops > 0 && peakTflops == 0.0 && wantsFigures) {
    Device &device = session.executor().device();
    auto peak = measureMatmulPeak(device, matmulComputeType(plan, device));
    if (!peak.isOk())
      return fail("measuring the device's peak for MFU: " + peak.status().message() +
                  " (give it with --peak-tflops)");
    basis.peakTflops = peak->tflops;
    if (leader)
      std::printf("ptc-run: model %.4g FLOPs per step; MFU against %.3g TFLOP/s per device (%s)\n",
                  basis.modelFlops, basis.peakTflops, peak->what.c_str());
  } else if (leader && basis.modelFlops > 0 && peakTflops > 0.0) {
    std::printf("ptc-run: model %.4g FLOPs per step; MFU against %.3g TFLOP/s per device (given)\n",
                basis.modelFlops, basis.peakTflops);
  }
  std::fflush(stdout);
  metrics.setBasis(basis);
  ProgressPrinter progress(leader ? logEvery : 0, steps);
  progress.setBasis(basis);
  progress.setFirst(first);
  LossScaleTracker lossScale;
  std::optional<TokenData> evalData;
  if (opts.count("--eval-data")) {
    if (!session.data())
      return fail("--eval-data needs a language model trained from token files");
    auto loaded = TokenData::load(std::vector<std::string>{opts["--eval-data"]}, session.seq(),
                                  session.vocab());
    if (!loaded.isOk())
      return fail(loaded.status().message());
    evalData = std::move(*loaded);
  }
  if (evalData && leader && evalEvery > steps - first)
    std::cerr << "ptc-run: warning: --eval-every " << evalEvery << " is more than this run's "
              << steps - first << " steps: only the evaluation after the last step runs\n";
  EvalHook eval(evalData ? &*evalData : nullptr, evalEvery, evalSteps, steps - 1);
  metrics.setEval(&eval);
  progress.setEval(&eval);
  StatusBeacon beacon;
  std::vector<SessionHook *> hooks{&beacon, &eval, &metrics, &progress, &lossScale};
  const std::string checkpointDir = opts.count("--checkpoint-dir") ? opts["--checkpoint-dir"] : "";
  CheckpointHook checkpoints(checkpointDir, checkpointEvery, static_cast<int>(keepLast),
                             asyncCheckpoint);
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
        s = saveCheckpoint(session, checkpointDir, at, static_cast<int>(keepLast));
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
      s = saveCheckpoint(session, checkpointDir, steps, static_cast<int>(keepLast));
    if (!s.isOk())
      return fail(s.message());
    if (leader) {
      std::cout << "ptc-run: checkpoint of step " << steps << " in " << checkpointDir << "/"
                << checkpointStepName(steps) << "\n";
      if (checkpoints.saves() > 0)
        std::printf("ptc-run: %lld checkpoints during the run%s held training up %.3f s in all "
                    "(%.1f ms each)\n",
                    static_cast<long long>(checkpoints.saves()), asyncCheckpoint ? " (async)" : "",
                    checkpoints.blockedSeconds(),
                    1e3 * checkpoints.blockedSeconds() / static_cast<double>(checkpoints.saves()));
    }
  }

  if (!tracePath.empty())
    if (Status s = writeTrace(session, tracePath); !s.isOk())
      return fail(s.message());
  if (lossScale.active() && leader)
    std::cout << "dynamic loss scale: " << lossScale.last() << " at the last step; "
              << lossScale.skipped() << " of the steps before it overflowed and were skipped\n";
  if (profile && steps > 0 && leader)
    printProfile(opTimes, steps);
  if (memoryReport) {
    // One line per pipeline rank: from its first process (dp, tp coordinates 0).
    bool first = leader;
    if (Communicator *c = session.communicator(); c && session.plan().pipelined()) {
      first = true;
      for (size_t a = 0; a < c->coords().size(); ++a)
        if (static_cast<int>(a) != session.plan().pipelineAxis() && c->coords()[a] != 0)
          first = false;
    }
    if (first)
      printMemoryReport(session);
  }

  if (opts.count("--save")) {
    Status s = session.saveParameters(opts["--save"],
                                      {{"format", "pt"},
                                       {"producer", "ptc-run"},
                                       {"steps", std::to_string(steps)}},
                                      maxShardMb * 1000 * 1000);
    if (!s.isOk())
      return fail(s.message());
    if (leader) {
      int64_t count = 0;
      for (const TensorInfo &t : plan.tensors())
        count += t.kind == plan::TensorKind::Parameter;
      std::cout << "ptc-run: saved " << count << " parameters to " << opts["--save"] << "\n";
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
