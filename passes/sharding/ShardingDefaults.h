//===- ShardingDefaults.h - default sharding rules --------------*- C++ -*-===//

#ifndef PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H
#define PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H

#include "dialects/ptc/PtcMesh.h"

#include <string>

namespace mlir::ptc {

/// Megatron-LM tensor parallelism: per parameter (and its optimizer state) a
/// sharding spec over the tensor axis. Fails, naming the axis and parameter,
/// when the axis cannot split a layer the rules recognize.
FailureOr<llvm::DenseMap<BlockArgument, std::string>>
megatronDefaults(func::FuncOp func, const MeshInfo &mesh, bool sequenceParallel);

/// ZeRO stage `zero` over the data axis, on top of `specs`.
/// Expert parallelism: parameters stacked over experts (`ptc.experts`) and
/// their optimizer state split over ep along dimension 0. Errors when ep does
/// not divide an expert count; warns when the mesh has ep and the model no
/// experts.
LogicalResult expertDefaults(func::FuncOp func, const MeshInfo &mesh,
                             llvm::DenseMap<BlockArgument, std::string> &specs);

void zeroDefaults(func::FuncOp func, const MeshInfo &mesh, int zero,
                  llvm::DenseMap<BlockArgument, std::string> &specs);

} // namespace mlir::ptc

#endif // PTC_PASSES_SHARDING_SHARDINGDEFAULTS_H
