// Named arrays as training data (`--data FILE.safetensors`): one tensor per
// plan input, its first dimension the example index. Step k's global batch of
// B examples is rows (k*B + j) mod N for j < B (the token windows' order,
// DESIGN.md); the caller splits it over dp like token rows.
#ifndef PTC_RUNTIME_IO_ARRAY_DATA_H
#define PTC_RUNTIME_IO_ARRAY_DATA_H

#include "runtime/base/status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ptc {

class ArrayData {
public:
  /// One plan input: its name, the shape of one example (the global shape
  /// without the batch dimension), whether it holds ids (i32, each below
  /// `idBound` when that is >= 0) or floats (stored as `floatBytes` = 4, or 2
  /// for bf16 / f16 as `bf16`).
  struct Input {
    std::string name;
    std::vector<int64_t> exampleShape;
    bool ids = false;
    int64_t idBound = -1;
    int floatBytes = 4;
    bool bf16 = false;
  };

  /// Reads `path` and checks that it holds every input with `batch` or more
  /// examples of the right shape (F32/BF16/F16 for floats; I32/I64/U8/U16
  /// integers for ids); tensors no input reads are an error too.
  static StatusOr<ArrayData> load(const std::string &path, const std::vector<Input> &inputs,
                                  int64_t batch);

  int64_t examples() const { return examples_; }
  /// Writes input `i`'s rows of step `step` (global batch `batch`) into `out`.
  void fillBatch(size_t i, int64_t step, int64_t batch, void *out) const;

private:
  int64_t examples_ = 0;
  std::vector<std::vector<uint8_t>> rows_; // per input: examples x row bytes, plan dtype
  std::vector<int64_t> rowBytes_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_ARRAY_DATA_H
