// CUDA kernels: elementwise arithmetic, broadcasts, activations, float conversions (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Elementwise ---------------------------------------------------------------
struct BroadcastShape {
  int rank;
  int64_t out[kMaxRank], aStride[kMaxRank], bStride[kMaxRank];
};

/// out = op(a, b) with broadcasting: every dimension's index recovered from i.
template <typename T, typename Op>
__global__ void binaryKernel(const T *a, const T *b, T *out, int64_t n, BroadcastShape s, Op op) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, ai = 0, bi = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      int64_t c = rest % s.out[d];
      rest /= s.out[d];
      ai += c * s.aStride[d];
      bi += c * s.bStride[d];
    }
    out[i] = fromFloat<T>(op(toFloat(a[ai]), toFloat(b[bi])));
  }
}

/// The common cases without index arithmetic: a has the result's shape and b
/// either too (bPeriod == n) or repeats along the leading dimensions (a bias:
/// b[i % bPeriod]).
template <typename T, typename Op>
__global__ void binaryFlatKernel(const T *a, const T *b, T *out, int64_t n, int64_t bPeriod,
                                 Op op) {
  if (bPeriod == n) {
    PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(op(toFloat(a[i]), toFloat(b[i]))); }
  } else {
    PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(op(toFloat(a[i]), toFloat(b[i % bPeriod]))); }
  }
}

struct AddOp { __device__ float operator()(float x, float y) const { return x + y; } };
struct SubOp { __device__ float operator()(float x, float y) const { return x - y; } };
struct MulOp { __device__ float operator()(float x, float y) const { return x * y; } };
struct DivOp { __device__ float operator()(float x, float y) const { return x / y; } };
struct FirstOp { __device__ float operator()(float x, float) const { return x; } };

BroadcastShape broadcastShape(const Shape &as, const Shape &bs, const Shape &os) {
  BroadcastShape s{};
  s.rank = static_cast<int>(os.size());
  auto strides = [&](const Shape &shape, int64_t *st) {
    int64_t acc = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
      int sd = d - (s.rank - static_cast<int>(shape.size()));
      int64_t size = sd >= 0 ? shape[static_cast<size_t>(sd)] : 1;
      st[d] = size == 1 ? 0 : acc;
      acc *= size;
    }
  };
  for (int d = 0; d < s.rank; ++d)
    s.out[d] = os[static_cast<size_t>(d)];
  strides(as, s.aStride);
  strides(bs, s.bStride);
  return s;
}

__device__ float normalCdf(float x) { return 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }

template <typename T> __global__ void scaleKernel(const T *in, T *out, int64_t n, float f) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(toFloat(in[i]) * f); }
}

/// Dropout: each element's mask from its global index (kernels/common/dropout.h).
template <typename T>
__global__ void dropoutKernel(const T *in, T *out, int64_t n, DropoutMask mask) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(toFloat(in[i]) * mask.factor(i)); }
}

// One case per entry of PTC_UNARY_FUNCTIONS (kernels/common/elementwise.h).
__device__ float activation(UnaryFunction fn, float x) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return x * normalCdf(x);
  case UnaryFunction::GeluTanh:
    return x / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
  case UnaryFunction::Tanh:
    return tanhf(x);
  case UnaryFunction::Relu:
    return x > 0.0f ? x : 0.0f;
  case UnaryFunction::Silu:
    return x / (1.0f + expf(-x));
  case UnaryFunction::Rsqrt:
    return rsqrtf(x);
  case UnaryFunction::Exp:
    return expf(x);
  case UnaryFunction::Log:
    return logf(x);
  case UnaryFunction::Sign:
    return static_cast<float>((x > 0.0f) - (x < 0.0f));
  }
  return 0.0f;
}

__device__ float activationGrad(UnaryFunction fn, float x, float g) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return g * (normalCdf(x) + x * 0.39894228040143268f * expf(-0.5f * x * x));
  case UnaryFunction::GeluTanh: {
    float s = 1.0f / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
    return g * (s + x * s * (1.0f - s) * 1.5957691216057308f * (1.0f + 0.134145f * x * x));
  }
  case UnaryFunction::Tanh: {
    float t = tanhf(x);
    return g * (1.0f - t * t);
  }
  case UnaryFunction::Relu:
    return x > 0.0f ? g : 0.0f;
  case UnaryFunction::Silu: {
    float s = 1.0f / (1.0f + expf(-x));
    return g * s * (1.0f + x * (1.0f - s));
  }
  case UnaryFunction::Rsqrt: {
    float r = rsqrtf(x);
    return -0.5f * g * r * r * r;
  }
  case UnaryFunction::Exp:
    return g * expf(x);
  case UnaryFunction::Log:
    return g / x;
  case UnaryFunction::Sign:
    return 0.0f;
  }
  return 0.0f;
}

template <typename T>
__global__ void unaryKernel(UnaryFunction fn, const T *in, T *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(activation(fn, toFloat(in[i]))); }
}

