// CUDA kernels: mixture-of-experts routing, dispatch and combine (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Mixture of experts ----------------------------------------------------------
__device__ void softmaxStats(const float *x, int64_t n, float &max, float &sum) {
  max = -INFINITY;
  for (int64_t e = 0; e < n; ++e)
    max = fmaxf(max, x[e]);
  sum = 0.0f;
  for (int64_t e = 0; e < n; ++e)
    sum += expf(x[e] - max);
}

/// One thread per token: the k experts of largest p (+ bias) (lowest index on ties).
__global__ void topKGateKernel(const float *logits, const float *bias, int64_t tokens,
                               int64_t experts, int64_t k, bool normalize, float *weights,
                               int32_t *indices) {
  PTC_GRID_LOOP(t, tokens) {
    const float *x = logits + t * experts;
    float mx, sum;
    softmaxStats(x, experts, mx, sum);
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      float bestP = 0.0f, bestScore = 0.0f;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i)
          taken |= indices[t * k + i] == e;
        float p = expf(x[e] - mx) / sum;
        float score = bias ? p + bias[e] : p;
        if (!taken && (best < 0 || score > bestScore)) {
          best = e;
          bestP = p;
          bestScore = score;
        }
      }
      indices[t * k + j] = static_cast<int32_t>(best);
      weights[t * k + j] = bestP;
      total += bestP;
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j)
        weights[t * k + j] /= total;
  }
}

__global__ void topKGateGradKernel(const float *logits, const int32_t *indices, const float *gw,
                                   int64_t tokens, int64_t experts, int64_t k, bool normalize,
                                   float *out, ErrorRecord *err) {
  PTC_GRID_LOOP(t, tokens) {
    const float *x = logits + t * experts;
    const int32_t *idx = indices + t * k;
    const float *g = gw + t * k;
    bool ok = true;
    for (int64_t j = 0; j < k; ++j)
      if (idx[j] < 0 || idx[j] >= experts) {
        recordError(err, kBadExpert, idx[j], t * k + j, experts);
        ok = false;
      }
    if (!ok)
      continue;
    float mx, sum;
    softmaxStats(x, experts, mx, sum);
    auto p = [&](int64_t e) { return expf(x[e] - mx) / sum; };
    float chosen = 0.0f, c = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      chosen += p(idx[j]);
    if (normalize)
      for (int64_t j = 0; j < k; ++j)
        c += g[j] * p(idx[j]) / chosen;
    // dp_e is non-zero only on the chosen experts.
    auto dp = [&](int64_t e) {
      float d = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        if (idx[j] == e)
          d += normalize ? (g[j] - c) / chosen : g[j];
      return d;
    };
    float dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      bool first = true;
      for (int64_t i = 0; i < j; ++i)
        first &= idx[i] != idx[j];
      if (first)
        dot += p(idx[j]) * dp(idx[j]);
    }
    for (int64_t e = 0; e < experts; ++e)
      out[t * experts + e] = p(e) * (dp(e) - dot);
  }
}

/// One thread per (group, expert), scanning the group's assignments
/// choice-major (as the CPU): slot = group * capacity + s, or -1 when dropped.
__global__ void assignSlotsKernel(const int32_t *indices, int64_t groups, int64_t tokens,
                                  int64_t k, int64_t experts, int64_t capacity, int32_t *slots,
                                  ErrorRecord *err) {
  PTC_GRID_LOOP(ge, groups * experts) {
    int64_t g = ge / experts, e = ge % experts, used = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t i = (g * tokens + t) * k + j;
        int32_t x = indices[i];
        if (x == e)
          slots[i] = used < capacity ? static_cast<int32_t>(g * capacity + used++) : -1;
        else if (e == 0 && (x < 0 || x >= experts)) {
          recordError(err, kBadExpert, x, i, experts);
          slots[i] = -1;
        }
      }
  }
}

/// One thread per (group, expert): counts the group's assignments to it.
__global__ void expertLoadKernel(const int32_t *indices, int64_t groups, int64_t tokens,
                                 int64_t k, int64_t experts, float *out, ErrorRecord *err) {
  PTC_GRID_LOOP(ge, groups * experts) {
    int64_t g = ge / experts, e = ge % experts, count = 0;
    for (int64_t i = g * tokens * k; i < (g + 1) * tokens * k; ++i) {
      int32_t x = indices[i];
      count += x == e;
      if (e == 0 && (x < 0 || x >= experts))
        recordError(err, kBadExpert, x, i, experts);
    }
    out[ge] = static_cast<float>(count) / static_cast<float>(tokens * k);
  }
}

// The dispatch and combine kernels run on the stored type T (f32, bf16, f16):
// copies, or f32 sums and products rounded once, as the widened f32 kernels
// gave.
template <typename T>
__global__ void moeDispatchKernel(const T *x, const int32_t *indices, const int32_t *slots,
                                  int64_t n, int64_t k, int64_t dim, int64_t capacity, T *out) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t a = i / dim, c = i % dim;
    if (slots[a] >= 0)
      out[(indices[a] * capacity + slots[a]) * dim + c] = x[(a / k) * dim + c];
  }
}

