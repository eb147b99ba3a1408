// Helpers shared by the unit tests.
#ifndef PTC_TEST_UNIT_TESTUTIL_H
#define PTC_TEST_UNIT_TESTUTIL_H

#include <random>
#include <vector>

namespace ptc::test {
/// n standard-normal floats from a fixed seed.
inline std::vector<float> randomVector(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}
} // namespace ptc::test

#endif // PTC_TEST_UNIT_TESTUTIL_H
