// ptc-run's --np launcher: mpirun under ptc-run, which passes a stop request
// on, prints each rank's error once, names the ranks that died without a
// word, and with --max-restarts supervises the job as torchrun does; and what
// a launcher's environment says of this process.
#ifndef PTC_TOOLS_PTC_RUN_LAUNCHER_H
#define PTC_TOOLS_PTC_RUN_LAUNCHER_H

#include <cstdint>
#include <string>

namespace ptc {

/// The number of ranks on this node, from the launcher's environment (Open
/// MPI, MPICH, srun's SLURM_STEP_TASKS_PER_NODE; 1 when not launched by one).
int ranksOnThisNode();

/// The rank whose process this is, from the launcher's environment (MPI is
/// not initialized yet).
int launcherRank();

/// `ptc-run --np N ARGS...`: re-executes ptc-run under mpirun with N ranks
/// (see the definition). Returns the job's exit status.
int launchWithMpirun(int argc, char **argv, int64_t jobRanks, int64_t maxRestarts,
                     const std::string &checkpointDir, const std::string &planPath,
                     const std::string &hostfile, double collectiveTimeout);

} // namespace ptc

#endif // PTC_TOOLS_PTC_RUN_LAUNCHER_H
