// CPU kernels. See kernels.h for the contract.

#include "kernels/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {

namespace {
int64_t product(const Shape &s, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  const size_t end = std::min(to, s.size());
  for (size_t i = from; i < end; ++i)
    p *= s[i];
  return p;
}

/// Row-major strides.
std::vector<int64_t> stridesOf(const Shape &s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * s[i + 1];
  return st;
}

/// Strides of `in` seen through broadcasting to `out` (0 on stretched dims).
std::vector<int64_t> broadcastStrides(const Shape &in, const Shape &out) {
  std::vector<int64_t> st(out.size(), 0);
  std::vector<int64_t> inSt = stridesOf(in);
  size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    st[lead + i] = in[i] == 1 && out[lead + i] != 1 ? 0 : inSt[i];
  return st;
}

/// Offset of row `row` (index over all dims but the last) with strides `st`.
int64_t rowOffset(int64_t row, const Shape &shape, const std::vector<int64_t> &st) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    off += (row % shape[d]) * st[d];
    row /= shape[d];
  }
  return off;
}

template <typename F> inline float apply(F f, float a, float b) { return f(a, b); }

template <typename F>
void binaryLoop(F f, const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
                const Shape &os) {
  int64_t n = product(os);
  if (as == os && bs == os) {
#pragma omp parallel for simd if (n > 32768)
    for (int64_t i = 0; i < n; ++i)
      out[i] = f(a[i], b[i]);
    return;
  }
  Shape shape = os.empty() ? Shape{1} : os;
  Shape ash = as, bsh = bs;
  if (os.empty()) {
    ash = {1};
    bsh = {1};
  }
  std::vector<int64_t> sa = broadcastStrides(ash, shape), sb = broadcastStrides(bsh, shape);
  int64_t inner = shape.back(), rows = n / std::max<int64_t>(inner, 1);
  int64_t ia = sa.back(), ib = sb.back();
#pragma omp parallel for if (n > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float *pa = a + rowOffset(r, shape, sa);
    const float *pb = b + rowOffset(r, shape, sb);
    float *po = out + r * inner;
    if (ia == 1 && ib == 1) {
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j)
        po[j] = f(pa[j], pb[j]);
    } else {
      for (int64_t j = 0; j < inner; ++j)
        po[j] = f(pa[j * ia], pb[j * ib]);
    }
  }
}
} // namespace

void binary(Binary kind, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os) {
  switch (kind) {
  case Binary::Add:
    return binaryLoop([](float x, float y) { return x + y; }, a, as, b, bs, out, os);
  case Binary::Sub:
    return binaryLoop([](float x, float y) { return x - y; }, a, as, b, bs, out, os);
  case Binary::Mul:
    return binaryLoop([](float x, float y) { return x * y; }, a, as, b, bs, out, os);
  case Binary::Div:
    return binaryLoop([](float x, float y) { return x / y; }, a, as, b, bs, out, os);
  }
}

void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os) {
  binaryLoop([](float x, float) { return x; }, in, is, in, is, out, os);
}

void scale(const float *in, float *out, int64_t n, float factor) {
#pragma omp parallel for simd if (n > 32768)
  for (int64_t i = 0; i < n; ++i)
    out[i] = in[i] * factor;
}



void copy(const void *in, void *out, int64_t bytes) {
  if (in != out)
    std::memmove(out, in, static_cast<size_t>(bytes));
}

void matmul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out,
            bool transA, bool transB) {
  size_t r = as.size(), rb = bs.size();
  int64_t m = transA ? as[r - 1] : as[r - 2], k = transA ? as[r - 2] : as[r - 1];
  int64_t n = transB ? bs[rb - 2] : bs[rb - 1];
  int64_t batch = product(as, 0, r - 2);
  int lda = static_cast<int>(transA ? m : k), ldb = static_cast<int>(transB ? k : n);
  CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans, tb = transB ? CblasTrans : CblasNoTrans;
  bool shared = rb == 2;
  if (shared && !transA) {
    // All batch rows share B: one GEMM over batch * m rows.
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(batch * m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, lda, b, ldb, 0.0f, out, static_cast<int>(n));
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a + i * m * k, lda, shared ? b : b + i * k * n, ldb,
                0.0f, out + i * m * n, static_cast<int>(n));
}

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

