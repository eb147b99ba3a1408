// Hugging Face model directories: model.safetensors or an index and shards.

#include "runtime/io/hf_checkpoint.h"

#include "runtime/base/read_file.h"
#include "runtime/io/durable_file.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ptc {

namespace fs = std::filesystem;

namespace {
constexpr const char *kIndexName = "model.safetensors.index.json";

StatusOr<std::shared_ptr<SafetensorsFile>> readShared(const std::string &path) {
  auto file = SafetensorsFile::read(path);
  if (!file.isOk())
    return file.status();
  return std::make_shared<SafetensorsFile>(std::move(*file));
}
} // namespace

StatusOr<WeightSource> WeightSource::open(const std::string &path) {
  WeightSource src;
  src.path_ = path;
  std::error_code ec;
  // One file holds every tensor: a safetensors path, or a directory's model.safetensors.
  auto single = [&](const std::string &file) -> StatusOr<WeightSource> {
    auto read = readShared(file);
    if (!read.isOk())
      return read.status();
    src.files_.push_back(*read);
    for (const auto &[name, entry] : (*read)->entries())
      src.where_[name] = 0;
    return std::move(src);
  };
  if (!fs::is_directory(path, ec))
    return single(path);
  src.directory_ = true;
  fs::path dir(path), index = dir / kIndexName;
  if (!fs::exists(index, ec)) {
    if (!fs::exists(dir / "model.safetensors", ec))
      return error(StatusCode::kNotFound, "weights directory '", path, "' has neither ",
                   kIndexName, " nor model.safetensors");
    return single((dir / "model.safetensors").string());
  }
  StatusOr<std::vector<uint8_t>> indexBytes = readRegularFile(index.string(), "weights index");
  if (!indexBytes.isOk())
    return indexBytes.status();
  std::string text(indexBytes->begin(), indexBytes->end());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    return invalidArgument("index '", index.string(),
                           "' is not JSON with a \"weight_map\" object");
  std::map<std::string, size_t> shardIndex;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return invalidArgument("index '", index.string(), "': tensor '", it.key(),
                             "' maps to no file name");
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return invalidArgument("index '", index.string(), "': tensor '", it.key(),
                             "' maps to '", shard, "', not a file in the directory");
    auto found = shardIndex.find(shard);
    if (found == shardIndex.end()) {
      fs::path shardPath = dir / shard;
      if (!fs::exists(shardPath, ec))
        return error(StatusCode::kNotFound, "index '", index.string(), "' maps tensor '",
                     it.key(), "' to shard '", shard, "', which does not exist");
      auto file = readShared(shardPath.string());
      if (!file.isOk())
        return file.status();
      found = shardIndex.emplace(shard, src.files_.size()).first;
      src.files_.push_back(*file);
    }
    if (!src.files_[found->second]->entries().count(it.key()))
      return invalidArgument("index '", index.string(), "' maps tensor '", it.key(),
                             "' to shard '", shard, "', which does not hold it");
    src.where_[it.key()] = found->second;
  }
  return src;
}

std::optional<std::pair<std::string, std::string>> splitStackedExperts(const std::string &name) {
  const std::string key = "experts.";
  size_t at = name.rfind(key);
  if (at == std::string::npos || (at > 0 && name[at - 1] != '.'))
    return std::nullopt;
  std::string rest = name.substr(at + key.size());
  if (rest.empty() || std::isdigit(static_cast<unsigned char>(rest[0])))
    return std::nullopt;
  return std::make_pair(name.substr(0, at + key.size()), rest);
}

std::string expertName(const std::pair<std::string, std::string> &split, int64_t j) {
  return split.first + std::to_string(j) + "." + split.second;
}

std::vector<std::string> WeightSource::names() const {
  std::vector<std::string> out;
  for (const auto &[name, file] : where_)
    out.push_back(name);
  return out;
}

std::string WeightSource::fileOf(const std::string &name) const {
  auto it = where_.find(name);
  return it == where_.end() ? "" : files_[it->second]->path();
}

Status WeightSource::copyTo(const std::string &name, const std::vector<int64_t> &shape,
                            float *out, std::vector<std::string> *read) const {
  auto it = where_.find(name);
  auto split = splitStackedExperts(name);
  if (it == where_.end() && directory_ && split && !shape.empty() &&
      where_.count(expertName(*split, 0))) {
    // Hugging Face's per-expert tensors, stacked along dimension 0.
    std::vector<int64_t> one(shape.begin() + 1, shape.end());
    int64_t slice = 1;
    for (int64_t d : one)
      slice *= d;
    for (int64_t j = 0; j < shape[0]; ++j) {
      std::string part = expertName(*split, j);
      auto e = where_.find(part);
      if (e == where_.end())
        return error(StatusCode::kNotFound, "weights directory '", path_, "' has no tensor '",
                     part, "' (expert ", j, " of the ", shape[0], " experts of '", name, "')");
      PTC_RETURN_IF_ERROR(files_[e->second]->copyTo(part, one, out + j * slice));
      if (read)
        read->push_back(part);
    }
    return Status::ok();
  }
  if (read)
    read->push_back(name);
  if (it == where_.end()) {
    if (directory_)
      return error(StatusCode::kNotFound, "weights directory '", path_, "' has no tensor '",
                   name, "'");
    return error(StatusCode::kNotFound, "safetensors file '", path_, "' has no tensor '", name,
                 "'");
  }
  return files_[it->second]->copyTo(name, shape, out);
}

Status writeHfDirectory(const std::string &dir, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata,
                        int64_t maxShardBytes) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return invalidArgument("--save '", dir, "': not a directory");
  fs::create_directories(dir, ec);
  if (ec)
    return error(StatusCode::kInternal, "cannot create directory '", dir, "': ", ec.message());
  // Stacked experts as Hugging Face names them: one tensor per expert.
  std::vector<NamedTensor> named;
  for (const NamedTensor &t : tensors) {
    auto split = splitStackedExperts(t.name);
    if (!split || t.shape.size() < 2) {
      named.push_back(t);
      continue;
    }
    std::vector<int64_t> one(t.shape.begin() + 1, t.shape.end());
    int64_t slice = 1;
    for (int64_t d : one)
      slice *= d;
    for (int64_t j = 0; j < t.shape[0]; ++j)
      named.push_back({expertName(*split, j), one, t.data + j * slice});
  }
  // Consecutive tensors fill a shard up to maxShardBytes.
  std::vector<std::vector<NamedTensor>> shards;
  int64_t current = 0, total = 0;
  for (const NamedTensor &t : named) {
    int64_t bytes = 4;
    for (int64_t d : t.shape)
      bytes *= d;
    if (shards.empty() || (current > 0 && current + bytes > maxShardBytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(t);
    current += bytes;
    total += bytes;
  }
  nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    PTC_RETURN_IF_ERROR(writeSafetensors((fs::path(dir) / name).string(), shards[i], metadata));
    for (const NamedTensor &t : shards[i])
      weightMap[t.name] = name;
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weightMap}};
  std::string text = index.dump(2) + "\n";
  std::string indexPath = (fs::path(dir) / kIndexName).string();
  return writeFileDurably(indexPath, [&](int fd) { return writeAll(fd, text.data(), text.size(), indexPath); });
}

} // namespace ptc
