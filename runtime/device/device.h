// Device: the memory, streams, events and kernels of one accelerator, as the
// executor sees them. Implementations: CpuDevice (host memory, the kernels of
// kernels/cpu: oneDNN + OpenMP; streams run in order on the calling thread)
// and CudaDevice (one GPU: cudaMalloc'd memory, a compute and a communication
// stream, CUDA events, cuBLAS + the kernels of kernels/cuda). A plan's
// instructions reach kernels through the backend's KernelTable with typed
// tensor views (launch); the few primitives below are what the executor
// composes itself (conversions, box copies, the vocabulary-parallel loss, the
// optimizer's updates). Pointers are this device's memory; shapes row-major.
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

struct AdamWParams {
  float lr, beta1, beta2, eps, weightDecay;
};

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

  // ---- Primitives the executor composes (f32 math; i32 ids) ----------------
  virtual Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                              int64_t n) = 0;
  /// Vocabulary-parallel cross-entropy pieces (classes [offset, offset +
  /// classes) of `total` here): row maxima, row sums of exp(x - max), target
  /// logits (0 where another device holds the target); then the mean loss
  /// from the combined pieces, and the gradient block.
  virtual Status rowMax(const float *logits, int64_t rows, int64_t classes, float *out) = 0;
  virtual Status rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max,
                           float *out) = 0;
  virtual Status targetLogit(const float *logits, const int32_t *targets, int64_t rows,
                             int64_t classes, int64_t offset, int64_t total, float *out) = 0;
  virtual Status lossFromParts(const float *max, const float *sumExp, const float *target,
                               int64_t rows, float *loss) = 0;
  virtual Status vocabParallelGrad(const float *logits, const int32_t *targets, const float *g,
                                   const float *max, const float *sumExp, int64_t rows,
                                   int64_t classes, int64_t offset, int64_t total,
                                   float *out) = 0;
  /// Ring attention (context parallelism): one block of keys / values
  /// accumulated into the queries' online softmax (acc, row max, row sum),
  /// and the block's gradient (see kernels/cpu/kernels.h); `firstKey`
  /// (device memory, [batch, sq], or null): packed documents' first key of
  /// the block each query row sees. Devices without them refuse ring
  /// attention.
  virtual Status attentionBlock(const float *q, const float *k, const float *v,
                                const Shape &qShape, int64_t kvHeads, int64_t keys, double scale,
                                bool causal, float *acc, float *rowMax, float *rowSum,
                                const int32_t *firstKey) {
    return error(StatusCode::kUnimplemented, "ring attention is not implemented on ", describe());
  }
  virtual Status attentionBlockGrad(const float *q, const float *k, const float *v,
                                    const float *o, const float *g, const float *lse,
                                    const Shape &qShape, int64_t kvHeads, int64_t keys,
                                    double scale, bool causal, float *dq, float *dk, float *dv,
                                    const int32_t *firstKey) {
    return error(StatusCode::kUnimplemented, "ring attention is not implemented on ", describe());
  }
  /// Copies the box `box` at `srcOffsets` of `src` to `dstOffsets` of `dst`
  /// (any element size).
  virtual Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets,
                         void *dst, const Shape &dstShape, const Shape &dstOffsets,
                         const Shape &box, int64_t elemBytes) = 0;
  // Optimizer. `skip` (device scalar or nullptr): when non-zero (an overflow
  // under dynamic loss scaling) the outputs get the inputs' values.
  virtual Status adamwUpdate(const float *param, const float *grad, const float *m,
                             const float *v, const float *step, const AdamWParams &hp, int64_t n,
                             const float *skip, float *outParam, float *outM, float *outV) = 0;
  /// Many AdamW updates with the same hyperparameters, step and skip flag
  /// (a plan's parameters, one instruction each) in one call: one kernel
  /// launch on a GPU (multi-tensor apply). Default: one adamwUpdate each.
  /// One tensor of a multi-tensor AdamW: f32 parameter and moments; the
  /// gradient f32, or bf16 / f16 (gradType) where the device reads it so
  /// (adamwReadsLowPrecisionGradients).
  struct AdamWTensor {
    const float *param;
    const void *grad;
    const float *m, *v;
    float *outParam, *outM, *outV;
    int64_t n;
    FloatType gradType = FloatType::F32;
  };
  /// Whether adamwUpdateMany takes bf16 / f16 gradients (widened as read).
  virtual bool adamwReadsLowPrecisionGradients() const { return false; }
  virtual Status adamwUpdateMany(const std::vector<AdamWTensor> &tensors, const float *step,
                                 const AdamWParams &hp, const float *skip) {
    for (const AdamWTensor &t : tensors) {
      if (t.gradType != FloatType::F32)
        return error(StatusCode::kInternal, "multi-tensor AdamW with a low-precision gradient on ",
                     describe(), ", which does not read them");
      PTC_RETURN_IF_ERROR(adamwUpdate(t.param, static_cast<const float *>(t.grad), t.m, t.v, step,
                                      hp, t.n, skip, t.outParam, t.outM, t.outV));
    }
    return Status::ok();
  }
  virtual Status sgdUpdate(const float *param, const float *grad, const float *buf, float lr,
                           float momentum, float weightDecay, int64_t n, const float *skip,
                           float *outParam, float *outBuf) = 0;
  /// Sum of squares of every element of every tensor, into *out (device scalar).
  virtual Status sumOfSquares(const std::vector<const float *> &grads,
                              const std::vector<int64_t> &sizes, float *out) = 0;
  /// outs[i] = grads[i] * min(1, maxNorm / (sqrt(*sumSquares) + 1e-6)); *norm = sqrt(*sumSquares).
  virtual Status clipByNorm(const std::vector<const float *> &grads,
                            const std::vector<int64_t> &sizes, const std::vector<float *> &outs,
                            float maxNorm, const float *sumSquares, float *norm) = 0;
  /// outs[i] = grads[i] / *scale, 0 where a gradient is not finite (so that an
  /// update computed from them and then discarded stays finite); *found = 1
  /// if any gradient is not finite, else 0.
  virtual Status unscale(const std::vector<const float *> &grads,
                         const std::vector<int64_t> &sizes, const std::vector<float *> &outs,
                         const float *scale, float *found) = 0;
  /// *found = 1 if any element of any tensor is not finite (inf, NaN), else
  /// 0; reads the tensors only, each in its own float type (`types`).
  virtual Status anyNonfinite(const std::vector<const void *> &tensors,
                              const std::vector<int64_t> &sizes,
                              const std::vector<FloatType> &types, float *found) = 0;
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
/// The CUDA device `ordinal` (e.g. the local rank modulo the GPUs present).
StatusOr<std::unique_ptr<Device>> createCudaDevice(int ordinal);
/// "cpu", "cuda" or "cpu-discrete"; "auto" means cuda when a GPU is visible,
/// else cpu.
StatusOr<std::unique_ptr<Device>> createDevice(const std::string &name, int localRank);

} // namespace ptc

#endif // PTC_RUNTIME_DEVICE_DEVICE_H
