// CPU kernels: broadcasting arithmetic, scaling, copies and float conversions.
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
/// out = f(a, b) with numpy broadcasting, on f32 or bf16 storage (T), in f32
/// registers (one rounding per bf16 result, as widening would give).
template <typename T, typename F>
void binaryLoop(F f, const T *a, const Shape &as, const T *b, const Shape &bs, T *out,
                const Shape &os) {
  int64_t n = product(os);
  if (as == os && bs == os) {
    vectorLoop(n, 32768, [&](int64_t i) { storeAs(out, i, f(loadAs(a, i), loadAs(b, i))); });
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
    const T *pa = a + rowOffset(r, shape, sa);
    const T *pb = b + rowOffset(r, shape, sb);
    T *po = out + r * inner;
    if (ia == 1 && ib == 1) {
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j)
        storeAs(po, j, f(loadAs(pa, j), loadAs(pb, j)));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        storeAs(po, j, f(loadAs(pa, j * ia), loadAs(pb, j * ib)));
    }
  }
}

template <typename T>
void binaryOf(BinaryOp kind, const T *a, const Shape &as, const T *b, const Shape &bs, T *out,
              const Shape &os) {
  switch (kind) {
  case BinaryOp::Add:
    return binaryLoop([](float x, float y) { return x + y; }, a, as, b, bs, out, os);
  case BinaryOp::Sub:
    return binaryLoop([](float x, float y) { return x - y; }, a, as, b, bs, out, os);
  case BinaryOp::Mul:
    return binaryLoop([](float x, float y) { return x * y; }, a, as, b, bs, out, os);
  case BinaryOp::Div:
    return binaryLoop([](float x, float y) { return x / y; }, a, as, b, bs, out, os);
  }
}

template <typename T>
void scaleOf(const T *in, T *out, int64_t n, float factor) {
  vectorLoop(n, 32768, [&](int64_t i) { storeAs(out, i, loadAs(in, i) * factor); });
}

} // namespace

void binary(BinaryOp kind, const float *a, const Shape &as, const float *b, const Shape &bs,
            float *out, const Shape &os) {
  binaryOf(kind, a, as, b, bs, out, os);
}

static void broadcastTo(const float *in, const Shape &is, float *out, const Shape &os) {
  binaryLoop([](float x, float) { return x; }, in, is, in, is, out, os);
}

void scale(const float *in, float *out, int64_t n, float factor) { scaleOf(in, out, n, factor); }



void copy(const void *in, void *out, int64_t bytes) {
  if (in != out)
    std::memmove(out, in, static_cast<size_t>(bytes));
}

void convertFloat(const void *in, FloatType from, void *out, FloatType to, int64_t n) {
  if (from == to) {
    std::memcpy(out, in, static_cast<size_t>(n) * (from == FloatType::F32 ? 4 : 2));
    return;
  }
  // One loop per pair, without branches inside, so that each vectorizes (the
  // mixed-precision executor converts every low-precision operand and result
  // of the ops without a native low-precision kernel).
  constexpr int64_t kGrain = 65536;
  const bool parallel = n > kGrain;
  if (from == FloatType::BF16 && to == FloatType::F32) {
    const uint16_t *src = static_cast<const uint16_t *>(in);
    float *dst = static_cast<float *>(out);
    vectorLoop(n, kGrain, [&](int64_t i) { dst[i] = bf16ToF32(src[i]); });
    return;
  }
  if (from == FloatType::F32 && to == FloatType::BF16) {
    const float *src = static_cast<const float *>(in);
    uint16_t *dst = static_cast<uint16_t *>(out);
    vectorLoop(n, kGrain, [&](int64_t i) { dst[i] = f32ToBf16(src[i]); });
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
  if (to == FloatType::F32) {
    float *dst = static_cast<float *>(out);
#pragma omp parallel for if (parallel)
    for (int64_t i = 0; i < n; ++i)
      dst[i] = load(i);
  } else if (to == FloatType::F16) {
    _Float16 *dst = static_cast<_Float16 *>(out);
#pragma omp parallel for if (parallel)
    for (int64_t i = 0; i < n; ++i)
      dst[i] = static_cast<_Float16>(load(i));
  } else {
    uint16_t *dst = static_cast<uint16_t *>(out);
#pragma omp parallel for if (parallel)
    for (int64_t i = 0; i < n; ++i)
      dst[i] = f32ToBf16(load(i));
  }
}

void addArithmeticKernels(KernelTable &t) {
  // Arithmetic computes natively on bf16 storage (f32 math).
  auto binaryKernel = [](const KernelCall &c) {
    static constexpr BinaryOp kOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
    const BinaryOp kind = kOps[static_cast<int>(c.op) - static_cast<int>(OpKind::Add)];
    const TensorView &a = c.input(0), &b = c.input(1), &out = c.output(0);
    if (out.dtype == DType::BF16)
      binaryOf(kind, bf16In(a), *a.shape, bf16In(b), *b.shape, bf16Out(out), *out.shape);
    else
      binaryOf(kind, a.f32(), *a.shape, b.f32(), *b.shape, out.f32(), *out.shape);
    return KernelResult::ok();
  };
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div})
    t.add(op, binaryKernel, f32OrBf16);
  // out += in (a micro-batch's contribution to a sum).
  t.add(OpKind::MicrobatchSum, [](const KernelCall &c) {
    const TensorView &in = c.input(0), &out = c.output(0);
    binary(BinaryOp::Add, out.f32(), *out.shape, in.f32(), *in.shape, out.f32(), *out.shape);
    return KernelResult::ok();
  });
  t.add(OpKind::Broadcast, [](const KernelCall &c) {
    broadcastTo(c.input(0).f32(), *c.input(0).shape, c.output(0).f32(), *c.output(0).shape);
    return KernelResult::ok();
  });
  t.add(
      OpKind::Scale,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0), &out = c.output(0);
        if (out.dtype == DType::BF16)
          scaleOf(bf16In(in), bf16Out(out), in.elements, c.attr(attr::Scale::factor));
        else
          scaleOf(in.f32(), out.f32(), in.elements, c.attr(attr::Scale::factor));
        return KernelResult::ok();
      },
      f32OrBf16);
  // Byte moves and conversions run on the stored types.
  t.add(
      OpKind::Reshape,
      [](const KernelCall &c) {
        copy(c.input(0).data, c.output(0).data, c.input(0).bytes());
        return KernelResult::ok();
      },
      anyTypes);
  t.add(
      OpKind::Convert,
      [](const KernelCall &c) {
        convertFloat(c.input(0).data, floatTypeOf(c.input(0).dtype), c.output(0).data,
                     floatTypeOf(c.output(0).dtype), c.input(0).elements);
        return KernelResult::ok();
      },
      anyTypes);
}

} // namespace ptc::kernels::cpu
