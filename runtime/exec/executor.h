// The CPU executor: owns the storage of every plan tensor (persistent
// parameters/state/inputs/constants, and one arena for temporaries) and runs
// the plan's instructions in order, one kernel call each.
#ifndef PTC_RUNTIME_EXEC_EXECUTOR_H
#define PTC_RUNTIME_EXEC_EXECUTOR_H

#include "runtime/base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/plan/plan_loader.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

class Executor {
public:
  static StatusOr<std::unique_ptr<Executor>> create(std::shared_ptr<const LoadedPlan> plan);

  const LoadedPlan &plan() const { return *plan_; }

  /// Raw storage of tensor `id` (plan tensor index).
  void *data(int32_t id) { return storage_[static_cast<size_t>(id)]; }
  float *f32(int32_t id) { return static_cast<float *>(data(id)); }
  int32_t *i32(int32_t id) { return static_cast<int32_t *>(data(id)); }

  /// Initializes parameters from their plan initializers and zeroes optimizer
  /// state. Each tensor draws from its own stream seeded by (seed, name), so
  /// the values do not depend on the tensor order.
  void initialize(uint64_t seed);

  /// Sets the local part of tensor `id` from its whole value (global shape).
  void loadFromWhole(int32_t id, const void *whole);
  /// The whole value of tensor `id` on rank 0 (collective: every rank calls
  /// it; other ranks get an empty vector).
  StatusOr<std::vector<float>> gatherWhole(int32_t id);

  /// Runs every instruction once (one training step). With `profile` (one
  /// entry per opcode), adds each instruction's wall time to its opcode.
  Status step(std::vector<double> *profile = nullptr);

  /// The communicator for the plan's collectives (none: every mesh axis has
  /// size 1, or the plan has no mesh). Not owned.
  void setCommunicator(Communicator *comm) { comm_ = comm; }

  /// Bytes of the arena and of persistent storage.
  int64_t arenaBytes() const { return arenaBytes_; }
  int64_t persistentBytes() const { return persistentBytes_; }
  /// High-water mark of the buffer collectives pack and unpack through.
  int64_t communicationBytes() const {
    return static_cast<int64_t>(staging_.capacity() * sizeof(float));
  }

private:
  explicit Executor(std::shared_ptr<const LoadedPlan> plan) : plan_(std::move(plan)) {}
  Status run(const plan::Instruction &inst);

  Status runCollective(const plan::Instruction &inst);
  Status runVocabParallelCrossEntropy(const plan::Instruction &inst);
  /// Calls fn(wholeOffsets, localOffsets, box) for every box of tensor `t`'s
  /// local part that a device at `coords` holds.
  template <typename Fn>
  void forEachLocalBox(const TensorInfo &t, const std::vector<int> &coords, Fn fn) const;
  std::vector<int> coords() const;

  std::shared_ptr<const LoadedPlan> plan_;
  Communicator *comm_ = nullptr;
  std::vector<float> staging_;
  std::vector<std::unique_ptr<uint8_t[], void (*)(void *)>> buffers_;
  std::vector<void *> storage_;
  int64_t arenaBytes_ = 0, persistentBytes_ = 0;
};

/// Deterministic N(0, std) values for tensor `name` under `seed`.
void fillNormal(float *out, int64_t n, double stddev, uint64_t seed, const std::string &name);

} // namespace ptc

#endif // PTC_RUNTIME_EXEC_EXECUTOR_H
