// CpuDevice: host memory and the kernels of kernels/cpu. Everything runs in
// order on the calling thread, so events are already complete when recorded.
#ifndef PTC_RUNTIME_DEVICE_CPU_DEVICE_H
#define PTC_RUNTIME_DEVICE_CPU_DEVICE_H

#include "runtime/device/device.h"

#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc {
namespace cpu_device_detail {

inline constexpr size_t kAlignment = 256;

/// A kernel's failure as the runtime's Status.
inline Status toStatus(const kernels::KernelResult &r) {
  return r.isOk() ? Status::ok() : invalidArgument(r.message());
}

} // namespace cpu_device_detail

/// The CPU device (not final: tests derive from it to observe stream and
/// event use).
class CpuDevice : public Device {

public:
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string describe() const override {
    const std::string gemm =
        std::string("f32 GEMMs: ") + kernels::cpu::f32GemmName(kernels::cpu::f32Gemm());
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    return "cpu (" + std::to_string(threads) + (threads == 1 ? " thread, " : " threads, ") + gemm + ")";
#else
    return "cpu (" + gemm + ")";
#endif
  }

  StatusOr<void *> allocate(int64_t bytes) override {
    size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + cpu_device_detail::kAlignment - 1) /
                  cpu_device_detail::kAlignment * cpu_device_detail::kAlignment;
    void *p = std::aligned_alloc(cpu_device_detail::kAlignment, size);
    if (!p)
      return error(StatusCode::kInternal, "cannot allocate ", bytes, " bytes of host memory");
    std::memset(p, 0, size);
    return p;
  }
  void release(void *p) override { std::free(p); }
  Status copy(void *dst, const void *src, int64_t bytes, CopyKind) override {
    if (bytes > 0 && dst != src)
      std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status::ok();
  }
  Status copyOn(StreamKind, void *dst, const void *src, int64_t bytes) override {
    return copy(dst, src, bytes, CopyKind::DeviceToDevice);
  }
  Status zero(void *p, int64_t bytes) override {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  StatusOr<Event> record(StreamKind) override { return Event{0}; }
  Status wait(StreamKind, Event) override { return Status::ok(); }
  void *nativeStream(StreamKind) override { return nullptr; }

  const kernels::KernelTable &kernelTable() const override { return kernels::cpu::kernelTable(); }
  Status launch(kernels::KernelCall call) override {
    return cpu_device_detail::toStatus(kernels::cpu::kernelTable()[call.op].run(call));
  }
  std::string lowPrecisionMatmul(FloatType type) const override {
    std::string impl = kernels::cpu::lowPrecisionMatmulImplementation(type);
    return impl.empty() ? "" : "oneDNN " + impl;
  }
  Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                      int64_t n) override {
    kernels::cpu::convertFloat(in, from, out, to, n);
    return Status::ok();
  }
  Status attentionBlock(const float *q, const float *k, const float *v, const Shape &qShape,
                        int64_t kvHeads, int64_t keys, double scale, bool causal, float *acc,
                        float *rowMax, float *rowSum, const int32_t *firstKey) override {
    kernels::cpu::attentionBlock(q, k, v, qShape, kvHeads, keys, scale, causal, acc, rowMax,
                                 rowSum, firstKey);
    return Status::ok();
  }
  Status attentionBlockGrad(const float *q, const float *k, const float *v, const float *o,
                            const float *g, const float *lse, const Shape &qShape,
                            int64_t kvHeads, int64_t keys, double scale, bool causal, float *dq,
                            float *dk, float *dv, const int32_t *firstKey) override {
    kernels::cpu::attentionBlockGrad(q, k, v, o, g, lse, qShape, kvHeads, keys, scale, causal, dq,
                                     dk, dv, firstKey);
    return Status::ok();
  }
  Status rowMax(const float *logits, int64_t rows, int64_t classes, float *out) override {
    kernels::cpu::rowMax(logits, rows, classes, out);
    return Status::ok();
  }
  Status rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max,
                   float *out) override {
    kernels::cpu::rowSumExp(logits, rows, classes, max, out);
    return Status::ok();
  }
  Status targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                     int64_t offset, int64_t total, float *out) override {
    return cpu_device_detail::toStatus(kernels::cpu::targetLogit(logits, targets, rows, classes, offset, total, out));
  }
  Status lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                       float *loss) override {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      sum += std::log(static_cast<double>(sumExp[r])) + max[r] - target[r];
    *loss = static_cast<float>(sum / static_cast<double>(rows));
    return Status::ok();
  }
  Status vocabParallelGrad(const float *x, const int32_t *targets, const float *g,
                           const float *max, const float *sumExp, int64_t rows, int64_t classes,
                           int64_t offset, int64_t total, float *out) override {
    const float scale = *g / static_cast<float>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0 || targets[r] >= total)
        return invalidArgument("target ", targets[r], " at position ", r, " is outside [0, ",
                               total, ")");
      float inv = scale / sumExp[r];
      for (int64_t c = 0; c < classes; ++c)
        out[r * classes + c] = std::exp(x[r * classes + c] - max[r]) * inv;
      int64_t local = static_cast<int64_t>(targets[r]) - offset;
      if (local >= 0 && local < classes)
        out[r * classes + local] -= scale;
    }
    return Status::ok();
  }
  Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
                 const Shape &dstShape, const Shape &dstOffsets, const Shape &box,
                 int64_t elemBytes) override {
    kernels::cpu::copyBox(src, srcShape, srcOffsets, dst, dstShape, dstOffsets, box, elemBytes);
    return Status::ok();
  }
  Status adamwUpdate(const float *param, const float *grad, const float *m, const float *v,
                     const float *step, const AdamWParams &hp, int64_t n, const float *skip,
                     float *outParam, float *outM, float *outV) override {
    if (skip && *skip != 0.0f) {
      copyUnlessSame(param, outParam, n);
      copyUnlessSame(m, outM, n);
      copyUnlessSame(v, outV, n);
      return Status::ok();
    }
    kernels::cpu::adamwUpdate(param, grad, m, v, *step,
                   kernels::cpu::AdamW{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weightDecay}, n, outParam,
                   outM, outV);
    return Status::ok();
  }
  Status sgdUpdate(const float *param, const float *grad, const float *buf, float lr,
                   float momentum, float weightDecay, int64_t n, const float *skip,
                   float *outParam, float *outBuf) override {
    if (skip && *skip != 0.0f) {
      copyUnlessSame(param, outParam, n);
      copyUnlessSame(buf, outBuf, n);
      return Status::ok();
    }
    kernels::cpu::sgdUpdate(param, grad, buf, lr, momentum, weightDecay, n, outParam, outBuf);
    return Status::ok();
  }
  Status sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                      float *out) override {
    *out = static_cast<float>(kernels::cpu::sumOfSquares(grads, sizes));
    return Status::ok();
  }
  Status clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                    const std::vector<float *> &outs, float maxNorm, const float *sumSquares,
                    float *norm) override {
    *norm = kernels::cpu::clipByNorm(grads, sizes, outs, maxNorm, static_cast<double>(*sumSquares));
    return Status::ok();
  }
  Status anyNonfinite(const std::vector<const void *> &tensors, const std::vector<int64_t> &sizes,
                      const std::vector<FloatType> &types, float *found) override {
    *found = kernels::cpu::anyNonfinite(tensors, sizes, types) ? 1.0f : 0.0f;
    return Status::ok();
  }
  Status unscale(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                 const std::vector<float *> &outs, const float *scale, float *found) override {
    float inv = 1.0f / *scale;
    int bad = 0;
    for (size_t t = 0; t < grads.size(); ++t) {
      const float *g = grads[t];
      float *u = outs[t];
      int64_t count = sizes[t];
#pragma omp parallel for reduction(| : bad) if (count > 32768)
      for (int64_t i = 0; i < count; ++i) {
        bool finite = std::isfinite(g[i]);
        bad |= !finite;
        u[i] = finite ? g[i] * inv : 0.0f;
      }
    }
    *found = bad ? 1.0f : 0.0f;
    return Status::ok();
  }

private:
  static void copyUnlessSame(const float *from, float *to, int64_t n) {
    if (from != to)
      std::memcpy(to, from, static_cast<size_t>(n) * sizeof(float));
  }
};

} // namespace ptc

#endif // PTC_RUNTIME_DEVICE_CPU_DEVICE_H
