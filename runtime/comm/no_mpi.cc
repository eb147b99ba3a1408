// Builds without MPI (-DPTC_WITH_MPI=OFF or MPI not found, e.g. the GPU check
// machine): single-rank runs only.

#include "runtime/comm/communicator.h"

#include <cstdlib>

namespace ptc {

StatusOr<std::unique_ptr<Communicator>> createMpiCommunicator(const Mesh &mesh, double, double) {
  return invalidArgument("this ptc-run was built without MPI; the plan needs ", mesh.numRanks(),
                         " ranks (mesh ", mesh.describe(), ")");
}

void finalizeMpi() {}

void abortMpi(int code) { std::exit(code); }

int worldRank() { return 0; }

} // namespace ptc
