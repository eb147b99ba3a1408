//===- ShardingPhases.h - what propagation hands to partitioning -*- C++ -*-===//
//
// ptc-propagate-sharding decides every sharding and records its decisions on
// the IR as typed attributes; ptc-partition reads them and rewrites the step
// to local shapes with collectives. The attributes below are the contract
// between the two phases (partitioning removes them, except `ptc.shardings`
// and `ptc.sharding_origins`, which stay for reading the IR):
//
// On ops:
//   ptc.operand_shardings  [#ptc.sharding, ...]  what each operand must be
//   ptc.shardings          [#ptc.sharding, ...]  what each result is
//   ptc.sharding_origins   ["default rule", ...] where each result's came from
//   ptc.operand_scales     array<f64>            multiply operands first (optional)
//   ptc.result_scales      array<f64>            multiply results after (optional)
//   ptc.reshard_results    [{result, to, why[, scaled]}]
//                          results resharded right after the op (a rule's
//                          `then`; with `scaled`, the rescaled result: a user
//                          annotation), in order
//   ptc.partitioned_form   the partitioned form the op's rule chose (the
//                          classes axis of a vocabulary-parallel
//                          cross-entropy), for the op's `partition` method
//   ptc.whole_gradient     i64   ZeRO-1: this operand is a gradient reduced
//                                whole (all-reduce, then sliced)
// On arguments:
//   ptc.sharding           #ptc.sharding         the argument's own sharding
//   ptc.reshard_on_entry   #ptc.sharding         what every user reads (the
//                                                batch over dp*ep)
//   ptc.gather_per_use     unit                  ZeRO-3: each use gathers anew
//
//===----------------------------------------------------------------------===//

#ifndef PTC_PASSES_SHARDING_SHARDINGPHASES_H
#define PTC_PASSES_SHARDING_SHARDINGPHASES_H

#include "dialects/ptc/PtcSharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <string>

namespace mlir::ptc::sharding {

inline constexpr StringLiteral kOperandShardings = "ptc.operand_shardings";
inline constexpr StringLiteral kResultShardings = PtcDialect::kShardingsAttrName;
inline constexpr StringLiteral kOrigins = PtcDialect::kShardingOriginsAttrName;
inline constexpr StringLiteral kOperandScales = "ptc.operand_scales";
inline constexpr StringLiteral kResultScales = "ptc.result_scales";
inline constexpr StringLiteral kReshardResults = "ptc.reshard_results";
inline constexpr StringLiteral kWholeGradient = "ptc.whole_gradient";
inline constexpr StringLiteral kReshardOnEntry = PtcDialect::kReshardOnEntryAttrName;
inline constexpr StringLiteral kGatherPerUse = PtcDialect::kGatherPerUseAttrName;

/// "'wte'" for a named argument, "the result of ptc.matmul at loc" otherwise.
std::string describe(func::FuncOp func, Value v);
/// "[dp, _] partial(tp)".
std::string text(const MeshInfo &mesh, const Sharding &s);
/// The local type of a value of global type `g` split as `s`, or an error at
/// `where` (or at the value) when an axis does not divide its dimension.
FailureOr<RankedTensorType> localType(func::FuncOp func, const MeshInfo &mesh, Value v,
                                      RankedTensorType g, const Sharding &s, Operation *where);
/// `s` with sums over a compound axis written as sums over its mesh axes.
Sharding normalizePartial(const MeshInfo &mesh, const Sharding &s);
/// A fused optimizer update (its gradient is operand #1).
bool isFusedUpdate(Operation *op);

} // namespace mlir::ptc::sharding

#endif // PTC_PASSES_SHARDING_SHARDINGPHASES_H
