// ptc-bench-cuda-attention: causal attention on the GPU through the CUDA
// device's kernel table, as ptc-run calls it: CausalAttentionQkv (forward)
// with its rows' softmax statistics, and CausalAttentionQkvGrad (backward)
// given the forward's result and those statistics, on a fused projection
// [batch, seq, (heads + 2 kvHeads) * dim], bf16 (with --f32: f32, which
// runs on the tiled CUDA-core kernels); and, last column, the
// backward without them (it recomputes the forward first). One line
// per shape: the median time of `rounds` rounds of `repeats` calls each (the
// device synchronized around a round) and the rate in TFLOP/s, counting the
// causal half of the products (forward 2 products, backward 5, of 2 b h s^2 d
// FLOPs each, halved) as FlashAttention's benchmarks do (the recomputing
// backward's extra forward is not counted).
//   ptc-bench-cuda-attention [--f32] [NAME:BATCH:HEADS:KVHEADS:SEQ:DIM ...]
// Default shapes: GPT-2 medium's layer (8:16:16:1024:64) and a Llama-style
// grouped-query layer (4:32:8:2048:128). The first line names what runs the
// bf16 attention (cuDNN's fused attention, or why not).

#include "kernels/common/kernel_call.h"
#include "runtime/device/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {
using namespace ptc;

struct Shape5 {
  std::string name;
  int64_t batch, heads, kvHeads, seq, dim;
};

bool parseShape(const std::string &text, Shape5 &out) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == ':') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  if (parts.size() != 6)
    return false;
  out.name = parts[0];
  int64_t *fields[5] = {&out.batch, &out.heads, &out.kvHeads, &out.seq, &out.dim};
  for (int i = 0; i < 5; ++i) {
    char *end = nullptr;
    *fields[i] = std::strtoll(parts[static_cast<size_t>(i) + 1].c_str(), &end, 10);
    if (*end || *fields[i] <= 0)
      return false;
  }
  return out.heads % out.kvHeads == 0;
}

int fail(const std::string &what, const Status &s) {
  std::fprintf(stderr, "ptc-bench-cuda-attention: %s: %s\n", what.c_str(), s.message().c_str());
  return 1;
}
} // namespace

