// The device abstraction: the CPU device's memory, copy and event contract
// (always), and every kernel of the CUDA device against the CPU device's on
// the same inputs (label `gpu`: "skipped: no GPU" without one).

#include "kernels/cuda/kernels.h"
#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"
#include "runtime/exec/executor.h"

#include "test/unit/PlanBuilder.h"
#include "test/unit/TestUtil.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <tuple>

namespace ptc {
namespace {
using test::randomVector;

/// Device memory for a test, freed at scope exit.
class Mem {
public:
  explicit Mem(Device &d) : d_(d) {}
  ~Mem() {
    for (void *p : owned_)
      d_.release(p);
  }
  template <typename T> T *put(const std::vector<T> &host) {
    auto p = d_.allocate(static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(p.isOk()) << p.status().message();
    owned_.push_back(*p);
    EXPECT_TRUE(d_.copy(*p, host.data(), static_cast<int64_t>(host.size() * sizeof(T)),
                        CopyKind::HostToDevice)
                    .isOk());
    return static_cast<T *>(*p);
  }
  template <typename T = float> T *zeros(size_t n) { return put(std::vector<T>(n)); }
  template <typename T = float> std::vector<T> get(const T *p, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(d_.copy(host.data(), p, static_cast<int64_t>(n * sizeof(T)), CopyKind::DeviceToHost)
                    .isOk());
    return host;
  }

private:
  Device &d_;
  std::vector<void *> owned_;
};

/// A tensor argument of a kernel call: device memory, shape, element type.
struct Arg {
  const void *data;
  Shape shape;
  kernels::DType dtype = kernels::DType::F32;
};
Arg ids(const int32_t *data, Shape shape) { return {data, std::move(shape), kernels::DType::I32}; }

/// Runs op kind `op` through `d`'s kernel table, as the executor calls it;
/// kUnimplemented where the entry does not take these element types.
Status run(Device &d, kernels::OpKind op, const std::vector<Arg> &in, const std::vector<Arg> &out,
           std::vector<int64_t> ints = {}, std::vector<double> floats = {},
           UnaryFunction fn = {}) {
  std::vector<kernels::TensorView> vi, vo;
  auto numel = [](const Shape &s) {
    int64_t n = 1;
    for (int64_t x : s)
      n *= x;
    return n;
  };
  for (const Arg &a : in)
    vi.push_back({const_cast<void *>(a.data), a.dtype, &a.shape, numel(a.shape)});
  for (const Arg &a : out)
    vo.push_back({const_cast<void *>(a.data), a.dtype, &a.shape, numel(a.shape)});
  kernels::KernelCall call = kernels::makeKernelCall(op, vi, vo, ints, floats);
  call.function = fn;
  const int64_t coords[1] = {1}, sizes[1] = {2}; // rank 1 of a 2-way axis
  call.meshCoords = coords;
  call.meshSizes = sizes;
  kernels::RandomContext random; // micro-batch 1 of 2, rows dealt to 2 parts
  random.seed = 5;
  random.step = 2;
  random.microbatch = 1;
  random.microbatches = 2;
  random.dataParts = 2;
  call.random = &random;
  const kernels::KernelEntry &entry = d.kernelTable()[op];
  if (!entry.run || !entry.accepts(call))
    return error(StatusCode::kUnimplemented, kernels::opKindName(op), " does not take these types");
  return d.launch(call);
}

TEST(CpuDevice, AllocatesZeroedAlignedMemoryAndCopies) {
  auto dev = createCpuDevice();
  EXPECT_EQ(dev->kind(), DeviceKind::Cpu);
  EXPECT_TRUE(dev->hostAddressable());
  auto p = dev->allocate(1000);
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
  const auto *bytes = static_cast<const uint8_t *>(*p);
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(bytes[i], 0) << i;
  std::vector<float> src{1, 2, 3};
  ASSERT_TRUE(dev->copy(*p, src.data(), 12, CopyKind::HostToDevice).isOk());
  ASSERT_TRUE(dev->copyOn(StreamKind::Communication, static_cast<float *>(*p) + 3, *p, 12).isOk());
  EXPECT_EQ(static_cast<float *>(*p)[4], 2.0f);
  auto ev = dev->record(StreamKind::Communication);
  ASSERT_TRUE(ev.isOk());
  EXPECT_TRUE(dev->wait(StreamKind::Compute, *ev).isOk());
  EXPECT_TRUE(dev->synchronize().isOk());
  dev->release(*p);
}

TEST(CpuDevice, BufferGrowsAndReportsCapacity) {
  auto dev = createCpuDevice();
  DeviceBuffer buf(dev.get());
  EXPECT_EQ(buf.capacity(), 0);
  ASSERT_TRUE(buf.reserve(64).isOk());
  void *first = buf.data();
  ASSERT_TRUE(buf.reserve(32).isOk());
  EXPECT_EQ(buf.data(), first); // no shrink, no move
  ASSERT_TRUE(buf.reserve(4096).isOk());
  EXPECT_EQ(buf.capacity(), 4096);
}

// Timed events (a profile's marks): the seconds between two marks cover the
// work between them; an unknown mark is an error; recycling starts over.
TEST(CpuDevice, TimedEventsMeasureTheWorkBetweenThem) {
  std::unique_ptr<Device> devices[] = {createCpuDevice(), createDiscreteCpuDevice()};
  for (auto &device : devices) {
    auto a = device->recordTimed(StreamKind::Compute);
    ASSERT_TRUE(a.isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto b = device->recordTimed(StreamKind::Compute);
    ASSERT_TRUE(b.isOk());
    auto seconds = device->secondsBetween(*a, *b);
    ASSERT_TRUE(seconds.isOk()) << seconds.status().message();
    EXPECT_GE(*seconds, 0.019);
    EXPECT_LT(*seconds, 10.0);
    EXPECT_FALSE(device->secondsBetween(*a, *b + 1).isOk());
    device->recycleEvents();
    EXPECT_FALSE(device->secondsBetween(*a, *b).isOk());
  }
}

TEST(CpuDevice, OptimizerSkipLeavesStateUnchanged) {
  auto dev = createCpuDevice();
  Mem m(*dev);
  auto p = randomVector(10, 1), g = randomVector(10, 2), mm = randomVector(10, 3);
  std::vector<float> v(10, 0.5f);
  float *dp = m.put(p), *dg = m.put(g), *dm = m.put(mm), *dv = m.put(v);
  float *step = m.put(std::vector<float>{1.0f}), *skip = m.put(std::vector<float>{1.0f});
  float *op = m.zeros(10), *om = m.zeros(10), *ov = m.zeros(10);
  auto update = [&] {
    return run(*dev, kernels::OpKind::AdamWUpdate,
               {{dp, {10}}, {dg, {10}}, {dm, {10}}, {dv, {10}}, {step, {}}, {skip, {}}},
               {{op, {10}}, {om, {10}}, {ov, {10}}}, {}, {1e-3, 0.9, 0.95, 1e-8, 0.1});
  };
  ASSERT_TRUE(update().isOk());
  EXPECT_EQ(m.get(op, 10), p);
  EXPECT_EQ(m.get(om, 10), mm);
  *skip = 0.0f;
  ASSERT_TRUE(update().isOk());
  EXPECT_NE(m.get(op, 10), p);
}

TEST(Devices, UnknownOrUnavailableDeviceIsAnError) {
  auto bad = createDevice("tpu", 0);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("unknown device 'tpu'"), std::string::npos);
  auto cpu = createDevice("cpu", 0);
  ASSERT_TRUE(cpu.isOk());
  auto any = createDevice("auto", 0);
  ASSERT_TRUE(any.isOk());
  EXPECT_EQ((*any)->kind(), cudaGpuAvailable() ? DeviceKind::Cuda : DeviceKind::Cpu);
  if (!cudaGpuAvailable()) {
    auto cuda = createDevice("cuda", 0);
    ASSERT_FALSE(cuda.isOk());
    EXPECT_TRUE(cuda.status().message().find("no usable GPU") != std::string::npos ||
                cuda.status().message().find("without CUDA") != std::string::npos)
        << cuda.status().message();
  }
}

/// Counts batched (multi-tensor) AdamW launches and their sizes on the CPU.
class CountingDevice : public CpuDevice {
public:
  Status launchBatch(kernels::KernelCall *calls, size_t count) override {
    groups.push_back(count);
    return CpuDevice::launchBatch(calls, count);
  }
  std::vector<size_t> groups;
};

TEST(ExecutorOptimizerGroups, ConsecutiveAdamWWithTheSameSettingsRunAsOneCall) {
  using plan::OpCode;
  using plan::TensorKind;
  using test::InstDesc;
  // Three parameters with their gradients (inputs) and moments; the third
  // update has another learning rate and stays on its own.
  std::vector<test::TensorDesc> t{{"step", TensorKind::OptimizerState, {}}};
  for (int p = 0; p < 3; ++p) {
    std::string n = "p" + std::to_string(p);
    t.push_back({n, TensorKind::Parameter, {5}});
    t.push_back({n + ".grad", TensorKind::Input, {5}});
    t.push_back({n + ".m", TensorKind::OptimizerState, {5}});
    t.push_back({n + ".v", TensorKind::OptimizerState, {5}});
  }
  std::vector<InstDesc> insts;
  for (int p = 0; p < 3; ++p) {
    int32_t b = 1 + 4 * p;
    insts.push_back(InstDesc{OpCode::AdamWUpdate, {b, b + 1, b + 2, b + 3, 0}, {b, b + 2, b + 3}, {},
                             {p == 2 ? 2e-3 : 1e-3, 0.9, 0.95, 1e-8, 0.0}});
  }
  auto bytes = test::buildPlan(t, insts, 0);
  auto loaded = LoadedPlan::loadBytes(bytes, "adamw.plan");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  auto counting = std::make_unique<CountingDevice>();
  CountingDevice *dev = counting.get();
  auto grouped = Executor::create(*loaded, 0, std::move(counting));
  auto reference = Executor::create(*loaded, 0); // the same updates one by one
  ASSERT_TRUE(grouped.isOk() && reference.isOk());
  for (Executor *ex : {grouped->get(), reference->get()}) {
    std::vector<float> one{1.0f};
    ASSERT_TRUE(ex->loadFromWhole(0, one.data()).isOk());
    for (int p = 0; p < 3; ++p) {
      auto g = randomVector(5, static_cast<unsigned>(p));
      ASSERT_TRUE(ex->loadFromWhole(2 + 4 * p, g.data()).isOk());
      ASSERT_TRUE(ex->loadFromWhole(1 + 4 * p, randomVector(5, 9 + p).data()).isOk());
    }
    ASSERT_TRUE(ex->step().isOk());
  }
  EXPECT_EQ(dev->groups, (std::vector<size_t>{2})); // p0 + p1; p2 ran alone
  for (int32_t id = 1; id < 13; ++id) {
    auto a = (*grouped)->gatherWhole(id), b = (*reference)->gatherWhole(id);
    ASSERT_TRUE(a.isOk() && b.isOk());
    EXPECT_EQ(*a, *b) << "tensor " << id;
  }
}

// ptc-fuse-gradient-widening hands an f32 parameter's update its bf16
// gradient: the result must be bitwise the update of the gradient widened
// to f32 (widening is exact), for AdamW and SGD; such updates run on their
// own, outside the multi-tensor groups of f32 ones.
TEST(ExecutorOptimizerGroups, UpdatesReadingBf16GradientsEqualTheWidenedOnes) {
  using plan::DType;
  using plan::OpCode;
  using plan::TensorKind;
  using test::InstDesc;
  // p0 / p2 take bf16 gradients, p1 / p3 the same values in f32.
  std::vector<test::TensorDesc> t{{"step", TensorKind::OptimizerState, {}}};
  for (int p = 0; p < 4; ++p) {
    std::string n = "p" + std::to_string(p);
    t.push_back({n, TensorKind::Parameter, {37}});
    t.push_back({n + ".grad", TensorKind::Input, {37}, -1, p % 2 == 0 ? DType::BF16 : DType::F32});
    t.push_back({n + ".m", TensorKind::OptimizerState, {37}});
    t.push_back({n + ".v", TensorKind::OptimizerState, {37}});
  }
  std::vector<InstDesc> insts;
  for (int p = 0; p < 2; ++p) {
    int32_t b = 1 + 4 * p;
    insts.push_back(InstDesc{OpCode::AdamWUpdate, {b, b + 1, b + 2, b + 3, 0}, {b, b + 2, b + 3},
                             {}, {1e-3, 0.9, 0.95, 1e-8, 0.1}});
  }
  for (int p = 2; p < 4; ++p) {
    int32_t b = 1 + 4 * p;
    insts.push_back(InstDesc{OpCode::SgdUpdate, {b, b + 1, b + 2}, {b, b + 2}, {}, {0.1, 0.9, 0.01}});
  }
  auto loaded = LoadedPlan::loadBytes(test::buildPlan(t, insts, 0), "widening.plan");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  auto counting = std::make_unique<CountingDevice>();
  CountingDevice *dev = counting.get();
  auto ex = Executor::create(*loaded, 0, std::move(counting));
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  std::vector<float> one{1.0f};
  ASSERT_TRUE((*ex)->loadFromWhole(0, one.data()).isOk());
  for (int pair = 0; pair < 2; ++pair) {
    // Gradient values bf16 holds exactly, the same parameters and moments.
    std::vector<uint16_t> g16(37);
    std::vector<float> g = randomVector(37, 3 + pair);
    for (size_t i = 0; i < g.size(); ++i) {
      g16[i] = kernels::f32ToBf16(g[i]);
      g[i] = kernels::bf16ToF32(g16[i]);
    }
    for (int p : {2 * pair, 2 * pair + 1}) {
      int32_t b = 1 + 4 * p;
      ASSERT_TRUE((*ex)->loadFromWhole(b, randomVector(37, 11 + pair).data()).isOk());
      ASSERT_TRUE((*ex)->loadFromWhole(b + 2, randomVector(37, 13 + pair).data()).isOk());
      if (p < 2) { // AdamW's second moment, non-negative
        std::vector<float> v = randomVector(37, 17);
        for (float &x : v)
          x = std::fabs(x);
        ASSERT_TRUE((*ex)->loadFromWhole(b + 3, v.data()).isOk());
      }
      ASSERT_TRUE((*ex)->loadFromWhole(b + 1, p % 2 == 0 ? static_cast<const void *>(g16.data())
                                                         : g.data())
                      .isOk());
    }
  }
  ASSERT_TRUE((*ex)->step().isOk());
  EXPECT_TRUE(dev->groups.empty()); // no group: p0's update is not an all-f32 one
  for (int pair = 0; pair < 2; ++pair)
    for (int32_t k : {0, 2, 3}) {
      if (pair == 1 && k == 3)
        continue; // SGD has no second moment
      int32_t a = 1 + 8 * pair + k, b = a + 4;
      auto x = (*ex)->gatherWhole(a), y = (*ex)->gatherWhole(b);
      ASSERT_TRUE(x.isOk() && y.isOk());
      EXPECT_EQ(*x, *y) << "tensors " << a << " and " << b;
      EXPECT_NE(*x, randomVector(37, 11 + pair)) << "tensor " << a << " was not updated";
    }
}

// ---- CUDA against CPU ----------------------------------------------------------

/// Runs `body` on the CPU and on the GPU device with the same inputs and
/// compares the float vectors it returns.
using Body = std::function<std::vector<float>(Device &, Mem &)>;

class CudaConformance : public ::testing::Test {
protected:
  void SetUp() override {
    if (!cudaGpuAvailable())
      GTEST_SKIP() << (cudaCompiledIn() ? "skipped: no GPU" : "skipped: no GPU (built without CUDA)");
    auto d = createCudaDevice(0);
    ASSERT_TRUE(d.isOk()) << d.status().message();
    gpu_ = std::move(*d);
    cpu_ = createCpuDevice();
  }
  void compare(const Body &body, float tol = 1e-5f) {
    std::vector<float> want, got;
    {
      Mem m(*cpu_);
      want = body(*cpu_, m);
    }
    {
      Mem m(*gpu_);
      got = body(*gpu_, m);
      Status s = gpu_->synchronize();
      ASSERT_TRUE(s.isOk()) << s.message();
    }
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i]))) << "at " << i;
  }
  std::unique_ptr<Device> cpu_, gpu_;
};

