// Distributed checkpoint format: metadata, discovery, whole-tensor assembly.

#include "runtime/io/dist_checkpoint.h"

#include "kernels/cpu/kernels.h"
#include "runtime/base/checked_math.h"
#include "runtime/base/read_file.h"
#include "runtime/base/text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ptc {

namespace fs = std::filesystem;

namespace {
/// Whether `s` has non-negative dims and at most 2^40 elements (no overflow).
bool sane(const std::vector<int64_t> &s) {
  return checkedProduct(s, int64_t{1} << 40).has_value();
}

/// The step of "step-00000200", or -1.
int64_t stepOfName(const std::string &name) {
  if (name.size() != 13 || name.compare(0, 5, "step-") != 0)
    return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9')
      return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

/// Whether `name` is a checkpoint being written: ".step-00000200.tmp".
bool isTemporaryName(const std::string &name) {
  return name.size() == 18 && name[0] == '.' && name.compare(14, 4, ".tmp") == 0 &&
         stepOfName(name.substr(1, 13)) >= 0;
}

bool isComplete(const fs::path &stepDir) {
  std::error_code ec;
  return fs::is_regular_file(stepDir / "metadata.json", ec);
}

/// A name the metadata may give a file of the checkpoint's folder: no path,
/// not "." or "..", printable.
bool isPlainFileName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         isPrintableUtf8(name);
}

StatusOr<std::vector<uint8_t>> readBytes(const std::string &path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return error(StatusCode::kNotFound, "checkpoint file '", path, "' is missing");
  return readRegularFile(path, "checkpoint file");
}
} // namespace

std::string checkpointStepName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string modelFingerprint(const std::map<std::string, std::vector<int64_t>> &parameters) {
  std::string text;
  for (const auto &[name, shape] : parameters)
    text += name + shapeString(shape) + ";";
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a64(text.data(), text.size())));
  return hex;
}

std::string checkpointMetadataJson(const CheckpointMetadata &meta) {
  nlohmann::ordered_json j;
  j["format"] = "ptc-distributed-checkpoint";
  j["version"] = 1;
  j["step"] = meta.step;
  j["info"] = meta.info;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto &[name, t] : meta.tensors)
    tensors[name] = {{"kind", t.kind}, {"dtype", "F32"}, {"shape", t.shape}};
  j["tensors"] = tensors;
  nlohmann::ordered_json boxes = nlohmann::ordered_json::array();
  for (const CheckpointBox &b : meta.boxes)
    boxes.push_back({{"tensor", b.tensor}, {"file", b.file}, {"key", b.key},
                     {"offset", b.offset}, {"shape", b.shape}});
  j["boxes"] = boxes;
  j["files"] = meta.files;
  return j.dump(1) + "\n";
}

std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string &dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = stepOfName(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec) && isComplete(it->path()))
      out.emplace_back(step, it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int removeTemporaryCheckpoints(const std::string &dir) {
  std::error_code ec;
  std::vector<fs::path> temporary;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (isTemporaryName(it->path().filename().string()) && it->is_directory(ec))
      temporary.push_back(it->path());
  int removed = 0;
  for (const fs::path &path : temporary)
    removed += fs::remove_all(path, ec) > 0 ? 1 : 0;
  return removed;
}

StatusOr<std::string> findCheckpoint(const std::string &dir,
                                     std::vector<std::string> *incomplete) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return error(StatusCode::kNotFound, "checkpoint directory '", dir, "' does not exist");
  if (isComplete(dir))
    return dir;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (incomplete && (isTemporaryName(name) || (stepOfName(name) >= 0 && !isComplete(it->path()))))
      incomplete->push_back(it->path().string());
  }
  if (incomplete)
    std::sort(incomplete->begin(), incomplete->end());
  // The pointer names the newest; if it is missing or names something
  // incomplete, the newest complete directory is the one.
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && stepOfName(name) >= 0 &&
      isComplete(fs::path(dir) / name))
    return (fs::path(dir) / name).string();
  auto all = listCheckpoints(dir);
  if (all.empty())
    return error(StatusCode::kNotFound, "checkpoint directory '", dir,
                 "' holds no complete checkpoint");
  return all.back().second;
}

