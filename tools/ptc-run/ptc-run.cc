// ptc-run: executes a ptc plan (one training step per iteration) on the CPU
// or a GPU (--device).
//   ptc-run gpt.plan --data corpus.bin --steps 200 --metrics run.jsonl --save final.safetensors
//   ptc-run gpt.plan --dump-plan

#include "runtime/comm/communicator.h"
#include "runtime/exec/executor.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/token_data.h"
#include "runtime/plan/plan_loader.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <sys/resource.h>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
using namespace ptc;

const char *kUsage = R"(usage: ptc-run PLAN [options]
  --data FILE         uint16 token file (nanoGPT .bin) feeding the 'tokens'/'targets' inputs
  --steps N           training steps to run (default 100)
  --init FILE         initial parameters from a safetensors file (default: the plan's initializers)
  --seed S            seed of the plan's initializers (default 1337)
  --save FILE         write the final parameters as safetensors
  --metrics FILE      write one JSON line per step: step, loss, tokens_per_s, elapsed_s[, grad_norm]
                      [, loss_scale]
  --log-every N       progress line every N steps (default 10; 0: none)
  --device D          cpu, cuda or auto (default auto: cuda when a GPU is visible, else cpu);
                      with several ranks per node, rank r uses GPU (local rank mod GPUs);
                      cpu-discrete: the CPU reached only through copies, as a GPU is (testing)
  --tf32              let f32 matmuls on a GPU use TF32 tensor cores (faster, ~1e-3 relative)
  --comm C            collectives over mpi, nccl or auto (default auto: NCCL on the device's
                      communication stream with --device cuda, else MPI)
  --threads N         kernel and BLAS threads (default: OpenMP's default)
  --profile           print the time spent per op kind at the end
  --memory-report     print the memory this rank allocated against the compiler's prediction
  --dump-plan         print the verified plan as JSON and exit
  --trace FILE        write a Chrome-trace / Perfetto JSON timeline of every rank's schedule
                      actions (pipelined plans; the last step)
  --np N              start N local ranks with mpirun (an SPMD plan needs as many as its mesh)
  --collective-timeout S  fail a collective that does not finish within S seconds (default 300)
  --step-timeout S    end the run with an error when one training step takes more than S
                      seconds, whatever it waits for (a device, a peer; default 3600; 0: off)
)";

bool gMultiRank = false;

int fail(const std::string &message) {
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

/// Ends the process with an error when a step runs longer than the timeout:
/// whatever the step waits for (a GPU kernel, a driver, a peer outside any
/// collective timeout), the run never hangs silently.
class StepWatchdog {
public:
  explicit StepWatchdog(double timeoutSeconds) : timeout_(timeoutSeconds) {
    if (timeout_ > 0)
      thread_ = std::thread([this] { watch(); });
  }
  ~StepWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable())
      thread_.join();
  }
  void begin(int64_t step) {
    startedUs_ = nowUs();
    step_ = step;
  }
  void end() { step_ = -1; }

private:
  static int64_t nowUs() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void watch() {
    auto tick = std::chrono::duration<double>(std::min(1.0, timeout_ / 10));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, tick, [this] { return done_; })) {
      int64_t step = step_;
      if (step >= 0 && nowUs() - startedUs_ > static_cast<int64_t>(timeout_ * 1e6)) {
        char line[256];
        int n = std::snprintf(line, sizeof line,
                              "ptc-run: error: rank %d: step %lld has not finished after %g s "
                              "(--step-timeout): a device or a peer stopped responding\n",
                              worldRank(), static_cast<long long>(step), timeout_);
        std::fwrite(line, 1, static_cast<size_t>(n), stderr);
        std::fflush(stderr);
        std::_Exit(1); // the launcher takes the other ranks down
      }
    }
  }
  double timeout_;
  std::atomic<int64_t> step_{-1}, startedUs_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false; // guarded by mutex_
  std::thread thread_;
};

/// This process's rank among the ranks on its node (OpenMPI, MPICH/Hydra,
/// Slurm), which picks its GPU.
int localRank() {
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char *v = std::getenv(name))
      return std::atoi(v);
  return 0;
}

