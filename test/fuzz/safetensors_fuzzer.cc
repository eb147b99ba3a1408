// libFuzzer target: any bytes as a safetensors file, then every tensor it
// lists copied out at its declared shape.
#include "runtime/io/safetensors.h"

#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto file = ptc::SafetensorsFile::parse(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
  if (!file.isOk())
    return 0;
  for (const auto &[name, entry] : file->entries()) {
    int64_t n = 1;
    for (int64_t d : entry.shape)
      n = d > 0 && n <= (int64_t{1} << 24) / d ? n * d : (int64_t{1} << 25);
    if (n > (int64_t{1} << 24))
      continue;
    std::vector<float> out(static_cast<size_t>(n));
    (void)file->copyTo(name, entry.shape, out.data());
  }
  return 0;
}
