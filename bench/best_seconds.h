// The best wall time of `repeats` runs after one warm-up run (JIT, pages,
// caches): the figure the C++ benchmarks print.
#ifndef PTC_BENCH_BEST_SECONDS_H
#define PTC_BENCH_BEST_SECONDS_H

#include <algorithm>
#include <chrono>
#include <functional>

namespace ptc::bench {
inline double bestSeconds(int repeats, const std::function<void()> &run) {
  run();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
} // namespace ptc::bench

#endif // PTC_BENCH_BEST_SECONDS_H
