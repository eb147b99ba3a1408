// CPU kernels: matmuls through OpenBLAS (one GEMM for a shared weight over all rows).
#include "kernels/cpu/internal.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;

void matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
            bool transA, bool transB) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = product(as, 0, r - 2);
  int lda = static_cast<int>(transA ? m : k), ldb = static_cast<int>(transB ? k : n);
  CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans, tb = transB ? CblasTrans : CblasNoTrans;
  bool shared = rb == 2;
  if (shared && !transA) {
    // All batch rows share B: one GEMM over batch * m rows.
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(batch * m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, lda, b, ldb, 0.0f, out, static_cast<int>(n));
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
                0.0f, out + i * m * n, static_cast<int>(n));
}

} // namespace ptc::kernels::cpu
