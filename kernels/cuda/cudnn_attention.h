// Causal attention on the GPU's tensor cores through cuDNN's fused
// scaled-dot-product attention (flash attention: the seq x seq scores never
// reach device memory), forward and backward, in bf16 and f16 with f32
// softmax statistics. The graphs are built with cuDNN's backend (graph) API as
// the pattern its fused-attention engines match (matmul, scale, causal mask,
// softmax with its log-sum-exp, matmul; the backward's five products), once
// per problem (sizes, element type, strides) and cached for the process.
//
// Tensors are strided [batch, heads, seq, dim] views with the head dimension
// contiguous, so every ptc layout is read in place: per-head [batch, heads,
// seq, dim], seq-major [batch, seq, heads, dim], and the fused projection's
// column blocks of [batch, seq, (heads + 2 kvHeads) * dim]. Grouped-query
// attention (kvHeads dividing heads) is cuDNN's own.
//
// Why a pattern of primitive ops and not the one-node SDPA operation
// (CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR): in cuDNN 9.19 that node takes
// no mask (score-modifier subgraphs, which carry the causal mask, come with
// 9.21 in cuDNN's frontend).
//
// The backward pass runs cuDNN's deterministic algorithm (the dP workspace
// variant, with no float atomics; engines noted non-deterministic are passed
// over), so a step is bitwise repeatable; it needs cuDNN 9.18.1 or later.
//
// Used by attention.cu's entries; host code only (no device code here).
#ifndef PTC_KERNELS_CUDA_CUDNN_ATTENTION_H
#define PTC_KERNELS_CUDA_CUDNN_ATTENTION_H

#include "kernels/common/error.h"
#include "kernels/common/types.h"

#include <cstdint>
#include <string>

namespace ptc::kernels::cuda::cudnn {

/// Element strides of a [batch, heads, seq, dim] view (the dim's is 1).
struct HeadStrides {
  int64_t batch, head, seq;
};

/// One attention problem: causal (top-left: a query sees the keys at or before
/// its own position), or with every key visible (a block of ring attention off
/// the diagonal). The gradients dq, dk, dv have the strides of q, k, v; the
/// incoming gradient those of o.
struct AttentionProblem {
  FloatType type;
  int64_t batch, heads, kvHeads, seq, dim;
  HeadStrides q, k, v, o;
  bool causal = true;
};

/// "cuDNN 9.19.0 fused attention" or why cuDNN cannot be used at all.
std::string libraryDescription();

/// Empty when cuDNN runs `p` forward (and backward, with `backward`); else why
/// not. Builds and caches the execution plans on first use (a plan load
/// calls it for every attention instruction).
std::string supports(const AttentionProblem &p, bool backward);

/// Device bytes of scratch forward() / backward() need: the workspace, the
/// row statistics unless `stats` are given (the plan's tensor), and for a
/// backward without them the recomputed forward output.
int64_t forwardScratchBytes(const AttentionProblem &p, bool stats);
int64_t backwardScratchBytes(const AttentionProblem &p, bool stats);

/// o = softmax(scale q k^T, causal) v; the rows' log-sum-exp (f32 [batch,
/// heads, seq]) goes to `stats`, or to scratch when it is null.
KernelResult forward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                     void *o, float *stats, float scale, void *scratch, void *stream);

/// dq, dk, dv from q, k, v and the incoming gradient `g`, given the forward's
/// output `o` (the strides of p.o) and its row statistics `stats`: cuDNN's
/// deterministic backward pass alone. Without them (null), the forward pass
/// is recomputed into scratch first.
KernelResult backward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                      const void *o, const float *stats, const void *g, void *dq, void *dk,
                      void *dv, float scale, void *scratch, void *stream);

} // namespace ptc::kernels::cuda::cudnn

#endif // PTC_KERNELS_CUDA_CUDNN_ATTENTION_H
