// The programs the tools start: a sibling tool of this build (ptc-train runs
// ptc-model, ptc-opt, ptc-plan and ptc-run; ptc-generate runs ptc-opt; the
// planner's calibration runs ptc-run) or a program on PATH (mpirun, srun,
// scontrol). By argument vector, never through a shell: a path with a space
// or a quote reaches the program as it is. Header-only: ptc-train links no
// library of ours.
#ifndef PTC_RUNTIME_BASE_SUBPROCESS_H
#define PTC_RUNTIME_BASE_SUBPROCESS_H

#include "runtime/base/self_path.h"

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ptc {

/// Where a program's name (argv[0]) is looked up.
enum class ProgramPlace {
  SiblingTool, ///< beside the running executable (toolDirectory())
  OnPath,      ///< on PATH, as a shell would find it
};

/// `argv` as a shell would take it back: words with spaces, quotes or shell
/// characters in single quotes (for messages and --dry-run listings).
inline std::string commandText(const std::vector<std::string> &argv) {
  std::string out;
  for (const std::string &a : argv) {
    const bool plain = !a.empty() && a.find_first_of(" \t\"'$*?;&|<>()\\") == std::string::npos;
    std::string word = a;
    if (!plain) {
      word = "'";
      for (char c : a)
        word += c == '\'' ? std::string("'\\''") : std::string(1, c);
      word += "'";
    }
    out += (out.empty() ? "" : " ") + word;
  }
  return out;
}

/// Replaces this process with `argv`; returns only when it cannot, after
/// saying why on stderr as "<who>: error: cannot run PROGRAM: REASON".
inline void execProgram(std::vector<std::string> argv, ProgramPlace place, const char *who) {
  if (argv.empty())
    return;
  if (place == ProgramPlace::SiblingTool)
    argv[0] = (toolDirectory() / argv[0]).string();
  std::vector<char *> cargs;
  for (std::string &a : argv)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  if (place == ProgramPlace::SiblingTool)
    ::execv(cargs[0], cargs.data());
  else
    ::execvp(cargs[0], cargs.data());
  std::fprintf(stderr, "%s: error: cannot run %s: %s\n", who, cargs[0], std::strerror(errno));
}

struct ChildOptions {
  ProgramPlace place = ProgramPlace::OnPath;
  /// The tool that starts it, in the message when it cannot run.
  const char *who = "ptc";
  /// Variables set in the child's environment only.
  std::vector<std::pair<std::string, std::string>> environment = {};
  /// Its standard output into ChildResult::output (else it is ours).
  bool captureOutput = false;
  /// Its standard output, or its standard error, to /dev/null.
  bool discardOutput = false, discardErrors = false;
  /// Called in this process with the child's id once it runs (to pass
  /// signals on to it), and with 0 when it has ended.
  std::function<void(pid_t)> onRunning = {};
};

struct ChildResult {
  /// Its exit status; 128 + the signal that ended it; 127 when it could not
  /// start (the reason is on stderr).
  int status = 127;
  std::string output;
};

/// Runs `argv` and waits for it.
inline ChildResult runChild(std::vector<std::string> argv, const ChildOptions &options = {}) {
  ChildResult result;
  int fds[2] = {-1, -1};
  if (options.captureOutput && ::pipe(fds) != 0) {
    std::fprintf(stderr, "%s: error: cannot start %s: no pipe for its output: %s\n", options.who,
                 argv.empty() ? "?" : argv[0].c_str(), std::strerror(errno));
    return result;
  }
  std::fflush(nullptr); // our buffered output before the child's
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "%s: error: cannot start %s: %s\n", options.who,
                 argv.empty() ? "?" : argv[0].c_str(), std::strerror(errno));
    if (options.captureOutput) {
      ::close(fds[0]);
      ::close(fds[1]);
    }
    return result;
  }
  if (pid == 0) {
    for (const auto &[name, value] : options.environment)
      ::setenv(name.c_str(), value.c_str(), 1);
    if (options.captureOutput) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
    }
    if (options.discardOutput || options.discardErrors) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        if (options.discardOutput && !options.captureOutput)
          ::dup2(null, STDOUT_FILENO);
        if (options.discardErrors)
          ::dup2(null, STDERR_FILENO);
        ::close(null);
      }
    }
    execProgram(std::move(argv), options.place, options.who);
    ::_exit(127);
  }
  if (options.onRunning)
    options.onRunning(pid);
  if (options.captureOutput) {
    ::close(fds[1]);
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
      if (n > 0)
        result.output.append(buffer, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        break;
    }
    ::close(fds[0]);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (options.onRunning)
    options.onRunning(0);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_SUBPROCESS_H
