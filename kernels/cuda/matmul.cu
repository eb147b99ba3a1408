// CUDA kernels: matmuls through cuBLAS (see kernels.h).

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/padded_product.h"

#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

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

// ---- Products with a bias epilogue on cuBLASLt ---------------------------------------
// With PTC_CUDA_LT_EPILOGUES=1, a product with a bias (ptc-fuse-matmul-bias) runs
// as one cuBLASLt matmul with CUBLASLT_EPILOGUE_BIAS: the bias is added to the
// f32 accumulator and the result rounded once (the dialect's semantics; the
// default path rounds the product, then adds the bias and rounds again), and
// the separate pass over the result goes. The algorithm is cuBLASLt's
// heuristic choice for the shape, types and the buffers' alignment, chosen
// once and cached (the same algorithm every step). Opt-in until a GPU run has
// checked it against the CPU (CudaConformance.BiasEpilogueOnCublasLt).
namespace {
bool ltEpiloguesEnabled() {
  const char *v = std::getenv("PTC_CUDA_LT_EPILOGUES");
  return v && std::strcmp(v, "1") == 0;
}

/// The largest power of two up to 256 dividing `p`'s address: the alignment
/// the heuristic may assume (the plan's arena aligns tensors to 64 bytes).
uint32_t alignmentOf(const void *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0)
    align /= 2;
  return align;
}

/// One cached product with an epilogue (a bias, or a bias gradient):
/// cuBLASLt's descriptors and algorithm for a shape, types, alignment and
/// epilogue, or why cuBLASLt refused it.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  std::string refused; // non-empty: run on the default path
};

/// Builds the plan of C[m, n] = op(A) op(B) + bias (row-major; cuBLASLt's
/// column-major view: C^T[n, m] = op(B)^T op(A)^T, whose rows are ptc's
/// columns, so the bias vector of n is the epilogue's per-row bias), or,
/// with CUBLASLT_EPILOGUE_BGRADB, of C and the sums of ptc's A over the
/// product's k (cuBLASLt's B is ptc's A: a vector of m, one per column of
/// the column-major C^T).
LtPlan planBiasProduct(cublasLtHandle_t lt, const Product &p, cudaDataType_t dt,
                       cublasComputeType_t ct, uint32_t alignA, uint32_t alignB, uint32_t alignC,
                       size_t maxWorkspace, cublasLtEpilogue_t epilogue) {
  LtPlan plan;
  auto failed = [&](const char *what, cublasStatus_t st) {
    plan.refused = std::string(what) + " (cuBLAS status " + std::to_string(static_cast<int>(st)) + ")";
    return plan;
  };
  cublasStatus_t st = cublasLtMatmulDescCreate(&plan.op, ct, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS)
    return failed("creating the matmul descriptor", st);
  const cublasOperation_t opA = p.transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opB = p.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t biasType = static_cast<int32_t>(dt);
  if ((st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA,
                                           sizeof opA)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB,
                                           sizeof opB)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof epilogue)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                           &biasType, sizeof biasType)) != CUBLAS_STATUS_SUCCESS)
    return failed("setting the matmul's transposes and epilogue", st);
  // cuBLASLt's A is ptc's rhs, its B ptc's lhs, as stored (column-major).
  const uint64_t rowsA = p.transB ? p.k : p.n, colsA = p.transB ? p.n : p.k;
  const uint64_t rowsB = p.transA ? p.m : p.k, colsB = p.transA ? p.k : p.m;
  if ((st = cublasLtMatrixLayoutCreate(&plan.a, dt, rowsA, colsA, p.ldb)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&plan.b, dt, rowsB, colsB, p.lda)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&plan.c, dt, p.n, p.m, p.n)) != CUBLAS_STATUS_SUCCESS)
    return failed("describing the operands", st);
  cublasLtMatmulPreference_t pref = nullptr;
  if ((st = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
    return failed("creating the heuristic's preference", st);
  const uint32_t aligns[3] = {alignB, alignA, alignC}; // cuBLASLt's A, B, C and D
  const cublasLtMatmulPreferenceAttributes_t alignAttrs[3] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
  st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &maxWorkspace, sizeof maxWorkspace);
  for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; ++i)
    st = cublasLtMatmulPreferenceSetAttribute(pref, alignAttrs[i], &aligns[i], sizeof aligns[i]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &aligns[2], sizeof aligns[2]);
  // Split-k partial products added in f32 in the workspace, as the default
  // path's cuBLAS handle does (not in place in the 16-bit output).
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &reduction, sizeof reduction);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1,
                                        &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS)
    return failed("asking the heuristic for an algorithm", st);
  if (found == 0)
    return failed("no algorithm for this shape, types and alignment", CUBLAS_STATUS_NOT_SUPPORTED);
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  return plan;
}

