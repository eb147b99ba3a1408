// CPU kernels: matmuls through oneDNN's sgemm (one GEMM for a shared weight
// over all rows). oneDNN's JIT kernels dispatch on the CPU at run time
// (AVX-512 here: about twice the rate of OpenBLAS pinned to its Haswell
// kernels, which this machine's environment does). The kernels own the
// threads: every GEMM is split over OpenMP's threads, each calling oneDNN on
// its block of the result. Debian's oneDNN is built against GNU OpenMP, but
// its OpenMP calls bind to the LLVM runtime ptc's kernels link first (one
// pool, no second spinning team), and inside a parallel region oneDNN runs
// on the calling thread. Each element of the result is computed by one call
// over the whole K, so the numbers do not depend on the thread count.
#include "kernels/cpu/internal.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;

namespace {
/// C[M x N] = op(A) op(B), row-major, split over the threads along the
/// larger of M and N in blocks of 16 rows / columns.
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
          const float *b, int64_t ldb, float *c, int64_t ldc, int threads) {
  const char ta = transA ? 'T' : 'N', tb = transB ? 'T' : 'N';
  auto call = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    if (m1 <= m0 || n1 <= n0)
      return;
    const float *ab = transA ? a + m0 : a + m0 * lda;
    const float *bb = transB ? b + n0 * ldb : b + n0;
    if (K == 0) { // an empty sum (oneDNN refuses a leading dimension of 0)
      for (int64_t i = m0; i < m1; ++i)
        std::fill(c + i * ldc + n0, c + i * ldc + n1, 0.0f);
      return;
    }
    // Row-major. The arguments are valid by construction (the plan's shapes
    // were checked when it was loaded); a refusal is a bug in this file.
    dnnl_status_t status = dnnl_sgemm(ta, tb, m1 - m0, n1 - n0, K, 1.0f, ab, lda, bb, ldb, 0.0f,
                                      c + m0 * ldc + n0, ldc);
    if (status != dnnl_success) {
      std::fprintf(stderr, "ptc: internal error: dnnl_sgemm refused %c%c %lldx%lldx%lld (status %d)\n",
                   ta, tb, static_cast<long long>(m1 - m0), static_cast<long long>(n1 - n0),
                   static_cast<long long>(K), static_cast<int>(status));
      std::abort();
    }
  };
  // Small products are not worth waking the threads for.
  if (threads <= 1 || M * N * K < (int64_t{1} << 18)) {
    call(0, M, 0, N);
    return;
  }
  const bool alongM = M >= N;
  const int64_t extent = alongM ? M : N;
  const int64_t block = ((extent + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel num_threads(threads)
  {
    int64_t t = threadIndex();
    int64_t lo = std::min(extent, t * block), hi = std::min(extent, lo + block);
    if (alongM)
      call(lo, hi, 0, N);
    else
      call(0, M, lo, hi);
  }
}
} // namespace

void matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
            bool transA, bool transB) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = product(as, 0, r - 2);
  int64_t lda = transA ? m : k, ldb = transB ? k : n;
  bool shared = rb == 2;
  int threads = availableThreads();
  if (shared && !transA) {
    // All batch rows share B: one GEMM over batch * m rows.
    gemm(false, transB, batch * m, n, k, a, lda, b, ldb, out, n, threads);
    return;
  }
  if (batch >= threads && threads > 1) {
    // Enough products to give each thread whole ones (same results: each
    // product is computed alone either way).
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < batch; ++i)
      gemm(transA, transB, m, n, k, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
           out + i * m * n, n, 1);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    gemm(transA, transB, m, n, k, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
         out + i * m * n, n, threads);
}

} // namespace ptc::kernels::cpu
