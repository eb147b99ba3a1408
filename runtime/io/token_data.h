// Token data: files of little-endian uint16 token ids (nanoGPT's .bin),
// memory-mapped (a file larger than memory works), several files read as one
// stream, and the batch order of the standard model (DESIGN.md): step k's
// global batch is B windows of S+1 tokens, window j starting at
// ((k*B + j) * S) mod (N - S - 1). With a shuffle seed, window g = k*B + j of
// the stream instead starts at S * pi_e(g mod W), W = (N - S - 1) / S windows
// per epoch e = g / W, pi_e a seeded permutation of [0, W) per epoch: every
// window once per epoch, in an order that is a function of (seed, step), so a
// resumed run continues it exactly.
#ifndef PTC_RUNTIME_IO_TOKEN_DATA_H
#define PTC_RUNTIME_IO_TOKEN_DATA_H

#include "runtime/base/status.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ptc {

class TokenData {
public:
  /// Maps `paths` (one stream, in order); needs at least seq + 2 tokens. Ids
  /// must be below `vocab`: checked at load for streams up to 64M tokens,
  /// else as windows are read.
  static StatusOr<TokenData> load(const std::vector<std::string> &paths, int64_t seq,
                                  int64_t vocab, std::optional<uint64_t> shuffleSeed = {});
  static StatusOr<TokenData> load(const std::string &path, int64_t seq, int64_t vocab) {
    return load(std::vector<std::string>{path}, seq, vocab);
  }

  int64_t size() const { return total_; }

  /// Fills rows [rowBegin, rowEnd) of step `step`'s batch of `batch` windows:
  /// tokens[r][t] = data[start + t], targets[r][t] = data[start + t + 1].
  /// Fails on an id not below the vocabulary (naming file and position).
  Status fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin, int64_t rowEnd,
                   int32_t *tokens, int32_t *targets) const;

  /// The first token of window `g` of the stream (see the file comment).
  int64_t windowStart(int64_t g, int64_t seq) const;

private:
  struct Mapped;
  std::vector<std::shared_ptr<Mapped>> files_;
  std::vector<int64_t> begin_; // first stream index of each file
  int64_t total_ = 0, vocab_ = 0;
  bool checked_ = false;
  std::optional<uint64_t> shuffle_;

  uint16_t at(int64_t i, size_t &file) const;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_TOKEN_DATA_H
