// Shape arithmetic the CPU kernel families share (not part of kernels.h).
#ifndef PTC_KERNELS_CPU_INTERNAL_H
#define PTC_KERNELS_CPU_INTERNAL_H

#include "kernels/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

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

/// exp(x) for x <= 0 (a softmax's shifted scores, -x^2 / 2), branch-free
/// and inline so that its loops vectorize whole without a library call:
/// 2^n * e^r with n = round(x / ln 2), r in [-ln 2 / 2, ln 2 / 2] and e^r from
/// its degree-6 Taylor polynomial (relative error below 2e-7, as libm's expf
/// within a few ulp); 0 below -87 (where expf underflows too); NaN for NaN
/// (its power of two taken from 0: converting a NaN, or an infinity, to an
/// integer is undefined).
inline float expNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float bounded = x <= 88.0f ? x : 0.0f;
  float n = std::nearbyint(bounded * 1.44269504088896341f);
  float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// max(x[0..n)) in 16 vector lanes (a max reduction does not vectorize
/// without fast-math); -inf for n = 0. NaNs are not propagated.
inline float maxOf(const float *x, int64_t n) {
#ifdef __AVX512F__
  // maxps(a, b) is a > b ? a : b, lane by lane: the loop below, whole.
  __m512 lanes = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    lanes = _mm512_max_ps(_mm512_loadu_ps(x + i), lanes);
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    lanes = _mm512_mask_max_ps(lanes, tail, _mm512_maskz_loadu_ps(tail, x + i), lanes);
  }
  return _mm512_reduce_max_ps(lanes);
#else
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l)
      lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  for (; j < n; ++j)
    lane[0] = x[j] > lane[0] ? x[j] : lane[0];
  return *std::max_element(lane, lane + kLanes);
#endif
}

/// sum_j exp(x[j] - mx) for mx >= max(x) (vectorized, a fixed order).
inline float sumExpShifted(const float *x, int64_t n, float mx) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j)
    sum += expNonPositive(x[j] - mx);
  return sum;
}

/// A view's bf16 storage (the kernels that compute natively on bf16).
/// A view's data as T (the entry checked its element type).
template <typename T> T *as(const TensorView &v) { return static_cast<T *>(v.data); }

/// Runs `body` with a value of storage type `t`: float, or uint16_t for bf16.
template <typename Body> KernelResult onStorage(DType t, Body body) {
  if (t == DType::BF16)
    body(uint16_t{});
  else
    body(float{});
  return KernelResult::ok();
}
/// The same with the call's storage type (its first output's; entries that
/// accept f32OrBf16).
template <typename Body> KernelResult onStorage(const KernelCall &c, Body body) {
  return onStorage(c.output(0).dtype, body);
}

inline const uint16_t *bf16In(const TensorView &v) { return static_cast<const uint16_t *>(v.data); }
inline uint16_t *bf16Out(const TensorView &v) { return static_cast<uint16_t *>(v.data); }

/// The element types of the kernels that compute natively on bf16: every
/// view f32, or every view bf16 (a kernel table entry's `accepts`).
inline bool f32OrBf16Views(const KernelCall &c, bool idInputs) {
  const DType t = c.output(0).dtype;
  if (t != DType::F32 && t != DType::BF16)
    return false;
  for (size_t i = 0; i < c.numInputs; ++i)
    if (c.in[i].dtype != t && !(idInputs && c.in[i].dtype == DType::I32))
      return false;
  for (size_t i = 0; i < c.numOutputs; ++i)
    if (c.out[i].dtype != t)
      return false;
  return true;
}
inline bool f32OrBf16(const KernelCall &c) { return f32OrBf16Views(c, false); }
/// f32OrBf16 for entries whose i32 inputs (ids, positions) are not floats.
inline bool f32OrBf16WithIds(const KernelCall &c) { return f32OrBf16Views(c, true); }

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

/// body(i) for i in [0, n), as one vectorized loop: split over OpenMP's
/// threads when n exceeds `grain`, on this thread otherwise. (An `if` clause
/// on `omp parallel for simd` leaves clang's serial copy of the loop scalar:
/// a 256 x 256 f32 -> bf16 conversion took 43 us that way, 2.6 us vectorized.)
template <typename F> inline void vectorLoop(int64_t n, int64_t grain, F body) {
  if (n > grain) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i)
      body(i);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      body(i);
  }
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

/// Calls f(r, rowOffset(r, shape, st)) for every row r in [0, rows) (rows:
/// the product of all dims but the last), in order within contiguous blocks
/// of rows, one block per thread when `parallel`. The offsets advance like an
/// odometer: one division per block instead of one per dimension and row.
template <typename F>
void forEachRowOffset(int64_t rows, const Shape &shape, const std::vector<int64_t> &st,
                      bool parallel, F f) {
  const int64_t lead = static_cast<int64_t>(shape.size()) - 1;
  auto run = [&](int64_t r0, int64_t r1) {
    if (r0 >= r1)
      return;
    std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(lead, 0)));
    int64_t rest = r0, off = 0;
    for (int64_t d = lead - 1; d >= 0; --d) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
      off += idx[d] * st[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      f(r, off);
      for (int64_t d = lead - 1; d >= 0; --d) {
        off += st[d];
        if (++idx[d] < shape[d])
          break;
        off -= st[d] * shape[d];
        idx[d] = 0;
      }
    }
  };
  const int threads = parallel ? availableThreads() : 1;
  if (threads <= 1) {
    run(0, rows);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t block = (rows + threads - 1) / threads, t = threadIndex();
    run(std::min(rows, t * block), std::min(rows, (t + 1) * block));
  }
}

/// "embedding index 70000 at position 12 is outside [0, 65536)" (the CUDA
/// kernels report the same text).
inline KernelResult badId(const char *what, int64_t id, int64_t pos, int64_t limit) {
  return KernelResult::error(what, " ", id, " at position ", pos, " is outside [0, ", limit, ")");
}

} // namespace ptc::kernels::cpu::internal

#endif // PTC_KERNELS_CPU_INTERNAL_H
