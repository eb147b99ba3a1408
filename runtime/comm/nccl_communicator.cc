// NCCL communicator (CUDA builds): collectives and ring attention's send/recv
// on the device's communication stream (pipeline point-to-point stays on MPI
// through host memory); the executor orders them against compute
// with events. Non-blocking communicators: every call that reports
// ncclInProgress, and every drain(), is watched (runtime/comm/watchdog.h), so
// a dead peer or a NCCL error aborts the communicators and names the
// collective and rank instead of hanging.

#include "runtime/comm/communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/device/device.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

namespace ptc {
namespace {

class NcclCommunicator final : public Communicator {
public:
  NcclCommunicator(std::unique_ptr<Communicator> host, Device &device, double timeout)
      : host_(std::move(host)), stream_(static_cast<cudaStream_t>(
                                    device.nativeStream(StreamKind::Communication))) {
    mesh_ = host_->mesh();
    coords_ = host_->coords();
    watchdog_.timeoutSeconds = timeout;
  }
  ~NcclCommunicator() override {
    if (!aborted_) {
      // Non-blocking communicators: finalize (flushes outstanding work, may
      // report ncclInProgress), wait until ready, then destroy; any failure or
      // timeout aborts instead.
      Status s = drain();
      std::vector<ncclComm_t> comms;
      for (auto &[mask, c] : groups_)
        comms.push_back(c);
      if (world_)
        comms.push_back(world_);
      for (ncclComm_t c : comms)
        if (s.isOk() && !aborted_) {
          ncclResult_t r = ncclCommFinalize(c);
          s = r == ncclSuccess || r == ncclInProgress ? ready(c, "finalizing a NCCL communicator")
                                                      : checked(r, "ncclCommFinalize", c);
        }
      if (!s.isOk())
        abortAll();
      else
        for (ncclComm_t c : comms)
          ncclCommDestroy(c);
    }
    for (const InFlight &f : inflight_)
      cudaEventDestroy(f.done);
    for (cudaEvent_t e : freeEvents_)
      cudaEventDestroy(e);
  }

