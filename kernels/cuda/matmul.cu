// CUDA kernels: matmuls through cuBLAS (see kernels.h).

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/padded_product.h"

#include <cstdlib>
#include <optional>
#include <string>

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

/// Bytes of scratch the padded chunks (A' and C') may take: 128 MB, or
/// PTC_CUDA_PAD_CHUNK_BYTES (the conformance test makes chunks small to run
/// several).
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

/// The product, or what failed: cuBLAS's status, or the CUDA error of a
/// padded copy.
KernelResult matmul(void *cublasHandle, const void *a, const Shape &as, const void *b,
                    const Shape &bs, void *out, bool transA, bool transB, FloatType type,
                    bool allowTf32, void *stream, void *(*scratchFor)(void *owner, int64_t bytes),
                    void *owner) {
  const Product p = productOf(as, bs, transA, transB);
  auto h = static_cast<cublasHandle_t>(cublasHandle);
  cublasSetStream(h, S(stream));
  const cudaDataType_t dt = cudaTypeOf(type);
  const cublasComputeType_t ct = type == FloatType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                     : CUBLAS_COMPUTE_32F;
  // A 16-bit product with a size that is not a multiple of 8 (an LM head
  // over 50257 tokens) runs on zero-padded copies (padded_product.h), chunk
  // by chunk of C's rows within the scratch budget: cuBLAS's kernels for such
  // sizes run at 90-150 TFLOP/s on an H200 where aligned ones reach ~700.
  const int64_t elem = type == FloatType::F32 ? 4 : 2;
  std::optional<PaddedProduct> padded;
  if (type != FloatType::F32 && p.batch == 1 && scratchFor)
    padded = paddedProductFor(p.m, p.n, p.k, p.transA, p.transB, chunkBytes() / elem);
  auto direct = [&] {
    const int st = gemm(h, p, p.m, a, p.lda, b, out, p.n, dt, ct);
    return st == 0 ? KernelResult::ok()
                   : KernelResult::error("cuBLAS matmul failed with status ", st);
  };
  if (!padded)
    return direct();
  auto alignUp = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t bBytes = alignUp(padded->bElems * elem), aBytes = alignUp(padded->aElems * elem);
  char *work = static_cast<char *>(
      scratchFor(owner, bBytes + aBytes + padded->cElems * elem));
  if (!work) // no scratch: cuBLAS's slow kernels, still correct
    return direct();
  struct Ops {
    char *buffers[6];
    int64_t elem;
    cublasHandle_t h;
    cudaDataType_t dt;
    cublasComputeType_t ct;
    bool transA, transB;
    cudaStream_t stream;
    std::string error; // the first failure
    bool copied(cudaError_t e, const char *what) {
      if (e != cudaSuccess)
        error = std::string(what) + " a padded matmul operand: " + cudaGetErrorString(e);
      return e == cudaSuccess;
    }
    char *at(ProductBuffer b, int64_t offset) const {
      return buffers[static_cast<int>(b)] + offset * elem;
    }
    bool zero(ProductBuffer b, int64_t elems) {
      return elems <= 0 ||
             copied(cudaMemsetAsync(at(b, 0), 0, static_cast<size_t>(elems * elem), stream),
                    "clearing");
    }
    bool copy(ProductBuffer dst, int64_t dOff, int64_t dPitch, ProductBuffer src, int64_t sOff,
              int64_t sPitch, int64_t width, int64_t height) {
      return copied(cudaMemcpy2DAsync(at(dst, dOff), static_cast<size_t>(dPitch * elem),
                                      at(src, sOff), static_cast<size_t>(sPitch * elem),
                                      static_cast<size_t>(width * elem),
                                      static_cast<size_t>(height), cudaMemcpyDeviceToDevice, stream),
                    "copying");
    }
    bool gemm(const ProductChunk &c) {
      const float one = 1.0f, zero = 0.0f;
      const cublasStatus_t st = cublasGemmEx(
          h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
          static_cast<int>(c.gemmN), static_cast<int>(c.mc), static_cast<int>(c.gemmK), &one,
          at(c.b, 0), dt, static_cast<int>(c.ldb), at(c.a, c.aOffset), dt, static_cast<int>(c.lda),
          &zero, at(c.c, c.cOffset), dt, static_cast<int>(c.ldc), ct, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS)
        error = "cuBLAS matmul (a padded chunk of " + std::to_string(c.mc) + " x " +
                std::to_string(c.gemmN) + " x " + std::to_string(c.gemmK) +
                ") failed with status " + std::to_string(static_cast<int>(st));
      return st == CUBLAS_STATUS_SUCCESS;
    }
  } ops{{const_cast<char *>(static_cast<const char *>(a)),
         const_cast<char *>(static_cast<const char *>(b)), static_cast<char *>(out),
         work + bBytes, work, work + bBytes + aBytes},
        elem, h, dt, ct, p.transA, p.transB, S(stream)};
  runPaddedProduct(*padded, ops);
  return ops.error.empty() ? KernelResult::ok() : KernelResult::error(ops.error);
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
        if (KernelResult r = matmul(ctx.blas, a.data, *a.shape, b.data, *b.shape, out.data,
                                    c.integer(0) != 0, c.integer(1) != 0, type,
                                    type == FloatType::F32 && ctx.allowTf32, ctx.stream,
                                    ctx.scratch, ctx.owner);
            !r.isOk())
          return r;
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