namespace {
/// A field that must hold an integer. nlohmann's get<int64_t>() converts a
/// float without a range check (undefined behaviour for 3e23), so the type is
/// checked first.
struct NotAnInteger {
  std::string what;
};
int64_t integerOf(const nlohmann::json &v, const char *field) {
  if (!v.is_number_integer())
    throw NotAnInteger{std::string("'") + field + "' holds " + v.dump() + ", not an integer"};
  return v.get<int64_t>();
}
std::vector<int64_t> integersOf(const nlohmann::json &v, const char *field) {
  if (!v.is_array())
    throw NotAnInteger{std::string("'") + field + "' is not a list of integers"};
  std::vector<int64_t> out;
  for (const nlohmann::json &e : v)
    out.push_back(integerOf(e, field));
  return out;
}
} // namespace

StatusOr<CheckpointReader> CheckpointReader::open(const std::string &stepDir) {
  std::string path = (fs::path(stepDir) / "metadata.json").string();
  auto bytes = readBytes(path);
  if (!bytes.isOk())
    return bytes.status();
  nlohmann::json j = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, false);
  auto bad = [&](const std::string &why) {
    return invalidArgument("checkpoint metadata '", path, "' is corrupt: ", why);
  };
  if (j.is_discarded() || !j.is_object())
    return bad("not JSON");
  // (j.value() would throw on a "format" that is not a string.)
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != "ptc-distributed-checkpoint" ||
      !j.contains("version") || !j["version"].is_number_integer())
    return bad("not a ptc distributed checkpoint");
  if (j["version"].get<int64_t>() != 1)
    return invalidArgument("checkpoint '", stepDir, "' has format version ", j["version"].get<int64_t>(),
                           "; this ptc reads version 1");
  CheckpointReader r;
  CheckpointMetadata &m = r.meta_;
  m.path = stepDir;
  try {
    m.step = integerOf(j.at("step"), "step");
    if (m.step < 0 || m.step > (int64_t{1} << 40))
      return bad("step " + std::to_string(m.step) + " is out of range (0 to 2^40)");
    // A step directory's name says its step: metadata that disagrees was
    // edited or copied into the wrong place, and would resume at a step the
    // run never reached.
    int64_t named = stepOfName(fs::path(stepDir).lexically_normal().filename().string());
    if (named < 0 && fs::path(stepDir).filename().empty())
      named = stepOfName(fs::path(stepDir).parent_path().filename().string());
    if (named >= 0 && named != m.step)
      return bad("its step is " + std::to_string(m.step) + " but its directory is " +
                 checkpointStepName(named));
    for (auto it = j.at("info").begin(); it != j.at("info").end(); ++it)
      m.info[it.key()] = it.value().get<std::string>();
    for (auto it = j.at("tensors").begin(); it != j.at("tensors").end(); ++it) {
      if (!isPrintableUtf8(it.key()))
        return bad("the tensor name '" + escapedForMessage(it.key()) + "' is not printable UTF-8");
      CheckpointTensor t;
      t.kind = it.value().at("kind").get<std::string>();
      t.shape = integersOf(it.value().at("shape"), "shape");
      if (it.value().at("dtype").get<std::string>() != "F32")
        return bad("tensor '" + it.key() + "' is not F32");
      if (!sane(t.shape))
        return bad("tensor '" + it.key() + "' has an invalid shape");
      m.tensors[it.key()] = t;
    }
    for (const auto &b : j.at("boxes")) {
      CheckpointBox box{b.at("tensor").get<std::string>(), b.at("file").get<std::string>(),
                        b.at("key").get<std::string>(), integersOf(b.at("offset"), "offset"),
                        integersOf(b.at("shape"), "shape")};
      auto t = m.tensors.find(box.tensor);
      if (t == m.tensors.end())
        return bad("a box of the unknown tensor '" + box.tensor + "'");
      if (box.offset.size() != t->second.shape.size() || box.shape.size() != box.offset.size() ||
          !sane(box.shape))
        return bad("a box of '" + box.tensor + "' has the wrong rank or shape");
      for (size_t d = 0; d < box.offset.size(); ++d)
        if (box.offset[d] < 0 || box.shape[d] < 0 || box.offset[d] > t->second.shape[d] ||
            box.shape[d] > t->second.shape[d] - box.offset[d])
          return bad("a box of '" + box.tensor + "' lies outside its shape " +
                     shapeString(t->second.shape));
      if (!isPlainFileName(box.file) || !isPrintableUtf8(box.key))
        return bad("a box names the file '" + escapedForMessage(box.file) + "' and key '" +
                   escapedForMessage(box.key) + "'");
      m.boxes.push_back(std::move(box));
    }
    // The files are opened by name in the checkpoint's folder: a path, "..",
    // or control bytes in a name would open something else.
    for (auto it = j.at("files").begin(); it != j.at("files").end(); ++it) {
      if (!isPlainFileName(it.key()))
        return bad("'files' names '" + escapedForMessage(it.key()) +
                   "', which is not a plain file name in the checkpoint's folder");
      m.files[it.key()] = it.value().get<std::string>();
    }
  } catch (const nlohmann::json::exception &e) {
    return bad(e.what());
  } catch (const NotAnInteger &e) {
    return bad(e.what);
  }
  for (const CheckpointBox &b : m.boxes)
    if (!m.files.count(b.file))
      return bad("a box of '" + b.tensor + "' is in '" + b.file + "', which 'files' does not list");
  // Each tensor's boxes cover it exactly: pairwise disjoint, and as many
  // elements as the tensor (two copies of one box over half of it passed a
  // count of covered elements and the other half read as zeros).
  std::map<std::string, std::vector<const CheckpointBox *>> boxesOf;
  for (const CheckpointBox &b : m.boxes)
    boxesOf[b.tensor].push_back(&b);
  for (const auto &[name, t] : m.tensors) {
    std::vector<const CheckpointBox *> &list = boxesOf[name];
    int64_t volume = 0;
    for (const CheckpointBox *b : list)
      if ((volume += elementCount(b->shape)) > elementCount(t.shape))
        break; // (each box lies within the tensor: the sum stays far from overflow)
    if (volume != elementCount(t.shape))
      return bad("the boxes of tensor '" + name + "' hold " + std::to_string(volume) +
                 " elements, but its shape " + shapeString(t.shape) + " has " +
                 std::to_string(elementCount(t.shape)));
    // Overlaps, by a sweep over dimension 0 (boxes starting before one ends).
    std::sort(list.begin(), list.end(), [](const CheckpointBox *a, const CheckpointBox *b) {
      return a->offset.empty() ? false : a->offset[0] < b->offset[0];
    });
    for (size_t i = 0; i < list.size(); ++i)
      for (size_t k = i + 1; k < list.size(); ++k) {
        const CheckpointBox &a = *list[i], &b = *list[k];
        if (!a.offset.empty() && b.offset[0] >= a.offset[0] + a.shape[0])
          break;
        bool overlap = true;
        for (size_t d = 0; d < a.offset.size() && overlap; ++d)
          overlap = a.offset[d] < b.offset[d] + b.shape[d] && b.offset[d] < a.offset[d] + a.shape[d];
        if (overlap && elementCount(a.shape) > 0 && elementCount(b.shape) > 0)
          return bad("two boxes of tensor '" + name + "' overlap: at " + shapeString(a.offset) +
                     " (in '" + a.file + "') and at " + shapeString(b.offset) + " (in '" + b.file + "')");
      }
  }
  return r;
}