#define OK(expr) EXPECT_TRUE((expr).isOk())

TEST_F(CudaConformance, ElementwiseWithBroadcast) {
  auto a = randomVector(96, 1), b = randomVector(8, 2);
  for (kernels::OpKind op : {kernels::OpKind::Add, kernels::OpKind::Sub, kernels::OpKind::Mul,
                             kernels::OpKind::Div})
    compare([&](Device &d, Mem &m) {
      float *out = m.zeros(96);
      OK(run(d, op, {{m.put(a), {4, 3, 8}}, {m.put(b), {8}}}, {{out, {4, 3, 8}}}));
      return m.get(out, 96);
    });
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(96);
    OK(run(d, kernels::OpKind::Broadcast, {{m.put(b), {1, 1, 8}}}, {{out, {4, 3, 8}}}));
    return m.get(out, 96);
  });
}

TEST_F(CudaConformance, ActivationsAndGradients) {
  auto x = randomVector(1000, 3), g = randomVector(1000, 4);
  // rsqrt and log on positive inputs.
  std::vector<float> positive(x);
  for (float &v : positive)
    v = std::fabs(v) + 0.1f;
  auto inputOf = [&](UnaryFunction fn) -> const std::vector<float> & {
    return fn == UnaryFunction::Rsqrt || fn == UnaryFunction::Log ? positive : x;
  };
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(1000);
    OK(run(d, kernels::OpKind::Scale, {{m.put(x), {1000}}}, {{out, {1000}}}, {}, {0.25}));
    return m.get(out, 1000);
  });
  // Every activation the kernels know (kernels/common/elementwise.h).
#define PTC_TEST_UNARY(e, name)                                                                    \
  compare([&](Device &d, Mem &m) {                                                                 \
    float *out = m.zeros(1000);                                                                    \
    OK(run(d, kernels::OpKind::Unary, {{m.put(inputOf(UnaryFunction::e)), {1000}}},              \
           {{out, {1000}}}, {}, {}, UnaryFunction::e));                                            \
    return m.get(out, 1000);                                                                       \
  });                                                                                              \
  compare([&](Device &d, Mem &m) {                                                                 \
    float *out = m.zeros(1000);                                                                    \
    OK(run(d, kernels::OpKind::UnaryGrad,                                                        \
           {{m.put(inputOf(UnaryFunction::e)), {1000}}, {m.put(g), {1000}}}, {{out, {1000}}}, {},  \
           {}, UnaryFunction::e));                                                                 \
    return m.get(out, 1000);                                                                       \
  });
  PTC_UNARY_FUNCTIONS(PTC_TEST_UNARY)
#undef PTC_TEST_UNARY
  // Gated (SwiGLU: silu; GeGLU: gelu): f(gate) * up, and both gradients.
  auto up = randomVector(1000, 6);
  for (UnaryFunction fn : {UnaryFunction::Silu, UnaryFunction::Gelu}) {
    compare([&](Device &d, Mem &m) {
      float *out = m.zeros(1000);
      OK(run(d, kernels::OpKind::GatedUnary, {{m.put(x), {1000}}, {m.put(up), {1000}}},
             {{out, {1000}}}, {}, {}, fn));
      return m.get(out, 1000);
    });
    compare([&](Device &d, Mem &m) {
      float *dgate = m.zeros(1000), *dup = m.zeros(1000);
      OK(run(d, kernels::OpKind::GatedUnaryGrad,
             {{m.put(x), {1000}}, {m.put(up), {1000}}, {m.put(g), {1000}}},
             {{dgate, {1000}}, {dup, {1000}}}, {}, {}, fn));
      auto both = m.get(dgate, 1000), second = m.get(dup, 1000);
      both.insert(both.end(), second.begin(), second.end());
      return both;
    });
  }
}

TEST_F(CudaConformance, FloatConversionsRoundTheSame) {
  auto x = randomVector(777, 5);
  for (FloatType t : {FloatType::BF16, FloatType::F16})
    compare(
        [&](Device &d, Mem &m) {
          uint16_t *narrow = m.zeros<uint16_t>(777);
          float *back = m.zeros(777);
          OK(d.convertFloat(m.put(x), FloatType::F32, narrow, t, 777));
          OK(d.convertFloat(narrow, t, back, FloatType::F32, 777));
          auto out = m.get(back, 777);
          // Unaligned starts (the scalar kernel) give the same values.
          OK(d.convertFloat(m.put(x) + 1, FloatType::F32, narrow + 1, t, 776));
          OK(d.convertFloat(narrow + 1, t, back + 1, FloatType::F32, 776));
          auto shifted = m.get(back, 777);
          out.insert(out.end(), shifted.begin() + 1, shifted.end());
          return out;
        },
        0.0f);
}

TEST_F(CudaConformance, MatmulSharedAndBatchedWithTransposes) {
  auto a = randomVector(2 * 3 * 5 * 7, 6), b = randomVector(7 * 4, 7),
       bb = randomVector(2 * 3 * 7 * 5, 8);
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(2 * 3 * 5 * 4);
    OK(run(d, kernels::OpKind::Matmul, {{m.put(a), {2, 3, 5, 7}}, {m.put(b), {7, 4}}},
           {{out, {2, 3, 5, 4}}}, {0, 0}));
    return m.get(out, 120);
  });
  compare([&](Device &d, Mem &m) { // a^T b^T: [6, 7, 5]^T x [6, 5, 7]^T -> [6, 5, 5]
    float *out = m.zeros(6 * 5 * 5);
    OK(run(d, kernels::OpKind::Matmul, {{m.put(a), {6, 7, 5}}, {m.put(bb), {6, 5, 7}}},
           {{out, {6, 5, 5}}}, {1, 1}));
    return m.get(out, 150);
  });
  compare([&](Device &d, Mem &m) { // shared b with transposed a: [6, 7, 5]^T x [7, 4]
    float *out = m.zeros(6 * 5 * 4);
    OK(run(d, kernels::OpKind::Matmul, {{m.put(a), {6, 7, 5}}, {m.put(b), {7, 4}}},
           {{out, {6, 5, 4}}}, {1, 0}));
    return m.get(out, 120);
  });
  auto bias = randomVector(4, 9);
  compare([&](Device &d, Mem &m) { // with a bias (ptc-fuse-matmul-bias): + bias[n] on every row
    float *out = m.zeros(2 * 3 * 5 * 4);
    OK(run(d, kernels::OpKind::Matmul,
           {{m.put(a), {2, 3, 5, 7}}, {m.put(b), {7, 4}}, {m.put(bias), {4}}},
           {{out, {2, 3, 5, 4}}}, {0, 0}));
    return m.get(out, 120);
  });
}

TEST_F(CudaConformance, Bf16MatmulAccumulatesInF32) {
  // GPU: cuBLAS on bf16 with f32 accumulation; CPU: the executor's fallback
  // (widen, f32 matmul, round the result once).
  auto a = randomVector(4 * 64 * 96, 40), b = randomVector(96 * 48, 41);
  compare(
      [&](Device &d, Mem &m) {
        uint16_t *a16 = m.zeros<uint16_t>(a.size()), *b16 = m.zeros<uint16_t>(b.size()),
                 *o16 = m.zeros<uint16_t>(4 * 64 * 48);
        OK(d.convertFloat(m.put(a), FloatType::F32, a16, FloatType::BF16, a.size()));
        OK(d.convertFloat(m.put(b), FloatType::F32, b16, FloatType::BF16, b.size()));
        const auto bf16 = kernels::DType::BF16;
        Status s = run(d, kernels::OpKind::Matmul, {{a16, {4, 64, 96}, bf16}, {b16, {96, 48}, bf16}},
                       {{o16, {4, 64, 48}, bf16}}, {0, 0});
        if (s.code() == StatusCode::kUnimplemented) {
          float *aw = m.zeros(a.size()), *bw = m.zeros(b.size()), *ow = m.zeros(4 * 64 * 48);
          OK(d.convertFloat(a16, FloatType::BF16, aw, FloatType::F32, a.size()));
          OK(d.convertFloat(b16, FloatType::BF16, bw, FloatType::F32, b.size()));
          OK(run(d, kernels::OpKind::Matmul, {{aw, {4, 64, 96}}, {bw, {96, 48}}},
                 {{ow, {4, 64, 48}}}, {0, 0}));
          OK(d.convertFloat(ow, FloatType::F32, o16, FloatType::BF16, 4 * 64 * 48));
        } else {
          OK(s);
        }
        float *out = m.zeros(4 * 64 * 48);
        OK(d.convertFloat(o16, FloatType::BF16, out, FloatType::F32, 4 * 64 * 48));
        return m.get(out, 4 * 64 * 48);
      },
      1e-2f);
}

// A product with a bias (ptc-fuse-matmul-bias) on cuBLASLt's bias epilogue
// (PTC_CUDA_LT_EPILOGUES=1): the bias added in the f32 accumulator, one
// rounding, as the CPU computes it; f32 and bf16, a linear layer's x W^T over
// batch rows and a plain 2-D product; the same bits when run twice.
TEST_F(CudaConformance, BiasEpilogueOnCublasLt) {
  struct Case {
    Shape a, b, c;
    bool transB;
  };
  const std::vector<Case> cases = {{{4, 64, 96}, {48, 96}, {4, 64, 48}, true},
                                   {{128, 64}, {64, 256}, {128, 256}, false}};
  setenv("PTC_CUDA_LT_EPILOGUES", "1", 1);
  for (const Case &k : cases)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16 " : "f32 ") + std::to_string(k.c.back()));
      auto count = [](const Shape &s) {
        size_t n = 1;
        for (int64_t x : s)
          n *= static_cast<size_t>(x);
        return n;
      };
      auto a = randomVector(count(k.a), 44), b = randomVector(count(k.b), 45),
           bias = randomVector(k.c.back(), 46);
      const size_t nc = count(k.c);
      auto body = [&](Device &d, Mem &m) {
        float *af = m.put(a), *bf = m.put(b), *biasf = m.put(bias), *of = m.zeros(nc);
        const std::vector<int64_t> ints{0, k.transB ? 1 : 0};
        const Shape biasShape{k.c.back()};
        if (!bf16) {
          OK(run(d, kernels::OpKind::Matmul, {{af, k.a}, {bf, k.b}, {biasf, biasShape}},
                 {{of, k.c}}, ints));
          return m.get(of, nc);
        }
        const auto t = kernels::DType::BF16;
        uint16_t *a16 = m.zeros<uint16_t>(a.size()), *b16 = m.zeros<uint16_t>(b.size()),
                 *bias16 = m.zeros<uint16_t>(bias.size()), *o16 = m.zeros<uint16_t>(nc);
        for (auto [f, h, n] : {std::tuple{af, a16, a.size()}, std::tuple{bf, b16, b.size()},
                               std::tuple{biasf, bias16, bias.size()}}) {
          OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(n)));
          OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
        }
        Status st = run(d, kernels::OpKind::Matmul,
                        {{a16, k.a, t}, {b16, k.b, t}, {bias16, biasShape, t}}, {{o16, k.c, t}},
                        ints);
        if (st.code() == StatusCode::kUnimplemented) { // the CPU: f32 on the same values, rounded once
          OK(run(d, kernels::OpKind::Matmul, {{af, k.a}, {bf, k.b}, {biasf, biasShape}},
                 {{of, k.c}}, ints));
          OK(d.convertFloat(of, FloatType::F32, o16, FloatType::BF16, static_cast<int64_t>(nc)));
        } else {
          OK(st);
        }
        OK(d.convertFloat(o16, FloatType::BF16, of, FloatType::F32, static_cast<int64_t>(nc)));
        return m.get(of, nc);
      };
      compare(body, bf16 ? 1e-2f : 1e-4f);
      std::vector<float> first, second;
      for (auto *into : {&first, &second}) {
        Mem m(*gpu_);
        *into = body(*gpu_, m);
        ASSERT_TRUE(gpu_->synchronize().isOk());
      }
      EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
    }
  unsetenv("PTC_CUDA_LT_EPILOGUES");
}

