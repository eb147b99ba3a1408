// Token data loading and the standard batch order.

#include "runtime/io/token_data.h"

#include <fstream>

namespace ptc {

StatusOr<TokenData> TokenData::load(const std::string &path, int64_t seq, int64_t vocab) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    return error(StatusCode::kNotFound, "cannot open data file '", path, "'");
  std::streamsize bytes = in.tellg();
  if (bytes % 2 != 0)
    return error(StatusCode::kDataLoss, "data file '", path, "' has ", bytes,
                 " bytes, not a whole number of uint16 tokens");
  TokenData data;
  data.tokens_.resize(static_cast<size_t>(bytes / 2));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char *>(data.tokens_.data()), bytes))
    return error(StatusCode::kDataLoss, "cannot read data file '", path, "'");
  if (data.size() < seq + 2)
    return invalidArgument("data file '", path, "' has ", data.size(), " tokens; one window of ",
                           "seq ", seq, " needs at least ", seq + 2);
  for (size_t i = 0; i < data.tokens_.size(); ++i)
    if (data.tokens_[i] >= vocab)
      return invalidArgument("data file '", path, "': token id ", data.tokens_[i],
                             " at position ", i, " is not below the model's vocab ", vocab);
  return data;
}

void TokenData::fillBatch(int64_t step, int64_t batch, int64_t seq, int64_t rowBegin,
                          int64_t rowEnd, int32_t *tokens, int32_t *targets) const {
  const int64_t span = size() - seq - 1;
  for (int64_t j = rowBegin; j < rowEnd; ++j) {
    int64_t start = ((step * batch + j) * seq) % span;
    int32_t *tr = tokens + (j - rowBegin) * seq, *gr = targets + (j - rowBegin) * seq;
    for (int64_t t = 0; t < seq; ++t) {
      tr[t] = tokens_[static_cast<size_t>(start + t)];
      gr[t] = tokens_[static_cast<size_t>(start + t + 1)];
    }
  }
}

} // namespace ptc
