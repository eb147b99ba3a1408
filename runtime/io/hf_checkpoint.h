// Weights in and out as Hugging Face stores them: one safetensors file, or a
// directory holding model.safetensors or a sharded model
// (model.safetensors.index.json, whose weight_map names each tensor's shard,
// plus the shards).
#ifndef PTC_RUNTIME_IO_HF_CHECKPOINT_H
#define PTC_RUNTIME_IO_HF_CHECKPOINT_H

#include "runtime/io/safetensors.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

class WeightSource {
public:
  /// `path`: a safetensors file or a Hugging Face model directory. A
  /// directory's index must name existing shards that hold what it maps.
  static StatusOr<WeightSource> open(const std::string &path);

  bool isDirectory() const { return directory_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  /// The file that holds `name` (for messages), or "".
  std::string fileOf(const std::string &name) const;
  /// Copies `name` (F32, BF16 or F16) into `out` of `shape` (f32); errors
  /// name the tensor and its file.
  Status copyTo(const std::string &name, const std::vector<int64_t> &shape, float *out) const;

private:
  bool directory_ = false;
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_; // tensor -> files_ index
};

/// Writes `tensors` into directory `dir` (created if missing) in Hugging
/// Face's sharded form: shards model-0000i-of-0000N.safetensors of at most
/// `maxShardBytes` each (a larger tensor gets a shard of its own), then
/// model.safetensors.index.json. Every file is written durably; the index,
/// written last, is what a reader follows.
Status writeHfDirectory(const std::string &dir, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata,
                        int64_t maxShardBytes);

} // namespace ptc

#endif // PTC_RUNTIME_IO_HF_CHECKPOINT_H