// A weight gradient's product with its bias gradient (Matmul's second
// output: the transposed lhs summed over its rows), on the default path
// (the product, then the column sums) and on cuBLASLt's BGRADB epilogue
// (PTC_CUDA_LT_EPILOGUES=1), f32 and bf16, against the CPU; repeatable.
TEST_F(CudaConformance, BiasGradientBesideTheWeightGradient) {
  const int64_t k = 1000, m = 96, n = 64; // k over several column-sum chunks
  const Shape as{k, m}, bs{k, n}, os{m, n}, sumShape{m};
  auto a = randomVector(static_cast<size_t>(k * m), 47), b = randomVector(static_cast<size_t>(k * n), 48);
  const size_t no = static_cast<size_t>(m * n), ns = static_cast<size_t>(m);
  for (const char *lt : {"0", "1"})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "f32") + ", PTC_CUDA_LT_EPILOGUES=" + lt);
      setenv("PTC_CUDA_LT_EPILOGUES", lt, 1);
      auto body = [&](Device &d, Mem &mem) {
        float *af = mem.put(a), *bf = mem.put(b), *of = mem.zeros(no + ns);
        const std::vector<int64_t> ints{1, 0};
        if (!bf16) {
          OK(run(d, kernels::OpKind::Matmul, {{af, as}, {bf, bs}}, {{of, os}, {of + no, sumShape}},
                 ints));
          return mem.get(of, no + ns);
        }
        const auto t = kernels::DType::BF16;
        uint16_t *a16 = mem.zeros<uint16_t>(a.size()), *b16 = mem.zeros<uint16_t>(b.size()),
                 *o16 = mem.zeros<uint16_t>(no + ns);
        for (auto [f, h, count] : {std::tuple{af, a16, a.size()}, std::tuple{bf, b16, b.size()}}) {
          OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(count)));
          OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(count)));
        }
        Status st = run(d, kernels::OpKind::Matmul, {{a16, as, t}, {b16, bs, t}},
                        {{o16, os, t}, {o16 + no, sumShape, t}}, ints);
        if (st.code() == StatusCode::kUnimplemented) { // the CPU: f32 on the same values, rounded once
          OK(run(d, kernels::OpKind::Matmul, {{af, as}, {bf, bs}},
                 {{of, os}, {of + no, sumShape}}, ints));
          OK(d.convertFloat(of, FloatType::F32, o16, FloatType::BF16,
                            static_cast<int64_t>(no + ns)));
        } else {
          OK(st);
        }
        OK(d.convertFloat(o16, FloatType::BF16, of, FloatType::F32, static_cast<int64_t>(no + ns)));
        return mem.get(of, no + ns);
      };
      compare(body, bf16 ? 2e-2f : 1e-3f);
      std::vector<float> first, second;
      for (auto *into : {&first, &second}) {
        Mem mem(*gpu_);
        *into = body(*gpu_, mem);
        ASSERT_TRUE(gpu_->synchronize().isOk());
      }
      EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
    }
  unsetenv("PTC_CUDA_LT_EPILOGUES");
}

// bf16 products with a size that is not a multiple of 8 (an LM head over a
// vocabulary of 50257) run on zero-padded copies in chunks of C's rows
// (padded_product.h): odd n (x w^T), odd k (g w, and transposed B), odd m
// transposed (g^T x), odd m, a batch-shared B; each in several chunks
// (PTC_CUDA_PAD_CHUNK_BYTES), against the CPU's widened product.
TEST_F(CudaConformance, Bf16MatmulWithUnalignedRowsRunsPadded) {
  struct Case {
    Shape a, b, c;
    bool transA, transB;
  };
  const std::vector<Case> cases = {{{64, 32}, {83, 32}, {64, 83}, false, true},
                                   {{64, 83}, {83, 32}, {64, 32}, false, false},
                                   {{64, 83}, {64, 32}, {83, 32}, true, false},
                                   {{40, 83}, {64, 83}, {40, 64}, false, true},
                                   {{37, 32}, {32, 24}, {37, 24}, false, false},
                                   {{2, 40, 83}, {83, 16}, {2, 40, 16}, false, false}};
  setenv("PTC_CUDA_PAD_CHUNK_BYTES", "4096", 1);
  for (const Case &k : cases) {
    SCOPED_TRACE(std::to_string(&k - cases.data()));
    auto count = [](const Shape &sh) {
      size_t n = 1;
      for (int64_t x : sh)
        n *= static_cast<size_t>(x);
      return n;
    };
    auto a = randomVector(count(k.a), 50), b = randomVector(count(k.b), 51);
    const size_t nc = count(k.c);
    compare(
        [&](Device &d, Mem &m) {
          const auto bf16 = kernels::DType::BF16;
          uint16_t *a16 = m.zeros<uint16_t>(a.size()), *b16 = m.zeros<uint16_t>(b.size()),
                   *c16 = m.zeros<uint16_t>(nc);
          float *aw = m.put(a), *bw = m.put(b), *cw = m.zeros(nc);
          for (auto [f, h, n] : {std::tuple{aw, a16, a.size()}, std::tuple{bw, b16, b.size()}}) {
            OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(n)));
            OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
          }
          const std::vector<int64_t> ints{k.transA ? 1 : 0, k.transB ? 1 : 0};
          if (d.kind() == DeviceKind::Cuda) {
            OK(run(d, kernels::OpKind::Matmul, {{a16, k.a, bf16}, {b16, k.b, bf16}},
                   {{c16, k.c, bf16}}, ints));
          } else {
            OK(run(d, kernels::OpKind::Matmul, {{aw, k.a}, {bw, k.b}}, {{cw, k.c}}, ints));
            OK(d.convertFloat(cw, FloatType::F32, c16, FloatType::BF16, static_cast<int64_t>(nc)));
          }
          OK(d.convertFloat(c16, FloatType::BF16, cw, FloatType::F32, static_cast<int64_t>(nc)));
          return m.get(cw, nc);
        },
        1e-2f);
  }
  unsetenv("PTC_CUDA_PAD_CHUNK_BYTES");
}

TEST_F(CudaConformance, LayerNormAndGradient) {
  int64_t rows = 37, cols = 300;
  auto x = randomVector(rows * cols, 9), w = randomVector(cols, 10), b = randomVector(cols, 11),
       g = randomVector(rows * cols, 12);
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(rows * cols);
    OK(run(d, kernels::OpKind::LayerNorm,
           {{m.put(x), {rows, cols}}, {m.put(w), {cols}}, {m.put(b), {cols}}},
           {{out, {rows, cols}}}, {}, {1e-5}));
    return m.get(out, rows * cols);
  });
  compare(
      [&](Device &d, Mem &m) {
        float *dx = m.zeros(rows * cols), *dw = m.zeros(cols), *db = m.zeros(cols);
        OK(run(d, kernels::OpKind::LayerNormGrad,
               {{m.put(x), {rows, cols}}, {m.put(w), {cols}}, {m.put(g), {rows, cols}}},
               {{dx, {rows, cols}}, {dw, {cols}}, {db, {cols}}}, {}, {1e-5}));
        auto out = m.get(dx, rows * cols);
        for (float *p : {dw, db}) {
          auto v = m.get(p, cols);
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      },
      1e-4f);
}

// The entries that take bf16 natively (elementwise arithmetic with and
// without broadcasting, activations and their gradients, gated activations,
// scaling, LayerNorm and its gradient over several row chunks, sums over
// leading axes, RMSNorm and its gradient, rotary) against the
// CPU's f32 kernels on the same bf16 values, each result rounded to bf16 once
// (what the runtime's widening gave before). The GPU must take them in bf16
// (no widening).
TEST_F(CudaConformance, Bf16EntriesMatchWidenedF32) {
  struct Case {
    kernels::OpKind op;
    std::vector<Shape> in, out;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    UnaryFunction fn;
  };
  const Shape big{3, 200, 72}, row{72}, mid{3, 1, 72};
  const std::vector<Case> cases = {
      {kernels::OpKind::Add, {big, big}, {big}, {}, {}, {}},
      {kernels::OpKind::Add, {big, row}, {big}, {}, {}, {}},
      {kernels::OpKind::Mul, {big, mid}, {big}, {}, {}, {}},
      {kernels::OpKind::Sub, {row, big}, {big}, {}, {}, {}},
      {kernels::OpKind::Scale, {big}, {big}, {}, {0.5}, {}},
      {kernels::OpKind::Unary, {big}, {big}, {}, {}, UnaryFunction::Gelu},
      {kernels::OpKind::UnaryGrad, {big, big}, {big}, {}, {}, UnaryFunction::Gelu},
      {kernels::OpKind::GatedUnary, {big, big}, {big}, {}, {}, UnaryFunction::Silu},
      {kernels::OpKind::GatedUnaryGrad, {big, big, big}, {big, big}, {}, {}, UnaryFunction::Silu},
      {kernels::OpKind::LayerNorm, {{600, 72}, row, row}, {{600, 72}}, {}, {1e-5}, {}},
      {kernels::OpKind::LayerNormGrad, {{600, 72}, row, {600, 72}}, {{600, 72}, row, row}, {},
       {1e-5}, {}},
      {kernels::OpKind::ReduceSum, {{2, 600, 72}}, {row}, {0, 1}, {}, {}},
      {kernels::OpKind::ReduceMean, {{2, 600, 72}}, {{600, 72}}, {0}, {}, {}},
      {kernels::OpKind::RmsNorm, {{600, 72}, row}, {{600, 72}}, {}, {1e-5}, {}},
      {kernels::OpKind::RmsNormGrad, {{600, 72}, row, {600, 72}}, {{600, 72}, row}, {}, {1e-5},
       {}},
      {kernels::OpKind::Rotary, {{2, 3, 40, 64}}, {{2, 3, 40, 64}}, {0}, {10000.0}, {}},
      {kernels::OpKind::Rotary, {{2, 3, 40, 64}}, {{2, 3, 40, 64}}, {1}, {10000.0}, {}},
      {kernels::OpKind::Rotary, {{2, 40, 3, 64}}, {{2, 40, 3, 64}}, {0, -1, 1}, {10000.0}, {}},
      {kernels::OpKind::Rotary, {{2, 40, 3, 64}}, {{2, 40, 3, 64}}, {1, 0, 1}, {10000.0}, {}},
  };
  auto count = [](const Shape &sh) {
    size_t n = 1;
    for (int64_t x : sh)
      n *= static_cast<size_t>(x);
    return n;
  };
  unsigned seed = 90;
  for (const Case &k : cases) {
    SCOPED_TRACE(kernels::opKindName(k.op));
    std::vector<std::vector<float>> values;
    for (const Shape &sh : k.in)
      values.push_back(randomVector(count(sh), seed++));
    compare(
        [&](Device &d, Mem &m) {
          const bool native = d.kind() == DeviceKind::Cuda;
          const auto type = native ? kernels::DType::BF16 : kernels::DType::F32;
          auto round = [&](void *p, size_t n, void *tmp) { // f32 at p through bf16
            OK(d.convertFloat(p, FloatType::F32, tmp, FloatType::BF16, static_cast<int64_t>(n)));
            OK(d.convertFloat(tmp, FloatType::BF16, p, FloatType::F32, static_cast<int64_t>(n)));
          };
          std::vector<Arg> in, out;
          std::vector<float *> f32Out;
          std::vector<uint16_t *> bf16Out;
          for (size_t i = 0; i < k.in.size(); ++i) {
            const size_t n = values[i].size();
            float *f = m.put(values[i]);
            uint16_t *h = m.zeros<uint16_t>(n);
            round(f, n, h); // h holds the bf16 values, f the same in f32
            in.push_back(native ? Arg{h, k.in[i], type} : Arg{f, k.in[i], type});
          }
          for (const Shape &sh : k.out) {
            f32Out.push_back(m.zeros(count(sh)));
            bf16Out.push_back(m.zeros<uint16_t>(count(sh)));
            out.push_back(native ? Arg{bf16Out.back(), sh, type} : Arg{f32Out.back(), sh, type});
          }
          Status st = run(d, k.op, in, out, k.ints, k.floats, k.fn);
          EXPECT_TRUE(st.isOk()) << st.message();
          std::vector<float> result;
          for (size_t i = 0; i < k.out.size(); ++i) {
            const size_t n = count(k.out[i]);
            if (native)
              OK(d.convertFloat(bf16Out[i], FloatType::BF16, f32Out[i], FloatType::F32,
                                static_cast<int64_t>(n)));
            else
              round(f32Out[i], n, bf16Out[i]);
            auto v = m.get(f32Out[i], n);
            result.insert(result.end(), v.begin(), v.end());
          }
          return result;
        },
        1e-2f);
  }
}

// The entries with ids or positions beside bf16 values (embedding lookup and
// its gradient, rotary at positions): the GPU takes the bf16 values natively,
// the CPU computes in f32 on the same values, rounded once. Many tokens share
// few ids (the gradient's runs of equal ids).
TEST_F(CudaConformance, Bf16EmbeddingAndRotaryAtMatchWidenedF32) {
  const int64_t vocab = 40, dim = 96, tokens = 700, B = 2, H = 3, T = 5, D = 32;
  std::vector<int32_t> tokenIds(tokens), positions(B * T);
  for (int64_t i = 0; i < tokens; ++i)
    tokenIds[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + i / 11) % vocab);
  for (int64_t i = 0; i < B * T; ++i)
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(3 + 5 * i);
  auto table = randomVector(vocab * dim, 71), g = randomVector(tokens * dim, 72),
       x = randomVector(B * H * T * D, 73);
  compare(
      [&](Device &d, Mem &m) {
        const bool native = d.kind() == DeviceKind::Cuda;
        const auto type = native ? kernels::DType::BF16 : kernels::DType::F32;
        // f32 values through bf16: the bf16 bits at h, their f32 values at f.
        auto both = [&](const std::vector<float> &v) {
          float *f = m.put(v);
          uint16_t *h = m.zeros<uint16_t>(v.size());
          OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(v.size())));
          OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(v.size())));
          return std::pair{f, h};
        };
        auto [tf, th] = both(table);
        auto [gf, gh] = both(g);
        auto [xf, xh] = both(x);
        auto arg = [&](std::pair<float *, uint16_t *> p) {
          return native ? static_cast<const void *>(p.second) : static_cast<const void *>(p.first);
        };
        std::vector<std::pair<float *, uint16_t *>> outs;
        for (int64_t n : {tokens * dim, vocab * dim, B * H * T * D, B * H * T * D})
          outs.push_back({m.zeros(static_cast<size_t>(n)), m.zeros<uint16_t>(static_cast<size_t>(n))});
        auto out = [&](size_t i) { return const_cast<void *>(arg(outs[i])); };
        const int32_t *pid = m.put(tokenIds), *ppos = m.put(positions);
        OK(run(d, kernels::OpKind::Embedding, {{arg({tf, th}), {vocab, dim}, type}, ids(pid, {tokens})},
               {{out(0), {tokens, dim}, type}}));
        OK(run(d, kernels::OpKind::EmbeddingGrad, {ids(pid, {tokens}), {arg({gf, gh}), {tokens, dim}, type}},
               {{out(1), {vocab, dim}, type}}));
        OK(run(d, kernels::OpKind::RotaryAt, {{arg({xf, xh}), {B, H, T, D}, type}, ids(ppos, {B, T})},
               {{out(2), {B, H, T, D}, type}}, {}, {10000.0}));
        // Seq-major ([B, T, H, D]; ints inverse, seq_major), the same values.
        OK(run(d, kernels::OpKind::RotaryAt, {{arg({xf, xh}), {B, T, H, D}, type}, ids(ppos, {B, T})},
               {{out(3), {B, T, H, D}, type}}, {1, 1}, {10000.0}));
        std::vector<float> result;
        const int64_t counts[4] = {tokens * dim, vocab * dim, B * H * T * D, B * H * T * D};
        for (size_t i = 0; i < 4; ++i) {
          auto [f, h] = outs[i];
          if (native)
            OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, counts[i]));
          else { // round the f32 result once, as the GPU's store does
            OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, counts[i]));
            OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, counts[i]));
          }
          auto v = m.get(f, static_cast<size_t>(counts[i]));
          result.insert(result.end(), v.begin(), v.end());
        }
        return result;
      },
      1e-2f);
}

