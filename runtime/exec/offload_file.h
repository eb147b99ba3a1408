// NVMe offload (ZeRO-Infinity's idea): the host-resident model state of an
// offload=optimizer plan (fp32 master weights, optimizer state) kept in a
// file under a directory on fast storage instead of host memory. The file is
// mapped (MAP_SHARED); the executor asks for a tensor's bytes ahead of its use
// (madvise WILLNEED: the kernel reads them in asynchronously) and releases
// them after it (a background thread writes the dirty pages back with msync,
// then drops them from the page cache and the mapping), so host memory holds
// only the tensors in use and those being read or written.
#ifndef PTC_RUNTIME_EXEC_OFFLOAD_FILE_H
#define PTC_RUNTIME_EXEC_OFFLOAD_FILE_H

#include "runtime/base/status.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ptc {

class OffloadFile {
public:
  /// Creates `dir`/`name` of `bytes` (allocated up front: a directory
  /// without room is an error now, not a crash later), maps it and unlinks
  /// it (it lives as long as the mapping: nothing is left behind).
  static StatusOr<std::unique_ptr<OffloadFile>> create(const std::string &dir,
                                                       const std::string &name, int64_t bytes);
  ~OffloadFile();
  uint8_t *data() const { return base_; }
  int64_t bytes() const { return bytes_; }
  /// Starts reading [offset, offset + length) in (asynchronously).
  void prefetch(int64_t offset, int64_t length);
  /// Queues [offset, offset + length) to be written back and dropped from
  /// memory (the data stays in the file; a later access reads it back).
  void release(int64_t offset, int64_t length);
  /// Waits until every queued release is done / until at most `n` are queued.
  void drain() { drainTo(0); }
  void drainTo(size_t n);
  /// Bytes of the file resident in host memory now (mincore over the whole
  /// mapping: a pass over its pages, so the executor calls it only when asked
  /// to measure), and the most seen by this call so far.
  int64_t residentBytes();
  int64_t peakResidentBytes() const { return peakResident_; }

private:
  OffloadFile() = default;
  void worker();
  std::pair<int64_t, int64_t> pages(int64_t offset, int64_t length) const;
  int fd_ = -1;
  uint8_t *base_ = nullptr;
  int64_t bytes_ = 0, page_ = 4096;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::pair<int64_t, int64_t>> queue_;
  bool stop_ = false, busy_ = false;
  int64_t peakResident_ = 0;
  std::vector<unsigned char> residency_; // mincore's answer, one byte a page
  std::thread thread_;
};

} // namespace ptc

#endif // PTC_RUNTIME_EXEC_OFFLOAD_FILE_H
