// CPU kernels: f32 matmuls through oneDNN's or OpenBLAS's sgemm (one GEMM
// for a shared weight over all rows), whichever runs this CPU's product
// shapes faster (f32Gemm): oneDNN's JIT kernels where it has AVX-512 ones
// (about twice the rate of OpenBLAS pinned to its Haswell kernels, which the
// first measuring machine's environment did); where oneDNN would run its
// AVX2 sgemm, OpenBLAS's for the gradients' products (measured on a Zen 3
// EPYC, one core: 65-87 GFLOP/s on the bench GPT's, oneDNN's 41-75 on the
// weight gradients) and oneDNN's for the forward products A B^T (oneDNN
// 80-89 GFLOP/s where K = 256, OpenBLAS 71-75; equal where K = 1024:
// `ptc-bench-sgemm 1024 1`). The kernels own the threads: every GEMM
// is split over OpenMP's threads, each calling the library single-threaded on
// its block of the result. Debian's oneDNN is built against GNU OpenMP, but
// its OpenMP calls bind to the LLVM runtime ptc's kernels link first (one
// pool, no second spinning team), and inside a parallel region oneDNN runs
// on the calling thread; OpenBLAS is told to use one thread and its own pool
// (the pthread build's) is shut down at start. Each element of the result is
// computed by one call over the whole K, and the threads' blocks start where
// the library's tiles start (splitOf), so the numbers do not depend on the
// thread count.
#include "kernels/cpu/internal.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#ifdef PTC_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;

namespace {
constexpr const char *kF32GemmVariable = "PTC_CPU_GEMM";

std::optional<F32Gemm> parseF32Gemm(std::string_view text) {
  if (text == "auto")
    return defaultF32Gemm();
  if (text == "onednn")
    return F32Gemm::OneDnn;
  if (text == "openblas" && f32GemmBuilt(F32Gemm::OpenBlas))
    return F32Gemm::OpenBlas;
  if (text == "mixed" && f32GemmBuilt(F32Gemm::Mixed))
    return F32Gemm::Mixed;
  return std::nullopt;
}

/// The choice in use: PTC_CPU_GEMM where it names one, else this CPU's default.
std::atomic<F32Gemm> &f32GemmChoice() {
  static std::atomic<F32Gemm> choice = [] {
    const char *text = std::getenv(kF32GemmVariable);
    return (text ? parseF32Gemm(text) : std::nullopt).value_or(defaultF32Gemm());
  }();
  return choice;
}

#ifdef PTC_HAVE_OPENBLAS
/// OpenBLAS's pthread build starts a pool of threads when it loads, before
/// main: threads that take the process's signals (ptc-run blocks its stop
/// signals in its own threads and waits for them in one; a SIGTERM that
/// reached OpenBLAS's idle thread ended the process) and a second pool beside
/// OpenMP's. ptc calls OpenBLAS on one thread, so the pool is shut down as the
/// program starts (OpenBLAS starts it again for a caller that asks for more
/// threads: the sgemm benchmark's reference). blas_thread_shutdown_ is
/// exported by every OpenBLAS build, not declared in its headers.
extern "C" int blas_thread_shutdown_(void);
const bool kOpenBlasPoolShutDown = [] {
  openblas_set_num_threads(1);
  blas_thread_shutdown_();
  return true;
}();

/// OpenBLAS's sgemm on the calling thread (its thread count set to 1 above).
void openblasSgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans,
              tb == 'T' ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), 0.0f, c, static_cast<blasint>(ldc));
}
#endif

