//===- ModelBlocks.h - a model file's repeated blocks, and cutting them ---===//
//
// Internal to the planner: it compiles a model file cut to a few of its
// repeated blocks and extrapolates, as it builds one- and two-layer probes
// of builder models.
//
//===----------------------------------------------------------------------===//

#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/DenseMap.h"

#include <optional>
#include <vector>

namespace ptc::planner {

/// A model file's repeated blocks (nn.ModuleList entries, a builder's
/// layers): parameters named `<prefix><i>.<rest>` for i = 0..L-1 with the same
/// `<rest>`s, and the op regions they delimit: region i starts at the first op
/// that reads a parameter of block i, all regions have the same ops, and what
/// follows the last region (the final norm, the head, the loss) reads only
/// its results. The planner compiles the file cut to a few blocks and
/// extrapolates, as it builds one- and two-layer probes of builder models.
struct FileBlocks {
  int64_t layers = 0;
  size_t length = 0;               // ops per region
  std::vector<size_t> begin;       // per block: its first op's index
  llvm::DenseMap<mlir::BlockArgument, int64_t> layerOf;
};

/// The blocks of `func`'s parameters named `<prefix><i>.<rest>`, or nothing
/// when the file has none or its regions differ.
std::optional<FileBlocks> findBlocks(mlir::func::FuncOp func);

/// `module` (one function, blocks `fb`) cut to its first `keep` blocks: what
/// followed the last block now reads the corresponding results of block
/// keep - 1. Null when the cut does not close (a later op reads an earlier
/// block's values).
mlir::OwningOpRef<mlir::ModuleOp> truncateBlocks(mlir::ModuleOp module, const FileBlocks &fb,
                                                 int64_t keep);

} // namespace ptc::planner
