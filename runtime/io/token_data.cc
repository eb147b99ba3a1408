// Token data: memory-mapped files as one stream, the standard batch order and
// the seeded window shuffle.

#include "runtime/io/token_data.h"

#include "runtime/base/read_file.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ptc {

struct TokenData::Mapped {
  std::string path;
  const unsigned char *base = nullptr; // the mapping
  const unsigned char *ids = nullptr;  // the first id (after a header)
  uint32_t width = 2;                  // bytes per id
  int64_t count = 0;
  size_t bytes = 0;
  uint32_t id(int64_t i) const {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, ids + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, ids + 4 * i, 4);
    return v;
  }
  ~Mapped() {
    if (base && bytes)
      munmap(const_cast<unsigned char *>(base), bytes);
  }
};

namespace {
constexpr int64_t kEagerCheckTokens = int64_t{64} << 20;

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/// A seeded bijection of [0, n): a 4-round Feistel network on the smallest
/// even-bit domain covering n, cycle-walking until the result is below n.
int64_t permute(int64_t index, int64_t n, uint64_t key) {
  int bits = 2;
  while ((int64_t{1} << bits) < n)
    bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = mix(r ^ (key + round * 0x9E3779B97F4A7C15ull)) & mask;
      uint64_t t = l ^ f;
      l = r;
      r = t;
    }
    x = (l << half) | r;
  } while (static_cast<int64_t>(x) >= n);
  return static_cast<int64_t>(x);
}
} // namespace

std::string TokenFileHeader::encode() const {
  std::string h(kMagic, 8);
  uint32_t version = 1;
  h.append(reinterpret_cast<const char *>(&version), 4);
  h.append(reinterpret_cast<const char *>(&bytesPerToken), 4);
  h.append(reinterpret_cast<const char *>(&vocab), 8);
  h.append(reinterpret_cast<const char *>(&count), 8);
  return h;
}

