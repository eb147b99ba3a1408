// Kernel bodies written for CUDA's threads, run on the host: a block's threads
// as host threads, with real block and warp barriers and warp shuffles through
// an exchange array, so that a kernel's indexing, masking, tiling and
// barriers are checked on a machine without a GPU (the bodies of
// kernels/cuda/tiled_attention.h; `Threads` there). Blocks run one after the
// other (a grid-stride loop in the body covers any grid size); shared memory
// starts as NaN, so that reading what no thread wrote shows in the results.
// Not a model of CUDA's memory system or timing: what it cannot see (a
// missing barrier between threads the host happens to order, bank conflicts,
// occupancy) is left to the GPU conformance tests.
#ifndef PTC_TEST_UNIT_SIMT_EMULATOR_H
#define PTC_TEST_UNIT_SIMT_EMULATOR_H

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

namespace ptc::test {

/// All `n` threads wait until the last arrives (reusable). Waiters yield
/// rather than sleep: a block's threads outnumber the cores, and a barrier
/// passes as soon as the last of them is scheduled.
class SimtBarrier {
public:
  explicit SimtBarrier(int n) : n_(n) {}
  void wait() {
    const int64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == generation)
      std::this_thread::yield();
  }

private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<int64_t> generation_{0};
};

/// One running block: its barriers and the warps' shuffle exchange.
struct SimtBlock {
  SimtBlock(int threads, int64_t index, int64_t count)
      : barrier(threads), exchange(static_cast<size_t>(threads)), index(index), count(count) {
    for (int w = 0; w < threads / 32; ++w)
      warps.push_back(std::make_unique<SimtBarrier>(32));
  }
  SimtBarrier barrier;
  std::vector<std::unique_ptr<SimtBarrier>> warps;
  std::vector<float> exchange;
  int64_t index, count;
};

/// One emulated thread: what a kernel body asks of CUDA's.
class SimtThread {
public:
  SimtThread(SimtBlock &block, int thread) : block_(&block), thread_(thread) {}
  int thread() const { return thread_; }
  int lane() const { return thread_ % 32; }
  int warp() const { return thread_ / 32; }
  int64_t block() const { return block_->index; }
  int64_t blocks() const { return block_->count; }
  void sync() const { block_->barrier.wait(); }
  void syncWarp() const { block_->warps[static_cast<size_t>(warp())]->wait(); }
  /// __shfl_xor_sync over the whole warp: every lane must call it.
  float shflXor(float v, int mask) const {
    block_->exchange[static_cast<size_t>(thread_)] = v;
    syncWarp();
    const float got = block_->exchange[static_cast<size_t>(warp() * 32 + (lane() ^ mask))];
    syncWarp();
    return got;
  }

private:
  SimtBlock *block_;
  int thread_;
};

/// Runs `body(SimtThread, float *shared)` as `grid` blocks of `threads`
/// threads (a multiple of 32) with `sharedBytes` of shared memory each.
template <class Body> void emulateGrid(int64_t grid, int threads, int64_t sharedBytes, Body body) {
  std::vector<float> shared(static_cast<size_t>((sharedBytes + 3) / 4));
  for (int64_t b = 0; b < grid; ++b) {
    std::fill(shared.begin(), shared.end(), std::numeric_limits<float>::quiet_NaN());
    SimtBlock block(threads, b, grid);
    std::vector<std::thread> running;
    running.reserve(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      running.emplace_back([&, t] { body(SimtThread(block, t), shared.data()); });
    for (std::thread &t : running)
      t.join();
  }
}

} // namespace ptc::test

#endif // PTC_TEST_UNIT_SIMT_EMULATOR_H
