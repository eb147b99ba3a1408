// The exit statuses ptc's tools share with the scripts and supervisors that
// run them (a Slurm job script, ptc-train's elastic loop, ptc-run's --np
// launcher). Any other non-zero status is a failure.
#ifndef PTC_RUNTIME_BASE_EXIT_CODES_H
#define PTC_RUNTIME_BASE_EXIT_CODES_H

namespace ptc {

/// A usage error (a bad option, a bad job file): running again repeats it.
constexpr int kExitUsage = 2;

/// A run stopped at a step boundary by a signal (SIGUSR1, or SIGTERM outside
/// the --np launcher), its checkpoint written: sysexits' EX_TEMPFAIL, "try
/// again later". A job script requeues the job on it.
constexpr int kExitStopped = 75;

/// The launcher cannot start or restart the job: fewer ranks are available
/// (the hostfile's slots) than the plan needs. ptc-train's elastic mode
/// re-plans for the ranks there are.
constexpr int kExitTooFewRanks = 76;

} // namespace ptc

#endif // PTC_RUNTIME_BASE_EXIT_CODES_H
