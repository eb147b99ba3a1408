// Communicator: the collectives an SPMD plan needs, over groups of the device
// mesh. A group is named by a set of mesh axes: the ranks that differ from
// this one only along those axes. Implementations: MPI (mpi_communicator.cc);
// a single process needs none.
#ifndef PTC_RUNTIME_COMM_COMMUNICATOR_H
#define PTC_RUNTIME_COMM_COMMUNICATOR_H

#include "runtime/base/status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptc {

class Device;

/// The device mesh of a plan: ranks are numbered row-major over the axes.
struct Mesh {
  std::vector<std::string> axes;
  std::vector<int> sizes;

  int numRanks() const;
  /// Coordinates of `rank` along every axis.
  std::vector<int> coords(int rank) const;
  /// "dp=2 x tp=2"
  std::string describe() const;
  /// The rank at `coords`.
  int rankOf(const std::vector<int> &coords) const;

  /// The group of `axes` around a device at `coords`: the devices that differ
  /// from it only along those axes. `color` numbers the group (row-major over
  /// the other axes), `key` the member (row-major over `axes`, in mesh axis
  /// order) -- the arguments of MPI_Comm_split / ncclCommSplit.
  struct GroupKey {
    int color, key;
  };
  GroupKey groupKey(const std::vector<int> &coords, const std::vector<int> &axes) const;
  /// World ranks of the group of `axes` around `rank`, in member (key) order.
  std::vector<int> groupRanks(int rank, const std::vector<int> &axes) const;
  /// "{dp,tp}" ("{}" for none).
  std::string describeAxes(const std::vector<int> &axes) const;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  const Mesh &mesh() const { return mesh_; }
  /// Whether the buffers are device memory and the collectives are enqueued
  /// on the device's communication stream (NCCL) rather than done on host
  /// memory before returning (MPI).
  virtual bool deviceResident() const { return false; }
  /// Waits until every collective enqueued so far has finished (device
  /// resident communicators; the others finish each call before returning),
  /// or fails naming the collective and rank after the timeout.
  virtual Status drain() { return Status::ok(); }
  const std::vector<int> &coords() const { return coords_; }

