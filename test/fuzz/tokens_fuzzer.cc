// libFuzzer target: any bytes as a token file (memory-mapped; headerless
// uint16 or ptc's header and uint16/uint32 ids), read in the standard and the
// shuffled order and in a blend, and as a Hugging Face index beside a shard.
#include "runtime/io/hf_checkpoint.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/token_data.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {
const std::string &directory() {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path() /
                    ("ptc-fuzz-tokens-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::vector<float> a(6, 0.5f);
    (void)ptc::writeSafetensors(d + "/model-00001-of-00001.safetensors", {{"w", {2, 3}, a.data()}});
    return d;
  }();
  return dir;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string &dir = directory();
  std::string tokens = dir + "/tokens.bin";
  {
    std::ofstream out(tokens, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  }
  for (bool shuffle : {false, true}) {
    auto loaded = ptc::TokenData::load(std::vector<std::string>{tokens, tokens}, /*seq=*/4,
                                       /*vocab=*/200, shuffle ? std::optional<uint64_t>(9) : std::nullopt);
    if (!loaded.isOk())
      continue;
    std::vector<int32_t> x(3 * 4), y(3 * 4);
    for (int64_t step = 0; step < 4; ++step)
      (void)loaded->fillBatch(step * 1000003, 3, 4, 0, 3, x.data(), y.data());
  }
  // A blend of the bytes with themselves (the first steps: the blend order is
  // walked from the start).
  auto blend = ptc::TokenData::loadBlend({{2.0, {tokens}}, {1.0, {tokens, tokens}}}, /*seq=*/4,
                                         /*vocab=*/200, std::optional<uint64_t>(5));
  if (blend.isOk()) {
    std::vector<int32_t> x(3 * 4), y(3 * 4);
    for (int64_t step = 0; step < 4; ++step)
      (void)blend->fillBatch(step, 3, 4, 0, 3, x.data(), y.data());
  }
  // The same bytes as model.safetensors.index.json.
  {
    std::ofstream out(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  }
  auto weights = ptc::WeightSource::open(dir);
  if (weights.isOk())
    for (const std::string &name : weights->names()) {
      std::vector<float> out(6);
      (void)weights->copyTo(name, {2, 3}, out.data());
    }
  return 0;
}
