// Mesh helpers and launcher detection (no MPI calls).

#include "runtime/comm/communicator.h"

#include <cstdlib>

namespace ptc {

int Mesh::numRanks() const {
  int n = 1;
  for (int s : sizes)
    n *= s;
  return n;
}

std::vector<int> Mesh::coords(int rank) const {
  std::vector<int> c(sizes.size());
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    c[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return c;
}

std::string Mesh::describe() const {
  std::string s;
  for (size_t i = 0; i < axes.size(); ++i)
    s += (i ? " x " : "") + axes[i] + "=" + std::to_string(sizes[i]);
  return s.empty() ? "1 device" : s;
}

bool launchedByMpi() {
  for (const char *v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v))
      return true;
  return false;
}

} // namespace ptc