TEST_F(CudaConformance, SoftmaxOnLastAndMiddleAxis) {
  auto x = randomVector(4 * 9 * 5, 13), g = randomVector(4 * 9 * 5, 14);
  for (int64_t axis : {2, 1})
    compare([&](Device &d, Mem &m) {
      float *y = m.zeros(180), *dx = m.zeros(180);
      OK(run(d, kernels::OpKind::Softmax, {{m.put(x), {4, 9, 5}}}, {{y, {4, 9, 5}}}, {axis}));
      OK(run(d, kernels::OpKind::SoftmaxGrad, {{y, {4, 9, 5}}, {m.put(g), {4, 9, 5}}},
             {{dx, {4, 9, 5}}}, {axis}));
      auto out = m.get(y, 180), grad = m.get(dx, 180);
      out.insert(out.end(), grad.begin(), grad.end());
      return out;
    });
}

/// CausalAttention and its gradient on `d` (q [s], k, v [kv], the result's
/// gradient g; scale 0.25; `positions` [positionsShape] the document
/// positions, or null): the result, then dq, dk and dv.
std::vector<float> attentionWithGradient(Device &d, Mem &m, const std::vector<float> &q,
                                         const std::vector<float> &k, const std::vector<float> &v,
                                         const std::vector<float> &g, const Shape &s,
                                         const Shape &kv, const std::vector<int64_t> &ints,
                                         const int32_t *positions, const Shape &positionsShape) {
  const size_t n = q.size(), nkv = k.size();
  float *o = m.zeros(n), *dq = m.zeros(n), *dk = m.zeros(nkv), *dv = m.zeros(nkv);
  const float *pq = m.put(q), *pk = m.put(k), *pv = m.put(v);
  std::vector<Arg> in = {{pq, s}, {pk, kv}, {pv, kv}}, gradIn = {{pq, s}, {pk, kv}, {pv, kv},
                                                                 {m.put(g), s}};
  if (positions) {
    in.push_back(ids(positions, positionsShape));
    gradIn.push_back(ids(positions, positionsShape));
  }
  OK(run(d, kernels::OpKind::CausalAttention, in, {{o, s}}, ints, {0.25}));
  OK(run(d, kernels::OpKind::CausalAttentionGrad, gradIn, {{dq, s}, {dk, kv}, {dv, kv}}, ints,
         {0.25}));
  auto out = m.get(o, n);
  for (auto [p, count] : {std::pair{dq, n}, {dk, nkv}, {dv, nkv}}) {
    auto t = m.get(p, count);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST_F(CudaConformance, CausalAttentionAndGradient) {
  // Multi-head (3 kv heads of 3), grouped-query (2 kv heads of 4), and
  // grouped-query seq-major (every tensor [batch, seq, heads, head_dim]: the
  // integer seq_major = 1, rows read strided).
  struct Config {
    int64_t heads, kvHeads;
    bool seqMajor;
  };
  for (Config c : {Config{3, 3, false}, Config{4, 2, false}, Config{4, 2, true}}) {
    const int64_t seq = 17, dim = 16;
    const Shape s = c.seqMajor ? Shape{2, seq, c.heads, dim} : Shape{2, c.heads, seq, dim};
    const Shape kv = c.seqMajor ? Shape{2, seq, c.kvHeads, dim} : Shape{2, c.kvHeads, seq, dim};
    const std::vector<int64_t> ints = c.seqMajor ? std::vector<int64_t>{1} : std::vector<int64_t>{};
    size_t n = static_cast<size_t>(2 * c.heads * seq * dim);
    size_t nkv = static_cast<size_t>(2 * c.kvHeads * seq * dim);
    auto q = randomVector(n, 15), k = randomVector(nkv, 16), v = randomVector(nkv, 17),
         g = randomVector(n, 18);
    compare(
        [&](Device &d, Mem &m) {
          return attentionWithGradient(d, m, q, k, v, g, s, kv, ints, nullptr, {});
        },
        1e-4f);
  }
  // Read from and written into a fused projection [batch, seq, (4 + 2 * 2) *
  // 16] (CausalAttentionQkv(Grad); the CUDA entries copy the column blocks).
  const int64_t seq = 17, width = 8 * 16;
  const Shape fs{2, seq, width}, os{2, seq, 4, 16};
  const size_t nf = static_cast<size_t>(2 * seq * width), no = static_cast<size_t>(2 * seq * 64);
  auto qkv = randomVector(nf, 19), g = randomVector(no, 20);
  compare(
      [&](Device &d, Mem &m) {
        float *o = m.zeros(no), *dqkv = m.zeros(nf);
        const float *p = m.put(qkv);
        OK(run(d, kernels::OpKind::CausalAttentionQkv, {{p, fs}}, {{o, os}}, {}, {0.25}));
        OK(run(d, kernels::OpKind::CausalAttentionQkvGrad, {{p, fs}, {m.put(g), os}}, {{dqkv, fs}},
               {}, {0.25}));
        auto out = m.get(o, no), t = m.get(dqkv, nf);
        out.insert(out.end(), t.begin(), t.end());
        return out;
      },
      1e-4f);
}

// Packed documents: attention with document positions (documents of 5, 9 and
// 3 tokens, then one of 17) in both layouts, the fused projection's, and the
// positions' rotation and its inverse (ptc.rotary_at, the gradient).
TEST_F(CudaConformance, PackedDocumentsAttentionAndRotation) {
  const int64_t B = 2, A = 4, KV = 2, S = 17, D = 16;
  std::vector<int32_t> pos(B * S);
  for (int64_t t = 0; t < S; ++t) {
    pos[t] = static_cast<int32_t>(t < 5 ? t : t < 14 ? t - 5 : t - 14);
    pos[S + t] = static_cast<int32_t>(t);
  }
  for (bool seqMajor : {false, true}) {
    const Shape s = seqMajor ? Shape{B, S, A, D} : Shape{B, A, S, D};
    const Shape kv = seqMajor ? Shape{B, S, KV, D} : Shape{B, KV, S, D};
    const std::vector<int64_t> ints = seqMajor ? std::vector<int64_t>{1} : std::vector<int64_t>{};
    const size_t n = static_cast<size_t>(B * A * S * D), nkv = static_cast<size_t>(B * KV * S * D);
    auto q = randomVector(n, 61), k = randomVector(nkv, 62), v = randomVector(nkv, 63),
         g = randomVector(n, 64);
    compare(
        [&](Device &d, Mem &m) {
          return attentionWithGradient(d, m, q, k, v, g, s, kv, ints, m.put(pos), {B, S});
        },
        1e-4f);
  }
  const int64_t width = (A + 2 * KV) * D;
  const Shape fs{B, S, width}, os{B, S, A, D};
  const size_t nf = static_cast<size_t>(B * S * width), no = static_cast<size_t>(B * S * A * D);
  auto qkv = randomVector(nf, 65), g = randomVector(no, 66), x = randomVector(no, 67);
  compare(
      [&](Device &d, Mem &m) {
        float *o = m.zeros(no), *dqkv = m.zeros(nf), *r = m.zeros(no), *back = m.zeros(no);
        const float *p = m.put(qkv);
        const int32_t *pp = m.put(pos);
        OK(run(d, kernels::OpKind::CausalAttentionQkv, {{p, fs}, ids(pp, {B, S})}, {{o, os}}, {},
               {0.25}));
        OK(run(d, kernels::OpKind::CausalAttentionQkvGrad,
               {{p, fs}, {m.put(g), os}, ids(pp, {B, S})}, {{dqkv, fs}}, {}, {0.25}));
        OK(run(d, kernels::OpKind::RotaryAt, {{m.put(x), {B, A, S, D}}, ids(pp, {B, S})},
               {{r, {B, A, S, D}}}, {}, {10000.0}));
        OK(run(d, kernels::OpKind::RotaryAt, {{r, {B, A, S, D}}, ids(pp, {B, S})},
               {{back, {B, A, S, D}}}, {1}, {10000.0}));
        auto out = m.get(o, no);
        for (auto [q, count] : {std::pair{dqkv, nf}, {r, no}, {back, no}}) {
          auto t = m.get(q, count);
          out.insert(out.end(), t.begin(), t.end());
        }
        return out;
      },
      1e-4f);
}

// Attention against the CPU's f32 kernels on the same inputs, in every layout
// ptc has (per-head, seq-major, the fused projection's column blocks read and
// written in place), head sizes 64, 80, 96, 128 and 256, multi-head and
// grouped-query (2 and 8 query heads per kv head), sequence lengths that are
// not a multiple of a tile, and packed documents: in bf16 (on cuDNN's fused
// kernels; packed documents, which cuDNN is not given, on the tiled kernels
// reading bf16) with the inputs rounded to bf16 first, and in f32 (the tiled
// kernels). Outputs are poisoned with NaN first (every element must be
// written); the bound is the relative L2 error bf16 operands give (METHOD:
// 1e-3 .. 1e-2), and f32 rounding in f32. The backward pass run twice must
// be bitwise the same (cuDNN's deterministic algorithm; the tiled kernels have
// no atomics). Each configuration runs twice: the backward recomputing the
// forward, and with the forward's saved result and row statistics
// (ptc-save-attention-stats: the forward writes the f32 log-sum-exp, the
// backward reads them and runs no forward), the statistics checked against
// the CPU's too.
TEST_F(CudaConformance, AttentionMatchesTheCpuInEveryLayout) {
  enum class Layout { PerHead, SeqMajor, Fused };
  struct Config {
    Layout layout;
    int64_t heads, kvHeads, dim, seq;
    bool documents = false;
  };
  const std::vector<Config> configs = {
      {Layout::PerHead, 4, 4, 64, 100},         {Layout::SeqMajor, 4, 2, 64, 128},
      {Layout::Fused, 4, 4, 64, 100},           {Layout::Fused, 8, 1, 128, 77},
      {Layout::Fused, 4, 2, 80, 64},            {Layout::PerHead, 4, 2, 96, 129},
      {Layout::SeqMajor, 2, 2, 128, 200},       {Layout::Fused, 4, 2, 128, 256},
      {Layout::PerHead, 2, 1, 256, 64},         {Layout::PerHead, 4, 2, 64, 100, true},
      {Layout::Fused, 4, 2, 128, 77, true},     {Layout::SeqMajor, 2, 1, 256, 70, true},
  };
  const auto bf16 = kernels::DType::BF16;
  for (bool lowPrecision : {true, false})
  for (bool saved : {false, true})
  for (const Config &c : configs) {
    SCOPED_TRACE(std::string(lowPrecision ? "bf16" : "f32") + " layout " +
                 std::to_string(static_cast<int>(c.layout)) + " heads " +
                 std::to_string(c.heads) + "/" + std::to_string(c.kvHeads) + " dim " +
                 std::to_string(c.dim) + " seq " + std::to_string(c.seq) +
                 (c.documents ? " packed documents" : "") + (saved ? " saved statistics" : ""));
    const int64_t batch = 2, s = c.seq, d = c.dim;
    // Packed documents: lengths 1, 10, 19, ... (a second batch entry from 8 on).
    std::vector<int32_t> positions(static_cast<size_t>(batch * s));
    for (int64_t b = 0, length = 1; b < batch; ++b, length = 8)
      for (int64_t i = 0, at = 0, len = length; i < s; ++i, ++at) {
        if (at == len)
          at = 0, len += 9;
        positions[static_cast<size_t>(b * s + i)] = static_cast<int32_t>(at);
      }
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // Shapes of the call's tensors: inputs and outputs in call order.
    std::vector<Shape> fwdIn, fwdOut, bwdIn, bwdOut;
    std::vector<int64_t> ints;
    kernels::OpKind fwdOp, bwdOp;
    const Shape heads = {batch, s, c.heads, d};
    if (c.layout == Layout::Fused) {
      const Shape qkv{batch, s, (c.heads + 2 * c.kvHeads) * d};
      fwdOp = kernels::OpKind::CausalAttentionQkv;
      bwdOp = kernels::OpKind::CausalAttentionQkvGrad;
      fwdIn = {qkv};
      fwdOut = {heads};
      bwdIn = {qkv, heads};
      bwdOut = {qkv};
    } else {
      const bool sm = c.layout == Layout::SeqMajor;
      const Shape q = sm ? heads : Shape{batch, c.heads, s, d};
      const Shape kv = sm ? Shape{batch, s, c.kvHeads, d} : Shape{batch, c.kvHeads, s, d};
      if (sm)
        ints = {1};
      fwdOp = kernels::OpKind::CausalAttention;
      bwdOp = kernels::OpKind::CausalAttentionGrad;
      fwdIn = {q, kv, kv};
      fwdOut = {q};
      bwdIn = {q, kv, kv, q};
      bwdOut = {q, kv, kv};
    }
    auto count = [](const Shape &sh) {
      size_t n = 1;
      for (int64_t x : sh)
        n *= static_cast<size_t>(x);
      return n;
    };
    const Shape statsShape{batch, c.heads, s}; // f32 whatever the operands' type
    if (saved)
      fwdOut.push_back(statsShape);
    // Host values (bf16-representable: rounded on the device first).
    std::vector<std::vector<float>> values;
    unsigned seed = 70;
    for (const Shape &sh : bwdIn)
      values.push_back(randomVector(count(sh), seed++));

    // The device's results of the forward and backward calls, as f32.
    auto runOn = [&](Device &dev, bool lowPrecision, std::vector<std::vector<float>> *rounded) {
      Mem m(dev);
      const Arg documents = ids(m.put(positions), {batch, s});
      std::vector<Arg> in;
      for (size_t i = 0; i < bwdIn.size(); ++i) {
        const size_t n = values[i].size();
        float *f = m.put(values[i]);
        uint16_t *h = m.zeros<uint16_t>(n);
        OK(dev.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(n)));
        OK(dev.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
        if (rounded)
          rounded->push_back(m.get(f, n));
        in.push_back(lowPrecision ? Arg{h, bwdIn[i], bf16} : Arg{f, bwdIn[i]});
      }
      // (`statsLast`: the forward's row statistics, f32, come last.)
      auto outputs = [&](const std::vector<Shape> &shapes, bool statsLast) {
        std::vector<Arg> out;
        for (const Shape &sh : shapes)
          out.push_back(lowPrecision && !(statsLast && out.size() + 1 == shapes.size())
                            ? Arg{m.put(std::vector<uint16_t>(count(sh), 0x7FC0)), sh, bf16}
                            : Arg{m.put(std::vector<float>(count(sh), NAN)), sh});
        return out;
      };
      std::vector<Arg> fo = outputs(fwdOut, saved), bo = outputs(bwdOut, false),
                       bo2 = outputs(bwdOut, false);
      std::vector<Arg> fin(in.begin(), in.begin() + static_cast<long>(fwdIn.size()));
      if (c.documents)
        fin.push_back(documents);
      OK(run(dev, fwdOp, fin, fo, ints, {scale}));
      if (saved) // (..., incoming gradient, forward result, statistics)
        in.insert(in.end(), {fo[0], fo[1]});
      if (c.documents) // after the float inputs
        in.push_back(documents);
      OK(run(dev, bwdOp, in, bo, ints, {scale}));
      OK(run(dev, bwdOp, in, bo2, ints, {scale}));
      OK(dev.synchronize());
      std::vector<std::vector<float>> results;
      auto collect = [&](const std::vector<Arg> &args, std::vector<std::vector<float>> &into) {
        for (const Arg &a : args) {
          const size_t n = count(a.shape);
          if (a.dtype == kernels::DType::F32) {
            into.push_back(m.get(static_cast<const float *>(a.data), n));
            continue;
          }
          float *f = m.zeros(n);
          OK(dev.convertFloat(a.data, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
          into.push_back(m.get(f, n));
        }
      };
      collect(fo, results);
      collect(bo, results);
      std::vector<std::vector<float>> again;
      collect(bo2, again);
      for (size_t i = 0; i < again.size(); ++i)
        EXPECT_EQ(0, std::memcmp(again[i].data(), results[fwdOut.size() + i].data(),
                                 again[i].size() * sizeof(float)))
            << "the backward's output " << i << " differs between two runs";
      return results;
    };
    std::vector<std::vector<float>> rounded;
    auto got = runOn(*gpu_, lowPrecision, &rounded);
    values = rounded; // the CPU sees exactly the bf16 values
    auto want = runOn(*cpu_, false, nullptr);
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < got.size(); ++t) {
      ASSERT_EQ(got[t].size(), want[t].size());
      double err = 0, ref = 0;
      for (size_t i = 0; i < got[t].size(); ++i) {
        ASSERT_FALSE(std::isnan(got[t][i])) << "output " << t << " element " << i << " unwritten";
        err += (got[t][i] - want[t][i]) * double(got[t][i] - want[t][i]);
        ref += want[t][i] * double(want[t][i]);
      }
      EXPECT_LT(std::sqrt(err / ref), lowPrecision ? 1e-2 : 1e-5) << "output " << t;
    }
  }
}

// Heads larger than the CUDA attention kernels take are refused, naming the
// head size, in either layout (the fused projection's entries check the
// heads of their result or incoming gradient before copying the blocks out).
TEST_F(CudaConformance, AttentionRefusesHeadsBeyondTheKernel) {
  const int64_t d = kernels::cuda::kMaxAttentionDim * 2;
  const Shape hs{1, 1, 2, d}, fs{1, 2, 3 * d}, os{1, 2, 1, d};
  Mem m(*gpu_);
  float *a = m.zeros(static_cast<size_t>(2 * d)), *b = m.zeros(static_cast<size_t>(2 * d));
  float *f = m.zeros(static_cast<size_t>(6 * d)), *df = m.zeros(static_cast<size_t>(6 * d));
  const std::string want = "head dimension " + std::to_string(d);
  for (Status s : {run(*gpu_, kernels::OpKind::CausalAttention, {{a, hs}, {a, hs}, {a, hs}},
                       {{b, hs}}, {}, {0.25}),
                   run(*gpu_, kernels::OpKind::CausalAttentionQkv, {{f, fs}}, {{b, os}}, {},
                       {0.25}),
                   run(*gpu_, kernels::OpKind::CausalAttentionQkvGrad, {{f, fs}, {a, os}},
                       {{df, fs}}, {}, {0.25})}) {
    EXPECT_FALSE(s.isOk());
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
  }
}

TEST_F(CudaConformance, RmsNormRotaryAndGradients) {
  const int64_t rows = 37, cols = 96;
  size_t n = static_cast<size_t>(rows * cols);
  auto x = randomVector(n, 21), w = randomVector(cols, 22), g = randomVector(n, 23);
  Shape rs{1, 3, 37, 32}; // 3 heads x 37 positions x 32 dims
  size_t nr = 3 * 37 * 32;
  auto xr = randomVector(nr, 24);
  compare(
      [&](Device &d, Mem &m) {
        float *y = m.zeros(n), *dx = m.zeros(n), *dw = m.zeros(static_cast<size_t>(cols));
        float *r = m.zeros(nr), *back = m.zeros(nr);
        const float *px = m.put(x), *pw = m.put(w);
        OK(run(d, kernels::OpKind::RmsNorm, {{px, {rows, cols}}, {pw, {cols}}},
               {{y, {rows, cols}}}, {}, {1e-5}));
        OK(run(d, kernels::OpKind::RmsNormGrad,
               {{px, {rows, cols}}, {pw, {cols}}, {m.put(g), {rows, cols}}},
               {{dx, {rows, cols}}, {dw, {cols}}}, {}, {1e-5}));
        OK(run(d, kernels::OpKind::Rotary, {{m.put(xr), rs}}, {{r, rs}}, {0}, {10000.0}));
        OK(run(d, kernels::OpKind::Rotary, {{r, rs}}, {{back, rs}}, {1}, {500000.0}));
        auto out = m.get(y, n);
        for (auto [p, count] : {std::pair{dx, n}, {dw, static_cast<size_t>(cols)}, {r, nr},
                                {back, nr}}) {
          auto t = m.get(p, count);
          out.insert(out.end(), t.begin(), t.end());
        }
        return out;
      },
      1e-4f);
}

/// bf16 tensors of a test that runs natively in bf16 on the GPU and in f32 on
/// the CPU on the same values: `put` rounds host values to bf16 on the device
/// (kept as bf16 natively, widened back to f32 otherwise), `result` reads a
/// result as f32 (widened natively; rounded once through bf16 otherwise, as
/// the runtime's widening rounds).
struct Bf16OrF32 {
  Device &d;
  Mem &m;
  bool native = d.kind() == DeviceKind::Cuda;
  kernels::DType type() const { return native ? kernels::DType::BF16 : kernels::DType::F32; }
  void *put(const std::vector<float> &host) const {
    float *f = m.put(host);
    uint16_t *h = m.zeros<uint16_t>(host.size());
    OK(d.convertFloat(f, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(host.size())));
    OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(host.size())));
    return native ? static_cast<void *>(h) : static_cast<void *>(f);
  }
  void *zeros(size_t n) const {
    return native ? static_cast<void *>(m.zeros<uint16_t>(n)) : static_cast<void *>(m.zeros(n));
  }
  std::vector<float> result(void *p, size_t n) const {
    float *f = m.zeros(n);
    if (native) {
      OK(d.convertFloat(p, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
    } else {
      uint16_t *h = m.zeros<uint16_t>(n);
      OK(d.convertFloat(p, FloatType::F32, h, FloatType::BF16, static_cast<int64_t>(n)));
      OK(d.convertFloat(h, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(n)));
    }
    return m.get(f, n);
  }
};

/// Device memory as a decode call sees it: `put` uploads host values,
/// `zeros` allocates, `result` reads a tensor back as f32.
struct DecodeMemory {
  std::function<void *(const std::vector<float> &)> put;
  std::function<void *(size_t)> zeros;
  std::function<std::vector<float>(void *, size_t)> result;
  kernels::DType type;
};

/// A grouped-query decode through CachedAttention: a `prefill`-token prefill
/// from position 0 (on the GPU: causal attention over its own keys, cuDNN in
/// bf16, the tiled kernels in f32), one token, then two more tokens (a
/// prefill chunk not from 0: the kernel over the cache), the caches [B, KV,
/// C, D] written in place; returns the calls' outputs, then the caches.
std::vector<float> decodeSteps(Device &d, Mem &m, const DecodeMemory &dm, int64_t B, int64_t A,
                               int64_t KV, int64_t C, int64_t D, int64_t prefill,
                               const std::vector<float> &q, const std::vector<float> &k,
                               const std::vector<float> &v, double scale) {
  Shape cache{B, KV, C, D};
  const size_t nc = static_cast<size_t>(B * KV * C * D);
  void *kc = dm.zeros(nc), *vc = dm.zeros(nc);
  std::vector<float> out;
  for (auto [from, n] :
       {std::pair<int64_t, int64_t>{0, prefill}, {prefill, 1}, {prefill + 1, 2}}) {
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        pos.push_back(static_cast<int32_t>(from + t));
    size_t nq = static_cast<size_t>(B * A * n * D), nkv = static_cast<size_t>(B * KV * n * D);
    std::vector<float> qs(q.begin(), q.begin() + static_cast<long>(nq)),
        ks(k.begin(), k.begin() + static_cast<long>(nkv)),
        vs(v.begin(), v.begin() + static_cast<long>(nkv));
    void *o = dm.zeros(nq);
    Shape qShape{B, A, n, D}, kvShape{B, KV, n, D};
    OK(run(d, kernels::OpKind::CachedAttention,
           {{dm.put(qs), qShape, dm.type}, {dm.put(ks), kvShape, dm.type},
            {dm.put(vs), kvShape, dm.type}, {kc, cache, dm.type}, {vc, cache, dm.type},
            ids(m.put(pos), {B, n})},
           {{o, qShape, dm.type}, {kc, cache, dm.type}, {vc, cache, dm.type}}, {}, {scale}));
    auto t = dm.result(o, nq);
    out.insert(out.end(), t.begin(), t.end());
  }
  for (void *c : {kc, vc}) {
    auto t = dm.result(c, nc);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST_F(CudaConformance, CachedAttentionAndRotaryAtPositions) {
  // Grouped-query decode: a 3-token prefill, one token, two more; caches written in place.
  const int64_t B = 2, A = 4, KV = 2, C = 10, D = 16;
  auto q = randomVector(B * A * 4 * D, 81), k = randomVector(B * KV * 4 * D, 82),
       v = randomVector(B * KV * 4 * D, 83), xr = randomVector(B * A * 3 * D, 84);
  compare(
      [&](Device &d, Mem &m) {
        DecodeMemory dm{[&](const std::vector<float> &h) -> void * { return m.put(h); },
                        [&](size_t n) -> void * { return m.zeros(n); },
                        [&](void *p, size_t n) { return m.get(static_cast<float *>(p), n); },
                        kernels::DType::F32};
        std::vector<float> out = decodeSteps(d, m, dm, B, A, KV, C, D, 3, q, k, v, 0.25);
        std::vector<int32_t> at{7, 0, 3, 2, 9, 1};
        float *r = m.zeros(xr.size());
        OK(run(d, kernels::OpKind::RotaryAt, {{m.put(xr), {B, A, 3, D}}, ids(m.put(at), {B, 3})},
               {{r, {B, A, 3, D}}}, {}, {10000.0}));
        auto t = m.get(r, xr.size());
        out.insert(out.end(), t.begin(), t.end());
        return out;
      },
      1e-4f);
}

// The same decode in bf16: the GPU reads and writes the bf16 caches as they
// are (no widened copy of whole caches each token); the CPU runs the f32
// kernel on the same bf16 values and rounds its outputs once.
TEST_F(CudaConformance, Bf16CachedAttentionReadsBf16Caches) {
  const int64_t B = 2, A = 4, KV = 2, C = 40, D = 64;
  auto q = randomVector(B * A * 33 * D, 85), k = randomVector(B * KV * 33 * D, 86),
       v = randomVector(B * KV * 33 * D, 87);
  compare(
      [&](Device &d, Mem &m) {
        const Bf16OrF32 b{d, m};
        DecodeMemory dm{[&](const std::vector<float> &h) { return b.put(h); },
                        [&](size_t n) { return b.zeros(n); },
                        [&](void *p, size_t n) { return b.result(p, n); }, b.type()};
        return decodeSteps(d, m, dm, B, A, KV, C, D, 32, q, k, v, 0.125);
      },
      1e-2f);
}

/// Ring attention's two steps on device `d` (kernel_call.h's AttentionBlock
/// and AttentionBlockGrad, as the executor composes them): queries [b, a, s,
/// dim] against two key/value blocks [b, kv, s, dim], the diagonal one under
/// the causal mask, then a whole one, merged by the online softmax; then each
/// block's gradient from the rows' result and log-sum-exp. `storage`: the
/// plan's type the ring says (bf16: the values are bf16, and the gradient
/// reads the result rounded as the plan stores it). `firstKeys` ([b, s],
/// packed documents): each row's first key in both blocks. Returns the result,
/// the log-sum-exp, dq and each block's dk, dv.
std::vector<float> ringBlocks(Device &d, Mem &m, Shape qShape, int64_t kvHeads,
                              const std::vector<std::vector<float>> &qkvkvg, double scale,
                              kernels::DType storage,
                              const std::vector<int32_t> *firstKeys = nullptr) {
  const int64_t B = qShape[0], A = qShape[1], S = qShape[2], D = qShape[3];
  const size_t nq = static_cast<size_t>(B * A * S * D),
               nkv = static_cast<size_t>(B * kvHeads * S * D), rows = static_cast<size_t>(B * A * S);
  auto withCausal = [&](int causal) {
    return std::vector<int64_t>{causal, static_cast<int64_t>(storage)};
  };
  float *acc = m.zeros(nq), *sum = m.zeros(rows);
  float *mx = m.put(std::vector<float>(rows, -std::numeric_limits<float>::infinity()));
  const float *pq = m.put(qkvkvg[0]), *pk0 = m.put(qkvkvg[1]), *pv0 = m.put(qkvkvg[2]),
              *pk1 = m.put(qkvkvg[3]), *pv1 = m.put(qkvkvg[4]);
  const Shape kvShape{B, kvHeads, S, D}, rowShape{B, A, S};
  const int32_t *first = firstKeys ? m.put(*firstKeys) : nullptr;
  auto withFirstKeys = [&](std::vector<Arg> in) {
    if (first)
      in.push_back(ids(first, {B, S}));
    return in;
  };
  for (auto [k, v, causal] : {std::tuple{pk0, pv0, 1}, std::tuple{pk1, pv1, 0}})
    OK(run(d, kernels::OpKind::AttentionBlock,
           withFirstKeys({{pq, qShape}, {k, kvShape}, {v, kvShape}}),
           {{acc, qShape}, {mx, rowShape}, {sum, rowShape}}, withCausal(causal), {scale}));
  auto hAcc = m.get(acc, nq), hMx = m.get(mx, rows), hSum = m.get(sum, rows);
  std::vector<float> o(nq), lse(rows);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < static_cast<size_t>(D); ++c)
      o[r * D + c] = hAcc[r * D + c] / hSum[r];
    lse[r] = hMx[r] + std::log(hSum[r]);
  }
  // The forward's result as the plan stores it (the gradient's input).
  std::vector<float> stored = o;
  if (storage == kernels::DType::BF16)
    for (float &e : stored)
      e = kernels::bf16ToF32(kernels::f32ToBf16(e));
  float *dq = m.zeros(nq), *dk0 = m.zeros(nkv), *dv0 = m.zeros(nkv), *dk1 = m.zeros(nkv),
        *dv1 = m.zeros(nkv);
  const float *po = m.put(stored), *pg = m.put(qkvkvg[5]), *plse = m.put(lse);
  for (auto [k, v, dk, dv, causal] :
       {std::tuple{pk0, pv0, dk0, dv0, 1}, std::tuple{pk1, pv1, dk1, dv1, 0}})
    OK(run(d, kernels::OpKind::AttentionBlockGrad,
           withFirstKeys({{pq, qShape}, {k, kvShape}, {v, kvShape}, {po, qShape}, {pg, qShape},
                          {plse, rowShape}}),
           {{dq, qShape}, {dk, kvShape}, {dv, kvShape}}, withCausal(causal), {scale}));
  std::vector<float> out = o;
  out.insert(out.end(), lse.begin(), lse.end());
  for (auto [p, count] : {std::pair{dq, nq}, {dk0, nkv}, {dv0, nkv}, {dk1, nkv}, {dv1, nkv}}) {
    auto t = m.get(p, count);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST_F(CudaConformance, RingAttentionBlocksAndGradient) {
  // Grouped-query queries against two key/value blocks (the ring's steps), in
  // an f32 plan: the tiled kernels. Blocks of 6 rows, of 45 (two tiles, head
  // size 80), and of 45 with each row's first key (packed documents: rows
  // that see none of the earlier block, or part of it, or of the diagonal one).
  const int64_t B = 2, A = 4, KV = 2;
  struct Config {
    int64_t S, D;
    bool documents;
  };
  for (Config c : {Config{6, 16, false}, Config{45, 80, false}, Config{45, 80, true}}) {
    const int64_t S = c.S, D = c.D;
    const size_t nq = static_cast<size_t>(B * A * S * D), nkv = static_cast<size_t>(B * KV * S * D);
    const std::vector<std::vector<float>> in{randomVector(nq, 91),  randomVector(nkv, 92),
                                             randomVector(nkv, 93), randomVector(nkv, 94),
                                             randomVector(nkv, 95), randomVector(nq, 96)};
    // (Each row still sees itself in the diagonal block: a first key up to its own row.)
    std::vector<int32_t> first(static_cast<size_t>(B * S));
    for (size_t i = 0; i < first.size(); ++i)
      first[i] = std::min(static_cast<int32_t>(i * 11 % (S + 4)) - 2,
                          static_cast<int32_t>(i % static_cast<size_t>(S)));
    compare(
        [&](Device &d, Mem &m) {
          return ringBlocks(d, m, {B, A, S, D}, KV, in, 0.25, kernels::DType::F32,
                            c.documents ? &first : nullptr);
        },
        1e-4f);
  }
}

TEST_F(CudaConformance, RingAttentionBlocksOnCudnnInBf16Plans) {
  // A bf16 plan's ring: its f32 blocks hold bf16 values, and the GPU runs
  // each block on cuDNN's fused attention (the diagonal block causal, the
  // other whole), merging into the f32 accumulators, and each block's
  // gradient from the rows' global result and log-sum-exp. Against the CPU's
  // f32 blocks on the same values, within bf16's rounding.
  const int64_t B = 1, A = 4, KV = 2, S = 64, D = 64;
  const size_t nq = static_cast<size_t>(B * A * S * D), nkv = static_cast<size_t>(B * KV * S * D);
  auto bf16Values = [](std::vector<float> x) {
    for (float &e : x)
      e = kernels::bf16ToF32(kernels::f32ToBf16(e));
    return x;
  };
  const std::vector<std::vector<float>> in{
      bf16Values(randomVector(nq, 81)),  bf16Values(randomVector(nkv, 82)),
      bf16Values(randomVector(nkv, 83)), bf16Values(randomVector(nkv, 84)),
      bf16Values(randomVector(nkv, 85)), bf16Values(randomVector(nq, 86))};
  compare(
      [&](Device &d, Mem &m) {
        return ringBlocks(d, m, {B, A, S, D}, KV, in, 0.125, kernels::DType::BF16);
      },
      2e-2f);
}

TEST_F(CudaConformance, VocabularyParallelEmbeddingAndGradient) {
  auto table = randomVector(10 * 8, 19), g = randomVector(6 * 8, 20);
  std::vector<int32_t> tokenIds{0, 12, 5, 19, 12, 3}; // rows 0..9 live on the other rank
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(6 * 8), *dt = m.zeros(10 * 8);
    const int32_t *pid = m.put(tokenIds);
    // Mesh axis 0: this is rank 1 of 2 (run()'s coordinates): rows 10..19.
    OK(run(d, kernels::OpKind::Embedding, {{m.put(table), {10, 8}}, ids(pid, {6})},
           {{out, {6, 8}}}, {0}));
    OK(run(d, kernels::OpKind::EmbeddingGrad, {ids(pid, {6}), {m.put(g), {6, 8}}},
           {{dt, {10, 8}}}, {0}));
    auto r = m.get(out, 48), t = m.get(dt, 80);
    r.insert(r.end(), t.begin(), t.end());
    return r;
  });
}

// Dropout's masks on the GPU are the CPU's, element for element: the same
// Philox draws and the same global indices (a blocked split over the mesh
// axis, micro-batch rows).
TEST_F(CudaConformance, DropoutDrawsTheCpuMasks) {
  auto x = randomVector(4 * 6 * 10, 21);
  compare(
      [&](Device &d, Mem &m) {
        float *out = m.zeros(240);
        OK(run(d, kernels::OpKind::Dropout, {{m.put(x), {4, 6, 10}}}, {{out, {4, 6, 10}}},
               {7, 1, 1, 0, 2, 1, 0, 1, 0}, {0.3}));
        return m.get(out, 240);
      },
      0.0f);
}

// The sums that used float atomics (the embedding gradient, the cross-entropy
// mean, the gradient norm's sum of squares) now add in a fixed order: against
// the CPU, and bitwise the same when run twice on the GPU. Many tokens share
// few ids (long runs of equal ids in the sorted gradient).
TEST_F(CudaConformance, SumsWithoutAtomicsMatchAndRepeatBitwise) {
  const int64_t n = 5000, vocab = 50, dim = 96, rows = 300, classes = 70;
  std::vector<int32_t> tokenIds(n), targets(rows);
  for (int64_t i = 0; i < n; ++i)
    tokenIds[static_cast<size_t>(i)] = static_cast<int32_t>((i * 13 + i / 7) % vocab);
  for (int64_t r = 0; r < rows; ++r)
    targets[static_cast<size_t>(r)] = static_cast<int32_t>((r * 11) % classes);
  auto g = randomVector(n * dim, 31), logits = randomVector(rows * classes, 32);
  auto body = [&](Device &d, Mem &m) {
    float *dt = m.zeros(vocab * dim), *loss = m.zeros(1), *norm = m.zeros(1);
    const float *pg = m.put(g), *pl = m.put(logits);
    OK(run(d, kernels::OpKind::EmbeddingGrad, {ids(m.put(tokenIds), {n}), {pg, {n, dim}}},
           {{dt, {vocab, dim}}}));
    OK(run(d, kernels::OpKind::CrossEntropy, {{pl, {rows, classes}}, ids(m.put(targets), {rows})},
           {{loss, {}}}));
    OK(run(d, kernels::OpKind::SumOfSquares, {{pg, {n * dim}}, {pl, {rows * classes}}},
           {{norm, {1}}}));
    auto out = m.get(dt, static_cast<size_t>(vocab * dim));
    out.push_back(m.get(loss, 1)[0]);
    out.push_back(m.get(norm, 1)[0] / static_cast<float>(n * dim)); // ~1: within the bound
    return out;
  };
  compare(body, 1e-4f);
  std::vector<float> first, second;
  for (auto *into : {&first, &second}) {
    Mem m(*gpu_);
    *into = body(*gpu_, m);
    ASSERT_TRUE(gpu_->synchronize().isOk());
  }
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
}

TEST_F(CudaConformance, BadIdsAreReportedAtSynchronize) {
  Mem m(*gpu_);
  std::vector<int32_t> badIds{1, 70000};
  float *out = m.zeros(2 * 4);
  OK(run(*gpu_, kernels::OpKind::Embedding, {{m.put(randomVector(40, 1)), {10, 4}}, ids(m.put(badIds), {2})},
         {{out, {2, 4}}}));
  Status s = gpu_->synchronize();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("embedding index 70000 at position 1 is outside [0, 10)"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(gpu_->synchronize().isOk()); // reported once
}

TEST_F(CudaConformance, CrossEntropyWholeAndVocabularyParallel) {
  int64_t rows = 12, classes = 50;
  auto x = randomVector(rows * classes, 21);
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r)
    t[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % classes);
  compare(
      [&](Device &d, Mem &m) {
        float *loss = m.zeros(1), *dx = m.zeros(rows * classes);
        const float *px = m.put(x);
        const int32_t *pt = m.put(t);
        OK(run(d, kernels::OpKind::CrossEntropy, {{px, {rows, classes}}, ids(pt, {rows})},
               {{loss, {}}}));
        OK(run(d, kernels::OpKind::CrossEntropyGrad,
               {{px, {rows, classes}}, ids(pt, {rows}), {m.put(std::vector<float>{2.0f}), {}}},
               {{dx, {rows, classes}}}));
        auto out = m.get(loss, 1), grad = m.get(dx, rows * classes);
        out.insert(out.end(), grad.begin(), grad.end());
        return out;
      },
      1e-5f);
  // This device holds classes [50, 100) of 100.
  compare(
      [&](Device &d, Mem &m) {
        float *mx = m.zeros(rows), *sum = m.zeros(rows), *tl = m.zeros(rows),
              *loss = m.zeros(1), *dx = m.zeros(rows * classes);
        const float *px = m.put(x);
        std::vector<int32_t> shifted(t);
        for (size_t i = 0; i < shifted.size(); i += 2)
          shifted[i] += 50;
        const int32_t *pt = m.put(shifted);
        const Shape x2{rows, classes}, r1{rows};
        OK(run(d, kernels::OpKind::RowMax, {{px, x2}}, {{mx, r1}}));
        OK(run(d, kernels::OpKind::RowSumExp, {{px, x2}, {mx, r1}}, {{sum, r1}}));
        OK(run(d, kernels::OpKind::TargetLogit, {{px, x2}, ids(pt, r1)}, {{tl, r1}}, {50, 100}));
        OK(run(d, kernels::OpKind::LossFromParts, {{mx, r1}, {sum, r1}, {tl, r1}}, {{loss, {1}}}));
        OK(run(d, kernels::OpKind::VocabParallelGrad,
               {{px, x2}, ids(pt, r1), {m.put(std::vector<float>{1.0f}), {1}}, {mx, r1}, {sum, r1}},
               {{dx, x2}}, {50, 100}));
        auto out = m.get(loss, 1);
        for (auto [p, k] : {std::pair{mx, rows}, std::pair{sum, rows}, std::pair{tl, rows},
                            std::pair{dx, rows * classes}}) {
          auto v = m.get(p, static_cast<size_t>(k));
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      },
      1e-5f);
}

// The loss over bf16 logits as ptc-fuse-loss-widening leaves it: the logits
// read as stored (no widened copy), the loss f32, the gradient bf16 (f32
// math, one rounding); both devices take these types natively. Rows longer
// than a block's threads, an odd class count. The gradient that gives the loss
// too is bitwise the two calls' on each device.
TEST_F(CudaConformance, CrossEntropyReadsBf16Logits) {
  const int64_t rows = 24, classes = 3001;
  auto x = randomVector(rows * classes, 41);
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r)
    t[static_cast<size_t>(r)] = static_cast<int32_t>((r * 379) % classes);
  compare(
      [&](Device &d, Mem &m) {
        const auto bf16 = kernels::DType::BF16;
        const Shape ls{rows, classes};
        uint16_t *x16 = m.zeros<uint16_t>(x.size()), *dx16 = m.zeros<uint16_t>(x.size());
        OK(d.convertFloat(m.put(x), FloatType::F32, x16, FloatType::BF16, rows * classes));
        float *loss = m.zeros(1), *dx = m.zeros(rows * classes);
        const int32_t *pt = m.put(t);
        OK(run(d, kernels::OpKind::CrossEntropy, {{x16, ls, bf16}, ids(pt, {rows})}, {{loss, {}}}));
        OK(run(d, kernels::OpKind::CrossEntropyGrad,
               {{x16, ls, bf16}, ids(pt, {rows}), {m.put(std::vector<float>{0.5f}), {}}},
               {{dx16, ls, bf16}}));
        OK(d.convertFloat(dx16, FloatType::BF16, dx, FloatType::F32, rows * classes));
        // The gradient with the loss as its second output (ptc.cross_entropy_with_grad):
        // bitwise the two calls' on the same device.
        uint16_t *fused16 = m.zeros<uint16_t>(x.size());
        float *fusedLoss = m.zeros(1);
        OK(run(d, kernels::OpKind::CrossEntropyGrad,
               {{x16, ls, bf16}, ids(pt, {rows}), {m.put(std::vector<float>{0.5f}), {}}},
               {{fused16, ls, bf16}, {fusedLoss, {}}}));
        OK(d.synchronize());
        EXPECT_EQ(m.get(fusedLoss, 1), m.get(loss, 1)) << "the fused call's loss";
        EXPECT_TRUE(m.get(fused16, x.size()) == m.get(dx16, x.size())) << "the fused gradient";
        auto out = m.get(loss, 1), grad = m.get(dx, rows * classes);
        for (float &g : grad) // (softmax - onehot) * classes: O(1) values, one bf16
          g *= static_cast<float>(rows * 2 * classes); // rounding within the bound
        out.insert(out.end(), grad.begin(), grad.end());
        return out;
      },
      1e-2f);
  // The vocabulary-parallel pieces on a block of bf16 logits (classes [3001,
  // 6002) of 6002; half the targets another rank's): the gradient in bf16.
  compare(
      [&](Device &d, Mem &m) {
        const auto bf16 = kernels::DType::BF16;
        const Shape ls{rows, classes}, r1{rows};
        uint16_t *x16 = m.zeros<uint16_t>(x.size()), *dx16 = m.zeros<uint16_t>(x.size());
        OK(d.convertFloat(m.put(x), FloatType::F32, x16, FloatType::BF16, rows * classes));
        std::vector<int32_t> shifted(t);
        for (size_t i = 0; i < shifted.size(); i += 2)
          shifted[i] += static_cast<int32_t>(classes);
        const int32_t *pt = m.put(shifted);
        float *mx = m.zeros(rows), *sum = m.zeros(rows), *tl = m.zeros(rows),
              *dx = m.zeros(rows * classes);
        const std::vector<int64_t> block{classes, 2 * classes};
        OK(run(d, kernels::OpKind::RowMax, {{x16, ls, bf16}}, {{mx, r1}}));
        OK(run(d, kernels::OpKind::RowSumExp, {{x16, ls, bf16}, {mx, r1}}, {{sum, r1}}));
        OK(run(d, kernels::OpKind::TargetLogit, {{x16, ls, bf16}, ids(pt, r1)}, {{tl, r1}},
               block));
        OK(run(d, kernels::OpKind::VocabParallelGrad,
               {{x16, ls, bf16}, ids(pt, r1), {m.put(std::vector<float>{0.5f}), {1}}, {mx, r1},
                {sum, r1}},
               {{dx16, ls, bf16}}, block));
        OK(d.convertFloat(dx16, FloatType::BF16, dx, FloatType::F32, rows * classes));
        std::vector<float> out;
        for (auto [p, k] : {std::pair{mx, rows}, std::pair{sum, rows}, std::pair{tl, rows}}) {
          auto v = m.get(p, static_cast<size_t>(k));
          out.insert(out.end(), v.begin(), v.end());
        }
        auto grad = m.get(dx, rows * classes);
        for (float &g : grad)
          g *= static_cast<float>(rows * 2 * classes);
        out.insert(out.end(), grad.begin(), grad.end());
        return out;
      },
      1e-2f);
}

TEST_F(CudaConformance, LayoutOps) {
  auto x = randomVector(2 * 3 * 4 * 5, 22), y = randomVector(2 * 2 * 4 * 5, 23);
  compare(
      [&](Device &d, Mem &m) {
        float *t = m.zeros(120), *sl = m.zeros(2 * 2 * 3 * 5), *pd = m.zeros(4 * 5 * 6 * 5),
              *cat = m.zeros(2 * 5 * 4 * 5);
        const float *px = m.put(x);
        OK(run(d, kernels::OpKind::Transpose, {{px, {2, 3, 4, 5}}}, {{t, {2, 4, 3, 5}}},
               {0, 2, 1, 3}));
        OK(run(d, kernels::OpKind::Slice, {{px, {2, 3, 4, 5}}}, {{sl, {2, 2, 3, 5}}},
               {0, 1, 1, 0}));
        OK(run(d, kernels::OpKind::Pad, {{px, {2, 3, 4, 5}}}, {{pd, {4, 5, 6, 5}}}, {1, 1, 2, 0}));
        OK(run(d, kernels::OpKind::Concat, {{px, {2, 3, 4, 5}}, {m.put(y), {2, 2, 4, 5}}},
               {{cat, {2, 5, 4, 5}}}, {1}));
        auto out = m.get(t, 120);
        for (auto [p, n] : {std::pair{sl, 60}, std::pair{pd, 600}, std::pair{cat, 200}}) {
          auto v = m.get(p, static_cast<size_t>(n));
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      },
      0.0f);
  // 2-byte elements (bf16 activations are transposed as stored).
  compare(
      [&](Device &d, Mem &m) {
        std::vector<uint16_t> h(24);
        for (size_t i = 0; i < h.size(); ++i)
          h[i] = static_cast<uint16_t>(i * 37);
        uint16_t *t = m.zeros<uint16_t>(24);
        OK(run(d, kernels::OpKind::Transpose, {{m.put(h), {2, 3, 4}, kernels::DType::BF16}},
               {{t, {4, 2, 3}, kernels::DType::BF16}}, {2, 0, 1}));
        auto r = m.get(t, 24);
        return std::vector<float>(r.begin(), r.end());
      },
      0.0f);
}

TEST_F(CudaConformance, ReductionsAndMaxGradientWithTies) {
  auto x = randomVector(3 * 4 * 5, 24), g = randomVector(12, 25);
  x[7] = x[8] = 9.0f; // a tie inside one reduced row
  for (kernels::OpKind op :
       {kernels::OpKind::ReduceSum, kernels::OpKind::ReduceMean, kernels::OpKind::ReduceMax})
    for (Shape axes : {Shape{1}, Shape{0, 2}, Shape{2}})
      compare([&](Device &d, Mem &m) {
        float *out = m.zeros(60);
        Shape kept;
        for (int64_t i = 0; i < 3; ++i)
          if (std::find(axes.begin(), axes.end(), i) == axes.end())
            kept.push_back(Shape{3, 4, 5}[static_cast<size_t>(i)]);
        OK(run(d, op, {{m.put(x), {3, 4, 5}}}, {{out, kept}}, axes));
        int64_t n = 60;
        for (int64_t a : axes)
          n /= Shape{3, 4, 5}[static_cast<size_t>(a)];
        return m.get(out, static_cast<size_t>(n));
      });
  // Sums and means over leading axes (bias gradients: the two-pass column
  // sums), with a partial last chunk of rows and a partial tile of columns.
  auto big = randomVector(2 * 600 * 70, 26);
  for (kernels::OpKind op : {kernels::OpKind::ReduceSum, kernels::OpKind::ReduceMean})
    for (Shape axes : {Shape{0, 1}, Shape{1, 0}, Shape{0}})
      compare([&](Device &d, Mem &m) {
        const size_t n = axes.size() == 2 ? 70 : 600 * 70;
        float *out = m.zeros(n);
        OK(run(d, op, {{m.put(big), {2, 600, 70}}},
               {{out, axes.size() == 2 ? Shape{70} : Shape{600, 70}}}, axes));
        return m.get(out, n);
      });
  compare([&](Device &d, Mem &m) {
    float *out = m.zeros(60);
    OK(run(d, kernels::OpKind::ReduceMaxGrad, {{m.put(x), {3, 4, 5}}, {m.put(g), {3, 4}}},
           {{out, {3, 4, 5}}}, {2}));
    return m.get(out, 60);
  });
}

TEST_F(CudaConformance, MixtureOfExpertsRoutingWithDrops) {
  // Two routing groups of 5 tokens; capacity 3 per expert per group drops some.
  int64_t groups = 2, perGroup = 5, tokens = groups * perGroup, experts = 4, k = 2, dim = 6,
          capacity = 3, slots = experts * groups * capacity;
  auto logits = randomVector(tokens * experts, 26), x = randomVector(tokens * dim, 27),
       gw = randomVector(tokens * k, 28), eo = randomVector(slots * dim, 29),
       g = randomVector(tokens * dim, 30), ge = randomVector(slots * dim, 31),
       bias = randomVector(experts, 32);
  for (bool normalize : {false, true})
    compare(
        [&](Device &d, Mem &m) {
          float *w = m.zeros(tokens * k), *dl = m.zeros(tokens * experts);
          int32_t *idx = m.zeros<int32_t>(tokens * k);
          const float *pl = m.put(logits);
          std::vector<Arg> gateIn{{pl, {tokens, experts}}};
          if (normalize)
            gateIn.push_back({m.put(bias), {experts}});
          OK(run(d, kernels::OpKind::TopKGate, gateIn, {{w, {tokens, k}}, ids(idx, {tokens, k})},
                 {k, normalize ? 1 : 0}));
          OK(run(d, kernels::OpKind::TopKGateGrad,
                 {{pl, {tokens, experts}}, ids(idx, {tokens, k}), {m.put(gw), {tokens, k}}},
                 {{dl, {tokens, experts}}}, {normalize ? 1 : 0}));
          float *disp = m.zeros(slots * dim), *dd = m.zeros(tokens * dim),
                *comb = m.zeros(tokens * dim), *dexp = m.zeros(slots * dim),
                *dwt = m.zeros(tokens * k), *load = m.zeros(groups * experts);
          const float *pe = m.put(eo);
          // Routing groups: indices [groups, perGroup, k], expert buffers
          // [experts, groups, capacity, dim].
          Arg routed = ids(idx, {groups, perGroup, k});
          Shape tok{groups, perGroup, dim}, buf{experts, groups, capacity, dim},
              wts{groups, perGroup, k};
          OK(run(d, kernels::OpKind::ExpertLoad, {routed}, {{load, {groups, experts}}}));
          OK(run(d, kernels::OpKind::MoeDispatch, {{m.put(x), tok}, routed}, {{disp, buf}}));
          OK(run(d, kernels::OpKind::MoeDispatchGrad, {{m.put(ge), buf}, routed}, {{dd, tok}}));
          OK(run(d, kernels::OpKind::MoeCombine, {{pe, buf}, {w, wts}, routed}, {{comb, tok}}));
          OK(run(d, kernels::OpKind::MoeCombineGrad, {{pe, buf}, {w, wts}, routed, {m.put(g), tok}},
                 {{dexp, buf}, {dwt, wts}}));
          auto ids = m.get(idx, tokens * k);
          std::vector<float> out(ids.begin(), ids.end());
          for (auto [p, n] : {std::pair{w, tokens * k}, std::pair{dl, tokens * experts},
                              std::pair{load, groups * experts}, std::pair{disp, slots * dim},
                              std::pair{dd, tokens * dim}, std::pair{comb, tokens * dim},
                              std::pair{dexp, slots * dim}, std::pair{dwt, tokens * k}}) {
            auto v = m.get(p, static_cast<size_t>(n));
            out.insert(out.end(), v.begin(), v.end());
          }
          return out;
        },
        1e-5f);
}

// The expert dispatch and combine on bf16 tensors (a bf16 plan's MoE layer):
// the GPU reads and writes bf16 as stored (f32 sums and products, each result
// rounded once); the CPU runs the f32 kernels on the same bf16 values and
// rounds its results once, as the runtime's widening does.
TEST_F(CudaConformance, Bf16MoeDispatchAndCombine) {
  const int64_t groups = 2, perGroup = 5, tokens = groups * perGroup, experts = 4, k = 2,
                dim = 6, capacity = 3, slots = experts * groups * capacity;
  std::vector<int32_t> indices(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j)
      indices[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((t + 3 * j) % experts);
  auto x = randomVector(tokens * dim, 41), w = randomVector(tokens * k, 42),
       eo = randomVector(slots * dim, 43), g = randomVector(tokens * dim, 44),
       ge = randomVector(slots * dim, 45);
  compare(
      [&](Device &d, Mem &m) {
        const Bf16OrF32 b{d, m};
        const auto type = b.type();
        auto put = [&](const std::vector<float> &host) { return b.put(host); };
        auto zeros = [&](int64_t n) { return b.zeros(static_cast<size_t>(n)); };
        const Arg routed = ids(m.put(indices), {groups, perGroup, k});
        const Shape tok{groups, perGroup, dim}, buf{experts, groups, capacity, dim},
            wts{groups, perGroup, k};
        void *disp = zeros(slots * dim), *dd = zeros(tokens * dim), *comb = zeros(tokens * dim),
             *dexp = zeros(slots * dim), *dwt = zeros(tokens * k), *pe = put(eo), *pw = put(w);
        OK(run(d, kernels::OpKind::MoeDispatch, {{put(x), tok, type}, routed}, {{disp, buf, type}}));
        OK(run(d, kernels::OpKind::MoeDispatchGrad, {{put(ge), buf, type}, routed},
               {{dd, tok, type}}));
        OK(run(d, kernels::OpKind::MoeCombine, {{pe, buf, type}, {pw, wts, type}, routed},
               {{comb, tok, type}}));
        OK(run(d, kernels::OpKind::MoeCombineGrad,
               {{pe, buf, type}, {pw, wts, type}, routed, {put(g), tok, type}},
               {{dexp, buf, type}, {dwt, wts, type}}));
        std::vector<float> out;
        for (auto [p, n] : {std::pair{disp, slots * dim}, std::pair{dd, tokens * dim},
                            std::pair{comb, tokens * dim}, std::pair{dexp, slots * dim},
                            std::pair{dwt, tokens * k}}) {
          auto v = b.result(p, static_cast<size_t>(n));
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      },
      1e-2f);
}

TEST_F(CudaConformance, OptimizersNormsAndLossScaling) {
  size_t n = 5000;
  auto p = randomVector(n, 32), g = randomVector(n, 33), mm = randomVector(n, 34);
  std::vector<float> v(n, 0.25f);
  for (float skipValue : {0.0f, 1.0f})
    compare([&](Device &d, Mem &m) {
      float *op = m.zeros(n), *om = m.zeros(n), *ov = m.zeros(n), *sb = m.zeros(n),
            *sp = m.zeros(n);
      const float *pp = m.put(p), *pg = m.put(g), *pm = m.put(mm);
      const float *skip = m.put(std::vector<float>{skipValue});
      const Shape s{static_cast<int64_t>(n)};
      OK(run(d, kernels::OpKind::AdamWUpdate,
             {{pp, s}, {pg, s}, {pm, s}, {m.put(v), s}, {m.put(std::vector<float>{3.0f}), {}},
              {skip, {}}},
             {{op, s}, {om, s}, {ov, s}}, {}, {1e-3, 0.9, 0.95, 1e-8, 0.1}));
      OK(run(d, kernels::OpKind::SgdUpdate, {{pp, s}, {pg, s}, {pm, s}, {skip, {}}},
             {{sp, s}, {sb, s}}, {}, {0.1, 0.9, 0.01}));
      // With a bf16 gradient and the working copies (ptc-keep-working-copies),
      // the copies widened to compare.
      uint16_t *g16 = m.zeros<uint16_t>(n), *c16 = m.zeros<uint16_t>(n),
               *s16 = m.zeros<uint16_t>(n);
      float *cp = m.zeros(n), *cm = m.zeros(n), *cv = m.zeros(n), *csp = m.zeros(n),
            *csb = m.zeros(n), *wc = m.zeros(n), *ws = m.zeros(n);
      OK(d.convertFloat(pg, FloatType::F32, g16, FloatType::BF16, static_cast<int64_t>(n)));
      const kernels::DType bf16 = kernels::DType::BF16;
      OK(run(d, kernels::OpKind::AdamWUpdate,
             {{pp, s}, {g16, s, bf16}, {pm, s}, {m.put(v), s}, {m.put(std::vector<float>{3.0f}), {}},
              {skip, {}}},
             {{cp, s}, {cm, s}, {cv, s}, {c16, s, bf16}}, {}, {1e-3, 0.9, 0.95, 1e-8, 0.1}));
      OK(run(d, kernels::OpKind::SgdUpdate, {{pp, s}, {g16, s, bf16}, {pm, s}, {skip, {}}},
             {{csp, s}, {csb, s}, {s16, s, bf16}}, {}, {0.1, 0.9, 0.01}));
      OK(d.convertFloat(c16, FloatType::BF16, wc, FloatType::F32, static_cast<int64_t>(n)));
      OK(d.convertFloat(s16, FloatType::BF16, ws, FloatType::F32, static_cast<int64_t>(n)));
      auto out = m.get(op, n);
      for (float *q : {om, ov, sp, sb, cp, cm, cv, csp, csb, wc, ws}) {
        auto t = m.get(q, n);
        out.insert(out.end(), t.begin(), t.end());
      }
      return out;
    });
  // Multi-tensor AdamW: one launch over three tensors of different sizes,
  // with f32 gradients, then bf16 ones (ptc-fuse-gradient-widening's updates:
  // the GPU reads them in the launch, the CPU updates from widened copies).
  for (const bool bf16Grads : {false, true})
    compare([&](Device &d, Mem &m) {
      std::vector<size_t> sizes{1000, 3, 4097};
      std::vector<float *> outs;
      // Every call's views and shapes, alive until the launch.
      std::vector<Shape> shapes(sizes.size());
      std::vector<std::vector<kernels::TensorView>> ins(sizes.size()), outViews(sizes.size());
      const Shape scalar{};
      const std::vector<int64_t> noInts;
      const std::vector<double> hp{1e-3, 0.9, 0.95, 1e-8, 0.1};
      float *step = m.put(std::vector<float>{7.0f});
      std::vector<kernels::KernelCall> calls;
      const kernels::KernelEntry &entry = d.kernelTable()[kernels::OpKind::AdamWUpdate];
      bool native = false;
      for (size_t i = 0; i < sizes.size(); ++i) {
        size_t k = sizes[i];
        float *op = m.zeros(k), *om = m.zeros(k), *ov = m.zeros(k),
              *g = m.put(randomVector(k, 60 + i));
        uint16_t *g16 = m.zeros<uint16_t>(k);
        if (bf16Grads) { // the gradient's bf16 values, in g16 and (widened) in g
          OK(d.convertFloat(g, FloatType::F32, g16, FloatType::BF16, static_cast<int64_t>(k)));
          OK(d.convertFloat(g16, FloatType::BF16, g, FloatType::F32, static_cast<int64_t>(k)));
        }
        shapes[i] = {static_cast<int64_t>(k)};
        auto view = [&](void *data, kernels::DType t = kernels::DType::F32) {
          return kernels::TensorView{data, t, &shapes[i], static_cast<int64_t>(k)};
        };
        ins[i] = {view(m.put(randomVector(k, 50 + i))), view(g16, kernels::DType::BF16),
                  view(m.put(randomVector(k, 70 + i))), view(m.put(std::vector<float>(k, 0.5f))),
                  kernels::TensorView{step, kernels::DType::F32, &scalar, 1}};
        outViews[i] = {view(op), view(om), view(ov)};
        calls.push_back(kernels::makeKernelCall(kernels::OpKind::AdamWUpdate, ins[i], outViews[i],
                                                noInts, hp));
        // The GPU's batched entry reads bf16 gradients; the CPU's updates
        // from their widened copies.
        native = bf16Grads && entry.runBatch && entry.batchAccepts(calls.back());
        if (!native)
          ins[i][1] = view(g);
        outs.insert(outs.end(), {op, om, ov});
      }
      OK(d.launchBatch(calls.data(), calls.size()));
      std::vector<float> out;
      for (size_t i = 0; i < outs.size(); ++i) {
        auto v = m.get(outs[i], sizes[i / 3]);
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    });
  // Multi-tensor SGD with momentum and weight decay, writing bf16 working
  // copies: one launch on the GPU (its batched entry), calls in order on the CPU.
  compare([&](Device &d, Mem &m) {
    const std::vector<size_t> sizes{1000, 3, 4097};
    std::vector<Shape> shapes(sizes.size());
    std::vector<std::vector<kernels::TensorView>> ins(sizes.size()), outViews(sizes.size());
    const std::vector<int64_t> noInts;
    const std::vector<double> hp{0.05, 0.9, 0.01};
    std::vector<kernels::KernelCall> calls;
    std::vector<std::pair<const void *, size_t>> f32Outs, copies;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t k = sizes[i];
      shapes[i] = {static_cast<int64_t>(k)};
      auto view = [&](void *data, kernels::DType t = kernels::DType::F32) {
        return kernels::TensorView{data, t, &shapes[i], static_cast<int64_t>(k)};
      };
      float *op = m.zeros(k), *ob = m.zeros(k);
      uint16_t *copy = m.zeros<uint16_t>(k);
      ins[i] = {view(m.put(randomVector(k, 110 + i))), view(m.put(randomVector(k, 120 + i))),
                view(m.put(randomVector(k, 130 + i)))};
      outViews[i] = {view(op), view(ob), view(copy, kernels::DType::BF16)};
      calls.push_back(
          kernels::makeKernelCall(kernels::OpKind::SgdUpdate, ins[i], outViews[i], noInts, hp));
      f32Outs.insert(f32Outs.end(), {{op, k}, {ob, k}});
      copies.push_back({copy, k});
    }
    OK(d.launchBatch(calls.data(), calls.size()));
    std::vector<float> out;
    for (auto [p, k] : f32Outs) {
      auto v = m.get(static_cast<const float *>(p), k);
      out.insert(out.end(), v.begin(), v.end());
    }
    for (auto [p, k] : copies) {
      float *f = m.zeros(k);
      OK(d.convertFloat(p, FloatType::BF16, f, FloatType::F32, static_cast<int64_t>(k)));
      auto v = m.get(f, k);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  });
  auto g2 = randomVector(300, 35);
  g2[17] = INFINITY;
  compare(
      [&](Device &d, Mem &m) {
        const float *a = m.put(g), *b = m.put(g2);
        float *sum = m.zeros(1), *oa = m.zeros(n), *ob = m.zeros(300), *found = m.zeros(1);
        const Shape s{static_cast<int64_t>(n)};
        OK(run(d, kernels::OpKind::SumOfSquares, {{a, s}}, {{sum, {1}}}));
        // The norm in the sum's memory, as the executor does.
        OK(run(d, kernels::OpKind::ClipByNorm, {{a, s}, {sum, {1}}}, {{oa, s}, {sum, {1}}}, {},
               {1.0}));
        OK(run(d, kernels::OpKind::UnscaleGrads,
               {{a, s}, {b, {300}}, {m.put(std::vector<float>{1024.0f}), {1}}},
               {{oa, s}, {ob, {300}}, {found, {1}}}));
        auto out = m.get(sum, 1), f = m.get(found, 1), v1 = m.get(oa, n);
        out.insert(out.end(), f.begin(), f.end());
        out.insert(out.end(), v1.begin(), v1.end());
        return out;
      },
      1e-5f);
}

// ptc-keep-working-copies: AdamW and SGD read a bf16 gradient as stored and
// write the new parameter's bf16 working copy, bitwise the f32 update on the
// widened gradient followed by a conversion; a skipped update rounds the old
// parameter.
TEST(CpuDevice, UpdatesWriteWorkingCopies) {
  auto dev = createCpuDevice();
  Mem m(*dev);
  const int64_t n = 40000; // over the kernels' parallel grain
  const Shape s{n};
  auto p = randomVector(n, 11), g = randomVector(n, 12), mm = randomVector(n, 13);
  std::vector<float> v(static_cast<size_t>(n), 0.5f);
  uint16_t *g16 = m.zeros<uint16_t>(static_cast<size_t>(n));
  float *g32 = m.put(g);
  OK(dev->convertFloat(g32, FloatType::F32, g16, FloatType::BF16, n));
  OK(dev->convertFloat(g16, FloatType::BF16, g32, FloatType::F32, n));
  float *step = m.put(std::vector<float>{2.0f}), *skip = m.put(std::vector<float>{0.0f});
  const kernels::DType bf16 = kernels::DType::BF16;
  for (float skipValue : {0.0f, 1.0f}) {
    *skip = skipValue;
    // The reference: f32 gradient, no copy; then the copy by conversion.
    float *rp = m.zeros(n), *rm = m.zeros(n), *rv = m.zeros(n), *rs = m.zeros(n), *rb = m.zeros(n);
    uint16_t *rc = m.zeros<uint16_t>(static_cast<size_t>(n)),
             *rsc = m.zeros<uint16_t>(static_cast<size_t>(n));
    OK(run(*dev, kernels::OpKind::AdamWUpdate,
           {{m.put(p), s}, {g32, s}, {m.put(mm), s}, {m.put(v), s}, {step, {}}, {skip, {}}},
           {{rp, s}, {rm, s}, {rv, s}}, {}, {1e-3, 0.9, 0.95, 1e-8, 0.1}));
    OK(run(*dev, kernels::OpKind::SgdUpdate, {{m.put(p), s}, {g32, s}, {m.put(mm), s}, {skip, {}}},
           {{rs, s}, {rb, s}}, {}, {0.1, 0.9, 0.01}));
    OK(dev->convertFloat(rp, FloatType::F32, rc, FloatType::BF16, n));
    OK(dev->convertFloat(rs, FloatType::F32, rsc, FloatType::BF16, n));
    // In one pass, the gradient read as bf16.
    float *op = m.zeros(n), *om = m.zeros(n), *ov = m.zeros(n), *sp = m.zeros(n), *sb = m.zeros(n);
    uint16_t *oc = m.zeros<uint16_t>(static_cast<size_t>(n)),
             *sc = m.zeros<uint16_t>(static_cast<size_t>(n));
    OK(run(*dev, kernels::OpKind::AdamWUpdate,
           {{m.put(p), s}, {g16, s, bf16}, {m.put(mm), s}, {m.put(v), s}, {step, {}}, {skip, {}}},
           {{op, s}, {om, s}, {ov, s}, {oc, s, bf16}}, {}, {1e-3, 0.9, 0.95, 1e-8, 0.1}));
    OK(run(*dev, kernels::OpKind::SgdUpdate,
           {{m.put(p), s}, {g16, s, bf16}, {m.put(mm), s}, {skip, {}}},
           {{sp, s}, {sb, s}, {sc, s, bf16}}, {}, {0.1, 0.9, 0.01}));
    EXPECT_EQ(m.get(op, n), m.get(rp, n));
    EXPECT_EQ(m.get(om, n), m.get(rm, n));
    EXPECT_EQ(m.get(ov, n), m.get(rv, n));
    EXPECT_EQ(m.get(sp, n), m.get(rs, n));
    EXPECT_EQ(m.get(sb, n), m.get(rb, n));
    EXPECT_EQ(std::memcmp(oc, rc, static_cast<size_t>(n) * 2), 0) << "AdamW, skip " << skipValue;
    EXPECT_EQ(std::memcmp(sc, rsc, static_cast<size_t>(n) * 2), 0) << "SGD, skip " << skipValue;
  }
}

// The whole-gradient operations as one launch over many tensors (a
// descriptor table): the sum of squares over tensors of 1 to 300000 elements
// (a tensor of more blocks than a launch gives one, each block's share as
// before), run twice (the same bits: a fixed order of partial sums), the clip
// by that norm, and the unscaling of them with an infinity in one.
TEST_F(CudaConformance, MultiTensorNormClipAndUnscale) {
  const std::vector<size_t> sizes{1, 1000, 300000, 7};
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < sizes.size(); ++i)
    grads.push_back(randomVector(sizes[i], static_cast<unsigned>(140 + i)));
  grads[3][5] = INFINITY;
  compare(
      [&](Device &d, Mem &m) {
        std::vector<Arg> in, clipIn, clipOut, unscaleIn, unscaleOut;
        float *sum = m.zeros(1), *again = m.zeros(1), *found = m.zeros(1);
        for (size_t i = 0; i < sizes.size(); ++i) {
          const Shape s{static_cast<int64_t>(sizes[i])};
          const float *g = m.put(grads[i]);
          if (i < 3) { // the finite ones
            in.push_back({g, s});
            clipIn.push_back({g, s});
            clipOut.push_back({m.zeros(sizes[i]), s});
          }
          unscaleIn.push_back({g, s});
          unscaleOut.push_back({m.zeros(sizes[i]), s});
        }
        OK(run(d, kernels::OpKind::SumOfSquares, in, {{sum, {1}}}));
        OK(run(d, kernels::OpKind::SumOfSquares, in, {{again, {1}}}));
        clipIn.push_back({sum, {1}});
        clipOut.push_back({m.zeros(1), {1}});
        OK(run(d, kernels::OpKind::ClipByNorm, clipIn, clipOut, {}, {1.0}));
        unscaleIn.push_back({m.put(std::vector<float>{512.0f}), {1}});
        unscaleOut.push_back({found, {1}});
        OK(run(d, kernels::OpKind::UnscaleGrads, unscaleIn, unscaleOut));
        auto out = m.get(sum, 1), twice = m.get(again, 1);
        EXPECT_EQ(0, std::memcmp(out.data(), twice.data(), sizeof(float)))
            << "the sum of squares differs between two runs";
        for (const std::vector<Arg> *args : {&clipOut, &unscaleOut})
          for (const Arg &a : *args) {
            auto v = m.get(static_cast<const float *>(a.data), static_cast<size_t>(a.shape[0]));
            out.insert(out.end(), v.begin(), v.end());
          }
        return out;
      },
      1e-5f);
}

// The non-finite check every AdamW/SGD update takes its skip flag from: f32,
// bf16 and f16 tensors read as stored, infinities and NaNs of either sign
// anywhere (the last element of a long tensor, a short one), the largest
// finite values not.
TEST_F(CudaConformance, AnyNonfiniteOverF32Bf16AndF16) {
  constexpr uint16_t kBf16Max = 0x7F7F, kBf16Nan = 0x7FC0, kBf16NegInf = 0xFF80;
  constexpr uint16_t kF16Max = 0x7BFF, kF16Inf = 0x7C00, kF16Nan = 0x7E00;
  struct Case {
    float f32Last;  // the last of 5000 f32 elements
    uint16_t bf16;  // element 17 of 300 bf16 ones
    uint16_t f16;   // element 3 of 7 f16 ones
    float expected;
  };
  for (const Case &c : {Case{1.0f, kBf16Max, kF16Max, 0.0f}, Case{INFINITY, kBf16Max, kF16Max, 1.0f},
                        Case{-INFINITY, kBf16Max, kF16Max, 1.0f}, Case{NAN, kBf16Max, kF16Max, 1.0f},
                        Case{3.4e38f, kBf16Nan, kF16Max, 1.0f}, Case{1.0f, kBf16NegInf, kF16Max, 1.0f},
                        Case{1.0f, kBf16Max, kF16Inf, 1.0f}, Case{1.0f, kBf16Max, kF16Nan, 1.0f}})
    compare([&](Device &d, Mem &m) {
      auto f32 = randomVector(5000, 80);
      f32.back() = c.f32Last;
      std::vector<uint16_t> bf16(300, 0x3F80), f16(7, 0x3C00); // 1.0 each
      bf16[17] = c.bf16;
      f16[3] = c.f16;
      float *found = m.zeros(1);
      OK(run(d, kernels::OpKind::AnyNonfinite,
             {{m.put(f32), {5000}}, {m.put(bf16), {300}, kernels::DType::BF16},
              {m.put(f16), {7}, kernels::DType::F16}},
             {{found, {1}}}));
      auto flag = m.get(found, 1);
      EXPECT_EQ(flag[0], c.expected) << "f32 last " << c.f32Last << ", bf16 0x" << std::hex
                                     << c.bf16 << ", f16 0x" << c.f16;
      return flag;
    });
}

} // namespace
} // namespace ptc
