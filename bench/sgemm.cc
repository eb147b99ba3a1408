// ptc-bench-sgemm: OpenBLAS sgemm throughput on this machine (the ceiling the
// step-time benchmark compares model FLOP/s against).
//   ptc-bench-sgemm [n=1024] [threads=0 (OpenBLAS default)] [repeats=10]

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char **argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 1024;
  int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  int repeats = argc > 3 ? std::atoi(argv[3]) : 10;
  if (n < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: ptc-bench-sgemm [n] [threads] [repeats]\n");
    return 2;
  }
  if (threads > 0)
    openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 1.0f), b(a), c(a);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
              0.0f, c.data(), n); // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("sgemm %dx%dx%d: %.1f GFLOP/s (best of %d)\n", n, n, n, 2.0 * n * n * n / best / 1e9,
              repeats);
  return 0;
}
