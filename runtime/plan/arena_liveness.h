// The memory plan of a plan file, checked like the rest of it: no two arena
// temporaries that are live at the same time share a byte. The lifetimes are
// the compiler's (passes/memory/PlanMemory.cpp), derived from the
// instructions alone: a temporary lives from its first write to its last read
// (the end of the step for a plan output); in a pipelined plan, a value
// handed to another segment lives to the end of its own segment and one read
// from another segment from the start of the reader's, micro-batch sums and
// per-step receives live the whole step, and buffers of different pipeline
// ranks never meet. A reshape may view its operand's bytes, and an in-place
// all-reduce bucket (allReduceInPlace) its operands' bytes; the padding
// between a bucket's operands is written by the reduction too.
#ifndef PTC_RUNTIME_PLAN_ARENA_LIVENESS_H
#define PTC_RUNTIME_PLAN_ARENA_LIVENESS_H

#include "runtime/base/status.h"

namespace ptc {

class LoadedPlan;

/// An error naming both tensors, their bytes and lifetimes, and an
/// instruction at which both are live, when two live temporaries overlap.
Status verifyArenaLiveness(const LoadedPlan &plan);

} // namespace ptc

#endif // PTC_RUNTIME_PLAN_ARENA_LIVENESS_H
