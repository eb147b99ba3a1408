// ptc-run's options: one table row per option (name, the field it sets, the
// kind of value), then the checks that relate options to one another.

#include "tools/ptc-run/options.h"

#include "runtime/io/durable_file.h"
#include "runtime/plan/plan_loader.h"
#include "runtime/session/training_session.h"
#include "tools/ptc-run/launcher.h"

#include <sched.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <variant>

namespace ptc {
namespace {

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
  --kernel-coverage B how backend B's kernels (cpu or cuda; no device needed) would run the
                      plan's instructions, by op kind: natively, widened to f32 (a 16-bit
                      tensor converted around an f32 kernel), or by the runtime; then exit
  --trace FILE        write a Chrome-trace / Perfetto JSON timeline of the last step, a row
                      per rank: schedule actions (pipelined plans) or instructions (op, line)
  --np N              start N local ranks with mpirun (an SPMD plan needs as many as its mesh)
  --collective-timeout S  fail a collective that does not finish within S seconds (default:
                      60 s plus the plan's largest collective at 10 MB/s for the step's
                      collectives, 600 s for coordination such as checkpoint agreement)
  --step-timeout S    end the run with an error when one training step takes more than S
                      seconds, whatever it waits for (a device, a peer; default 3600; 0: off)
  --on-nonfinite A    a step whose loss or gradients are not finite (NaN, inf): skip (default:
                      the plan leaves parameters and optimizer state unchanged, a warning names
                      the step) or stop (an error naming the step; nothing of it is applied)
  --max-skipped-steps N  with skip: stop after N such steps in a row (default 10; 0: no limit)
)";

/// What an option's value must be.
enum class Kind {
  Switch,       // no value
  Text,         // any string
  Count,        // an integer >= 0
  Seconds,      // a number of seconds > 0
  SecondsOrOff, // a number of seconds >= 0 (0: off)
  Positive,     // a number > 0 (TFLOP/s)
};

struct OptionRow {
  const char *name;
  Kind kind;
  std::variant<bool RunOptions::*, std::string RunOptions::*, int64_t RunOptions::*,
               double RunOptions::*>
      field;
};

const OptionRow kOptions[] = {
    {"--dump-plan", Kind::Switch, &RunOptions::dumpPlan},
    {"--profile", Kind::Switch, &RunOptions::profile},
    {"--memory-report", Kind::Switch, &RunOptions::memoryReport},
    {"--async-checkpoint", Kind::Switch, &RunOptions::asyncCheckpoint},
    {"--tf32", Kind::Switch, &RunOptions::tf32},
    {"--data", Kind::Text, &RunOptions::data},
    {"--data-blend", Kind::Text, &RunOptions::dataBlend},
    {"--eval-data", Kind::Text, &RunOptions::evalData},
    {"--init", Kind::Text, &RunOptions::init},
    {"--save", Kind::Text, &RunOptions::save},
    {"--checkpoint-dir", Kind::Text, &RunOptions::checkpointDir},
    {"--resume", Kind::Text, &RunOptions::resume},
    {"--hostfile", Kind::Text, &RunOptions::hostfile},
    {"--metrics", Kind::Text, &RunOptions::metrics},
    {"--metrics-csv", Kind::Text, &RunOptions::metricsCsv},
    {"--tensorboard", Kind::Text, &RunOptions::tensorboard},
    {"--trace", Kind::Text, &RunOptions::trace},
    {"--offload-dir", Kind::Text, &RunOptions::offloadDir},
    {"--kernel-coverage", Kind::Text, &RunOptions::kernelCoverage},
    {"--device", Kind::Text, &RunOptions::device},
    {"--comm", Kind::Text, &RunOptions::comm},
    {"--on-nonfinite", Kind::Text, &RunOptions::onNonfinite},
    {"--np", Kind::Count, &RunOptions::ranks},
    {"--steps", Kind::Count, &RunOptions::steps},
    {"--seed", Kind::Count, &RunOptions::seed},
    {"--shuffle", Kind::Count, &RunOptions::shuffle},
    {"--eval-every", Kind::Count, &RunOptions::evalEvery},
    {"--eval-steps", Kind::Count, &RunOptions::evalSteps},
    {"--checkpoint-every", Kind::Count, &RunOptions::checkpointEvery},
    {"--keep-last", Kind::Count, &RunOptions::keepLast},
    {"--max-restarts", Kind::Count, &RunOptions::maxRestarts},
    {"--max-shard-mb", Kind::Count, &RunOptions::maxShardMb},
    {"--log-every", Kind::Count, &RunOptions::logEvery},
    {"--max-skipped-steps", Kind::Count, &RunOptions::maxSkippedSteps},
    {"--threads", Kind::Count, &RunOptions::threads},
    {"--collective-timeout", Kind::Seconds, &RunOptions::collectiveTimeout},
    {"--step-timeout", Kind::SecondsOrOff, &RunOptions::stepTimeout},
    {"--peak-tflops", Kind::Positive, &RunOptions::peakTflops},
};

