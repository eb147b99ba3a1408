// CPU kernels: LayerNorm and softmax, forward and backward.
#include "kernels/cpu/internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;

namespace {
/// Mean and 1/sqrt(biased variance + eps) of one row, two-pass for accuracy.
inline void rowStats(const float *x, int64_t cols, float eps, float &mean, float &rstd) {
  mean = 0.0f;
  for (int64_t c = 0; c < cols; ++c)
    mean += x[c];
  mean /= static_cast<float>(cols);
  float var = 0.0f;
  for (int64_t c = 0; c < cols; ++c)
    var += (x[c] - mean) * (x[c] - mean);
  rstd = 1.0f / std::sqrt(var / static_cast<float>(cols) + eps);
}
} // namespace

void layerNorm(const float *x, const float *w, const float *b, float *out, int64_t rows,
               int64_t cols, float eps) {
#pragma omp parallel for if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * cols;
    float *yr = out + r * cols;
    float mean, rstd;
    rowStats(xr, cols, eps, mean, rstd);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
  }
}

void layerNormGrad(const float *x, const float *w, const float *g, float *dx, float *dw,
                   float *db, int64_t rows, int64_t cols, float eps) {
  std::fill(dw, dw + cols, 0.0f);
  std::fill(db, db + cols, 0.0f);
#pragma omp parallel if (rows * cols > 16384)
  {
    std::vector<float> pdw(cols, 0.0f), pdb(cols, 0.0f), xhat(cols);
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * cols, *gr = g + r * cols;
      float mean, rstd;
      rowStats(xr, cols, eps, mean, rstd);
      float sumD = 0.0f, sumDX = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        xhat[c] = (xr[c] - mean) * rstd;
        float d = gr[c] * w[c];
        sumD += d;
        sumDX += d * xhat[c];
        pdw[c] += gr[c] * xhat[c];
        pdb[c] += gr[c];
      }
      float mD = sumD / static_cast<float>(cols), mDX = sumDX / static_cast<float>(cols);
      float *dxr = dx + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        dxr[c] = rstd * (gr[c] * w[c] - mD - xhat[c] * mDX);
    }
#pragma omp critical
    for (int64_t c = 0; c < cols; ++c) {
      dw[c] += pdw[c];
      db[c] += pdb[c];
    }
  }
}

void softmax(const float *x, float *out, const Shape &shape, int64_t axis) {
  int64_t n = shape[axis], inner = product(shape, axis + 1), outer = product(shape, 0, axis);
#pragma omp parallel for collapse(2) if (outer * inner * n > 16384)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float *xr = x + o * n * inner + i;
      float *yr = out + o * n * inner + i;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j)
        mx = std::max(mx, xr[j * inner]);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        yr[j * inner] = std::exp(xr[j * inner] - mx);
        sum += yr[j * inner];
      }
      for (int64_t j = 0; j < n; ++j)
        yr[j * inner] /= sum;
    }
}

void softmaxGrad(const float *y, const float *g, float *out, const Shape &shape, int64_t axis) {
  int64_t n = shape[axis], inner = product(shape, axis + 1), outer = product(shape, 0, axis);
#pragma omp parallel for collapse(2) if (outer * inner * n > 16384)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t base = o * n * inner + i;
      float dot = 0.0f;
      for (int64_t j = 0; j < n; ++j)
        dot += y[base + j * inner] * g[base + j * inner];
      for (int64_t j = 0; j < n; ++j)
        out[base + j * inner] = y[base + j * inner] * (g[base + j * inner] - dot);
    }
}

} // namespace ptc::kernels::cpu
