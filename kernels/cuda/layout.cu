// CUDA kernels: transposes, boxes and reductions (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Layout ------------------------------------------------------------------------
template <typename T>
__global__ void transposeKernel(const T *in, T *out, int64_t n, Dims outShape, Dims inStride) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, src = 0;
    for (int d = outShape.rank - 1; d >= 0; --d) {
      src += (rest % outShape.size[d]) * inStride.stride[d];
      rest /= outShape.size[d];
    }
    out[i] = in[src];
  }
}

template <typename T>
__global__ void copyBoxKernel(const T *src, T *dst, int64_t n, Dims box, Dims srcStride,
                              Dims dstStride, int64_t srcBase, int64_t dstBase) {
  PTC_GRID_LOOP(i, n) {
    int64_t rest = i, s = srcBase, d = dstBase;
    for (int k = box.rank - 1; k >= 0; --k) {
      int64_t c = rest % box.size[k];
      rest /= box.size[k];
      s += c * srcStride.stride[k];
      d += c * dstStride.stride[k];
    }
    dst[d] = src[s];
  }
}

/// Reduction: `kept` enumerates the output, `red` the reduced positions (both
/// with input strides).
/// One thread per output element, the reduced elements in a fixed order, in
/// f32 on the stored type T (the result rounded once).
template <typename T>
__global__ void reduceKernel(int op, const T *in, T *out, int64_t outN, Dims kept, Dims red,
                             int64_t count) {
  PTC_GRID_LOOP(o, outN) {
    int64_t rest = o, base = 0;
    for (int d = kept.rank - 1; d >= 0; --d) {
      base += (rest % kept.size[d]) * kept.stride[d];
      rest /= kept.size[d];
    }
    float acc = op == 2 ? -INFINITY : 0.0f;
    for (int64_t r = 0; r < count; ++r) {
      int64_t rr = r, off = base;
      for (int d = red.rank - 1; d >= 0; --d) {
        off += (rr % red.size[d]) * red.stride[d];
        rr /= red.size[d];
      }
      const float x = toFloat(in[off]);
      acc = op == 2 ? fmaxf(acc, x) : acc + x;
    }
    out[o] = fromFloat<T>(op == 1 ? acc / static_cast<float>(count) : acc);
  }
}

/// Column sums of a row-major [rows, cols] block (a bias gradient: the sum
/// over every leading axis), pass 1: a block of 32 x 8 threads per 32 columns
/// and kRowsPerChunk rows, reads coalesced along the columns; the chunk's sum
/// of each column goes to partial[chunk * cols + col]. Pass 2 adds the chunks
/// in order: a fixed summation order whatever the GPU (no atomics).
constexpr int kColumnTile = 32, kRowThreads = 8;
constexpr int64_t kRowsPerChunk = 256;
template <typename T>
__global__ void columnPartialSumsKernel(const T *in, int64_t rows, int64_t cols, float *partial) {
  __shared__ float tile[kRowThreads][kColumnTile + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads)
      acc += toFloat(in[r * cols + col]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int i = 0; i < kRowThreads; ++i)
      sum += tile[i][threadIdx.x];
    partial[blockIdx.y * cols + col] = sum;
  }
}
template <typename T>
__global__ void columnFinishKernel(const float *partial, int64_t chunks, int64_t cols, float scale,
                                   T *out) {
  PTC_GRID_LOOP(c, cols) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k)
      sum += partial[k * cols + c];
    out[c] = fromFloat<T>(sum * scale);
  }
}

/// The rows a ReduceSum / ReduceMean call sums when it reduces exactly the
/// leading axes (in any order) and the column sums can run: > 0; else 0.
int64_t leadingRows(const KernelCall &c) {
  if (c.op == OpKind::ReduceMax)
    return 0;
  const TensorView &in = c.input(0);
  const Shape axes = c.attr(attr::Reduction::axes);
  int64_t rows = 1, leading = 0;
  while (leading < static_cast<int64_t>(in.rank()) &&
         std::find(axes.begin(), axes.end(), leading) != axes.end())
    rows *= in.dim(static_cast<int>(leading++));
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  if (leading != static_cast<int64_t>(axes.size()) || rows <= 0 || in.elements <= 0 ||
      chunks > 65535)
    return 0;
  return rows;
}

/// d max: g split evenly over the positions that hold the maximum.
__global__ void reduceMaxGradKernel(const float *in, const float *g, float *out, int64_t outN,
                                    Dims kept, Dims red, int64_t count) {
  PTC_GRID_LOOP(o, outN) {
    int64_t rest = o, base = 0;
    for (int d = kept.rank - 1; d >= 0; --d) {
      base += (rest % kept.size[d]) * kept.stride[d];
      rest /= kept.size[d];
    }
    auto offset = [&](int64_t r) {
      int64_t off = base;
      for (int d = red.rank - 1; d >= 0; --d) {
        off += (r % red.size[d]) * red.stride[d];
        r /= red.size[d];
      }
      return off;
    };
    float mx = -INFINITY;
    for (int64_t r = 0; r < count; ++r)
      mx = fmaxf(mx, in[offset(r)]);
    float ties = 0.0f;
    for (int64_t r = 0; r < count; ++r)
      ties += in[offset(r)] == mx ? 1.0f : 0.0f;
    for (int64_t r = 0; r < count; ++r) {
      int64_t off = offset(r);
      out[off] = in[off] == mx ? g[o] / ties : 0.0f;
    }
  }
}

} // namespace

