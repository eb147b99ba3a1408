#include "runtime/exec/offload_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

namespace ptc {

StatusOr<std::unique_ptr<OffloadFile>> OffloadFile::create(const std::string &dir,
                                                           const std::string &name, int64_t bytes) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalidArgument("offload directory '", dir, "' does not exist (or is not a directory)");
  std::unique_ptr<OffloadFile> f(new OffloadFile());
  f->page_ = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  f->bytes_ = (bytes + f->page_ - 1) / f->page_ * f->page_;
  std::string path = dir + "/" + name;
  f->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (f->fd_ < 0)
    return invalidArgument("offload directory '", dir, "': cannot create '", name, "': ",
                           std::strerror(errno));
  ::unlink(path.c_str());
  if (int e = posix_fallocate(f->fd_, 0, f->bytes_); e != 0)
    return invalidArgument("offload directory '", dir, "' has no room for ", f->bytes_,
                           " bytes of master weights and optimizer state: ", std::strerror(e));
  void *p = mmap(nullptr, static_cast<size_t>(f->bytes_), PROT_READ | PROT_WRITE, MAP_SHARED,
                 f->fd_, 0);
  if (p == MAP_FAILED)
    return invalidArgument("offload directory '", dir, "': cannot map ", f->bytes_, " bytes: ",
                           std::strerror(errno));
  f->base_ = static_cast<uint8_t *>(p);
  f->thread_ = std::thread([raw = f.get()] { raw->worker(); });
  return f;
}

OffloadFile::~OffloadFile() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
  if (base_)
    munmap(base_, static_cast<size_t>(bytes_));
  if (fd_ >= 0)
    ::close(fd_);
}

std::pair<int64_t, int64_t> OffloadFile::pages(int64_t offset, int64_t length) const {
  int64_t begin = offset / page_ * page_;
  int64_t end = std::min(bytes_, (offset + length + page_ - 1) / page_ * page_);
  return {begin, end - begin};
}

void OffloadFile::prefetch(int64_t offset, int64_t length) {
  auto [begin, len] = pages(offset, length);
  if (len > 0)
    madvise(base_ + begin, static_cast<size_t>(len), MADV_WILLNEED);
}

void OffloadFile::release(int64_t offset, int64_t length) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(pages(offset, length));
  }
  cv_.notify_one();
}

void OffloadFile::drainTo(size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.size() + (busy_ ? 1 : 0) <= n; });
}

int64_t OffloadFile::residentBytes() {
  residency_.resize(static_cast<size_t>(bytes_ / page_));
  if (residency_.empty() || mincore(base_, static_cast<size_t>(bytes_), residency_.data()) != 0)
    return 0;
  int64_t pages = 0;
  for (unsigned char c : residency_)
    pages += c & 1;
  int64_t resident = pages * page_;
  peakResident_ = std::max(peakResident_, resident);
  return resident;
}

void OffloadFile::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_)
      return;
    auto [begin, len] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    if (len > 0) {
      // Dirty pages to the file, then out of the mapping and the page cache
      // (a page written again meanwhile stays: nothing is lost, a later
      // access faults it back in).
      msync(base_ + begin, static_cast<size_t>(len), MS_SYNC);
      madvise(base_ + begin, static_cast<size_t>(len), MADV_DONTNEED); // unmapped first,
      posix_fadvise(fd_, begin, len, POSIX_FADV_DONTNEED);            // then evictable
    }
    lock.lock();
    busy_ = false;
    idle_.notify_all();
  }
}

} // namespace ptc
