// Builds without NCCL (no CUDA, or NCCL not found): collectives go through MPI.

#include "runtime/comm/communicator.h"

namespace ptc {

bool ncclCompiledIn() { return false; }

StatusOr<std::unique_ptr<Communicator>> createNcclCommunicator(std::unique_ptr<Communicator>,
                                                               Device &,
                                                               const std::vector<std::vector<int>> &,
                                                               double) {
  return invalidArgument("this build has no NCCL backend (configured without CUDA or NCCL)");
}

} // namespace ptc
