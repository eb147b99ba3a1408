#include "runtime/io/model_info.h"

#include "runtime/io/durable_file.h"
#include "runtime/io/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

namespace ptc {

StatusOr<ModelInfo> ModelInfo::parse(const std::string &text, const std::string &origin) {
  ModelInfo info;
  if (text.empty())
    return info;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalidArgument(origin, ": the model information is not a JSON object");
  if (auto t = j.find("tied"); t != j.end()) {
    if (!t->is_object())
      return invalidArgument(origin, ": the model information's 'tied' is not an object");
    for (const auto &[alias, param] : t->items()) {
      if (!param.is_string())
        return invalidArgument(origin, ": tied name '", alias, "' does not name a parameter");
      info.tied[alias] = param.get<std::string>();
    }
  }
  if (auto b = j.find("buffers"); b != j.end()) {
    if (!b->is_array())
      return invalidArgument(origin, ": the model information's 'buffers' is not a list");
    for (const auto &name : *b) {
      if (!name.is_string())
        return invalidArgument(origin, ": a buffer of the model information is not a name");
      info.buffers.push_back(name.get<std::string>());
    }
  }
  if (auto h = j.find("hf_config"); h != j.end()) {
    // config.json's text (kept verbatim), or its object.
    if (h->is_string())
      info.hfConfig = h->get<std::string>();
    else if (h->is_object())
      info.hfConfig = h->dump(2) + "\n";
    else
      return invalidArgument(origin, ": the model information's 'hf_config' is neither text nor an object");
  }
  if (auto d = j.find("document_end"); d != j.end()) {
    if (!d->is_number_integer() || d->get<int64_t>() < 0 || d->get<int64_t>() > 2147483647)
      return invalidArgument(origin, ": the model information's 'document_end' is not a token "
                                     "id (an integer in [0, 2^31))");
    info.documentEnd = d->get<int64_t>();
  }
  return info;
}

Status writeModelWeights(const std::string &path, bool directory,
                         const std::vector<NamedTensor> &tensors,
                         std::map<std::string, std::string> metadata, int64_t maxShardBytes,
                         const ModelInfo &info) {
  std::vector<NamedTensor> out = tensors;
  for (const auto &[alias, param] : info.tied) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const NamedTensor &t) { return t.name == param; });
    if (it == tensors.end())
      return invalidArgument("tied name '", alias, "' names '", param,
                             "', which is not a parameter being saved");
    if (std::none_of(tensors.begin(), tensors.end(),
                     [&](const NamedTensor &t) { return t.name == alias; }))
      out.push_back({alias, it->shape, it->data});
  }
  if (!info.buffers.empty())
    metadata[kBuffersMetadataKey] = nlohmann::json(info.buffers).dump();
  if (!directory)
    return writeSafetensors(path, out, metadata);
  PTC_RETURN_IF_ERROR(writeHfDirectory(path, out, metadata, maxShardBytes));
  if (info.hfConfig.empty())
    return Status::ok();
  const std::string config = (std::filesystem::path(path) / "config.json").string();
  return writeFileDurably(config, [&](int fd) {
    return writeAll(fd, info.hfConfig.data(), info.hfConfig.size(), config);
  });
}

} // namespace ptc
