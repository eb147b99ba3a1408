// DeviceBuffer, the CPU device and device selection.

#include "runtime/device/cpu_device.h"

namespace ptc {

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
  if (this != &o) {
    if (data_)
      device_->release(data_);
    device_ = o.device_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_)
    device_->release(data_);
}

Status DeviceBuffer::reserve(int64_t bytes) {
  if (bytes <= capacity_)
    return Status::ok();
  if (data_)
    device_->release(data_);
  data_ = nullptr;
  capacity_ = 0;
  auto p = device_->allocate(bytes);
  if (!p.isOk())
    return p.status();
  data_ = *p;
  capacity_ = bytes;
  return Status::ok();
}

std::unique_ptr<Device> createCpuDevice() { return std::make_unique<CpuDevice>(); }

namespace {
class DiscreteCpuDevice final : public CpuDevice {
public:
  bool hostAddressable() const override { return false; }
  std::string describe() const override { return CpuDevice::describe() + " as a discrete device"; }
};
} // namespace

std::unique_ptr<Device> createDiscreteCpuDevice() { return std::make_unique<DiscreteCpuDevice>(); }

// cuda_device.cc, or no_cuda.cc without the CUDA backend.
const kernels::KernelTable *cudaKernelTable();

const kernels::KernelTable *kernelTableOf(const std::string &backend) {
  if (backend == "cpu")
    return &kernels::cpu::kernelTable();
  return backend == "cuda" ? cudaKernelTable() : nullptr;
}

StatusOr<std::unique_ptr<Device>> createDevice(const std::string &name, int localRank) {
  // The CPU kernels' GEMM library (also the host's, for offloaded optimizers).
  if (std::string error = kernels::cpu::f32GemmEnvironmentError(); !error.empty())
    return invalidArgument(error);
  if (name == "cpu")
    return createCpuDevice();
  if (name == "cpu-discrete")
    return createDiscreteCpuDevice();
  if (name == "cuda" || (name == "auto" && cudaGpuAvailable())) {
    if (!cudaCompiledIn())
      return invalidArgument("--device cuda: this ptc-run was built without CUDA (nvcc was not "
                             "found at configure time)");
    return createCudaDevice(localRank);
  }
  if (name == "auto")
    return createCpuDevice();
  return invalidArgument("unknown device '", name, "' (expected cpu, cuda, auto or cpu-discrete)");
}

} // namespace ptc
