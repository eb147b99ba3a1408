// CpuDevice: host memory and the kernels of kernels/cpu. Everything runs in
// order on the calling thread, so events are already complete when recorded.
#ifndef PTC_RUNTIME_DEVICE_CPU_DEVICE_H
#define PTC_RUNTIME_DEVICE_CPU_DEVICE_H

#include "runtime/device/device.h"

#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc {
namespace cpu_device_detail {

inline constexpr size_t kAlignment = 256;

/// A kernel's failure as the runtime's Status.
inline Status toStatus(const kernels::KernelResult &r) {
  return r.isOk() ? Status::ok() : invalidArgument(r.message());
}

} // namespace cpu_device_detail

/// The CPU device (not final: tests derive from it to observe stream and
/// event use).
class CpuDevice : public Device {

public:
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string describe() const override {
    const std::string gemm =
        std::string("f32 GEMMs: ") + kernels::cpu::f32GemmName(kernels::cpu::f32Gemm());
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    return "cpu (" + std::to_string(threads) + (threads == 1 ? " thread, " : " threads, ") + gemm + ")";
#else
    return "cpu (" + gemm + ")";
#endif
  }

  StatusOr<void *> allocate(int64_t bytes) override {
    size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + cpu_device_detail::kAlignment - 1) /
                  cpu_device_detail::kAlignment * cpu_device_detail::kAlignment;
    void *p = std::aligned_alloc(cpu_device_detail::kAlignment, size);
    if (!p)
      return error(StatusCode::kInternal, "cannot allocate ", bytes, " bytes of host memory");
    std::memset(p, 0, size);
    return p;
  }
  void release(void *p) override { std::free(p); }
  Status copy(void *dst, const void *src, int64_t bytes, CopyKind) override {
    if (bytes > 0 && dst != src)
      std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status::ok();
  }
  Status copyOn(StreamKind, void *dst, const void *src, int64_t bytes) override {
    return copy(dst, src, bytes, CopyKind::DeviceToDevice);
  }
  Status zero(void *p, int64_t bytes) override {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  StatusOr<Event> record(StreamKind) override { return Event{0}; }
  Status wait(StreamKind, Event) override { return Status::ok(); }
  // The work before a mark has run when it is taken: wall-clock time.
  StatusOr<Event> recordTimed(StreamKind) override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<Event>(marks_.size() - 1);
  }
  StatusOr<double> secondsBetween(Event from, Event to) override {
    if (from < 0 || to < 0 || static_cast<size_t>(std::max(from, to)) >= marks_.size())
      return error(StatusCode::kInternal, "unknown timed event ", std::max(from, to));
    return std::chrono::duration<double>(marks_[static_cast<size_t>(to)] -
                                         marks_[static_cast<size_t>(from)])
        .count();
  }
  void recycleEvents() override { marks_.clear(); }
  void *nativeStream(StreamKind) override { return nullptr; }

  const kernels::KernelTable &kernelTable() const override { return kernels::cpu::kernelTable(); }
  Status launch(kernels::KernelCall call) override {
    return cpu_device_detail::toStatus(kernels::cpu::kernelTable()[call.op].run(call));
  }
  std::string lowPrecisionMatmul(FloatType type) const override {
    std::string impl = kernels::cpu::lowPrecisionMatmulImplementation(type);
    return impl.empty() ? "" : "oneDNN " + impl;
  }
  Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                      int64_t n) override {
    kernels::cpu::convertFloat(in, from, out, to, n);
    return Status::ok();
  }
  Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
                 const Shape &dstShape, const Shape &dstOffsets, const Shape &box,
                 int64_t elemBytes) override {
    kernels::cpu::copyBox(src, srcShape, srcOffsets, dst, dstShape, dstOffsets, box, elemBytes);
    return Status::ok();
  }

private:
  std::vector<std::chrono::steady_clock::time_point> marks_; // recordTimed's
};

} // namespace ptc

#endif // PTC_RUNTIME_DEVICE_CPU_DEVICE_H