bool error(const std::string &message) {
  std::cerr << "ptc-run: error: " << message << "\n";
  return false;
}

/// Sets `row`'s field from `value`, or prints why it cannot.
bool setValue(const OptionRow &row, const std::string &value, RunOptions &out) {
  const std::string flag = row.name;
  char *end = nullptr;
  errno = 0;
  switch (row.kind) {
  case Kind::Switch:
    out.*std::get<bool RunOptions::*>(row.field) = true;
    return true;
  case Kind::Text:
    out.*std::get<std::string RunOptions::*>(row.field) = value;
    return true;
  case Kind::Count: {
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (end == value.c_str() || *end || v < 0 || errno == ERANGE)
      return error(flag + " expects a non-negative integer below 2^63, got '" + value + "'");
    out.*std::get<int64_t RunOptions::*>(row.field) = v;
    return true;
  }
  case Kind::Seconds:
  case Kind::SecondsOrOff:
  case Kind::Positive: {
    double v = std::strtod(value.c_str(), &end);
    bool allowZero = row.kind == Kind::SecondsOrOff;
    if (end == value.c_str() || *end || errno == ERANGE || !std::isfinite(v) ||
        !(allowZero ? v >= 0 : v > 0)) {
      if (row.kind == Kind::Positive)
        return error(flag + " expects a positive number of TFLOP/s, got '" + value + "'");
      return error(flag + " expects a number of seconds " +
                   (allowZero ? ">= 0 (0: off)" : "> 0") + ", got '" + value + "'");
    }
    out.*std::get<double RunOptions::*>(row.field) = v;
    return true;
  }
  }
  return false;
}