  Status init(const std::vector<std::vector<int>> &groups) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank() == 0)
      PTC_RETURN_IF_ERROR(checked(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
    auto ids = host_->allGatherStrings(
        rank() == 0 ? std::string(reinterpret_cast<const char *>(&id), sizeof id) : std::string());
    if (!ids.isOk())
      return ids.status();
    if ((*ids)[0].size() != sizeof id)
      return error(StatusCode::kInternal, "rank ", rank(), ": NCCL unique id from rank 0 has ",
                   (*ids)[0].size(), " bytes, expected ", sizeof id);
    std::memcpy(&id, (*ids)[0].data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    PTC_RETURN_IF_ERROR(checked(ncclCommInitRankConfig(&world_, worldSize(), id, rank(), &config),
                                "ncclCommInitRankConfig", world_));
    PTC_RETURN_IF_ERROR(ready(world_, "creating the NCCL world communicator"));
    // Every rank splits the same groups in the same order (the split is
    // collective over the world).
    std::vector<unsigned> masks;
    for (const std::vector<int> &axes : groups)
      masks.push_back(maskOf(axes));
    std::sort(masks.begin(), masks.end());
    masks.erase(std::unique(masks.begin(), masks.end()), masks.end());
    for (unsigned mask : masks) {
      std::vector<int> axes = axesOf(mask);
      Mesh::GroupKey k = mesh_.groupKey(coords_, axes);
      ncclComm_t c = nullptr;
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      PTC_RETURN_IF_ERROR(checked(ncclCommSplit(world_, k.color, k.key, &c, &cfg), "ncclCommSplit",
                                  world_));
      PTC_RETURN_IF_ERROR(ready(world_, "splitting the NCCL communicator for mesh axes " +
                                            mesh_.describeAxes(axes)));
      PTC_RETURN_IF_ERROR(ready(c, "creating the NCCL communicator for mesh axes " +
                                       mesh_.describeAxes(axes)));
      groups_[mask] = c;
    }
    return Status::ok();
  }

  int rank() const override { return host_->rank(); }
  int worldSize() const override { return host_->worldSize(); }
  bool deviceResident() const override { return true; }

  Status allReduceSum(float *data, int64_t count, const std::vector<int> &axes,
                      const std::string &what) override {
    return enqueue("all_reduce", what, axes, [&](ncclComm_t c) {
      return ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, c,
                           stream_);
    });
  }
  Status allReduceSumBf16(uint16_t *data, int64_t count, const std::vector<int> &axes,
                          const std::string &what) override {
    return enqueue("all_reduce(bf16)", what, axes, [&](ncclComm_t c) {
      return ncclAllReduce(data, data, static_cast<size_t>(count), ncclBfloat16, ncclSum, c,
                           stream_);
    });
  }
  Status allReduceMax(float *data, int64_t count, const std::vector<int> &axes,
                      const std::string &what) override {
    return enqueue("all_reduce(max)", what, axes, [&](ncclComm_t c) {
      return ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclMax, c,
                           stream_);
    });
  }
  Status reduceScatterSum(const float *in, float *out, int64_t count, int axis,
                          const std::string &what) override {
    return enqueue("reduce_scatter", what, {axis}, [&](ncclComm_t c) {
      return ncclReduceScatter(in, out, static_cast<size_t>(count), ncclFloat32, ncclSum, c,
                               stream_);
    });
  }
  Status reduceScatterSumBf16(const uint16_t *in, uint16_t *out, int64_t count, int axis,
                              const std::string &what) override {
    return enqueue("reduce_scatter(bf16)", what, {axis}, [&](ncclComm_t c) {
      return ncclReduceScatter(in, out, static_cast<size_t>(count), ncclBfloat16, ncclSum, c,
                               stream_);
    });
  }
  Status allToAll(const void *in, void *out, int64_t bytes, int axis,
                  const std::string &what) override {
    int members = mesh_.sizes[static_cast<size_t>(axis)];
    return enqueue("all_to_all", what, {axis}, [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      for (int m = 0; m < members && (r == ncclSuccess || r == ncclInProgress); ++m) {
        r = ncclSend(static_cast<const uint8_t *>(in) + m * bytes, static_cast<size_t>(bytes),
                     ncclUint8, m, c, stream_);
        if (r == ncclSuccess || r == ncclInProgress)
          r = ncclRecv(static_cast<uint8_t *>(out) + m * bytes, static_cast<size_t>(bytes),
                       ncclUint8, m, c, stream_);
      }
      ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess ? end : r;
    });
  }
  Status allGather(const void *in, void *out, int64_t bytes, int axis,
                   const std::string &what) override {
    return enqueue("all_gather", what, {axis}, [&](ncclComm_t c) {
      return ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, c, stream_);
    });
  }
  Status gatherToRoot(const void *in, int64_t bytes, void *out) override {
    return host_->gatherToRoot(in, bytes, out);
  }
  StatusOr<std::vector<std::string>> allGatherStrings(const std::string &mine) override {
    return host_->allGatherStrings(mine);
  }
  StatusOr<bool> anyRank(bool mine) override { return host_->anyRank(mine); }
  // Pipeline point-to-point: host memory through MPI (see Executor::p2pView:
  // NCCL sends would block until matched, and 1F1B has both neighbours send
  // before they receive).
  Status send(const void *data, int64_t bytes, int axis, int peer, int tag,
              const std::string &what) override {
    return host_->send(data, bytes, axis, peer, tag, what);
  }
  Status recv(void *data, int64_t bytes, int axis, int peer, int tag,
              const std::string &what) override {
    return host_->recv(data, bytes, axis, peer, tag, what);
  }
  Status flushSends() override {
    PTC_RETURN_IF_ERROR(drain());
    return host_->flushSends();
  }
  // Ring attention's steps: device memory, NCCL send/recv on the
  // communication stream (every member sends and receives in one group, so
  // the ring cannot deadlock on the order).
  Status ringShift(const void *data, void *into, int64_t bytes, int axis, int /*tag*/,
                   const std::string &what) override {
    const int n = mesh_.sizes[static_cast<size_t>(axis)], me = coords_[static_cast<size_t>(axis)];
    return enqueue("ring send/recv", what, {axis}, [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclSend(data, static_cast<size_t>(bytes), ncclUint8, (me + 1) % n, c, stream_);
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclRecv(into, static_cast<size_t>(bytes), ncclUint8, (me + n - 1) % n, c, stream_);
      ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  Status drain() override {
    while (!inflight_.empty()) {
      InFlight f = inflight_.front();
      Status s = waitForCollective(
          [&] {
            cudaError_t e = cudaEventQuery(f.done);
            if (e == cudaSuccess)
              return CollectiveProgress{CollectiveProgress::kDone, ""};
            if (e != cudaErrorNotReady)
              return CollectiveProgress{CollectiveProgress::kFailed, cudaGetErrorString(e)};
            return asyncErrors();
          },
          [&] { abortAll(); }, f.what, rank(), watchdog_);
      if (!s.isOk())
        return s;
      freeEvents_.push_back(f.done);
      inflight_.pop_front();
    }
    return Status::ok();
  }

private:
  struct InFlight {
    cudaEvent_t done;
    std::string what;
  };

  static unsigned maskOf(const std::vector<int> &axes) {
    unsigned m = 0;
    for (int a : axes)
      m |= 1u << a;
    return m;
  }
  std::vector<int> axesOf(unsigned mask) const {
    std::vector<int> axes;
    for (size_t a = 0; a < mesh_.sizes.size(); ++a)
      if (mask & (1u << a))
        axes.push_back(static_cast<int>(a));
    return axes;
  }

  Status checked(ncclResult_t r, const char *call, ncclComm_t c) {
    if (r == ncclSuccess || r == ncclInProgress)
      return Status::ok();
    const char *last = c ? ncclGetLastError(c) : nullptr;
    return error(StatusCode::kInternal, "rank ", rank(), ": ", call, " failed: ",
                 ncclGetErrorString(r), last && *last ? std::string(" (") + last + ")" : "");
  }

  /// Waits until `c` has no operation in progress (non-blocking communicators).
  Status ready(ncclComm_t c, const std::string &what) {
    return waitForCollective(
        [&] {
          ncclResult_t st = ncclSuccess;
          ncclResult_t r = ncclCommGetAsyncError(c, &st);
          if (r != ncclSuccess)
            return CollectiveProgress{CollectiveProgress::kFailed, ncclGetErrorString(r)};
          if (st == ncclSuccess)
            return CollectiveProgress{CollectiveProgress::kDone, ""};
          if (st == ncclInProgress)
            return CollectiveProgress{CollectiveProgress::kPending, ""};
          return CollectiveProgress{CollectiveProgress::kFailed,
                                    std::string(ncclGetErrorString(st)) + ": " + ncclGetLastError(c)};
        },
        [&] { abortAll(); }, what, rank(), watchdog_);
  }

  /// Asynchronous errors of any communicator (a failed peer shows up there).
  CollectiveProgress asyncErrors() {
    auto look = [&](ncclComm_t c) -> CollectiveProgress {
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess &&
          st != ncclInProgress)
        return {CollectiveProgress::kFailed,
                std::string(ncclGetErrorString(st)) + ": " + ncclGetLastError(c)};
      return {CollectiveProgress::kPending, ""};
    };
    CollectiveProgress p = look(world_);
    for (auto &[mask, c] : groups_)
      if (p.kind == CollectiveProgress::kPending)
        p = look(c);
    return p;
  }

  void abortAll() {
    if (aborted_)
      return;
    aborted_ = true;
    for (auto &[mask, c] : groups_)
      ncclCommAbort(c);
    if (world_)
      ncclCommAbort(world_);
  }

  Status enqueue(const char *kind, const std::string &what, const std::vector<int> &axes,
                 const std::function<ncclResult_t(ncclComm_t)> &call) {
    std::string desc = std::string(kind) + " of " + what +
                       (axes.empty() ? std::string() : " over mesh axes " + mesh_.describeAxes(axes));
    if (aborted_)
      return error(StatusCode::kInternal, "rank ", rank(), ": ", desc,
                   ": the NCCL communicators were aborted after an earlier failure");
    ncclComm_t c = world_;
    if (!axes.empty()) {
      auto it = groups_.find(maskOf(axes));
      if (it == groups_.end())
        return error(StatusCode::kInternal, "rank ", rank(), ": ", desc,
                     ": no NCCL communicator was created for mesh axes ",
                     mesh_.describeAxes(axes));
      c = it->second;
    }
    ncclResult_t r = call(c);
    PTC_RETURN_IF_ERROR(checked(r, kind, c));
    if (r == ncclInProgress)
      PTC_RETURN_IF_ERROR(ready(c, desc));
    cudaEvent_t done;
    if (!freeEvents_.empty()) {
      done = freeEvents_.back();
      freeEvents_.pop_back();
    } else if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
      return error(StatusCode::kInternal, "rank ", rank(), ": cannot create a CUDA event");
    }
    cudaEventRecord(done, stream_);
    inflight_.push_back({done, desc});
    // Retire finished collectives so the list stays short between drains.
    while (inflight_.size() > 64 && cudaEventQuery(inflight_.front().done) == cudaSuccess) {
      freeEvents_.push_back(inflight_.front().done);
      inflight_.pop_front();
    }
    return Status::ok();
  }

  std::unique_ptr<Communicator> host_;
  cudaStream_t stream_;
  WatchdogOptions watchdog_;
  ncclComm_t world_ = nullptr;
  std::map<unsigned, ncclComm_t> groups_;
  std::deque<InFlight> inflight_;
  std::vector<cudaEvent_t> freeEvents_;
  bool aborted_ = false;
};
} // namespace

bool ncclCompiledIn() { return true; }

StatusOr<std::unique_ptr<Communicator>>
createNcclCommunicator(std::unique_ptr<Communicator> host, Device &device,
                       const std::vector<std::vector<int>> &groups, double timeoutSeconds) {
  if (device.kind() != DeviceKind::Cuda)
    return invalidArgument("NCCL needs the CUDA device (this rank runs on ", device.describe(),
                           ")");
  auto comm = std::make_unique<NcclCommunicator>(std::move(host), device, timeoutSeconds);
  PTC_RETURN_IF_ERROR(comm->init(groups));
  return std::unique_ptr<Communicator>(std::move(comm));
}

} // namespace ptc
