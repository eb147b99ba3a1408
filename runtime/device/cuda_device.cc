// CudaDevice: one GPU. Memory from cudaMalloc (the executor's arena is one
// allocation), a compute and a communication stream (non-blocking), events
// from a pool recycled at synchronize(), cuBLAS on the compute stream, the
// kernels of kernels/cuda. Kernels that find bad ids record them on the
// device; synchronize() reports the first one.
//
// Environment: PTC_CUDA_TF32=1 lets f32 matmuls use TF32 tensor cores (off by
// default: f32 plans then match the CPU to ~1e-6).

#include "runtime/device/device.h"

#include "kernels/cuda/kernels.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace ptc {
namespace {
namespace g = kernels::cuda;

Status cudaStatus(cudaError_t e, const std::string &what) {
  if (e == cudaSuccess)
    return Status::ok();
  return error(StatusCode::kInternal, what, ": CUDA error ", cudaGetErrorName(e), " (",
               cudaGetErrorString(e), ")");
}

class CudaDevice final : public Device {
public:
  static StatusOr<std::unique_ptr<Device>> create(int ordinal) {
    std::unique_ptr<CudaDevice> d(new CudaDevice());
    PTC_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(ordinal), "selecting GPU " + std::to_string(ordinal)));
    cudaDeviceProp prop{};
    PTC_RETURN_IF_ERROR(cudaStatus(cudaGetDeviceProperties(&prop, ordinal), "querying GPU"));
    char text[512];
    std::snprintf(text, sizeof text, "cuda:%d (%s, sm_%d%d, %.1f GiB)", ordinal, prop.name,
                  prop.major, prop.minor,
                  static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    d->name_ = text;
    // What runs bf16 / f16 attention (the run's first line names the device).
    d->attention_ = g::attentionLibrary();
    PTC_RETURN_IF_ERROR(cudaStatus(
        cudaStreamCreateWithFlags(&d->compute_, cudaStreamNonBlocking), "creating a stream"));
    PTC_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&d->comm_, cudaStreamNonBlocking),
                                   "creating a stream"));
    if (cublasCreate(&d->blas_) != CUBLAS_STATUS_SUCCESS)
      return error(StatusCode::kInternal, "cannot create a cuBLAS handle on ", d->name_);
    if (cublasLtCreate(&d->blasLt_) != CUBLAS_STATUS_SUCCESS)
      return error(StatusCode::kInternal, "cannot create a cuBLASLt handle on ", d->name_);
    // Split-k reductions of bf16 / f16 products in f32 (by default cuBLAS may
    // add the partial products in the output type, several bf16 roundings).
    cublasSetMathMode(d->blas_, static_cast<cublasMath_t>(
                                    CUBLAS_DEFAULT_MATH |
                                    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    void *err = nullptr;
    PTC_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&err, sizeof(g::ErrorRecord)), "allocating"));
    PTC_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(err, 0, sizeof(g::ErrorRecord), d->compute_),
                                   "clearing"));
    d->err_ = static_cast<g::ErrorRecord *>(err);
    const char *tf32 = std::getenv("PTC_CUDA_TF32");
    d->tf32_ = tf32 && std::strcmp(tf32, "1") == 0;
    return std::unique_ptr<Device>(std::move(d));
  }

  ~CudaDevice() override {
    cudaDeviceSynchronize();
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    for (cudaEvent_t e : timed_)
      cudaEventDestroy(e);
    for (void *p : {scratch_, static_cast<void *>(err_)})
      if (p)
        cudaFree(p);
    if (blas_)
      cublasDestroy(blas_);
    if (blasLt_)
      cublasLtDestroy(blasLt_);
    if (compute_)
      cudaStreamDestroy(compute_);
    if (comm_)
      cudaStreamDestroy(comm_);
  }

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string describe() const override { return name_ + "; attention: " + attention_; }

  StatusOr<void *> allocate(int64_t bytes) override {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) {
      cudaGetLastError(); // clear the sticky-free allocation error
      size_t freeBytes = 0, totalBytes = 0;
      cudaMemGetInfo(&freeBytes, &totalBytes);
      return error(StatusCode::kInternal, "cudaMalloc of ", bytes, " bytes failed on ", name_,
                   " (", freeBytes, " of ", totalBytes, " bytes free): ", cudaGetErrorString(e));
    }
    // On the compute stream: the streams are non-blocking, so a memset on the
    // legacy default stream would not be ordered before their kernels.
    PTC_RETURN_IF_ERROR(cudaStatus(
        cudaMemsetAsync(p, 0, static_cast<size_t>(std::max<int64_t>(bytes, 1)), compute_),
        "clearing"));
    return p;
  }
  void release(void *p) override { cudaFree(p); }
  Status pinHostMemory(void *p, int64_t bytes) override {
    return cudaStatus(cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault),
                      "page-locking " + std::to_string(bytes) + " bytes of host memory");
  }
  void unpinHostMemory(void *p) override { cudaHostUnregister(p); }

  Status copy(void *dst, const void *src, int64_t bytes, CopyKind kind) override {
    if (bytes <= 0 || dst == src)
      return Status::ok();
    cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                       : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                        : cudaMemcpyDeviceToDevice;
    PTC_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), k, compute_),
                                   "copying " + std::to_string(bytes) + " bytes"));
    if (kind == CopyKind::DeviceToDevice)
      return Status::ok();
    // The host buffer is the caller's: done before returning.
    return cudaStatus(cudaStreamSynchronize(compute_), "copying to or from the host");
  }
  Status copyOn(StreamKind stream, void *dst, const void *src, int64_t bytes) override {
    if (dst == src)
      return Status::ok();
    return copyAsync(stream, dst, src, bytes, cudaMemcpyDeviceToDevice, "on a stream");
  }
  Status copyToDeviceOn(StreamKind stream, void *dst, const void *src, int64_t bytes) override {
    return copyAsync(stream, dst, src, bytes, cudaMemcpyHostToDevice, "to the device on a stream");
  }
  Status copyToHostOn(StreamKind stream, void *dst, const void *src, int64_t bytes) override {
    return copyAsync(stream, dst, src, bytes, cudaMemcpyDeviceToHost, "to the host on a stream");
  }
  Status zero(void *p, int64_t bytes) override {
    return cudaStatus(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), compute_), "clearing");
  }

  Status synchronize() override {
    PTC_RETURN_IF_ERROR(cudaStatus(cudaDeviceSynchronize(), "running kernels on " + name_));
    g::ErrorRecord rec{};
    PTC_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpy(&rec, err_, sizeof rec, cudaMemcpyDeviceToHost), "reading errors"));
    if (rec.kind == g::kNoError)
      return Status::ok();
    cudaMemsetAsync(err_, 0, sizeof rec, compute_);
    return invalidArgument(g::describe(rec));
  }

  StatusOr<Event> record(StreamKind stream) override {
    if (nextEvent_ == events_.size()) {
      cudaEvent_t e;
      PTC_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                     "creating an event"));
      events_.push_back(e);
    }
    Event id = static_cast<Event>(nextEvent_++);
    PTC_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(events_[static_cast<size_t>(id)], streamOf(stream)),
                                   "recording an event"));
    return id;
  }
  Status wait(StreamKind stream, Event event) override {
    if (event < 0 || static_cast<size_t>(event) >= events_.size())
      return error(StatusCode::kInternal, "unknown event ", event);
    return cudaStatus(cudaStreamWaitEvent(streamOf(stream), events_[static_cast<size_t>(event)], 0),
                      "waiting for an event");
  }
  StatusOr<Event> recordTimed(StreamKind stream) override {
    if (nextTimed_ == timed_.size()) {
      cudaEvent_t e;
      PTC_RETURN_IF_ERROR(cudaStatus(cudaEventCreate(&e), "creating a timed event"));
      timed_.push_back(e);
    }
    Event id = static_cast<Event>(nextTimed_++);
    PTC_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(timed_[static_cast<size_t>(id)], streamOf(stream)),
                                   "recording a timed event"));
    return id;
  }
  StatusOr<double> secondsBetween(Event from, Event to) override {
    if (from < 0 || to < 0 || static_cast<size_t>(std::max(from, to)) >= nextTimed_)
      return error(StatusCode::kInternal, "unknown timed event ", std::max(from, to));
    float ms = 0.0f;
    PTC_RETURN_IF_ERROR(cudaStatus(cudaEventElapsedTime(&ms, timed_[static_cast<size_t>(from)],
                                                        timed_[static_cast<size_t>(to)]),
                                   "timing between events"));
    return static_cast<double>(ms) * 1e-3;
  }
  void recycleEvents() override {
    nextEvent_ = 0;
    nextTimed_ = 0;
  }
  void *nativeStream(StreamKind stream) override { return streamOf(stream); }

  // ---- Kernels ------------------------------------------------------------------
  const kernels::KernelTable &kernelTable() const override { return g::kernelTable(); }
  Status launch(kernels::KernelCall call) override {
    g::LaunchContext ctx = launchContext();
    call.backend = &ctx;
    return finish(call.op, g::kernelTable()[call.op].run(call));
  }
  Status launchBatch(kernels::KernelCall *calls, size_t count) override {
    if (count == 0)
      return Status::ok();
    const kernels::KernelEntry &entry = g::kernelTable()[calls[0].op];
    if (!entry.runBatch)
      return Device::launchBatch(calls, count);
    g::LaunchContext ctx = launchContext();
    for (size_t i = 0; i < count; ++i)
      calls[i].backend = &ctx;
    return finish(calls[0].op, entry.runBatch(calls, count));
  }
  std::string lowPrecisionMatmul(FloatType type) const override { return "cuBLAS"; }
  Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                      int64_t n) override {
    g::convertFloat(in, from, out, to, n, compute_);
    return launched("a float conversion");
  }
  Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
                 const Shape &dstShape, const Shape &dstOffsets, const Shape &box,
                 int64_t elemBytes) override {
    PTC_RETURN_IF_ERROR(checkRank(box, "a slice copy"));
    g::copyBox(src, srcShape, srcOffsets, dst, dstShape, dstOffsets, box, elemBytes, compute_);
    return launched("a slice copy");
  }

