// The loader's per-instruction checks (internal to runtime/plan; the loader
// runs them on every instruction of a plan it loads).

#pragma once

#include "runtime/base/status.h"
#include "runtime/plan/plan_loader.h"

#include <string>
#include <vector>

namespace ptc {

/// "2x3x4" ("scalar" for rank 0), as the loader's messages write shapes.
std::string shapeStr(const std::vector<int64_t> &shape);

/// Checks `inst` against the tensor table: operand and attribute counts,
/// shapes and element types as its opcode's shape rule says, attribute
/// values (mesh axes among `meshSizes`' indices, functions the kernels have).
/// The message does not name the instruction (the caller does).
Status checkInstruction(const plan::Instruction &inst, const std::vector<TensorInfo> &tensors,
                        const std::vector<int> &meshSizes);

/// Offload: a host instruction runs on the host CPU and touches only host
/// tensors, a device instruction only device tensors; a Transfer crosses.
Status checkPlacement(const plan::Instruction &inst, const std::vector<TensorInfo> &tensors);

} // namespace ptc
