// Builds without the CUDA backend (no nvcc at configure time, or
// -DPTC_ENABLE_CUDA=OFF): the CPU is the only device.

#include "runtime/device/device.h"

namespace ptc {

bool cudaCompiledIn() { return false; }
const kernels::KernelTable *cudaKernelTable() { return nullptr; }
bool cudaGpuAvailable() { return false; }

StatusOr<std::unique_ptr<Device>> createCudaDevice(int) {
  return invalidArgument("this build has no CUDA backend (configured without nvcc or with "
                         "-DPTC_ENABLE_CUDA=OFF)");
}

} // namespace ptc
