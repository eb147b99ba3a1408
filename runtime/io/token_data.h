// Token data: a flat file of little-endian uint16 token ids (nanoGPT's .bin)
// and the batch order of the standard model (DESIGN.md): step k's global batch
// is B windows of S+1 tokens, window j starting at ((k*B + j) * S) mod (N - S - 1).
#ifndef PTC_RUNTIME_IO_TOKEN_DATA_H
#define PTC_RUNTIME_IO_TOKEN_DATA_H

#include "runtime/base/status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ptc {

class TokenData {
public:
  /// Loads `path`; needs at least seq + 2 tokens, every id below `vocab`.
  static StatusOr<TokenData> load(const std::string &path, int64_t seq, int64_t vocab);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  /// Fills rows [rowBegin, rowEnd) of step `step`'s batch of `batch` windows:
  /// tokens[r][t] = data[start + t], targets[r][t] = data[start + t + 1].
  void fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin, int64_t rowEnd,
                 int32_t *tokens, int32_t *targets) const;

private:
  std::vector<uint16_t> tokens_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_TOKEN_DATA_H
