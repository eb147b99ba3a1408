// CUDA kernels: optimizer updates, norms, clipping, loss-scale unscaling (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Optimizer ---------------------------------------------------------------------
/// AdamW's per-step coefficients (bias corrections from the device step count,
/// in double as the CPU computes them) and one element's update, torch's order.
struct AdamWStep {
  float stepSize, bc2Sqrt, decay, b1, b2, eps;
  bool keep; // the loss-scaling skip flag: outputs get the inputs
};
__device__ AdamWStep adamwStep(const float *step, float lr, float b1, float b2, float eps,
                               float wd, const float *skip) {
  double t = static_cast<double>(*step);
  return {static_cast<float>(lr / (1.0 - pow(static_cast<double>(b1), t))),
          static_cast<float>(sqrt(1.0 - pow(static_cast<double>(b2), t))), 1.0f - lr * wd, b1,
          b2, eps, skip && *skip != 0.0f};
}
/// One element's update; `grad` f32, bf16 or f16 (`gradType`, widened as read);
/// `outCopy` (nullable): the new parameter rounded to `copyType` (its working copy).
__device__ void adamwElement(const AdamWStep &c, const float *param, const void *grad,
                             int gradType, const float *m, const float *v, float *outP,
                             float *outM, float *outV, void *outCopy, int copyType, int64_t i) {
  float p;
  if (c.keep) {
    p = param[i];
    outM[i] = m[i];
    outV[i] = v[i];
  } else {
    float g = loadFloat(grad, gradType, i);
    float mi = m[i] + (g - m[i]) * (1.0f - c.b1);
    float vi = v[i] * c.b2 + (1.0f - c.b2) * g * g;
    float denom = sqrtf(vi) / c.bc2Sqrt + c.eps;
    p = param[i] * c.decay - c.stepSize * mi / denom;
    outM[i] = mi;
    outV[i] = vi;
  }
  outP[i] = p;
  if (outCopy)
    storeFloat(outCopy, copyType, i, p);
}

__global__ void adamwKernel(const float *param, const void *grad, int gradType, const float *m,
                            const float *v, const float *step, int64_t n, float lr, float b1,
                            float b2, float eps, float wd, const float *skip, float *outP,
                            float *outM, float *outV, void *outCopy, int copyType) {
  AdamWStep c = adamwStep(step, lr, b1, b2, eps, wd, skip);
  PTC_GRID_LOOP(i, n)
  adamwElement(c, param, grad, gradType, m, v, outP, outM, outV, outCopy, copyType, i);
}

// ---- Multi-tensor launches: a descriptor table over the concatenated tensors ----------
/// The last entry of `table` (`count` of them, `Key` ascending from 0) whose
/// key is at most `value`.
template <typename Entry, int64_t Entry::*Key>
__device__ int findEntry(const Entry *table, int count, int64_t value) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].*Key <= value)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}
/// The entry holding element e of the concatenated tensors (`offset`: prefix
/// sums), for one thread's grid-stride elements (increasing): a binary search
/// for its first element, then steps forward.
template <typename Entry> struct TableCursor {
  const Entry *table;
  int count, at = -1;
  __device__ const Entry &operator()(int64_t e) {
    if (at < 0)
      at = findEntry<Entry, &Entry::offset>(table, count, e);
    while (at + 1 < count && table[at + 1].offset <= e)
      ++at;
    return table[at];
  }
};

/// One thread per element of the concatenated tensors.
__global__ void adamwManyKernel(const AdamWTensor *table, int count, int64_t total,
                                const float *step, float lr, float b1, float b2, float eps,
                                float wd, const float *skip) {
  AdamWStep c = adamwStep(step, lr, b1, b2, eps, wd, skip);
  TableCursor<AdamWTensor> at{table, count};
  PTC_GRID_LOOP(e, total) {
    const AdamWTensor &x = at(e);
    adamwElement(c, x.param, x.grad, static_cast<int>(x.gradType), x.m, x.v, x.outParam, x.outM,
                 x.outV, x.outCopy, static_cast<int>(x.copyType), e - x.offset);
  }
}

/// One element's SGD update (torch's order); `keep`: the skip flag's.
__device__ void sgdElement(bool keep, const float *param, const void *grad, int gradType,
                           const float *buf, float lr, float momentum, float wd, float *outP,
                           float *outB, void *outCopy, int copyType, int64_t i) {
  float p;
  if (keep) {
    p = param[i];
    outB[i] = buf[i];
  } else {
    float g = loadFloat(grad, gradType, i) + wd * param[i];
    float b = momentum * buf[i] + g;
    outB[i] = b;
    p = param[i] - lr * b;
  }
  outP[i] = p;
  if (outCopy)
    storeFloat(outCopy, copyType, i, p);
}

