// Weights in and out as Hugging Face stores them: one safetensors file, or a
// directory holding model.safetensors or a sharded model
// (model.safetensors.index.json, whose weight_map names each tensor's shard,
// plus the shards).
#ifndef PTC_RUNTIME_IO_HF_CHECKPOINT_H
#define PTC_RUNTIME_IO_HF_CHECKPOINT_H

#include "runtime/io/safetensors.h"

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

/// ptc stacks an MoE layer's experts into one tensor along dimension 0
/// (`...experts.w1.weight` [E, out, in]); Hugging Face names each expert
/// (`...experts.{j}.w1.weight` [out, in]). The stacked name's split around
/// "experts.", or nullopt when `name` is not one (the next component a number,
/// or no "experts." in it).
std::optional<std::pair<std::string, std::string>> splitStackedExperts(const std::string &name);
/// Expert j's Hugging Face name of a stacked tensor split by splitStackedExperts.
std::string expertName(const std::pair<std::string, std::string> &split, int64_t j);

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
  /// name the tensor and its file. In a model directory, a stacked expert
  /// tensor missing under its own name is assembled from its experts'
  /// tensors (Hugging Face's `...experts.{j}...`); `read` (optional) gets
  /// the names of the tensors it read.
  Status copyTo(const std::string &name, const std::vector<int64_t> &shape, float *out,
                std::vector<std::string> *read = nullptr) const;

private:
  bool directory_ = false;
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_; // tensor -> files_ index
};

/// Writes `tensors` into directory `dir` (created if missing) in Hugging
/// Face's sharded form (stacked expert tensors as one tensor per expert): shards model-0000i-of-0000N.safetensors of at most
/// `maxShardBytes` each (a larger tensor gets a shard of its own), then
/// model.safetensors.index.json. Every file is written durably; the index,
/// written last, is what a reader follows.
Status writeHfDirectory(const std::string &dir, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata,
                        int64_t maxShardBytes);

} // namespace ptc

#endif // PTC_RUNTIME_IO_HF_CHECKPOINT_H
