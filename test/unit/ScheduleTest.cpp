// The pipeline simulation with given durations (what ptc-plan prices a
// pipeline with).
#include "runtime/schedule/schedule.h"

#include <gtest/gtest.h>

namespace sch = ptc::schedule;

namespace {
sch::Pipeline twoStages(const std::string &schedule, int microbatches) {
  sch::Pipeline p;
  p.ranks = 2;
  p.chunks = 2;
  p.microbatches = microbatches;
  p.channels = {{0, 1, sch::Segment::Forward, sch::Segment::Forward, false, false, 0},
                {1, 0, sch::Segment::Backward, sch::Segment::Backward, false, false, 0}};
  EXPECT_TRUE(sch::generate(schedule, p).isOk());
  return p;
}
} // namespace

TEST(ScheduleSimulation, GivenDurationsAndTransfers) {
  // One micro-batch through two stages: F0, transfer, F1, B1, transfer, B0.
  sch::Pipeline p = twoStages("gpipe", 1);
  sch::Timing t;
  t.forward = {1, 3};
  t.backward = {2, 6};
  t.transfer = 0.5;
  auto rep = sch::simulate(p, t);
  ASSERT_TRUE(rep.isOk()) << rep.status().message();
  EXPECT_DOUBLE_EQ(rep->makespan, 1 + 0.5 + 3 + 6 + 0.5 + 2);
  EXPECT_DOUBLE_EQ(rep->busy[0], 3);
  EXPECT_DOUBLE_EQ(rep->busy[1], 9);
}

TEST(ScheduleSimulation, DefaultDurationsAreEqualStages) {
  // 1F1B, 2 ranks, 4 micro-batches: forward 1, backward 2 per micro-batch;
  // the bubble is (p - 1) / (m + p - 1) of every rank's time.
  sch::Pipeline p = twoStages("1f1b", 4);
  auto equal = sch::simulate(p);
  sch::Timing t;
  t.forward = {1, 1};
  t.backward = {2, 2};
  auto given = sch::simulate(p, t);
  ASSERT_TRUE(equal.isOk() && given.isOk());
  EXPECT_DOUBLE_EQ(equal->makespan, given->makespan);
  EXPECT_NEAR(equal->bubble, sch::closedFormBubble(sch::ScheduleKind::OneFOneB, 2, 1, 4), 1e-12);
  sch::Timing wrong;
  wrong.forward = {1};
  EXPECT_FALSE(sch::simulate(p, wrong).isOk());
}

// Option values: every spelling reads back as its value and names it, the
// choices are listed in order, and a message says what was expected.
TEST(OptionValues, SpellingsRoundTripAndMessagesListTheChoices) {
  for (const auto &s : ptc::OptionValues<sch::ScheduleKind>::spellings) {
    EXPECT_EQ(ptc::parseOption<sch::ScheduleKind>(s.name), s.value);
    EXPECT_EQ(ptc::optionName(s.value), s.name);
    EXPECT_TRUE(sch::parseSchedule(std::string(s.name)).isOk());
  }
  EXPECT_EQ(ptc::parseOption<ptc::Recompute>("Full"), std::nullopt); // spellings are exact
  EXPECT_EQ(ptc::parseOption<ptc::Precision>("f32"), std::nullopt);  // precision says fp32
  EXPECT_EQ(ptc::parseOption<ptc::FloatDtype>("f32"), ptc::FloatDtype::F32);
  EXPECT_EQ(ptc::optionChoices<ptc::Recompute>(), "none, selective or full");
  EXPECT_EQ(ptc::optionChoices<ptc::CpAttention>(), "ring or ulysses");
  EXPECT_EQ(ptc::badOptionMessage<ptc::CpAttention>("rings"),
            "cp-attention='rings': expected ring or ulysses");
  EXPECT_EQ(sch::parseSchedule("2f2b").status().message(),
            "unknown schedule '2f2b' (expected one of: gpipe, 1f1b, interleaved-1f1b, zb-h1)");
  EXPECT_EQ(ptc::computeDtype(ptc::Precision::Bf16), ptc::FloatDtype::Bf16);
}
