// CpuDevice: host memory and the kernels of kernels/cpu. Everything runs in
// order on the calling thread, so events are already complete when recorded.

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
namespace {
namespace k = kernels::cpu;

constexpr size_t kAlignment = 256;

k::FloatType toCpu(FloatType t) {
  return t == FloatType::BF16 ? k::FloatType::BF16
         : t == FloatType::F16 ? k::FloatType::F16
                               : k::FloatType::F32;
}

class CpuDevice final : public Device {
public:
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string describe() const override {
#ifdef _OPENMP
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
#else
    return "cpu";
#endif
  }

  StatusOr<void *> allocate(int64_t bytes) override {
    size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlignment - 1) /
                  kAlignment * kAlignment;
    void *p = std::aligned_alloc(kAlignment, size);
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

  Status binary(BinaryOp op, const float *a, const Shape &as, const float *b, const Shape &bs,
                float *out, const Shape &os) override {
    k::binary(static_cast<k::Binary>(static_cast<int>(op)), a, as, b, bs, out, os);
    return Status::ok();
  }
  Status broadcastTo(const float *in, const Shape &is, float *out, const Shape &os) override {
    k::broadcastTo(in, is, out, os);
    return Status::ok();
  }
  Status unary(UnaryOp op, const float *in, float *out, int64_t n, float factor) override {
    switch (op) {
    case UnaryOp::Scale:
      k::scale(in, out, n, factor);
      break;
    case UnaryOp::Gelu:
      k::gelu(in, out, n);
      break;
    case UnaryOp::Relu:
      k::relu(in, out, n);
      break;
    }
    return Status::ok();
  }
  Status unaryGrad(UnaryGradOp op, const float *x, const float *g, float *out,
                   int64_t n) override {
    if (op == UnaryGradOp::Gelu)
      k::geluGrad(x, g, out, n);
    else
      k::reluGrad(x, g, out, n);
    return Status::ok();
  }
  Status convertFloat(const void *in, FloatType from, void *out, FloatType to,
                      int64_t n) override {
    k::convertFloat(in, toCpu(from), out, toCpu(to), n);
    return Status::ok();
  }
  Status matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
                bool transA, bool transB) override {
    k::matmul(a, as, b, bs, out, transA, transB);
    return Status::ok();
  }
  Status layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
                   int64_t cols, float eps) override {
    k::layerNorm(x, w, b, out, rows, cols, eps);
    return Status::ok();
  }
  Status layerNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                       float *db, int64_t rows, int64_t cols, float eps) override {
    k::layerNormGrad(x, w, g, dx, dw, db, rows, cols, eps);
    return Status::ok();
  }
  Status softmax(const float *x, float *out, const Shape &shape, int64_t axis) override {
    k::softmax(x, out, shape, axis);
    return Status::ok();
  }
  Status softmaxGrad(const float *y, const float *g, float *out, const Shape &shape,
                     int64_t axis) override {
    k::softmaxGrad(y, g, out, shape, axis);
    return Status::ok();
  }
  Status causalAttention(const float *q, const float *kk, const float *v, float *out,
                         const Shape &shape, float scale) override {
    k::causalAttention(q, kk, v, out, shape, scale);
    return Status::ok();
  }
  Status causalAttentionGrad(const float *q, const float *kk, const float *v, const float *g,
                             float *dq, float *dk, float *dv, const Shape &shape,
                             float scale) override {
    k::causalAttentionGrad(q, kk, v, g, dq, dk, dv, shape, scale);
    return Status::ok();
  }
  Status embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                   int64_t count, float *out, int64_t rowOffset, int64_t totalRows) override {
    return k::embedding(table, rows, dim, ids, count, out, rowOffset, totalRows);
  }
  Status embeddingGrad(const int32_t *ids, int64_t count, const float *g, float *dtable,
                       int64_t rows, int64_t dim, int64_t rowOffset,
                       int64_t totalRows) override {
    return k::embeddingGrad(ids, count, g, dtable, rows, dim, rowOffset, totalRows);
  }
  Status crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                      float *loss) override {
    return k::crossEntropy(logits, targets, rows, classes, loss);
  }
  Status crossEntropyGrad(const float *logits, const int32_t *targets, const float *g,
                          int64_t rows, int64_t classes, float *out) override {
    return k::crossEntropyGrad(logits, targets, g, rows, classes, out);
  }
  Status rowMax(const float *logits, int64_t rows, int64_t classes, float *out) override {
    k::rowMax(logits, rows, classes, out);
    return Status::ok();
  }
  Status rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max,
                   float *out) override {
    k::rowSumExp(logits, rows, classes, max, out);
    return Status::ok();
  }
  Status targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                     int64_t offset, int64_t total, float *out) override {
    return k::targetLogit(logits, targets, rows, classes, offset, total, out);
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
  Status transpose(const void *in, const Shape &is, void *out, const Shape &perm,
                   int64_t elemBytes) override {
    k::transpose(in, is, out, perm, elemBytes);
    return Status::ok();
  }
  Status copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
                 const Shape &dstShape, const Shape &dstOffsets, const Shape &box,
                 int64_t elemBytes) override {
    k::copyBox(src, srcShape, srcOffsets, dst, dstShape, dstOffsets, box, elemBytes);
    return Status::ok();
  }
  Status pad(const float *in, const Shape &is, float *out, const Shape &os,
             const Shape &offsets) override {
    k::pad(in, is, out, os, offsets);
    return Status::ok();
  }
  Status concat(const std::vector<const void *> &ins, const std::vector<Shape> &shapes,
                void *out, int64_t axis, int64_t elemBytes) override {
    k::concat(ins, shapes, out, axis, elemBytes);
    return Status::ok();
  }
  Status reduce(ReduceOp op, const float *in, const Shape &is, const Shape &axes,
                float *out) override {
    k::reduce(static_cast<k::Reduce>(static_cast<int>(op)), in, is, axes, out);
    return Status::ok();
  }
  Status reduceMaxGrad(const float *in, const Shape &is, const Shape &axes, const float *g,
                       float *out) override {
    k::reduceMaxGrad(in, is, axes, g, out);
    return Status::ok();
  }
  Status topKGate(const float *logits, int64_t tokens, int64_t experts, int64_t kk,
                  bool normalize, float *weights, int32_t *indices) override {
    k::topKGate(logits, tokens, experts, kk, normalize, weights, indices);
    return Status::ok();
  }
  Status topKGateGrad(const float *logits, const int32_t *indices, const float *gw,
                      int64_t tokens, int64_t experts, int64_t kk, bool normalize,
                      float *out) override {
    return k::topKGateGrad(logits, indices, gw, tokens, experts, kk, normalize, out);
  }
  Status moeDispatch(const float *x, const int32_t *indices, int64_t tokens, int64_t kk,
                     int64_t dim, int64_t experts, int64_t capacity, float *out) override {
    return k::moeDispatch(x, indices, tokens, kk, dim, experts, capacity, out);
  }
  Status moeDispatchGrad(const float *g, const int32_t *indices, int64_t tokens, int64_t kk,
                         int64_t dim, int64_t experts, int64_t capacity, float *out) override {
    return k::moeDispatchGrad(g, indices, tokens, kk, dim, experts, capacity, out);
  }
  Status moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                    int64_t tokens, int64_t kk, int64_t dim, int64_t experts, int64_t capacity,
                    float *out) override {
    return k::moeCombine(expertOut, weights, indices, tokens, kk, dim, experts, capacity, out);
  }
  Status moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                        const float *g, int64_t tokens, int64_t kk, int64_t dim, int64_t experts,
                        int64_t capacity, float *dExpertOut, float *dWeights) override {
    return k::moeCombineGrad(expertOut, weights, indices, g, tokens, kk, dim, experts, capacity,
                             dExpertOut, dWeights);
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
    k::adamwUpdate(param, grad, m, v, *step,
                   k::AdamW{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weightDecay}, n, outParam,
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
    k::sgdUpdate(param, grad, buf, lr, momentum, weightDecay, n, outParam, outBuf);
    return Status::ok();
  }
  Status sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                      float *out) override {
    *out = static_cast<float>(k::sumOfSquares(grads, sizes));
    return Status::ok();
  }
  Status clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                    const std::vector<float *> &outs, float maxNorm, const float *sumSquares,
                    float *norm) override {
    *norm = k::clipByNorm(grads, sizes, outs, maxNorm, static_cast<double>(*sumSquares));
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
        bad |= !std::isfinite(g[i]);
        u[i] = g[i] * inv;
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
} // namespace

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
  if (this != &o) {
    if (data_)
      device_->release(data_);
    device_ = o.device_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_)
    device_->release(data_);
}

Status DeviceBuffer::reserve(int64_t bytes) {
  if (bytes <= capacity_)
    return Status::ok();
  if (data_)
    device_->release(data_);
  data_ = nullptr;
  capacity_ = 0;
  auto p = device_->allocate(bytes);
  if (!p.isOk())
    return p.status();
  data_ = *p;
  capacity_ = bytes;
  return Status::ok();
}

std::unique_ptr<Device> createCpuDevice() { return std::make_unique<CpuDevice>(); }

StatusOr<std::unique_ptr<Device>> createDevice(const std::string &name, int localRank) {
  if (name == "cpu")
    return createCpuDevice();
  if (name == "cuda" || (name == "auto" && cudaGpuAvailable())) {
    if (!cudaCompiledIn())
      return invalidArgument("--device cuda: this ptc-run was built without CUDA (nvcc was not "
                             "found at configure time)");
    return createCudaDevice(localRank);
  }
  if (name == "auto")
    return createCpuDevice();
  return invalidArgument("unknown device '", name, "' (expected cpu, cuda or auto)");
}

} // namespace ptc