namespace {
/// Normalized causal attention probabilities of query row `i` into `p[0..i]`.
inline void attentionRow(const float *q, const float *k, int64_t i, int64_t d, float scale,
                         float *p) {
  const float *qi = q + i * d;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= i; ++j) {
    const float *kj = k + j * d;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < d; ++c)
      s += qi[c] * kj[c];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  float inv = 1.0f / sum;
  for (int64_t j = 0; j <= i; ++j)
    p[j] *= inv;
}
} // namespace

void causalAttention(const float *q, const float *k, const float *v, float *out,
                     const Shape &shape, float scale) {
  int64_t bh = shape[0] * shape[1], s = shape[2], d = shape[3];
#pragma omp parallel
  {
    std::vector<float> p(s);
#pragma omp for collapse(2)
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t i = 0; i < s; ++i) {
        const float *qh = q + h * s * d, *kh = k + h * s * d, *vh = v + h * s * d;
        attentionRow(qh, kh, i, d, scale, p.data());
        float *o = out + h * s * d + i * d;
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float *vj = vh + j * d;
          float pj = p[j];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c)
            o[c] += pj * vj[c];
        }
      }
  }
}

void causalAttentionGrad(const float *q, const float *k, const float *v, const float *g,
                         float *dq, float *dk, float *dv, const Shape &shape, float scale) {
  int64_t bh = shape[0] * shape[1], s = shape[2], d = shape[3];
#pragma omp parallel
  {
    std::vector<float> p(s), dp(s);
#pragma omp for
    for (int64_t h = 0; h < bh; ++h) {
      const float *qh = q + h * s * d, *kh = k + h * s * d, *vh = v + h * s * d;
      const float *gh = g + h * s * d;
      float *dqh = dq + h * s * d, *dkh = dk + h * s * d, *dvh = dv + h * s * d;
      std::fill(dkh, dkh + s * d, 0.0f);
      std::fill(dvh, dvh + s * d, 0.0f);
      for (int64_t i = 0; i < s; ++i) {
        attentionRow(qh, kh, i, d, scale, p.data());
        const float *gi = gh + i * d;
        float t = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          const float *vj = vh + j * d;
          float *dvj = dvh + j * d;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; ++c) {
            dot += gi[c] * vj[c];
            dvj[c] += p[j] * gi[c];
          }
          dp[j] = dot;
          t += p[j] * dot;
        }
        float *dqi = dqh + i * d;
        std::fill(dqi, dqi + d, 0.0f);
        const float *qi = qh + i * d;
        for (int64_t j = 0; j <= i; ++j) {
          float ds = p[j] * (dp[j] - t) * scale;
          const float *kj = kh + j * d;
          float *dkj = dkh + j * d;
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
    }
  }
}

namespace {
KernelResult badId(const char *what, int64_t id, int64_t pos, int64_t limit) {
  return KernelResult::error(what, " ", id, " at position ", pos, " is outside [0, ", limit, ")");
}
} // namespace

KernelResult embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                 int64_t count, float *out, int64_t rowOffset, int64_t totalRows) {
  if (totalRows < 0)
    totalRows = rows;
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= totalRows)
      return badId("embedding index", ids[i], i, totalRows);
#pragma omp parallel for if (count * dim > 32768)
  for (int64_t i = 0; i < count; ++i) {
    int64_t r = static_cast<int64_t>(ids[i]) - rowOffset;
    if (r >= 0 && r < rows)
      std::memcpy(out + i * dim, table + r * dim, sizeof(float) * static_cast<size_t>(dim));
    else
      std::fill(out + i * dim, out + (i + 1) * dim, 0.0f);
  }
  return KernelResult::ok();
}

KernelResult embeddingGrad(const int32_t *ids, int64_t count, const float *g, float *dtable,
                     int64_t rows, int64_t dim, int64_t rowOffset, int64_t totalRows) {
  if (totalRows < 0)
    totalRows = rows;
  std::fill(dtable, dtable + rows * dim, 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= totalRows)
      return badId("embedding index", ids[i], i, totalRows);
    int64_t r = static_cast<int64_t>(ids[i]) - rowOffset;
    if (r < 0 || r >= rows)
      continue;
    float *row = dtable + r * dim;
    const float *gi = g + i * dim;
#pragma omp simd
    for (int64_t c = 0; c < dim; ++c)
      row[c] += gi[c];
  }
  return KernelResult::ok();
}

