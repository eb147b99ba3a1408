// ptc-bench-sgemm: single-precision GEMM throughput on this machine, the
// ceiling the step-time benchmark compares model FLOP/s against, and the
// figures behind the CPU kernels' choice of GEMM library (f32Gemm):
//   - oneDNN's dnnl_sgemm and OpenBLAS's cblas_sgemm over an n-cube, each on
//     its own threads (OpenBLAS as the environment configures it, where
//     built: PTC_WITH_OPENBLAS);
//   - ptc's CPU matmul kernel (the product split over ptc's OpenMP threads)
//     calling each library, the default of this CPU marked;
//   - the same kernel on the products of one training step of the bench GPT
//     (bench/step_time.py: 4 layers, hidden 256, MLP 1024, vocabulary 256,
//     1024 tokens; 51 products of 12 shapes), per shape and summed, with
//     each library and with F32Gemm::Mixed's split between them (oneDNN
//     for the products A B^T): the step's GEMM time.
//   ptc-bench-sgemm [n=1024] [threads=0 (all cores)] [repeats=10]

#include "bench/best_seconds.h"
#include "kernels/cpu/kernels.h"

#include <oneapi/dnnl/dnnl.h>
#ifdef PTC_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

using ptc::bench::bestSeconds;
namespace cpu = ptc::kernels::cpu;
using cpu::F32Gemm;

namespace {
/// One product shape of the bench GPT's step: C[m x n] = op(A) op(B) over k, `count` times.
struct Product {
  int64_t m, n, k;
  bool transA, transB;
  int count;
  const char *what;
};

// Tokens T = 1024, hidden h = 256, MLP 4h, vocabulary 256 (the LM head ties
// the embedding), 4 layers: forward (x W^T), input gradients (g W), weight
// gradients (g^T x).
constexpr Product kBenchStep[] = {
    {1024, 768, 256, false, true, 4, "qkv forward"},
    {1024, 256, 256, false, true, 5, "projection, LM head forward"},
    {1024, 1024, 256, false, true, 4, "MLP up forward"},
    {1024, 256, 1024, false, true, 4, "MLP down forward"},
    {1024, 256, 768, false, false, 4, "qkv input gradient"},
    {1024, 256, 256, false, false, 5, "projection, LM head input gradient"},
    {1024, 256, 1024, false, false, 4, "MLP up input gradient"},
    {1024, 1024, 256, false, false, 4, "MLP down input gradient"},
    {768, 256, 1024, true, false, 4, "qkv weight gradient"},
    {256, 256, 1024, true, false, 5, "projection, LM head weight gradient"},
    {1024, 256, 1024, true, false, 4, "MLP up weight gradient"},
    {256, 1024, 1024, true, false, 4, "MLP down weight gradient"},
};

std::vector<float> filled(size_t size, int seed) {
  std::vector<float> v(size);
  for (size_t i = 0; i < size; ++i)
    v[i] = static_cast<float>((i * 7 + static_cast<size_t>(seed)) % 13) * 0.1f - 0.6f;
  return v;
}
} // namespace

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
  threads = omp_get_max_threads();
  const F32Gemm chosen = cpu::f32Gemm();
  std::vector<float> a(static_cast<size_t>(n) * n, 1.0f), b(a), c(a);
  const double flops = 2.0 * n * n * n;
  auto report = [&](const char *what, double seconds) {
    std::printf("%-18s sgemm %dx%dx%d: %.1f GFLOP/s (best of %d, %d threads)\n", what, n, n, n,
                flops / seconds / 1e9, repeats, threads);
  };
  report("oneDNN", bestSeconds(repeats, [&] {
           dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
         }));
#ifdef PTC_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
  report("OpenBLAS", bestSeconds(repeats, [&] {
           cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n,
                       b.data(), n, 0.0f, c.data(), n);
         }));
#endif
  const F32Gemm libraries[] = {F32Gemm::OneDnn, F32Gemm::OpenBlas};
  const ptc::kernels::Shape s{n, n};
  for (F32Gemm library : libraries) {
    if (!cpu::f32GemmBuilt(library))
      continue;
    cpu::setF32Gemm(library);
    char label[64];
    std::snprintf(label, sizeof label, "ptc (%s)%s", cpu::f32GemmName(library),
                  library == cpu::f32GemmLibraryOf(chosen, false, false) ? "*" : "");
    report(label, bestSeconds(repeats, [&] {
             cpu::matmul(a.data(), s, b.data(), s, c.data(), false, false);
           }));
  }

  std::printf("\nptc's matmul on the bench GPT's step (1024 tokens, hidden 256, 4 layers), GFLOP/s, "
              "best of %d, %d threads:\n%-40s %5s %5s %5s %10s %10s\n",
              repeats, threads, "product", "m", "n", "k", "oneDNN", "OpenBLAS");
  double total[2] = {0, 0}, mixed = 0; // mixed: each product on F32Gemm::Mixed's library
  for (const Product &p : kBenchStep) {
    ptc::kernels::Shape as = p.transA ? ptc::kernels::Shape{p.k, p.m} : ptc::kernels::Shape{p.m, p.k};
    ptc::kernels::Shape bs = p.transB ? ptc::kernels::Shape{p.n, p.k} : ptc::kernels::Shape{p.k, p.n};
    std::vector<float> pa = filled(static_cast<size_t>(p.m * p.k), 1),
                       pb = filled(static_cast<size_t>(p.k * p.n), 2),
                       pc(static_cast<size_t>(p.m * p.n));
    const double productFlops = 2.0 * p.m * p.n * p.k;
    double rate[2] = {0, 0};
    for (int l = 0; l < 2; ++l) {
      if (!cpu::f32GemmBuilt(libraries[l]))
        continue;
      cpu::setF32Gemm(libraries[l]);
      double seconds = bestSeconds(repeats, [&] {
        cpu::matmul(pa.data(), as, pb.data(), bs, pc.data(), p.transA, p.transB);
      });
      rate[l] = productFlops / seconds / 1e9;
      total[l] += seconds * p.count;
      if (libraries[l] == cpu::f32GemmLibraryOf(F32Gemm::Mixed, p.transA, p.transB))
        mixed += seconds * p.count;
    }
    char name[64];
    std::snprintf(name, sizeof name, "%s (%c%c) x%d", p.what, p.transA ? 'T' : 'N',
                  p.transB ? 'T' : 'N', p.count);
    std::printf("%-40s %5lld %5lld %5lld %10.1f %10.1f\n", name, static_cast<long long>(p.m),
                static_cast<long long>(p.n), static_cast<long long>(p.k), rate[0], rate[1]);
  }
  if (cpu::f32GemmBuilt(F32Gemm::OpenBlas))
    std::printf("step's products: oneDNN %.1f ms, OpenBLAS %.1f ms (OpenBLAS / oneDNN %.2fx), "
                "mixed (oneDNN for A B^T, OpenBLAS for the rest) %.1f ms (%.2fx oneDNN, %.2fx "
                "OpenBLAS); ptc's choice here: %s\n",
                total[0] * 1e3, total[1] * 1e3, total[1] / total[0], mixed * 1e3,
                mixed / total[0], mixed / total[1], cpu::f32GemmName(chosen));
  else
    std::printf("step's products: oneDNN %.1f ms (built without OpenBLAS)\n", total[0] * 1e3);
  cpu::setF32Gemm(chosen);
  return 0;
}