/// C[m x n] = op(A) op(B) through oneDNN's or OpenBLAS's sgemm, row-major.
/// The arguments are valid by construction (the plan's shapes were checked
/// when it was loaded); a refusal is a bug in this file.
void sgemm(F32Gemm library, char ta, char tb, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
#ifdef PTC_HAVE_OPENBLAS
  if (library == F32Gemm::OpenBlas) {
    openblasSgemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
#endif
  dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  if (status != dnnl_success) {
    std::fprintf(stderr, "ptc: internal error: dnnl_sgemm refused %c%c %lldx%lldx%lld (status %d)\n",
                 ta, tb, static_cast<long long>(m), static_cast<long long>(n),
                 static_cast<long long>(k), static_cast<int>(status));
    std::abort();
  }
}

/// (oneDNN) A transposed A is read down its columns, one row of A after another:
/// with rows a multiple of 2 KiB apart (lda % 512 floats == 0: the weight
/// gradient of any layer 512, 1024, 4096... wide, A being the output's
/// gradient) sgemm runs 10-20% slower (on this machine, one core, TN 512 x
/// 256 x 1024: 221 GFLOP/s at lda 512, 205 at 1024, 197 at 4096, 241 at
/// 528 or 4112). Such an A is copied into rows that are not (columns
/// [m0, m0 + m) of A, in slices of at most kConflictFreeSliceFloats), which
/// costs a few percent of the product; the sums are the same (each slice's
/// elements are computed over the whole K as before).
constexpr int64_t kConflictFreeSliceFloats = int64_t{1} << 20; // 4 MiB per thread

bool conflictingRows(int64_t ld) { return ld % 512 == 0; }

void sgemmTransposedA(char tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float *c, int64_t ldc) {
  thread_local std::vector<float> copy;
  const int64_t slice = std::max<int64_t>(16, kConflictFreeSliceFloats / k / 16 * 16);
  for (int64_t s0 = 0; s0 < m; s0 += slice) {
    const int64_t width = std::min(slice, m - s0);
    int64_t ld = (width + 15) / 16 * 16;
    if (conflictingRows(ld))
      ld += 16;
    copy.resize(static_cast<size_t>(k * ld));
    for (int64_t p = 0; p < k; ++p)
      std::memcpy(copy.data() + p * ld, a + p * lda + s0,
                  sizeof(float) * static_cast<size_t>(width));
    sgemm(F32Gemm::OneDnn, 'T', tb, width, n, k, copy.data(), ld, b, ldb, c + s0 * ldc, ldc);
  }
}

/// How a product is split over the threads: along its rows or its columns,
/// at multiples of `unit`. The libraries' micro-kernels tile the result (and
/// sum an edge tile's elements in another order than a whole tile's), so a
/// block must start where a tile of the whole product starts for its elements
/// to be computed as on one thread. Measured on this machine's libraries
/// (Kernels.MatmulIsBitwiseTheSameOnOneAndTwoThreads checks it on every
/// CPU): oneDNN's sgemm gives the same sums for blocks of columns at
/// multiples of 16, and for blocks of rows at multiples of 48 unless B is
/// transposed (never then); OpenBLAS's (its Haswell / Zen kernels) for
/// blocks of rows at multiples of 24, never for blocks of columns.
struct RowColumnSplit {
  bool alongM;
  int64_t unit;
};

RowColumnSplit splitOf(F32Gemm library, int64_t N, bool transB) {
  if (library == F32Gemm::OpenBlas)
    return {true, 24};
  if (N >= 32 || transB)
    return {false, 16};
  return {true, 48};
}

/// C[M x N] = op(A) op(B) (+ bias[N] on every row), row-major, split over
/// the threads (splitOf); each thread adds the bias to its block right after
/// its product. The library is read once: every block of a product on the same one.
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
          const float *b, int64_t ldb, float *c, int64_t ldc, int threads, const float *bias) {
  const F32Gemm library = f32GemmLibraryOf(f32Gemm(), transA, transB);
  const char ta = transA ? 'T' : 'N', tb = transB ? 'T' : 'N';
  auto call = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    if (m1 <= m0 || n1 <= n0)
      return;
    const float *ab = transA ? a + m0 : a + m0 * lda;
    const float *bb = transB ? b + n0 * ldb : b + n0;
    if (K == 0) { // an empty sum (oneDNN refuses a leading dimension of 0)
      for (int64_t i = m0; i < m1; ++i)
        for (int64_t j = n0; j < n1; ++j)
          c[i * ldc + j] = bias ? bias[j] : 0.0f;
      return;
    }
    // (A K too long for even 16 columns within the slice limit keeps the stride.)
    if (library == F32Gemm::OneDnn && transA && conflictingRows(lda) &&
        (m1 - m0) * K >= (int64_t{1} << 16) && K * 16 <= kConflictFreeSliceFloats)
      sgemmTransposedA(tb, m1 - m0, n1 - n0, K, ab, lda, bb, ldb, c + m0 * ldc + n0, ldc);
    else
      sgemm(library, ta, tb, m1 - m0, n1 - n0, K, ab, lda, bb, ldb, c + m0 * ldc + n0, ldc);
    if (bias)
      for (int64_t i = m0; i < m1; ++i) {
        float *row = c + i * ldc;
#pragma omp simd
        for (int64_t j = n0; j < n1; ++j)
          row[j] += bias[j];
      }
  };
  // Small products are not worth waking the threads for. They run on this
  // thread alone: oneDNN, called outside a parallel region with more than
  // one thread allowed, would start its own team, whose split of the product
  // depends on the thread count (OpenBLAS runs on one thread already).
  if (threads <= 1 || M * N * K < (int64_t{1} << 18)) {
#ifdef _OPENMP
    if (library == F32Gemm::OneDnn && threads > 1) {
      omp_set_num_threads(1);
      call(0, M, 0, N);
      omp_set_num_threads(threads);
      return;
    }
#endif
    call(0, M, 0, N);
    return;
  }
  const RowColumnSplit split = splitOf(library, N, transB);
  const int64_t extent = split.alongM ? M : N;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = threadIndex();
    // Boundaries at the multiples of the unit nearest to even shares.
    auto bound = [&](int64_t i) {
      return i >= threads ? extent
                          : std::min(extent, (i * extent + threads * split.unit / 2) /
                                                 (threads * split.unit) * split.unit);
    };
    const int64_t lo = bound(t), hi = bound(t + 1);
    if (split.alongM)
      call(lo, hi, 0, N);
    else
      call(0, M, lo, hi);
  }
}
} // namespace

void matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
            bool transA, bool transB, const float *bias) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = product(as, 0, r - 2);
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  bool shared = rb == 2;
  int threads = availableThreads();
  if (shared && !transA) {
    // All batch rows share B: one GEMM over batch * m rows.
    gemm(false, transB, batch * m, n, k, a, lda, b, ldb, out, n, threads, bias);
    return;
  }
  if (batch >= threads && threads > 1) {
    // Enough products to give each thread whole ones (same results: each
    // product is computed alone either way).
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < batch; ++i)
      gemm(transA, transB, m, n, k, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
           out + i * m * n, n, 1, bias);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    gemm(transA, transB, m, n, k, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
         out + i * m * n, n, threads, bias);
}

bool f32GemmBuilt(F32Gemm library) {
#ifdef PTC_HAVE_OPENBLAS
  (void)library;
  return true;
#else
  return library == F32Gemm::OneDnn;
#endif
}

F32Gemm defaultF32Gemm() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned avx512 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
  return (isa & avx512) == avx512 || !f32GemmBuilt(F32Gemm::Mixed) ? F32Gemm::OneDnn
                                                                    : F32Gemm::Mixed;
}

F32Gemm f32Gemm() { return f32GemmChoice().load(std::memory_order_relaxed); }

F32Gemm f32GemmLibraryOf(F32Gemm choice, bool transA, bool transB) {
  if (choice != F32Gemm::Mixed)
    return choice;
  return transB && !transA ? F32Gemm::OneDnn : F32Gemm::OpenBlas;
}

void setF32Gemm(F32Gemm library) {
  if (f32GemmBuilt(library))
    f32GemmChoice().store(library, std::memory_order_relaxed);
}

const char *f32GemmName(F32Gemm library) {
  switch (library) {
  case F32Gemm::OneDnn:
    return "oneDNN";
  case F32Gemm::OpenBlas:
    return "OpenBLAS";
  case F32Gemm::Mixed:
    break;
  }
  return "oneDNN for A B^T, OpenBLAS for the rest";
}

std::string f32GemmEnvironmentError() {
  const char *text = std::getenv(kF32GemmVariable);
  if (!text || parseF32Gemm(text))
    return "";
  return std::string(kF32GemmVariable) + "='" + text + "': expected auto, onednn, openblas or mixed" +
         (f32GemmBuilt(F32Gemm::OpenBlas) ? "" : " (this build has no OpenBLAS: PTC_WITH_OPENBLAS=OFF)");
}

bool nativeBf16() {
  static const bool native = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
}