namespace {
template <typename T>
void launchTranspose(const void *in, void *out, int64_t n, const Dims &os, const Dims &st,
                     void *stream) {
  transposeKernel<T><<<gridFor(n), kThreads, 0, S(stream)>>>(static_cast<const T *>(in),
                                                            static_cast<T *>(out), n, os, st);
}
template <typename T>
void launchCopyBox(const void *src, void *dst, int64_t n, const Dims &box, const Dims &ss,
                   const Dims &ds, int64_t s0, int64_t d0, void *stream) {
  copyBoxKernel<T><<<gridFor(n), kThreads, 0, S(stream)>>>(
      static_cast<const T *>(src), static_cast<T *>(dst), n, box, ss, ds, s0, d0);
}
} // namespace

void transpose(const void *in, const Shape &is, void *out, const Shape &perm, int64_t elemBytes,
               void *stream) {
  int64_t n = product(is);
  if (n == 0)
    return;
  Dims inDims = rowMajor(is), os, st;
  os.rank = st.rank = inDims.rank;
  for (int i = 0; i < inDims.rank; ++i) {
    os.size[i] = inDims.size[perm[static_cast<size_t>(i)]];
    st.stride[i] = inDims.stride[perm[static_cast<size_t>(i)]];
  }
  switch (elemBytes) {
  case 1:
    launchTranspose<uint8_t>(in, out, n, os, st, stream);
    break;
  case 2:
    launchTranspose<uint16_t>(in, out, n, os, st, stream);
    break;
  case 8:
    launchTranspose<uint64_t>(in, out, n, os, st, stream);
    break;
  default:
    launchTranspose<uint32_t>(in, out, n, os, st, stream);
    break;
  }
}

void copyBox(const void *src, const Shape &srcShape, const Shape &srcOffsets, void *dst,
             const Shape &dstShape, const Shape &dstOffsets, const Shape &box, int64_t elemBytes,
             void *stream) {
  int64_t n = product(box);
  if (n == 0)
    return;
  Dims b = rowMajor(box), ss = rowMajor(srcShape), ds = rowMajor(dstShape);
  int64_t s0 = 0, d0 = 0;
  for (size_t i = 0; i < box.size(); ++i) {
    s0 += srcOffsets[i] * ss.stride[i];
    d0 += dstOffsets[i] * ds.stride[i];
  }
  switch (elemBytes) {
  case 1:
    launchCopyBox<uint8_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  case 2:
    launchCopyBox<uint16_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  case 8:
    launchCopyBox<uint64_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  default:
    launchCopyBox<uint32_t>(src, dst, n, b, ss, ds, s0, d0, stream);
    break;
  }
}

namespace {
/// Splits the input dims into kept (output order) and reduced ones.
void splitAxes(const Shape &is, const Shape &axes, Dims &kept, Dims &red, int64_t &outN,
               int64_t &count) {
  Dims in = rowMajor(is);
  outN = count = 1;
  for (int d = 0; d < in.rank; ++d) {
    bool reduced = false;
    for (int64_t a : axes)
      reduced |= a == d;
    Dims &to = reduced ? red : kept;
    to.size[to.rank] = in.size[d];
    to.stride[to.rank] = in.stride[d];
    ++to.rank;
    (reduced ? count : outN) *= in.size[d];
  }
}
} // namespace

KernelResult columnSums(const KernelCall &c, const TensorView &in, int64_t rows,
                        const TensorView &out, float scale) {
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t cols = rows > 0 ? in.elements / rows : 0;
  if (rows <= 0 || cols <= 0)
    return KernelResult::ok();
  if (chunks > 65535)
    return KernelResult::error("column sums over ", rows, " rows: more than the grid takes");
  auto *partial = static_cast<float *>(scratch(c, chunks * cols * 4));
  if (!partial)
    return scratchFailure(c, chunks * cols * 4);
  dim3 grid(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile),
            static_cast<unsigned>(chunks));
  withFloatType(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    columnPartialSumsKernel<<<grid, dim3(kColumnTile, kRowThreads), 0, S(streamOf(c))>>>(
        static_cast<const T *>(in.data), rows, cols, partial);
    columnFinishKernel<<<gridFor(cols), kThreads, 0, S(streamOf(c))>>>(
        partial, chunks, cols, scale, static_cast<T *>(out.data));
    return 0;
  });
  return KernelResult::ok();
}

