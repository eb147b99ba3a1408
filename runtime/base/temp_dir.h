// A fresh private directory under $TMPDIR (else /tmp), as std::filesystem
// finds it: ptc-run's rank status files, ptc-generate's compiled plans.
#ifndef PTC_RUNTIME_BASE_TEMP_DIR_H
#define PTC_RUNTIME_BASE_TEMP_DIR_H

#include "runtime/base/status.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace ptc {

/// Creates "<temp>/<prefix>XXXXXX" (mode 0700, mkdtemp) and returns its path;
/// the error names the path it tried and why.
inline StatusOr<std::string> makeTempDirectory(const std::string &prefix) {
  std::error_code ec;
  std::string path = (std::filesystem::temp_directory_path(ec) / (prefix + "XXXXXX")).string();
  if (ec) {
    const char *tmpdir = std::getenv("TMPDIR");
    return error(StatusCode::kInternal, "cannot create a temporary directory: the temporary folder ",
                 tmpdir && *tmpdir ? "TMPDIR='" + std::string(tmpdir) + "'" : std::string("/tmp"),
                 " is not usable (", ec.message(), ")");
  }
  if (!mkdtemp(path.data()))
    return error(StatusCode::kInternal, "cannot create a temporary directory ", path, " (",
                 std::strerror(errno), ")");
  return path;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_TEMP_DIR_H
