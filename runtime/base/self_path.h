// Where this program's executable is: tools that start their siblings (ptc-train
// runs ptc-model, ptc-opt and ptc-run; ptc-generate runs ptc-opt; the --np
// launchers re-execute themselves under mpirun) find them next to it.
#ifndef PTC_RUNTIME_BASE_SELF_PATH_H
#define PTC_RUNTIME_BASE_SELF_PATH_H

#include <filesystem>
#include <system_error>

namespace ptc {

/// The running executable's path (empty when /proc does not say).
inline std::filesystem::path selfExecutable() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : self;
}

/// The folder of the running executable ("." when unknown): its sibling tools.
inline std::filesystem::path toolDirectory() {
  std::filesystem::path self = selfExecutable();
  return self.empty() ? std::filesystem::path(".") : self.parent_path();
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_SELF_PATH_H
