// ptc-run's command line: every option in one declarative table
// (options.cc), parsed and checked into RunOptions before anything runs.

#ifndef PTC_TOOLS_PTC_RUN_OPTIONS_H
#define PTC_TOOLS_PTC_RUN_OPTIONS_H

#include "runtime/base/option_values.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>

namespace ptc {

struct RunOptions {
  std::string planPath;
  // Switches.
  bool dumpPlan = false, profile = false, memoryReport = false, asyncCheckpoint = false,
       tf32 = false;
  // Paths and names ("" when not given).
  std::string data, dataBlend, evalData, init, save, checkpointDir, resume, hostfile, metrics,
      metricsCsv, tensorboard, trace, offloadDir, kernelCoverage;
  std::string device = "auto", comm = "auto", onNonfinite = "skip";
  // The closed-set values above, parsed once (checkTogether).
  CommBackend commBackend = CommBackend::Auto;
  NonfiniteAction nonfiniteAction = NonfiniteAction::Skip;
  // Counts.
  int64_t steps = 100, seed = 1337, shuffle = 0, evalEvery = 100, evalSteps = 10,
          checkpointEvery = 0, keepLast = 0, maxRestarts = 0, maxShardMb = 5000, logEvery = 10,
          threads = 0, ranks = 0, maxSkippedSteps = 10;
  // Seconds and rates (0: the default the option's help names).
  double collectiveTimeout = 0.0, stepTimeout = 3600.0, peakTflops = 0.0;
  /// The options given on the command line ("--steps", ...).
  std::set<std::string> given;
  bool has(const std::string &flag) const { return given.count(flag) != 0; }
};

/// The kernels' threads when --threads is not given: the node's cores shared
/// by the ranks on it, at most the cores this process may run on.
int defaultKernelThreads();

/// Parses and checks ptc-run's command line. Returns the exit status when
/// ptc-run is done (0 after --help; 2 after an error, printed), or nothing
/// when it should run with `out`.
std::optional<int> parseRunOptions(int argc, char **argv, RunOptions &out);

} // namespace ptc

#endif // PTC_TOOLS_PTC_RUN_OPTIONS_H
