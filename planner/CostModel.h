//===- CostModel.h - the planner's prices of ops and collectives ---------===//
//
// Internal to the planner: what one phase of a compiled chunk costs on a
// device of a cluster (compute by op kind, collectives by the mesh roles they
// span, ring attention's transfers and the compute they overlap), from the
// ops of a compiled probe.
//
//===----------------------------------------------------------------------===//

#pragma once

#include "planner/Cluster.h"

#include "dialects/ptc/PtcMesh.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace ptc::planner {

using mlir::ptc::MeshAxisRole;

enum Phase { kForward = 0, kBackward = 1, kStep = 2 };
enum CollKind { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kAllToAll = 3 };

/// A collective's bytes per device and how many were issued, per (axes, kind):
/// the axes as a mask of roles (bit 1 << MeshAxisRole).
struct Collective {
  double bytes = 0, count = 0;
};
using CollKey = std::pair<int, int>; // (mask of MeshAxisRole bits, CollKind)
inline int roleBit(MeshAxisRole r) { return 1 << static_cast<int>(r); }
/// Which traffic a collective is: an all-to-all over ep is the experts'
/// dispatch, one over cp Ulysses' attention; any other collective over dp,
/// ep or cp moves gradients or parameters (the dense ones are replicated over
/// dp x ep x cp); the rest is tp's.
MeshAxisRole classOf(const CollKey &key);

/// What one phase of a chunk costs for one micro-batch: its compute, priced
/// on the device, and the collectives it issues, priced per layout.
struct PhaseCost {
  double seconds = 0;       ///< compute
  double matmulSeconds = 0; ///< of which GEMMs (the weight-gradient split of zb-h1)
  double attentionSeconds = 0;
  double flops = 0;         ///< matmul and attention FLOPs executed (recomputation included)
  std::map<CollKey, Collective> collectives;
  /// Ring attention (cp): the key/value blocks (and their gradients) it
  /// passes to the next cp rank, and the attention compute they overlap.
  Collective ring;
  double ringComputeSeconds = 0;

  PhaseCost &add(const PhaseCost &o, double scale) {
    seconds += scale * o.seconds;
    matmulSeconds += scale * o.matmulSeconds;
    attentionSeconds += scale * o.attentionSeconds;
    flops += scale * o.flops;
    ring.bytes += scale * o.ring.bytes;
    ring.count += scale * o.ring.count;
    ringComputeSeconds += scale * o.ringComputeSeconds;
    for (const auto &[k, c] : o.collectives) {
      collectives[k].bytes += scale * c.bytes;
      collectives[k].count += scale * c.count;
    }
    return *this;
  }
};

struct Costs {
  PhaseCost phase[3];
  Costs &add(const Costs &o, double scale) {
    for (int p = 0; p < 3; ++p)
      phase[p].add(o.phase[p], scale);
    return *this;
  }
};


/// Prices ops on one device of `cluster` (`ranksPerNode` of them share a node).
struct Pricer {
  const Cluster &cluster;
  const ComputeProfile *profile = nullptr;
  double slowdown = 1;

  Pricer(const Cluster &c, int64_t ranksPerNode) : cluster(c) {
    std::tie(profile, slowdown) = c.profileFor(ranksPerNode);
  }
  double matmul(double flops, const std::string &dtype) const {
    double rate = profile ? interpolate(profile->matmul, flops)
                          : cluster.peak(dtype) * cluster.matmulEfficiency * flops /
                                (flops + cluster.matmulHalfFlops);
    return flops / rate * slowdown * (profile ? profile->matmulScale : 1.0);
  }
  double attention(double flops, const std::string &dtype) const {
    double rate = profile ? interpolate(profile->attention, flops) : cluster.peak(dtype) * cluster.attentionEfficiency;
    return flops / rate * slowdown * (profile ? profile->attentionScale : 1.0);
  }
  double memory(double bytes) const {
    if (profile)
      return bytes / interpolate(profile->memory, bytes) * slowdown * profile->otherScale;
    return bytes / (cluster.memoryBandwidth * cluster.memoryEfficiency) + cluster.kernelOverhead;
  }
};

/// 4 B H S^2 D of a query whose sequence is dimension `seqDim` ([B, H, S, D]:
/// 2; seq_major: 1).
double attentionFlopsOf(mlir::Value query, int64_t seqDim = 2);
/// "bf16", "f16" or "f32": the cluster's peak-rate key of an element type.
std::string elementTypeName(mlir::Type t);
/// The bytes of a ranked tensor value (0 for anything else).
double tensorBytes(mlir::Value v);
/// The collective `op` is, its axis roles and bytes per device, or nothing.
std::optional<std::tuple<CollKey, double>> collectiveOf(mlir::Operation *op);
/// The cost of every op of `func`, by chunk (`ptc.stage`, 0 without one) and
/// phase (`ptc.segment`, or the position around the backward ops).
std::map<int, Costs> aggregate(mlir::func::FuncOp func, const Pricer &price);

} // namespace ptc::planner
