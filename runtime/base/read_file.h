// One way to open and read a file named by a user or by another file (a plan,
// a checkpoint shard, a data file, an index): only a regular file is opened,
// so a FIFO never blocks the reader and a device or /proc file is refused by
// name; a read error is a Status naming the file, never an exception.
#ifndef PTC_RUNTIME_BASE_READ_FILE_H
#define PTC_RUNTIME_BASE_READ_FILE_H

#include "runtime/base/status.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ptc {

/// What `st` is, for "is not a regular file (...)".
inline const char *fileKindName(const struct stat &st) {
  if (S_ISDIR(st.st_mode))
    return "a directory";
  if (S_ISFIFO(st.st_mode))
    return "a FIFO";
  if (S_ISSOCK(st.st_mode))
    return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
    return "a device";
  return "a special file";
}

/// Opens `path` for reading when it is a regular file (a symbolic link to one
/// included) and returns its descriptor (O_CLOEXEC); `what` names it in errors
/// ("plan", "data file"): kNotFound "cannot open plan 'p': No such file or
/// directory", or "plan 'p' is not a regular file (a FIFO)". A FIFO is opened
/// non-blocking, so that no writer is waited for, and refused by its fstat.
inline StatusOr<int> openRegularFile(const std::string &path, const std::string &what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return error(StatusCode::kNotFound, "cannot open ", what, " '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string kind = fileKindName(st);
    ::close(fd);
    return invalidArgument(what, " '", path, "' is not a regular file (", kind, ")");
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0)
    (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

/// The whole of a regular file `path` (see openRegularFile); a read error
/// (EIO, a /proc file that refuses reads) is kDataLoss naming the file, and
/// a file that reads past its size (/proc, /sys, one being appended to) is
/// refused.
inline StatusOr<std::vector<uint8_t>> readRegularFile(const std::string &path, const std::string &what) {
  StatusOr<int> fd = openRegularFile(path, what);
  if (!fd.isOk())
    return fd.status();
  std::vector<uint8_t> bytes;
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    int err = errno;
    ::close(*fd);
    return error(StatusCode::kDataLoss, "cannot read ", what, " '", path, "': ", std::strerror(err));
  }
  bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(*fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ::close(*fd);
      return error(StatusCode::kDataLoss, "cannot read ", what, " '", path, "': ", std::strerror(err));
    }
    if (n == 0)
      break;
    // More than its size: a file of /proc or sysfs (size 0, which may read
    // on without end, as /proc/self/pagemap does) or one written meanwhile.
    if (static_cast<int64_t>(bytes.size()) + n > static_cast<int64_t>(st.st_size)) {
      ::close(*fd);
      return invalidArgument(what, " '", path, "' reads past its size of ", st.st_size,
                             " bytes: a file of /proc or /sys, or one being written");
    }
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  ::close(*fd);
  return bytes;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_READ_FILE_H
