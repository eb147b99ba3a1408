//===- Cluster.h - what the planner plans for: devices and links -*- C++ -*-===//
//
// A cluster description: how many devices, how they sit in nodes, their
// memory and arithmetic throughput, and the two links between them (inside a
// node, between nodes). Presets describe common machines with documented
// default efficiencies; `ptc-plan --calibrate` measures this machine and
// writes the same JSON a user can write by hand.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_PLANNER_CLUSTER_H
#define PTC_PLANNER_CLUSTER_H

#include "llvm/Support/Error.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptc::planner {

/// A link's alpha-beta model: a message of n bytes over a group of p
/// devices takes steps(p) * latency + factor(p) * n / busBandwidth, with the
/// bus-bandwidth factors nccl-tests defines (all-reduce 2(p-1)/p, all-gather,
/// reduce-scatter and all-to-all (p-1)/p); a point-to-point message (pipeline
/// activations) p2pLatency + n / p2pBandwidth.
struct Link {
  double busBandwidth = 0; ///< bytes/s
  double latency = 0;      ///< seconds per step
  double p2pBandwidth = 0, p2pLatency = 0; ///< 0: the collective figures
  double p2pSeconds(double bytes) const {
    return (p2pBandwidth > 0 ? p2pLatency : latency) + bytes / (p2pBandwidth > 0 ? p2pBandwidth : busBandwidth);
  }
};

/// Measured throughput of one kind of work at one size (calibration).
struct Point {
  double size;       ///< FLOPs of one GEMM / attention, or bytes of one elementwise op
  double throughput; ///< FLOP/s or bytes/s
};

/// Throughput of a device for one thread count (CPU) or the device (GPU).
struct ComputeProfile {
  int threads = 0;             ///< CPU threads per rank this was measured with (0: a GPU)
  std::vector<Point> matmul;   ///< FLOP/s by GEMM FLOPs, ascending
  std::vector<Point> attention; ///< FLOP/s by attention FLOPs, ascending
  std::vector<Point> memory;   ///< bytes/s of elementwise work by bytes moved, ascending
  /// Measured / predicted time of each class of op in a real ptc-run step
  /// (the calibration model, profiled): what the isolated kernels miss
  /// (caches shared with the rest of the step, dispatch, layouts).
  double matmulScale = 1, attentionScale = 1, otherScale = 1;
};

struct Cluster {
  std::string name;
  std::string source; ///< where the figures come from
  int64_t devices = 1;
  int64_t devicesPerNode = 1;
  double memoryBytes = 0;
  /// Peak dense FLOP/s per element type ("f32", "bf16").
  std::vector<std::pair<std::string, double>> peakFlops;
  /// Without calibration points: matmul efficiency eff(f) = matmulEfficiency
  /// * f / (f + matmulHalfFlops) for a GEMM of f FLOPs (small GEMMs do not
  /// fill the device: each costs matmulHalfFlops at full speed more), attention at attentionEfficiency of peak, other ops at
  /// memoryEfficiency of memoryBandwidth.
  double matmulEfficiency = 0.8, matmulHalfFlops = 5e9, attentionEfficiency = 0.5;
  double memoryBandwidth = 0, memoryEfficiency = 0.7;
  /// Seconds every elementwise kernel takes at least (launch and tail).
  double kernelOverhead = 0;
  /// Calibrated throughput (CPU): one profile per thread count; ranks run
  /// with cores / ranks threads each.
  std::vector<ComputeProfile> profiles;
  int64_t cores = 0; ///< CPU: cores shared by the ranks of a node (0: GPUs)
  /// Devices (ranks) per node; for a calibrated CPU machine 0: every rank on
  /// this machine (oversubscribed past `cores`).
  int64_t ranksPerNode(int64_t devices) const { return devicesPerNode > 0 ? std::min(devices, devicesPerNode) : devices; }
  Link intraNode, interNode;
  /// Whether communication runs concurrently with compute (GPU streams:
  /// DDP buckets during the backward pass, ZeRO-3 gathers ahead of their
  /// layer). The CPU runtime's collectives block the rank.
  bool overlap = true;

  double peak(const std::string &dtype) const;
  /// The profile a rank uses when `ranksPerNode` ranks share the node's
  /// cores, and the slowdown factor when they oversubscribe them (>= 1).
  std::pair<const ComputeProfile *, double> profileFor(int64_t ranksPerNode) const;
  bool oversubscribed(int64_t ranksPerNode) const {
    return cores > 0 && ranksPerNode > cores;
  }
};

/// Presets: "dgx-a100-ib", "h100-ib", ...
const std::vector<std::string> &clusterPresetNames();
llvm::Expected<Cluster> clusterPreset(const std::string &name);
/// A cluster from a JSON file (the format `--calibrate` writes; see
/// docs/planner.md).
llvm::Expected<Cluster> loadCluster(const std::string &path);
llvm::Error saveCluster(const Cluster &cluster, const std::string &path);

/// Throughput at `size` from ascending points (log-linear interpolation,
/// clamped at the ends).
double interpolate(const std::vector<Point> &points, double size);

} // namespace ptc::planner

#endif // PTC_PLANNER_CLUSTER_H
