// CUDA kernels: matmuls through cuBLAS (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
/// out[i] += bias[i % n] for `count` elements of `type` (f32 math, narrow
/// results rounded to nearest even): a matmul's bias epilogue.
template <typename T>
__global__ void addBiasKernel(T *out, const T *bias, int64_t count, int64_t n) {
  PTC_GRID_LOOP(i, count) { out[i] = fromFloat<T>(toFloat(out[i]) + toFloat(bias[i % n])); }
}
} // namespace

int matmul(void *cublasHandle, const void *a, const Shape &as, const void *b, const Shape &bs,
           void *out, bool transA, bool transB, FloatType type, bool allowTf32, void *stream) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < r; ++d)
    batch *= as[d];
  bool shared = rb == 2;
  auto h = static_cast<cublasHandle_t>(cublasHandle);
  cublasSetStream(h, S(stream));
  cudaDataType_t dt = type == FloatType::BF16 ? CUDA_R_16BF
                      : type == FloatType::F16 ? CUDA_R_16F
                                               : CUDA_R_32F;
  cublasComputeType_t ct = type == FloatType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                               : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ldb = static_cast<int>(transB ? k : n), lda = static_cast<int>(transA ? m : k);
  if (shared && !transA) {
    // Every batch row shares B: one GEMM over batch * m rows.
    m *= batch;
    batch = 1;
  }
  cublasStatus_t st = cublasGemmStridedBatchedEx(
      h, opB, opA, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b, dt, ldb,
      shared ? 0 : k * n, a, dt, lda, m * k, &zero, out, dt, static_cast<int>(n), m * n,
      static_cast<int>(batch), ct, CUBLAS_GEMM_DEFAULT);
  return static_cast<int>(st);
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
                        ctx.stream);
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
