// Device: the memory, streams, events and kernels of one accelerator, as the
// executor sees them. Implementations: CpuDevice (host memory, the kernels of
// kernels/cpu: oneDNN + OpenMP; streams run in order on the calling thread)
// and CudaDevice (one GPU: cudaMalloc'd memory, a compute and a communication
// stream, CUDA events, cuBLAS + the kernels of kernels/cuda). A plan's
// instructions reach kernels through the backend's KernelTable with typed
// tensor views (launch), and so do the pieces the executor composes some
// instructions from (kernels/common/kernel_call.h: the vocabulary-parallel
// loss, ring attention's blocks, the gradient norm); the device itself adds
// memory, streams, events and two memory primitives (conversions, box
// copies). Pointers are this device's memory; shapes row-major.
//
// Kernels are enqueued on the compute stream and may still be running when a
// call returns; copies to or from the host and synchronize() wait. A kernel
// that finds bad data (ids out of range) reports it through the Status of a
// later synchronize() on devices that run asynchronously.
#ifndef PTC_RUNTIME_DEVICE_DEVICE_H
#define PTC_RUNTIME_DEVICE_DEVICE_H

#include "runtime/base/status.h"

#include "kernels/common/elementwise.h"
#include "kernels/common/kernel_call.h"
#include "kernels/common/types.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

using Shape = kernels::Shape;
using FloatType = kernels::FloatType;
using kernels::UnaryFunction;

enum class DeviceKind { Cpu, Cuda };
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
enum class StreamKind { Compute, Communication };

/// An event recorded on a stream; another stream can wait for it. Owned by
/// the device (recycled by recycleEvents()).
using Event = int;

class Device {
public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  /// "cpu (2 threads)", "cuda:0 (NVIDIA H200, sm_90, 139.8 GiB)".
  virtual std::string describe() const = 0;
  /// Whether the host may read and write device pointers directly (no
  /// copies needed).
  virtual bool hostAddressable() const { return kind() == DeviceKind::Cpu; }

  // ---- Memory --------------------------------------------------------------
  /// `bytes` of zeroed memory aligned to 256 bytes (the arena is one such
  /// allocation, the tensors offsets into it).
  virtual StatusOr<void *> allocate(int64_t bytes) = 0;
  virtual void release(void *p) = 0;
  /// Copies ordered after the work enqueued on the compute stream; copies
  /// that involve the host return when done.
  virtual Status copy(void *dst, const void *src, int64_t bytes, CopyKind kind) = 0;
  /// A device-to-device copy enqueued on `stream`.
  virtual Status copyOn(StreamKind stream, void *dst, const void *src, int64_t bytes) = 0;
  /// A host-to-device copy from page-locked host memory (pinHostMemory)
  /// enqueued on `stream`: it may still run when the call returns, so the
  /// host must not change the source until the stream has passed it. Devices
  /// without asynchronous copies copy at once.
  virtual Status copyToDeviceOn(StreamKind stream, void *dst, const void *src, int64_t bytes) {
    return copy(dst, src, bytes, CopyKind::HostToDevice);
  }
  /// The same to page-locked host memory: the host reads the destination
  /// only after a synchronize().
  virtual Status copyToHostOn(StreamKind stream, void *dst, const void *src, int64_t bytes) {
    return copy(dst, src, bytes, CopyKind::DeviceToHost);
  }
  virtual Status zero(void *p, int64_t bytes) = 0;
  /// Page-locks host memory that copies to and from this device use often
  /// (the offloaded tensors), so they run at full bandwidth; a no-op where
  /// copies are plain memory copies. unpinHostMemory before freeing it.
  virtual Status pinHostMemory(void *p, int64_t bytes) { return Status::ok(); }
  virtual void unpinHostMemory(void *p) {}
  /// Waits for every stream; reports errors of earlier asynchronous work.
  virtual Status synchronize() = 0;