template <typename T>
__global__ void unaryGradKernel(UnaryFunction fn, const T *x, const T *g, T *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(activationGrad(fn, toFloat(x[i]), toFloat(g[i]))); }
}

// A gated activation f(gate) * up and its gradient (dgate = f'(gate) * g * up,
// dup = g * f(gate)), one pass each.
template <typename T>
__global__ void gatedKernel(UnaryFunction fn, const T *gate, const T *up, T *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<T>(activation(fn, toFloat(gate[i])) * toFloat(up[i])); }
}

template <typename T>
__global__ void gatedGradKernel(UnaryFunction fn, const T *gate, const T *up, const T *g,
                                T *dgate, T *dup, int64_t n) {
  PTC_GRID_LOOP(i, n) {
    const float x = toFloat(gate[i]), gv = toFloat(g[i]);
    dgate[i] = fromFloat<T>(activationGrad(fn, x, gv * toFloat(up[i])));
    dup[i] = fromFloat<T>(gv * activation(fn, x));
  }
}

template <typename From, typename To>
__global__ void convertKernel(const From *in, To *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = fromFloat<To>(toFloat(in[i])); }
}

/// Four elements moved as one aligned vector each way (16-byte f32 loads or
/// stores, 8-byte bf16 / f16 ones): conversions are memory-bound.
template <typename T> struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};
template <typename From, typename To>
__global__ void convertVec4Kernel(const Vec4<From> *in, Vec4<To> *out, int64_t n4) {
  PTC_GRID_LOOP(i, n4) {
    const Vec4<From> x = in[i];
    Vec4<To> y;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      y.v[j] = fromFloat<To>(toFloat(x.v[j]));
    out[i] = y;
  }
}

DType dtypeOf(FloatType t) {
  return t == FloatType::BF16 ? DType::BF16 : t == FloatType::F16 ? DType::F16 : DType::F32;
}

/// b's period when a has the result's shape and b equals the result's
/// trailing dimensions (leading ones of size 1 or missing): the flat kernel's
/// case; 0 otherwise.
int64_t flatPeriod(const Shape &as, const Shape &bs, const Shape &os) {
  if (as != os || bs.size() > os.size())
    return 0;
  const size_t lead = os.size() - bs.size();
  size_t first = 0; // b's first dimension that is not a leading 1
  while (first < bs.size() && bs[first] == 1 && os[lead + first] != 1)
    ++first;
  int64_t period = 1;
  for (size_t d = first; d < bs.size(); ++d) {
    if (bs[d] != os[lead + d])
      return 0;
    period *= bs[d];
  }
  return period;
}

} // namespace

template <typename T>
void binary(BinaryOp op, const T *a, const Shape &as, const T *b, const Shape &bs, T *out,
            const Shape &os, void *stream) {
  const int64_t n = product(os);
  if (n == 0)
    return;
  const unsigned grid = gridFor(n);
  const int64_t period = flatPeriod(as, bs, os);
  auto launch = [&](auto f) {
    if (period > 0)
      binaryFlatKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, period, f);
    else
      binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, broadcastShape(as, bs, os), f);
  };
  switch (op) {
  case BinaryOp::Add:
    launch(AddOp{});
    break;
  case BinaryOp::Sub:
    launch(SubOp{});
    break;
  case BinaryOp::Mul:
    launch(MulOp{});
    break;
  case BinaryOp::Div:
    launch(DivOp{});
    break;
  }
}

void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os, void *stream) {
  BroadcastShape s = broadcastShape(is, is, os);
  int64_t n = product(os);
  binaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, in, out, n, s, FirstOp{});
}

void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream) {
  if (n <= 0)
    return;
  withFloatType(dtypeOf(from), [&](auto f) {
    using From = decltype(f);
    withFloatType(dtypeOf(to), [&](auto t) {
      using To = decltype(t);
      const auto *src = static_cast<const From *>(in);
      auto *dst = static_cast<To *>(out);
      int64_t done = 0;
      if (reinterpret_cast<uintptr_t>(src) % sizeof(Vec4<From>) == 0 &&
          reinterpret_cast<uintptr_t>(dst) % sizeof(Vec4<To>) == 0 && n >= 4) {
        const int64_t n4 = n / 4;
        convertVec4Kernel<<<gridFor(n4), kThreads, 0, S(stream)>>>(
            reinterpret_cast<const Vec4<From> *>(src), reinterpret_cast<Vec4<To> *>(dst), n4);
        done = 4 * n4;
      }
      if (done < n)
        convertKernel<<<gridFor(n - done), kThreads, 0, S(stream)>>>(src + done, dst + done,
                                                                     n - done);
      return 0;
    });
    return 0;
  });
}

