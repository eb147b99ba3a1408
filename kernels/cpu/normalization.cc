// CPU kernels: LayerNorm, RMSNorm, rotary embeddings and softmax, forward and
// backward.
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

// LayerNorm and RMSNorm on f32 or bf16 storage (T: float or uint16_t); the
// row statistics, the gradient's sums and the weight gradients' partials in
// f32, one rounding per bf16 result.
namespace {
/// Rows go through the normalizations in blocks of kNormRows, phase by phase
/// (every row's sum, then every row's variance, ...): a row's statistics are
/// short dependent chains (a reduction's lanes added, a division, a square
/// root) which overlap across the block's rows when no row waits on its own.
/// Each row's arithmetic is the same as one row at a time.
constexpr int64_t kNormRows = 8;

/// The number of row blocks, and the rows in block `block` (the last may be short).
inline int64_t normBlocks(int64_t rows) { return (rows + kNormRows - 1) / kNormRows; }
inline int64_t rowsInBlock(int64_t rows, int64_t block) {
  return std::min(kNormRows, rows - block * kNormRows);
}

/// Mean and 1/sqrt(biased variance + eps) of each of n <= kNormRows rows,
/// two-pass for accuracy.
template <typename T>
inline void blockStats(const T *x, int64_t n, int64_t cols, float eps, float *mean, float *rstd) {
  for (int64_t r = 0; r < n; ++r) {
    const T *xr = x + r * cols;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c)
      sum += loadAs(xr, c);
    mean[r] = sum / static_cast<float>(cols);
  }
  for (int64_t r = 0; r < n; ++r) {
    const T *xr = x + r * cols;
    float var = 0.0f;
    const float m = mean[r];
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < cols; ++c)
      var += (loadAs(xr, c) - m) * (loadAs(xr, c) - m);
    rstd[r] = var;
  }
  for (int64_t r = 0; r < n; ++r)
    rstd[r] = 1.0f / std::sqrt(rstd[r] / static_cast<float>(cols) + eps);
}

template <typename T>
void layerNorm(const T *x, const T *w, const T *b, T *out, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for if (rows * cols > 16384)
  for (int64_t blk = 0; blk < normBlocks(rows); ++blk) {
    const int64_t r0 = blk * kNormRows, n = rowsInBlock(rows, blk);
    float mean[kNormRows], rstd[kNormRows];
    blockStats(x + r0 * cols, n, cols, eps, mean, rstd);
    for (int64_t r = 0; r < n; ++r) {
      const T *xr = x + (r0 + r) * cols;
      T *yr = out + (r0 + r) * cols;
      const float m = mean[r], s = rstd[r];
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c)
        storeAs(yr, c, (loadAs(xr, c) - m) * s * loadAs(w, c) + loadAs(b, c));
    }
  }
}

/// The threads the row loops of a normalization gradient use, and the sum of
/// their per-thread column partials in thread order (deterministic for any
/// thread count, unlike an arrival-ordered critical section).
int normThreads(int64_t rows, int64_t cols) {
  return rows * cols > 16384 ? availableThreads() : 1;
}
template <typename T>
void sumPartials(const std::vector<float> &partials, int threads, int64_t cols, int64_t which,
                 int64_t count, T *out) {
  std::vector<float> sum(static_cast<size_t>(cols), 0.0f);
  for (int t = 0; t < threads; ++t) {
    const float *p = partials.data() + (t * count + which) * cols;
    for (int64_t c = 0; c < cols; ++c)
      sum[c] += p[c];
  }
  for (int64_t c = 0; c < cols; ++c)
    storeAs(out, c, sum[c]);
}

