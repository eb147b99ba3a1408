// CUDA kernels: the GPU counterparts of kernels/cpu, reached through
// kernelTable() (one entry per op kind, added by each family file:
// elementwise.cu, normalization.cu, attention.cu, embedding_loss.cu,
// layout.cu, moe.cu, matmul.cu) with a LaunchContext as the call's backend;
// declared below besides the table: the primitives the device composes
// (conversions, box copies, the vocabulary-parallel loss, the optimizer).
// Work is enqueued on a CUDA stream (passed as void* so that callers need no
// CUDA headers). Math in f32 (matmuls: cuBLAS, f32 or bf16 inputs with f32
// accumulation). Kernels that check ids (embedding, targets, expert indices)
// record the first bad id in `err` (a device ErrorRecord) instead of failing:
// the device reports it at its next synchronize().
//
// Used by runtime/device/cuda_device.cc; checked against the CPU device by
// test/unit/DeviceTest.cpp (CudaConformance) on a machine with a GPU.
#ifndef PTC_KERNELS_CUDA_KERNELS_H
#define PTC_KERNELS_CUDA_KERNELS_H

#include "kernels/common/elementwise.h"
#include "kernels/common/kernel_call.h"
#include "kernels/common/types.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ptc::kernels::cuda {

using kernels::FloatType;
using kernels::Shape;
using kernels::UnaryFunction;

/// What a kernel found wrong, written once (the first error wins).
struct ErrorRecord {
  int kind;       // 0: none; ErrorKind otherwise
  int64_t id;     // the bad value
  int64_t where;  // its position
  int64_t limit;  // the valid range is [0, limit)
};
enum ErrorKind { kNoError = 0, kBadEmbeddingId = 1, kBadTarget = 2, kBadExpert = 3, kBadPosition = 4 };
/// "embedding index 70000 at position 12 is outside [0, 65536)".
std::string describe(const ErrorRecord &e);

/// What a kernel entry needs besides its call (KernelCall::backend).
struct LaunchContext {
  void *stream = nullptr; // cudaStream_t: the compute stream
  void *blas = nullptr;   // cublasHandle_t
  void *blasLt = nullptr; // cublasLtHandle_t (products with epilogues)
  bool allowTf32 = false; // f32 matmuls may use TF32 tensor cores
  ErrorRecord *err = nullptr;
  /// Device scratch of at least `bytes` for this call (stream-ordered
  /// reuse), or null when it cannot be had.
  void *(*scratch)(void *owner, int64_t bytes) = nullptr;
  /// A device copy of `bytes` bytes at `data` (host memory), uploaded once
  /// per distinct content and kept (a parameter group's descriptors, the
  /// same every step), or null when it cannot be had.
  const void *(*constants)(void *owner, const void *data, int64_t bytes) = nullptr;
  void *owner = nullptr;
};

/// Every CUDA kernel by op kind.
const KernelTable &kernelTable();
void addElementwiseKernels(KernelTable &t);
void addMatmulKernels(KernelTable &t);
void addNormalizationKernels(KernelTable &t);
void addAttentionKernels(KernelTable &t);
void addEmbeddingAndLossKernels(KernelTable &t);
void addLayoutKernels(KernelTable &t);
void addMoeKernels(KernelTable &t);
void addOptimizerKernels(KernelTable &t);

// ---- Primitives ----------------------------------------------------------------
void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream);

/// What runs bf16 / f16 attention: "cuDNN 9.19.0 fused attention", or why
/// cuDNN is unavailable (those calls then run widened on the f32 kernels).
std::string attentionLibrary();

/// The longest head dimension the attention kernels take.
constexpr int64_t kMaxAttentionDim = 256;

// ---- The vocabulary-parallel cross-entropy's pieces ---------------------------
/// Ring attention (context parallelism): one block of keys / values into the
/// queries' online softmax, and the block's gradient (kernels/cpu's
/// attentionBlock / attentionBlockGrad; q [batch, heads, sq, dim], k, v
/// [batch, kvHeads, keys, dim]; dq, dk, dv accumulate; firstKey: packed
/// documents' first visible key per query row, device memory, or null).
void attentionBlock(const float *q, const float *k, const float *v, int64_t batch,
                    int64_t heads, int64_t kvHeads, int64_t sq, int64_t keys, int64_t dim,
                    float scale, bool causal, float *acc, float *rowMax, float *rowSum,
                    void *stream, const int32_t *firstKey = nullptr);
void attentionBlockGrad(const float *q, const float *k, const float *v, const float *o,
                        const float *g, const float *lse, int64_t batch, int64_t heads,
                        int64_t kvHeads, int64_t sq, int64_t keys, int64_t dim, float scale,
                        bool causal, float *dq, float *dk, float *dv, void *stream,
                        const int32_t *firstKey = nullptr);
