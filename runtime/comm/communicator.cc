// Mesh helpers and launcher detection (no MPI calls).

#include "runtime/comm/communicator.h"

#include <algorithm>
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

int Mesh::rankOf(const std::vector<int> &c) const {
  int r = 0;
  for (size_t i = 0; i < sizes.size(); ++i)
    r = r * sizes[i] + c[i];
  return r;
}

Mesh::GroupKey Mesh::groupKey(const std::vector<int> &c, const std::vector<int> &groupAxes) const {
  GroupKey k{0, 0};
  for (size_t a = 0; a < sizes.size(); ++a) {
    bool inGroup = std::find(groupAxes.begin(), groupAxes.end(), static_cast<int>(a)) !=
                   groupAxes.end();
    if (inGroup)
      k.key = k.key * sizes[a] + c[a];
    else
      k.color = k.color * sizes[a] + c[a];
  }
  return k;
}

std::vector<int> Mesh::groupRanks(int rank, const std::vector<int> &groupAxes) const {
  std::vector<std::pair<int, int>> members; // (key, rank)
  GroupKey mine = groupKey(coords(rank), groupAxes);
  for (int r = 0, n = numRanks(); r < n; ++r) {
    GroupKey k = groupKey(coords(r), groupAxes);
    if (k.color == mine.color)
      members.push_back({k.key, r});
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (auto [key, r] : members)
    ranks.push_back(r);
  return ranks;
}

std::string Mesh::describeAxes(const std::vector<int> &groupAxes) const {
  std::string s;
  for (int a : groupAxes)
    s += (s.empty() ? "" : ",") +
         (a >= 0 && static_cast<size_t>(a) < axes.size() ? axes[static_cast<size_t>(a)]
                                                         : "axis" + std::to_string(a));
  return "{" + s + "}";
}

bool launchedByMpi() {
  for (const char *v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v))
      return true;
  return false;
}

} // namespace ptc
