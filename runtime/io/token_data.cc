// Token data: memory-mapped files as one stream, the standard batch order and
// the seeded window shuffle.

#include "runtime/io/token_data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ptc {

struct TokenData::Mapped {
  std::string path;
  const uint16_t *tokens = nullptr;
  int64_t count = 0;
  size_t bytes = 0;
  ~Mapped() {
    if (tokens && bytes)
      munmap(const_cast<uint16_t *>(tokens), bytes);
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

StatusOr<TokenData> TokenData::load(const std::vector<std::string> &paths, int64_t seq,
                                    int64_t vocab, std::optional<uint64_t> shuffleSeed) {
  if (paths.empty())
    return invalidArgument("no data file given");
  TokenData data;
  data.vocab_ = vocab;
  data.shuffle_ = shuffleSeed;
  for (const std::string &path : paths) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0)
      return error(StatusCode::kNotFound, "cannot open data file '", path, "': ",
                   std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return invalidArgument("data file '", path, "' is not a regular file");
    }
    auto m = std::make_shared<Mapped>();
    m->path = path;
    m->bytes = static_cast<size_t>(st.st_size);
    if (st.st_size % 2 != 0) {
      ::close(fd);
      return error(StatusCode::kDataLoss, "data file '", path, "' has ", st.st_size,
                   " bytes, not a whole number of uint16 tokens");
    }
    m->count = st.st_size / 2;
    if (m->bytes > 0) {
      void *p = mmap(nullptr, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return error(StatusCode::kDataLoss, "cannot map data file '", path, "': ",
                     std::strerror(errno));
      }
      madvise(p, m->bytes, MADV_RANDOM);
      m->tokens = static_cast<const uint16_t *>(p);
    }
    ::close(fd);
    data.begin_.push_back(data.total_);
    data.total_ += m->count;
    data.files_.push_back(std::move(m));
  }
  std::string names = paths.size() == 1 ? "data file '" + paths[0] + "'"
                                        : "data files (" + std::to_string(paths.size()) + ")";
  if (data.total_ < seq + 2)
    return invalidArgument(names, " has ", data.total_, " tokens; one window of seq ", seq,
                           " needs at least ", seq + 2);
  if (data.total_ <= kEagerCheckTokens) {
    for (const auto &f : data.files_)
      for (int64_t i = 0; i < f->count; ++i)
        if (f->tokens[i] >= vocab)
          return invalidArgument("data file '", f->path, "': token id ", f->tokens[i],
                                 " at position ", i, " is not below the model's vocab ", vocab);
    data.checked_ = true;
  }
  return data;
}

uint16_t TokenData::at(int64_t i, size_t &file) const {
  if (i < begin_[file] || i >= begin_[file] + files_[file]->count)
    file = static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), i) - begin_.begin() - 1);
  return files_[file]->tokens[i - begin_[file]];
}

int64_t TokenData::windowStart(int64_t g, int64_t seq) const {
  const int64_t span = total_ - seq - 1;
  if (!shuffle_)
    return (g * seq) % span;
  const int64_t windows = std::max<int64_t>(span / seq, 1);
  const int64_t epoch = g / windows, index = g % windows;
  return permute(index, windows, mix(*shuffle_ ^ mix(static_cast<uint64_t>(epoch) + 1))) * seq;
}

Status TokenData::fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin,
                            int64_t rowEnd, int32_t *tokens, int32_t *targets) const {
  size_t file = 0;
  for (int64_t j = rowBegin; j < rowEnd; ++j) {
    int64_t start = windowStart(step * batch + j, seq);
    int32_t *tr = tokens + (j - rowBegin) * seq, *gr = targets + (j - rowBegin) * seq;
    for (int64_t t = 0; t <= seq; ++t) {
      uint16_t id = at(start + t, file);
      if (!checked_ && id >= vocab_)
        return invalidArgument("data file '", files_[file]->path, "': token id ", id,
                               " at position ", start + t - begin_[file],
                               " is not below the model's vocab ", vocab_);
      if (t < seq)
        tr[t] = id;
      if (t > 0)
        gr[t - 1] = id;
    }
  }
  return Status::ok();
}

} // namespace ptc
