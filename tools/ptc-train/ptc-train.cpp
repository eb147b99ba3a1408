//===- ptc-train.cpp - run a training job described by one TOML file ------===//
//
//   ptc-train JOB.toml [--set SECTION.KEY=VALUE ...] [--elastic] [--dry-run | --compile-only]
//
// Builds the model (ptc-model, or [model] file), compiles it (ptc-opt; the
// plan is cached in the job's folder under a hash of the model, the compile
// options and the compiler), and runs it (ptc-run, on as many ranks as the
// mesh has, through mpirun or, inside a Slurm allocation, srun; resuming from
// the newest checkpoint when there is one). Elastic: when fewer ranks are
// available than the mesh needs (the hostfile's slots, the Slurm
// allocation's tasks), ptc-plan chooses a layout for those, and the job
// continues from its checkpoint in it.
//
//===----------------------------------------------------------------------===//

#include "runtime/base/self_path.h"
#include "tools/ptc-train/JobConfig.h"
#include "models/ModelKeys.h"

#include "runtime/base/exit_codes.h"
#include "runtime/base/hostfile.h"
#include "runtime/base/option_values.h"
#include "runtime/base/signal_handlers.h"
#include "runtime/base/subprocess.h"

#include <nlohmann/json.hpp>

#include <csignal>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace {
namespace fs = std::filesystem;
using namespace ptc::train;
using ptc::BuilderKind;
using ptc::isLanguageModel;
using ptc::parseOption;

const char *kUsage = R"(usage: ptc-train JOB.toml [--set SECTION.KEY=VALUE ...] [--elastic] [--dry-run | --compile-only]
  Runs the training job JOB.toml describes: builds the model (ptc-model, or [model] file),
  compiles it (ptc-opt; the plan is cached in the job's folder, recompiled only when the
  model, the compile options or the compiler change) and trains it with ptc-run on the
  mesh's ranks (mpirun, or srun inside a Slurm allocation), resuming from the newest
  checkpoint when [checkpoint] has one.
  --set S.K=V   override a key (V in TOML syntax; a bare word is a string), e.g.
                --set training.steps=200 --set parallelism.mesh=dp:2
  --elastic     as [launch] elastic = true: on fewer ranks than the mesh needs (the
                hostfile's slots, the Slurm allocation's tasks; also when a restart finds
                a node gone), re-plan with ptc-plan, recompile and resume from the checkpoint
  --dry-run     check the job and print the commands it would run; run nothing
  --compile-only  build the model and compile the plan (or find it cached); do not train
  --help-keys   list every section and key