StatusOr<TokenData::Stream> TokenData::loadStream(const std::vector<std::string> &paths,
                                                  int64_t seq, int64_t vocab,
                                                  std::optional<uint64_t> shuffleSeed) {
  if (paths.empty())
    return invalidArgument("no data file given");
  Stream data;
  data.shuffle = shuffleSeed;
  for (const std::string &path : paths) {
    // (Never a blocking open: a FIFO is refused, named, not waited on.)
    StatusOr<int> opened = openRegularFile(path, "data file");
    if (!opened.isOk())
      return opened.status();
    int fd = *opened;
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      ::close(fd);
      return error(StatusCode::kDataLoss, "cannot stat data file '", path, "': ", std::strerror(errno));
    }
    auto m = std::make_shared<Mapped>();
    m->path = path;
    m->bytes = static_cast<size_t>(st.st_size);
    if (m->bytes > 0) {
      void *p = mmap(nullptr, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return error(StatusCode::kDataLoss, "cannot map data file '", path, "': ",
                     std::strerror(errno));
      }
      madvise(p, m->bytes, MADV_RANDOM);
      m->base = static_cast<const unsigned char *>(p);
    }
    ::close(fd);
    m->ids = m->base;
    int64_t payload = st.st_size;
    if (m->bytes >= 8 && std::memcmp(m->base, TokenFileHeader::kMagic, 8) == 0) {
      // ptc's form: the header says the width and the count.
      if (m->bytes < static_cast<size_t>(TokenFileHeader::kBytes))
        return error(StatusCode::kDataLoss, "data file '", path, "' has a token header cut short (",
                     st.st_size, " bytes)");
      uint32_t version, width;
      uint64_t count, fileVocab;
      std::memcpy(&version, m->base + 8, 4);
      std::memcpy(&width, m->base + 12, 4);
      std::memcpy(&fileVocab, m->base + 16, 8);
      std::memcpy(&count, m->base + 24, 8);
      if (version != 1)
        return invalidArgument("data file '", path, "': token header version ", version,
                               " (this ptc reads 1)");
      if (width != 2 && width != 4)
        return error(StatusCode::kDataLoss, "data file '", path, "': token header says ", width,
                     " bytes per token (2 or 4)");
      // The tokenizer's vocabulary: its ids are below it, and the model must
      // have an embedding row for each.
      if (fileVocab == 0 || fileVocab > (width == 2 ? 65536ull : 4294967296ull))
        return error(StatusCode::kDataLoss, "data file '", path, "': token header says a vocabulary of ",
                     fileVocab, ", which ", width, "-byte ids cannot hold");
      if (fileVocab > static_cast<uint64_t>(vocab))
        return invalidArgument("data file '", path, "' was tokenized for a vocabulary of ", fileVocab,
                               ", larger than the model's ", vocab,
                               " (another tokenizer, or a model with a smaller vocab)");
      payload = st.st_size - TokenFileHeader::kBytes;
      if (count > static_cast<uint64_t>(INT64_MAX / 4) ||
          static_cast<int64_t>(count) * width != payload)
        return error(StatusCode::kDataLoss, "data file '", path, "': its header says ", count,
                     " tokens of ", width, " bytes, but ", payload, " bytes follow it");
      m->width = width;
      m->ids = m->base + TokenFileHeader::kBytes;
    } else if (st.st_size % 2 != 0) {
      return error(StatusCode::kDataLoss, "data file '", path, "' has ", st.st_size,
                   " bytes, not a whole number of uint16 tokens");
    }
    m->count = payload / m->width;
    data.begin.push_back(data.total);
    data.total += m->count;
    data.files.push_back(std::move(m));
  }
  std::string names = paths.size() == 1 ? "data file '" + paths[0] + "'"
                                        : "data files (" + std::to_string(paths.size()) + ")";
  if (data.total < seq + 2)
    return invalidArgument(names, " has ", data.total, " tokens; one window of seq ", seq,
                           " needs at least ", seq + 2);
  if (data.total <= kEagerCheckTokens) {
    for (const auto &f : data.files)
      for (int64_t i = 0; i < f->count; ++i)
        if (f->id(i) >= static_cast<uint64_t>(vocab))
          return invalidArgument("data file '", f->path, "': token id ", f->id(i),
                                 " at position ", i, " is not below the model's vocab ", vocab);
    data.checked = true;
  }
  return data;
}

StatusOr<TokenData> TokenData::load(const std::vector<std::string> &paths, int64_t seq,
                                    int64_t vocab, std::optional<uint64_t> shuffleSeed) {
  auto stream = loadStream(paths, seq, vocab, shuffleSeed);
  if (!stream.isOk())
    return stream.status();
  TokenData data;
  data.vocab_ = vocab;
  data.streams_.push_back(std::move(*stream));
  return data;
}

StatusOr<std::vector<std::pair<double, std::vector<std::string>>>>
TokenData::parseBlend(const std::string &text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;)
    words.push_back(w);
  if (words.empty() || words.size() % 2 != 0)
    return invalidArgument("a blend is pairs of weight and path ('0.7 a.bin 0.3 b.bin'), got '",
                           text, "'");
  std::vector<std::pair<double, std::vector<std::string>>> out;
  for (size_t i = 0; i < words.size(); i += 2) {
    char *end = nullptr;
    double w = std::strtod(words[i].c_str(), &end);
    if (end == words[i].c_str() || *end || !std::isfinite(w) || w <= 0)
      return invalidArgument("blend weight '", words[i], "' (before '", words[i + 1],
                             "') is not a positive number");
    std::vector<std::string> paths;
    std::stringstream ss(words[i + 1]);
    for (std::string p; std::getline(ss, p, ',');)
      if (!p.empty())
        paths.push_back(p);
    out.push_back({w, paths});
  }
  return out;
}

