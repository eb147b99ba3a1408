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

#include "planner/Calibrate.h"
#include "planner/Planner.h"

#include "dialects/ptc/PtcOps.h"
#include "kernels/cpu/kernels.h"
#include "passes/Passes.h"
#include "runtime/base/subprocess.h"
#include "runtime/comm/communicator.h"
#include "models/Models.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <unistd.h>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::planner {
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
      kernels::cpu::binary(kernels::BinaryOp::Add, a.data(), {n}, b.data(), {n}, c.data(), {n});
    });
    double bytes = 12.0 * n;
    p.memory.push_back({bytes, bytes / t});
  }
  log << llvm::format("  %d thread(s): GEMM %.1f GFLOP/s (1024 x 1024 x 1024), attention %.1f GFLOP/s, "
                       "elementwise %.1f GB/s\n",
                       threads, p.matmul.back().throughput / 1e9, p.attention.back().throughput / 1e9,
                       p.memory.back().throughput / 1e9);
  return p;
}
} // namespace

namespace {
/// Seconds per call of `op` (which fails with a Status) on both ranks: the
/// same number of calls everywhere (a count from the size, not from each
/// rank's clock), the best of three batches after a warm-up one, the slower
/// rank's time.
StatusOr<double> timeCollectively(Communicator &c, int calls, const std::function<Status(int)> &op) {
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    auto start = Clock::now();
    for (int i = 0; i < calls; ++i)
      PTC_RETURN_IF_ERROR(op(i));
    double t = std::chrono::duration<double>(Clock::now() - start).count() / calls;
    if (rep > 0)
      best = std::min(best, t);
  }
  std::vector<float> mine{static_cast<float>(best)};
  PTC_RETURN_IF_ERROR(c.allReduceMax(mine.data(), 1, {0}, "calibration"));
  return static_cast<double>(mine[0]);
}