Status CheckpointReader::verify() {
  for (const auto &[name, digest] : meta_.files) {
    auto f = file(name);
    if (!f.isOk())
      return f.status();
  }
  for (const auto &[name, t] : meta_.tensors) {
    std::vector<float> whole(static_cast<size_t>(elementCount(t.shape)));
    PTC_RETURN_IF_ERROR(readWhole(name, whole.data()));
  }
  return Status::ok();
}

StatusOr<SafetensorsFile *> CheckpointReader::file(const std::string &name) {
  auto &slot = open_[name];
  if (slot)
    return slot.get();
  std::string path = (fs::path(meta_.path) / name).string();
  auto bytes = readBytes(path);
  if (!bytes.isOk())
    return bytes.status();
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a64(bytes->data(), bytes->size())));
  if (meta_.files[name] != hex)
    return error(StatusCode::kDataLoss, "checkpoint file '", path, "' is corrupt: its digest is ",
                 hex, ", the metadata says ", meta_.files[name]);
  auto parsed = SafetensorsFile::parse(std::move(*bytes), path);
  if (!parsed.isOk())
    return parsed.status();
  slot = std::make_shared<SafetensorsFile>(std::move(*parsed));
  return slot.get();
}

Status CheckpointReader::readWhole(const std::string &name, float *out) {
  auto t = meta_.tensors.find(name);
  if (t == meta_.tensors.end())
    return error(StatusCode::kNotFound, "checkpoint '", meta_.path, "' has no tensor '", name, "'");
  const std::vector<int64_t> &shape = t->second.shape;
  return readLocal(name, {Box{std::vector<int64_t>(shape.size(), 0),
                              std::vector<int64_t>(shape.size(), 0), shape}},
                   shape, out);
}

