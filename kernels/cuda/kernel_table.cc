// The CUDA backend's kernel table: every family's entries.
#include "kernels/cuda/kernels.h"

namespace ptc::kernels::cuda {

const KernelTable &kernelTable() {
  static const KernelTable table = [] {
    KernelTable t;
    addElementwiseKernels(t);
    addMatmulKernels(t);
    addNormalizationKernels(t);
    addAttentionKernels(t);
    addEmbeddingAndLossKernels(t);
    addLayoutKernels(t);
    addMoeKernels(t);
    addOptimizerKernels(t);
    return t;
  }();
  return table;
}

} // namespace ptc::kernels::cuda
