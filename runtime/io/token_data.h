// Token data: files of token ids, memory-mapped (a file larger than memory
// works), several files read as one stream, and the batch order of the
// standard model (DESIGN.md): step k's global batch is B windows of S+1
// tokens, window j starting at ((k*B + j) * S) mod (N - S - 1). With a shuffle
// seed, window g = k*B + j of the stream instead starts at S * pi_e(g mod W),
// W = (N - S - 1) / S windows per epoch e = g / W, pi_e a seeded permutation
// of [0, W) per epoch: every window once per epoch, in an order that is a
// function of (seed, step), so a resumed run continues it exactly.
//
// Two file forms: nanoGPT's .bin, little-endian uint16 ids and nothing else;
// and ptc's, a 32-byte header then little-endian ids of 2 or 4 bytes (uint32
// for vocabularies above 65536): "PTCTOKEN", uint32 version (1), uint32 bytes
// per token, uint64 the tokenizer's vocabulary (0: unknown), uint64 the
// number of tokens (checked against the file size).
//
// A blend (Megatron's): datasets, each a stream as above, with weights; the
// global sample i comes from the dataset d maximising w_d * max(i, 1) - n_d
// (n_d: the samples taken from d so far; weights normalised), and is that
// dataset's window n_d, in its own order (shuffled with seed + d).
#ifndef PTC_RUNTIME_IO_TOKEN_DATA_H
#define PTC_RUNTIME_IO_TOKEN_DATA_H

#include "runtime/base/status.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ptc {

/// The header of ptc's token files (see the file comment).
struct TokenFileHeader {
  static constexpr char kMagic[9] = "PTCTOKEN";
  static constexpr int64_t kBytes = 32;
  uint32_t bytesPerToken = 2;
  uint64_t vocab = 0;
  uint64_t count = 0;
  /// The 32 bytes, little-endian.
  std::string encode() const;
};

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
  /// A weighted blend of datasets, each one stream of its files ("0.7 a.bin
  /// 0.3 b.bin,c.bin" parsed by parseBlend). Weights > 0, normalised.
  static StatusOr<TokenData> loadBlend(const std::vector<std::pair<double, std::vector<std::string>>> &datasets,
                                       int64_t seq, int64_t vocab,
                                       std::optional<uint64_t> shuffleSeed = {});
  /// Megatron's blend text: "W1 PATH1 W2 PATH2 ..." (a path may be a comma
  /// list: one stream).
  static StatusOr<std::vector<std::pair<double, std::vector<std::string>>>>
  parseBlend(const std::string &text);

  /// Tokens in all (every dataset of a blend).
  int64_t size() const;
  size_t datasets() const { return streams_.size(); }

  /// Fills rows [rowBegin, rowEnd) of step `step`'s batch of `batch` windows:
  /// tokens[r][t] = data[start + t], targets[r][t] = data[start + t + 1].
  /// Fails on an id not below the vocabulary (naming file and position).
  Status fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin, int64_t rowEnd,
                   int32_t *tokens, int32_t *targets) const;

  /// The first token of window `g` of the (first) stream (see the file comment).
  int64_t windowStart(int64_t g, int64_t seq) const { return streams_[0].windowStart(g, seq); }
  /// A blend's sample `g`: (dataset, its window index).
  std::pair<size_t, int64_t> blendSample(int64_t g) const;

private:
  struct Mapped;
  struct Stream {
    std::vector<std::shared_ptr<Mapped>> files;
    std::vector<int64_t> begin; // first stream index of each file
    int64_t total = 0;
    bool checked = false;
    std::optional<uint64_t> shuffle;
    uint32_t at(int64_t i, size_t &file) const;
    int64_t windowStart(int64_t g, int64_t seq) const;
  };
  static StatusOr<Stream> loadStream(const std::vector<std::string> &paths, int64_t seq,
                                     int64_t vocab, std::optional<uint64_t> shuffleSeed);
  std::vector<Stream> streams_;
  std::vector<double> weights_; // normalised; empty: one stream
  int64_t vocab_ = 0;
  // The blend's state after sample `cursor_` - 1 (counts per dataset), and
  // snapshots every kBlendSnapshot samples, so that going back is cheap.
  mutable int64_t cursor_ = 0;
  mutable std::vector<int64_t> counts_;
  mutable std::vector<std::vector<int64_t>> snapshots_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_TOKEN_DATA_H
