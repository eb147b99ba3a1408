// CPU kernels: transpose, slices, boxes, padding and concatenation on any element size.
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
  forEachRowOffset(rows, os, st, n > 32768, [&](int64_t r, int64_t base) {
    if (contiguous) {
      std::memcpy(dst + r * inner * elemBytes, src + base * elemBytes,
                  static_cast<size_t>(inner * elemBytes));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(dst + (r * inner + j) * elemBytes, src + (base + j * st.back()) * elemBytes,
                    static_cast<size_t>(elemBytes));
    }
  });
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
  forEachRowOffset(rows, smallShape, bigSt, n > 32768, [&](int64_t r, int64_t rowOff) {
    char *bp = b + (start + rowOff) * elemBytes, *sp = s + r * inner * elemBytes;
    if (toSmall)
      std::memcpy(sp, bp, static_cast<size_t>(inner * elemBytes));
    else
      std::memcpy(bp, sp, static_cast<size_t>(inner * elemBytes));
  });
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

static void pad(const float *in, const Shape &is, float *out, const Shape &os,
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

void addLayoutKernels(KernelTable &t) {
  // Byte moves: on the stored element type.
  t.add(
      OpKind::Transpose,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0);
        transpose(in.data, *in.shape, c.output(0).data, c.attr(attr::Permutation::permutation),
                  dtypeBytes(in.dtype));
        return KernelResult::ok();
      },
      anyTypes);
  t.add(
      OpKind::Slice,
      [](const KernelCall &c) {
        const TensorView &in = c.input(0), &out = c.output(0);
        sliceCopy(in.data, *in.shape, out.data, *out.shape, c.attr(attr::Offsets::offsets), dtypeBytes(in.dtype),
                  /*toSmall=*/true);
        return KernelResult::ok();
      },
      anyTypes);
  t.add(
      OpKind::Concat,
      [](const KernelCall &c) {
        std::vector<const void *> ins;
        std::vector<Shape> shapes;
        for (size_t i = 0; i < c.numInputs; ++i) {
          ins.push_back(c.in[i].data);
          shapes.push_back(*c.in[i].shape);
        }
        concat(ins, shapes, c.output(0).data, c.attr(attr::Axis::axis),
               dtypeBytes(c.output(0).dtype));
        return KernelResult::ok();
      },
      anyTypes);
  t.add(OpKind::Pad, [](const KernelCall &c) {
    pad(c.input(0).f32(), *c.input(0).shape, c.output(0).f32(), *c.output(0).shape,
        c.attr(attr::Offsets::offsets));
    return KernelResult::ok();
  });
}

} // namespace ptc::kernels::cpu