__global__ void sgdKernel(const float *param, const void *grad, int gradType, const float *buf,
                          float lr, float momentum, float wd, int64_t n, const float *skip,
                          float *outP, float *outB, void *outCopy, int copyType) {
  const bool keep = skip && *skip != 0.0f;
  PTC_GRID_LOOP(i, n)
  sgdElement(keep, param, grad, gradType, buf, lr, momentum, wd, outP, outB, outCopy, copyType, i);
}

__global__ void sgdManyKernel(const SgdTensor *table, int count, int64_t total, float lr,
                              float momentum, float wd, const float *skip) {
  const bool keep = skip && *skip != 0.0f;
  TableCursor<SgdTensor> at{table, count};
  PTC_GRID_LOOP(e, total) {
    const SgdTensor &x = at(e);
    sgdElement(keep, x.param, x.grad, static_cast<int>(x.gradType), x.buf, lr, momentum, wd,
               x.outParam, x.outBuf, x.outCopy, static_cast<int>(x.copyType), e - x.offset);
  }
}

/// Each block's sum of squares of its share of one tensor (block b of the
/// tensor's `blocks`: elements b * 256 + thread, stepping by blocks * 256),
/// into partial[blockIdx.x]; orderedSumKernel adds the partials in order. The
/// table depends only on the sizes, so the sum is the same on every run.
__global__ void sumSquaresManyKernel(const SquaresSpan *table, int count, float *partial) {
  const SquaresSpan &x = table[findEntry<SquaresSpan, &SquaresSpan::first>(table, count,
                                                                           blockIdx.x)];
  const int64_t stride = x.blocks * blockDim.x;
  float s = 0.0f;
  for (int64_t i = (blockIdx.x - x.first) * blockDim.x + threadIdx.x; i < x.n; i += stride)
    s += x.x[i] * x.x[i];
  s = blockSum(s);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = s;
}
/// Blocks of a tensor's sum of squares.
int64_t sumSquaresBlocks(int64_t n) { return std::min<unsigned>(gridFor(n), 1024u); }

__global__ void clipManyKernel(const TensorSpan *table, int count, int64_t total, float maxNorm,
                               const float *sumSquares) {
  const float coef = fminf(1.0f, maxNorm / (sqrtf(*sumSquares) + 1e-6f));
  TableCursor<TensorSpan> at{table, count};
  PTC_GRID_LOOP(e, total) {
    const TensorSpan &x = at(e);
    const int64_t i = e - x.offset;
    x.out[i] = static_cast<const float *>(x.in)[i] * coef;
  }
}

__global__ void normKernel(const float *sumSquares, float *norm) { *norm = sqrtf(*sumSquares); }

__global__ void unscaleManyKernel(const TensorSpan *table, int count, int64_t total,
                                  const float *scale, float *found) {
  const float inv = 1.0f / *scale;
  bool bad = false;
  TableCursor<TensorSpan> at{table, count};
  PTC_GRID_LOOP(e, total) {
    const TensorSpan &x = at(e);
    const int64_t i = e - x.offset;
    const float g = static_cast<const float *>(x.in)[i];
    const bool finite = isfinite(g);
    bad |= !finite;
    x.out[i] = finite ? g * inv : 0.0f;
  }
  if (bad)
    *found = 1.0f;
}

/// Infinite or NaN: every exponent bit set in the stored bits (f32, bf16, f16).
__global__ void anyNonfiniteManyKernel(const TensorSpan *table, int count, int64_t total,
                                       float *found) {
  bool bad = false;
  TableCursor<TensorSpan> at{table, count};
  PTC_GRID_LOOP(e, total) {
    const TensorSpan &x = at(e);
    const int64_t i = e - x.offset;
    if (x.type == static_cast<int64_t>(FloatType::F32)) {
      const uint32_t bits = static_cast<const uint32_t *>(x.in)[i];
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint16_t mask = x.type == static_cast<int64_t>(FloatType::BF16) ? 0x7f80u : 0x7c00u;
      bad |= (static_cast<const uint16_t *>(x.in)[i] & mask) == mask;
    }
  }
  if (bad)
    *found = 1.0f; // every writer writes the same value: the result is deterministic
}

} // namespace