int timeLinks(const std::string &outPath) {
  Mesh mesh{{"dp"}, {2}};
  auto created = createMpiCommunicator(mesh, 60.0);
  if (!created.isOk()) {
    std::fprintf(stderr, "ptc-plan: error: %s\n", created.status().message().c_str());
    return 1;
  }
  Communicator &c = **created;
  nlohmann::json points = nlohmann::json::array(), p2p = nlohmann::json::array();
  for (int64_t bytes = 64; bytes <= (16 << 20); bytes *= 4) {
    std::vector<float> data(static_cast<size_t>(bytes / 4), 1.f);
    int calls = static_cast<int>(std::clamp<int64_t>((int64_t{64} << 20) / bytes, 4, 2000));
    // All-reduce, then a ping-pong: half its round trip is one message.
    StatusOr<double> reduce = timeCollectively(
        c, calls, [&](int) { return c.allReduceSum(data.data(), bytes / 4, {0}, "calibration"); });
    int peer = 1 - c.rank();
    StatusOr<double> roundTrip = reduce.isOk() ? timeCollectively(c, std::max(4, calls / 2), [&](int i) {
      Status s = c.rank() == 0 ? c.send(data.data(), bytes, 0, peer, i, "calibration")
                               : c.recv(data.data(), bytes, 0, peer, i, "calibration");
      if (s.isOk())
        s = c.rank() == 0 ? c.recv(data.data(), bytes, 0, peer, i, "calibration")
                          : c.send(data.data(), bytes, 0, peer, i, "calibration");
      return s.isOk() ? c.flushSends() : s;
    })
                                               : reduce;
    if (!roundTrip.isOk()) {
      std::fprintf(stderr, "ptc-plan: error: timing the links (%lld bytes): %s\n", static_cast<long long>(bytes),
                   roundTrip.status().message().c_str());
      return 1;
    }
    points.push_back({bytes, *reduce});
    p2p.push_back({bytes, *roundTrip / 2});
  }
  if (c.rank() == 0) {
    std::ofstream out(outPath);
    out << nlohmann::json{{"all_reduce", points}, {"p2p", p2p}}.dump() << "\n";
  }
  return 0;
}
/// Corrects every profile by a real step: the calibration model (not the
/// bench configuration, so that predicting the bench is a test) compiled
/// here, run by ptc-run --profile at the profile's thread count, and its time
/// per class of op divided by the isolated kernels' prediction.
llvm::Error correctByRealRuns(Cluster &c, const std::string &self, llvm::raw_ostream &log) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::ptc::PtcDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect>();
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  mlir::ptc::GptConfig g;
  g.layers = 2;
  g.hidden = 384;
  g.heads = 6;
  g.seq = 96;
  g.vocab = 512;
  g.batch = 8;
  auto module = mlir::ptc::buildGptModel(context, g);
  if (!module)
    return module.takeError();
  llvm::SmallString<128> dir;
  if (std::error_code ec = llvm::sys::fs::createUniqueDirectory("ptc-plan-calibration", dir))
    return llvm::createStringError("cannot create a temporary directory: " + ec.message());
  std::string plan = (dir + "/calibration.plan").str(), data = (dir + "/tokens.bin").str();
  {
    std::ofstream out(data, std::ios::binary);
    uint32_t x = 12345;
    for (int i = 0; i < 65536; ++i) {
      x = x * 1664525u + 1013904223u;
      uint16_t t = static_cast<uint16_t>((x >> 16) % static_cast<uint32_t>(g.vocab));
      out.write(reinterpret_cast<const char *>(&t), 2);
    }
  }
  mlir::PassManager pm(&context);
  // Typed, not option text (a plan path may hold spaces).
  mlir::ptc::CompilePipelineOptions options;
  options.optimizer = std::string(::ptc::optionName(::ptc::OptimizerKind::AdamW));
  options.plan = plan;
  mlir::ptc::buildCompilePipeline(pm, options);
  if (mlir::failed(pm.run(**module)))
    return llvm::createStringError("compiling the calibration model failed");
  mlir::func::FuncOp func;
  for (auto f : (**module).getOps<mlir::func::FuncOp>())
    func = f;
  std::string run = (llvm::sys::path::parent_path(self) + "/ptc-run").str();
  for (ComputeProfile &p : c.profiles) {
    Cluster one = c;
    one.profiles = {p};
    ClassSeconds predicted = predictClasses(func, one, 1);
    const std::vector<std::string> command = {run, plan, "--data", data, "--steps", "12", "--log-every", "0",
                                              "--profile", "--threads", std::to_string(p.threads)};
    ::ptc::ChildOptions capture;
    capture.who = "ptc-plan";
    capture.captureOutput = true;
    const ::ptc::ChildResult result = ::ptc::runChild(command, capture);
    ClassSeconds measured;
    bool inProfile = false;
    for (llvm::StringRef rest = result.output; !rest.empty();) {
      auto [line, next] = rest.split('\n');
      rest = next;
      if (line.starts_with("profile:")) {
        inProfile = true;
        continue;
      }
      char kind[128];
      double ms = 0;
      if (!inProfile || std::sscanf(line.str().c_str(), " %127s %lf ms", kind, &ms) != 2)
        continue;
      std::string k(kind);
      (k == "Matmul" ? measured.matmul : k.rfind("CausalAttention", 0) == 0 ? measured.attention : measured.other) +=
          ms * 1e-3;
    }
    if (result.status != 0 || measured.matmul <= 0)
      return llvm::createStringError("'" + ::ptc::commandText(command) + "' failed (exit status " +
                                     std::to_string(result.status) + ") or printed no profile");
    p.matmulScale = measured.matmul / predicted.matmul;
    p.attentionScale = measured.attention > 0 ? measured.attention / predicted.attention : 1.0;
    p.otherScale = measured.other / predicted.other;
    log << llvm::format("  %d thread(s), a real step (GPT 2 x 384, seq 96, batch 8): measured / the kernels' "
                         "prediction: matmul %.2f, attention %.2f, other ops %.2f\n",
                         p.threads, p.matmulScale, p.attentionScale, p.otherScale);
  }
  llvm::sys::fs::remove_directories(dir);
  return llvm::Error::success();
}
} // namespace