void rowMax(const float *logits, int64_t rows, int64_t classes, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r)
    out[r] = *std::max_element(logits + r * classes, logits + (r + 1) * classes);
}

void rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.0f;
    for (int64_t c = 0; c < classes; ++c)
      s += std::exp(logits[r * classes + c] - max[r]);
    out[r] = s;
  }
}

KernelResult targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                   int64_t offset, int64_t totalClasses, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0 || targets[r] >= totalClasses)
      return badId("target", targets[r], r, totalClasses);
    int64_t c = static_cast<int64_t>(targets[r]) - offset;
    out[r] = c >= 0 && c < classes ? logits[r * classes + c] : 0.0f;
  }
  return KernelResult::ok();
}

KernelResult crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                    float *loss) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= classes)
      return badId("target", targets[r], r, classes);
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = logits + r * classes;
    float mx = *std::max_element(x, x + classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c)
      sum += std::exp(x[c] - mx);
    total += static_cast<double>(mx + std::log(sum) - x[targets[r]]);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
  return KernelResult::ok();
}

KernelResult crossEntropyGrad(const float *logits, const int32_t *targets, const float *g,
                        int64_t rows, int64_t classes, float *out) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= classes)
      return badId("target", targets[r], r, classes);
  const float scale = *g / static_cast<float>(rows);
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = logits + r * classes;
    float *o = out + r * classes;
    float mx = *std::max_element(x, x + classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) {
      o[c] = std::exp(x[c] - mx);
      sum += o[c];
    }
    float inv = scale / sum;
    for (int64_t c = 0; c < classes; ++c)
      o[c] *= inv;
    o[targets[r]] -= scale;
  }
  return KernelResult::ok();
}

void transpose(const void *in, const Shape &is, void *out, const std::vector<int64_t> &perm,
               int64_t elemBytes) {
  size_t rank = is.size();
  int64_t n = product(is);
  if (rank == 0 || n == 0) {
    copy(in, out, n * elemBytes);
    return;
  }
  Shape os(rank);
  std::vector<int64_t> inSt = stridesOf(is), st(rank);
  for (size_t i = 0; i < rank; ++i) {
    os[i] = is[perm[i]];
    st[i] = inSt[perm[i]]; // input stride of output dim i
  }
  int64_t inner = os.back(), rows = n / inner;
  const char *src = static_cast<const char *>(in);
  char *dst = static_cast<char *>(out);
  bool contiguous = st.back() == 1;
#pragma omp parallel for if (n > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = rowOffset(r, os, st);
    if (contiguous) {
      std::memcpy(dst + r * inner * elemBytes, src + base * elemBytes,
                  static_cast<size_t>(inner * elemBytes));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(dst + (r * inner + j) * elemBytes, src + (base + j * st.back()) * elemBytes,
                    static_cast<size_t>(elemBytes));
    }
  }
}

void sliceCopy(const void *big, const Shape &bigShape, void *small, const Shape &smallShape,
               const std::vector<int64_t> &offsets, int64_t elemBytes, bool toSmall) {
  int64_t n = product(smallShape);
  if (n == 0)
    return;
  if (smallShape.empty()) {
    copy(toSmall ? big : small, toSmall ? small : const_cast<void *>(big), elemBytes);
    return;
  }
  std::vector<int64_t> bigSt = stridesOf(bigShape);
  int64_t start = 0;
  for (size_t i = 0; i < offsets.size(); ++i)
    start += offsets[i] * bigSt[i];
  int64_t inner = smallShape.back(), rows = n / inner;
  char *b = static_cast<char *>(const_cast<void *>(big));
  char *s = static_cast<char *>(small);
#pragma omp parallel for if (n > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = start + rowOffset(r, smallShape, bigSt);
    char *bp = b + off * elemBytes, *sp = s + r * inner * elemBytes;
    if (toSmall)
      std::memcpy(sp, bp, static_cast<size_t>(inner * elemBytes));
    else
      std::memcpy(bp, sp, static_cast<size_t>(inner * elemBytes));
  }
}

