// Each CUDA kernel against its CPU counterpart (label `gpu`; without a GPU
// every test is skipped with "skipped: no GPU").

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"

#include "test/unit/TestUtil.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace cpu = ptc::kernels::cpu;
namespace gpu = ptc::kernels::cuda;

namespace {
using ptc::test::randomVector;

/// A device copy of a host vector, freed at scope exit.
template <typename T> struct DeviceVector {
  explicit DeviceVector(const std::vector<T> &host) : n(host.size()) {
    p = static_cast<T *>(gpu::deviceAlloc(static_cast<int64_t>(n * sizeof(T))));
    gpu::copyToDevice(p, host.data(), static_cast<int64_t>(n * sizeof(T)));
  }
  explicit DeviceVector(size_t n) : DeviceVector(std::vector<T>(n)) {}
  ~DeviceVector() { gpu::deviceFree(p); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    gpu::copyToHost(out.data(), p, static_cast<int64_t>(n * sizeof(T)));
    return out;
  }
  T *p;
  size_t n;
};

void expectNear(const std::vector<float> &a, const std::vector<float> &b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::fabs(b[i]))) << "at " << i;
}

class CudaKernels : public ::testing::Test {
protected:
  void SetUp() override {
    if (!gpu::gpuAvailable())
      GTEST_SKIP() << "skipped: no GPU";
  }
};
} // namespace

TEST_F(CudaKernels, ElementwiseWithBroadcast) {
  std::vector<int64_t> as{4, 3, 8}, bs{8}, os{4, 3, 8};
  auto a = randomVector(96, 1), b = randomVector(8, 2);
  for (auto kind : {gpu::Binary::Add, gpu::Binary::Sub, gpu::Binary::Mul, gpu::Binary::Div}) {
    DeviceVector<float> da(a), db(b), dout(96);
    gpu::binary(kind, da.p, as, db.p, bs, dout.p, os, nullptr);
    ASSERT_TRUE(gpu::check("binary").isOk());
    std::vector<float> ref(96);
    cpu::binary(static_cast<cpu::Binary>(static_cast<int>(kind)), a.data(), as, b.data(), bs,
                ref.data(), os);
    expectNear(dout.host(), ref, 1e-6f);
  }
}

TEST_F(CudaKernels, ActivationsAndScale) {
  auto x = randomVector(1000, 3), g = randomVector(1000, 4);
  DeviceVector<float> dx(x), dg(g), dout(1000);
  std::vector<float> ref(1000);
  gpu::gelu(dx.p, dout.p, 1000, nullptr);
  cpu::gelu(x.data(), ref.data(), 1000);
  expectNear(dout.host(), ref, 1e-5f);
  gpu::geluGrad(dx.p, dg.p, dout.p, 1000, nullptr);
  cpu::geluGrad(x.data(), g.data(), ref.data(), 1000);
  expectNear(dout.host(), ref, 1e-5f);
  gpu::relu(dx.p, dout.p, 1000, nullptr);
  cpu::relu(x.data(), ref.data(), 1000);
  expectNear(dout.host(), ref, 0.0f);
  gpu::scale(dx.p, dout.p, 1000, 0.25f, nullptr);
  cpu::scale(x.data(), ref.data(), 1000, 0.25f);
  expectNear(dout.host(), ref, 0.0f);
}

TEST_F(CudaKernels, LayerNormAndSoftmax) {
  const int64_t rows = 37, cols = 300;
  auto x = randomVector(rows * cols, 5), w = randomVector(cols, 6), b = randomVector(cols, 7);
  DeviceVector<float> dx(x), dw(w), db(b), dout(x.size());
  std::vector<float> ref(x.size());
  gpu::layerNorm(dx.p, dw.p, db.p, dout.p, rows, cols, 1e-5f, nullptr);
  cpu::layerNorm(x.data(), w.data(), b.data(), ref.data(), rows, cols, 1e-5f);
  expectNear(dout.host(), ref, 1e-4f);
  gpu::softmaxLastAxis(dx.p, dout.p, rows, cols, nullptr);
  cpu::softmax(x.data(), ref.data(), {rows, cols}, 1);
  expectNear(dout.host(), ref, 1e-5f);
}

