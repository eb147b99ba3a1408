// ptc-bench-cuda-matmul: the Matmul entry of the CUDA device's kernel table
// (what ptc-run calls) on the products of a GPT layer and its LM head, bf16,
// forward and both gradients: one line per product with its median time of 5
// rounds of 10 calls and TFLOP/s, then the step's total for `layers` layers.
//   ptc-bench-cuda-matmul [tokens=8192] [hidden=1024] [vocab=50257] [layers=24]
// Shows which shapes run far from the GPU's matrix rate (a vocabulary that is
// not a multiple of 8 leaves the logits' rows unaligned for the tensor cores).

#include "kernels/common/kernel_call.h"
#include "runtime/device/device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {
using namespace ptc;

struct Product {
  std::string name;
  int64_t m, k, n;
  bool transA, transB;
  int count; // per layer (or per step for the head)
  bool perLayer;
};
} // namespace

int main(int argc, char **argv) {
  auto arg = [&](int i, int64_t fallback) {
    return argc > i ? std::strtoll(argv[i], nullptr, 10) : fallback;
  };
  const int64_t tokens = arg(1, 8192), hidden = arg(2, 1024), vocab = arg(3, 50257),
                layers = arg(4, 24);
  if (tokens <= 0 || hidden <= 0 || vocab <= 0 || layers <= 0) {
    std::fprintf(stderr, "usage: ptc-bench-cuda-matmul [tokens] [hidden] [vocab] [layers]\n");
    return 2;
  }
  if (!cudaGpuAvailable()) {
    std::fprintf(stderr, "ptc-bench-cuda-matmul: no GPU visible\n");
    return 1;
  }
  auto dev = createCudaDevice(0);
  if (!dev.isOk()) {
    std::fprintf(stderr, "ptc-bench-cuda-matmul: %s\n", dev.status().message().c_str());
    return 1;
  }
  Device &d = **dev;
  const int64_t h = hidden, t = tokens;
  // Forward x[t, k] w[k, n]; input gradient g[t, n] w^T; weight gradient x^T g.
  std::vector<Product> products;
  for (auto [name, k, n] : {std::tuple{"qkv", h, 3 * h}, std::tuple{"attn-proj", h, h},
                            std::tuple{"fc", h, 4 * h}, std::tuple{"mlp-proj", 4 * h, h}}) {
    products.push_back({std::string(name) + " fwd", t, k, n, false, false, 1, true});
    products.push_back({std::string(name) + " dx", t, n, k, false, true, 1, true});
    products.push_back({std::string(name) + " dw", k, t, n, true, false, 1, true});
  }
  // The tied LM head: logits = x wte^T, dx = g wte, dwte = g^T x.
  products.push_back({"head fwd", t, h, vocab, false, true, 1, false});
  products.push_back({"head dx", t, vocab, h, false, false, 1, false});
  products.push_back({"head dw", vocab, t, h, true, false, 1, false});

  std::printf("device: %s\n", d.describe().c_str());
  std::printf("%-16s %6s %6s %6s %3s  %9s %8s\n", "product", "m", "k", "n", "t", "ms",
              "TFLOP/s");
  double layerMs = 0, headMs = 0, layerFlop = 0, headFlop = 0;
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Product &p : products) {
    const Shape as = p.transA ? Shape{p.k, p.m} : Shape{p.m, p.k};
    const Shape bs = p.transB ? Shape{p.n, p.k} : Shape{p.k, p.n};
    const Shape os{p.m, p.n};
    std::vector<void *> owned;
    auto filled = [&](int64_t n) -> void * {
      std::vector<float> host(static_cast<size_t>(n));
      for (float &x : host)
        x = dist(gen);
      auto f = d.allocate(n * 4), b = d.allocate(n * 2);
      if (!f.isOk() || !b.isOk() ||
          !d.copy(*f, host.data(), n * 4, CopyKind::HostToDevice).isOk() ||
          !d.convertFloat(*f, FloatType::F32, *b, FloatType::BF16, n).isOk()) {
        std::fprintf(stderr, "ptc-bench-cuda-matmul: cannot fill %lld elements\n",
                     static_cast<long long>(n));
        std::exit(1);
      }
      if (!d.synchronize().isOk())
        std::exit(1);
      d.release(*f);
      owned.push_back(*b);
      return *b;
    };
    void *a = filled(p.m * p.k), *b = filled(p.k * p.n), *o = filled(p.m * p.n);
    const kernels::DType bf16 = kernels::DType::BF16;
    std::vector<kernels::TensorView> in{{a, bf16, &as, p.m * p.k}, {b, bf16, &bs, p.k * p.n}};
    std::vector<kernels::TensorView> out{{o, bf16, &os, p.m * p.n}};
    const std::vector<int64_t> ints{p.transA ? 1 : 0, p.transB ? 1 : 0};
    const std::vector<double> floats;
    kernels::KernelCall call = kernels::makeKernelCall(kernels::OpKind::Matmul, in, out, ints, floats);
    auto round = [&] {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < 10; ++r)
        if (Status st = d.launch(call); !st.isOk()) {
          std::fprintf(stderr, "ptc-bench-cuda-matmul: %s\n", st.message().c_str());
          std::exit(1);
        }
      if (!d.synchronize().isOk())
        std::exit(1);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10;
    };
    round();
    std::vector<double> times;
    for (int i = 0; i < 5; ++i)
      times.push_back(round());
    std::sort(times.begin(), times.end());
    const double s = times[2], flop = 2.0 * p.m * p.k * p.n;
    std::printf("%-16s %6lld %6lld %6lld %d%d  %9.3f %8.1f\n", p.name.c_str(),
                static_cast<long long>(p.m), static_cast<long long>(p.k),
                static_cast<long long>(p.n), p.transA, p.transB, s * 1e3, flop / s / 1e12);
    (p.perLayer ? layerMs : headMs) += s * 1e3 * p.count;
    (p.perLayer ? layerFlop : headFlop) += flop * p.count;
    for (void *q : owned)
      d.release(q);
  }
  const double totalMs = layerMs * static_cast<double>(layers) + headMs;
  std::printf("step's products: %lld layers x %.3f ms + head %.3f ms = %.2f ms, %.1f TFLOP/s\n",
              static_cast<long long>(layers), layerMs, headMs, totalMs,
              (layerFlop * static_cast<double>(layers) + headFlop) / (totalMs * 1e-3) / 1e12);
  return 0;
}