/// The checks that relate options to one another (each option's own value
/// was checked by its row's kind).
bool checkTogether(RunOptions &o) {
  std::optional<CommBackend> comm = parseOption<CommBackend>(o.comm);
  if (!comm)
    return error("unknown --comm '" + o.comm + "' (expected " + optionChoices<CommBackend>() + ")");
  o.commBackend = *comm;
  std::optional<NonfiniteAction> nonfinite = parseOption<NonfiniteAction>(o.onNonfinite);
  if (!nonfinite)
    return error("unknown --on-nonfinite '" + o.onNonfinite + "' (expected " +
                 optionChoices<NonfiniteAction>() + ")");
  o.nonfiniteAction = *nonfinite;
  if (o.has("--np") && (o.ranks < 1 || o.ranks > kMaxMeshDevices))
    return error("--np " + std::to_string(o.ranks) + " must be 1 to " +
                 std::to_string(kMaxMeshDevices) + " ranks");
  if (o.has("--np") && o.maxRestarts > 0 && !o.has("--checkpoint-dir"))
    return error("--max-restarts needs a non-negative count and --checkpoint-dir (restarts "
                 "resume from its latest checkpoint)");
  if (!o.has("--np") && (o.has("--max-restarts") || o.has("--hostfile")))
    return error(std::string(o.has("--max-restarts") ? "--max-restarts" : "--hostfile") +
                 " is for a job ptc-run launches: use it with --np");
  // Step indices times the batch index the data (token windows, rows): 2^40
  // steps keep every such product inside int64.
  if (o.steps > (int64_t{1} << 40))
    return error("--steps " + std::to_string(o.steps) + " is more than 2^40 steps");
  if (o.evalEvery < 1 || o.evalSteps < 1)
    return error("--eval-every and --eval-steps must be at least 1");
  if ((o.has("--eval-every") || o.has("--eval-steps")) && !o.has("--eval-data"))
    return error("--eval-every and --eval-steps need --eval-data");
  if (o.keepLast > (1 << 20))
    return error("--keep-last " + std::to_string(o.keepLast) + " is more than 2^20 checkpoints");
  if ((o.checkpointEvery > 0 || o.keepLast > 0) && !o.has("--checkpoint-dir"))
    return error("--checkpoint-every and --keep-last need --checkpoint-dir");
  if (o.maxShardMb < 1 || o.maxShardMb > (int64_t{1} << 40))
    return error("--max-shard-mb " + std::to_string(o.maxShardMb) + " must be at least 1");
  // More threads than this is a typo, not a configuration (OpenMP aborts
  // when it cannot create them).
  int64_t most = 16 * std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (o.has("--threads") && (o.threads < 1 || o.threads > most))
    return error("--threads " + std::to_string(o.threads) + " is outside [1, " +
                 std::to_string(most) + "] (16 x the " +
                 std::to_string(std::thread::hardware_concurrency()) + " hardware threads here)");
  if (o.has("--data") && o.has("--data-blend"))
    return error("--data and --data-blend both name the training data; give one");
  // Outputs are checked before any work: a path in a missing directory, or
  // one that is not a regular file, fails now rather than after the run.
  for (const char *flag : {"--save", "--metrics", "--metrics-csv", "--trace"}) {
    if (!o.has(flag))
      continue;
    const std::string &path = std::string(flag) == "--save"      ? o.save
                              : std::string(flag) == "--metrics" ? o.metrics
                              : std::string(flag) == "--trace"   ? o.trace
                                                                 : o.metricsCsv;
    Status s = std::string(flag) == "--save" && isDirectoryTarget(path)
                   ? checkOutputDirectory(path, flag)
                   : checkOutputPath(path, flag);
    if (!s.isOk())
      return error(s.message());
  }
  return true;
}

} // namespace

/// The kernels' threads when --threads is not given: the node's cores shared
/// by the ranks on it, and no more than the cores this process may run on (a
/// launcher that binds each rank to a core or a socket narrows its affinity
/// mask). An oversubscribed node (more ranks than cores) gets one thread per
/// rank instead of every core per rank.
int defaultKernelThreads() {
  int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : hardware;
  return std::max(1, std::min(allowed, hardware / ranksOnThisNode()));
}

std::optional<int> parseRunOptions(int argc, char **argv, RunOptions &out) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (a.rfind("--", 0) != 0) {
      if (!out.planPath.empty()) {
        error("unexpected argument '" + a + "' (see ptc-run --help)");
        return 2;
      }
      out.planPath = a;
      continue;
    }
    const OptionRow *row = nullptr;
    for (const OptionRow &r : kOptions)
      if (a == r.name)
        row = &r;
    if (!row) {
      error("unknown option '" + a + "' (see ptc-run --help)");
      return 2;
    }
    std::string value;
    if (row->kind != Kind::Switch) {
      if (i + 1 >= argc) {
        error(a + " needs a value");
        return 2;
      }
      value = argv[++i];
    }
    out.given.insert(a);
    if (!setValue(*row, value, out))
      return 2;
  }
  if (out.planPath.empty()) {
    error("no plan given (usage: ptc-run PLAN [options]; see ptc-run --help)");
    return 2;
  }
  if (!checkTogether(out))
    return 2;
  return std::nullopt;
}

} // namespace ptc