// ---- bf16 / f16: oneDNN's matmul primitive (f32 accumulation; the result
// rounded once, to nearest even, as the widening path rounds it).
namespace {
dnnl::memory::data_type dnnlType(FloatType type) {
  return type == FloatType::BF16 ? dnnl::memory::data_type::bf16
         : type == FloatType::F16 ? dnnl::memory::data_type::f16
                                  : dnnl::memory::data_type::f32;
}

dnnl::engine &cpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// Whether this CPU (as oneDNN dispatches, ONEDNN_MAX_CPU_ISA included) has
/// bf16 instructions: AVX512-BF16 or AMX. Without them oneDNN emulates bf16
/// (measured on the bench GPT: 6174 tok/s, against 7860 widening to f32 on
/// AVX2 and 18689 natively), so the executor widens instead. f16 matmuls:
/// oneDNN 2.6 computes them natively only with AVX512-FP16 (not in its ISA
/// list), so they are widened everywhere.
bool nativeLowPrecision(FloatType type) { return type == FloatType::BF16 && nativeBf16(); }

/// One matmul shape's primitive, or none where the CPU has no native kernel
/// for the type or oneDNN has only its reference implementation.
struct LowPrecisionMatmul {
  bool usable = false;
  std::string implementation;
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, bias; // bias: [1, 1, n] when the matmul has one
};

/// op(a) as [batch, m, k] and op(b) as [batch or 1, k, n], the transposes
/// folded into the strides; the result [batch, m, n] dense.
LowPrecisionMatmul createLowPrecisionMatmul(FloatType type, const Shape &as, const Shape &bs,
                                            bool transA, bool transB, bool bias) {
  using dims = dnnl::memory::dims;
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = product(as, 0, r - 2);
  if (rb == 2 && !transA) {
    // Every batch row shares B: one [batch * m, k] x [k, n] product (oneDNN's
    // broadcast batch runs each m-row slice on its own, at about 70% of the rate).
    m *= batch;
    batch = 1;
  }
  int64_t batchB = rb == 2 ? 1 : batch;
  LowPrecisionMatmul out;
  if (!nativeLowPrecision(type) || m <= 0 || n <= 0 || k <= 0 || batch <= 0)
    return out; // empty products: the widening path's kernels handle them
  const auto t = dnnlType(type);
  out.a = dnnl::memory::desc(dims{batch, m, k}, t,
                             transA ? dims{m * k, 1, m} : dims{m * k, k, 1});
  out.b = dnnl::memory::desc(dims{batchB, k, n}, t,
                             transB ? dims{k * n, 1, k} : dims{k * n, n, 1});
  out.c = dnnl::memory::desc(dims{batch, m, n}, t, dims{m * n, n, 1});
  if (bias)
    out.bias = dnnl::memory::desc(dims{1, 1, n}, t, dims{n, n, 1});
  try {
    dnnl::matmul::primitive_desc pd(bias ? dnnl::matmul::desc(out.a, out.b, out.bias, out.c)
                                         : dnnl::matmul::desc(out.a, out.b, out.c),
                                    cpuEngine());
    out.implementation = pd.impl_info_str();
    if (out.implementation.rfind("ref", 0) == 0)
      return out;
    out.primitive = dnnl::matmul(pd);
    out.usable = true;
  } catch (const dnnl::error &) {
    // No implementation for this type on this CPU.
  }
  return out;
}

using LowPrecisionKey = std::tuple<FloatType, Shape, Shape, bool, bool, bool>;
std::mutex gLowPrecisionMutex;
std::map<LowPrecisionKey, LowPrecisionMatmul> gLowPrecisionMatmuls; // every shape static: a few dozen
} // namespace

namespace {
/// The primitive of a shape, created at its first use (the executor asks
/// every instruction's kernel whether it accepts the call when the plan is
/// loaded, so that is at load) and kept. The Matmul
/// entry asks twice per instruction (does it accept the call, then run it):
/// the thread's last answer is kept so that the second ask costs neither the
/// lock nor the key's copies (map nodes never move).
LowPrecisionMatmul &lowPrecisionMatmulFor(FloatType type, const Shape &as, const Shape &bs,
                                          bool transA, bool transB, bool bias) {
  thread_local const LowPrecisionKey *lastKey = nullptr;
  thread_local LowPrecisionMatmul *last = nullptr;
  if (last && std::get<0>(*lastKey) == type && std::get<1>(*lastKey) == as &&
      std::get<2>(*lastKey) == bs && std::get<3>(*lastKey) == transA &&
      std::get<4>(*lastKey) == transB && std::get<5>(*lastKey) == bias)
    return *last;
  std::lock_guard<std::mutex> lock(gLowPrecisionMutex);
  LowPrecisionKey key{type, as, bs, transA, transB, bias};
  auto it = gLowPrecisionMatmuls.find(key);
  if (it == gLowPrecisionMatmuls.end())
    it = gLowPrecisionMatmuls
             .emplace(key, createLowPrecisionMatmul(type, as, bs, transA, transB, bias))
             .first;
  lastKey = &it->first;
  last = &it->second;
  return it->second;
}
} // namespace

