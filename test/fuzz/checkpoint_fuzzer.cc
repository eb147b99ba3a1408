// libFuzzer target: any bytes as a distributed checkpoint's metadata.json
// beside a real shard, then every tensor it lists read whole and as a box.
#include "runtime/io/dist_checkpoint.h"
#include "runtime/io/safetensors.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

namespace {
/// A checkpoint directory with one real shard ("rank-00000.safetensors").
const std::string &directory() {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path() /
                    ("ptc-fuzz-ckpt-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::vector<float> a(12, 1.5f), b(4, -2.0f);
    (void)ptc::writeSafetensors(d + "/rank-00000.safetensors",
                                {{"w", {3, 4}, a.data()}, {"w#1", {2, 2}, b.data()}});
    return d;
  }();
  return dir;
}
} // namespace

/// The shard's digest as the metadata writes it.
const std::string &shardDigest() {
  static const std::string digest = [] {
    std::ifstream in(directory() + "/rank-00000.safetensors", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(ptc::fnv1a64(bytes.data(), bytes.size())));
    return std::string(hex);
  }();
  return digest;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string &dir = directory();
  // "@@@@@@@@@@@@@@@@" in the input stands for the real shard's digest, so that
  // mutations get past the digest check to the reads the metadata directs.
  std::string text(reinterpret_cast<const char *>(data), size);
  for (size_t at = text.find("@@@@@@@@@@@@@@@@"); at != std::string::npos;
       at = text.find("@@@@@@@@@@@@@@@@", at + 16))
    text.replace(at, 16, shardDigest());
  {
    std::ofstream out(dir + "/metadata.json", std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  auto reader = ptc::CheckpointReader::open(dir);
  if (!reader.isOk())
    return 0;
  for (const auto &[name, t] : reader->metadata().tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape)
      n = d > 0 && n <= (int64_t{1} << 20) / d ? n * d : (int64_t{1} << 21);
    if (n > (int64_t{1} << 20))
      continue;
    std::vector<float> whole(static_cast<size_t>(n));
    (void)reader->readWhole(name, whole.data());
    if (!t.shape.empty()) { // the first half of the first dimension, as a rank's box
      std::vector<int64_t> box = t.shape;
      box[0] = (box[0] + 1) / 2;
      (void)reader->readLocal(name, {{std::vector<int64_t>(box.size(), 0),
                                      std::vector<int64_t>(box.size(), 0), box}},
                              box, whole.data());
    }
  }
  return 0;
}
