// Checks on names read from files (tensor names in plans and checkpoints):
// what a message, a log or a safetensors header may print as it is.
#ifndef PTC_RUNTIME_BASE_TEXT_H
#define PTC_RUNTIME_BASE_TEXT_H

#include <cstdint>
#include <string>
#include <string_view>

namespace ptc {

/// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
/// points past U+10FFFF) without control characters (C0, DEL, C1; NUL too).
inline bool isPrintableUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        return false;
      ++i;
      continue;
    }
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (len == 0 || c > 0xf4 || i + len > s.size())
      return false;
    uint32_t cp = c & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinOfLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
        (cp >= 0x80 && cp <= 0x9f))
      return false;
    i += len;
  }
  return true;
}

/// `s` with every byte outside printable ASCII written as \xHH, for a
/// message that names a bad name without printing its bytes.
inline std::string escapedForMessage(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_TEXT_H
