// CUDA kernels: LayerNorm, RMSNorm and rotary embeddings (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- LayerNorm -----------------------------------------------------------------
/// Mean and 1/sqrt(var + eps) of one row (two passes), for every thread of the block.
__device__ void rowStats(const float *row, int64_t cols, float eps, float &mean, float &rstd) {
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += row[c];
  mean = blockSum(s) / static_cast<float>(cols);
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    q += (row[c] - mean) * (row[c] - mean);
  rstd = rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
__global__ void layerNormKernel(const float *x, const float *w, const float *b, float *out,
                                int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = (row[c] - mean) * rstd * w[c] + b[c];
}

/// One block per row: dx = rstd (g w - mean(g w) - xhat mean(g w xhat)).
__global__ void layerNormGradRowKernel(const float *x, const float *w, const float *g, float *dx,
                                       int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float mean, rstd;
  rowStats(row, cols, eps, mean, rstd);
  float sd = 0.0f, sdx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float d = gr[c] * w[c];
    sd += d;
    sdx += d * (row[c] - mean) * rstd;
  }
  float mD = blockSum(sd) / static_cast<float>(cols);
  float mDX = blockSum(sdx) / static_cast<float>(cols);
  float *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = rstd * (gr[c] * w[c] - mD - (row[c] - mean) * rstd * mDX);
}

/// Per row: mean and rstd into stats[2 * row + {0, 1}].
__global__ void layerNormStatsKernel(const float *x, int64_t cols, float eps, float *stats) {
  float mean, rstd;
  rowStats(x + blockIdx.x * cols, cols, eps, mean, rstd);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rstd;
  }
}

/// dw, db: blocks of 32 columns x 8 row groups, reduced in shared memory.
__global__ void layerNormGradColumnsKernel(const float *x, const float *g, const float *stats,
                                           float *dw, float *db, int64_t rows, int64_t cols) {
  __shared__ float sw[8][33], sb[8][33];
  int64_t c = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 8) {
      float xhat = (x[r * cols + c] - stats[2 * r]) * stats[2 * r + 1];
      aw += g[r * cols + c] * xhat;
      ab += g[r * cols + c];
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
    dw[c] = tw;
    db[c] = tb;
  }
}

// ---- RMSNorm and rotary embeddings ------------------------------------------------
/// 1/sqrt(mean(x^2) + eps) of one row, for every thread of the block.
__device__ float rowRstd(const float *row, int64_t cols, float eps) {
  float q = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    q += row[c] * row[c];
  return rsqrtf(blockSum(q) / static_cast<float>(cols) + eps);
}

/// One block per row.
__global__ void rmsNormKernel(const float *x, const float *w, float *out, int64_t cols,
                              float eps) {
  const float *row = x + blockIdx.x * cols;
  float *o = out + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = row[c] * rstd * w[c];
}

/// One block per row: dx = rstd (g w - x rstd^2 mean(g w x)); rstd into stats[row].
__global__ void rmsNormGradRowKernel(const float *x, const float *w, const float *g, float *dx,
                                     float *stats, int64_t cols, float eps) {
  const float *row = x + blockIdx.x * cols, *gr = g + blockIdx.x * cols;
  float rstd = rowRstd(row, cols, eps);
  float d = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    d += gr[c] * w[c] * row[c];
  float k = rstd * rstd * blockSum(d) / static_cast<float>(cols);
  float *o = dx + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = rstd * (gr[c] * w[c] - row[c] * k);
  if (threadIdx.x == 0)
    stats[blockIdx.x] = rstd;
}

/// dw = sum over rows of g x rstd: blocks of 32 columns x 8 row groups.
__global__ void rmsNormGradColumnsKernel(const float *x, const float *g, const float *stats,
                                         float *dw, int64_t rows, int64_t cols) {
  __shared__ float sw[8][33];
  int64_t c = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 8)
      aw += g[r * cols + c] * x[r * cols + c] * stats[r];
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f;
    for (int y = 0; y < 8; ++y)
      tw += sw[y][threadIdx.x];
    dw[c] = tw;
  }
}

/// One thread per (head row, frequency) pair; angles in f32 as Hugging Face.
__global__ void rotaryKernel(const float *x, float *out, int64_t bh, int64_t seq, int64_t dim,
                             double theta, bool inverse, int64_t first) {
  int64_t half = dim / 2;
  PTC_GRID_LOOP(t, bh * seq * half) {
    int64_t i = t % half, rowIndex = t / half, p = first + rowIndex % seq;
    float invFreq = static_cast<float>(1.0 / pow(theta, static_cast<double>(2 * i) /
                                                            static_cast<double>(dim)));
    float angle = static_cast<float>(p) * invFreq;
    float c = cosf(angle), sn = inverse ? -sinf(angle) : sinf(angle);
    const float *xr = x + rowIndex * dim;
    float *yr = out + rowIndex * dim;
    float a = xr[i], b = xr[i + half];
    yr[i] = a * c - b * sn;
    yr[i + half] = b * c + a * sn;
  }
}