  /// In-place elementwise sum of `count` floats over the group of `axes`.
  virtual Status allReduceSum(float *data, int64_t count, const std::vector<int> &axes,
                              const std::string &what) = 0;
  /// The same for bf16 values (each pairwise sum rounded to bf16, as NCCL
  /// does): half the bytes on the wire.
  virtual Status allReduceSumBf16(uint16_t *data, int64_t count, const std::vector<int> &axes,
                                  const std::string &what) = 0;
  /// In-place elementwise maximum over the group of `axes`.
  virtual Status allReduceMax(float *data, int64_t count, const std::vector<int> &axes,
                              const std::string &what) = 0;
  /// Sums `in` (one block of `count` floats per group member, in coordinate
  /// order) over the group of `axis`; this member keeps its block in `out`.
  virtual Status reduceScatterSum(const float *in, float *out, int64_t count, int axis,
                                  const std::string &what) = 0;
  virtual Status reduceScatterSumBf16(const uint16_t *in, uint16_t *out, int64_t count, int axis,
                                     const std::string &what) = 0;
  /// Sends block r of `in` (`bytes` each, coordinate order) to member r of the
  /// group of `axis`; block r of `out` receives member r's block.
  virtual Status allToAll(const void *in, void *out, int64_t bytes, int axis,
                          const std::string &what) = 0;
  /// Gathers `bytes` from every member of the group of `axis` into `out`
  /// (member blocks in coordinate order).
  virtual Status allGather(const void *in, void *out, int64_t bytes, int axis,
                           const std::string &what) = 0;
  /// Gathers `bytes` from every rank into `out` on rank 0 (rank order).
  virtual Status gatherToRoot(const void *in, int64_t bytes, void *out) = 0;
  /// Point-to-point along mesh axis `axis`: to / from the rank whose
  /// coordinate on `axis` is `peer` (all other coordinates equal to this
  /// one's). A send copies `data` and returns at once; flushSends() waits for
  /// every send to be delivered. A receive blocks (up to the timeout).
  virtual Status send(const void *data, int64_t bytes, int axis, int peer, int tag,
                      const std::string &what) = 0;
  virtual Status recv(void *data, int64_t bytes, int axis, int peer, int tag,
                      const std::string &what) = 0;
  virtual Status flushSends() = 0;
  /// One step of a ring along mesh axis `axis`: sends `bytes` of `data` to
  /// the member whose coordinate is this one's + 1 (mod the axis size) and
  /// receives as many from the one before into `into` (a distinct buffer).
  /// A device-resident communicator enqueues both on the communication
  /// stream as one group (NCCL send/recv: every member sends and receives at
  /// once without deadlock); the others move host memory before returning.
  virtual Status ringShift(const void *data, void *into, int64_t bytes, int axis, int tag,
                           const std::string &what) {
    const int n = mesh_.sizes[static_cast<size_t>(axis)], c = coords_[static_cast<size_t>(axis)];
    PTC_RETURN_IF_ERROR(send(data, bytes, axis, (c + 1) % n, tag, what));
    return recv(into, bytes, axis, (c + n - 1) % n, tag, what);
  }
  /// Gathers one string per rank on every rank (small metadata only).
  virtual StatusOr<std::vector<std::string>> allGatherStrings(const std::string &mine) = 0;
  /// Whether any rank passes true (host memory, every rank; a coordination
  /// collective under the control timeout): how ranks agree on a step
  /// boundary to stop at when only some of them were signalled.
  virtual StatusOr<bool> anyRank(bool mine) = 0;

protected:
  Mesh mesh_;
  std::vector<int> coords_;
};

/// Whether a launcher (OpenMPI, MPICH/Hydra, Slurm) started this process.
bool launchedByMpi();

/// Initializes MPI and builds a communicator for `mesh`, with collectives that
/// fail (naming the collective, group and timeout) instead of hanging when a
/// peer dies or stalls for `timeoutSeconds`. `controlTimeoutSeconds` (0: the
/// same) bounds the collectives that coordinate ranks rather than move a
/// step's data (allGatherStrings: the plan check at start, the checkpoint
/// agreement), where one rank may rightly work far longer than the others
/// (writing the shards of a checkpoint). The world size must equal the mesh
/// size; otherwise the error says both.
StatusOr<std::unique_ptr<Communicator>> createMpiCommunicator(const Mesh &mesh,
                                                              double timeoutSeconds,
                                                              double controlTimeoutSeconds = 0);
/// Whether this build has the NCCL backend (CUDA builds).
bool ncclCompiledIn();
/// NCCL collectives on `device`'s communication stream (device memory;
/// deviceResident()); pipeline point-to-point stays on `host` (host memory). `host` (MPI) bootstraps it (the unique
/// id goes from rank 0 to all) and keeps the host-side calls (gatherToRoot,
/// allGatherStrings). One NCCL communicator per group in `groups` (sets of
/// mesh axes; every rank passes the same list) is split from the world one up
/// front. Every wait polls ncclCommGetAsyncError and the stream; an error or
/// `timeoutSeconds` without progress aborts the communicators and fails
/// naming the collective and rank.
StatusOr<std::unique_ptr<Communicator>>
createNcclCommunicator(std::unique_ptr<Communicator> host, Device &device,
                       const std::vector<std::vector<int>> &groups, double timeoutSeconds);

/// Finalizes MPI if it was initialized (normal exit).
void finalizeMpi();
/// Aborts every rank of the job (after an unrecoverable error on this one).
[[noreturn]] void abortMpi(int code);
/// This process's world rank, 0 without MPI.
int worldRank();

} // namespace ptc

#endif // PTC_RUNTIME_COMM_COMMUNICATOR_H
