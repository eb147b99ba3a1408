//===- Planner.h - ranked search over parallel layouts ----------*- C++ -*-===//
//
// The planner compiles small probes of the model with the real pipeline
// (ptc-compile without pp at one and two layers for costs), reads per-op
// FLOPs and bytes and the collectives ptc-shard inserted, and from them
// predicts the step time of every layout: compute per pipeline chunk, each
// collective on the link its group spans, which communication overlaps
// compute, and the pipeline bubble by simulating the actual schedule
// (runtime/schedule). Memory is the compiler's: the layout's plan at two and
// three layers per chunk screens it, the whole model's plan (its peak with
// the pipeline's activation stash, as ptc-opt predicts it) decides it.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_PLANNER_PLANNER_H
#define PTC_PLANNER_PLANNER_H

#include "planner/Cluster.h"

#include "models/Models.h"

#include "runtime/base/option_values.h"
#include "runtime/schedule/schedule.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir::ptc {
struct CompilePipelineOptions;
} // namespace mlir::ptc

namespace ptc::planner {

/// The shortest per-rank chunk of the sequence the default search gives
/// context parallelism (shorter chunks leave the ring's transfers exposed).
inline constexpr int64_t kMinCpChunk = 4096;

/// The model being planned: one of ptc-model's builders (per-layer probes),
/// or a whole .mlir file (each layout compiled in full).
enum class ModelSource { Gpt, Llama, File };

struct ModelSpec {
  ModelSource kind = ModelSource::Gpt;
  /// "gpt", "llama" or "file" (messages).
  const char *kindName() const {
    return kind == ModelSource::Gpt ? "gpt" : kind == ModelSource::Llama ? "llama" : "file";
  }
  mlir::ptc::GptConfig gpt;
  mlir::ptc::LlamaConfig llama;
  std::string file;
  int64_t layers() const { return kind == ModelSource::Gpt ? gpt.layers : llama.layers; }
  int64_t heads() const { return kind == ModelSource::Gpt ? gpt.heads : llama.heads; }
  int64_t kvHeads() const { return kind == ModelSource::Gpt ? gpt.heads : llama.kvHeads; }
  int64_t seq() const { return kind == ModelSource::Gpt ? gpt.seq : llama.seq; }
  int64_t hidden() const { return kind == ModelSource::Gpt ? gpt.hidden : llama.hidden; }
  int64_t fileExperts = 0; ///< a file's experts per MoE layer (`ptc.experts`), found when it is read
  int64_t experts() const {
    return kind == ModelSource::Gpt ? gpt.moe.experts : kind == ModelSource::Llama ? llama.moe.experts : fileExperts;
  }
};

struct SearchSpace {
  int64_t devices = 1;
  int64_t globalBatch = 0; ///< sequences per step (builders; a file's batch is its own)
  std::vector<int64_t> tp, pp, dp, ep; ///< empty: every divisor
  /// Context parallelism sizes; empty: 1, and every divisor that leaves each
  /// rank at least kMinCpChunk tokens (a long sequence's memory saver).
  std::vector<int64_t> cp;
  std::vector<CpAttention> cpAttention{CpAttention::Ring, CpAttention::Ulysses};
  std::vector<int64_t> microBatchSizes{1, 2, 4};
  std::vector<int64_t> virtualStages{1, 2};
  std::vector<int> zero{0, 1, 2, 3};
  std::vector<Recompute> recompute{Recompute::None, Recompute::Selective, Recompute::Full};
  std::vector<schedule::ScheduleKind> schedules{schedule::ScheduleKind::OneFOneB,
                                                schedule::ScheduleKind::Interleaved1F1B,
                                                schedule::ScheduleKind::ZbH1};
  std::vector<bool> sequenceParallel{false, true};
  bool tpAcrossNodes = false;
  Precision precision = Precision::Bf16; ///< ptc-compile's precision=
  OptimizerKind optimizer = OptimizerKind::AdamW;
  /// The job's other ptc-compile options (optimizer settings, clipping, the
  /// learning-rate schedule): every probe compiles with them. An optimizer=
  /// among them replaces `optimizer`.
  std::string compileOptions;
};

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, virtualStages = 1, microBatch = 1, microbatches = 1;
  bool sequenceParallel = false;
  int zero = 0;
  Recompute recompute = Recompute::None;
  schedule::ScheduleKind schedule = schedule::ScheduleKind::OneFOneB;
  int64_t ep = 1; ///< expert parallelism (MoE models): experts split over ep, the batch over dp x ep
  int64_t cp = 1; ///< context parallelism: the sequence split over cp for the whole layer
  CpAttention cpAttention = CpAttention::Ring; ///< with cp > 1
  int64_t devices() const { return dp * ep * cp * tp * pp; }
  /// The layout as ptc-compile options: as text (what ptc-plan prints), or
  /// set on typed options (what the planner's probes compile with); one list.
  std::string compileOptions(Precision precision) const;
  void applyTo(mlir::ptc::CompilePipelineOptions &options, Precision precision) const;
  std::string describe() const;
};

struct Estimate {
  Layout layout;
  double step = 0;    ///< seconds
  double compute = 0; ///< per rank, all micro-batches, the slowest pipeline rank
  double tpComm = 0, dpComm = 0, ppComm = 0, epComm = 0; ///< exposed seconds per step
  /// Context parallelism's exposed seconds per step: the ring's key/value
  /// transfers that the attention blocks do not hide, or Ulysses' all-to-alls.
  double cpComm = 0;
  double bubble = 0;   ///< idle fraction of the pipeline (simulated)
  double optimizer = 0; ///< the step segment (updates and their collectives)
  double tokensPerSecond = 0, tflopsPerDevice = 0, mfu = 0;
  double memory = 0; ///< predicted peak bytes of the fullest device (0: not computed)
  /// Whether `memory` is the whole model's compiled plan (ptc-opt's figure),
  /// not an estimate extrapolated from probes.
  bool memoryExact = false;
  /// Of which parameters, their gradients and the optimizer state (the ZeRO
  /// paper's model states).
  double modelStateMemory = 0;
  int memoryRank = 0;
  bool fits = true;
  std::string limit; ///< what the step time is mostly spent on
};

struct SearchStats {
  int64_t layouts = 0, invalid = 0, outOfMemory = 0, probes = 0;
  /// Layouts whose memory the whole model's plan was compiled for.
  int64_t wholeCompiles = 0;
  double seconds = 0;
  std::map<std::string, int64_t> invalidReasons;
  /// The layout with the smallest predicted peak among those that did not fit.
  std::optional<Estimate> smallest;
};

/// Predicted compute seconds of a compiled step by class of op, on a device
/// of `cluster` with `ranks` ranks (calibration compares them with a profile).
struct ClassSeconds {
  double matmul = 0, attention = 0, other = 0;
};
ClassSeconds predictClasses(mlir::func::FuncOp compiled, const Cluster &cluster, int64_t ranks);

class Planner {
public:
  Planner(mlir::MLIRContext &context, ModelSpec model, Cluster cluster, SearchSpace space);
  ~Planner();
  /// Every valid layout that fits, fastest first (at most `keep`).
  llvm::Expected<std::vector<Estimate>> search(size_t keep, SearchStats &stats);
  /// One layout (memory included even if it does not fit).
  llvm::Expected<Estimate> evaluate(const Layout &layout);
  /// Why `layout` is not a valid layout (empty: it is).
  std::string invalidReason(const Layout &layout) const;
  const Cluster &cluster() const { return cluster_; }

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Cluster cluster_;
};

} // namespace ptc::planner

#endif // PTC_PLANNER_PLANNER_H
