// Learning-rate schedules against the definitions they follow: nanoGPT's
// get_lr (train.py: linear warmup (it + 1) / (warmup + 1), cosine decay to
// min_lr at lr_decay_iters, min_lr after) and Megatron's
// OptimizerParamScheduler decay (cosine and linear between warmup and decay
// steps), written out here independently at sample steps.

#include "kernels/common/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

using ptc::kernels::LrScheduleKind;
using ptc::kernels::scheduledLr;

namespace {
// nanoGPT's get_lr(it), verbatim in structure.
double nanoGptLr(int it, double learningRate, double minLr, int warmupIters, int decayIters) {
  if (it < warmupIters)
    return learningRate * (it + 1) / (warmupIters + 1);
  if (it > decayIters)
    return minLr;
  double decayRatio = double(it - warmupIters) / (decayIters - warmupIters);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * decayRatio));
  return minLr + coeff * (learningRate - minLr);
}

// Megatron's get_lr after warmup, for num_steps in [warmup, decay].
double megatronDecay(int numSteps, double maxLr, double minLr, int warmup, int decay,
                     bool cosine) {
  double ratio = double(numSteps - warmup) / double(decay - warmup);
  double coeff = cosine ? 0.5 * (std::cos(M_PI * ratio) + 1.0) : 1.0 - ratio;
  return minLr + coeff * (maxLr - minLr);
}
} // namespace

TEST(LrSchedule, CosineIsNanoGptGetLr) {
  // nanoGPT's shakespeare-char defaults: lr 1e-3, min 1e-4, warmup 100, decay 5000.
  for (int it : {0, 1, 50, 99, 100, 101, 1000, 2550, 4999, 5000, 5001, 9000})
    EXPECT_NEAR(scheduledLr(LrScheduleKind::Cosine, 1e-3, 1e-4, 100, 5000, it + 1),
                nanoGptLr(it, 1e-3, 1e-4, 100, 5000), 1e-15)
        << "it " << it;
}

TEST(LrSchedule, DecayIsMegatronCosineAndLinear) {
  // Megatron counts num_steps from 0 after warmup as ptc counts it = step - 1.
  for (int n : {2000, 2001, 10000, 250000, 499999, 500000})
    for (bool cosine : {true, false})
      EXPECT_NEAR(scheduledLr(cosine ? LrScheduleKind::Cosine : LrScheduleKind::Linear, 6e-4,
                              6e-5, 2000, 500000, n + 1),
                  megatronDecay(n, 6e-4, 6e-5, 2000, 500000, cosine), 1e-15)
          << "num_steps " << n << (cosine ? " cosine" : " linear");
}

TEST(LrSchedule, ConstantWithAndWithoutWarmup) {
  EXPECT_DOUBLE_EQ(scheduledLr(LrScheduleKind::Constant, 3e-4, 0, 0, 0, 1), 3e-4);
  EXPECT_DOUBLE_EQ(scheduledLr(LrScheduleKind::Constant, 3e-4, 0, 0, 0, 1e6), 3e-4);
  EXPECT_DOUBLE_EQ(scheduledLr(LrScheduleKind::Constant, 3e-4, 0, 9, 0, 1), 3e-5);
  EXPECT_DOUBLE_EQ(scheduledLr(LrScheduleKind::Constant, 3e-4, 0, 9, 0, 10), 3e-4);
  EXPECT_DOUBLE_EQ(scheduledLr(LrScheduleKind::Constant, 3e-4, 0, 9, 0, 11), 3e-4);
}