void copyBox(const void *src, const Shape &srcShape, const std::vector<int64_t> &srcOffsets,
             void *dst, const Shape &dstShape, const std::vector<int64_t> &dstOffsets,
             const Shape &box, int64_t elemBytes) {
  int64_t n = product(box);
  if (n == 0)
    return;
  if (box.empty()) {
    std::memcpy(dst, src, static_cast<size_t>(elemBytes));
    return;
  }
  std::vector<int64_t> ss = stridesOf(srcShape), ds = stridesOf(dstShape);
  int64_t s0 = 0, d0 = 0;
  for (size_t i = 0; i < box.size(); ++i) {
    s0 += srcOffsets[i] * ss[i];
    d0 += dstOffsets[i] * ds[i];
  }
  int64_t inner = box.back(), rows = n / inner;
  const char *sp = static_cast<const char *>(src);
  char *dp = static_cast<char *>(dst);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dp + (d0 + rowOffset(r, box, ds)) * elemBytes,
                sp + (s0 + rowOffset(r, box, ss)) * elemBytes, static_cast<size_t>(inner * elemBytes));
}

void pad(const float *in, const Shape &is, float *out, const Shape &os,
         const std::vector<int64_t> &offsets) {
  std::fill(out, out + product(os), 0.0f);
  sliceCopy(out, os, const_cast<float *>(in), is, offsets, sizeof(float), /*toSmall=*/false);
}

void concat(const std::vector<const void *> &ins, const std::vector<Shape> &shapes, void *out,
            int64_t axis, int64_t elemBytes) {
  Shape os = shapes[0];
  os[axis] = 0;
  for (const Shape &s : shapes)
    os[axis] += s[axis];
  std::vector<int64_t> offsets(os.size(), 0);
  for (size_t i = 0; i < ins.size(); ++i) {
    sliceCopy(out, os, const_cast<void *>(ins[i]), shapes[i], offsets, elemBytes, false);
    offsets[axis] += shapes[i][axis];
  }
}

namespace {
/// Output strides of each input dim for a reduction (0 on reduced dims).
std::vector<int64_t> reducedStrides(const Shape &is, const std::vector<int64_t> &axes) {
  std::vector<bool> reduced(is.size(), false);
  for (int64_t a : axes)
    reduced[a] = true;
  std::vector<int64_t> st(is.size(), 0);
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(is.size()) - 1; d >= 0; --d)
    if (!reduced[d]) {
      st[d] = stride;
      stride *= is[d];
    }
  return st;
}
} // namespace

void reduce(Reduce kind, const float *in, const Shape &is, const std::vector<int64_t> &axes,
            float *out) {
  int64_t n = product(is);
  std::vector<int64_t> st = reducedStrides(is, axes);
  int64_t count = 1;
  for (int64_t a : axes)
    count *= is[a];
  int64_t outN = count ? n / std::max<int64_t>(count, 1) : 0;
  if (is.empty()) {
    out[0] = in[0];
    return;
  }
  std::fill(out, out + outN,
            kind == Reduce::Max ? -std::numeric_limits<float>::infinity() : 0.0f);
  int64_t inner = is.back(), rows = n / std::max<int64_t>(inner, 1), ist = st.back();
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = in + r * inner;
    float *o = out + rowOffset(r, is, st);
    if (kind == Reduce::Max) {
      for (int64_t j = 0; j < inner; ++j)
        o[j * ist] = std::max(o[j * ist], x[j]);
    } else if (ist == 0) {
      float s = 0.0f;
      for (int64_t j = 0; j < inner; ++j)
        s += x[j];
      o[0] += s;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j)
        o[j] += x[j];
    }
  }
  if (kind == Reduce::Mean)
    for (int64_t i = 0; i < outN; ++i)
      out[i] /= static_cast<float>(count);
}

void reduceMaxGrad(const float *in, const Shape &is, const std::vector<int64_t> &axes,
                   const float *g, float *out) {
  int64_t n = product(is);
  int64_t count = 1;
  for (int64_t a : axes)
    count *= is[a];
  std::vector<float> mx(static_cast<size_t>(n / std::max<int64_t>(count, 1)));
  reduce(Reduce::Max, in, is, axes, mx.data());
  std::vector<float> ties(mx.size(), 0.0f);
  std::vector<int64_t> st = reducedStrides(is, axes);
  Shape shape = is.empty() ? Shape{1} : is;
  if (is.empty())
    st = {0};
  int64_t inner = shape.back(), rows = n / inner, ist = st.back();
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t o = rowOffset(r, shape, st);
      for (int64_t j = 0; j < inner; ++j) {
        int64_t oi = o + j * ist;
        bool hit = in[r * inner + j] == mx[oi];
        if (pass == 0)
          ties[oi] += hit ? 1.0f : 0.0f;
        else
          out[r * inner + j] = hit ? g[oi] / ties[oi] : 0.0f;
      }
    }
}

