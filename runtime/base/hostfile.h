// Open MPI hostfiles ("HOST slots=N [max_slots=M]" per line, '#' comments):
// the hosts a job may use and how many ranks each takes. The --np launcher
// and ptc-train read the slots to know how many ranks are available now (a
// node taken out of the file is a node gone: elastic continuation re-plans
// for the rest).
#ifndef PTC_RUNTIME_BASE_HOSTFILE_H
#define PTC_RUNTIME_BASE_HOSTFILE_H

#include "runtime/base/parse_number.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace ptc {

struct HostfileEntry {
  std::string host;
  int64_t slots = 0;
  int line = 0;   ///< 1-based line number in the file
  std::string text; ///< the line as written
};

/// The hosts of `path` in order (ranks fill them in that order, as Open MPI
/// maps by slot). An unreadable file, or a host line without a positive
/// slots=N, is nullopt with `error` naming the file and line.
inline std::optional<std::vector<HostfileEntry>> readHostfile(const std::string &path,
                                                              std::string &error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot read the hostfile '" + path + "'";
    return std::nullopt;
  }
  std::vector<HostfileEntry> hosts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string body = line.substr(0, line.find('#'));
    std::istringstream words(body);
    HostfileEntry e;
    e.line = n;
    e.text = line;
    if (!(words >> e.host))
      continue;
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) == 0) {
        auto slots = parseInteger(w.substr(6), 1, 1 << 20);
        if (!slots) {
          error = path + ":" + std::to_string(n) + ": '" + w + "' is not a positive slot count";
          return std::nullopt;
        }
        e.slots = *slots;
      }
    }
    if (e.slots == 0) {
      error = path + ":" + std::to_string(n) + ": host '" + e.host +
              "' has no slots=N (the ranks a host takes must be given)";
      return std::nullopt;
    }
    hosts.push_back(e);
  }
  if (hosts.empty()) {
    error = "the hostfile '" + path + "' names no host";
    return std::nullopt;
  }
  return hosts;
}

/// The ranks `hosts` can take.
inline int64_t totalSlots(const std::vector<HostfileEntry> &hosts) {
  int64_t n = 0;
  for (const HostfileEntry &h : hosts)
    n += h.slots;
  return n;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_HOSTFILE_H