template <typename T>
void layerNormGrad(const T *x, const T *w, const T *g, T *dx, T *dw, T *db, int64_t rows,
                   int64_t cols, float eps) {
  const int threads = normThreads(rows, cols);
  std::vector<float> partials(static_cast<size_t>(threads * 2 * cols), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> xhat(static_cast<size_t>(kNormRows * cols));
    float *pw = partials.data() + threadIndex() * 2 * cols, *pb = pw + cols;
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < normBlocks(rows); ++blk) {
      const int64_t r0 = blk * kNormRows, n = rowsInBlock(rows, blk);
      float mean[kNormRows], rstd[kNormRows], mD[kNormRows], mDX[kNormRows];
      blockStats(x + r0 * cols, n, cols, eps, mean, rstd);
      for (int64_t r = 0; r < n; ++r) {
        const T *xr = x + (r0 + r) * cols, *gr = g + (r0 + r) * cols;
        const float m = mean[r], s = rstd[r];
        float sumD = 0.0f, sumDX = 0.0f;
        float *xh = xhat.data() + r * cols;
#pragma omp simd reduction(+ : sumD, sumDX)
        for (int64_t c = 0; c < cols; ++c) {
          xh[c] = (loadAs(xr, c) - m) * s;
          float gc = loadAs(gr, c);
          float d = gc * loadAs(w, c);
          sumD += d;
          sumDX += d * xh[c];
          pw[c] += gc * xh[c];
          pb[c] += gc;
        }
        mD[r] = sumD / static_cast<float>(cols);
        mDX[r] = sumDX / static_cast<float>(cols);
      }
      for (int64_t r = 0; r < n; ++r) {
        const T *gr = g + (r0 + r) * cols;
        const float *xh = xhat.data() + r * cols;
        const float s = rstd[r], md = mD[r], mdx = mDX[r];
        T *dxr = dx + (r0 + r) * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c)
          storeAs(dxr, c, s * (loadAs(gr, c) * loadAs(w, c) - md - xh[c] * mdx));
      }
    }
  }
  sumPartials(partials, threads, cols, 0, 2, dw);
  sumPartials(partials, threads, cols, 1, 2, db);
}

template <typename T>
void rmsNorm(const T *x, const T *w, T *out, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for if (rows * cols > 16384)
  for (int64_t blk = 0; blk < normBlocks(rows); ++blk) {
    const int64_t r0 = blk * kNormRows, n = rowsInBlock(rows, blk);
    float rstd[kNormRows];
    for (int64_t r = 0; r < n; ++r) {
      const T *xr = x + (r0 + r) * cols;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < cols; ++c)
        ss += loadAs(xr, c) * loadAs(xr, c);
      rstd[r] = ss;
    }
    for (int64_t r = 0; r < n; ++r)
      rstd[r] = 1.0f / std::sqrt(rstd[r] / static_cast<float>(cols) + eps);
    for (int64_t r = 0; r < n; ++r) {
      const T *xr = x + (r0 + r) * cols;
      T *yr = out + (r0 + r) * cols;
      const float s = rstd[r];
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c)
        storeAs(yr, c, loadAs(xr, c) * s * loadAs(w, c));
    }
  }
}

// y = x r w with r = (mean(x^2) + eps)^-1/2:
// dx = r (g w - x r^2 mean(g w x)), dw = sum over rows of g x r.
template <typename T>
void rmsNormGrad(const T *x, const T *w, const T *g, T *dx, T *dw, int64_t rows, int64_t cols,
                 float eps) {
  const int threads = normThreads(rows, cols);
  std::vector<float> partials(static_cast<size_t>(threads * cols), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float *pdw = partials.data() + threadIndex() * cols;
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < normBlocks(rows); ++blk) {
      const int64_t r0 = blk * kNormRows, n = rowsInBlock(rows, blk);
      float rstd[kNormRows], k[kNormRows];
      for (int64_t r = 0; r < n; ++r) {
        const T *xr = x + (r0 + r) * cols, *gr = g + (r0 + r) * cols;
        float ss = 0.0f, dot = 0.0f;
#pragma omp simd reduction(+ : ss, dot)
        for (int64_t c = 0; c < cols; ++c) {
          float xc = loadAs(xr, c);
          ss += xc * xc;
          dot += loadAs(gr, c) * loadAs(w, c) * xc;
        }
        rstd[r] = ss;
        k[r] = dot;
      }
      const float nc = static_cast<float>(cols);
      for (int64_t r = 0; r < n; ++r) {
        rstd[r] = 1.0f / std::sqrt(rstd[r] / nc + eps);
        k[r] = rstd[r] * rstd[r] * k[r] / nc;
      }
      for (int64_t r = 0; r < n; ++r) {
        const T *xr = x + (r0 + r) * cols, *gr = g + (r0 + r) * cols;
        const float s = rstd[r], kr = k[r];
        T *dxr = dx + (r0 + r) * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          float xc = loadAs(xr, c), gc = loadAs(gr, c);
          storeAs(dxr, c, s * (gc * loadAs(w, c) - xc * kr));
          pdw[c] += gc * xc * s;
        }
      }
    }
  }
  sumPartials(partials, threads, cols, 0, 1, dw);
}

} // namespace

