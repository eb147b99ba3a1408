// TrainingSession: the step loop calls its hooks in order and stops at the
// first failure; parameters round-trip through safetensors.
#include "runtime/session/training_session.h"

#include "test/unit/PlanBuilder.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using namespace ptc;
using namespace ptc::test;

namespace {

std::string writePlan(const std::string &name) {
  std::vector<TensorDesc> tensors{{"x", plan::TensorKind::Input, {2, 3}},
                                  {"w", plan::TensorKind::Parameter, {3, 4}},
                                  {"y", plan::TensorKind::Temporary, {2, 4}, 0}};
  auto bytes = buildPlan(tensors, {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::unique_ptr<TrainingSession> session(const std::string &path) {
  SessionOptions options;
  options.planPath = path;
  options.device = "cpu";
  options.needsData = false;
  auto created = TrainingSession::create(options);
  EXPECT_TRUE(created.isOk()) << created.status().message();
  return created.isOk() ? std::move(*created) : nullptr;
}

struct Recorder : SessionHook {
  std::vector<std::string> calls;
  int64_t failAt = -1;
  Status beforeStep(TrainingSession &, int64_t step) override {
    calls.push_back("before " + std::to_string(step));
    return Status::ok();
  }
  Status afterStep(TrainingSession &, const StepResult &r) override {
    calls.push_back("after " + std::to_string(r.step));
    if (r.step == failAt)
      return invalidArgument("hook stops at step ", r.step);
    return Status::ok();
  }
  Status afterRun(TrainingSession &) override {
    calls.push_back("end");
    return Status::ok();
  }
};

} // namespace

TEST(TrainingSession, RunsStepsWithHooksInOrder) {
  auto s = session(writePlan("hooks.plan"));
  ASSERT_TRUE(s);
  Recorder a, b;
  ASSERT_TRUE(s->run(5, 2, {&a, &b}).isOk());
  std::vector<std::string> expected{"before 5", "after 5", "before 6", "after 6", "end"};
  EXPECT_EQ(a.calls, expected);
  EXPECT_EQ(b.calls, expected);
  EXPECT_TRUE(s->leader());
  EXPECT_EQ(s->communicator(), nullptr); // one process, no MPI
}

TEST(TrainingSession, AFailingHookEndsTheRunWithItsError) {
  auto s = session(writePlan("failing.plan"));
  ASSERT_TRUE(s);
  Recorder a;
  a.failAt = 1;
  Status st = s->run(0, 5, {&a});
  EXPECT_EQ(st.message(), "hook stops at step 1");
  EXPECT_EQ(a.calls.back(), "after 1");
}

TEST(TrainingSession, ParametersRoundTripThroughSafetensors) {
  std::string plan = writePlan("save.plan");
  auto s = session(plan);
  ASSERT_TRUE(s);
  float *w = s->executor().f32(1);
  for (int i = 0; i < 12; ++i)
    w[i] = 0.5f * static_cast<float>(i);
  std::string file = ::testing::TempDir() + "w.safetensors";
  ASSERT_TRUE(s->saveParameters(file, {{"producer", "test"}}).isOk());
  auto t = session(plan);
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->loadParameters(file).isOk());
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(t->executor().f32(1)[i], 0.5f * static_cast<float>(i));
}

TEST(TrainingSession, NamesAMissingPlanAndMissingData) {
  SessionOptions options;
  options.planPath = ::testing::TempDir() + "does-not-exist.plan";
  auto missing = TrainingSession::create(options);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("does-not-exist.plan"), std::string::npos);
  options.planPath = writePlan("nodata.plan");
  options.device = "cpu";
  auto noData = TrainingSession::create(options);
  ASSERT_FALSE(noData.isOk());
  EXPECT_NE(noData.status().message().find("has no data source"), std::string::npos)
      << noData.status().message();
}