/// `ptc-run --np N ARGS...` re-executes itself under mpirun with N ranks.
int launchWithMpirun(int argc, char **argv, const std::string &np) {
  std::vector<std::string> args{"mpirun", "-np", np};
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  args.push_back(n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--np") {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  // Local convenience: allow root and more ranks than cores (OpenMPI).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp("mpirun", cargs.data());
  std::cerr << "ptc-run: error: cannot start mpirun for --np " << np << ": " << std::strerror(errno)
            << "\n";
  return 1;
}

/// Kind, group and size of every collective, in order: must be the same on
/// every rank, or some rank would wait forever.
std::string collectiveSignature(const LoadedPlan &plan) {
  std::string sig;
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    plan::OpCode op = inst->op();
    if (op != plan::OpCode::AllReduce && op != plan::OpCode::AllGather &&
        op != plan::OpCode::ReduceScatter && op != plan::OpCode::VocabParallelCrossEntropy &&
        op != plan::OpCode::VocabParallelCrossEntropyGrad && op != plan::OpCode::AllToAll)
      continue;
    int64_t count = 0;
    for (int32_t id : *inst->inputs())
      count += plan.tensor(id).numElements;
    sig += std::string(opcodeName(op)) + "(axes";
    for (int64_t a : *inst->ints())
      sig += " " + std::to_string(a);
    sig += ", f32 x " + std::to_string(count) + ");";
    if (op == plan::OpCode::AllGather || op == plan::OpCode::ReduceScatter)
      sig.insert(sig.size() - 2, ", dim " + std::to_string(inst->ints()->Get(1)));
  }
  return sig;
}

/// The first collective where `a` and `b` differ.
std::string firstDifference(const std::string &a, const std::string &b) {
  size_t i = 0, n = 0;
  while (true) {
    size_t ea = a.find(';', i), eb = b.find(';', i);
    std::string ca = ea == std::string::npos ? "(none)" : a.substr(i, ea - i);
    std::string cb = eb == std::string::npos ? "(none)" : b.substr(i, eb - i);
    if (ca != cb)
      return "collective #" + std::to_string(n) + ": " + ca + " vs " + cb;
    if (ea == std::string::npos)
      return "";
    i = ea + 1;
    ++n;
  }
}

int64_t parseInt(const std::string &flag, const char *value, bool &ok) {
  char *end = nullptr;
  long long v = std::strtoll(value, &end, 10);
  if (!end || *end || v < 0) {
    std::cerr << "ptc-run: error: " << flag << " expects a non-negative integer, got '" << value
              << "'\n";
    ok = false;
  }
  return v;
}
} // namespace

