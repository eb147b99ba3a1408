// CPU kernels (f32, bf16 matmuls; i32 ids). The runtime reaches them through
// kernelTable(): one entry per op kind and kernel piece, added by each family
// file (arithmetic.cc, elementwise.cc, matmul.cc, normalization.cc,
// attention.cc, attention_blocks.cc, embedding_loss.cc, layout.cc,
// reduction.cc, moe.cc, optimizer.cc). Declared below besides the table: what
// other code calls directly — host conversions and box copies, the matmul,
// attention and AdamW the planner calibrates and benchmarks time — and the
// functions behind the entries that the unit tests compare with naive
// references.
// Shapes come verified from the plan loader; kernels that read ids check their
// range and report bad ids through a KernelResult. Matmuls go through oneDNN;
// the rest are OpenMP loops written to vectorize.
#ifndef PTC_KERNELS_CPU_KERNELS_H
#define PTC_KERNELS_CPU_KERNELS_H

#include "kernels/common/elementwise.h"
#include "kernels/common/kernel_call.h"
#include "kernels/common/error.h"
#include "kernels/common/types.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ptc::kernels::cpu {

using kernels::bf16ToF32;
using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::f32ToBf16;
using kernels::FloatType;
using kernels::KernelResult;
using kernels::Shape;
using kernels::UnaryFunction;

/// Every CPU kernel by op kind.
const KernelTable &kernelTable();
void addArithmeticKernels(KernelTable &t);
void addElementwiseKernels(KernelTable &t);
void addMatmulKernels(KernelTable &t);
void addNormalizationKernels(KernelTable &t);
void addAttentionKernels(KernelTable &t);
void addEmbeddingAndLossKernels(KernelTable &t);
void addLayoutKernels(KernelTable &t);
void addReductionKernels(KernelTable &t);
void addMoeKernels(KernelTable &t);
void addAttentionBlockKernels(KernelTable &t);
void addOptimizerKernels(KernelTable &t);

void binary(BinaryOp kind, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os);
void scale(const float *in, float *out, int64_t n, float factor);
/// The activation `fn` and its gradient (elementwise.cc).
void unary(UnaryFunction fn, const float *in, float *out, int64_t n);
void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n);
void copy(const void *in, void *out, int64_t bytes);

/// Converts n elements (round to nearest even when narrowing).
void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n);

/// out[..., m, n] = op(a)[..., m, k] op(b)[..., k, n] (+ bias[n], if not
/// null, on every row); b is rank 2 (shared) or batched like a.
void matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
            bool transA, bool transB, const float *bias = nullptr);

/// The library of the f32 matmuls (and of the low-precision ones widened to
/// f32): oneDNN's or OpenBLAS's sgemm, called on each thread's block of the
/// product; or Mixed: oneDNN's for the products A B^T (B transposed, A not:
/// a linear layer's forward), OpenBLAS's for the others (the gradients). A
/// product's library depends only on its transposes, never on its shape or
/// the thread count.
enum class F32Gemm { OneDnn, OpenBlas, Mixed };
/// Whether this build has the library (OpenBLAS and Mixed: PTC_WITH_OPENBLAS).
bool f32GemmBuilt(F32Gemm library);
/// This CPU's fastest choice as measured: oneDNN where its sgemm has AVX-512
/// kernels (as it dispatches, ONEDNN_MAX_CPU_ISA included), Mixed where
/// oneDNN would run its AVX2 sgemm (where OpenBLAS is built).
F32Gemm defaultF32Gemm();
/// The choice in use: PTC_CPU_GEMM (auto, onednn, openblas or mixed) where it
/// names one, else defaultF32Gemm; read at the first matmul and fixed for the
/// process (a run's numbers do not change between steps), except by
/// setF32Gemm (tests and benchmarks, between products; a choice not built
/// is ignored).
F32Gemm f32Gemm();
/// The library (OneDnn or OpenBlas) that runs a product with these
/// transposes under `choice`.
F32Gemm f32GemmLibraryOf(F32Gemm choice, bool transA, bool transB);
void setF32Gemm(F32Gemm library);
const char *f32GemmName(F32Gemm library);
/// What is wrong with PTC_CPU_GEMM's value, or "" (unset or valid): the CPU
/// device refuses to start on it.
std::string f32GemmEnvironmentError();

