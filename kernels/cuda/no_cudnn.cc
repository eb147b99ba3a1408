// cudnn_attention.h in a build without cuDNN: every low-precision attention
// call is refused, so the runtime widens it to the f32 CUDA kernels.

#include "kernels/cuda/cudnn_attention.h"

namespace ptc::kernels::cuda::cudnn {
namespace {
constexpr const char *kMissing = "this build has no cuDNN (CMake found no cudnn_graph.h / libcudnn)";
}

std::string libraryDescription() { return std::string("cuDNN unavailable: ") + kMissing; }
std::string supports(const AttentionProblem &, bool) { return kMissing; }
int64_t forwardScratchBytes(const AttentionProblem &, bool) { return 0; }
int64_t backwardScratchBytes(const AttentionProblem &, bool) { return 0; }
KernelResult forward(const AttentionProblem &, const void *, const void *, const void *, void *,
                     float *, float, void *, void *) {
  return KernelResult::error(kMissing);
}
KernelResult backward(const AttentionProblem &, const void *, const void *, const void *,
                      const void *, const float *, const void *, void *, void *, void *, float,
                      void *, void *) {
  return KernelResult::error(kMissing);
}

} // namespace ptc::kernels::cuda::cudnn