void addElementwiseKernels(KernelTable &t) {
  // The arithmetic entries take f32, bf16 and f16 natively (every view of a
  // call one type): f32 math in registers, each result rounded once, as the
  // runtime's widening gave.
  auto binaryEntry = [](const KernelCall &c) {
    static constexpr BinaryOp kOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
    const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
    if (KernelResult r = rankAtMost8(*out.shape, "an elementwise op"); !r.isOk())
      return r;
    const BinaryOp op = kOps[static_cast<int>(c.op) - static_cast<int>(OpKind::Add)];
    withFloatType(out.dtype, [&](auto tag) {
      using T = decltype(tag);
      binary(op, static_cast<const T *>(a.data), *a.shape, static_cast<const T *>(b.data),
             *b.shape, static_cast<T *>(out.data), *out.shape, streamOf(c));
      return 0;
    });
    return KernelResult::ok();
  };
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div})
    t.add(op, binaryEntry, oneFloatType);
  // out += in (a micro-batch's contribution to a sum).
  t.add(OpKind::MicrobatchSum, [](const KernelCall &c) {
    const TensorView &in = c.input(0), &out = c.output(0);
    if (KernelResult r = rankAtMost8(*out.shape, "a micro-batch sum"); !r.isOk())
      return r;
    binary(BinaryOp::Add, out.f32(), *out.shape, in.f32(), *in.shape, out.f32(), *out.shape,
           streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::Broadcast, [](const KernelCall &c) {
    const TensorView &in = c.input(0), &out = c.output(0);
    if (KernelResult r = rankAtMost8(*out.shape, "broadcast"); !r.isOk())
      return r;
    broadcastTo(in.f32(), *in.shape, out.f32(), *out.shape, streamOf(c));
    return KernelResult::ok();
  });
  t.add(
      OpKind::Scale,
      [](const KernelCall &c) {
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          scaleKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(inputAs<T>(c, 0),
                                                                     outputAs<T>(c, 0), n,
                                                                     static_cast<float>(c.attr(attr::Scale::factor)));
        });
      },
      oneFloatType);
  t.add(
      OpKind::Unary,
      [](const KernelCall &c) {
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          unaryKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(c.function, inputAs<T>(c, 0),
                                                                     outputAs<T>(c, 0), n);
        });
      },
      oneFloatType);
  t.add(
      OpKind::UnaryGrad,
      [](const KernelCall &c) {
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          unaryGradKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
              c.function, inputAs<T>(c, 0), inputAs<T>(c, 1), outputAs<T>(c, 0), n);
        });
      },
      oneFloatType);
  t.add(
      OpKind::GatedUnary,
      [](const KernelCall &c) {
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          gatedKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
              c.function, inputAs<T>(c, 0), inputAs<T>(c, 1), outputAs<T>(c, 0), n);
        });
      },
      oneFloatType);
  t.add(
      OpKind::GatedUnaryGrad,
      [](const KernelCall &c) {
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          gatedGradKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
              c.function, inputAs<T>(c, 0), inputAs<T>(c, 1), inputAs<T>(c, 2),
              outputAs<T>(c, 0), outputAs<T>(c, 1), n);
        });
      },
      oneFloatType);
  // Byte moves and conversions run on the stored types.
  t.add(
      OpKind::Reshape,
      [](const KernelCall &c) {
        // The memory planner makes a reshape a view of its operand's bytes:
        // then there is nothing to move (a copy onto itself still costs a
        // read and a write of the whole tensor).
        if (c.output(0).data == c.input(0).data)
          return KernelResult::ok();
        cudaError_t e = cudaMemcpyAsync(c.output(0).data, c.input(0).data,
                                        static_cast<size_t>(c.input(0).bytes()),
                                        cudaMemcpyDeviceToDevice, S(streamOf(c)));
        return e == cudaSuccess ? KernelResult::ok()
                                : KernelResult::error("copying: ", cudaGetErrorString(e));
      },
      anyTypes);
  t.add(
      OpKind::Dropout,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0);
        if (c.random && !c.random->training) {
          if (c.output(0).data == in.data || in.elements == 0)
            return KernelResult::ok();
          cudaError_t e = cudaMemcpyAsync(c.output(0).data, in.data, static_cast<size_t>(in.bytes()),
                                          cudaMemcpyDeviceToDevice, S(streamOf(c)));
          return e == cudaSuccess ? KernelResult::ok()
                                  : KernelResult::error("copying: ", cudaGetErrorString(e));
        }
        DropoutMask mask;
        if (!c.random || !dropoutMask(*in.shape, c.attr(attr::Dropout::stream),
                                      c.attr(attr::Dropout::layout), c.attr(attr::Dropout::p),
                                      c.meshCoords, c.meshSizes, *c.random, mask))
          return KernelResult::error("Dropout: no random context or integers that fit its input");
        return launchTyped(c, [&](auto tag, int64_t n) {
          using T = decltype(tag);
          dropoutKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(inputAs<T>(c, 0),
                                                                      outputAs<T>(c, 0), n, mask);
        });
      },
      oneFloatType);
  t.add(
      OpKind::Convert,
      [](const KernelCall &c) {
        convertFloat(c.input(0).data, floatTypeOf(c.input(0).dtype), c.output(0).data,
                     floatTypeOf(c.output(0).dtype), c.input(0).elements, streamOf(c));
        return KernelResult::ok();
      },
      anyTypes);
}
} // namespace ptc::kernels::cuda