/// The same on bf16 / f16 operands and result, f32 accumulation (oneDNN's
/// matmul primitive, one per shape, created at its first use (the Matmul
/// entry's `accepts`, which the executor asks at load) and kept); `bias`, if
/// not null, a vector of n values of the same type added to every row in the
/// accumulator. Returns false, computing nothing, where oneDNN has no JIT
/// implementation of it for this CPU (the caller then widens the operands to
/// f32).
bool matmulLowPrecision(FloatType type, const void *a, const Shape &as, const void *b,
                        const Shape &bs, void *out, bool transA, bool transB,
                        const void *bias = nullptr);

/// Whether this CPU computes bf16 natively (AVX512-BF16, AMX), as oneDNN
/// dispatches: ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 turns it off for
/// ptc's own bf16 kernels too (attention), so one setting tests the fallbacks.
bool nativeBf16();

/// The oneDNN implementation matmulLowPrecision uses for this type on this
/// CPU (e.g. "brg:avx512_core_bf16"), or "" where it has none.
std::string lowPrecisionMatmulImplementation(FloatType type);

/// Rotary embedding of x [batch, heads, seq, dim] (rotate_half pairs i, i + dim/2;
/// position = index along seq); `inverse` rotates back (the gradient).
/// Positions start at `first` (a device's block of a sequence split over context parallelism).
void rotary(const float *x, float *out, const Shape &shape, double theta, bool inverse,
            int64_t first = 0);

/// Ring attention's blocks (context parallelism): queries [batch, heads, sq,
/// d] against keys / values [batch, kvHeads, keys, d], accumulated by the
/// online-softmax rule into acc and the rows' running max and sum; with
/// `causal` the blocks hold the same positions. With `firstKey` ([batch, sq]:
/// packed documents), query row i of batch entry b sees the block's keys from
/// firstKey[b * sq + i] on (none when it is `keys` or more).
void attentionBlock(const float *q, const float *k, const float *v, const Shape &qShape,
                    int64_t kvHeads, int64_t keys, double scale, bool causal, float *acc,
                    float *rowMax, float *rowSum, const int32_t *firstKey = nullptr);
/// Its gradient given the rows' log-sum-exp and the output: adds to dq and to
/// the block's dk, dv.
void attentionBlockGrad(const float *q, const float *k, const float *v, const float *o,
                        const float *g, const float *lse, const Shape &qShape, int64_t kvHeads,
                        int64_t keys, double scale, bool causal, float *dq, float *dk, float *dv,
                        const int32_t *firstKey = nullptr);

/// q, out: [batch, heads, seq, dim]; k, v: [batch, kvHeads, seq, dim] with
/// kvHeads dividing heads (query head h uses kv head h / (heads / kvHeads));
/// causal; no seq x seq buffer. dk, dv sum over the query heads of a kv head.
/// `shape` is the query's [batch, heads, seq, dim]; with `seqMajor` every
/// tensor is stored [batch, seq, heads (kvHeads), dim] instead (the heads read
/// and written in place, strided; the same numbers). A nonzero `qkvStride`
/// (seq-major only) is the distance between positions of q, k, v, dq, dk and
/// dv: column blocks of one fused projection [batch, seq, qkvStride] (out and
/// g stay [batch, seq, heads, dim]).
/// With `positions` ([batch, seq], each token's position in its document;
/// checkDocumentPositions first), query i attends keys i - positions[i] .. i
/// only (packed documents); the keys before a query block's earliest document
/// start are not computed.
/// With `lse` (f32 [batch, heads, seq]), the forward writes each query row's
/// log-sum-exp of its scaled scores there; the gradient given the forward's
/// result `out` (g's layout) and those statistics makes the probabilities
/// from them and takes rowsum(P dP) as g . out, instead of recomputing the
/// softmax.
void causalAttention(const float *q, const float *k, const float *v, float *out,
                     const Shape &shape, int64_t kvHeads, float scale, bool seqMajor = false,
                     int64_t qkvStride = 0, const int32_t *positions = nullptr,
                     float *lse = nullptr);
void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, const Shape &shape, int64_t kvHeads,
                         float scale, bool seqMajor = false, int64_t qkvStride = 0,
                         const int32_t *positions = nullptr, const float *out = nullptr,
                         const float *lse = nullptr);
