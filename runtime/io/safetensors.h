// safetensors files (8-byte little-endian header length, JSON header with
// dtype/shape/data_offsets per tensor, then raw little-endian data).
#ifndef PTC_RUNTIME_IO_SAFETENSORS_H
#define PTC_RUNTIME_IO_SAFETENSORS_H

#include "runtime/base/status.h"

#include "kernels/common/types.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptc {

/// "[2, 3]": a shape in messages.
std::string shapeString(const std::vector<int64_t> &shape);
/// The element count of `shape`.
/// The product of `shape`, or -1 when it overflows int64 (or a size is negative).
int64_t elementCount(const std::vector<int64_t> &shape);
/// Most elements a tensor of a safetensors file may have (2^48: far above any
/// real tensor, and width x elements stays inside int64).
inline constexpr int64_t kMaxSafetensorsElements = int64_t(1) << 48;

/// A safetensors float dtype ("F32", "BF16", "F16") as a storage type and its
/// width in bytes; false for any other dtype.
bool floatDtype(const std::string &dtype, kernels::FloatType &type, int64_t &width);

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float *data; ///< f32, shape's element count
};

/// Writes f32 tensors to `path` atomically (a temporary file renamed over it),
/// so an existing file is never left half-written.
/// `digest`, when given, receives the file's fnv1a64 (computed over the bytes
/// as they are written).
Status writeSafetensors(const std::string &path, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata = {},
                        uint64_t *digest = nullptr);

/// 64-bit FNV-1a of `bytes`, continuing from `hash` (corruption check of files).
uint64_t fnv1a64(const void *bytes, size_t size, uint64_t hash = 0xCBF29CE484222325ull);

class SafetensorsFile {
public:
  static StatusOr<SafetensorsFile> read(const std::string &path);
  /// The same from bytes in memory; `path` names them in errors.
  static StatusOr<SafetensorsFile> parse(std::vector<uint8_t> bytes, const std::string &path);

  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;
  };
  const std::map<std::string, Entry> &entries() const { return entries_; }

  /// Copies tensor `name` (F32, BF16 or F16) into `out`, which has `shape`
  /// (f32). Errors name the file, the tensor and the mismatch.
  Status copyTo(const std::string &name, const std::vector<int64_t> &shape, float *out) const;
  /// The raw little-endian bytes of tensor `name` (null if absent).
  const uint8_t *bytes(const std::string &name) const;
  const std::string &path() const { return path_; }

private:
  std::string path_;
  std::vector<uint8_t> data_; // bytes after the header
  std::map<std::string, Entry> entries_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_SAFETENSORS_H
