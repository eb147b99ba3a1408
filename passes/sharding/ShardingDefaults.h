//===- ShardingDefaults.h - default sharding rules --------------*- C++ -*-===//

#ifndef PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H
#define PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcSharding.h"

namespace mlir::ptc {

/// A default sharding per argument (parameters and their optimizer state),
/// below user annotations: what ptc-propagate-sharding starts from.
using ShardingDefaults = llvm::DenseMap<BlockArgument, Sharding>;

/// Megatron-LM tensor parallelism: per parameter (and its optimizer state) a
/// sharding spec over the tensor axis. Fails, naming the axis and parameter,
/// when the axis cannot split a layer the rules recognize.
FailureOr<ShardingDefaults>
megatronDefaults(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel);

/// ZeRO stage `zero` over the data axis, on top of `specs`.
/// Expert parallelism: parameters stacked over experts (`ptc.experts`) and
/// their optimizer state split over ep along dimension 0. Errors when ep does
/// not divide an expert count; warns when the mesh has ep and the model no
/// experts.
LogicalResult expertDefaults(func::FuncOp func, const MeshInfo &mesh,
                             ShardingDefaults &specs);

/// ZeRO's defaults: optimizer state (stage >= 1) and parameters (stage 3)
/// split over dp. At stage 1, also moves each gradient's widening copy (mixed
/// precision) to its first reader at the end of the step, so that what stays
/// whole from the backward pass to the update is the low-precision gradient.
void zeroDefaults(func::FuncOp func, const MeshInfo &mesh, int zero, ShardingDefaults &specs);

/// Muon's stacks of matrices (ptc-optimizer's `ptc.muon_stack` and
/// `ptc.muon_orthogonal`): a dealt stack is split over dp along the stack,
/// so that each rank orthogonalizes its share; any other stack is whole (a
/// stack of one expert-batched parameter keeps its split over experts). The
/// orthogonalized stack leaves split as its parameters are in `specs` (or
/// their annotation) when they all are alike, else whole.
void muonDefaults(func::FuncOp func, const MeshInfo &mesh, const ShardingDefaults &specs);

/// The operand of `op` that is a gradient on its way to a fused update (the
/// update's own gradient, or the source of a convert feeding one); -1 if none.
int updateGradientOperand(Operation *op);

} // namespace mlir::ptc

#endif // PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H