TEST_F(CudaKernels, CrossEntropyAndGradient) {
  const int64_t rows = 64, classes = 50;
  auto logits = randomVector(rows * classes, 8);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % classes);
  DeviceVector<float> dl(logits), dloss(1), dg(std::vector<float>{2.0f}), dout(logits.size());
  DeviceVector<int32_t> dt(targets);
  DeviceVector<int> bad(1);
  gpu::crossEntropy(dl.p, dt.p, rows, classes, dloss.p, bad.p, nullptr);
  float ref = 0;
  ASSERT_TRUE(cpu::crossEntropy(logits.data(), targets.data(), rows, classes, &ref).isOk());
  EXPECT_NEAR(dloss.host()[0], ref, 1e-4f * ref);
  EXPECT_EQ(bad.host()[0], 0);
  gpu::crossEntropyGrad(dl.p, dt.p, dg.p, rows, classes, dout.p, nullptr);
  std::vector<float> refGrad(logits.size());
  float two = 2.0f;
  ASSERT_TRUE(cpu::crossEntropyGrad(logits.data(), targets.data(), &two, rows, classes,
                                    refGrad.data()).isOk());
  expectNear(dout.host(), refGrad, 1e-5f);
}

TEST_F(CudaKernels, EmbeddingAttentionAdamW) {
  auto table = randomVector(20 * 8, 9);
  std::vector<int32_t> ids{3, 0, 19, 7, 7};
  DeviceVector<float> dt(table), dout(5 * 8);
  DeviceVector<int32_t> di(ids);
  gpu::embedding(dt.p, 20, 8, di.p, 5, dout.p, nullptr);
  std::vector<float> ref(40);
  ASSERT_TRUE(cpu::embedding(table.data(), 20, 8, ids.data(), 5, ref.data(), 0, 20).isOk());
  expectNear(dout.host(), ref, 0.0f);

  const int64_t b = 2, h = 3, t = 17, d = 16;
  auto q = randomVector(b * h * t * d, 10), k = randomVector(q.size(), 11),
       v = randomVector(q.size(), 12);
  DeviceVector<float> dq(q), dk(k), dv(v), da(q.size());
  ASSERT_TRUE(gpu::causalAttention(dq.p, dk.p, dv.p, da.p, b * h, t, d, 0.25f, nullptr).isOk());
  std::vector<float> refA(q.size());
  cpu::causalAttention(q.data(), k.data(), v.data(), refA.data(), {b, h, t, d}, 0.25f);
  expectNear(da.host(), refA, 1e-4f);

  auto p = randomVector(500, 13), g = randomVector(500, 14);
  std::vector<float> m(500, 0.1f), vv(500, 0.2f);
  DeviceVector<float> dp(p), dg(g), dm(m), dvv(vv);
  gpu::adamwUpdate(dp.p, dg.p, dm.p, dvv.p, 3.0f, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 500, nullptr);
  std::vector<float> rp(500), rm(500), rv(500);
  cpu::adamwUpdate(p.data(), g.data(), m.data(), vv.data(), 3.0f, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f},
                   500, rp.data(), rm.data(), rv.data());
  expectNear(dp.host(), rp, 1e-6f);
  expectNear(dm.host(), rm, 1e-6f);
}

TEST_F(CudaKernels, MatmulAndConversions) {
  const int64_t m = 33, n = 17, k = 29;
  auto a = randomVector(m * k, 15), b = randomVector(n * k, 16);
  DeviceVector<float> da(a), db(b), dc(m * n);
  // A [M,K] times B^T (B stored [N,K]), as a linear layer.
  ASSERT_TRUE(gpu::matmul(da.p, db.p, dc.p, 1, m, n, k, false, true, 0, 0, 0, nullptr).isOk());
  std::vector<float> ref(m * n);
  cpu::matmul(a.data(), {m, k}, b.data(), {n, k}, ref.data(), false, true);
  expectNear(dc.host(), ref, 1e-4f);

  auto x = randomVector(100, 17);
  DeviceVector<float> dx(x), back(100);
  DeviceVector<uint16_t> half(100);
  std::vector<uint16_t> refHalf(100);
  std::vector<float> refBack(100);
  for (auto [g, c] : {std::pair{gpu::FloatType::BF16, cpu::FloatType::BF16},
                      std::pair{gpu::FloatType::F16, cpu::FloatType::F16}}) {
    gpu::convertFloat(dx.p, gpu::FloatType::F32, half.p, g, 100, nullptr);
    gpu::convertFloat(half.p, g, back.p, gpu::FloatType::F32, 100, nullptr);
    cpu::convertFloat(x.data(), cpu::FloatType::F32, refHalf.data(), c, 100);
    cpu::convertFloat(refHalf.data(), c, refBack.data(), cpu::FloatType::F32, 100);
    EXPECT_EQ(half.host(), refHalf);
    expectNear(back.host(), refBack, 0.0f);
  }
}
