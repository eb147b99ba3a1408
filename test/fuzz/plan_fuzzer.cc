// libFuzzer target: any bytes as a plan. The loader must refuse or accept
// without crashing, and what it accepts must dump as JSON and set up an
// executor without crashing either.
#include "runtime/base/checked_math.h"
#include "runtime/exec/executor.h"
#include "runtime/plan/plan_loader.h"

#include <cstdint>
#include <optional>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  auto loaded = ptc::LoadedPlan::loadBytes(std::move(bytes), "fuzz.plan");
  if (!loaded.isOk())
    return 0;
  (void)ptc::planToJson(**loaded);
  // Storage for a plan of at most 64 MiB of tensors (larger ones are real
  // plans too, but the fuzzer should not spend its time allocating).
  // The loader bounds the arena and the tensors; the sum is checked anyway,
  // and stops at the first term past the limit.
  const int64_t limit = int64_t(64) << 20;
  std::optional<int64_t> bytesNeeded = (*loaded)->plan().arena_bytes();
  for (const ptc::TensorInfo &t : (*loaded)->tensors()) {
    if (!bytesNeeded || *bytesNeeded >= limit)
      break;
    bytesNeeded = ptc::checkedAdd(*bytesNeeded, t.bytes);
  }
  if (bytesNeeded && *bytesNeeded < limit)
    (void)ptc::Executor::create(*loaded);
  return 0;
}
