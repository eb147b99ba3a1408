#include "runtime/io/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ptc {
namespace {
std::string directoryOf(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
} // namespace

Status checkOutputPath(const std::string &path, const std::string &what) {
  if (path.empty())
    return invalidArgument(what, " needs a file name");
  struct stat st;
  std::string dir = directoryOf(path);
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalidArgument(what, " '", path, "': the directory '", dir, "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    return invalidArgument(what, " '", path, "': the directory '", dir, "' is not writable");
  if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return invalidArgument(what, " '", path, "' exists and is not a regular file (",
                           S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a symbolic link"
                                                                                    : "a device or other special file",
                           "); refusing to replace it");
  return Status::ok();
}

Status checkOutputDirectory(const std::string &dir, const std::string &what) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/')
    d.pop_back();
  struct stat st;
  if (lstat(d.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      return invalidArgument(what, " '", dir, "' exists and is not a directory");
    if (access(d.c_str(), W_OK) != 0)
      return invalidArgument(what, " '", dir, "': the directory is not writable");
    return Status::ok();
  }
  std::string parent = directoryOf(d);
  if (stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalidArgument(what, " '", dir, "': the directory '", parent, "' does not exist");
  if (access(parent.c_str(), W_OK) != 0)
    return invalidArgument(what, " '", dir, "': the directory '", parent, "' is not writable");
  return Status::ok();
}

Status writeAll(int fd, const void *bytes, size_t size, const std::string &path) {
  const char *p = static_cast<const char *>(bytes);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return error(StatusCode::kDataLoss, "cannot write '", path, "': ",
                   n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status writeFileDurably(const std::string &path, const std::function<Status(int fd)> &write) {
  PTC_RETURN_IF_ERROR(checkOutputPath(path, "output"));
  std::string pattern = path + ".tmp.XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0)
    return error(StatusCode::kDataLoss, "cannot create a temporary beside '", path, "': ",
                 std::strerror(errno));
  std::string tmp(name.data());
  auto failWith = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  if (Status s = write(fd); !s.isOk())
    return failWith(s);
  if (::fsync(fd) != 0)
    return failWith(error(StatusCode::kDataLoss, "cannot sync '", tmp, "': ", std::strerror(errno)));
  if (::fchmod(fd, 0644) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return error(StatusCode::kDataLoss, "cannot finish '", tmp, "': ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return error(StatusCode::kDataLoss, "cannot rename '", tmp, "' to '", path, "': ",
                 std::strerror(errno));
  }
  // The rename is durable once the directory is.
  int dir = ::open(directoryOf(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return Status::ok();
}

} // namespace ptc
