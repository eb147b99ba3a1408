// CUDA kernels: LayerNorm, RMSNorm and rotary embeddings (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- LayerNorm -----------------------------------------------------------------
// Templated on the stored type T (f32, bf16, f16: every view of a call one
// type); f32 math in registers, each result rounded once.

/// Mean and 1/sqrt(var + eps) of one row (two passes), for every thread of the block.
template <typename T>
__device__ void rowStats(const T *row, int64_t cols, float eps, float &mean, float &rstd) {
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += toFloat(row[c]);
  mean = blockSum(s) / static_cast<float>(cols);
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = toFloat(row[c]) - mean;
    q += d * d;
  }
  rstd = rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
template <typename T>
__global__ void layerNormKernel(const T *x, const T *w, const T *b, T *out, int64_t cols,
                                float eps) {
  const T *row = x + blockIdx.x * cols;
  T *o = out + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = fromFloat<T>((toFloat(row[c]) - mean) * rstd * toFloat(w[c]) + toFloat(b[c]));
}

/// One block per row: dx = rstd (g w - mean(g w) - xhat mean(g w xhat)); the
/// row's mean and rstd into stats[2 * row + {0, 1}] for the columns' pass.
template <typename T>
__global__ void layerNormGradRowKernel(const T *x, const T *w, const T *g, T *dx, float *stats,
                                       int64_t cols, float eps) {
  const T *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  float sd = 0.0f, sdx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float d = toFloat(gr[c]) * toFloat(w[c]);
    sd += d;
    sdx += d * (toFloat(row[c]) - mean) * rstd;
  }
  float mD = blockSum(sd) / static_cast<float>(cols);
  float mDX = blockSum(sdx) / static_cast<float>(cols);
  T *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = fromFloat<T>(rstd * (toFloat(gr[c]) * toFloat(w[c]) - mD -
                                (toFloat(row[c]) - mean) * rstd * mDX));
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rstd;
  }
}

/// dw, db, pass 1: blocks of 32 columns x 8 row threads over a chunk of
/// kNormRowsPerChunk rows, reduced in shared memory into one partial per
/// chunk and column (partial[chunk * cols + col]; db's after dw's).
constexpr int64_t kNormRowsPerChunk = 256;
template <typename T>
__global__ void layerNormGradColumnsKernel(const T *x, const T *g, const float *stats,
                                           float *partialW, float *partialB, int64_t rows,
                                           int64_t cols) {
  __shared__ float sw[8][33], sb[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * kNormRowsPerChunk, r1 = min(rows, r0 + kNormRowsPerChunk);
  float aw = 0.0f, ab = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float gv = toFloat(g[r * cols + c]);
      aw += gv * (toFloat(x[r * cols + c]) - stats[2 * r]) * stats[2 * r + 1];
      ab += gv;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < 8; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    partialW[blockIdx.y * cols + c] = tw;
    partialB[blockIdx.y * cols + c] = tb;
  }
}

/// Pass 2: the chunks' partials added in order (no atomics: the same sums on
/// every run).
template <typename T>
__global__ void normColumnsFinishKernel(const float *partial, int64_t chunks, int64_t cols,
                                        T *out) {
  PTC_GRID_LOOP(c, cols) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k)
      sum += partial[k * cols + c];
    out[c] = fromFloat<T>(sum);
  }
}

// ---- RMSNorm and rotary embeddings ------------------------------------------------
// Templated on the stored type as LayerNorm: f32 math, each result rounded once.

/// 1/sqrt(mean(x^2) + eps) of one row, for every thread of the block.
template <typename T> __device__ float rowRstd(const T *row, int64_t cols, float eps) {
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = toFloat(row[c]);
    q += v * v;
  }
  return rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
template <typename T>
__global__ void rmsNormKernel(const T *x, const T *w, T *out, int64_t cols, float eps) {
  const T *row = x + blockIdx.x * cols;
  T *o = out + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = fromFloat<T>(toFloat(row[c]) * rstd * toFloat(w[c]));
}

/// One block per row: dx = rstd (g w - x rstd^2 mean(g w x)); rstd into stats[row].
template <typename T>
__global__ void rmsNormGradRowKernel(const T *x, const T *w, const T *g, T *dx, float *stats,
                                     int64_t cols, float eps) {
  const T *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  float d = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    d += toFloat(gr[c]) * toFloat(w[c]) * toFloat(row[c]);
  float k = rstd * rstd * blockSum(d) / static_cast<float>(cols);
  T *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = fromFloat<T>(rstd * (toFloat(gr[c]) * toFloat(w[c]) - toFloat(row[c]) * k));
  if (threadIdx.x == 0)
    stats[blockIdx.x] = rstd;
}

