//===- Calibrate.h - measuring this machine for the planner -----*- C++ -*-===//

#ifndef PTC_PLANNER_CALIBRATE_H
#define PTC_PLANNER_CALIBRATE_H

#include "planner/Cluster.h"

#include "llvm/Support/raw_ostream.h"

namespace ptc::planner {

/// Measures ptc's CPU kernels at every thread count up to the core count and
/// the MPI links (`mpirun -np 2 <self> --measure-links`), progress on `log`.
llvm::Expected<Cluster> calibrate(const std::string &self, llvm::raw_ostream &log);

/// The `--measure-links FILE` mode, run under mpirun: all-reduce times by
/// size as JSON [[bytes, seconds], ...] (rank 0 writes). Returns the exit code.
int measureLinks(const std::string &outPath);

} // namespace ptc::planner

#endif // PTC_PLANNER_CALIBRATE_H
