// safetensors reading and writing (header parsed with nlohmann::json).

#include "runtime/io/safetensors.h"

#include "runtime/base/checked_math.h"
#include "runtime/base/read_file.h"
#include "runtime/base/text.h"

#include "runtime/io/durable_file.h"

#include "kernels/cpu/kernels.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ptc {

std::string shapeString(const std::vector<int64_t> &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t elementCount(const std::vector<int64_t> &shape) {
  return checkedProduct(shape).value_or(-1);
}

bool floatDtype(const std::string &dtype, kernels::FloatType &type, int64_t &width) {
  if (dtype == "F32")
    type = kernels::FloatType::F32, width = 4;
  else if (dtype == "BF16")
    type = kernels::FloatType::BF16, width = 2;
  else if (dtype == "F16")
    type = kernels::FloatType::F16, width = 2;
  else
    return false;
  return true;
}

uint64_t fnv1a64(const void *bytes, size_t size, uint64_t hash) {
  const auto *p = static_cast<const uint8_t *>(bytes);
  for (size_t i = 0; i < size; ++i)
    hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

Status writeSafetensors(const std::string &path, const std::vector<NamedTensor> &tensors,
                        const std::map<std::string, std::string> &metadata, uint64_t *digest) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const NamedTensor &t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape)
      n *= d;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * n}}};
    offset += 4 * n;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0)
    text += ' ';
  uint64_t hash = fnv1a64(nullptr, 0);
  auto put = [&](int fd, const void *bytes, size_t size) {
    if (digest)
      hash = fnv1a64(bytes, size, hash);
    return writeAll(fd, bytes, size, path);
  };
  Status s = writeFileDurably(path, [&](int fd) -> Status {
    uint64_t len = text.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i)
      le[i] = static_cast<unsigned char>(len >> (8 * i));
    PTC_RETURN_IF_ERROR(put(fd, le, 8));
    PTC_RETURN_IF_ERROR(put(fd, text.data(), text.size()));
    for (const NamedTensor &t : tensors)
      PTC_RETURN_IF_ERROR(put(fd, t.data, static_cast<size_t>(4 * elementCount(t.shape))));
    return Status::ok();
  });
  if (s.isOk() && digest)
    *digest = hash;
  return s;
}

StatusOr<SafetensorsFile> SafetensorsFile::read(const std::string &path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return invalidArgument("safetensors file '", path, "' is a directory");
  StatusOr<std::vector<uint8_t>> bytes = readRegularFile(path, "safetensors file");
  if (!bytes.isOk())
    return bytes.status();
  return parse(std::move(*bytes), path);
}

StatusOr<SafetensorsFile> SafetensorsFile::parse(std::vector<uint8_t> bytes,
                                                 const std::string &path) {
  auto bad = [&](const auto &...parts) {
    return error(StatusCode::kDataLoss, "safetensors file '", path, "': ", parts...);
  };
  if (bytes.size() < 8)
    return bad("shorter than its 8-byte header length");
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i)
    len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (len > bytes.size() - 8)
    return bad("header length ", len, " exceeds the file size ", bytes.size());
  SafetensorsFile file;
  file.path_ = path;
  // A tensor named twice would silently read as its last entry: refused.
  std::set<std::string> keys;
  std::string duplicate;
  nlohmann::json::parser_callback_t noDuplicateKeys = [&](int depth, nlohmann::json::parse_event_t event,
                                                          nlohmann::json &parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(len),
                                                noDuplicateKeys, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return bad("header is not a JSON object");
  if (!duplicate.empty())
    return bad("the header names '", escapedForMessage(duplicate), "' twice");
  file.data_.assign(bytes.begin() + 8 + static_cast<int64_t>(len), bytes.end());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      continue;
    const nlohmann::json &v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return bad("entry '", it.key(), "' lacks dtype, shape or data_offsets");
    Entry e;
    e.dtype = v["dtype"].get<std::string>();
    for (const auto &d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return bad("entry '", it.key(), "' has an invalid shape");
      e.shape.push_back(d.get<int64_t>());
    }
    if (!checkedProduct(e.shape, kMaxSafetensorsElements))
      return bad("entry '", escapedForMessage(it.key()), "' has a shape ", shapeString(e.shape),
                 " of more than ", kMaxSafetensorsElements, " elements");
    if (!isPrintableUtf8(it.key()))
      return bad("a tensor name, '", escapedForMessage(it.key()), "', is not printable UTF-8");
    if (!v["data_offsets"][0].is_number_integer() || !v["data_offsets"][1].is_number_integer())
      return bad("entry '", it.key(), "' has invalid data_offsets");
    e.begin = v["data_offsets"][0].get<int64_t>();
    e.end = v["data_offsets"][1].get<int64_t>();
    if (e.begin < 0 || e.end < e.begin || e.end > static_cast<int64_t>(file.data_.size()))
      return bad("entry '", it.key(), "' data [", e.begin, ", ", e.end, ") lies outside the ",
                 file.data_.size(), "-byte data section");
    kernels::FloatType type;
    int64_t width = 0;
    if (floatDtype(e.dtype, type, width) && e.end - e.begin != width * elementCount(e.shape))
      return bad("entry '", escapedForMessage(it.key()), "' holds ", e.end - e.begin, " bytes, but ",
                 e.dtype, " of shape ", shapeString(e.shape), " is ", width * elementCount(e.shape));
    file.entries_[it.key()] = e;
  }
  // The data section is the entries back to back, as the format requires:
  // no entry overlaps another, no gap, nothing after the last.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto &[name, e] : file.entries_)
    ranges.push_back({e.begin, e.end});
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto &[begin, end] : ranges) {
    if (begin != at)
      return bad(begin < at ? "two entries overlap in the data section at byte " : "the data section has a gap at byte ",
                 std::min(begin, at));
    at = end;
  }
  if (at != static_cast<int64_t>(file.data_.size()))
    return bad("the data section has ", static_cast<int64_t>(file.data_.size()) - at,
               " bytes after its last entry");
  return file;
}

Status SafetensorsFile::copyTo(const std::string &name, const std::vector<int64_t> &shape,
                               float *out) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    return error(StatusCode::kNotFound, "safetensors file '", path_, "' has no tensor '", name,
                 "'");
  const Entry &e = it->second;
  kernels::FloatType from;
  int64_t width;
  if (!floatDtype(e.dtype, from, width))
    return invalidArgument("safetensors file '", path_, "': tensor '", name, "' is ", e.dtype,
                           ", expected F32, BF16 or F16");
  if (e.shape != shape)
    return invalidArgument("safetensors file '", path_, "': tensor '", name, "' has shape ",
                           shapeString(e.shape), ", the model expects ", shapeString(shape));
  // e.shape == shape, bounded by the parser: n * width does not overflow.
  int64_t n = elementCount(shape);
  if (e.end - e.begin != width * n)
    return invalidArgument("safetensors file '", path_, "': tensor '", name, "' holds ",
                           e.end - e.begin, " bytes, ", e.dtype, " shape ", shapeString(shape),
                           " needs ", width * n);
  // bf16 and f16 widen exactly.
  kernels::cpu::convertFloat(data_.data() + e.begin, from, out, kernels::FloatType::F32, n);
  return Status::ok();
}

const uint8_t *SafetensorsFile::bytes(const std::string &name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : data_.data() + it->second.begin;
}

} // namespace ptc