/// dw, pass 1 (as LayerNorm's): blocks of 32 columns x 8 row threads over a
/// chunk of kNormRowsPerChunk rows, one partial per chunk and column, summed
/// in order by normColumnsFinishKernel.
template <typename T>
__global__ void rmsNormGradColumnsKernel(const T *x, const T *g, const float *stats,
                                         float *partialW, int64_t rows, int64_t cols) {
  __shared__ float sw[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * kNormRowsPerChunk, r1 = min(rows, r0 + kNormRowsPerChunk);
  float aw = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
      aw += toFloat(g[r * cols + c]) * toFloat(x[r * cols + c]) * stats[r];
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f;
    for (int y = 0; y < 8; ++y)
      tw += sw[y][threadIdx.x];
    partialW[blockIdx.y * cols + c] = tw;
  }
}

/// The rotation of one (row, frequency) pair: angles in f32 as Hugging Face.
template <typename T>
__device__ inline void rotatePair(const T *xr, T *yr, int64_t i, int64_t half, int64_t dim,
                                  int64_t position, double theta, bool inverse) {
  float invFreq = static_cast<float>(1.0 / pow(theta, static_cast<double>(2 * i) /
                                                          static_cast<double>(dim)));
  float angle = static_cast<float>(position) * invFreq;
  float c = cosf(angle), sn = inverse ? -sinf(angle) : sinf(angle);
  float a = toFloat(xr[i]), b = toFloat(xr[i + half]);
  yr[i] = fromFloat<T>(a * c - b * sn);
  yr[i + half] = fromFloat<T>(b * c + a * sn);
}

/// One thread per (head row, frequency) pair over `rows` rows; row r is at
/// position (r / inner) % seq (inner: 1 heads-major, the heads seq-major).
template <typename T>
__global__ void rotaryKernel(const T *x, T *out, int64_t rows, int64_t seq, int64_t inner,
                             int64_t dim, double theta, bool inverse, int64_t first) {
  int64_t half = dim / 2;
  PTC_GRID_LOOP(t, rows * half) {
    int64_t i = t % half, rowIndex = t / half;
    rotatePair(x + rowIndex * dim, out + rowIndex * dim, i, half, dim,
               first + (rowIndex / inner) % seq, theta, inverse);
  }
}

/// rotaryKernel at the positions pos[b, t] of rows (b, h, t) (seq-major:
/// rows (b, t, h)).
template <typename T>
__global__ void rotaryAtKernel(const T *x, const int32_t *pos, T *out, int64_t heads,
                               int64_t rows, int64_t seq, int64_t dim, double theta,
                               bool inverse, bool seqMajor) {
  int64_t half = dim / 2;
  PTC_GRID_LOOP(t, rows * half) {
    int64_t i = t % half, rowIndex = t / half;
    int64_t b = rowIndex / (heads * seq), token = seqMajor ? (rowIndex / heads) % seq : rowIndex % seq;
    rotatePair(x + rowIndex * dim, out + rowIndex * dim, i, half, dim, pos[b * seq + token], theta,
               inverse);
  }
}
} // namespace

namespace {
int64_t normChunks(int64_t rows) { return (rows + kNormRowsPerChunk - 1) / kNormRowsPerChunk; }
/// Scratch of a LayerNormGrad: the rows' statistics and the columns' partials.
int64_t layerNormGradScratchFloats(int64_t rows, int64_t cols) {
  return 2 * rows + 2 * normChunks(rows) * cols;
}

template <typename T>
void layerNormGrad(const T *x, const T *w, const T *g, T *dx, T *dw, T *db, int64_t rows,
                   int64_t cols, float eps, float *scratch, void *stream) {
  if (rows == 0 || cols == 0)
    return;
  const int64_t chunks = normChunks(rows);
  float *stats = scratch, *partialW = scratch + 2 * rows, *partialB = partialW + chunks * cols;
  layerNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, g, dx,
                                                                                  stats, cols, eps);
  layerNormGradColumnsKernel<<<dim3(static_cast<unsigned>((cols + 31) / 32),
                                    static_cast<unsigned>(chunks)),
                               dim3(32, 8), 0, S(stream)>>>(x, g, stats, partialW, partialB, rows,
                                                            cols);
  normColumnsFinishKernel<<<gridFor(cols), kThreads, 0, S(stream)>>>(partialW, chunks, cols, dw);
  normColumnsFinishKernel<<<gridFor(cols), kThreads, 0, S(stream)>>>(partialB, chunks, cols, db);
}
} // namespace

namespace {
template <typename T>
void rmsNormGrad(const T *x, const T *w, const T *g, T *dx, T *dw, int64_t rows, int64_t cols,
                 float eps, float *scratch, void *stream) {
  if (rows == 0 || cols == 0)
    return;
  const int64_t chunks = normChunks(rows);
  float *stats = scratch, *partialW = scratch + rows;
  rmsNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      x, w, g, dx, stats, cols, eps);
  rmsNormGradColumnsKernel<<<dim3(static_cast<unsigned>((cols + 31) / 32),
                                  static_cast<unsigned>(chunks)),
                             dim3(32, 8), 0, S(stream)>>>(x, g, stats, partialW, rows, cols);
  normColumnsFinishKernel<<<gridFor(cols), kThreads, 0, S(stream)>>>(partialW, chunks, cols, dw);
}
} // namespace