/// The vocabulary-parallel loss's mean from its rows' parts (the other pieces,
/// on f32, bf16 or f16 logits, are kernel-table entries only).
void lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                   float *loss, void *stream);

// ---- Layout -------------------------------------------------------------------
/// Copies the box `box` at `srcOffsets` of `src` to `dstOffsets` of `dst`.
void copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
             const Shape &dstShape, const Shape &dstOffsets, const Shape &box, int64_t elemBytes,
             void *stream);

// ---- Optimizer and gradient norms ---------------------------------------------
struct AdamW {
  float lr, beta1, beta2, eps, weightDecay;
};
/// `step` and `skip` (nullable) are device scalars; `grad` f32, bf16 or f16
/// (widened as read); `outCopy` (nullable) gets the new parameter rounded to
/// `copyType` (its working copy, ptc-keep-working-copies).
void adamwUpdate(const float *param, const void *grad, FloatType gradType, const float *m,
                 const float *v, const float *step, const AdamW &hp, int64_t n, const float *skip,
                 float *outParam, float *outM, float *outV, void *outCopy, FloatType copyType,
                 void *stream);
/// Multi-tensor AdamW: `table` (device memory) holds `count` descriptors;
/// one launch covers every element of every tensor.
struct AdamWTensor {
  const float *param;
  const void *grad; // f32, bf16 or f16 (gradType: a FloatType's value)
  const float *m, *v;
  float *outParam, *outM, *outV;
  int64_t n, offset; // offset: elements before this tensor (prefix sum)
  int64_t gradType;
  void *outCopy;     // the working copy (null: none), of copyType (a FloatType's value)
  int64_t copyType;
};
void adamwUpdateMany(const AdamWTensor *table, int count, int64_t total, const float *step,
                     const AdamW &hp, const float *skip, void *stream);
void sgdUpdate(const float *param, const void *grad, FloatType gradType, const float *buf,
               float lr, float momentum, float weightDecay, int64_t n, const float *skip,
               float *outParam, float *outBuf, void *outCopy, FloatType copyType, void *stream);
/// Multi-tensor SGD: as AdamW's, one launch over every tensor of a group.
struct SgdTensor {
  const float *param;
  const void *grad; // f32, bf16 or f16 (gradType: a FloatType's value)
  const float *buf;
  float *outParam, *outBuf;
  int64_t n, offset, gradType;
  void *outCopy; // the working copy (null: none), of copyType
  int64_t copyType;
};
void sgdUpdateMany(const SgdTensor *table, int count, int64_t total, float lr, float momentum,
                   float weightDecay, const float *skip, void *stream);
// Whole-gradient operations (the norm, clipping, unscaling, the non-finite
// check) run as one launch over every tensor of the call, from a descriptor
// table in device memory (uploaded once: the same every step), not a launch
// per tensor.
/// One tensor of an elementwise multi-tensor operation: `in` (f32, or for
/// anyNonfinite of `type`, a FloatType's value), `out` (f32, may alias `in`),
/// `offset`: elements before it (prefix sum).
struct TensorSpan {
  const void *in;
  float *out;
  int64_t n, offset, type;
};
/// One tensor of the sum of squares: its `blocks` partial sums (each block's
/// grid-stride share, as a launch of that many blocks over the tensor alone
/// would sum it) start at partial `first`.
struct SquaresSpan {
  const float *x;
  int64_t n, blocks, first;
};
/// The sum-of-squares table of these tensor sizes (pointers from `grads`;
/// empty tensors left out) and its partial count.
std::vector<SquaresSpan> squaresTable(const std::vector<const float *> &grads,
                                      const std::vector<int64_t> &sizes, int64_t &partials);
/// *out = the sum of squares over the tensors (device scalar) in a fixed
/// order (no atomics): `partials` holds the table's partial count of floats.
void sumOfSquares(const SquaresSpan *table, int count, int64_t partialCount, float *out,
                  float *partials, void *stream);
/// out = g * min(1, maxNorm / (sqrt(*sumSquares) + 1e-6)), then *norm = the norm.
void clipByNorm(const TensorSpan *table, int count, int64_t total, float maxNorm,
                const float *sumSquares, float *norm, void *stream);
/// out = g / *scale where finite (else 0, and *found = 1).
void unscale(const TensorSpan *table, int count, int64_t total, const float *scale,
             float *found, void *stream);
/// *found = 1 when any element of the tensors is not finite, else 0.
void anyNonfinite(const TensorSpan *table, int count, int64_t total, float *found, void *stream);

} // namespace ptc::kernels::cuda

#endif // PTC_KERNELS_CUDA_KERNELS_H