void adamwUpdate(const float *param, const void *grad, FloatType gradType, const float *m,
                 const float *v, const float *step, const AdamW &hp, int64_t n, const float *skip,
                 float *outParam, float *outM, float *outV, void *outCopy, FloatType copyType,
                 void *stream) {
  adamwKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(
      param, grad, static_cast<int>(gradType), m, v, step, n, hp.lr, hp.beta1, hp.beta2, hp.eps,
      hp.weightDecay, skip, outParam, outM, outV, outCopy, static_cast<int>(copyType));
}

void adamwUpdateMany(const AdamWTensor *table, int count, int64_t total, const float *step,
                     const AdamW &hp, const float *skip, void *stream) {
  if (total > 0)
    adamwManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(
        table, count, total, step, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weightDecay, skip);
}

void sgdUpdate(const float *param, const void *grad, FloatType gradType, const float *buf,
               float lr, float momentum, float weightDecay, int64_t n, const float *skip,
               float *outParam, float *outBuf, void *outCopy, FloatType copyType, void *stream) {
  sgdKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(
      param, grad, static_cast<int>(gradType), buf, lr, momentum, weightDecay, n, skip, outParam,
      outBuf, outCopy, static_cast<int>(copyType));
}

void sgdUpdateMany(const SgdTensor *table, int count, int64_t total, float lr, float momentum,
                   float weightDecay, const float *skip, void *stream) {
  if (total > 0)
    sgdManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(table, count, total, lr, momentum,
                                                              weightDecay, skip);
}

std::vector<SquaresSpan> squaresTable(const std::vector<const float *> &grads,
                                      const std::vector<int64_t> &sizes, int64_t &partials) {
  std::vector<SquaresSpan> table;
  partials = 0;
  for (size_t t = 0; t < grads.size(); ++t)
    if (sizes[t] > 0) {
      const int64_t blocks = sumSquaresBlocks(sizes[t]);
      table.push_back({grads[t], sizes[t], blocks, partials});
      partials += blocks;
    }
  return table;
}

void sumOfSquares(const SquaresSpan *table, int count, int64_t partialCount, float *out,
                  float *partials, void *stream) {
  if (partialCount == 0) {
    cudaMemsetAsync(out, 0, sizeof(float), S(stream));
    return;
  }
  sumSquaresManyKernel<<<static_cast<unsigned>(partialCount), kThreads, 0, S(stream)>>>(
      table, count, partials);
  orderedSumKernel<<<1, 1024, 0, S(stream)>>>(partials, partialCount, 1.0f, out);
}

void clipByNorm(const TensorSpan *table, int count, int64_t total, float maxNorm,
                const float *sumSquares, float *norm, void *stream) {
  if (total > 0)
    clipManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(table, count, total, maxNorm,
                                                               sumSquares);
  // After every scale (norm may be the sum-of-squares scalar itself).
  normKernel<<<1, 1, 0, S(stream)>>>(sumSquares, norm);
}

void unscale(const TensorSpan *table, int count, int64_t total, const float *scale,
             float *found, void *stream) {
  // `found` may alias nothing read here; cleared first, set by any block that sees inf / nan.
  cudaMemsetAsync(found, 0, sizeof(float), S(stream));
  if (total > 0)
    unscaleManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(table, count, total, scale,
                                                                  found);
}

void anyNonfinite(const TensorSpan *table, int count, int64_t total, float *found, void *stream) {
  cudaMemsetAsync(found, 0, sizeof(float), S(stream));
  if (total > 0)
    anyNonfiniteManyKernel<<<gridFor(total), kThreads, 0, S(stream)>>>(table, count, total,
                                                                       found);
}

