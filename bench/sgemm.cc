// ptc-bench-sgemm: single-precision GEMM throughput on this machine, the
// ceiling the step-time benchmark compares model FLOP/s against:
//   - oneDNN's dnnl_sgemm over the whole product (its own threads: the bound);
//   - ptc's CPU matmul kernel (oneDNN split over ptc's OpenMP threads);
//   - OpenBLAS's cblas_sgemm as the environment configures it (this
//     machine's environment pins it to its Haswell kernels), where built.
//   ptc-bench-sgemm [n=1024] [threads=0 (all cores)] [repeats=10]

#include "bench/best_seconds.h"
#include "kernels/cpu/kernels.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#ifdef PTC_BENCH_OPENBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

using ptc::bench::bestSeconds;

int main(int argc, char **argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 1024;
  int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  int repeats = argc > 3 ? std::atoi(argv[3]) : 10;
  if (n < 1 || n > 16384 || threads < 0 || repeats < 1) {
    std::fprintf(stderr, "usage: ptc-bench-sgemm [n (1..16384)] [threads (0: all)] [repeats (>= 1)]\n");
    return 2;
  }
  if (threads > 0)
    omp_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 1.0f), b(a), c(a);
  const double flops = 2.0 * n * n * n;
  auto report = [&](const char *what, double seconds) {
    std::printf("%-8s sgemm %dx%dx%d: %.1f GFLOP/s (best of %d, %d threads)\n", what, n, n, n,
                flops / seconds / 1e9, repeats, omp_get_max_threads());
  };
  report("oneDNN", bestSeconds(repeats, [&] {
           dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
         }));
  const ptc::kernels::Shape s{n, n};
  report("ptc", bestSeconds(repeats, [&] {
           ptc::kernels::cpu::matmul(a.data(), s, b.data(), s, c.data(), false, false);
         }));
#ifdef PTC_BENCH_OPENBLAS
  if (threads > 0)
    openblas_set_num_threads(threads);
  report("OpenBLAS", bestSeconds(repeats, [&] {
           cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n,
                       b.data(), n, 0.0f, c.data(), n);
         }));
#endif
  return 0;
}
