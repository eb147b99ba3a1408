// Malformed meshes.
// RUN: not ptc-opt %s --ptc-shard="mesh=dp" 2>&1 | FileCheck %s --check-prefix=SYNTAX
// SYNTAX: error: mesh axis 'dp' must be written name:size (e.g. dp:2)
// RUN: not ptc-opt %s --ptc-shard="mesh=dp:2,dp:2" 2>&1 | FileCheck %s --check-prefix=TWICE
// TWICE: error: mesh axis 'dp' appears twice
// RUN: not ptc-opt %s --ptc-shard="mesh=tp:0" 2>&1 | FileCheck %s --check-prefix=SIZE
// SIZE: error: mesh axis 'tp' has size 0; sizes must be at least 1
// RUN: not ptc-opt %s --ptc-shard 2>&1 | FileCheck %s --check-prefix=NONE
// NONE: error: ptc-propagate-sharding needs a mesh: mesh=dp:2,tp:2 or a 'ptc.mesh' module attribute
// An axis name ptc does not know would run full replicas: an error listing the known ones.
// RUN: not ptc-opt %s --ptc-shard="mesh=foo:2" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: error: unknown mesh axis 'foo'; known axes: dp (data parallelism, ZeRO), tp (tensor and sequence parallelism), pp (pipeline parallelism), ep (expert parallelism), cp (context parallelism)
// An ep axis over a model without experts only splits the batch: a warning.
// RUN: ptc-opt %s --ptc-shard="mesh=dp:2,ep:2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=EP
// EP: warning: mesh axis 'ep' (size 2, expert parallelism) has no effect: the model has no experts
func.func @f(%x: tensor<4xf32> {ptc.input = "x"}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