namespace {
void softmaxRow(const float *x, int64_t n, float *p) {
  float mx = *std::max_element(x, x + n), sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    p[e] = std::exp(x[e] - mx);
    sum += p[e];
  }
  for (int64_t e = 0; e < n; ++e)
    p[e] /= sum;
}

/// Slot of every assignment (t, j) in its expert's buffer, or -1 when dropped.
KernelResult assignSlots(const int32_t *indices, int64_t tokens, int64_t k, int64_t experts,
                         int64_t capacity, std::vector<int64_t> &slot) {
  slot.assign(static_cast<size_t>(tokens * k), 0);
  std::vector<int64_t> used(experts, 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = indices[i];
    if (e < 0 || e >= experts)
      return KernelResult::error("expert index ", e, " of token ", i / k, " is outside [0, ",
                             experts, ")");
    slot[i] = used[e] < capacity ? used[e]++ : -1;
  }
  return KernelResult::ok();
}
} // namespace

void topKGate(const float *logits, int64_t tokens, int64_t experts, int64_t k, bool normalize,
              float *weights, int32_t *indices) {
#pragma omp parallel
  {
    std::vector<float> p(experts);
    std::vector<bool> taken(experts);
#pragma omp for
    for (int64_t t = 0; t < tokens; ++t) {
      softmaxRow(logits + t * experts, experts, p.data());
      std::fill(taken.begin(), taken.end(), false);
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e)
          if (!taken[e] && (best < 0 || p[e] > p[best]))
            best = e;
        taken[best] = true;
        weights[t * k + j] = p[best];
        indices[t * k + j] = static_cast<int32_t>(best);
        sum += p[best];
      }
      if (normalize)
        for (int64_t j = 0; j < k; ++j)
          weights[t * k + j] /= sum;
    }
  }
}

KernelResult topKGateGrad(const float *logits, const int32_t *indices, const float *gw,
                    int64_t tokens, int64_t experts, int64_t k, bool normalize, float *out) {
  for (int64_t i = 0; i < tokens * k; ++i)
    if (indices[i] < 0 || indices[i] >= experts)
      return badId("expert index", indices[i], i, experts);
  std::vector<float> p(experts), dp(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    softmaxRow(logits + t * experts, experts, p.data());
    std::fill(dp.begin(), dp.end(), 0.0f);
    const int32_t *idx = indices + t * k;
    const float *g = gw + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      sum += p[idx[j]];
    if (normalize) {
      float c = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        c += g[j] * p[idx[j]] / sum;
      for (int64_t j = 0; j < k; ++j)
        dp[idx[j]] += (g[j] - c) / sum;
    } else {
      for (int64_t j = 0; j < k; ++j)
        dp[idx[j]] += g[j];
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < experts; ++e)
      dot += p[e] * dp[e];
    for (int64_t e = 0; e < experts; ++e)
      out[t * experts + e] = p[e] * (dp[e] - dot);
  }
  return KernelResult::ok();
}

KernelResult moeDispatch(const float *x, const int32_t *indices, int64_t tokens, int64_t k,
                   int64_t dim, int64_t experts, int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + experts * capacity * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0)
      std::memcpy(out + (indices[i] * capacity + slots[i]) * dim, x + (i / k) * dim,
                  sizeof(float) * static_cast<size_t>(dim));
  return KernelResult::ok();
}

KernelResult moeDispatchGrad(const float *g, const int32_t *indices, int64_t tokens, int64_t k,
                       int64_t dim, int64_t experts, int64_t capacity, float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + tokens * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = g + (indices[i] * capacity + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += src[c];
    }
  return KernelResult::ok();
}

