//===- Passes.h - micro-batches and pipeline stages -------------*- C++ -*-===//

#ifndef PTC_PASSES_PIPELINE_PASSES_H
#define PTC_PASSES_PIPELINE_PASSES_H

#include "dialects/ptc/PtcOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::ptc {
#define GEN_PASS_DECL
#include "passes/pipeline/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/pipeline/Passes.h.inc"

/// On the step function: the micro-batch count (ptc-microbatch).
inline constexpr llvm::StringLiteral kMicrobatchesAttrName = "ptc.microbatches";
/// On the step function: {ranks, chunks, split_weight} (ptc-split-stages).
inline constexpr llvm::StringLiteral kPipelineAttrName = "ptc.pipeline";
/// On every op of a split step: its chunk (-1: every pipeline rank) and segment.
inline constexpr llvm::StringLiteral kStageAttrName = "ptc.stage";
inline constexpr llvm::StringLiteral kSegmentAttrName = "ptc.segment";
/// On a forward op of the model: a new pipeline chunk starts here.
inline constexpr llvm::StringLiteral kStageBoundaryAttrName = "ptc.stage_boundary";
/// On the step function: {name, actions = [[action strings] per rank]}.
inline constexpr llvm::StringLiteral kScheduleAttrName = "ptc.schedule";
} // namespace mlir::ptc

#endif // PTC_PASSES_PIPELINE_PASSES_H
