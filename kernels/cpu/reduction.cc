// CPU kernels: sums, means and maxima over axes, and the max gradient.
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

namespace {
/// The reduction of f32 or bf16 storage (T) into f32 results (a bf16
/// input's sums in f32, as the widened input would give).
template <typename T>
void reduceOf(ReduceOp kind, const T *in, const Shape &is, const std::vector<int64_t> &axes,
              float *out) {
  int64_t n = product(is);
  std::vector<int64_t> st = reducedStrides(is, axes);
  int64_t count = 1;
  for (int64_t a : axes)
    count *= is[a];
  int64_t outN = count ? n / std::max<int64_t>(count, 1) : 0;
  if (is.empty()) {
    out[0] = loadAs(in, 0);
    return;
  }
  std::fill(out, out + outN,
            kind == ReduceOp::Max ? -std::numeric_limits<float>::infinity() : 0.0f);
  int64_t inner = is.back(), rows = n / std::max<int64_t>(inner, 1), ist = st.back();
  if (ist != 0) {
    // The last dimension is kept (a bias gradient's column sums): blocks of
    // columns, each reduced over the rows in order, on many threads when the
    // input is large (every element sees the same additions either way).
    constexpr int64_t kColumns = 64;
    // Each row's output offset, once (not per block of columns); a bias
    // gradient's rows all land on the same output row.
    std::vector<int64_t> rowOut(static_cast<size_t>(rows));
    forEachRowOffset(rows, is, st, /*parallel=*/false,
                     [&](int64_t r, int64_t off) { rowOut[static_cast<size_t>(r)] = off; });
    const bool oneOutputRow =
        std::all_of(rowOut.begin(), rowOut.end(), [&](int64_t o) { return o == rowOut[0]; });
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j0 = 0; j0 < inner; j0 += kColumns) {
      const int64_t j1 = std::min(inner, j0 + kColumns);
      if (oneOutputRow && kind != ReduceOp::Max && j1 - j0 == kColumns) {
        // Column sums in registers over all the rows (the same additions in
        // the same order as below).
        float acc[kColumns];
        float *o = out + rowOut[0] + j0;
#pragma omp simd
        for (int64_t j = 0; j < kColumns; ++j)
          acc[j] = o[j];
        for (int64_t r = 0; r < rows; ++r) {
          const T *x = in + r * inner + j0;
#pragma omp simd
          for (int64_t j = 0; j < kColumns; ++j)
            acc[j] += loadAs(x, j);
        }
#pragma omp simd
        for (int64_t j = 0; j < kColumns; ++j)
          o[j] = acc[j];
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T *x = in + r * inner;
        float *o = out + rowOut[static_cast<size_t>(r)];
        if (kind == ReduceOp::Max) {
          for (int64_t j = j0; j < j1; ++j)
            o[j] = std::max(o[j], loadAs(x, j));
        } else {
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j)
            o[j] += loadAs(x, j);
        }
      }
    }
  } else {
    // The last dimension is reduced: one value per row.
    for (int64_t r = 0; r < rows; ++r) {
      const T *x = in + r * inner;
      float *o = out + rowOffset(r, is, st);
      float v = kind == ReduceOp::Max ? o[0] : 0.0f;
      for (int64_t j = 0; j < inner; ++j)
        v = kind == ReduceOp::Max ? std::max(v, loadAs(x, j)) : v + loadAs(x, j);
      o[0] = kind == ReduceOp::Max ? v : o[0] + v;
    }
  }
  if (kind == ReduceOp::Mean)
    for (int64_t i = 0; i < outN; ++i)
      out[i] /= static_cast<float>(count);
}

} // namespace

void reduce(ReduceOp kind, const float *in, const Shape &is, const std::vector<int64_t> &axes,
            float *out) {
  reduceOf(kind, in, is, axes, out);
}

static void reduceMaxGrad(const float *in, const Shape &is, const std::vector<int64_t> &axes,
                   const float *g, float *out) {
  int64_t n = product(is);
  int64_t count = 1;
  for (int64_t a : axes)
    count *= is[a];
  std::vector<float> mx(static_cast<size_t>(n / std::max<int64_t>(count, 1)));
  reduce(ReduceOp::Max, in, is, axes, mx.data());
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

void reduceInto(ReduceOp kind, const TensorView &in, const std::vector<int64_t> &axes,
                const TensorView &out) {
  if (in.dtype == DType::BF16) {
    std::vector<float> sums(static_cast<size_t>(out.elements));
    reduceOf(kind, bf16In(in), *in.shape, axes, sums.data());
    uint16_t *o = bf16Out(out);
    for (int64_t i = 0; i < out.elements; ++i)
      o[i] = f32ToBf16(sums[static_cast<size_t>(i)]);
  } else {
    reduce(kind, in.f32(), *in.shape, axes, out.f32());
  }
}

void addReductionKernels(KernelTable &t) {
  // f32, or bf16 storage summed in f32 and rounded once (a bias gradient in
  // bf16 plans), without the executor widening the whole input first.
  auto reduceKernel = [](const KernelCall &c) {
    const ReduceOp kind = c.op == OpKind::ReduceSum    ? ReduceOp::Sum
                          : c.op == OpKind::ReduceMean ? ReduceOp::Mean
                                                       : ReduceOp::Max;
    reduceInto(kind, c.input(0), c.attr(attr::Reduction::axes), c.output(0));
    return KernelResult::ok();
  };
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax})
    t.add(op, reduceKernel, internal::f32OrBf16);
  t.add(OpKind::ReduceMaxGrad, [](const KernelCall &c) {
    reduceMaxGrad(c.input(0).f32(), *c.input(0).shape, c.attr(attr::Reduction::axes), c.input(1).f32(),
                  c.output(0).f32());
    return KernelResult::ok();
  });
}

} // namespace ptc::kernels::cpu
