#include "runtime/session/throughput.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace ptc {

namespace {
const char *typeName(FloatType type) {
  return type == FloatType::F32 ? "f32" : type == FloatType::BF16 ? "bf16" : "f16";
}
} // namespace

std::optional<FloatType> planMatmulLowPrecision(const LoadedPlan &plan) {
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    if (inst->op() != plan::OpCode::Matmul || inst->outputs()->size() == 0)
      continue;
    plan::DType t = plan.tensor(inst->outputs()->Get(0)).dtype;
    if (t == plan::DType::BF16)
      return FloatType::BF16;
    if (t == plan::DType::F16)
      return FloatType::F16;
  }
  return std::nullopt;
}

FloatType matmulComputeType(const LoadedPlan &plan, const Device &device) {
  std::optional<FloatType> low = planMatmulLowPrecision(plan);
  return low && !device.lowPrecisionMatmul(*low).empty() ? *low : FloatType::F32;
}

StatusOr<PeakRate> measureMatmulPeak(Device &device, FloatType type, int64_t n, double seconds) {
  const int64_t bytes = n * n * (type == FloatType::F32 ? 4 : 2);
  void *buffers[3] = {nullptr, nullptr, nullptr};
  auto releaseAll = [&] {
    for (void *p : buffers)
      if (p)
        device.release(p);
  };
  for (void *&p : buffers) {
    auto allocated = device.allocate(bytes);
    if (!allocated.isOk()) {
      releaseAll();
      return allocated.status();
    }
    p = *allocated;
    if (Status s = device.zero(p, bytes); !s.isOk()) {
      releaseAll();
      return s;
    }
  }
  // The device's Matmul kernel, as a plan's instruction calls it.
  const Shape shape{n, n};
  const kernels::DType dtype = type == FloatType::F32    ? kernels::DType::F32
                               : type == FloatType::BF16 ? kernels::DType::BF16
                                                         : kernels::DType::F16;
  kernels::TensorView in[2], out[1];
  for (int i = 0; i < 2; ++i)
    in[i] = {buffers[i], dtype, &shape, n * n};
  out[0] = {buffers[2], dtype, &shape, n * n};
  const std::array<int64_t, 2> noTranspose = {0, 0};
  const std::array<double, 0> noFloats{};
  kernels::KernelCall call =
      kernels::makeKernelCall(kernels::OpKind::Matmul, in, out, noTranspose, noFloats);
  const kernels::KernelEntry &entry = device.kernelTable()[kernels::OpKind::Matmul];
  if (!entry.run || !entry.accepts(call)) {
    releaseAll();
    return error(StatusCode::kUnimplemented, "no ", type == FloatType::F32 ? "f32" : "native low-precision",
                 " matmul on ", device.describe());
  }
  auto once = [&]() -> Status { return device.launch(call); };
  Status s = once(); // warm-up: primitive creation, first-touch pages
  if (s.isOk())
    s = device.synchronize();
  // The best run: a peak, not an average over whatever else the node does.
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  int64_t runs = 0;
  double elapsed = 0.0, best = 0.0;
  while (s.isOk() && (runs < 3 || elapsed < seconds)) {
    auto t0 = Clock::now();
    s = once();
    if (s.isOk())
      s = device.synchronize();
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    best = runs++ == 0 ? t : std::min(best, t);
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  releaseAll();
  if (!s.isOk())
    return s;
  PeakRate peak;
  peak.tflops = 2.0 * static_cast<double>(n) * n * n / best / 1e12;
  peak.what = std::string(typeName(type)) +
              " matmul " + std::to_string(n) + "^3, best of " + std::to_string(runs) + " runs";
  return peak;
}

std::optional<PeakRate> knownMatmulPeak(const std::string &device, FloatType type) {
  if (type == FloatType::F32)
    return std::nullopt;
  struct Known {
    const char *name;
    double tflops;
  };
  // Dense (no sparsity) bf16 / f16 tensor-core rates; the PCIe H100 first.
  static const Known table[] = {{"H100 PCIe", 756.0}, {"H100", 989.4}, {"H200", 989.4}, {"A100", 312.0}};
  for (const Known &k : table)
    if (device.find(k.name) != std::string::npos)
      return PeakRate{k.tflops, std::string(k.name) + " dense " + (type == FloatType::BF16 ? "bf16" : "f16") +
                                    ", NVIDIA's datasheet"};
  return std::nullopt;
}

std::string defaultPeakCacheFile() {
  if (const char *path = std::getenv("PTC_PEAK_CACHE"))
    return path;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/ptc/matmul-peak.tsv";
  if (const char *home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/ptc/matmul-peak.tsv";
  return "";
}

StatusOr<PeakRate> matmulPeak(Device &device, FloatType type, int ranks, const std::string &cacheFile,
                              bool update) {
  if (std::optional<PeakRate> known = knownMatmulPeak(device.describe(), type))
    return *known;
  auto measured = measureMatmulPeak(device, type);
  if (!measured.isOk() || cacheFile.empty())
    return measured;
  PeakRate peak = *measured;
  const std::string key = device.describe() + " | " + typeName(type) + " | " + std::to_string(ranks) +
                          (ranks == 1 ? " rank" : " ranks");
  // The file's lines, this key's best.
  std::vector<std::pair<std::string, double>> lines;
  double best = 0.0;
  {
    std::ifstream in(cacheFile);
    std::string line;
    while (std::getline(in, line)) {
      size_t tab = line.rfind('\t');
      if (tab == std::string::npos)
        continue;
      char *end = nullptr;
      double v = std::strtod(line.c_str() + tab + 1, &end);
      if (!(v > 0.0) || !std::isfinite(v))
        continue;
      lines.push_back({line.substr(0, tab), v});
      if (lines.back().first == key)
        best = std::max(best, v);
    }
  }
  if (best > peak.tflops) {
    peak.tflops = best;
    char text[64];
    std::snprintf(text, sizeof text, "%.3g", best);
    peak.what += "; this machine's best, " + std::string(text) + " TFLOP/s, from " + cacheFile;
    return peak;
  }
  peak.what += "; this machine's best so far (" + cacheFile + ")";
  if (!update)
    return peak;
  // Written whole to a temporary and renamed: readers see the old file or the new.
  lines.erase(std::remove_if(lines.begin(), lines.end(), [&](const auto &l) { return l.first == key; }),
              lines.end());
  lines.push_back({key, peak.tflops});
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cacheFile).parent_path(), ec);
  const std::string tmp = cacheFile + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    for (const auto &[k, v] : lines)
      out << k << '\t' << v << '\n';
    if (!out)
      ec = std::make_error_code(std::errc::io_error);
  }
  if (ec || (std::filesystem::rename(tmp, cacheFile, ec), ec))
    std::filesystem::remove(tmp, ec); // the measurement stands; the cache is a convenience
  return peak;
}

} // namespace ptc