namespace {
/// A row normalization's entry: `run(T{}, rows, cols)` with T the call's
/// float type, unless there are no rows.
template <typename Run> KernelResult onRows(const KernelCall &c, Run &&run) {
  const TensorView &x = c.input(0);
  if (x.rows() > 0)
    withFloatType(x.dtype, [&](auto tag) {
      run(tag, x.rows(), x.dim(-1));
      return 0;
    });
  return KernelResult::ok();
}
/// The same with `floats` floats of scratch: `run(T{}, rows, cols, scratch)`.
template <typename Run>
KernelResult onRowsWithScratch(const KernelCall &c, int64_t floats, Run &&run) {
  const int64_t bytes = std::max<int64_t>(floats, 1) * 4;
  auto *work = static_cast<float *>(scratch(c, bytes));
  if (!work)
    return scratchFailure(c, bytes);
  return onRows(c, [&](auto tag, int64_t rows, int64_t cols) { run(tag, rows, cols, work); });
}
} // namespace

void addNormalizationKernels(KernelTable &t) {
  // LayerNorm, RMSNorm and their gradients take f32, bf16 and f16 natively
  // (every view one type); the weight (and bias) gradients are column sums in
  // two passes (row chunks, then the chunks in order: no atomics).
  t.add(
      OpKind::LayerNorm,
      [](const KernelCall &c) {
        return onRows(c, [&](auto tag, int64_t rows, int64_t cols) {
          using T = decltype(tag);
          layerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(streamOf(c))>>>(
              inputAs<T>(c, 0), inputAs<T>(c, 1), inputAs<T>(c, 2), outputAs<T>(c, 0), cols,
              static_cast<float>(c.attr(attr::RowNorm::epsilon)));
        });
      },
      oneFloatType);
  t.add(
      OpKind::LayerNormGrad,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        return onRowsWithScratch(
            c, layerNormGradScratchFloats(x.rows(), x.dim(-1)),
            [&](auto tag, int64_t rows, int64_t cols, float *work) {
              using T = decltype(tag);
              layerNormGrad(inputAs<T>(c, 0), inputAs<T>(c, 1), inputAs<T>(c, 2),
                            outputAs<T>(c, 0), outputAs<T>(c, 1), outputAs<T>(c, 2), rows, cols,
                            static_cast<float>(c.attr(attr::RowNorm::epsilon)), work, streamOf(c));
            });
      },
      oneFloatType);
  t.add(
      OpKind::RmsNorm,
      [](const KernelCall &c) {
        return onRows(c, [&](auto tag, int64_t rows, int64_t cols) {
          using T = decltype(tag);
          rmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(streamOf(c))>>>(
              inputAs<T>(c, 0), inputAs<T>(c, 1), outputAs<T>(c, 0), cols,
              static_cast<float>(c.attr(attr::RowNorm::epsilon)));
        });
      },
      oneFloatType);
  t.add(
      OpKind::RmsNormGrad,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        return onRowsWithScratch(
            c, x.rows() + normChunks(x.rows()) * x.dim(-1),
            [&](auto tag, int64_t rows, int64_t cols, float *work) {
              using T = decltype(tag);
              rmsNormGrad(inputAs<T>(c, 0), inputAs<T>(c, 1), inputAs<T>(c, 2), outputAs<T>(c, 0),
                          outputAs<T>(c, 1), rows, cols,
                          static_cast<float>(c.attr(attr::RowNorm::epsilon)), work, streamOf(c));
            });
      },
      oneFloatType);
  // x [batch, heads, seq, dim] (seq-major: [batch, seq, heads, dim]).
  t.add(
      OpKind::Rotary,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        const bool seqMajor = rotarySeqMajor(c);
        const int64_t rows = x.dim(0) * x.dim(1) * x.dim(2), n = rows * (x.dim(3) / 2);
        if (n > 0)
          withFloatType(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            rotaryKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
                inputAs<T>(c, 0), outputAs<T>(c, 0), rows, seqMajor ? x.dim(1) : x.dim(2),
                seqMajor ? x.dim(2) : 1, x.dim(3), c.attr(attr::Rotary::theta),
                c.attr(attr::Rotary::inverse) != 0,
                rotaryFirstPosition(c));
            return 0;
          });
        return KernelResult::ok();
      },
      oneFloatType);
  // x [batch, heads, tokens, dim], positions [batch, tokens].
  t.add(
      OpKind::RotaryAt,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        int64_t rows = x.dim(0) * x.dim(1) * x.dim(2), n = rows * (x.dim(3) / 2);
        if (n > 0)
          withFloatType(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            const bool seqMajor = rotarySeqMajor(c);
            rotaryAtKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
                inputAs<T>(c, 0), c.input(1).i32(), outputAs<T>(c, 0), x.dim(seqMajor ? 2 : 1),
                rows, x.dim(seqMajor ? 1 : 2), x.dim(3),
                static_cast<float>(c.attr(attr::RotaryAt::theta)),
                c.attr(attr::RotaryAt::inverse) != 0, seqMajor);
            return 0;
          });
        return KernelResult::ok();
      },
      [](const KernelCall &c) { return oneFloatType(c, 1); });
}
} // namespace ptc::kernels::cuda