KernelResult moeCombine(const float *expertOut, const float *weights, const int32_t *indices,
                  int64_t tokens, int64_t k, int64_t dim, int64_t experts, int64_t capacity,
                  float *out) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(out, out + tokens * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (slots[i] >= 0) {
      const float *src = expertOut + (indices[i] * capacity + slots[i]) * dim;
      float *dst = out + (i / k) * dim;
      float w = weights[i];
      for (int64_t c = 0; c < dim; ++c)
        dst[c] += w * src[c];
    }
  return KernelResult::ok();
}

KernelResult moeCombineGrad(const float *expertOut, const float *weights, const int32_t *indices,
                      const float *g, int64_t tokens, int64_t k, int64_t dim, int64_t experts,
                      int64_t capacity, float *dExpertOut, float *dWeights) {
  std::vector<int64_t> slots;
  if (KernelResult r = assignSlots(indices, tokens, k, experts, capacity, slots); !r.isOk())
    return r;
  std::fill(dExpertOut, dExpertOut + experts * capacity * dim, 0.0f);
  for (int64_t i = 0; i < tokens * k; ++i) {
    dWeights[i] = 0.0f;
    if (slots[i] < 0)
      continue;
    int64_t off = (indices[i] * capacity + slots[i]) * dim;
    const float *gt = g + (i / k) * dim;
    float dot = 0.0f;
    for (int64_t c = 0; c < dim; ++c) {
      dExpertOut[off + c] = weights[i] * gt[c];
      dot += gt[c] * expertOut[off + c];
    }
    dWeights[i] = dot;
  }
  return KernelResult::ok();
}

void adamwUpdate(const float *param, const float *grad, const float *m, const float *v, float step,
                 const AdamW &hp, int64_t n, float *outParam, float *outM, float *outV) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  const float stepSize = static_cast<float>(hp.lr / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weightDecay;
#pragma omp parallel for simd if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    float mi = m[i] + (g - m[i]) * (1.0f - hp.beta1); // lerp, as torch
    float vi = v[i] * hp.beta2 + (1.0f - hp.beta2) * g * g;
    float denom = std::sqrt(vi) / bc2Sqrt + hp.eps;
    float p = param[i] * decay;
    outParam[i] = p - stepSize * mi / denom;
    outM[i] = mi;
    outV[i] = vi;
  }
}

void sgdUpdate(const float *param, const float *grad, const float *buf, float lr, float momentum,
               float weightDecay, int64_t n, float *outParam, float *outBuf) {
#pragma omp parallel for simd if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] + weightDecay * param[i];
    float b = momentum * buf[i] + g;
    outBuf[i] = b;
    outParam[i] = param[i] - lr * b;
  }
}

void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n) {
  if (from == to) {
    std::memcpy(out, in, static_cast<size_t>(n) * (from == FloatType::F32 ? 4 : 2));
    return;
  }
  auto load = [&](int64_t i) -> float {
    switch (from) {
    case FloatType::F32:
      return static_cast<const float *>(in)[i];
    case FloatType::BF16:
      return bf16ToF32(static_cast<const uint16_t *>(in)[i]);
    case FloatType::F16:
      return static_cast<float>(static_cast<const _Float16 *>(in)[i]);
    }
    return 0.0f;
  };
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (to) {
    case FloatType::F32:
      static_cast<float *>(out)[i] = v;
      break;
    case FloatType::BF16:
      static_cast<uint16_t *>(out)[i] = f32ToBf16(v);
      break;
    case FloatType::F16:
      static_cast<_Float16 *>(out)[i] = static_cast<_Float16>(v);
      break;
    }
  }
}

double sumOfSquares(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes) {
  double total = 0.0;
  for (size_t t = 0; t < grads.size(); ++t) {
    const float *g = grads[t];
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) if (sizes[t] > 32768)
    for (int64_t i = 0; i < sizes[t]; ++i)
      s += static_cast<double>(g[i]) * g[i];
    total += s;
  }
  return total;
}

float clipByNorm(const std::vector<const float *> &grads, const std::vector<int64_t> &sizes,
                 const std::vector<float *> &outs, float maxNorm, double sumSquares) {
  float norm = static_cast<float>(std::sqrt(sumSquares));
  float coef = std::min(1.0f, maxNorm / (norm + 1e-6f));
  for (size_t t = 0; t < grads.size(); ++t)
    scale(grads[t], outs[t], sizes[t], coef);
  return norm;
}

} // namespace ptc::kernels::cpu
