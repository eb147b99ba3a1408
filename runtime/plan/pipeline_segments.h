// What one pipeline rank runs of a pipelined plan, per (chunk, segment): its
// instructions, the values it imports from other segments and exports to
// them, and a simulation of the activation stash those values occupy while
// the rank's schedule runs. The executor runs from it, and the compiler's
// memory report predicts the stash with the same code (ptc-export-plan).
#ifndef PTC_RUNTIME_PLAN_PIPELINE_SEGMENTS_H
#define PTC_RUNTIME_PLAN_PIPELINE_SEGMENTS_H

#include "runtime/plan/plan_loader.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

namespace ptc {

struct PipelineSegments {
  struct Segment {
    std::vector<uint32_t> instructions;
    std::vector<int32_t> imports;                 // read here, produced by another segment
    std::vector<std::pair<int32_t, int>> exports; // produced here: (tensor, consumers elsewhere)
    bool readsInputs = false;
  };
  std::map<std::pair<int, int>, Segment> segments; // (chunk, segment)
  std::vector<uint32_t> stepInstructions;           // once per step, after the actions
  std::vector<int32_t> accumulators;                // micro-batch sums (zeroed each step)
  std::map<int32_t, int> recvConsumers;             // received per micro-batch: readers
  std::map<int32_t, std::set<std::pair<int, int>>> readers; // tensor -> segments importing it
  std::map<int32_t, int> sends;                             // tensor -> send instructions
  std::vector<int> nextCompute; // per action of the rank: the next compute action, or -1

  /// Whether export `tensor` of the action at `index` (micro-batch `mb`) stays
  /// in the arena for its only reader, the next compute action (no stash copy).
  bool passesDirectly(const schedule::Pipeline &p, int ppRank, size_t index, int32_t tensor,
                      int consumers) const;
};

/// Derives pipeline rank `ppRank`'s segments from a loaded pipelined plan;
/// an instruction once per step reading a per-micro-batch value is an error.
StatusOr<PipelineSegments> derivePipelineSegments(const LoadedPlan &plan, int ppRank);

/// The activation stash of pipeline rank `ppRank` at its peak while its
/// schedule runs one step: the bytes of the values waiting between segments
/// and micro-batches, as the executor stashes them (received values, and
/// exports that do not pass directly to the next action).
int64_t simulateStashPeak(const LoadedPlan &plan, const PipelineSegments &segments, int ppRank);

} // namespace ptc

#endif // PTC_RUNTIME_PLAN_PIPELINE_SEGMENTS_H
