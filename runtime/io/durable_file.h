// Writing a file so that a crash or a full disk never leaves a torn or
// clobbered result: a unique temporary beside the target, written, fsynced,
// renamed over the target, and the directory fsynced; the temporary is removed
// on any failure. Only a regular file (or nothing) is ever replaced.
#ifndef PTC_RUNTIME_IO_DURABLE_FILE_H
#define PTC_RUNTIME_IO_DURABLE_FILE_H

#include "runtime/base/status.h"

#include <functional>
#include <string>

namespace ptc {

/// Whether `path` can be written as an output: its directory exists, and
/// `path` is absent or a regular file (not a directory, device, link, ...).
/// `what` names the output in the message ("--save").
Status checkOutputPath(const std::string &path, const std::string &what);

/// Whether `dir` can take a directory of outputs: it is a directory, or
/// absent with an existing parent directory.
Status checkOutputDirectory(const std::string &dir, const std::string &what);

/// Calls `write` with a file descriptor of a fresh temporary beside `path`
/// and, when it and every step after succeed, makes it `path`.
Status writeFileDurably(const std::string &path, const std::function<Status(int fd)> &write);

/// Writes all `bytes` to `fd` (retrying short writes); `path` names it in errors.
Status writeAll(int fd, const void *bytes, size_t size, const std::string &path);

} // namespace ptc

#endif // PTC_RUNTIME_IO_DURABLE_FILE_H
