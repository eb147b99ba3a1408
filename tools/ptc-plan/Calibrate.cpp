//===- Calibrate.cpp - this machine's kernels and links, measured ---------===//
//
// `ptc-plan --calibrate`: ptc's own CPU kernels (GEMMs through OpenBLAS split
// over OpenMP threads, the fused causal attention forward + backward,
// elementwise adds) timed at several sizes for every thread count from 1 to
// the core count, and ptc's MPI communicator timed by `mpirun -np 2` of this
// program (`--measure-links`): all-reduce at sizes from 4 KiB to 16 MiB,
// fitted to latency + bytes / bus bandwidth.
//
//===----------------------------------------------------------------------===//

#include "Calibrate.h"

#include "kernels/cpu/kernels.h"
#include "runtime/comm/communicator.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::plan {
namespace {
using Clock = std::chrono::steady_clock;

/// Seconds per call of `fn`, the best of repeated batches of at least `minSeconds`.
template <typename Fn> double timeIt(Fn fn, double minSeconds = 0.05) {
  fn(); // warm-up
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    int calls = 0;
    auto start = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < minSeconds);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

ComputeProfile measureProfile(int threads, llvm::raw_ostream &log) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  ComputeProfile p;
  p.threads = threads;
  std::vector<float> a, b, c;
  // GEMMs of the shapes transformer layers have: [rows, k] x [k, n].
  for (int64_t s : {32, 64, 128, 256, 512, 1024}) {
    int64_t m = 1024, k = s, n = s;
    a.assign(static_cast<size_t>(m * k), 0.5f);
    b.assign(static_cast<size_t>(k * n), 0.25f);
    c.assign(static_cast<size_t>(m * n), 0.f);
    double t = timeIt([&] { kernels::cpu::matmul(a.data(), {m, k}, b.data(), {k, n}, c.data(), false, false); });
    double flops = 2.0 * m * k * n;
    p.matmul.push_back({flops, flops / t});
  }
  // Causal attention forward + backward, priced by the planner at 3.5x the
  // forward's 4 B H S^2 D FLOPs (the backward recomputes the probabilities).
  for (int64_t s : {64, 128, 256, 512}) {
    int64_t batch = 1, heads = 4, dim = 64;
    size_t n = static_cast<size_t>(batch * heads * s * dim);
    std::vector<float> q(n, 0.01f), kk(n, 0.02f), v(n, 0.03f), o(n), g(n, 0.01f), dq(n), dk(n), dv(n);
    kernels::Shape shape{batch, heads, s, dim};
    double t = timeIt([&] {
      kernels::cpu::causalAttention(q.data(), kk.data(), v.data(), o.data(), shape, heads, 0.125f);
      kernels::cpu::causalAttentionGrad(q.data(), kk.data(), v.data(), g.data(), dq.data(), dk.data(), dv.data(),
                                        shape, heads, 0.125f);
    });
    double flops = 4.0 * batch * heads * s * s * dim;
    p.attention.push_back({flops, 3.5 * flops / t});
  }
  // Elementwise work: bytes read and written per second.
  for (int64_t n : {16384, 262144, 4194304}) {
    a.assign(static_cast<size_t>(n), 1.f);
    b.assign(static_cast<size_t>(n), 2.f);
    c.assign(static_cast<size_t>(n), 0.f);
    double t = timeIt([&] {
      kernels::cpu::binary(kernels::cpu::Binary::Add, a.data(), {n}, b.data(), {n}, c.data(), {n});
    });
    double bytes = 12.0 * n;
    p.memory.push_back({bytes, bytes / t});
  }
  log << "  " << threads << " thread(s): GEMM " << p.matmul.back().throughput / 1e9 << " GFLOP/s (1024x1024x1024), "
      << "attention " << p.attention.back().throughput / 1e9 << " GFLOP/s, elementwise "
      << p.memory.back().throughput / 1e9 << " GB/s\n";
  return p;
}
} // namespace

int measureLinks(const std::string &outPath) {
  Mesh mesh{{"dp"}, {2}};
  auto created = createMpiCommunicator(mesh, 60.0);
  if (!created.isOk()) {
    std::fprintf(stderr, "ptc-plan: error: %s\n", created.status().message().c_str());
    return 1;
  }
  Communicator &c = **created;
  nlohmann::json points = nlohmann::json::array();
  for (int64_t bytes = 4096; bytes <= (16 << 20); bytes *= 4) {
    std::vector<float> data(static_cast<size_t>(bytes / 4), 1.f);
    double t = timeIt([&] { (void)c.allReduceSum(data.data(), bytes / 4, {0}, "calibration"); }, 0.1);
    // Every rank decides on rank 0's time.
    std::vector<float> mine{static_cast<float>(t)};
    (void)c.allReduceMax(mine.data(), 1, {0}, "calibration");
    points.push_back({bytes, mine[0]});
  }
  if (c.rank() == 0) {
    std::ofstream out(outPath);
    out << points.dump() << "\n";
  }
  return 0;
}

llvm::Expected<Cluster> calibrate(const std::string &self, llvm::raw_ostream &log) {
  Cluster c;
  c.name = "this machine (calibrated)";
  c.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  c.devicesPerNode = c.cores;
  c.source = "ptc-plan --calibrate: ptc's CPU kernels and MPI communicator, measured";
  c.overlap = false;
  // Memory: what the machine has, shared by the ranks (a rank's limit).
  if (std::FILE *f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long kb = 0;
    if (std::fscanf(f, "%63s %lld", key, &kb) == 2)
      c.memoryBytes = static_cast<double>(kb) * 1024.0;
    std::fclose(f);
  }
  log << "ptc-plan: calibrating " << c.cores << " core(s)\n";
  for (int t = 1; t <= c.cores; ++t)
    c.profiles.push_back(measureProfile(t, log));
  c.peakFlops = {{"f32", c.profiles.back().matmul.back().throughput}};
  c.memoryBandwidth = c.profiles.back().memory.back().throughput;
  // Links: two ranks of ptc's MPI communicator.
  std::string tmp = "/tmp/ptc-plan-links-" + std::to_string(::getpid()) + ".json";
  std::string cmd = "mpirun --oversubscribe -np 2 " + self + " --measure-links " + tmp + " > /dev/null";
  if (std::system(cmd.c_str()) != 0)
    return llvm::createStringError("measuring the links failed: '" + cmd + "'");
  std::ifstream in(tmp);
  nlohmann::json points = nlohmann::json::parse(in, nullptr, false);
  std::remove(tmp.c_str());
  if (points.is_discarded() || !points.is_array() || points.size() < 2)
    return llvm::createStringError("the link measurement wrote no points");
  // Least squares t = steps * latency + factor * n / bw (all-reduce of 2: steps 2, factor 1).
  double sx = 0, sy = 0, sxx = 0, sxy = 0, k = static_cast<double>(points.size());
  for (const auto &p : points) {
    double x = p[0].get<double>(), y = p[1].get<double>();
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  double slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
  double intercept = (sy - slope * sx) / k;
  if (slope <= 0)
    return llvm::createStringError("the link measurement is not increasing with size");
  c.intraNode = {1.0 / slope, std::max(0.0, intercept / 2.0)};
  c.interNode = c.intraNode;
  log << "  MPI all-reduce (2 ranks): latency " << c.intraNode.latency * 1e6 << " us per step, bus bandwidth "
      << c.intraNode.busBandwidth / 1e9 << " GB/s\n";
  return c;
}

} // namespace ptc::plan