Exit status: ptc-run's (75: stopped at a checkpoint by SIGUSR1/SIGTERM, resume by running the
job again; 76: fewer ranks than the mesh needs and not elastic); 2 for a bad job file.
Examples: configs/*.toml, configs/slurm/ptc-train.sbatch (Slurm), configs/kubernetes/ (an
MPIJob). Relative paths are relative to the current folder.
)";

fs::path toolDir() { return ptc::toolDirectory(); }


/// Where a command of the job is: srun is Slurm's, on PATH; the rest are
/// tools of this build.
ptc::ProgramPlace placeOf(const std::vector<std::string> &argv) {
  return argv[0] == "srun" ? ptc::ProgramPlace::OnPath : ptc::ProgramPlace::SiblingTool;
}

/// Replaces this process with `argv` (a tool of this build, or srun);
/// returns only when it cannot (after saying why).
void execTool(const std::vector<std::string> &argv) {
  ptc::execProgram(argv, placeOf(argv), "ptc-train");
}

// SIGUSR1 and SIGTERM to ptc-train: passed on to the ranks' launcher
// (ptc-run or srun) while it runs (they stop at a step boundary with a
// checkpoint); before it starts (the model and plan are being built), kept:
// the ranks are then not started and the job ends with kExitStopped.
volatile pid_t gChild = 0;
volatile std::sig_atomic_t gForward = 0, gStopBeforeStart = 0;
extern "C" void forwardSignal(int sig) {
  if (gForward && gChild > 0)
    ::kill(gChild, sig);
  else
    gStopBeforeStart = sig;
}

/// Runs `argv` (argv[0] a tool of this build) and waits; its output is ours.
/// With `forward`, stop signals to ptc-train are passed on to it.
int runTool(const std::vector<std::string> &argv, bool forward = false) {
  std::cout << std::flush;
  ptc::ChildOptions options;
  options.place = placeOf(argv);
  options.who = "ptc-train";
  options.onRunning = [forward](pid_t pid) {
    gChild = pid;
    gForward = forward && pid > 0;
  };
  return ptc::runChild(argv, options).status;
}

/// FNV-1a, 64 bits.
uint64_t fnv1a(const std::string &bytes, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool readFile(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

/// Where the ranks are: how many are available, and who said so.
struct Available {
  int64_t ranks = -1; ///< -1: not limited (mpirun on this machine, oversubscribed)
  std::string source; ///< "the slots of hosts.txt", "the Slurm allocation (SLURM_NTASKS=2)"
};

/// Whether the ranks start with srun: [launch] launcher, or auto inside a
/// Slurm allocation (a batch script or salloc) but not inside a job step.
bool useSrun(const Job &job) {
  const Value *l = job.get("launch.launcher");
  // (The job's schema checked the spelling.)
  const ptc::Launcher launcher =
      l ? ptc::parseOption<ptc::Launcher>(l->s).value_or(ptc::Launcher::Auto) : ptc::Launcher::Auto;
  if (launcher != ptc::Launcher::Auto)
    return launcher == ptc::Launcher::Srun;
  return std::getenv("SLURM_JOB_ID") && !std::getenv("SLURM_STEP_ID");
}

std::optional<Available> availableRanks(const Job &job, bool srun, std::string &error) {
  Available a;
  if (srun) {
    // The job's tasks as Slurm has them now: a requeued job may have been
    // given fewer (scontrol update NumTasks=...), while the environment keeps
    // what was asked at submission.
    if (const char *id = std::getenv("SLURM_JOB_ID")) {
      ptc::ChildOptions quiet;
      quiet.who = "ptc-train";
      quiet.captureOutput = quiet.discardErrors = true;
      const std::string text = ptc::runChild({"scontrol", "show", "job", "-o", id}, quiet).output;
      size_t at = text.find(" NumTasks=");
      if (at != std::string::npos) {
        int64_t tasks = std::strtoll(text.c_str() + at + 10, nullptr, 10);
        if (tasks > 0) {
          a.ranks = tasks;
          a.source = "Slurm's job " + std::string(id) + " (NumTasks=" + std::to_string(tasks) + ")";
          return a;
        }
      }
    }
    for (const char *var : {"SLURM_NTASKS", "SLURM_NPROCS"})
      if (const char *v = std::getenv(var)) {
        a.ranks = std::strtoll(v, nullptr, 10);
        a.source = std::string("the Slurm allocation (") + var + "=" + v + ")";
        return a;
      }
    return a; // srun outside an allocation: Slurm allocates the tasks asked for
  }
  if (const Value *h = job.get("launch.hostfile")) {
    auto hosts = ptc::readHostfile(h->s, error);
    if (!hosts)
      return std::nullopt;
    a.ranks = ptc::totalSlots(*hosts);
    a.source = "the slots of " + h->s;
  }
  return a;
}

/// ptc-plan's best layout for `ranks` ranks that fits in memory, as compile
/// options, or nullopt after saying why.
/// ptc-plan's description of the job's model: its builder's shapes when the
/// job builds a GPT or Llama whose every key the planner's builder path
/// takes (it probes one and two layers: fast at any depth), else the model
/// file (every layout compiled whole: slow for deep models).
std::vector<std::string> plannerModel(const Job &job, const JobCommands &c) {
  const Value *name = job.get("model.name");
  if (!name || !isLanguageModel(*parseOption<BuilderKind>(name->s)))
    return {c.modelFile};
  std::vector<std::string> out = {"--model", name->s};
  for (const auto &[key, value] : job.values) {
    if (key.rfind("model.", 0) != 0)
      continue;
    std::string field = key.substr(6);
    const ptc::models::ModelKey *modelKey = ptc::models::findModelKey("model", field);
    const ptc::models::PlannerUse use = modelKey ? modelKey->planner : ptc::models::PlannerUse::NeedsFile;
    if (field == "name" || use == ptc::models::PlannerUse::Neutral)
      continue;
    if (use == ptc::models::PlannerUse::NeedsFile)
      return {c.modelFile}; // e.g. tie_embeddings, dtype, shared experts
    const std::string flag = modelKey->flag();
    std::ostringstream text;
    if (value.kind == Value::Kind::Int)
      text << value.i;
    else if (value.kind == Value::Kind::Float)
      text << value.f;
    else
      text << value.s;
    out.insert(out.end(), {flag, text.str()});
  }
  for (auto [key, flag] : {std::pair{"training.seq", "--seq"}, {"training.batch", "--global-batch"}})
    if (const Value *v = job.get(key))
      out.insert(out.end(), {flag, std::to_string(v->i)});
  return out;
}

std::optional<std::string> planLayout(const Job &job, const JobCommands &c, int64_t ranks) {
  std::vector<std::string> plan = {"ptc-plan"};
  for (const std::string &a : plannerModel(job, c))
    plan.push_back(a);
  plan.insert(plan.end(), {"--gpus", std::to_string(ranks), "--top", "5"});
  // The job's program (optimizer, clipping, schedule), so the probes are its plans.
  if (!c.programOptions.empty())
    plan.insert(plan.end(), {"--compile-options", c.programOptions});
  const Value *precision = job.get("parallelism.precision");
  plan.insert(plan.end(), {"--precision", precision ? precision->s : "fp32"});
  if (const Value *cluster = job.get("launch.cluster")) {
    plan.insert(plan.end(), {"--cluster", cluster->s});
  } else {
    // This machine, measured once (kernels, a real step, the MPI links).
    const std::string calibration = job.dir + "/calibration.json";
    if (!fs::exists(calibration)) {
      std::vector<std::string> calibrate = {"ptc-plan", "--calibrate", "-o", calibration};
      std::cout << "ptc-train: " << ptc::commandText(calibrate) << "\n";
      if (int rc = runTool(calibrate); rc != 0) {
        std::cerr << "ptc-train: error: calibrating this machine for the planner failed (ptc-plan exit "
                  << rc << "); give [launch] cluster\n";
        return std::nullopt;
      }
    }
    plan.insert(plan.end(), {"--calibrated", calibration});
  }
  if (const Value *memory = job.get("launch.device_memory"))
    plan.insert(plan.end(), {"--device-memory", memory->s});
  const std::string rows = job.dir + "/plans/elastic-" + std::to_string(ranks) + ".json";
  plan.insert(plan.end(), {"--json", rows});
  std::cout << "ptc-train: " << ptc::commandText(plan) << "\n";
  if (int rc = runTool(plan); rc != 0) {
    std::cerr << "ptc-train: error: cannot continue on " << ranks << (ranks == 1 ? " rank" : " ranks")
              << ": ptc-plan found no layout (exit " << rc << "; its message above says why)\n";
    return std::nullopt;
  }
  std::ifstream in(rows);
  nlohmann::json table = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!table.is_array()) {
    std::cerr << "ptc-train: error: cannot read ptc-plan's layouts '" << rows << "'\n";
    return std::nullopt;
  }
  for (const nlohmann::json &row : table)
    if (row.value("fits", false))
      return row.value("options", std::string());
  char need[64] = "";
  if (!table.empty())
    std::snprintf(need, sizeof need, " (the fastest needs %.2f GiB per device)",
                  table[0].value("memory_bytes", 0.0) / (1 << 30));
  std::cerr << "ptc-train: error: cannot continue on " << ranks << (ranks == 1 ? " rank" : " ranks")
            << ": no layout ptc-plan priced fits in the device memory" << need << "\n";
  return std::nullopt;
}

/// Re-plans `job` for `available` ranks and rebuilds its commands; false
/// after saying why.
bool replan(Job &job, JobCommands &c, const Available &available) {
  std::cout << "ptc-train: elastic: " << available.ranks << (available.ranks == 1 ? " rank is" : " ranks are")
            << " available (" << available.source << ") but the layout needs " << c.ranks
            << ": re-planning for " << available.ranks << " with the same global batch (the same training math)\n";
  std::optional<std::string> options = planLayout(job, c, available.ranks);
  if (!options)
    return false;
  std::string error;
  std::optional<std::string> change = applyLayout(job, *options, error);
  std::optional<JobCommands> commands = change ? jobCommands(job, error) : std::nullopt;
  if (!commands) {
    std::cerr << "ptc-train: error: " << error << "\n";
    return false;
  }
  const std::string modelFile = c.modelFile;
  std::vector<std::string> model = c.model;
  c = *commands;
  c.modelFile = modelFile;
  c.model = model;
  std::cout << "ptc-train: elastic: layout " << *change << " (" << c.ranks
            << (c.ranks == 1 ? " rank" : " ranks") << ")\n";
  return true;
}

/// The plan of `c` in the job's folder, compiled unless cached; empty after
/// saying why it could not be.
std::string compilePlan(const Job &job, const JobCommands &c) {
  std::string modelText;
  if (!readFile(c.modelFile, modelText)) {
    std::cerr << "ptc-train: error: cannot read the model '" << c.modelFile << "'\n";
    return "";
  }
  // The plan's cache key: the model, the options, and the compiler that
  // would compile them (its size and modification time).
  struct stat compiler {};
  stat((toolDir() / "ptc-opt").c_str(), &compiler);
  uint64_t key = fnv1a(modelText);
  key = fnv1a(c.compileOptions, key);
  key = fnv1a(std::to_string(compiler.st_size) + "/" + std::to_string(compiler.st_mtime), key);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  const std::string plan = job.dir + "/plans/" + hex + ".plan";
  if (fs::exists(plan)) {
    std::cout << "ptc-train: plan " << plan
              << " (cached: the model, the compile options and ptc-opt are unchanged)\n";
    return plan;
  }
  const std::string tmp = plan + ".tmp";
  std::vector<std::string> compile = {"ptc-opt", c.modelFile,
                                      "--ptc-compile=plan=" + tmp +
                                          (c.compileOptions.empty() ? "" : " ") + c.compileOptions,
                                      "-o", "/dev/null"};
  std::cout << "ptc-train: " << ptc::commandText(compile) << "\n";
  auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (int rc = runTool(compile); rc != 0) {
    fs::remove(tmp, ec);
    std::cerr << "ptc-train: error: compiling the plan failed (ptc-opt exit " << rc << ")\n";
    return "";
  }
  fs::rename(tmp, plan, ec);
  if (ec) {
    std::cerr << "ptc-train: error: cannot write the plan '" << plan << "': " << ec.message() << "\n";
    return "";
  }
  std::printf("ptc-train: compiled %s in %.1f s\n", plan.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return plan;
}

/// The ptc-run command of `c` for `plan`: resuming when the checkpoint
/// folder has a checkpoint (and the job resumes), under srun when `srun`.
std::vector<std::string> runCommand(const Job &job, const JobCommands &c, const std::string &plan,
                                    bool srun, int64_t maxRestarts) {
  std::vector<std::string> run = c.run;
  run[1] = plan;
  std::string checkpointDir;
  for (size_t i = 0; i + 1 < run.size(); ++i)
    if (run[i] == "--checkpoint-dir")
      checkpointDir = run[i + 1];
  const Value *resumeKey = job.get("checkpoint.resume");
  if (!checkpointDir.empty() && (!resumeKey || resumeKey->b) &&
      fs::exists(fs::path(checkpointDir) / "latest"))
    run.insert(run.end(), {"--resume", checkpointDir});
  for (size_t i = 0; i + 1 < run.size(); ++i)
    if (run[i] == "--max-restarts") {
      if (maxRestarts > 0)
        run[i + 1] = std::to_string(maxRestarts);
      else
        run.erase(run.begin() + static_cast<long>(i), run.begin() + static_cast<long>(i) + 2);
      break;
    }
  if (!srun)
    return run;
  // Slurm starts the ranks (PMIx) and restarts the job (requeue): no --np,
  // --hostfile or --max-restarts for ptc-run.
  std::vector<std::string> out = {"srun", "--ntasks=" + std::to_string(c.ranks), "--mpi=pmix",
                                  "--kill-on-bad-exit=1", (toolDir() / "ptc-run").string()};
  for (size_t i = 1; i < run.size(); ++i) {
    if (run[i] == "--np" || run[i] == "--hostfile" || run[i] == "--max-restarts") {
      ++i;
      continue;
    }
    out.push_back(run[i]);
  }
  return out;
}
} // namespace

/// The files the job reads (training.data and data_blend's files, init,
/// eval.data) that do not exist, as "key: 'path'".
std::vector<std::string> missingInputs(const Job &job) {
  std::vector<std::string> missing;
  auto check = [&](const std::string &key, const std::string &list) {
    std::stringstream ss(list);
    std::string path;
    while (std::getline(ss, path, ','))
      if (!path.empty() && !fs::exists(path))
        missing.push_back(key + ": '" + path + "'");
  };
  if (const Value *v = job.get("training.data"))
    for (const std::string &p : v->strings)
      check("training.data", p);
  if (const Value *v = job.get("training.data_blend"))
    for (const auto &[w, p] : v->blend)
      check("training.data_blend", p);
  for (const char *key : {"training.init", "eval.data"})
    if (const Value *v = job.get(key))
      check(key, v->s);
  return missing;
}

/// `model` (ptc-model's command) without --hf-config: the folder the
/// weights will be saved in gets its config.json only once the job compiles.
std::vector<std::string> withoutHfConfig(std::vector<std::string> model) {
  model.erase(std::remove_if(model.begin(), model.end(),
                             [](const std::string &a) { return a.rfind("--hf-config=", 0) == 0; }),
              model.end());
  return model;
}

/// --dry-run's check: the model built and the plan compiled in a scratch
/// folder (removed after), so a mesh or an option the compiler refuses is
/// found now, not after the ranks start; 0, or the failing tool's status.
int dryRunCompile(const JobCommands &c) {
  std::error_code tmpError;
  std::string pattern = (fs::temp_directory_path(tmpError) / "ptc-train-dry-run-XXXXXX").string();
  if (tmpError || !mkdtemp(pattern.data())) {
    std::cerr << "ptc-train: error: cannot create a scratch folder for the dry run's compile\n";
    return 1;
  }
  const fs::path scratch = pattern;
  std::string modelFile = c.modelFile;
  int rc = 0;
  if (!c.model.empty()) {
    std::vector<std::string> model = withoutHfConfig(c.model);
    modelFile = (scratch / "model.mlir").string();
    model.back() = modelFile; // after -o
    if ((rc = runTool(model)) != 0)
      std::cerr << "ptc-train: error: the dry run's model does not build (ptc-model exit " << rc << ")\n";
  }
  if (rc == 0) {
    std::vector<std::string> compile = {"ptc-opt", modelFile,
                                        "--ptc-compile=plan=" + (scratch / "job.plan").string() +
                                            (c.compileOptions.empty() ? "" : " ") + c.compileOptions,
                                        "-o", "/dev/null"};
    if ((rc = runTool(compile)) != 0)
      std::cerr << "ptc-train: error: the job does not compile (ptc-opt exit " << rc
                << "; its message above says why)\n";
  }
  std::error_code ec;
  fs::remove_all(scratch, ec);
  return rc;
}

int main(int argc, char **argv) {
  std::string jobPath;
  std::vector<std::string> overrides;
  bool dryRun = false, compileOnly = false, elasticFlag = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--help-keys") {
      std::cout << describeSchema();
      return 0;
    }
    if (a == "--dry-run") {
      dryRun = true;
    } else if (a == "--compile-only") {
      compileOnly = true;
    } else if (a == "--elastic") {
      elasticFlag = true;
    } else if (a == "--set" && i + 1 < argc) {
      overrides.push_back(argv[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      overrides.push_back(a.substr(6));
    } else if (a.rfind("-", 0) == 0 || !jobPath.empty()) {
      std::cerr << "ptc-train: error: unexpected argument '" << a << "'\n" << kUsage;
      return 2;
    } else {
      jobPath = a;
    }
  }
  if (jobPath.empty()) {
    std::cerr << "ptc-train: error: no job file\n" << kUsage;
    return 2;
  }
  if (elasticFlag)
    overrides.push_back("launch.elastic=true");
  std::string error;
  std::optional<Job> job = loadJob(jobPath, overrides, error);
  if (!job) {
    std::cerr << "ptc-train: error: " << error << "\n";
    return 2;
  }
  std::optional<JobCommands> commands = jobCommands(*job, error);
  if (!commands) {
    std::cerr << "ptc-train: error: " << error << "\n";
    return 2;
  }
  JobCommands &c = *commands;
  const bool elastic = job->get("launch.elastic") && job->get("launch.elastic")->b;
  const bool srun = useSrun(*job);
  if (srun && !dryRun && !compileOnly && !std::getenv("SLURM_JOB_ID") && std::system("command -v srun >/dev/null 2>&1") != 0) {
    std::cerr << "ptc-train: error: launch.launcher = \"srun\" but Slurm's srun is not installed\n";
    return 2;
  }
  const Value *restartsKey = job->get("checkpoint.max_restarts");
  int64_t restartsLeft = restartsKey ? restartsKey->i : 0;

  std::cout << "ptc-train: job '" << job->name << "' in " << job->dir << ": " << c.ranks
            << (c.ranks == 1 ? " rank" : " ranks") << (srun ? " (srun)" : "") << "\n";
  const std::vector<std::string> missing = missingInputs(*job);
  if (dryRun) {
    if (!c.model.empty())
      std::cout << ptc::commandText(c.model) << "\n";
    std::cout << ptc::commandText({"ptc-opt", c.modelFile, "--ptc-compile=plan=PLAN " + c.compileOptions, "-o",
                         "/dev/null"})
              << "\n";
    std::cout << ptc::commandText(runCommand(*job, c, job->dir + "/plans/PLAN.plan", srun, restartsLeft)) << "\n";
    // Checked, not run: the inputs a run reads, and the compile (scratch).
    for (const std::string &m : missing)
      std::cout << "ptc-train: note: " << m << " does not exist (a run needs it)\n";
    std::cout << std::flush;
    if (int rc = dryRunCompile(c); rc != 0)
      return 1;
    std::cout << "ptc-train: dry run: the job compiles for " << c.ranks << (c.ranks == 1 ? " rank" : " ranks")
              << "\n";
    return 0;
  }
  if (!compileOnly && !missing.empty()) {
    for (const std::string &m : missing)
      std::cerr << "ptc-train: error: " << m << " does not exist\n";
    return 2;
  }

  if (!compileOnly)
    ptc::handleSignals({SIGUSR1, SIGTERM}, forwardSignal);
  std::error_code ec;
  fs::create_directories(fs::path(job->dir) / "plans", ec);
  if (ec) {
    std::cerr << "ptc-train: error: cannot create the job's folder '" << job->dir
              << "': " << ec.message() << "\n";
    return 1;
  }
  if (!c.model.empty()) {
    const std::vector<std::string> model = withoutHfConfig(c.model);
    std::cout << "ptc-train: " << ptc::commandText(model) << "\n";
    if (int rc = runTool(model); rc != 0) {
      std::cerr << "ptc-train: error: building the model failed (ptc-model exit " << rc << ")\n";
      return 1;
    }
  }
  // The ranks there are now: too few for the mesh is a re-plan (elastic) or
  // an error naming both counts.
  std::optional<Available> available = availableRanks(*job, srun, error);
  if (!available) {
    std::cerr << "ptc-train: error: " << error << "\n";
    return 2;
  }
  if (available->ranks >= 0 && available->ranks < c.ranks && !compileOnly) {
    if (!elastic) {
      std::cerr << "ptc-train: error: " << available->ranks
                << (available->ranks == 1 ? " rank is" : " ranks are") << " available ("
                << available->source << ") but parallelism.mesh needs " << c.ranks
                << ": set launch.elastic = true (or --elastic) to re-plan for them\n";
      return ptc::kExitTooFewRanks;
    }
    if (available->ranks < 1 || !replan(*job, c, *available))
      return 1;
  }
  std::string plan = compilePlan(*job, c);
  if (plan.empty())
    return 1;
  if (!c.hfConfig.empty()) {
    // The folder the weights will be saved in gets the model's config.json
    // now that the job compiles.
    fs::create_directories(fs::path(c.hfConfig).parent_path(), ec);
    std::vector<std::string> config = c.model;
    config.back() = "/dev/null"; // the model itself is built already
    std::cout << "ptc-train: " << ptc::commandText(config) << "\n";
    if (int rc = runTool(config); rc != 0) {
      std::cerr << "ptc-train: error: writing '" << c.hfConfig << "' failed (ptc-model exit " << rc << ")\n";
      return 1;
    }
  }
  if (compileOnly)
    return 0;
  if (gStopBeforeStart) {
    std::cout << "ptc-train: asked to stop (signal " << gStopBeforeStart
              << ") before the ranks started: not starting them; exit status " << ptc::kExitStopped
              << "\n";
    return ptc::kExitStopped;
  }
  std::vector<std::string> run = runCommand(*job, c, plan, srun, restartsLeft);
  if (auto r = std::find(run.begin(), run.end(), "--resume"); r != run.end())
    std::cout << "ptc-train: resuming from the newest checkpoint in " << r[1] << "\n";
  std::cout << "ptc-train: " << ptc::commandText(run) << "\n" << std::flush;
  if (!elastic && !srun) {
    // ptc-run takes over this process: its exit status and signals are the job's.
    execTool(run);
    return 1;
  }
  if (srun) {
    // Slurm 22.05's srun exits 0 when the step fails to launch (a PMIx
    // socket left by the job's previous start, say): the run's leader
    // writes PTC_RESULT_FILE when it ends well, and its absence is a failure.
    // A requeued job re-plans when it starts (above).
    // A step that did not launch at all (srun 0, no rank started: a PMIx
    // socket of the job's previous start not yet removed, say) is tried
    // again, 3 times at most, 5 s apart.
    const std::string result = job->dir + "/.result-" + std::to_string(getpid());
    setenv("PTC_RESULT_FILE", result.c_str(), 1);
    int rc = 0;
    for (int attempt = 1;; ++attempt) {
      fs::remove(result, ec);
      rc = runTool(run, /*forward=*/true);
      std::string said;
      readFile(result, said);
      if (rc != 0 || said.rfind("done", 0) == 0)
        break;
      if (!said.empty() || attempt == 3) {
        std::cerr << "ptc-train: error: srun exited 0 but the ranks did not "
                  << (said.empty() ? "start (the job step did not launch; see srun's messages above)"
                                   : "finish the run")
                  << "\n";
        rc = 1;
        break;
      }
      std::cerr << "ptc-train: srun exited 0 but no rank started (the job step did not launch): "
                   "trying again in 5 s ("
                << attempt + 1 << " of 3)\n";
      std::this_thread::sleep_for(std::chrono::seconds(5));
    }
    fs::remove(result, ec);
    return rc;
  }
  // Elastic under mpirun: ptc-run restarts the job on its own while the
  // hostfile has the ranks; when it has too few (a node gone), re-plan for
  // the rest and continue from the checkpoint.
  while (true) {
    int rc = runTool(run, /*forward=*/true);
    if (rc != ptc::kExitTooFewRanks)
      return rc;
    if (restartsLeft <= 0) {
      std::cerr << "ptc-train: the job needs more ranks than there are and no restarts are left "
                   "(checkpoint.max_restarts): giving up\n";
      return rc;
    }
    --restartsLeft;
    available = availableRanks(*job, srun, error);
    if (!available) {
      std::cerr << "ptc-train: error: " << error << "\n";
      return 1;
    }
    if (available->ranks < 1 || !replan(*job, c, *available))
      return 1;
    plan = compilePlan(*job, c);
    if (plan.empty())
      return 1;
    run = runCommand(*job, c, plan, srun, restartsLeft);
    std::cout << "ptc-train: elastic: continuing from the newest checkpoint on " << c.ranks
              << (c.ranks == 1 ? " rank" : " ranks") << " (" << restartsLeft << " restarts left)\n"
              << "ptc-train: " << ptc::commandText(run) << "\n"
              << std::flush;
  }
}