int measureLinks(const std::string &outPath) {
  int code = timeLinks(outPath);
  finalizeMpi();
  return code;
}

llvm::Expected<Cluster> calibrate(const std::string &self, llvm::raw_ostream &log) {
  Cluster c;
  c.name = "this machine (calibrated)";
  c.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  c.devicesPerNode = 0; // every rank on this machine
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
  if (llvm::Error e = correctByRealRuns(c, self, log))
    return std::move(e);
  c.peakFlops = {{"f32", c.profiles.back().matmul.back().throughput}};
  c.memoryBandwidth = c.profiles.back().memory.back().throughput;
  // Links: two ranks of ptc's MPI communicator.
  std::string tmp = "/tmp/ptc-plan-links-" + std::to_string(::getpid()) + ".json";
  // OpenMPI refuses root unless told; this run only times ptc-plan itself.
  ::ptc::ChildOptions quiet;
  quiet.who = "ptc-plan";
  quiet.discardOutput = true;
  if (::getuid() == 0)
    quiet.environment = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  const std::vector<std::string> links = {"mpirun", "--oversubscribe", "-np", "2", self, "--measure-links", tmp};
  if (int status = ::ptc::runChild(links, quiet).status; status != 0)
    return llvm::createStringError("measuring the links failed: '" + ::ptc::commandText(links) +
                                   "' (exit status " + std::to_string(status) + ")");
  std::ifstream in(tmp);
  nlohmann::json measured = nlohmann::json::parse(in, nullptr, false);
  std::remove(tmp.c_str());
  // t = steps * latency + n / bandwidth: the latency from the smallest message,
  // the bandwidth from the slope of a least-squares line through the points
  // of the larger half (the two largest alone swap order on a busy machine).
  auto fit = [&](const char *key, double steps) -> llvm::Expected<std::pair<double, double>> {
    if (measured.is_discarded() || !measured.is_object() || !measured.contains(key) ||
        !measured[key].is_array() || measured[key].size() < 3)
      return llvm::createStringError(std::string("the link measurement wrote no ") + key + " points");
    const nlohmann::json &pts = measured[key];
    size_t k = pts.size();
    double n0 = pts[0][0].get<double>(), t0 = pts[0][1].get<double>();
    double sn = 0, st = 0, snn = 0, snt = 0, m = 0;
    for (size_t i = k / 2; i < k; ++i) {
      double n = pts[i][0].get<double>(), t = pts[i][1].get<double>();
      sn += n;
      st += t;
      snn += n * n;
      snt += n * t;
      m += 1;
    }
    double slope = (m * snt - sn * st) / (m * snn - sn * sn);
    if (!(slope > 0)) // still not: the largest against the smallest
      slope = (pts[k - 1][1].get<double>() - t0) / (pts[k - 1][0].get<double>() - n0);
    if (!(slope > 0))
      return llvm::createStringError(std::string("the ") + key + " measurement is not increasing with size");
    return std::pair{1.0 / slope, std::max(0.0, (t0 - slope * n0) / steps)};
  };
  // An all-reduce of 2 ranks: 2 steps, factor 1.
  auto allReduce = fit("all_reduce", 2.0);
  if (!allReduce)
    return allReduce.takeError();
  auto p2p = fit("p2p", 1.0);
  if (!p2p)
    return p2p.takeError();
  c.intraNode = {allReduce->first, allReduce->second, p2p->first, p2p->second};
  c.interNode = c.intraNode;
  log << llvm::format("  MPI all-reduce (2 ranks): latency %.2f us per step, bus bandwidth %.2f GB/s; "
                       "send/receive: latency %.2f us, bandwidth %.2f GB/s\n",
                       c.intraNode.latency * 1e6, c.intraNode.busBandwidth / 1e9, c.intraNode.p2pLatency * 1e6,
                       c.intraNode.p2pBandwidth / 1e9);
  return c;
}

} // namespace ptc::planner
