// Shape arithmetic the CPU kernel families share (not part of kernels.h).
#ifndef PTC_KERNELS_CPU_INTERNAL_H
#define PTC_KERNELS_CPU_INTERNAL_H

#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu::internal {

/// Element i of f32 or bf16 (uint16_t) storage as f32, and a f32 result
/// stored (bf16: rounded to nearest even): the loops of kernels that
/// compute natively on bf16 tensors.
inline float loadAs(const float *p, int64_t i) { return p[i]; }
inline float loadAs(const uint16_t *p, int64_t i) { return bf16ToF32(p[i]); }
inline void storeAs(float *p, int64_t i, float v) { p[i] = v; }
inline void storeAs(uint16_t *p, int64_t i, float v) { p[i] = f32ToBf16(v); }

/// The element types of the kernels that compute natively on bf16: every
/// view f32, or every view bf16 (a kernel table entry's `accepts`).
inline bool f32OrBf16(const KernelCall &c) {
  const DType t = c.output(0).dtype;
  if (t != DType::F32 && t != DType::BF16)
    return false;
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.in[i].dtype != t)
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.out[i].dtype != t)
      return false;
  return true;
}

inline int64_t product(const Shape &s, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  const size_t end = std::min(to, s.size());
  for (size_t i = from; i < end; ++i)
    p *= s[i];
  return p;
}

/// Row-major strides.
inline std::vector<int64_t> stridesOf(const Shape &s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * s[i + 1];
  return st;
}

/// Strides of `in` seen through broadcasting to `out` (0 on stretched dims).
inline std::vector<int64_t> broadcastStrides(const Shape &in, const Shape &out) {
  std::vector<int64_t> st(out.size(), 0);
  std::vector<int64_t> inSt = stridesOf(in);
  size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    st[lead + i] = in[i] == 1 && out[lead + i] != 1 ? 0 : inSt[i];
  return st;
}

/// Threads a kernel may start here: OpenMP's count, or 1 inside a parallel
/// region (no nested teams).
inline int availableThreads() {
#ifdef _OPENMP
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

/// This thread's index in the enclosing parallel region (0 outside one).
inline int threadIndex() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Offset of row `row` (index over all dims but the last) with strides `st`.
inline int64_t rowOffset(int64_t row, const Shape &shape, const std::vector<int64_t> &st) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    off += (row % shape[d]) * st[d];
    row /= shape[d];
  }
  return off;
}

/// "embedding index 70000 at position 12 is outside [0, 65536)" (the CUDA
/// kernels report the same text).
inline KernelResult badId(const char *what, int64_t id, int64_t pos, int64_t limit) {
  return KernelResult::error(what, " ", id, " at position ", pos, " is outside [0, ", limit, ")");
}

} // namespace ptc::kernels::cpu::internal

#endif // PTC_KERNELS_CPU_INTERNAL_H
