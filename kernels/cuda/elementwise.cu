// CUDA kernels: elementwise arithmetic, broadcasts, activations, float conversions (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Elementwise ---------------------------------------------------------------
struct BroadcastShape {
  int rank;
  int64_t out[kMaxRank], aStride[kMaxRank], bStride[kMaxRank];
};

template <typename Op>
__global__ void binaryKernel(const float *a, const float *b, float *out, int64_t n,
                             BroadcastShape s, Op op) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, ai = 0, bi = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      int64_t c = rest % s.out[d];
      rest /= s.out[d];
      ai += c * s.aStride[d];
      bi += c * s.bStride[d];
    }
    out[i] = op(a[ai], b[bi]);
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

__global__ void scaleKernel(const float *in, float *out, int64_t n, float f) {
  PTC_GRID_LOOP(i, n) { out[i] = in[i] * f; }
}

// One case per entry of PTC_UNARY_FUNCTIONS (kernels/common/elementwise.h).
__device__ float activation(UnaryFunction fn, float x) {
  switch (fn) {
  case UnaryFunction::Gelu:
    return x * normalCdf(x);
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

__global__ void unaryKernel(UnaryFunction fn, const float *in, float *out, int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = activation(fn, in[i]); }
}

__global__ void unaryGradKernel(UnaryFunction fn, const float *x, const float *g, float *out,
                                int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = activationGrad(fn, x[i], g[i]); }
}

// A gated activation f(gate) * up and its gradient (dgate = f'(gate) * g * up,
// dup = g * f(gate)), one pass each.
__global__ void gatedKernel(UnaryFunction fn, const float *gate, const float *up, float *out,
                            int64_t n) {
  PTC_GRID_LOOP(i, n) { out[i] = activation(fn, gate[i]) * up[i]; }
}

__global__ void gatedGradKernel(UnaryFunction fn, const float *gate, const float *up,
                                const float *g, float *dgate, float *dup, int64_t n) {
  PTC_GRID_LOOP(i, n) {
    const float x = gate[i], gv = g[i];
    dgate[i] = activationGrad(fn, x, gv * up[i]);
    dup[i] = gv * activation(fn, x);
  }
}

__global__ void convertKernel(const void *in, int from, void *out, int to, int64_t n) {
  PTC_GRID_LOOP(i, n) { storeFloat(out, to, i, loadFloat(in, from, i)); }
}

} // namespace

void binary(BinaryOp op, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os, void *stream) {
  BroadcastShape s = broadcastShape(as, bs, os);
  int64_t n = product(os);
  unsigned grid = gridFor(n);
  switch (op) {
  case BinaryOp::Add:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, AddOp{});
    break;
  case BinaryOp::Sub:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, SubOp{});
    break;
  case BinaryOp::Mul:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, MulOp{});
    break;
  case BinaryOp::Div:
    binaryKernel<<<grid, kThreads, 0, S(stream)>>>(a, b, out, n, s, DivOp{});
    break;
  }
}

void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os, void *stream) {
  BroadcastShape s = broadcastShape(is, is, os);
  int64_t n = product(os);
  binaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, in, out, n, s, FirstOp{});
}

void scale(const float *in, float *out, int64_t n, float factor, void *stream) {
  scaleKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, out, n, factor);
}

void unary(UnaryFunction fn, const float *in, float *out, int64_t n, void *stream) {
  unaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(fn, in, out, n);
}

void unaryGrad(UnaryFunction fn, const float *x, const float *g, float *out, int64_t n,
               void *stream) {
  unaryGradKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(fn, x, g, out, n);
}

void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n,
                  void *stream) {
  convertKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(in, static_cast<int>(from), out,
                                                        static_cast<int>(to), n);
}

void addElementwiseKernels(KernelTable &t) {
  auto binaryKernel = [](const KernelCall &c) {
    static constexpr BinaryOp kOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
    const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
    if (KernelResult r = rankAtMost8(*out.shape, "an elementwise op"); !r.isOk())
      return r;
    binary(kOps[static_cast<int>(c.op) - static_cast<int>(OpKind::Add)], a.f32(), *a.shape,
           b.f32(), *b.shape, out.f32(), *out.shape, streamOf(c));
    return KernelResult::ok();
  };
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div})
    t.add(op, binaryKernel);
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
  t.add(OpKind::Scale, [](const KernelCall &c) {
    scale(c.input(0).f32(), c.output(0).f32(), c.input(0).elements, c.real(0), streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::Unary, [](const KernelCall &c) {
    unary(c.function, c.input(0).f32(), c.output(0).f32(), c.input(0).elements, streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::UnaryGrad, [](const KernelCall &c) {
    unaryGrad(c.function, c.input(0).f32(), c.input(1).f32(), c.output(0).f32(),
              c.input(0).elements, streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::GatedUnary, [](const KernelCall &c) {
    const int64_t n = c.input(0).elements;
    gatedKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
        c.function, c.input(0).f32(), c.input(1).f32(), c.output(0).f32(), n);
    return KernelResult::ok();
  });
  t.add(OpKind::GatedUnaryGrad, [](const KernelCall &c) {
    const int64_t n = c.input(0).elements;
    gatedGradKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
        c.function, c.input(0).f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(),
        c.output(1).f32(), n);
    return KernelResult::ok();
  });
  // Byte moves and conversions run on the stored types.
  t.add(
      OpKind::Reshape,
      [](const KernelCall &c) {
        cudaError_t e = cudaMemcpyAsync(c.output(0).data, c.input(0).data,
                                        static_cast<size_t>(c.input(0).bytes()),
                                        cudaMemcpyDeviceToDevice, S(streamOf(c)));
        return e == cudaSuccess ? KernelResult::ok()
                                : KernelResult::error("copying: ", cudaGetErrorString(e));
      },
      anyTypes);
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