template <typename T>
__global__ void moeGatherKernel(const T *src, const T *weights, const int32_t *indices,
                                const int32_t *slots, int64_t tokens, int64_t k, int64_t dim,
                                int64_t capacity, T *out) {
  PTC_GRID_LOOP(i, tokens * dim) {
    int64_t t = i / dim, c = i % dim;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t a = t * k + j;
      if (slots[a] >= 0)
        acc += (weights ? toFloat(weights[a]) : 1.0f) *
               toFloat(src[(indices[a] * capacity + slots[a]) * dim + c]);
    }
    out[i] = fromFloat<T>(acc);
  }
}

template <typename T>
__global__ void moeCombineGradKernel(const T *expertOut, const T *weights, const int32_t *indices,
                                     const int32_t *slots, const T *g, int64_t n, int64_t k,
                                     int64_t dim, int64_t capacity, T *dExpertOut, T *dWeights) {
  PTC_GRID_LOOP(a, n) {
    float dot = 0.0f;
    if (slots[a] >= 0) {
      int64_t off = (indices[a] * capacity + slots[a]) * dim;
      const T *gt = g + (a / k) * dim;
      const float w = toFloat(weights[a]);
      for (int64_t c = 0; c < dim; ++c) {
        const float gc = toFloat(gt[c]);
        dExpertOut[off + c] = fromFloat<T>(w * gc);
        dot += gc * toFloat(expertOut[off + c]);
      }
    }
    dWeights[a] = fromFloat<T>(dot);
  }
}

} // namespace

void topKGate(const float *logits, const float *bias, int64_t tokens, int64_t experts, int64_t k,
              bool normalize, float *weights, int32_t *indices, void *stream) {
  topKGateKernel<<<gridFor(tokens), kThreads, 0, S(stream)>>>(logits, bias, tokens, experts, k,
                                                              normalize, weights, indices);
}

void topKGateGrad(const float *logits, const int32_t *indices, const float *gw, int64_t tokens,
                  int64_t experts, int64_t k, bool normalize, float *out, ErrorRecord *err,
                  void *stream) {
  topKGateGradKernel<<<gridFor(tokens), kThreads, 0, S(stream)>>>(logits, indices, gw, tokens,
                                                                  experts, k, normalize, out, err);
}

void assignSlots(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                 int64_t experts, int64_t capacity, int32_t *slots, ErrorRecord *err,
                 void *stream) {
  assignSlotsKernel<<<gridFor(groups * experts), kThreads, 0, S(stream)>>>(
      indices, groups, tokens, k, experts, capacity, slots, err);
}

void expertLoad(const int32_t *indices, int64_t groups, int64_t tokens, int64_t k,
                int64_t experts, float *out, ErrorRecord *err, void *stream) {
  expertLoadKernel<<<gridFor(groups * experts), kThreads, 0, S(stream)>>>(indices, groups, tokens,
                                                                         k, experts, out, err);
}

namespace {
template <typename T>
void moeDispatch(const T *x, const int32_t *indices, const int32_t *slots, int64_t tokens,
                 int64_t k, int64_t dim, int64_t experts, int64_t capacity, T *out,
                 void *stream) {
  cudaMemsetAsync(out, 0, static_cast<size_t>(experts * capacity * dim) * sizeof(T), S(stream));
  moeDispatchKernel<<<gridFor(tokens * k * dim), kThreads, 0, S(stream)>>>(
      x, indices, slots, tokens * k, k, dim, capacity, out);
}

template <typename T>
void moeDispatchGrad(const T *g, const int32_t *indices, const int32_t *slots, int64_t tokens,
                     int64_t k, int64_t dim, int64_t capacity, T *out, void *stream) {
  moeGatherKernel<<<gridFor(tokens * dim), kThreads, 0, S(stream)>>>(
      g, static_cast<const T *>(nullptr), indices, slots, tokens, k, dim, capacity, out);
}

template <typename T>
void moeCombine(const T *expertOut, const T *weights, const int32_t *indices,
                const int32_t *slots, int64_t tokens, int64_t k, int64_t dim, int64_t capacity,
                T *out, void *stream) {
  moeGatherKernel<<<gridFor(tokens * dim), kThreads, 0, S(stream)>>>(
      expertOut, weights, indices, slots, tokens, k, dim, capacity, out);
}

template <typename T>
void moeCombineGrad(const T *expertOut, const T *weights, const int32_t *indices,
                    const int32_t *slots, const T *g, int64_t tokens, int64_t k, int64_t dim,
                    int64_t experts, int64_t capacity, T *dExpertOut, T *dWeights,
                    void *stream) {
  cudaMemsetAsync(dExpertOut, 0, static_cast<size_t>(experts * capacity * dim) * sizeof(T),
                  S(stream));
  moeCombineGradKernel<<<gridFor(tokens * k), kThreads, 0, S(stream)>>>(
      expertOut, weights, indices, slots, g, tokens * k, k, dim, capacity, dExpertOut, dWeights);
}

/// A dispatch / combine call's float views of one type (f32, bf16 or f16),
/// the indices (input `ids`) i32.
bool moeTypes(const KernelCall &c, size_t ids) {
  const DType t = c.input(0).dtype;
  if (t != DType::F32 && !isLowPrecision(t))
    return false;
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.input(i).dtype != (i == ids ? DType::I32 : t))
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.output(i).dtype != t)
      return false;
  return true;
}
} // namespace