Status CheckpointReader::readLocal(const std::string &name, const std::vector<Box> &boxes,
                                   const std::vector<int64_t> &localShape, float *out) {
  if (!meta_.tensors.count(name))
    return error(StatusCode::kNotFound, "checkpoint '", meta_.path, "' has no tensor '", name, "'");
  int64_t wanted = 0, covered = 0;
  for (const Box &want : boxes)
    wanted += elementCount(want.shape);
  for (const CheckpointBox &b : meta_.boxes) {
    if (b.tensor != name)
      continue;
    std::vector<float> data; // the checkpoint box, read once if any wanted box overlaps it
    for (const Box &want : boxes) {
      // The intersection of the checkpoint box and the wanted one, per dimension.
      std::vector<int64_t> lo(b.offset.size()), len(b.offset.size());
      bool empty = false;
      for (size_t d = 0; d < b.offset.size(); ++d) {
        lo[d] = std::max(b.offset[d], want.wholeOffset[d]);
        int64_t hi = std::min(b.offset[d] + b.shape[d], want.wholeOffset[d] + want.shape[d]);
        len[d] = hi - lo[d];
        empty |= len[d] <= 0;
      }
      if (empty && !b.offset.empty())
        continue;
      if (data.empty()) {
        auto f = file(b.file);
        if (!f.isOk())
          return f.status();
        // The entry must hold exactly the box before anything is allocated for it.
        auto entry = (*f)->entries().find(b.key);
        if (entry == (*f)->entries().end() || entry->second.shape != b.shape)
          return invalidArgument("checkpoint file '", (fs::path(meta_.path) / b.file).string(),
                                 "' lacks the box '", b.key, "' of tensor '", name,
                                 "' the metadata lists");
        data.resize(static_cast<size_t>(elementCount(b.shape)));
        PTC_RETURN_IF_ERROR((*f)->copyTo(b.key, b.shape, data.data()));
      }
      std::vector<int64_t> src(lo.size()), dst(lo.size());
      for (size_t d = 0; d < lo.size(); ++d) {
        src[d] = lo[d] - b.offset[d];
        dst[d] = want.localOffset[d] + lo[d] - want.wholeOffset[d];
      }
      kernels::cpu::copyBox(data.data(), b.shape, src, out, localShape, dst, len, sizeof(float));
      covered += elementCount(len);
    }
  }
  if (covered != wanted)
    return invalidArgument("checkpoint '", meta_.path, "': the boxes of tensor '", name,
                           "' cover ", covered, " of the ", wanted, " elements needed");
  return Status::ok();
}

} // namespace ptc