namespace {
/// Rotary on f32 or bf16 storage (T), in f32 registers: one rounding per bf16
/// result, as widening the tensor would give, without the copies.
/// `shape` is [batch, heads, seq, head_dim], or with `seqMajor` [batch, seq,
/// heads, head_dim]: rows (a, p, c) at ((a * seq + p) * inner + c) with
/// position p.
template <typename T>
void rotaryOf(const T *x, T *out, const Shape &shape, double theta, bool inverse, int64_t first,
              bool seqMajor = false) {
  const int64_t outer = seqMajor ? shape[0] : shape[0] * shape[1], s = seqMajor ? shape[1] : shape[2],
                inner = seqMajor ? shape[2] : 1, d = shape[3], half = d / 2;
  // The angles of every (position, frequency), as Hugging Face computes them:
  // inv_freq_i = theta^(-2i/d) in f32, angle = position * inv_freq_i.
  std::vector<float> cosT(static_cast<size_t>(s * half)), sinT(static_cast<size_t>(s * half));
  for (int64_t i = 0; i < half; ++i) {
    float invFreq = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(d)));
    for (int64_t p = 0; p < s; ++p) {
      float angle = static_cast<float>(first + p) * invFreq;
      cosT[p * half + i] = std::cos(angle);
      sinT[p * half + i] = inverse ? -std::sin(angle) : std::sin(angle);
    }
  }
#pragma omp parallel for collapse(2) if (outer * s * inner * d > 16384)
  for (int64_t h = 0; h < outer; ++h)
    for (int64_t p = 0; p < s; ++p) {
      const float *cs = cosT.data() + p * half, *sn = sinT.data() + p * half;
      for (int64_t c = 0; c < inner; ++c) {
        const T *xr = x + ((h * s + p) * inner + c) * d;
        T *yr = out + ((h * s + p) * inner + c) * d;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float a = loadAs(xr, i), b = loadAs(xr, i + half);
          storeAs(yr, i, a * cs[i] - b * sn[i]);
          storeAs(yr, i + half, b * cs[i] + a * sn[i]);
        }
      }
    }
}
} // namespace

void rotary(const float *x, float *out, const Shape &shape, double theta, bool inverse,
            int64_t first) {
  rotaryOf(x, out, shape, theta, inverse, first);
}

/// ptc.rotary_at: row (b, h, t) of x [b, heads, t, d] rotated at position
/// pos[b * t + t] (the angles computed as rotary computes them, so positions
/// 0, 1, .. give rotary's numbers); `inverse` turns the other way. f32 or
/// bf16 storage (T), f32 registers.
template <typename T>
KernelResult rotaryAtOf(const T *x, const int32_t *pos, T *out, const Shape &shape, double theta,
                        bool inverse, bool seqMajor = false) {
  // seqMajor: shape is [batch, tokens, heads, d], row (b, p, h) at (b * s + p) * heads + h.
  const int64_t batch = shape[0], heads = shape[seqMajor ? 2 : 1], s = shape[seqMajor ? 1 : 2],
                d = shape[3], half = d / 2;
  for (int64_t i = 0; i < batch * s; ++i)
    if (pos[i] < 0)
      return badId("position", pos[i], i, std::numeric_limits<int32_t>::max());
  std::vector<float> invFreq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    invFreq[static_cast<size_t>(i)] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(d)));
#pragma omp parallel for collapse(2) if (batch * heads * s * d > 16384)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < s; ++p) {
      std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
      for (int64_t i = 0; i < half; ++i) {
        float angle = static_cast<float>(pos[b * s + p]) * invFreq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = std::cos(angle);
        sn[static_cast<size_t>(i)] = inverse ? -std::sin(angle) : std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = seqMajor ? (b * s + p) * heads + h : (b * heads + h) * s + p;
        const T *xr = x + row * d;
        T *yr = out + row * d;
        for (int64_t i = 0; i < half; ++i) {
          float a = loadAs(xr, i), c = loadAs(xr, i + half);
          storeAs(yr, i, a * cs[static_cast<size_t>(i)] - c * sn[static_cast<size_t>(i)]);
          storeAs(yr, i + half, c * cs[static_cast<size_t>(i)] + a * sn[static_cast<size_t>(i)]);
        }
      }
    }
  return KernelResult::ok();
}

