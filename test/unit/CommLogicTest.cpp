// The communication logic that does not need several GPUs: mesh groups (the
// color/key every backend splits by), the collective watchdog (done, library
// error, timeout: abort once, name collective and rank), and the executor's
// ordering of device-resident collectives against compute (the communication
// stream waits for the producers; the compute stream waits for the collective
// only where its result is read).

#include "runtime/comm/communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/device/cpu_device.h"
#include "runtime/exec/executor.h"
#include "test/unit/PlanBuilder.h"

#include <gtest/gtest.h>

#include <chrono>

namespace ptc {
namespace {

TEST(MeshGroups, ColorAndKeyMatchTheGroupMembers) {
  Mesh mesh{{"pp", "dp", "tp"}, {2, 2, 2}};
  EXPECT_EQ(mesh.rankOf({1, 0, 1}), 5);
  // tp pairs are adjacent ranks; dp pairs are 2 apart; pp pairs 4 apart.
  EXPECT_EQ(mesh.groupRanks(5, {2}), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.groupRanks(5, {1}), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh.groupRanks(5, {0}), (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh.groupRanks(5, {1, 2}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.groupRanks(2, {0, 2}), (std::vector<int>{2, 3, 6, 7}));
  // Every rank of a group computes the same color and a distinct key.
  for (const std::vector<int> &axes : {std::vector<int>{1}, std::vector<int>{0, 2}})
    for (int r = 0; r < 8; ++r) {
      std::vector<int> members = mesh.groupRanks(r, axes);
      for (size_t i = 0; i < members.size(); ++i) {
        Mesh::GroupKey k = mesh.groupKey(mesh.coords(members[i]), axes);
        EXPECT_EQ(k.color, mesh.groupKey(mesh.coords(r), axes).color);
        EXPECT_EQ(k.key, static_cast<int>(i));
      }
    }
  EXPECT_EQ(mesh.describeAxes({1, 2}), "{dp,tp}");
}

TEST(Watchdog, ReturnsWhenTheCollectiveFinishes) {
  int polls = 0, aborts = 0;
  Status s = waitForCollective(
      [&] {
        return CollectiveProgress{++polls < 3 ? CollectiveProgress::kPending
                                              : CollectiveProgress::kDone,
                                  ""};
      },
      [&] { ++aborts; }, "all_reduce of x", 0, {});
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(aborts, 0);
}

TEST(Watchdog, LibraryErrorAbortsAndNamesCollectiveAndRank) {
  int aborts = 0;
  Status s = waitForCollective(
      [&] { return CollectiveProgress{CollectiveProgress::kFailed, "remote process exited"}; },
      [&] { ++aborts; }, "reduce_scatter of 'w' over mesh axes {dp}", 3, {});
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(s.message(), "reduce_scatter of 'w' over mesh axes {dp} failed on rank 3: remote "
                         "process exited (communicator aborted)");
}

TEST(Watchdog, StuckPeerTimesOutInsteadOfHanging) {
  int aborts = 0;
  WatchdogOptions options;
  options.timeoutSeconds = 0.05;
  auto t0 = std::chrono::steady_clock::now();
  Status s = waitForCollective([&] { return CollectiveProgress{}; }, [&] { ++aborts; },
                               "all_reduce of a bucket over mesh axes {dp}", 1, options);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(aborts, 1);
  EXPECT_GE(waited, 0.05);
  EXPECT_LT(waited, 5.0);
  EXPECT_NE(s.message().find("all_reduce of a bucket over mesh axes {dp} did not complete within "
                             "0.05 s on rank 1"),
            std::string::npos)
      << s.message();
}

// ---- Executor ordering with a device-resident communicator --------------------

/// A CPU device that logs its stream and event calls.
class RecordingDevice : public CpuDevice {
public:
  explicit RecordingDevice(std::vector<std::string> *log) : log_(log) {}
  StatusOr<Event> record(StreamKind s) override {
    log_->push_back("record " + name(s) + " e" + std::to_string(next_));
    return Event{next_++};
  }
  Status wait(StreamKind s, Event e) override {
    log_->push_back(name(s) + " waits e" + std::to_string(e));
    return Status::ok();
  }
  Status copyOn(StreamKind s, void *dst, const void *src, int64_t bytes) override {
    log_->push_back("copy on " + name(s));
    return CpuDevice::copyOn(s, dst, src, bytes);
  }
  Status launch(kernels::KernelCall call) override {
    log_->push_back("kernel");
    return CpuDevice::launch(call);
  }

private:
  static std::string name(StreamKind s) {
    return s == StreamKind::Compute ? "compute" : "comm";
  }
  std::vector<std::string> *log_;
  int next_ = 0;
};

/// Rank 0 of dp=2 whose peer holds the same values: a sum doubles them. Says
/// it is device resident, as NCCL does.
class FakeDeviceComm : public Communicator {
public:
  explicit FakeDeviceComm(std::vector<std::string> *log) : log_(log) {
    mesh_ = Mesh{{"dp"}, {2}};
    coords_ = {0};
  }
  int rank() const override { return 0; }
  int worldSize() const override { return 2; }
  bool deviceResident() const override { return true; }
  Status drain() override {
    log_->push_back("drain");
    return Status::ok();
  }
  Status allReduceSum(float *data, int64_t count, const std::vector<int> &,
                      const std::string &) override {
    log_->push_back("all_reduce");
    for (int64_t i = 0; i < count; ++i)
      data[i] *= 2.0f;
    return Status::ok();
  }
  Status allReduceSumBf16(uint16_t *, int64_t, const std::vector<int> &,
                          const std::string &) override {
    return unexpected();
  }
  Status allReduceMax(float *, int64_t, const std::vector<int> &, const std::string &) override {
    return unexpected();
  }
  Status reduceScatterSum(const float *, float *, int64_t, int, const std::string &) override {
    return unexpected();
  }
  Status reduceScatterSumBf16(const uint16_t *, uint16_t *, int64_t, int,
                              const std::string &) override {
    return unexpected();
  }
  Status allToAll(const void *, void *, int64_t, int, const std::string &) override {
    return unexpected();
  }
  Status allGather(const void *, void *, int64_t, int, const std::string &) override {
    return unexpected();
  }
  Status gatherToRoot(const void *, int64_t, void *) override { return unexpected(); }
  Status send(const void *, int64_t, int, int, int, const std::string &) override {
    return unexpected();
  }
  Status recv(void *, int64_t, int, int, int, const std::string &) override {
    return unexpected();
  }
  Status flushSends() override { return Status::ok(); }
  StatusOr<std::vector<std::string>> allGatherStrings(const std::string &) override {
    return unexpected();
  }
  StatusOr<bool> anyRank(bool) override { return unexpected(); }

private:
  static Status unexpected() { return error(StatusCode::kInternal, "unexpected collective"); }
  std::vector<std::string> *log_;
};

TEST(ExecutorOrdering, DeviceCollectivesOverlapUntilTheirResultIsRead) {
  using test::InstDesc;
  using plan::OpCode;
  using plan::TensorKind;
  // x -> scale -> g; all_reduce(g) -> r; an unrelated scale of x -> u; scale(r) -> loss.
  auto bytes = test::buildPlan(
      {{"x", TensorKind::Input, {4}},
       {"g", TensorKind::Temporary, {4}, 0},
       {"loss", TensorKind::Temporary, {4}, 16},
       {"r", TensorKind::Temporary, {4}, 32},
       {"u", TensorKind::Temporary, {4}, 48}},
      {InstDesc{OpCode::Scale, {0}, {1}, {}, {1.0}},
       InstDesc{OpCode::AllReduce, {1}, {3}, {0}, {}},
       InstDesc{OpCode::Scale, {0}, {4}, {}, {3.0}},
       InstDesc{OpCode::Scale, {3}, {2}, {}, {0.5}}},
      64, plan::kFormatVersion, {{"dp", 2}});
  auto loaded = LoadedPlan::loadBytes(bytes, "ordering.plan");
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  EXPECT_EQ(Executor::collectiveGroups(**loaded), (std::vector<std::vector<int>>{{0}}));

  std::vector<std::string> log;
  auto created = Executor::create(*loaded, 0, std::make_unique<RecordingDevice>(&log));
  ASSERT_TRUE(created.isOk()) << created.status().message();
  Executor &ex = **created;
  FakeDeviceComm comm(&log);
  ex.setCommunicator(&comm);
  std::vector<float> x{1, 2, 3, 4};
  ASSERT_TRUE(ex.setInput(0, x.data()).isOk());
  log.clear();
  ASSERT_TRUE(ex.step().isOk());
  const std::vector<std::string> want = {
      "kernel",                 // g = x
      "record compute e0",      // the producers of the bucket ...
      "comm waits e0",          // ... before the communication stream sums it
      "all_reduce",             //
      "copy on comm",           // unpacked on the communication stream
      "record comm e1",         //
      "kernel",                 // u: does not wait for the collective (overlap)
      "compute waits e1",       // loss reads r: waits here
      "kernel",                 //
      "drain",                  // the step ends with every collective done
  };
  EXPECT_EQ(log, want);
  auto loss = ex.gatherWhole(2);
  ASSERT_TRUE(loss.isOk());
  EXPECT_EQ(*loss, (std::vector<float>{1, 2, 3, 4})); // 2x summed, halved
}

} // namespace
} // namespace ptc
