//===- Passes.h - memory planning -------------------------------*- C++ -*-===//

#ifndef PTC_PASSES_MEMORY_PASSES_H
#define PTC_PASSES_MEMORY_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/memory/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/memory/Passes.h.inc"

/// Attribute names written by ptc-plan-memory and read by ptc-export-plan.
inline constexpr llvm::StringLiteral kOffsetsAttrName = "ptc.offsets";
inline constexpr llvm::StringLiteral kArenaBytesAttrName = "ptc.arena_bytes";
inline constexpr llvm::StringLiteral kArenaBytesUnsharedAttrName = "ptc.arena_bytes_unshared";
/// Pipelined steps: the arena each pipeline rank needs.
inline constexpr llvm::StringLiteral kArenaBytesPerRankAttrName = "ptc.arena_bytes_per_rank";

/// The bf16 / f16 value `v` widens when `v` is a `ptc.convert` of it to f32
/// (mixed precision's widenings, which ptc-fuse-gradient-widening and
/// ptc-fuse-loss-widening let their readers skip), else null.
Value narrowSourceOf(Value v);

/// Bytes of a statically shaped tensor.
int64_t getTensorBytes(RankedTensorType type);

/// Whether `result` (a function result value) is written in place into an
/// argument: true for values returned with `ptc.update` or `ptc.working_copy`.
bool isInPlaceUpdate(Value value);

/// The staging buffer ptc-run needs for a collective op (its bytes on the
/// wire: an all-reduce's operands, an all-gather's result, a reduce-scatter's
/// operand, both buffers of an all-to-all); 0 for other ops.
int64_t collectiveBufferBytes(Operation &op);

/// Whether a planned all-reduce bucket sums in place (ptc-plan-memory laid
/// its operands back to back and gave each result its operand's offset):
/// ptc-run then needs no staging buffer for it (plan_loader's
/// allReduceInPlace reads the same from the plan).
bool isInPlaceAllReduce(AllReduceOp op);

/// Whether `value` lives in host memory (ptc-offload-optimizer): an argument
/// or an op result marked `ptc.on_host`, or a `ptc.transfer` to the host.
bool isOnHost(Value value);

/// One device's memory for a compiled (memory-planned) step, counted as
/// ptc-run allocates it (runtime/plan/plan_loader.cc, predictedPeakBytes):
/// the tensors its ops touch or that live on it, its arena, its largest
/// collective buffer. What ptc-report-memory prints and the planner (ptc-plan)
/// searches with.
struct DeviceMemory {
  int64_t params = 0, state = 0, inputs = 0, constants = 0, grads = 0, activations = 0,
          comm = 0, arena = 0, received = 0, values = 0;
  int64_t host = 0; ///< offloaded to host memory (not in the peak)
  /// Low-precision working copies of the parameters that the backward pass
  /// reads again (a parameter's bf16 convert, or under ZeRO-1/2 its gathered
  /// bf16 copy): model state in the ZeRO paper's sense (its 2 bytes of fp16
  /// weights), though they live in the arena. ZeRO-3's per-use gathers are not.
  int64_t workingCopies = 0;
  int64_t peak() const { return params + state + inputs + constants + arena + comm + received; }
};

/// The memory of pipeline rank `rank` of `ranks` (1: an unpipelined step).
/// Gradients and saved activations are of one micro-batch and live in the arena.
DeviceMemory computeDeviceMemory(func::FuncOp func, int rank, int ranks);

/// Bytes for people: "512 B", "3.00 MiB", "74.51 GiB" (binary units).
std::string formatByteSize(double bytes);

/// A size as the user wrote it, with its binary value where its unit is not
/// binary, so that it reads beside formatByteSize's figures: "80GB (74.51
/// GiB)", "512MiB".
std::string describeByteSize(StringRef text);

/// "80GB", "512MiB", "1e9" -> bytes (GB = 1e9, GiB = 2^30); failure for
/// anything else (device-memory= of the memory report and the export).
FailureOr<double> parseByteSize(StringRef text);
} // namespace mlir::ptc

#endif // PTC_PASSES_MEMORY_PASSES_H