  // ---- Streams and events ----------------------------------------------------
  /// Records an event after the work enqueued so far on `stream`.
  virtual StatusOr<Event> record(StreamKind stream) = 0;
  /// Work enqueued later on `stream` waits for `event`.
  virtual Status wait(StreamKind stream, Event event) = 0;
  /// Every event recorded so far may be reused (after a synchronize(), when
  /// nothing waits on them any more: the executor's step end).
  virtual void recycleEvents() {}
  /// A timestamp taken on `stream` when the work enqueued before it has run
  /// (a profile's marks between instructions: no stream waits on one). Its
  /// own numbering; recycled with the events.
  virtual StatusOr<Event> recordTimed(StreamKind stream) = 0;
  /// Seconds from timed event `from` to `to`, once both are complete (after
  /// synchronize()).
  virtual StatusOr<double> secondsBetween(Event from, Event to) = 0;
  /// Native handle of a stream (cudaStream_t; nullptr on the CPU).
  virtual void *nativeStream(StreamKind stream) = 0;

  // ---- Kernels ----------------------------------------------------------------
  /// This backend's kernels by op kind (kernels/common/kernel_call.h): what
  /// each computes and in which element types.
  virtual const kernels::KernelTable &kernelTable() const = 0;
  /// Runs `call` with its kernelTable() entry, which must accept the call's
  /// element types: with this device's launch context, a failure (bad ids,
  /// an unsupported shape, a launch error) as a Status naming the op.
  virtual Status launch(kernels::KernelCall call) = 0;
  /// What this device's Matmul entry runs for bf16 / f16 operands
  /// ("cuBLAS", "oneDNN brg:avx512_core_bf16"), or "" where the executor
  /// widens them to f32.
  virtual std::string lowPrecisionMatmul(FloatType type) const { return ""; }
  /// Bytes of device memory the kernels hold as scratch beside the plan's
  /// tensors (a GPU's one buffer, grown to the largest request: cuDNN's
  /// workspaces, padded products); 0 where kernels use host temporaries.
  virtual int64_t scratchBytes() const { return 0; }

  /// Several calls of one op kind in one launch where the entry has a
  /// batched form that accepts them (KernelEntry::runBatch: a multi-tensor
  /// optimizer update), else one launch each.
  virtual Status launchBatch(kernels::KernelCall *calls, size_t count) {
    for (size_t i = 0; i < count; ++i)
      PTC_RETURN_IF_ERROR(launch(calls[i]));
    return Status::ok();
  }

  // ---- Memory primitives the executor composes ------------------------------
  virtual Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                              int64_t n) = 0;
  /// Copies the box `box` at `srcOffsets` of `src` to `dstOffsets` of `dst`
  /// (any element size).
  virtual Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets,
                         void *dst, const Shape &dstShape, const Shape &dstOffsets,
                         const Shape &box, int64_t elemBytes) = 0;
};

/// A growable block of device memory (collective staging, stash entries).
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(Device *device) : device_(device) {}
  DeviceBuffer(DeviceBuffer &&o) noexcept { *this = std::move(o); }
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer();
  /// Makes room for `bytes` (contents are not kept when it grows).
  Status reserve(int64_t bytes);
  void *data() const { return data_; }
  int64_t capacity() const { return capacity_; }

private:
  Device *device_ = nullptr;
  void *data_ = nullptr;
  int64_t capacity_ = 0;
};

/// The CPU device.
std::unique_ptr<Device> createCpuDevice();
/// The CPU device presented as a discrete device: the executor reaches its
/// memory only through copies, as on a GPU, so every staging path of the GPU
/// backend runs (and is tested) on any machine. `--device cpu-discrete`.
std::unique_ptr<Device> createDiscreteCpuDevice();
/// Whether this build has the CUDA backend, and whether a GPU is visible.
bool cudaCompiledIn();
bool cudaGpuAvailable();
/// A backend's kernel table by name ("cpu", "cuda"), with or without its
/// device (what ptc-run --kernel-coverage reads); null for "cuda" in a build
/// without the CUDA backend, or an unknown name.
const kernels::KernelTable *kernelTableOf(const std::string &backend);
/// The CUDA device `ordinal` (e.g. the local rank modulo the GPUs present).
StatusOr<std::unique_ptr<Device>> createCudaDevice(int ordinal);
/// "cpu", "cuda" or "cpu-discrete"; "auto" means cuda when a GPU is visible,
/// else cpu.
StatusOr<std::unique_ptr<Device>> createDevice(const std::string &name, int localRank);

} // namespace ptc

#endif // PTC_RUNTIME_DEVICE_DEVICE_H