bool matmulLowPrecision(FloatType type, const void *a, const Shape &as, const void *b,
                        const Shape &bs, void *out, bool transA, bool transB, const void *bias) {
  if (type == FloatType::F32)
    return false;
  LowPrecisionMatmul &mm = lowPrecisionMatmulFor(type, as, bs, transA, transB, bias != nullptr);
  if (!mm.usable)
    return false;
  static dnnl::stream stream(cpuEngine());
  dnnl::engine &engine = cpuEngine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(mm.a, engine, const_cast<void *>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(mm.b, engine, const_cast<void *>(b))},
      {DNNL_ARG_DST, dnnl::memory(mm.c, engine, out)}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(mm.bias, engine, const_cast<void *>(bias)));
  mm.primitive.execute(stream, args);
  stream.wait();
  return true;
}

std::string lowPrecisionMatmulImplementation(FloatType type) {
  if (type == FloatType::F32)
    return "";
  LowPrecisionMatmul probe =
      createLowPrecisionMatmul(type, {256, 256}, {256, 256}, false, false, false);
  return probe.usable ? probe.implementation : "";
}

void addMatmulKernels(KernelTable &t) {
  // f32, or bf16 operands and result where oneDNN has a native kernel for
  // the shape (the executor widens the others to f32). An optional third
  // input, the bias, is added to every row: by oneDNN's primitive for bf16
  // (in the accumulator, before the one rounding), by each thread to its
  // block right after its GEMM for f32 (the same additions as an Add). An
  // optional second output, the bias gradient, is lhs summed over its
  // contracted dimension after the GEMM, by ReduceSum's kernel (the same
  // additions in the same order as the ReduceSum it replaces).
  auto accepts = [](const KernelCall &c) {
    const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
    const bool bias = c.numInputs >= 3;
    if (bias && c.input(2).dtype != out.dtype)
      return false;
    if (c.numOutputs >= 2 &&
        (c.output(1).dtype != out.dtype || (out.dtype != DType::F32 && out.dtype != DType::BF16)))
      return false;
    if (a.dtype == DType::F32 && b.dtype == DType::F32 && out.dtype == DType::F32)
      return true;
    return a.dtype == out.dtype && b.dtype == out.dtype && isLowPrecision(out.dtype) &&
           lowPrecisionMatmulFor(floatTypeOf(out.dtype), *a.shape, *b.shape, c.attr(attr::Matmul::transpose_lhs) != 0,
                                 c.attr(attr::Matmul::transpose_rhs) != 0, bias)
               .usable;
  };
  t.add(
      OpKind::Matmul,
      [](const KernelCall &c) {
        const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
        const bool transA = c.attr(attr::Matmul::transpose_lhs) != 0,
                   transB = c.attr(attr::Matmul::transpose_rhs) != 0;
        const TensorView *bias = c.numInputs >= 3 ? &c.input(2) : nullptr;
        if (out.dtype == DType::F32) {
          matmul(a.f32(), *a.shape, b.f32(), *b.shape, out.f32(), transA, transB,
                 bias ? bias->f32() : nullptr);
        } else if (!matmulLowPrecision(floatTypeOf(out.dtype), a.data, *a.shape, b.data, *b.shape,
                                       out.data, transA, transB, bias ? bias->data : nullptr)) {
          return KernelResult::error("no native low-precision matmul for this shape");
        }
        if (c.numOutputs >= 2)
          reduceInto(ReduceOp::Sum, a, {transA ? 0 : 1}, c.output(1));
        return KernelResult::ok();
      },
      accepts);
}

} // namespace ptc::kernels::cpu