/// An error unless 0 <= positions[b, i] <= i for every token.
KernelResult checkDocumentPositions(const int32_t *positions, int64_t batch, int64_t seq);
/// The same on bf16 storage (uint16_t bits): bf16 dot products with f32 sums
/// where the CPU has them (nativeBf16; the probabilities and the scores'
/// gradient rounded to bf16 for the products), else each head widened to f32;
/// each result rounded once.
void causalAttention(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out,
                     const Shape &shape, int64_t kvHeads, float scale, bool seqMajor = false,
                     int64_t qkvStride = 0, const int32_t *positions = nullptr,
                     float *lse = nullptr);
void causalAttentionGrad(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                         const uint16_t *g, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                         const Shape &shape, int64_t kvHeads, float scale, bool seqMajor = false,
                         int64_t qkvStride = 0, const int32_t *positions = nullptr,
                         const uint16_t *out = nullptr, const float *lse = nullptr);

/// Mean cross-entropy over `rows` rows of `classes` logits.
KernelResult crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                    float *loss);

void transpose(const void *in, const Shape &is, void *out, const std::vector<int64_t> &perm,
               int64_t elemBytes);
/// Copies the box of `small`'s shape at `offsets` of `big`, in either direction.
void sliceCopy(const void *big, const Shape &bigShape, void *small, const Shape &smallShape,
               const std::vector<int64_t> &offsets, int64_t elemBytes, bool toSmall);
/// Copies the box `box` at `srcOffsets` of `src` to `dstOffsets` of `dst`.
void copyBox(const void *src, const Shape &srcShape, const std::vector<int64_t> &srcOffsets,
             void *dst, const Shape &dstShape, const std::vector<int64_t> &dstOffsets,
             const Shape &box, int64_t elemBytes);
void concat(const std::vector<const void *> &ins, const std::vector<Shape> &shapes, void *out,
            int64_t axis, int64_t elemBytes);

void reduce(ReduceOp kind, const float *in, const Shape &is, const std::vector<int64_t> &axes,
            float *out);
/// A reduction of an f32 or bf16 view into `out` of its type (bf16: in f32,
/// rounded once): the ReduceSum / ReduceMean / ReduceMax kernels, and a
/// matmul's bias gradient.
void reduceInto(ReduceOp kind, const TensorView &in, const std::vector<int64_t> &axes,
                const TensorView &out);

/// Per group, the fraction of the tokens * k assignments routed to each
/// expert: out [groups, experts].
KernelResult expertLoad(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                        int64_t experts, float *out);
/// Routing groups: `groups` x `tokens` tokens, `capacity` slots per expert
/// per group, expert buffers [experts, groups, capacity, dim].
KernelResult moeDispatch(const float *x, const int32_t *indices, int64_t groups, int64_t tokens,
                         int64_t k, int64_t dim, int64_t experts, int64_t capacity, float *out);
KernelResult moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                        int64_t groups, int64_t tokens, int64_t k, int64_t dim, int64_t experts,
                        int64_t capacity, float *out);

struct AdamW {
  float lr, beta1, beta2, eps, weightDecay;
};
void adamwUpdate(const float *param, const float *grad, const float *m, const float *v, float step,
                 const AdamW &hp, int64_t n, float *outParam, float *outM, float *outV);
void sgdUpdate(const float *param, const float *grad, const float *buf, float lr, float momentum,
               float weightDecay, int64_t n, float *outParam, float *outBuf);
/// Sum of squares of every element of every tensor (for a norm spread over ranks).
double sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes);
/// Scales each tensor by min(1, maxNorm / (sqrt(sumSquares) + 1e-6)); returns the norm.
float clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                 const std::vector<float *> &outs, float maxNorm, double sumSquares);
/// Whether any element of the tensors (each of its own float type) is infinite or NaN: all
/// exponent bits set (f32 0x7f800000, bf16 0x7f80, f16 0x7c00), read from the stored bits.
bool anyNonfinite(const std::vector<const void *> &tensors, const std::vector<int64_t> &sizes,
                  const std::vector<FloatType> &types);

} // namespace ptc::kernels::cpu

#endif // PTC_KERNELS_CPU_KERNELS_H
