//===- ptc-train.cpp - run a training job described by one TOML file ------===//
//
//   ptc-train JOB.toml [--set SECTION.KEY=VALUE ...] [--dry-run | --compile-only] [--help-keys]
//
// Builds the model (ptc-model, or [model] file), compiles it (ptc-opt; the
// plan is cached in the job's folder under a hash of the model, the compile
// options and the compiler), and runs it (ptc-run, on as many ranks as the
// mesh has; resuming from the newest checkpoint when there is one).
//
//===----------------------------------------------------------------------===//

#include "tools/ptc-train/JobConfig.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace {
namespace fs = std::filesystem;
using namespace ptc::train;

const char *kUsage = R"(usage: ptc-train JOB.toml [--set SECTION.KEY=VALUE ...] [--dry-run | --compile-only]
  Runs the training job JOB.toml describes: builds the model (ptc-model, or [model] file),
  compiles it (ptc-opt; the plan is cached in the job's folder, recompiled only when the
  model, the compile options or the compiler change) and trains it with ptc-run on the
  mesh's ranks, resuming from the newest checkpoint when [checkpoint] has one.
  --set S.K=V   override a key (V in TOML syntax; a bare word is a string), e.g.
                --set training.steps=200 --set parallelism.mesh=dp:2
  --dry-run     check the job and print the commands it would run; run nothing
  --compile-only  build the model and compile the plan (or find it cached); do not train
  --help-keys   list every section and key
Examples: configs/*.toml. Relative paths are relative to the current folder.
)";

fs::path toolDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : self.parent_path();
}

std::string quoted(const std::vector<std::string> &argv) {
  std::string out;
  for (const std::string &a : argv) {
    bool plain = !a.empty() && a.find_first_of(" \t\"'$*?;&|<>()\\") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

/// Replaces this process with tool `argv[0]` of this build; returns only
/// when it cannot (after saying why).
void execTool(std::vector<std::string> argv) {
  argv[0] = (toolDir() / argv[0]).string();
  std::vector<char *> cargs;
  for (std::string &a : argv)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(cargs[0], cargs.data());
  std::fprintf(stderr, "ptc-train: error: cannot run %s: %s\n", cargs[0], std::strerror(errno));
}

/// Runs `argv` (argv[0] a tool of this build) and waits; its output is ours.
int runTool(const std::vector<std::string> &argv) {
  std::cout << std::flush;
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("ptc-train: fork");
    return 1;
  }
  if (pid == 0) {
    execTool(argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
} // namespace

int main(int argc, char **argv) {
  std::string jobPath;
  std::vector<std::string> overrides;
  bool dryRun = false, compileOnly = false;
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
  std::vector<std::string> compile = {"ptc-opt", c.modelFile,
                                      "--ptc-compile=plan=PLAN " + c.compileOptions, "-o",
                                      "/dev/null"};
  const Value *resumeKey = job->get("checkpoint.resume");
  std::string checkpointDir;
  for (size_t i = 0; i + 1 < c.run.size(); ++i)
    if (c.run[i] == "--checkpoint-dir")
      checkpointDir = c.run[i + 1];
  const bool resume = !checkpointDir.empty() && (!resumeKey || resumeKey->b) &&
                      fs::exists(fs::path(checkpointDir) / "latest");
  if (resume)
    c.run.insert(c.run.end(), {"--resume", checkpointDir});

  std::cout << "ptc-train: job '" << job->name << "' in " << job->dir << ": " << c.ranks
            << (c.ranks == 1 ? " rank" : " ranks") << "\n";
  if (dryRun) {
    if (!c.model.empty())
      std::cout << quoted(c.model) << "\n";
    std::cout << quoted(compile) << "\n";
    c.run[1] = job->dir + "/plans/PLAN.plan";
    std::cout << quoted(c.run) << "\n";
    return 0;
  }

  std::error_code ec;
  fs::create_directories(fs::path(job->dir) / "plans", ec);
  if (ec) {
    std::cerr << "ptc-train: error: cannot create the job's folder '" << job->dir
              << "': " << ec.message() << "\n";
    return 1;
  }
  if (!c.hfConfig.empty()) // the folder the weights will be saved in
    fs::create_directories(fs::path(c.hfConfig).parent_path(), ec);
  if (!c.model.empty()) {
    std::cout << "ptc-train: " << quoted(c.model) << "\n";
    if (int rc = runTool(c.model); rc != 0) {
      std::cerr << "ptc-train: error: building the model failed (ptc-model exit " << rc << ")\n";
      return 1;
    }
  }
  // The plan's cache key: the model, the options, and the compiler that
  // would compile them (its size and modification time).
  std::string modelText;
  if (!readFile(c.modelFile, modelText)) {
    std::cerr << "ptc-train: error: cannot read the model '" << c.modelFile << "'\n";
    return 1;
  }
  struct stat compiler {};
  stat((toolDir() / "ptc-opt").c_str(), &compiler);
  uint64_t key = fnv1a(modelText);
  key = fnv1a(c.compileOptions, key);
  key = fnv1a(std::to_string(compiler.st_size) + "/" + std::to_string(compiler.st_mtime), key);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  const std::string plan = job->dir + "/plans/" + hex + ".plan";
  if (fs::exists(plan)) {
    std::cout << "ptc-train: plan " << plan
              << " (cached: the model, the compile options and ptc-opt are unchanged)\n";
  } else {
    const std::string tmp = plan + ".tmp";
    compile[2] = "--ptc-compile=plan=" + tmp + (c.compileOptions.empty() ? "" : " ") + c.compileOptions;
    std::cout << "ptc-train: " << quoted(compile) << "\n";
    auto start = std::chrono::steady_clock::now();
    if (int rc = runTool(compile); rc != 0) {
      fs::remove(tmp, ec);
      std::cerr << "ptc-train: error: compiling the plan failed (ptc-opt exit " << rc << ")\n";
      return 1;
    }
    fs::rename(tmp, plan, ec);
    if (ec) {
      std::cerr << "ptc-train: error: cannot write the plan '" << plan << "': " << ec.message() << "\n";
      return 1;
    }
    std::printf("ptc-train: compiled %s in %.1f s\n", plan.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  c.run[1] = plan;
  if (compileOnly)
    return 0;
  if (resume)
    std::cout << "ptc-train: resuming from the newest checkpoint in " << checkpointDir << "\n";
  std::cout << "ptc-train: " << quoted(c.run) << "\n" << std::flush;
  // ptc-run takes over this process: its exit status and signals are the job's.
  execTool(c.run);
  return 1;
}
