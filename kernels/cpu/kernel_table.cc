// The CPU backend's kernel table: every family's entries.
#include "kernels/cpu/kernels.h"

namespace ptc::kernels::cpu {

const KernelTable &kernelTable() {
  static const KernelTable table = [] {
    KernelTable t;
    addArithmeticKernels(t);
    addElementwiseKernels(t);
    addMatmulKernels(t);
    addNormalizationKernels(t);
    addAttentionKernels(t);
    addEmbeddingAndLossKernels(t);
    addLayoutKernels(t);
    addReductionKernels(t);
    addMoeKernels(t);
    addAttentionBlockKernels(t);
    addOptimizerKernels(t);
    return t;
  }();
  return table;
}

} // namespace ptc::kernels::cpu
