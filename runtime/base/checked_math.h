// Overflow-checked arithmetic on sizes read from untrusted files (plans,
// checkpoints, weight files): each returns std::nullopt instead of wrapping,
// so a caller reports the value that does not fit rather than a product that
// silently became 0 or negative.
#ifndef PTC_RUNTIME_BASE_CHECKED_MATH_H
#define PTC_RUNTIME_BASE_CHECKED_MATH_H

#include <cstdint>
#include <optional>

namespace ptc {

inline std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

inline std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

/// The product of non-negative sizes if it is at most `limit`, else nullopt
/// (a negative factor is nullopt too). Stops at the first factor that takes
/// the running product past the limit, so no intermediate product wraps.
template <typename Range>
std::optional<int64_t> checkedProduct(const Range &factors, int64_t limit = INT64_MAX) {
  int64_t p = 1;
  for (auto f : factors) {
    int64_t v = static_cast<int64_t>(f);
    std::optional<int64_t> next = checkedMul(p, v);
    if (v < 0 || !next || *next > limit)
      return std::nullopt;
    p = *next;
  }
  return p;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_CHECKED_MATH_H