void reduce(ReduceOp op, const void *in, DType type, const Shape &is, const Shape &axes,
            void *out, void *stream) {
  Dims kept, red;
  int64_t outN, count;
  splitAxes(is, axes, kept, red, outN, count);
  withFloatType(type, [&](auto tag) {
    using T = decltype(tag);
    reduceKernel<<<gridFor(outN), kThreads, 0, S(stream)>>>(
        static_cast<int>(op), static_cast<const T *>(in), static_cast<T *>(out), outN, kept, red,
        count);
    return 0;
  });
}

void reduce(ReduceOp op, const float *in, const Shape &is, const Shape &axes, float *out,
            void *stream) {
  reduce(op, in, DType::F32, is, axes, out, stream);
}

void reduceMaxGrad(const float *in, const Shape &is, const Shape &axes, const float *g,
                   float *out, void *stream) {
  Dims kept, red;
  int64_t outN, count;
  splitAxes(is, axes, kept, red, outN, count);
  reduceMaxGradKernel<<<gridFor(outN), kThreads, 0, S(stream)>>>(in, g, out, outN, kept, red,
                                                                 count);
}

void addLayoutKernels(KernelTable &t) {
  // Byte moves: on the stored element type.
  t.add(
      OpKind::Transpose,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0);
        if (KernelResult r = rankAtMost8(*in.shape, "transpose"); !r.isOk())
          return r;
        transpose(in.data, *in.shape, c.output(0).data, c.attr(attr::Permutation::permutation),
                  dtypeBytes(in.dtype),
                  streamOf(c));
        return KernelResult::ok();
      },
      anyTypes);
  t.add(
      OpKind::Slice,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0), &out = c.output(0);
        if (KernelResult r = rankAtMost8(*out.shape, "a slice"); !r.isOk())
          return r;
        copyBox(in.data, *in.shape, c.attr(attr::Offsets::offsets), out.data, *out.shape, Shape(out.rank(), 0),
                *out.shape, dtypeBytes(in.dtype), streamOf(c));
        return KernelResult::ok();
      },
      anyTypes);
  t.add(
      OpKind::Concat,
      [](const KernelCall &c) {
        const TensorView &out = c.output(0);
        if (KernelResult r = rankAtMost8(*out.shape, "concat"); !r.isOk())
          return r;
        const auto axis = static_cast<size_t>(c.attr(attr::Axis::axis));
        Shape offsets(out.rank(), 0);
        for (size_t i = 0; i < c.numInputs; ++i) {
          const TensorView &in = c.in[i];
          copyBox(in.data, *in.shape, Shape(out.rank(), 0), out.data, *out.shape, offsets,
                  *in.shape, dtypeBytes(out.dtype), streamOf(c));
          offsets[axis] += in.dim(static_cast<int>(axis));
        }
        return KernelResult::ok();
      },
      anyTypes);
  t.add(OpKind::Pad, [](const KernelCall &c) {
    const TensorView &in = c.input(0), &out = c.output(0);
    if (KernelResult r = rankAtMost8(*out.shape, "pad"); !r.isOk())
      return r;
    cudaError_t e = cudaMemsetAsync(out.data, 0, static_cast<size_t>(out.bytes()), S(streamOf(c)));
    if (e != cudaSuccess)
      return KernelResult::error("clearing: ", cudaGetErrorString(e));
    copyBox(in.data, *in.shape, Shape(in.rank(), 0), out.data, *out.shape, c.attr(attr::Offsets::offsets), *in.shape,
            4, streamOf(c));
    return KernelResult::ok();
  });
  auto reduceKernel = [](const KernelCall &c) {
    const TensorView &in = c.input(0);
    if (KernelResult r = rankAtMost8(*in.shape, "a reduction"); !r.isOk())
      return r;
    const ReduceOp kind = c.op == OpKind::ReduceSum    ? ReduceOp::Sum
                          : c.op == OpKind::ReduceMean ? ReduceOp::Mean
                                                       : ReduceOp::Max;
    // Sums over leading axes (bias gradients): column sums in two passes, on
    // the stored type (f32, bf16, f16).
    const Shape axes = c.attr(attr::Reduction::axes);
    if (const int64_t rows = leadingRows(c); rows > 0)
      return columnSums(c, in, rows, c.output(0),
                        kind == ReduceOp::Mean ? 1.0f / static_cast<float>(rows) : 1.0f);
    reduce(kind, in.data, in.dtype, *in.shape, axes, c.output(0).data, streamOf(c));
    return KernelResult::ok();
  };
  // f32, bf16 or f16, one type (f32 math, each result rounded once).
  auto reduceTypes = [](const KernelCall &c) { return oneFloatType(c); };
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax})
    t.add(op, reduceKernel, reduceTypes);
  t.add(OpKind::ReduceMaxGrad, [](const KernelCall &c) {
    const TensorView &in = c.input(0);
    if (KernelResult r = rankAtMost8(*in.shape, "a max gradient"); !r.isOk())
      return r;
    reduceMaxGrad(in.f32(), *in.shape, c.attr(attr::Reduction::axes), c.input(1).f32(), c.output(0).f32(),
                  streamOf(c));
    return KernelResult::ok();
  });
}
} // namespace ptc::kernels::cuda
