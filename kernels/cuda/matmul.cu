// CUDA kernels: matmuls through cuBLAS (see kernels.h).

#include "kernels/cuda/internal.cuh"

#include <cstdlib>

namespace ptc::kernels::cuda {
namespace {
/// out[i] += bias[i % n] for `count` elements of `type` (f32 math, narrow
/// results rounded to nearest even): a matmul's bias epilogue.
template <typename T>
__global__ void addBiasKernel(T *out, const T *bias, int64_t count, int64_t n) {
  PTC_GRID_LOOP(i, count) { out[i] = fromFloat<T>(toFloat(out[i]) + toFloat(bias[i % n])); }
}
} // namespace

namespace {
/// A row-major product C[m, n] = op(A) op(B) for cuBLAS (column-major: C^T =
/// op(B)^T op(A)^T), `batch` of them `strideA` / `strideB` / m * n apart.
struct Product {
  int64_t m, n, k, lda, ldb, batch, strideA, strideB;
  bool transA, transB;
};

Product productOf(const Shape &as, const Shape &bs, bool transA, bool transB) {
  const size_t r = as.size(), rb = bs.size();
  Product p{};
  p.transA = transA;
  p.transB = transB;
  p.m = transA ? as[r - 1] : as[r - 2];
  p.k = transA ? as[r - 2] : as[r - 1];
  p.n = transB ? bs[rb - 2] : bs[rb - 1];
  p.batch = 1;
  for (size_t d = 0; d + 2 < r; ++d)
    p.batch *= as[d];
  const bool shared = rb == 2;
  p.ldb = transB ? p.k : p.n;
  p.lda = transA ? p.m : p.k;
  p.strideA = p.m * p.k;
  p.strideB = shared ? 0 : p.k * p.n;
  if (shared && !transA) {
    // Every batch row shares B: one GEMM over batch * m rows.
    p.m *= p.batch;
    p.batch = 1;
    p.strideA = p.m * p.k;
  }
  return p;
}

cudaDataType_t cudaTypeOf(FloatType type) {
  return type == FloatType::BF16 ? CUDA_R_16BF : type == FloatType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

/// Rows of 16-bit elements are 16-byte aligned (what cuBLAS's tensor-core
/// kernels want of every leading dimension) when their length is a multiple of 8.
constexpr int64_t kAlignElements = 8;
bool aligned16(int64_t ld) { return ld % kAlignElements == 0; }
int64_t padded(int64_t ld) { return (ld + kAlignElements - 1) / kAlignElements * kAlignElements; }
/// Bytes of scratch a padded chunk may take: 128 MB, or PTC_CUDA_PAD_CHUNK_BYTES
/// (the conformance test makes chunks small to run several).
int64_t chunkBytes() {
  const char *v = std::getenv("PTC_CUDA_PAD_CHUNK_BYTES");
  const long long bytes = v ? std::atoll(v) : 0;
  return bytes > 0 ? bytes : int64_t{128} << 20;
}

int gemm(cublasHandle_t h, const Product &p, int64_t m, const void *a, int64_t lda, const void *b,
         void *c, int64_t ldc, cudaDataType_t dt, cublasComputeType_t ct) {
  const float one = 1.0f, zero = 0.0f;
  return static_cast<int>(cublasGemmStridedBatchedEx(
      h, p.transB ? CUBLAS_OP_T : CUBLAS_OP_N, p.transA ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(p.n), static_cast<int>(m), static_cast<int>(p.k), &one, b, dt,
      static_cast<int>(p.ldb), p.strideB, a, dt, static_cast<int>(lda), p.strideA, &zero, c, dt,
      static_cast<int>(ldc), m * p.n, static_cast<int>(p.batch), ct, CUBLAS_GEMM_DEFAULT));
}
} // namespace

int matmul(void *cublasHandle, const void *a, const Shape &as, const void *b, const Shape &bs,
           void *out, bool transA, bool transB, FloatType type, bool allowTf32, void *stream,
           void *(*scratchFor)(void *owner, int64_t bytes), void *owner) {
  const Product p = productOf(as, bs, transA, transB);
  auto h = static_cast<cublasHandle_t>(cublasHandle);
  cublasSetStream(h, S(stream));
  const cudaDataType_t dt = cudaTypeOf(type);
  const cublasComputeType_t ct = type == FloatType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                     : CUBLAS_COMPUTE_32F;
  // A 16-bit product whose A or C rows are not 16-byte aligned (a vocabulary
  // of 50257 in an LM head) runs on cuBLAS's slow kernels, 100-150 TFLOP/s
  // instead of ~700 on an H200. Such a product runs in chunks of C's rows,
  // each with the unaligned operand copied to rows of padded length in
  // scratch (and C's chunk copied out of it): a few hundred MB moved per
  // product against milliseconds of matrix time. Each chunk is a whole
  // product over k, so results are those of one GEMM (f32 accumulation, one
  // rounding). B must be aligned, the product unbatched.
  const int64_t elem = type == FloatType::F32 ? 4 : 2;
  const int64_t ldc = p.n;
  const bool padA = !aligned16(p.lda), padC = !aligned16(ldc);
  if (type == FloatType::F32 || p.batch != 1 || !aligned16(p.ldb) || !(padA || padC) ||
      !scratchFor)
    return gemm(h, p, p.m, a, p.lda, b, out, ldc, dt, ct);
  // Rows of C per chunk (a multiple of 8, so column blocks of a transposed A
  // start aligned), within the scratch budget.
  const int64_t rowBytes = (padA ? (p.transA ? p.k : padded(p.lda)) : 0) +
                           (padC ? padded(ldc) : 0);
  int64_t rows = std::max<int64_t>(chunkBytes() / (rowBytes * elem) / 8 * 8, 8);
  rows = std::min(rows, padded(p.m));
  const int64_t aChunk = padA ? (p.transA ? p.k * rows : rows * padded(p.lda)) : 0;
  const int64_t cChunk = padC ? rows * padded(ldc) : 0;
  char *work = static_cast<char *>(scratchFor(owner, (aChunk + cChunk) * elem));
  if (!work) // no scratch: the slow kernels, still correct
    return gemm(h, p, p.m, a, p.lda, b, out, ldc, dt, ct);
  char *aPad = work, *cPad = work + aChunk * elem;
  for (int64_t r0 = 0; r0 < p.m; r0 += rows) {
    const int64_t n = std::min(rows, p.m - r0);
    // This chunk's A: rows r0.. of A [m, k], or columns r0.. of A [k, m].
    const char *aPtr = static_cast<const char *>(a) + (p.transA ? r0 : r0 * p.lda) * elem;
    int64_t lda = p.lda;
    if (padA) {
      const int64_t width = p.transA ? n : p.k, height = p.transA ? p.k : n;
      lda = p.transA ? padded(n) : padded(p.lda);
      if (cudaMemcpy2DAsync(aPad, static_cast<size_t>(lda * elem), aPtr,
                            static_cast<size_t>(p.lda * elem), static_cast<size_t>(width * elem),
                            static_cast<size_t>(height), cudaMemcpyDeviceToDevice,
                            S(stream)) != cudaSuccess)
        return -1;
      aPtr = aPad;
    }
    char *cPtr = padC ? cPad : static_cast<char *>(out) + r0 * ldc * elem;
    const int64_t ldcChunk = padC ? padded(ldc) : ldc;
    if (int st = gemm(h, p, n, aPtr, lda, b, cPtr, ldcChunk, dt, ct); st != 0)
      return st;
    if (padC &&
        cudaMemcpy2DAsync(static_cast<char *>(out) + r0 * ldc * elem,
                          static_cast<size_t>(ldc * elem), cPad,
                          static_cast<size_t>(ldcChunk * elem), static_cast<size_t>(ldc * elem),
                          static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                          S(stream)) != cudaSuccess)
      return -1;
  }
  return 0;
}

void addMatmulKernels(KernelTable &t) {
  // f32 (TF32 tensor cores when allowed), or bf16 / f16 operands and result
  // with f32 accumulation; an optional bias (a third input) added to every
  // row after the product.
  auto accepts = [](const KernelCall &c) {
    const DType type = c.output(0).dtype;
    return c.input(0).dtype == type && c.input(1).dtype == type && type != DType::I32 &&
           (c.numInputs < 3 || c.input(2).dtype == type);
  };
  t.add(
      OpKind::Matmul,
      [](const KernelCall &c) {
        const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
        const LaunchContext &ctx = context(c);
        const FloatType type = floatTypeOf(out.dtype);
        int st = matmul(ctx.blas, a.data, *a.shape, b.data, *b.shape, out.data, c.integer(0) != 0,
                        c.integer(1) != 0, type, type == FloatType::F32 && ctx.allowTf32,
                        ctx.stream, ctx.scratch, ctx.owner);
        if (st != 0)
          return KernelResult::error("cuBLAS matmul failed with status ", st);
        if (c.numInputs >= 3 && out.elements > 0)
          withFloatType(out.dtype, [&](auto tag) {
            using T = decltype(tag);
            addBiasKernel<<<gridFor(out.elements), kThreads, 0, S(ctx.stream)>>>(
                static_cast<T *>(out.data), static_cast<const T *>(c.input(2).data), out.elements,
                out.shape->back());
            return 0;
          });
        return KernelResult::ok();
      },
      accepts);
}
} // namespace ptc::kernels::cuda