namespace {
/// Every assignment's slot in its expert's rows (scratch), or null.
const int32_t *slotsFor(const KernelCall &c, const int32_t *indices, const MoeRouting &m) {
  auto *slots = static_cast<int32_t *>(scratch(c, m.groups * m.tokens * m.k * 4));
  if (slots)
    assignSlots(indices, m.groups, m.tokens, m.k, m.experts, m.capacity, slots, context(c).err,
                streamOf(c));
  return slots;
}
} // namespace

// The CUDA kernels index expert buffers by (expert, slot) with slot =
// group * capacity + s: their "capacity" is the row stride groups * capacity.
void addMoeKernels(KernelTable &t) {
  t.add(OpKind::TopKGate, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    const float *bias = c.numInputs > 1 ? c.input(1).f32() : nullptr;
    topKGate(logits.f32(), bias, logits.rows(), logits.dim(-1), c.attr(attr::TopKGate::k),
             c.attr(attr::TopKGate::normalize) != 0,
             c.output(0).f32(), c.output(1).i32(), streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::TopKGateGrad, [](const KernelCall &c) {
    const TensorView &logits = c.input(0), &indices = c.input(1);
    topKGateGrad(logits.f32(), indices.i32(), c.input(2).f32(), logits.rows(), logits.dim(-1),
                 indices.dim(-1), c.attr(attr::TopKGateGrad::normalize) != 0, c.output(0).f32(), context(c).err,
                 streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::ExpertLoad, [](const KernelCall &c) {
    const TensorView &indices = c.input(0);
    expertLoad(indices.i32(), indices.rank() == 3 ? indices.dim(0) : 1, indices.dim(-2),
               indices.dim(-1), c.output(0).dim(-1), c.output(0).f32(), context(c).err,
               streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::MoeDispatch, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(1), c.output(0));
    const int32_t *slots = slotsFor(c, c.input(1).i32(), m);
    if (!slots)
      return scratchFailure(c, m.groups * m.tokens * m.k * 4);
    withFloatType(c.input(0).dtype, [&](auto tag) {
      using T = decltype(tag);
      moeDispatch(inputAs<T>(c, 0), c.input(1).i32(), slots, m.groups * m.tokens, m.k, m.dim,
                  m.experts, m.groups * m.capacity, outputAs<T>(c, 0), streamOf(c));
      return 0;
    });
    return KernelResult::ok();
  }, [](const KernelCall &c) { return moeTypes(c, 1); });
  t.add(OpKind::MoeDispatchGrad, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(1), c.input(0));
    const int32_t *slots = slotsFor(c, c.input(1).i32(), m);
    if (!slots)
      return scratchFailure(c, m.groups * m.tokens * m.k * 4);
    withFloatType(c.input(0).dtype, [&](auto tag) {
      using T = decltype(tag);
      moeDispatchGrad(inputAs<T>(c, 0), c.input(1).i32(), slots, m.groups * m.tokens, m.k, m.dim,
                      m.groups * m.capacity, outputAs<T>(c, 0), streamOf(c));
      return 0;
    });
    return KernelResult::ok();
  }, [](const KernelCall &c) { return moeTypes(c, 1); });
  t.add(OpKind::MoeCombine, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(2), c.input(0));
    const int32_t *slots = slotsFor(c, c.input(2).i32(), m);
    if (!slots)
      return scratchFailure(c, m.groups * m.tokens * m.k * 4);
    withFloatType(c.input(0).dtype, [&](auto tag) {
      using T = decltype(tag);
      moeCombine(inputAs<T>(c, 0), inputAs<T>(c, 1), c.input(2).i32(), slots,
                 m.groups * m.tokens, m.k, m.dim, m.groups * m.capacity, outputAs<T>(c, 0),
                 streamOf(c));
      return 0;
    });
    return KernelResult::ok();
  }, [](const KernelCall &c) { return moeTypes(c, 2); });
  t.add(OpKind::MoeCombineGrad, [](const KernelCall &c) {
    MoeRouting m = moeRouting(c.input(2), c.input(0));
    const int32_t *slots = slotsFor(c, c.input(2).i32(), m);
    if (!slots)
      return scratchFailure(c, m.groups * m.tokens * m.k * 4);
    withFloatType(c.input(0).dtype, [&](auto tag) {
      using T = decltype(tag);
      moeCombineGrad(inputAs<T>(c, 0), inputAs<T>(c, 1), c.input(2).i32(), slots,
                     inputAs<T>(c, 3), m.groups * m.tokens, m.k, m.dim, m.experts,
                     m.groups * m.capacity, outputAs<T>(c, 0), outputAs<T>(c, 1), streamOf(c));
      return 0;
    });
    return KernelResult::ok();
  }, [](const KernelCall &c) { return moeTypes(c, 2); });
}
} // namespace ptc::kernels::cuda