namespace {
AdamW adamwOf(const KernelCall &c) {
  auto f = [&](const FloatAttr &a) { return static_cast<float>(c.attr(a)); };
  return AdamW{f(attr::AdamWUpdate::lr), f(attr::AdamWUpdate::beta1), f(attr::AdamWUpdate::beta2),
               f(attr::AdamWUpdate::eps), f(attr::AdamWUpdate::weight_decay)};
}
/// The update's skip flag (dynamic loss scaling), or null.
const float *skipOf(const KernelCall &c) {
  const UpdateInputs layout = updateInputs(c);
  return layout.skip >= 0 ? c.input(static_cast<size_t>(layout.skip)).f32() : nullptr;
}
/// An update call (AdamW's state: 3 outputs, SGD's: 2): f32 but for the
/// gradient, which may be bf16 or f16 (widened as read), and the working copy
/// after the state (bf16 or f16).
bool updateTypes(const KernelCall &c, size_t state) {
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.in[i].dtype != DType::F32 && !(i == 1 && isLowPrecision(c.in[i].dtype)))
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.out[i].dtype != DType::F32 && !(i == state && isLowPrecision(c.out[i].dtype)))
      return false;
  return true;
}
bool adamwTypes(const KernelCall &c) { return updateTypes(c, 3); }
/// The call's working copy (output `at`), or null, and its type.
void *copyOf(const KernelCall &c, size_t at) {
  return c.numOutputs > at ? c.output(at).data : nullptr;
}
FloatType copyTypeOf(const KernelCall &c, size_t at) {
  return c.numOutputs > at ? floatTypeOf(c.output(at).dtype) : FloatType::F32;
}

/// The call's first `n` inputs (and their outputs, where it has them) as a
/// multi-tensor table, empty tensors left out; `total`: their elements.
std::vector<TensorSpan> spanTable(const KernelCall &c, size_t n, int64_t &total) {
  std::vector<TensorSpan> table;
  total = 0;
  for (size_t i = 0; i < n; ++i) {
    const TensorView &in = c.input(i);
    if (in.elements <= 0)
      continue;
    table.push_back({in.data, c.numOutputs > n ? c.output(i).f32() : nullptr, in.elements, total,
                     static_cast<int64_t>(floatTypeOf(in.dtype))});
    total += in.elements;
  }
  return table;
}
/// A table's device copy (uploaded once per distinct content), or null.
template <typename Entry>
const Entry *uploadTable(const KernelCall &c, const std::vector<Entry> &table) {
  const LaunchContext &ctx = context(c);
  return static_cast<const Entry *>(ctx.constants(
      ctx.owner, table.data(), static_cast<int64_t>(table.size() * sizeof(Entry))));
}
template <typename Entry>
KernelResult tableFailure(const KernelCall &c, const std::vector<Entry> &table) {
  return KernelResult::error("cannot upload the ", table.size() * sizeof(Entry),
                             " bytes of a multi-tensor ", opKindName(c.op), "'s descriptors");
}
/// A group of updates as one launch: `entry(call, offset)` describes each
/// call's tensors (elements before it: `offset`), the table goes to the
/// device once, `launch(table, count, total)` runs them.
template <typename Entry, typename Describe, typename Launch>
KernelResult runUpdateGroup(const KernelCall *calls, size_t count, Describe entry,
                            Launch launch) {
  std::vector<Entry> table;
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    table.push_back(entry(calls[i], total));
    total += calls[i].input(0).elements;
  }
  const Entry *device = uploadTable(calls[0], table);
  if (!device)
    return tableFailure(calls[0], table);
  launch(device, static_cast<int>(count), total);
  return KernelResult::ok();
}
} // namespace