/// rotaryKernel at the positions pos[b, t] of rows (b, h, t).
__global__ void rotaryAtKernel(const float *x, const int32_t *pos, float *out, int64_t heads,
                               int64_t rows, int64_t seq, int64_t dim, double theta) {
  int64_t half = dim / 2;
  PTC_GRID_LOOP(t, rows * half) {
    int64_t i = t % half, rowIndex = t / half;
    int64_t b = rowIndex / (heads * seq), p = pos[b * seq + rowIndex % seq];
    float invFreq = static_cast<float>(1.0 / pow(theta, static_cast<double>(2 * i) /
                                                            static_cast<double>(dim)));
    float angle = static_cast<float>(p) * invFreq;
    float c = cosf(angle), sn = sinf(angle);
    const float *xr = x + rowIndex * dim;
    float *yr = out + rowIndex * dim;
    float a = xr[i], bv = xr[i + half];
    yr[i] = a * c - bv * sn;
    yr[i + half] = bv * c + a * sn;
  }
}
} // namespace

void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps, void *stream) {
  if (rows > 0)
    layerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, b, out, cols,
                                                                             eps);
}

void layerNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                   float *db, int64_t rows, int64_t cols, float eps, float *rowStats,
                   void *stream) {
  if (rows == 0)
    return;
  layerNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, g, dx,
                                                                                  cols, eps);
  layerNormStatsKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, cols, eps,
                                                                                rowStats);
  layerNormGradColumnsKernel<<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0,
                               S(stream)>>>(x, g, rowStats, dw, db, rows, cols);
}


void rmsNorm(const float *x, const float *w, float *out, int64_t rows, int64_t cols, float eps,
             void *stream) {
  if (rows > 0)
    rmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(x, w, out, cols, eps);
}

void rmsNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                 int64_t rows, int64_t cols, float eps, float *rowStats, void *stream) {
  if (rows == 0)
    return;
  rmsNormGradRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      x, w, g, dx, rowStats, cols, eps);
  rmsNormGradColumnsKernel<<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0,
                             S(stream)>>>(x, g, rowStats, dw, rows, cols);
}

void rotary(const float *x, float *out, int64_t bh, int64_t seq, int64_t dim, double theta,
            bool inverse, void *stream, int64_t first) {
  int64_t n = bh * seq * (dim / 2);
  if (n > 0)
    rotaryKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(x, out, bh, seq, dim, theta, inverse,
                                                         first);
}

void addNormalizationKernels(KernelTable &t) {
  t.add(OpKind::LayerNorm, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    layerNorm(x.f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(), x.rows(), x.dim(-1),
              c.real(0), streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::LayerNormGrad, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    auto *stats = static_cast<float *>(scratch(c, 2 * x.rows() * 4));
    if (!stats)
      return scratchFailure(c, 2 * x.rows() * 4);
    layerNormGrad(x.f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(),
                  c.output(1).f32(), c.output(2).f32(), x.rows(), x.dim(-1), c.real(0), stats,
                  streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::RmsNorm, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    rmsNorm(x.f32(), c.input(1).f32(), c.output(0).f32(), x.rows(), x.dim(-1), c.real(0),
            streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::RmsNormGrad, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    auto *stats = static_cast<float *>(scratch(c, x.rows() * 4));
    if (!stats)
      return scratchFailure(c, x.rows() * 4);
    rmsNormGrad(x.f32(), c.input(1).f32(), c.input(2).f32(), c.output(0).f32(), c.output(1).f32(),
                x.rows(), x.dim(-1), c.real(0), stats, streamOf(c));
    return KernelResult::ok();
  });
  // x [batch, heads, seq, dim].
  t.add(OpKind::Rotary, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    const int64_t first = c.numInts > 1 ? c.meshCoords[c.integer(1)] * x.dim(2) : 0;
    rotary(x.f32(), c.output(0).f32(), x.dim(0) * x.dim(1), x.dim(2), x.dim(3), c.floats[0],
           c.integer(0) != 0, streamOf(c), first);
    return KernelResult::ok();
  });
  // x [batch, heads, tokens, dim], positions [batch, tokens].
  t.add(OpKind::RotaryAt, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    int64_t rows = x.dim(0) * x.dim(1) * x.dim(2), n = rows * (x.dim(3) / 2);
    if (n > 0)
      rotaryAtKernel<<<gridFor(n), kThreads, 0, S(streamOf(c))>>>(
          x.f32(), c.input(1).i32(), c.output(0).f32(), x.dim(1), rows, x.dim(2), x.dim(3),
          c.real(0));
    return KernelResult::ok();
  });
}
} // namespace ptc::kernels::cuda