int main(int argc, char **argv) {
  std::map<std::string, std::string> opts;
  std::string planPath;
  bool dumpPlan = false, profile = false, memoryReport = false;
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
    } else if (a == "--tf32") {
      setenv("PTC_CUDA_TF32", "1", 1); // read by the CUDA device
    } else if (a.rfind("--", 0) == 0) {
      static const char *known[] = {"--data", "--steps", "--init", "--seed", "--save",
                                    "--metrics", "--log-every", "--threads", "--np",
                                    "--collective-timeout", "--trace", "--device", "--comm", "--step-timeout"};
      if (std::find_if(std::begin(known), std::end(known), [&](const char *k) { return a == k; }) ==
          std::end(known)) {
        std::cerr << "ptc-run: error: unknown option '" << a << "'\n" << kUsage;
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
      std::cerr << "ptc-run: error: unexpected argument '" << a << "'\n" << kUsage;
      return 2;
    }
  }
  if (planPath.empty()) {
    std::cerr << "ptc-run: error: no plan given\n" << kUsage;
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
    parseInt("--np", opts["--np"].c_str(), ok);
    if (!ok)
      return 2;
    return launchWithMpirun(argc, argv, opts["--np"]);
  }
  double timeout = opts.count("--collective-timeout") ? std::atof(opts["--collective-timeout"].c_str()) : 300.0;
  if (!(timeout > 0)) {
    std::cerr << "ptc-run: error: --collective-timeout expects a positive number of seconds\n";
    return 2;
  }
  int64_t steps = opts.count("--steps") ? parseInt("--steps", opts["--steps"].c_str(), ok) : 100;
  int64_t seed = opts.count("--seed") ? parseInt("--seed", opts["--seed"].c_str(), ok) : 1337;
  int64_t logEvery =
      opts.count("--log-every") ? parseInt("--log-every", opts["--log-every"].c_str(), ok) : 10;
  if (opts.count("--threads")) {
    int64_t threads = parseInt("--threads", opts["--threads"].c_str(), ok);
    if (ok && threads > 0) {
#ifdef _OPENMP
      omp_set_num_threads(static_cast<int>(threads));
#endif
      openblas_set_num_threads(static_cast<int>(threads));
    }
  }
  if (!ok)
    return 2;

  auto loaded = LoadedPlan::loadFile(planPath);
  if (!loaded.isOk())
    return fail(loaded.status().message());
  std::shared_ptr<const LoadedPlan> plan = *loaded;
  if (dumpPlan) {
    std::cout << planToJson(*plan) << "\n";
    return 0;
  }
  // Ranks: one process per device of the plan's mesh, from the launcher.
  Mesh mesh{plan->meshAxes(), plan->meshSizes()};
  std::unique_ptr<Communicator> comm;
  const int needRanks = plan->plan().num_ranks();
  if (needRanks > 1 || launchedByMpi()) {
    if (!launchedByMpi())
      return fail("plan '" + planPath + "' needs " + std::to_string(needRanks) + " ranks (mesh " +
                  mesh.describe() + "); launch it with mpirun -np " + std::to_string(needRanks) +
                  " ptc-run ... or ptc-run --np " + std::to_string(needRanks) + " ...");
    auto created = createMpiCommunicator(mesh, timeout);
    if (!created.isOk()) {
      // Every rank sees the same mismatch: report it on each and leave cleanly.
      std::string line = "ptc-run: error: " + created.status().message() + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
      finalizeMpi();
      return 1;
    }
    comm = std::move(*created);
    gMultiRank = comm->worldSize() > 1;
    // All ranks must issue the same collectives in the same order.
    auto sigs = comm->allGatherStrings(collectiveSignature(*plan));
    if (!sigs.isOk())
      return fail(sigs.status().message());
    for (int r = 1; r < comm->worldSize(); ++r)
      if ((*sigs)[static_cast<size_t>(r)] != (*sigs)[0]) {
        if (comm->rank() == 0)
          std::cerr << "ptc-run: error: rank " << r
                    << "'s plan does not issue the same collectives as rank 0's; first difference at "
                    << firstDifference((*sigs)[0], (*sigs)[static_cast<size_t>(r)])
                    << " (rank 0 vs rank " << r << ")\n"
                    << std::flush;
        finalizeMpi();
        return 1;
      }
  }
  const bool leader = !comm || comm->rank() == 0;
  int32_t lossId = plan->findOutput("loss");
  if (lossId < 0)
    return fail("plan '" + planPath + "' has no 'loss' output");
  int32_t gradNormId = plan->findOutput("grad_norm");
  int32_t lossScaleId = plan->findOutput("loss_scale");
  int64_t skippedSteps = 0;
  float lastScale = 0.0f;

  // Inputs: the standard model reads 'tokens' and 'targets' [batch, seq] from --data.
  int32_t tokensId = plan->findTensor("tokens", plan::TensorKind::Input);
  int32_t targetsId = plan->findTensor("targets", plan::TensorKind::Input);
  for (size_t i = 0; i < plan->tensors().size(); ++i) {
    const TensorInfo &t = plan->tensors()[i];
    if (t.kind == plan::TensorKind::Input && t.name != "tokens" && t.name != "targets")
      return fail("plan input '" + t.name +
                  "' has no data source (ptc-run feeds 'tokens' and 'targets' from --data)");
  }
  if (tokensId < 0 || targetsId < 0)
    return fail("plan '" + planPath + "' lacks the 'tokens' and 'targets' inputs");
  const TensorInfo &tokensInfo = plan->tensor(tokensId);
  if (tokensInfo.shape.size() != 2 || plan->tensor(targetsId).shape != tokensInfo.shape ||
      tokensInfo.dtype != plan::DType::I32)
    return fail("inputs 'tokens' and 'targets' must both be [batch, seq] i32");
  // Inputs may be split (rows over dp, the sequence over tp): each rank builds the
  // global batch and keeps its part.
  // A micro-batched plan's inputs hold one micro-batch.
  const int64_t batch = tokensInfo.globalShape[0] * plan->microbatches(),
                seq = tokensInfo.globalShape[1];
  int64_t vocab = idUpperBound(*plan, tokensId);
  int64_t classes = idUpperBound(*plan, targetsId);
  if (classes >= 0 && (vocab < 0 || classes < vocab))
    vocab = classes;
  if (vocab < 0)
    vocab = 65536;
  if (!opts.count("--data"))
    return fail("--data FILE is required (a uint16 token file; see ptc-tokenize)");
  auto data = TokenData::load(opts["--data"], seq, vocab);
  if (!data.isOk())
    return fail(data.status().message());

  int pipelineRank = comm && plan->pipelineAxis() >= 0
                         ? comm->coords()[static_cast<size_t>(plan->pipelineAxis())]
                         : 0;
  auto device = createDevice(deviceName, localRank());
  if (!device.isOk())
    return fail(device.status().message());
  std::string deviceText = (*device)->describe();
  const bool onGpu = (*device)->kind() == DeviceKind::Cuda;
  if (commName == "nccl" && !onGpu)
    return fail("--comm nccl needs the CUDA device (this rank runs on " + deviceText + ")");
  if (comm && onGpu && commName != "mpi" && (ncclCompiledIn() || commName == "nccl")) {
    auto nccl = createNcclCommunicator(std::move(comm), **device, Executor::collectiveGroups(*plan),
                                       timeout);
    if (!nccl.isOk())
      return fail(nccl.status().message());
    comm = std::move(*nccl);
  }
  if (comm)
    deviceText += comm->deviceResident() ? ", collectives: NCCL" : ", collectives: MPI";
  auto created = Executor::create(plan, pipelineRank, std::move(*device));
  if (!created.isOk())
    return fail(created.status().message());
  Executor &ex = **created;
  ex.setCommunicator(comm.get());
  if (Status s = ex.initialize(static_cast<uint64_t>(seed)); !s.isOk())
    return fail(s.message());
  std::vector<int32_t> params;
  for (size_t i = 0; i < plan->tensors().size(); ++i)
    if (plan->tensors()[i].kind == plan::TensorKind::Parameter)
      params.push_back(static_cast<int32_t>(i));
  if (opts.count("--init")) {
    // Every rank reads the whole tensors and keeps its part.
    auto file = SafetensorsFile::read(opts["--init"]);
    if (!file.isOk())
      return fail(file.status().message());
    for (int32_t id : params) {
      const TensorInfo &t = plan->tensor(id);
      int64_t count = 1;
      for (int64_t d : t.globalShape)
        count *= d;
      std::vector<float> whole(static_cast<size_t>(count));
      Status s = file->copyTo(t.name, t.globalShape, whole.data());
      if (!s.isOk())
        return fail(s.message());
      if (Status s = ex.loadFromWhole(id, whole.data()); !s.isOk())
        return fail(s.message());
    }
  }

  std::ofstream metrics;
  if (opts.count("--metrics") && leader) {
    metrics.open(opts["--metrics"], std::ios::trunc);
    if (!metrics)
      return fail("cannot write metrics file '" + opts["--metrics"] + "'");
  }
  // What this rank holds (a pipeline stage holds its chunks' parameters only).
  int64_t numParams = 0, paramBytes = 0, stateBytes = 0;
  for (int32_t id : params)
    if (ex.holds(id)) {
      numParams += plan->tensor(id).numElements;
      paramBytes += plan->tensor(id).bytes;
    }
  for (size_t i = 0; i < plan->tensors().size(); ++i)
    if (plan->tensors()[i].kind == plan::TensorKind::OptimizerState && ex.holds(static_cast<int32_t>(i)))
      stateBytes += plan->tensors()[i].bytes;
  if (leader)
    std::cout << "ptc-run: " << planPath << ": " << numParams << " parameters"
              << (comm ? " per rank" : "") << ", batch " << batch << " x seq " << seq << ", "
              << plan->plan().instructions()->size() << " instructions, memory per rank: "
              << "parameters " << paramBytes / 1024 << " KiB, optimizer state "
              << stateBytes / 1024 << " KiB, arena " << ex.arenaBytes() / 1024
              << " KiB; data " << data->size() << " tokens; device " << deviceText
              << (comm ? ", " + std::to_string(comm->worldSize()) + " ranks (mesh " + mesh.describe() + ")" : "")
              << "\n";

  std::vector<double> opTimes;
  std::vector<int32_t> wholeTokens(static_cast<size_t>(batch * seq)),
      wholeTargets(static_cast<size_t>(batch * seq));
  using Clock = std::chrono::steady_clock;
  double stepTimeout = 3600.0;
  if (opts.count("--step-timeout")) {
    char *end = nullptr;
    stepTimeout = std::strtod(opts["--step-timeout"].c_str(), &end);
    if (end == opts["--step-timeout"].c_str() || *end != '\0' || !(stepTimeout >= 0))
      return fail("--step-timeout expects a number of seconds >= 0 (0: off), got '" +
                  opts["--step-timeout"] + "'");
  }
  StepWatchdog watchdog(stepTimeout);
  // Fault injection for the tests: a step that never finishes.
  const char *hangEnv = std::getenv("PTC_FAULT_HANG_STEP");
  const int64_t hangStep = hangEnv ? std::atoll(hangEnv) : -1;
  const auto start = Clock::now();
  auto last = start;
  int64_t lastStep = 0;
  for (int64_t step = 0; step < steps; ++step) {
    watchdog.begin(step);
    while (step == hangStep)
      std::this_thread::sleep_for(std::chrono::seconds(1));
    data->fillBatch(step, batch, seq, 0, batch, wholeTokens.data(), wholeTargets.data());
    for (auto [id, values] : {std::pair{tokensId, &wholeTokens}, std::pair{targetsId, &wholeTargets}})
      if (Status s = ex.setInput(id, values->data()); !s.isOk())
        return fail("step " + std::to_string(step) + ": " + s.message());
    ex.setTracing(tracePath.size() > 0 && step + 1 == steps);
    auto t0 = Clock::now();
    Status s = ex.step(profile ? &opTimes : nullptr);
    if (!s.isOk())
      return fail("step " + std::to_string(step) + ": " + s.message());
    auto readScalar = [&](int32_t id) {
      auto v = ex.scalar(id);
      return v.isOk() ? *v : std::nanf("");
    };
    float loss = readScalar(lossId); // waits for the step on a GPU
    watchdog.end();
    auto t1 = Clock::now();
    if (!std::isfinite(loss))
      return fail("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                  "; stopping (lower the learning rate or enable max-grad-norm)");
    if (lossScaleId >= 0) {
      // Dynamic loss scaling: a lower scale than the last step's means that
      // step overflowed and was skipped.
      float scale = readScalar(lossScaleId);
      if (step > 0 && scale < lastScale)
        ++skippedSteps;
      lastScale = scale;
    }
    double stepSeconds = std::chrono::duration<double>(t1 - t0).count();
    double elapsed = std::chrono::duration<double>(t1 - start).count();
    double tokensPerSecond = static_cast<double>(batch * seq) / stepSeconds;
    if (metrics.is_open()) {
      char line[256];
      int n = std::snprintf(line, sizeof line,
                            "{\"step\":%lld,\"loss\":%.9g,\"tokens_per_s\":%.1f,\"elapsed_s\":%.4f",
                            static_cast<long long>(step), loss, tokensPerSecond, elapsed);
      metrics.write(line, n);
      if (gradNormId >= 0) {
        float norm = readScalar(gradNormId); // not finite on a step skipped by loss scaling
        n = std::isfinite(norm) ? std::snprintf(line, sizeof line, ",\"grad_norm\":%.9g", norm)
                                : std::snprintf(line, sizeof line, ",\"grad_norm\":null");
        metrics.write(line, n);
      }
      if (lossScaleId >= 0) {
        n = std::snprintf(line, sizeof line, ",\"loss_scale\":%.9g", readScalar(lossScaleId));
        metrics.write(line, n);
      }
      metrics << "}\n";
    }
    if (leader && logEvery > 0 && ((step + 1) % logEvery == 0 || step == 0 || step + 1 == steps)) {
      double window = std::chrono::duration<double>(t1 - last).count();
      double tps = static_cast<double>((step + 1 - lastStep) * batch * seq) / std::max(window, 1e-9);
      char line[256];
      std::snprintf(line, sizeof line, "step %6lld/%lld | loss %.4f | %9.0f tok/s | %7.1f s",
                    static_cast<long long>(step + 1), static_cast<long long>(steps), loss,
                    step == 0 ? tokensPerSecond : tps, elapsed);
      std::cout << line << "\n" << std::flush;
      last = t1;
      lastStep = step + 1;
    }
  }

  if (!tracePath.empty()) {
    // Chrome trace event format: one row (tid) per rank, times in us.
    std::string mine;
    for (const Executor::TraceEvent &e : ex.trace()) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "{\"name\":\"%s\",\"cat\":\"%c\",\"ph\":\"X\",\"ts\":%.1f,\"dur\":%.1f,"
                    "\"pid\":0,\"tid\":%d},\n",
                    e.name.c_str(), e.name[0], e.startUs, e.durationUs, comm ? comm->rank() : 0);
      mine += line;
    }
    std::vector<std::string> all{mine};
    if (comm) {
      auto gathered = comm->allGatherStrings(mine);
      if (!gathered.isOk())
        return fail(gathered.status().message());
      all = *gathered;
    }
    if (leader) {
      std::ofstream out(tracePath, std::ios::trunc);
      if (!out)
        return fail("cannot write trace file '" + tracePath + "'");
      out << "{\"traceEvents\":[\n";
      for (size_t r = 0; r < all.size(); ++r)
        out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << r
            << ",\"args\":{\"name\":\"rank " << r << "\"}},\n" << all[r];
      out << "{\"name\":\"end\",\"ph\":\"i\",\"ts\":0,\"pid\":0,\"tid\":0,\"s\":\"g\"}]}\n";
      std::cout << "ptc-run: wrote trace of the last step to " << tracePath << "\n";
    }
  }

  if (lossScaleId >= 0 && leader)
    std::cout << "dynamic loss scale: " << lastScale << " at the last step; " << skippedSteps
              << " of the steps before it overflowed and were skipped\n";

  if (profile && steps > 0 && leader) {
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

  if (memoryReport && leader) {
    // Everything ptc-run allocates for the plan is known up front; the process
    // peak adds code, MPI and BLAS buffers.
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    int64_t allocated = ex.persistentBytes() + ex.arenaBytes() + ex.communicationBytes();
    int64_t predicted = predictedPeakBytes(*plan, pipelineRank);
    char line[512];
    std::snprintf(line, sizeof line,
                  "memory (rank 0): allocated %lld B (tensors %lld + arena %lld + communication "
                  "%lld), predicted %lld B (%.1f%% off); process peak RSS %lld KiB\n",
                  static_cast<long long>(allocated), static_cast<long long>(ex.persistentBytes()),
                  static_cast<long long>(ex.arenaBytes()),
                  static_cast<long long>(ex.communicationBytes()), static_cast<long long>(predicted),
                  predicted ? 100.0 * static_cast<double>(allocated - predicted) / static_cast<double>(predicted) : 0.0,
                  static_cast<long long>(usage.ru_maxrss));
    std::cout << line;
    if (plan->pipelined())
      std::cout << "memory (rank 0): activation stash peak " << ex.stashPeakBytes()
                << " B (values waiting between segments and micro-batches)\n";
  }

  if (opts.count("--save")) {
    // Sharded parameters are gathered whole on rank 0, which writes the file.
    std::vector<std::vector<float>> wholes;
    std::vector<NamedTensor> out;
    for (int32_t id : params) {
      auto whole = ex.gatherWhole(id);
      if (!whole.isOk())
        return fail(whole.status().message());
      wholes.push_back(std::move(*whole));
    }
    if (!leader) {
      finalizeMpi();
      return 0;
    }
    for (size_t i = 0; i < params.size(); ++i)
      out.push_back({plan->tensor(params[i]).name, plan->tensor(params[i]).globalShape,
                     wholes[i].data()});
    Status s = writeSafetensors(opts["--save"], out,
                                {{"format", "pt"}, {"producer", "ptc-run"},
                                 {"steps", std::to_string(steps)}});
    if (!s.isOk())
      return fail(s.message());
    std::cout << "ptc-run: saved " << out.size() << " parameters to " << opts["--save"] << "\n";
  }
  finalizeMpi();
  return 0;
}
