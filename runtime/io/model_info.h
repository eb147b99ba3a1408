// What saving a model's weights for their users needs besides the parameters
// the plan holds (the plan's `model_info`, the checkpoint's "model_info"):
// names tied to a parameter (a module's state_dict lists the tied LM head
// under both names), the buffers the module registers (not parameters: a
// strict load_state_dict expects them), and Hugging Face's config.json.
#ifndef PTC_RUNTIME_IO_MODEL_INFO_H
#define PTC_RUNTIME_IO_MODEL_INFO_H

#include "runtime/base/status.h"
#include "runtime/io/safetensors.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptc {

struct ModelInfo {
  std::map<std::string, std::string> tied; ///< alias -> the parameter it names
  std::vector<std::string> buffers;        ///< the module's buffers (not in ptc's files)
  std::string hfConfig;                    ///< config.json's text, or "" (none)
  /// Packed documents: the token id that ends a document (the model's
  /// 'positions' input restarts after it), or -1 (one stream).
  int64_t documentEnd = -1;

  /// Parses the JSON text (`{"tied": {...}, "buffers": [...], "hf_config": TEXT or
  /// {...}, "document_end": ID}`, each optional; "" is an empty ModelInfo).
  /// `origin` names it in errors.
  static StatusOr<ModelInfo> parse(const std::string &json, const std::string &origin);
};

/// Metadata key of a weights file listing the module's buffers (JSON list).
inline constexpr const char *kBuffersMetadataKey = "ptc.buffers";

/// Writes parameters `tensors` to `path` (a safetensors file, or a folder in
/// Hugging Face's sharded form when `directory`) with what `info` adds: each
/// tied alias as a tensor of its own (the parameter's values), the buffers
/// listed in the metadata, and in a folder config.json.
Status writeModelWeights(const std::string &path, bool directory,
                         const std::vector<NamedTensor> &tensors,
                         std::map<std::string, std::string> metadata, int64_t maxShardBytes,
                         const ModelInfo &info);

} // namespace ptc

#endif // PTC_RUNTIME_IO_MODEL_INFO_H
