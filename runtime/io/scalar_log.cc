#include "runtime/io/scalar_log.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace ptc {
namespace {
std::array<uint32_t, 256> makeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1; // reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}

// Protocol-buffer encoding of the three messages TensorBoard's scalars need.
void putVarint(std::string &out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void putFixed(std::string &out, const void *p, size_t n) { out.append(static_cast<const char *>(p), n); }
void putBytesField(std::string &out, int field, const std::string &bytes) {
  putVarint(out, static_cast<uint64_t>(field) << 3 | 2);
  putVarint(out, bytes.size());
  out += bytes;
}
/// Event{wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5}.
std::string eventHeader(int64_t step) {
  std::string e;
  double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  putVarint(e, 1 << 3 | 1);
  putFixed(e, &wall, 8);
  putVarint(e, 2 << 3 | 0);
  putVarint(e, static_cast<uint64_t>(step));
  return e;
}

std::string csvField(const std::string &s) {
  if (s.find_first_of(",\"\n") == std::string::npos)
    return s;
  std::string q = "\"";
  for (char c : s)
    q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
} // namespace

uint32_t crc32c(const void *data, size_t size) {
  static const std::array<uint32_t, 256> table = makeCrcTable();
  uint32_t c = 0xffffffffu;
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i)
    c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t maskedCrc32c(const void *data, size_t size) {
  uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

Status CsvScalarLog::open(const std::string &path, bool append) {
  path_ = path;
  if (append) {
    std::ifstream in(path);
    std::getline(in, existingHeader_);
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_)
    return invalidArgument("cannot write CSV file '", path, "'");
  return Status::ok();
}

Status CsvScalarLog::write(const ScalarRow &row) {
  if (columns_.empty()) {
    std::string header;
    for (const auto &[name, value] : row) {
      columns_.push_back(name);
      header += (header.empty() ? "" : ",") + csvField(name);
    }
    if (existingHeader_.empty())
      out_ << header << "\n";
    else if (existingHeader_ != header)
      return invalidArgument("CSV file '", path_, "' has the columns '", existingHeader_,
                             "', this run writes '", header, "': name another file");
  }
  std::string line;
  size_t i = 0;
  for (const auto &[name, value] : row) {
    if (i >= columns_.size() || columns_[i] != name)
      return invalidArgument("CSV file '", path_, "': column '", name,
                             "' is not in the header written at the first step");
    if (i++)
      line += ",";
    if (value) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", *value);
      line += buf;
    }
  }
  out_ << line << "\n";
  out_.flush(); // a killed job keeps its rows up to the last step
  if (!out_)
    return invalidArgument("cannot write CSV file '", path_, "'");
  return Status::ok();
}

Status TensorBoardLog::open(const std::string &directory, bool append, int *removed) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec)
    return invalidArgument("cannot create TensorBoard directory '", directory, "': ", ec.message());
  if (removed)
    *removed = 0;
  if (!append) {
    std::vector<std::filesystem::path> earlier;
    for (const auto &entry : std::filesystem::directory_iterator(directory, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && name.rfind("events.out.tfevents.", 0) == 0 && name.size() > 4 &&
          name.compare(name.size() - 4, 4, ".ptc") == 0)
        earlier.push_back(entry.path());
    }
    for (const auto &path : earlier) {
      if (!std::filesystem::remove(path, ec) || ec)
        return invalidArgument("cannot remove the earlier run's TensorBoard file '", path.string(),
                               "': ", ec ? ec.message() : "it went");
      if (removed)
        ++*removed;
    }
  }
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  auto now = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  // The pid keeps two runs started in the same second apart.
  path_ = directory + "/events.out.tfevents." + std::to_string(now) + "." + host + "." +
          std::to_string(getpid()) + ".ptc";
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_)
    return invalidArgument("cannot write TensorBoard file '", path_, "'");
  std::string first = eventHeader(0);
  putBytesField(first, 3, "brain.Event:2");
  return writeRecord(first);
}

Status TensorBoardLog::write(int64_t step, const ScalarRow &row, const std::string &prefix) {
  std::string summary;
  for (const auto &[name, value] : row) {
    if (!value)
      continue;
    std::string v; // Summary.Value{tag = 1, simple_value = 2 (float)}
    putBytesField(v, 1, prefix + name);
    float f = static_cast<float>(*value);
    putVarint(v, 2 << 3 | 5);
    putFixed(v, &f, 4);
    putBytesField(summary, 1, v);
  }
  std::string event = eventHeader(step);
  putBytesField(event, 5, summary);
  return writeRecord(event);
}

Status TensorBoardLog::writeRecord(const std::string &bytes) {
  uint64_t length = bytes.size();
  uint32_t lengthCrc = maskedCrc32c(&length, 8), dataCrc = maskedCrc32c(bytes.data(), bytes.size());
  out_.write(reinterpret_cast<const char *>(&length), 8);
  out_.write(reinterpret_cast<const char *>(&lengthCrc), 4);
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.write(reinterpret_cast<const char *>(&dataCrc), 4);
  out_.flush();
  if (!out_)
    return invalidArgument("cannot write TensorBoard file '", path_, "'");
  return Status::ok();
}

} // namespace ptc
