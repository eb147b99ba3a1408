// Dropout's random numbers: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011), a counter-based generator, keyed so
// that an element's mask depends only on (seed, step, the op's stream, the
// element's index in the whole step's tensor). Every layout therefore draws
// the same masks as one rank: a device computes the global index of each of
// its elements from the tensor's split (mesh axes and blocks per dimension),
// its mesh coordinates, and for micro-batched steps the micro-batch and the
// data-parallel order of the batch rows (runtime/exec/pipelined.cc,
// loadMicrobatch). No state besides the seed and the step, which checkpoints
// keep.
//
// Shared by the CPU and CUDA kernels (host and device code). A leaf.
#ifndef PTC_KERNELS_COMMON_DROPOUT_H
#define PTC_KERNELS_COMMON_DROPOUT_H

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define PTC_HOST_DEVICE __host__ __device__
#else
#define PTC_HOST_DEVICE
#endif

namespace ptc::kernels {

/// Philox4x32-10 of `counter` under `key` (Random123's philox4x32_R(10, ...)).
struct Philox4x32 {
  uint32_t v[4];
};
PTC_HOST_DEVICE inline Philox4x32 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

/// Where a dropout's masks come from, besides its elements' indices: the
/// run's seed, the step (0 for the run's first batch; a resumed run goes on
/// with its checkpoint's step) and, for a micro-batched step, which
/// micro-batch of how many runs now and how many data-parallel parts the
/// batch rows are dealt to. `training` false (evaluation, generation): the
/// op is the identity.
struct RandomContext {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t microbatch = 0, microbatches = 1, dataParts = 1;
  bool training = true;
};

/// The mapping from a device's elements of one dropout's input to their
/// indices in the whole step's tensor, and the keep decision.
struct DropoutMask {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  /// Per dimension: the local extent, the micro-batch's global extent, this
  /// device's coordinate among the `parts` that split it, and its blocks.
  int64_t local[kMaxRank] = {}, global[kMaxRank] = {}, coord[kMaxRank] = {},
          parts[kMaxRank] = {}, blocks[kMaxRank] = {};
  int64_t microbatch = 0, microbatches = 1, dataParts = 1;
  uint32_t key0 = 0, key1 = 0, stream = 0, step = 0;
  /// Elements are kept when their uniform draw is >= p; kept ones are scaled.
  float p = 0.0f, scale = 1.0f;

  /// Local element `i` (row-major) -> its index in the whole step's tensor
  /// (the micro-batches' batch rows in the order one rank sees them).
  PTC_HOST_DEVICE int64_t wholeIndex(int64_t i) const {
    int64_t index = 0, stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t l = i % local[d];
      i /= local[d];
      // Block b of this device's part: b * (global / blocks) + coord * piece.
      const int64_t piece = local[d] / blocks[d];
      int64_t g = (l / piece) * (global[d] / blocks[d]) + coord[d] * piece + l % piece;
      int64_t extent = global[d];
      if (d == 0 && microbatches > 1) {
        // Data-parallel part r holds rows [r * perPart * M, ...), micro-batch
        // m of it rows m * perPart.. of those.
        const int64_t perPart = global[0] / dataParts;
        g = (g / perPart) * perPart * microbatches + microbatch * perPart + g % perPart;
        extent = global[0] * microbatches;
      }
      index += g * stride;
      stride *= extent;
    }
    return index;
  }
  /// The uniform draw in [0, 1) of whole-step element `w` (24 bits).
  PTC_HOST_DEVICE float uniform(int64_t w) const {
    const uint64_t group = static_cast<uint64_t>(w) >> 2;
    const Philox4x32 r = philox4x32(static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                                    step, stream, key0, key1);
    return static_cast<float>(r.v[w & 3] >> 8) * (1.0f / 16777216.0f);
  }
  /// What local element `i` is multiplied by: 0 (dropped) or 1 / (1 - p).
  PTC_HOST_DEVICE float factor(int64_t i) const {
    return uniform(wholeIndex(i)) >= p ? scale : 0.0f;
  }
};

/// The mask of a Dropout call: its input's local shape `shape` (rank <=
/// kMaxRank), the instruction's stream and layout (per dimension its blocks,
/// the number of mesh axes splitting it and those axes, major first:
/// op_attrs.def), `p`, the device's mesh coordinates and sizes, and the
/// random context. False when the layout does not describe `rank`
/// dimensions (the plan loader checks it first) or, under micro-batches, the
/// first dimension does not split into the data parts.
template <typename Shape>
inline bool dropoutMask(const Shape &shape, int64_t stream, const Shape &layout, double p,
                        const int64_t *meshCoords, const int64_t *meshSizes,
                        const RandomContext &random, DropoutMask &mask) {
  const size_t rank = shape.size();
  if (rank > static_cast<size_t>(DropoutMask::kMaxRank))
    return false;
  mask.rank = static_cast<int>(rank);
  mask.stream = static_cast<uint32_t>(stream);
  const int64_t *ints = layout.data();
  const size_t numInts = layout.size();
  size_t k = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (k + 2 > numInts)
      return false;
    const int64_t blocks = ints[k], axes = ints[k + 1];
    k += 2;
    if (blocks < 1 || axes < 0 || k + static_cast<size_t>(axes) > numInts)
      return false;
    int64_t coord = 0, parts = 1;
    for (int64_t a = 0; a < axes; ++a) { // major first
      const int64_t axis = ints[k++];
      if (axis < 0)
        return false;
      coord = coord * meshSizes[axis] + meshCoords[axis];
      parts *= meshSizes[axis];
    }
    mask.local[d] = shape[d];
    mask.global[d] = shape[d] * parts;
    mask.coord[d] = coord;
    mask.parts[d] = parts;
    mask.blocks[d] = blocks;
    if (shape[d] % blocks != 0)
      return false;
  }
  if (k != numInts)
    return false;
  mask.microbatch = random.microbatch;
  mask.microbatches = random.microbatches;
  mask.dataParts = random.dataParts > 0 ? random.dataParts : 1;
  // Micro-batches place the first dimension's rows by the data parts: it
  // must hold them (the compiler's batch-first rule), or the masks would not
  // be one rank's.
  if (mask.microbatches > 1 && (rank == 0 || mask.global[0] % mask.dataParts != 0))
    return false;
  mask.key0 = static_cast<uint32_t>(random.seed);
  mask.key1 = static_cast<uint32_t>(random.seed >> 32);
  mask.step = static_cast<uint32_t>(random.step);
  mask.p = static_cast<float>(p);
  mask.scale = static_cast<float>(1.0 / (1.0 - p));
  return true;
}

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_DROPOUT_H