private:
  CudaDevice() = default;
  g::LaunchContext launchContext() {
    g::LaunchContext ctx;
    ctx.stream = compute_;
    ctx.blas = blas_;
    ctx.blasLt = blasLt_;
    ctx.allowTf32 = tf32_;
    ctx.err = err_;
    ctx.scratch = [](void *owner, int64_t bytes) -> void * {
      auto *self = static_cast<CudaDevice *>(owner);
      return self->reserveScratch(bytes).isOk() ? self->scratch_ : nullptr;
    };
    ctx.constants = [](void *owner, const void *data, int64_t bytes) -> const void * {
      return static_cast<CudaDevice *>(owner)->constantCopy(data, bytes);
    };
    ctx.owner = this;
    return ctx;
  }
  Status finish(kernels::OpKind op, const kernels::KernelResult &r) {
    if (!r.isOk())
      return error(StatusCode::kInternal, kernels::opKindName(op), " on ", name_, ": ",
                   r.message());
    return launched(kernels::opKindName(op));
  }
  /// The device copy of `bytes` host bytes, uploaded on first use of that
  /// content (a parameter group's descriptors are the same every step).
  const void *constantCopy(const void *data, int64_t bytes) {
    std::string key(static_cast<const char *>(data), static_cast<size_t>(bytes));
    auto it = constants_.find(key);
    if (it == constants_.end()) {
      DeviceBuffer buf(this);
      if (!buf.reserve(bytes).isOk() ||
          !copy(buf.data(), key.data(), bytes, CopyKind::HostToDevice).isOk())
        return nullptr;
      it = constants_.emplace(std::move(key), std::move(buf)).first;
    }
    return it->second.data();
  }
  /// A copy enqueued on `stream` that may still run when this returns.
  Status copyAsync(StreamKind stream, void *dst, const void *src, int64_t bytes,
                   cudaMemcpyKind kind, const char *what) {
    if (bytes <= 0)
      return Status::ok();
    return cudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, streamOf(stream)),
                      "copying " + std::to_string(bytes) + " bytes " + what);
  }
  cudaStream_t streamOf(StreamKind s) const {
    return s == StreamKind::Compute ? compute_ : comm_;
  }
  Status launched(const char *what) {
    return cudaStatus(cudaGetLastError(), std::string("launching ") + what + " on " + name_);
  }
  static Status checkRank(const Shape &s, const char *what) {
    if (s.size() > 8)
      return error(StatusCode::kUnimplemented, what, " on a rank-", s.size(),
                   " tensor (the CUDA kernels take rank <= 8)");
    return Status::ok();
  }
  int64_t scratchBytes() const override { return scratchBytes_; }
  /// Scratch memory for one kernel at a time (stream-ordered reuse).
  Status reserveScratch(int64_t bytes) {
    if (bytes <= scratchBytes_)
      return Status::ok();
    // The previous scratch may still be in use by queued kernels.
    PTC_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(compute_), "growing scratch"));
    if (scratch_)
      cudaFree(scratch_);
    scratch_ = nullptr;
    scratchBytes_ = 0;
    PTC_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&scratch_, static_cast<size_t>(bytes)),
                                   "allocating " + std::to_string(bytes) + " bytes of scratch"));
    scratchBytes_ = bytes;
    return Status::ok();
  }
  std::string name_, attention_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t blasLt_ = nullptr;
  g::ErrorRecord *err_ = nullptr;
  std::vector<cudaEvent_t> events_;
  size_t nextEvent_ = 0;
  std::vector<cudaEvent_t> timed_; // recordTimed's (with timing), recycled with the events
  size_t nextTimed_ = 0;
  void *scratch_ = nullptr;
  int64_t scratchBytes_ = 0;
  std::map<std::string, DeviceBuffer> constants_; // constantCopy's uploads by content
  bool tf32_ = false;
};
} // namespace

bool cudaCompiledIn() { return true; }
const kernels::KernelTable *cudaKernelTable() { return &g::kernelTable(); }

bool cudaGpuAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

StatusOr<std::unique_ptr<Device>> createCudaDevice(int localRank) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
    // No NVIDIA driver (CUDA reports it as an "insufficient" one) or no GPU:
    // say so plainly, with CUDA's words after.
    return invalidArgument("--device cuda: no usable GPU: ",
                           e == cudaErrorNoDevice ? "no CUDA device is visible"
                                                  : "no NVIDIA driver, or one older than this "
                                                    "build's CUDA runtime, is loaded",
                           " (CUDA: ", cudaGetErrorString(e), "); use --device cpu");
  if (e != cudaSuccess || count == 0)
    return invalidArgument("--device cuda: no usable GPU (",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no devices",
                           "); use --device cpu");
  return CudaDevice::create(localRank % count);
}

} // namespace ptc