StatusOr<TokenData> TokenData::loadBlend(
    const std::vector<std::pair<double, std::vector<std::string>>> &datasets, int64_t seq,
    int64_t vocab, std::optional<uint64_t> shuffleSeed) {
  if (datasets.empty())
    return invalidArgument("a blend needs at least one dataset");
  TokenData data;
  data.vocab_ = vocab;
  double sum = 0.0;
  for (const auto &[w, paths] : datasets) {
    if (!(w > 0) || !std::isfinite(w))
      return invalidArgument("blend weight ", w, " is not a positive number");
    sum += w;
  }
  for (size_t d = 0; d < datasets.size(); ++d) {
    std::optional<uint64_t> seed;
    if (shuffleSeed)
      seed = *shuffleSeed + d; // each dataset its own order
    auto stream = loadStream(datasets[d].second, seq, vocab, seed);
    if (!stream.isOk())
      return stream.status();
    data.streams_.push_back(std::move(*stream));
    data.weights_.push_back(datasets[d].first / sum);
  }
  data.counts_.assign(datasets.size(), 0);
  return data;
}

int64_t TokenData::size() const {
  int64_t n = 0;
  for (const Stream &s : streams_)
    n += s.total;
  return n;
}

namespace {
constexpr int64_t kBlendSnapshot = int64_t{1} << 16;
} // namespace

std::pair<size_t, int64_t> TokenData::blendSample(int64_t g) const {
  if (weights_.empty())
    return {0, g};
  if (g < cursor_) { // back to the snapshot at or before g
    size_t k = static_cast<size_t>(g / kBlendSnapshot);
    counts_ = k == 0 ? std::vector<int64_t>(weights_.size(), 0) : snapshots_[k - 1];
    cursor_ = static_cast<int64_t>(k) * kBlendSnapshot;
  }
  for (;;) {
    // Megatron's build_blending_indices: the dataset furthest behind its share.
    double x = std::max<double>(static_cast<double>(cursor_), 1.0);
    size_t best = 0;
    double bestError = weights_[0] * x - static_cast<double>(counts_[0]);
    for (size_t d = 1; d < weights_.size(); ++d) {
      double e = weights_[d] * x - static_cast<double>(counts_[d]);
      if (e > bestError) {
        bestError = e;
        best = d;
      }
    }
    int64_t index = counts_[best]++;
    int64_t sample = cursor_++;
    if (cursor_ % kBlendSnapshot == 0 &&
        snapshots_.size() < static_cast<size_t>(cursor_ / kBlendSnapshot))
      snapshots_.push_back(counts_);
    if (sample == g)
      return {best, index};
  }
}

uint32_t TokenData::Stream::at(int64_t i, size_t &file) const {
  if (i < begin[file] || i >= begin[file] + files[file]->count)
    file = static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), i) - begin.begin() - 1);
  return files[file]->id(i - begin[file]);
}

int64_t TokenData::Stream::windowStart(int64_t g, int64_t seq) const {
  const int64_t span = total - seq - 1;
  if (!shuffle)
    return (g * seq) % span;
  const int64_t windows = std::max<int64_t>(span / seq, 1);
  const int64_t epoch = g / windows, index = g % windows;
  return permute(index, windows, mix(*shuffle ^ mix(static_cast<uint64_t>(epoch) + 1))) * seq;
}

Status TokenData::fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin,
                            int64_t rowEnd, int32_t *tokens, int32_t *targets) const {
  for (int64_t j = rowBegin; j < rowEnd; ++j) {
    auto [d, window] = blendSample(step * batch + j);
    const Stream &s = streams_[d];
    size_t file = 0;
    int64_t start = s.windowStart(window, seq);
    int32_t *tr = tokens + (j - rowBegin) * seq, *gr = targets + (j - rowBegin) * seq;
    for (int64_t t = 0; t <= seq; ++t) {
      uint32_t id = s.at(start + t, file);
      if (!s.checked && id >= static_cast<uint64_t>(vocab_))
        return invalidArgument("data file '", s.files[file]->path, "': token id ", id,
                               " at position ", start + t - s.begin[file],
                               " is not below the model's vocab ", vocab_);
      if (t < seq)
        tr[t] = static_cast<int32_t>(id);
      if (t > 0)
        gr[t - 1] = static_cast<int32_t>(id);
    }
  }
  return Status::ok();
}

} // namespace ptc
