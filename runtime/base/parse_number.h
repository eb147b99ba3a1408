// Strict parsing of numbers given on command lines and in environment
// variables: all of the text must be the number (no trailing characters, no
// empty string), integers must lie in the caller's range and reals must be
// finite. Unlike atoi/atof, "abc" or "1e999" is an error, never 0 or inf.
#ifndef PTC_RUNTIME_BASE_PARSE_NUMBER_H
#define PTC_RUNTIME_BASE_PARSE_NUMBER_H

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace ptc {

/// A decimal integer in [min, max], or nullopt.
inline std::optional<int64_t> parseInteger(const std::string &text, int64_t min = INT64_MIN,
                                           int64_t max = INT64_MAX) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])))
    return std::nullopt;
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end != text.c_str() + text.size() || errno == ERANGE || v < min || v > max)
    return std::nullopt;
  return static_cast<int64_t>(v);
}

/// A finite real number, or nullopt.
inline std::optional<double> parseReal(const std::string &text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])))
    return std::nullopt;
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    return std::nullopt;
  return v;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_PARSE_NUMBER_H