int main(int argc, char **argv) {
  std::vector<Shape5> shapes;
  bool f32 = false;
  for (int i = 1; i < argc; ++i) {
    Shape5 s;
    if (std::string(argv[i]) == "--f32") {
      f32 = true;
      continue;
    }
    if (!parseShape(argv[i], s)) {
      std::fprintf(stderr,
                   "ptc-bench-cuda-attention: '%s' is not --f32 or NAME:BATCH:HEADS:KVHEADS:SEQ:DIM "
                   "(positive sizes, kv heads dividing heads)\n",
                   argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty())
    shapes = {{"gpt2-medium", 8, 16, 16, 1024, 64}, {"llama-gqa", 4, 32, 8, 2048, 128}};
  if (!cudaGpuAvailable()) {
    std::fprintf(stderr, "ptc-bench-cuda-attention: no GPU visible\n");
    return 1;
  }
  auto dev = createCudaDevice(0);
  if (!dev.isOk())
    return fail("creating the CUDA device", dev.status());
  Device &d = **dev;
  std::printf("device: %s\n", d.describe().c_str());
  std::printf("element type: %s\n", f32 ? "f32" : "bf16");
  const kernels::DType type = f32 ? kernels::DType::F32 : kernels::DType::BF16;
  const int64_t elementBytes = f32 ? 4 : 2;
  std::printf("%-12s %5s %5s %4s %5s %4s  %10s %8s  %10s %8s  %10s  %14s\n", "shape", "batch",
              "heads", "kv", "seq", "dim", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "fwd+bwd ms",
              "bwd recomp. ms");
  const int repeats = 10, rounds = 5;
  for (const Shape5 &s : shapes) {
    const int64_t width = (s.heads + 2 * s.kvHeads) * s.dim;
    const Shape qkvShape{s.batch, s.seq, width}, headShape{s.batch, s.seq, s.heads, s.dim};
    const int64_t nQkv = s.batch * s.seq * width, nHeads = s.batch * s.seq * s.heads * s.dim;
    std::vector<void *> owned;
    auto alloc = [&](int64_t elements) -> void * {
      auto p = d.allocate(elements * elementBytes);
      if (!p.isOk())
        return nullptr;
      owned.push_back(*p);
      return *p;
    };
    const int64_t nStats = s.batch * s.heads * s.seq; // f32 (bf16: two elements each)
    void *qkv = alloc(nQkv), *dqkv = alloc(nQkv), *out = alloc(nHeads), *g = alloc(nHeads),
         *stats = alloc(f32 ? nStats : 2 * nStats);
    if (!qkv || !dqkv || !out || !g || !stats) {
      std::fprintf(stderr, "ptc-bench-cuda-attention: %s does not fit the GPU\n", s.name.c_str());
      return 1;
    }
    // Random inputs (never zeros: they run faster than real data).
    {
      std::mt19937 gen(7);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> host(static_cast<size_t>(std::max(nQkv, nHeads)));
      for (float &x : host)
        x = dist(gen);
      auto put = [&](void *dst, int64_t n) -> Status {
        auto tmp = d.allocate(n * 4);
        PTC_RETURN_IF_ERROR(tmp.status());
        PTC_RETURN_IF_ERROR(d.copy(*tmp, host.data(), n * 4, CopyKind::HostToDevice));
        PTC_RETURN_IF_ERROR(d.convertFloat(*tmp, FloatType::F32, dst,
                                           f32 ? FloatType::F32 : FloatType::BF16, n));
        PTC_RETURN_IF_ERROR(d.synchronize());
        d.release(*tmp);
        return Status::ok();
      };
      for (auto [p, n] : {std::pair{qkv, nQkv}, std::pair{g, nHeads}})
        if (Status st = put(p, n); !st.isOk())
          return fail("filling the inputs", st);
    }
    const Shape statsShape{s.batch, s.heads, s.seq};
    kernels::TensorView vQkv{qkv, type, &qkvShape, nQkv}, vOut{out, type, &headShape, nHeads},
        vG{g, type, &headShape, nHeads}, vDqkv{dqkv, type, &qkvShape, nQkv},
        vStats{stats, kernels::DType::F32, &statsShape, nStats};
    const std::vector<int64_t> ints;
    const std::vector<double> floats{1.0 / std::sqrt(static_cast<double>(s.dim))};
    std::vector<kernels::TensorView> fwdIn{vQkv}, fwdOut{vOut, vStats},
        bwdIn{vQkv, vG, vOut, vStats}, recomputeIn{vQkv, vG}, bwdOut{vDqkv};
    kernels::KernelCall fwd =
        kernels::makeKernelCall(kernels::OpKind::CausalAttentionQkv, fwdIn, fwdOut, ints, floats);
    kernels::KernelCall bwd = kernels::makeKernelCall(kernels::OpKind::CausalAttentionQkvGrad,
                                                      bwdIn, bwdOut, ints, floats);
    kernels::KernelCall recompute = kernels::makeKernelCall(
        kernels::OpKind::CausalAttentionQkvGrad, recomputeIn, bwdOut, ints, floats);
    bool refused = false;
    for (const kernels::KernelCall *c : {&fwd, &bwd, &recompute})
      if (!d.kernelTable()[c->op].accepts(*c)) {
        std::printf("%s: %s runs widened (the reason is above); not timed\n", s.name.c_str(),
                    kernels::opKindName(c->op));
        refused = true;
      }
    if (refused) {
      for (void *p : owned)
        d.release(p);
      continue;
    }
    // One round: `repeats` calls, the device synchronized after.
    auto round = [&](const kernels::KernelCall &c) -> double {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < repeats; ++r)
        if (Status st = d.launch(c); !st.isOk()) {
          fail(kernels::opKindName(c.op), st);
          std::exit(1);
        }
      if (Status st = d.synchronize(); !st.isOk()) {
        fail(kernels::opKindName(c.op), st);
        std::exit(1);
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
             repeats;
    };
    auto median = [&](const kernels::KernelCall &c) {
      round(c); // warm-up: plans, scratch
      std::vector<double> t;
      for (int i = 0; i < rounds; ++i)
        t.push_back(round(c));
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    // The forward first: the backward reads its result and statistics.
    const double tf = median(fwd), tb = median(bwd), tr = median(recompute);
    const double product = 2.0 * s.batch * s.heads * s.seq * s.seq * s.dim / 2; // causal half
    std::printf("%-12s %5lld %5lld %4lld %5lld %4lld  %10.3f %8.1f  %10.3f %8.1f  %10.3f  %14.3f\n",
                s.name.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.heads),
                static_cast<long long>(s.kvHeads), static_cast<long long>(s.seq),
                static_cast<long long>(s.dim), tf * 1e3, 2 * product / tf / 1e12, tb * 1e3,
                5 * product / tb / 1e12, (tf + tb) * 1e3, tr * 1e3);
    for (void *p : owned)
      d.release(p);
  }
  return 0;
}