/// The cached plan of a product with an epilogue (built on first use;
/// cuBLASLt's heuristic runs once per shape, types, alignment and epilogue).
const LtPlan &biasProductPlan(cublasLtHandle_t lt, const Product &p, cudaDataType_t dt,
                              cublasComputeType_t ct, const void *a, const void *b, void *c,
                              const void *bias, size_t maxWorkspace,
                              cublasLtEpilogue_t epilogue) {
  using Key = std::tuple<void *, int64_t, int64_t, int64_t, bool, bool, int, int, uint32_t,
                         uint32_t, uint32_t, uint32_t, int>;
  static std::mutex mu;
  static std::map<Key, LtPlan> plans;
  const uint32_t alignA = alignmentOf(a), alignB = alignmentOf(b), alignC = alignmentOf(c),
                 alignBias = alignmentOf(bias);
  Key key{lt, p.m, p.n, p.k, p.transA, p.transB, static_cast<int>(dt), static_cast<int>(ct),
          alignA, alignB, alignC, alignBias, static_cast<int>(epilogue)};
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) {
    // (The bias's alignment is in the key: the heuristic takes none for it.)
    it = plans.emplace(key, planBiasProduct(lt, p, dt, ct, alignA, alignB, alignC, maxWorkspace,
                                            epilogue))
             .first;
    const bool grad = epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if (!it->second.refused.empty()) // named once per shape: never a silent slow path
      std::fprintf(stderr,
                   "ptc: cuBLASLt refused the %s product %lld x %lld x %lld: %s; it runs as a "
                   "product and a separate %s\n",
                   grad ? "bias-gradient" : "biased", static_cast<long long>(p.m),
                   static_cast<long long>(p.n), static_cast<long long>(p.k),
                   it->second.refused.c_str(), grad ? "column sum" : "bias pass");
  }
  return it->second;
}

/// Runs the product with its epilogue on cuBLASLt when enabled and
/// accepted (BIAS: `bias` is read; BGRADB: `bias` is the bias gradient,
/// written): its result; nothing when the caller is to run it the default
/// way (then nothing was enqueued).
std::optional<KernelResult> biasProductOnLt(const LaunchContext &ctx, const Product &p,
                                            cudaDataType_t dt, cublasComputeType_t ct,
                                            const void *a, const void *b, const void *bias,
                                            void *out, cublasLtEpilogue_t epilogue) {
  if (!ctx.blasLt || p.batch != 1 || !ltEpiloguesEnabled())
    return std::nullopt;
  constexpr size_t kMaxWorkspace = size_t{32} << 20;
  auto lt = static_cast<cublasLtHandle_t>(ctx.blasLt);
  const LtPlan &plan = biasProductPlan(lt, p, dt, ct, a, b, out, bias, kMaxWorkspace, epilogue);
  if (!plan.refused.empty())
    return std::nullopt;
  void *workspace = nullptr;
  if (plan.workspace > 0 &&
      !(workspace = ctx.scratch ? ctx.scratch(ctx.owner, static_cast<int64_t>(plan.workspace))
                                : nullptr))
    return std::nullopt; // no scratch for this algorithm: the default path
  cublasStatus_t st = cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias);
  const float one = 1.0f, zero = 0.0f;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(lt, plan.op, &one, b, plan.a, a, plan.b, &zero, out, plan.c, out, plan.c,
                        &plan.algo, workspace, plan.workspace, S(ctx.stream));
  if (st != CUBLAS_STATUS_SUCCESS)
    return KernelResult::error("cuBLASLt ",
                               epilogue == CUBLASLT_EPILOGUE_BGRADB ? "bias-gradient" : "biased",
                               " product ", p.m, " x ", p.n, " x ", p.k, " failed with status ",
                               static_cast<int>(st));
  return KernelResult::ok();
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
  // row after the product; an optional bias gradient (a second output: lhs
  // summed over its contracted dimension) by the column sums after the
  // product (with transpose_lhs; f32 row sums otherwise), or, with
  // PTC_CUDA_LT_EPILOGUES=1, in the product (cuBLASLt's BGRADB epilogue).
  auto accepts = [](const KernelCall &c) {
    const DType type = c.output(0).dtype;
    const bool sumsRows = c.attr(attr::Matmul::transpose_lhs) != 0;
    return c.input(0).dtype == type && c.input(1).dtype == type && type != DType::I32 &&
           (c.numInputs < 3 || c.input(2).dtype == type) &&
           (c.numOutputs < 2 ||
            (c.output(1).dtype == type && (sumsRows || type == DType::F32)));
  };
  t.add(
      OpKind::Matmul,
      [](const KernelCall &c) {
        const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
        const LaunchContext &ctx = context(c);
        const FloatType type = floatTypeOf(out.dtype);
        const bool tf32 = type == FloatType::F32 && ctx.allowTf32;
        const bool bias = c.numInputs >= 3, biasGrad = c.numOutputs >= 2;
        const bool transA = c.attr(attr::Matmul::transpose_lhs) != 0;
        if ((bias || (biasGrad && transA)) && out.elements > 0) {
          // A 16-bit product that runs padded (a size not a multiple of 8)
          // stays on the default path.
          const Product p =
              productOf(*a.shape, *b.shape, transA, c.attr(attr::Matmul::transpose_rhs) != 0);
          const bool padded =
              type != FloatType::F32 && paddedProductFor(p.m, p.n, p.k, p.transA, p.transB, 1);
          if (!padded)
            if (std::optional<KernelResult> r = biasProductOnLt(
                    ctx, p, cudaTypeOf(type),
                    tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, a.data, b.data,
                    bias ? c.input(2).data : c.output(1).data, out.data,
                    bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB))
              return *r;
        }
        if (KernelResult r = matmul(ctx.blas, a.data, *a.shape, b.data, *b.shape, out.data,
                                    c.attr(attr::Matmul::transpose_lhs) != 0,
                                    c.attr(attr::Matmul::transpose_rhs) != 0, type, tf32, ctx.stream,
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
        if (biasGrad) {
          // lhs [k, m] (transposed): its column sums; [m, k]: its row sums (f32).
          const TensorView &sums = c.output(1);
          if (transA)
            return columnSums(c, a, a.dim(0), sums);
          reduce(ReduceOp::Sum, a.f32(), *a.shape, {1}, sums.f32(), ctx.stream);
        }
        return KernelResult::ok();
      },
      accepts);
}
} // namespace ptc::kernels::cuda