void addOptimizerKernels(KernelTable &t) {
  t.add(
      OpKind::AdamWUpdate,
      [](const KernelCall &c) {
        adamwUpdate(c.input(0).f32(), c.input(1).data, floatTypeOf(c.input(1).dtype),
                    c.input(2).f32(), c.input(3).f32(), c.input(4).f32(), adamwOf(c),
                    c.input(0).elements, skipOf(c), c.output(0).f32(), c.output(1).f32(),
                    c.output(2).f32(), copyOf(c, 3), copyTypeOf(c, 3), streamOf(c));
        return KernelResult::ok();
      },
      adamwTypes);
  // One launch for a parameter group: its descriptors uploaded once (the
  // same every step) through the device's constant cache.
  t.addBatch(
      OpKind::AdamWUpdate,
      [](const KernelCall *calls, size_t count) {
        const KernelCall &head = calls[0];
        return runUpdateGroup<AdamWTensor>(
            calls, count,
            [](const KernelCall &c, int64_t offset) {
              return AdamWTensor{c.input(0).f32(), c.input(1).data, c.input(2).f32(),
                                 c.input(3).f32(), c.output(0).f32(), c.output(1).f32(),
                                 c.output(2).f32(), c.input(0).elements, offset,
                                 static_cast<int64_t>(floatTypeOf(c.input(1).dtype)),
                                 copyOf(c, 3), static_cast<int64_t>(copyTypeOf(c, 3))};
            },
            [&](const AdamWTensor *table, int n, int64_t total) {
              adamwUpdateMany(table, n, total, head.input(4).f32(), adamwOf(head), skipOf(head),
                              streamOf(head));
            });
      },
      adamwTypes);
  t.add(
      OpKind::SgdUpdate,
      [](const KernelCall &c) {
        sgdUpdate(c.input(0).f32(), c.input(1).data, floatTypeOf(c.input(1).dtype),
                  c.input(2).f32(), static_cast<float>(c.attr(attr::SgdUpdate::lr)),
                  static_cast<float>(c.attr(attr::SgdUpdate::momentum)),
                  static_cast<float>(c.attr(attr::SgdUpdate::weight_decay)), c.input(0).elements,
                  skipOf(c), c.output(0).f32(), c.output(1).f32(), copyOf(c, 2),
                  copyTypeOf(c, 2), streamOf(c));
        return KernelResult::ok();
      },
      [](const KernelCall &c) { return updateTypes(c, 2); });
  t.addBatch(
      OpKind::SgdUpdate,
      [](const KernelCall *calls, size_t count) {
        const KernelCall &head = calls[0];
        return runUpdateGroup<SgdTensor>(
            calls, count,
            [](const KernelCall &c, int64_t offset) {
              return SgdTensor{c.input(0).f32(), c.input(1).data, c.input(2).f32(),
                               c.output(0).f32(), c.output(1).f32(), c.input(0).elements, offset,
                               static_cast<int64_t>(floatTypeOf(c.input(1).dtype)), copyOf(c, 2),
                               static_cast<int64_t>(copyTypeOf(c, 2))};
            },
            [&](const SgdTensor *table, int n, int64_t total) {
              sgdUpdateMany(table, n, total, static_cast<float>(head.attr(attr::SgdUpdate::lr)),
                            static_cast<float>(head.attr(attr::SgdUpdate::momentum)),
                            static_cast<float>(head.attr(attr::SgdUpdate::weight_decay)),
                            skipOf(head), streamOf(head));
            });
      },
      [](const KernelCall &c) { return updateTypes(c, 2); });
  t.add(OpKind::SumOfSquares, [](const KernelCall &c) {
    int64_t partials = 0;
    const std::vector<SquaresSpan> table = squaresTable(
        viewPointers<const float *>(c.in, c.numInputs), viewSizes(c.in, c.numInputs), partials);
    const int64_t bytes = std::max<int64_t>(partials, 1) * 4;
    auto *partial = static_cast<float *>(scratch(c, bytes));
    if (!partial)
      return scratchFailure(c, bytes);
    const SquaresSpan *device = table.empty() ? nullptr : uploadTable(c, table);
    if (!table.empty() && !device)
      return tableFailure(c, table);
    sumOfSquares(device, static_cast<int>(table.size()), partials, c.output(0).f32(), partial,
                 streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::ClipByNorm, [](const KernelCall &c) {
    const size_t n = c.numInputs - 1;
    int64_t total = 0;
    const std::vector<TensorSpan> table = spanTable(c, n, total);
    const TensorSpan *device = total ? uploadTable(c, table) : nullptr;
    if (total && !device)
      return tableFailure(c, table);
    clipByNorm(device, static_cast<int>(table.size()), total,
               static_cast<float>(c.attr(attr::ClipByNorm::max_norm)), c.input(n).f32(),
               c.output(n).f32(), streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::UnscaleGrads, [](const KernelCall &c) {
    const size_t n = c.numInputs - 1;
    int64_t total = 0;
    const std::vector<TensorSpan> table = spanTable(c, n, total);
    const TensorSpan *device = total ? uploadTable(c, table) : nullptr;
    if (total && !device)
      return tableFailure(c, table);
    unscale(device, static_cast<int>(table.size()), total, c.input(n).f32(), c.output(n).f32(),
            streamOf(c));
    return KernelResult::ok();
  });
  t.add(
      OpKind::AnyNonfinite,
      [](const KernelCall &c) {
        int64_t total = 0;
        const std::vector<TensorSpan> table = spanTable(c, c.numInputs, total);
        const TensorSpan *device = total ? uploadTable(c, table) : nullptr;
        if (total && !device)
          return tableFailure(c, table);
        anyNonfinite(device, static_cast<int>(table.size()), total, c.output(0).f32(),
                     streamOf(c));
        return KernelResult::ok();
      },
      anyTypes);
}

} // namespace ptc::kernels::cuda
