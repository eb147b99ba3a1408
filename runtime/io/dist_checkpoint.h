// Distributed checkpoints: the on-disk format, independent of the layout that
// wrote it (as PyTorch DCP and Megatron's dist_checkpointing).
//
//   DIR/latest                   the name of the newest complete checkpoint
//   DIR/step-00000200/
//     metadata.json              step, every tensor's global name, kind, dtype and
//                                shape, which file holds which box of it, each
//                                file's digest, the model fingerprint, plan facts
//     rank-00003.safetensors     the boxes rank 3 owned (each box once in the
//                                whole checkpoint: replicas are written once)
//   DIR/.step-00000400.tmp/      a checkpoint being written (ignored by readers)
//
// A checkpoint directory appears under its final name only once every file in
// it is written and fsynced (rename of the temporary directory), and `latest`
// is replaced (durably) after that: a crash at any moment leaves the previous
// checkpoint complete and found.
#ifndef PTC_RUNTIME_IO_DIST_CHECKPOINT_H
#define PTC_RUNTIME_IO_DIST_CHECKPOINT_H

#include "runtime/base/status.h"
#include "runtime/io/safetensors.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

/// "step-00000200".
std::string checkpointStepName(int64_t step);

struct CheckpointTensor {
  std::string kind; // "parameter" or "state"
  std::vector<int64_t> shape;
};

/// One box of a tensor in one file (safetensors entry `key`).
struct CheckpointBox {
  std::string tensor, file, key;
  std::vector<int64_t> offset, shape;
};

struct CheckpointMetadata {
  std::string path; // the step directory
  int64_t step = 0; // steps completed: the run continues with this step index
  std::map<std::string, CheckpointTensor> tensors;
  std::vector<CheckpointBox> boxes;
  std::map<std::string, std::string> files; // file -> fnv1a64 digest (hex)
  std::map<std::string, std::string> info;  // optimizer, mesh, plan, model fingerprint
};

/// The fingerprint of a model: its parameters' names and global shapes.
std::string modelFingerprint(const std::map<std::string, std::vector<int64_t>> &parameters);

/// Serializes `meta` as metadata.json text.
std::string checkpointMetadataJson(const CheckpointMetadata &meta);

/// The checkpoint to resume from `dir`: `dir` itself when it holds
/// metadata.json, else the one `dir/latest` names, else the newest complete
/// step directory. Incomplete (temporary or metadata-less) directories found
/// on the way are listed in `incomplete`.
StatusOr<std::string> findCheckpoint(const std::string &dir, std::vector<std::string> *incomplete);

/// Removes the checkpoints of `dir` that were being written when their job
/// ended (".step-N.tmp" folders; no rank may still be writing); returns how
/// many.
int removeTemporaryCheckpoints(const std::string &dir);

/// Complete checkpoints of `dir`, oldest first (for pruning).
std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string &dir);

/// Reads a checkpoint's metadata and, on demand, whole tensors from its boxes.
class CheckpointReader {
public:
  static StatusOr<CheckpointReader> open(const std::string &stepDir);
  const CheckpointMetadata &metadata() const { return meta_; }
  /// Assembles tensor `name` (f32, global shape) from every box of it; every
  /// element must be covered. Files are read (and their digests checked) once.
  Status readWhole(const std::string &name, float *out);
  /// Reads every file (checking its digest and its safetensors header) and
  /// assembles every tensor once, one at a time: the first problem is the
  /// error (a missing, truncated or altered shard, a box the metadata lists
  /// but no file holds, a tensor its boxes do not cover).
  Status verify();
  /// A box of a tensor this rank holds: where it lies in the whole tensor and
  /// in the local storage of shape `localShape`.
  struct Box {
    std::vector<int64_t> wholeOffset, localOffset, shape;
  };
  /// Fills the local tensor `out` (f32, `localShape`) from the checkpoint
  /// boxes that overlap `boxes`, reading only the files that hold them; every
  /// element must be covered.
  Status readLocal(const std::string &name, const std::vector<Box> &boxes,
                   const std::vector<int64_t> &localShape, float *out);

private:
  /// The shard `file`, read and its digest checked on first use.
  StatusOr<SafetensorsFile *> file(const std::string &file);
  CheckpointMetadata meta_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> open_;
};

} // namespace ptc

#endif // PTC_RUNTIME_IO_DIST_CHECKPOINT_H