static void softmax(const float *x, float *out, const Shape &shape, int64_t axis) {
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

static void softmaxGrad(const float *y, const float *g, float *out, const Shape &shape, int64_t axis) {
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

void addNormalizationKernels(KernelTable &t) {
  // Normalizations and rotary compute natively on bf16 storage (f32 statistics
  // and rotations).
  t.add(
      OpKind::LayerNorm,
      [](const KernelCall &c) {
        return onStorage(c, [&](auto t) {
          using T = decltype(t);
          const TensorView &x = c.input(0);
          layerNorm(as<T>(x), as<T>(c.input(1)), as<T>(c.input(2)), as<T>(c.output(0)), x.rows(),
                    x.dim(-1),
                    c.attr(attr::RowNorm::epsilon));
        });
      },
      f32OrBf16);
  t.add(
      OpKind::LayerNormGrad,
      [](const KernelCall &c) {
        return onStorage(c, [&](auto t) {
          using T = decltype(t);
          const TensorView &x = c.input(0);
          layerNormGrad(as<T>(x), as<T>(c.input(1)), as<T>(c.input(2)), as<T>(c.output(0)),
                        as<T>(c.output(1)), as<T>(c.output(2)), x.rows(), x.dim(-1),
                    c.attr(attr::RowNorm::epsilon));
        });
      },
      f32OrBf16);
  t.add(
      OpKind::RmsNorm,
      [](const KernelCall &c) {
        return onStorage(c, [&](auto t) {
          using T = decltype(t);
          const TensorView &x = c.input(0);
          rmsNorm(as<T>(x), as<T>(c.input(1)), as<T>(c.output(0)), x.rows(), x.dim(-1),
                  c.attr(attr::RowNorm::epsilon));
        });
      },
      f32OrBf16);
  t.add(
      OpKind::RmsNormGrad,
      [](const KernelCall &c) {
        return onStorage(c, [&](auto t) {
          using T = decltype(t);
          const TensorView &x = c.input(0);
          rmsNormGrad(as<T>(x), as<T>(c.input(1)), as<T>(c.input(2)), as<T>(c.output(0)),
                      as<T>(c.output(1)), x.rows(), x.dim(-1),
                    c.attr(attr::RowNorm::epsilon));
        });
      },
      f32OrBf16);
  t.add(
      OpKind::Rotary,
      [](const KernelCall &c) {
        // With a mesh axis: this device's block of the sequence.
        const bool seqMajor = rotarySeqMajor(c);
        const int64_t first = rotaryFirstPosition(c);
        return onStorage(c, [&](auto t) {
          using T = decltype(t);
          rotaryOf(as<T>(c.input(0)), as<T>(c.output(0)), *c.input(0).shape,
                   c.attr(attr::Rotary::theta), c.attr(attr::Rotary::inverse) != 0, first, seqMajor);
        });
      },
      f32OrBf16);
  t.add(
      OpKind::RotaryAt,
      [](const KernelCall &c) {
        const bool inverse = c.attr(attr::RotaryAt::inverse) != 0;
        KernelResult r = KernelResult::ok();
        (void)onStorage(c, [&](auto t) {
          using T = decltype(t);
          r = rotaryAtOf(as<T>(c.input(0)), c.input(1).i32(), as<T>(c.output(0)),
                         *c.input(0).shape, c.attr(attr::RotaryAt::theta), inverse,
                         rotarySeqMajor(c));
        });
        return r;
      },
      f32OrBf16WithIds);
  t.add(OpKind::Softmax, [](const KernelCall &c) {
    softmax(c.input(0).f32(), c.output(0).f32(), *c.input(0).shape, c.attr(attr::Axis::axis));
    return KernelResult::ok();
  });
  t.add(OpKind::SoftmaxGrad, [](const KernelCall &c) {
    softmaxGrad(c.input(0).f32(), c.input(1).f32(), c.output(0).f32(), *c.input(0).shape,
                c.attr(attr::Axis::axis));
    return KernelResult::ok();
  });
}

} // namespace ptc::kernels::cpu
