// Tests of the model builders: parameter names and counts, verified IR, and
// configuration errors.

#include "models/Models.h"

#include "dialects/ptc/PtcOps.h"
#include "passes/analysis/ModelStatistics.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::ptc;

namespace {
func::FuncOp trainStep(ModuleOp module) {
  return cast<func::FuncOp>(module.lookupSymbol("train_step"));
}

TEST(GptModel, Gpt2SmallHasAbout124MParameters) {
  GptConfig c{/*layers=*/12, /*hidden=*/768, /*heads=*/12, /*seq=*/1024, /*vocab=*/50304,
              /*batch=*/1, ::ptc::FloatDtype::F32, {}};
  // wte + wpe + 12 blocks + ln_f, lm_head tied to wte.
  const int64_t h = 768;
  const int64_t block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) +
                        (4 * h * h + h);
  const int64_t expected = 50304 * h + 1024 * h + 12 * block + 2 * h;
  EXPECT_EQ(expected, 124475904);
  EXPECT_EQ(countElements(gptParameters(c)), expected);

  MLIRContext context;
  auto module = buildGptModel(context, c);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  ModelStatistics stats = computeModelStatistics(trainStep(**module));
  EXPECT_EQ(stats.numParams, expected);
  EXPECT_EQ(stats.params.size(), 2u + 12u * 12u + 2u);
  ASSERT_EQ(stats.inputs.size(), 2u);
  EXPECT_EQ(stats.inputs[0].name, "tokens");
  EXPECT_EQ(stats.inputs[1].name, "targets");
}

TEST(GptModel, ParameterNamesFollowNanoGpt) {
  GptConfig c;
  c.layers = 2;
  std::vector<TensorSpec> params = gptParameters(c);
  ASSERT_FALSE(params.empty());
  EXPECT_EQ(params.front().name, "transformer.wte.weight");
  EXPECT_EQ(params.front().shape, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(params[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(params[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(params[4].shape, (std::vector<int64_t>{384, 128}));
  EXPECT_EQ(params.back().name, "transformer.ln_f.bias");
}

TEST(GptModel, OneAttentionAndTwoLayerNormsPerBlock) {
  MLIRContext context;
  GptConfig c;
  c.layers = 3;
  auto module = buildGptModel(context, c);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  ModelStatistics stats = computeModelStatistics(trainStep(**module));
  EXPECT_EQ(stats.opCounts.lookup("ptc.causal_attention"), 3);
  EXPECT_EQ(stats.opCounts.lookup("ptc.layer_norm"), 2 * 3 + 1);
  EXPECT_EQ(stats.opCounts.lookup("ptc.gelu"), 3);
  EXPECT_EQ(stats.opCounts.lookup("ptc.cross_entropy"), 1);
  // 4 linear layers per block + the tied LM head.
  EXPECT_EQ(stats.opCounts.lookup("ptc.matmul"), 4 * 3 + 1);
}

TEST(GptModel, RejectsHiddenNotDivisibleByHeads) {
  MLIRContext context;
  GptConfig c;
  c.hidden = 130;
  c.heads = 4;
  auto module = buildGptModel(context, c);
  ASSERT_FALSE(static_cast<bool>(module));
  EXPECT_EQ(llvm::toString(module.takeError()),
            "gpt: --hidden 130 is not divisible by --heads 4");
}

// Ids are int32 in plans; uint32 token files carry vocabularies above 65536.
TEST(GptModel, RejectsVocabBeyondInt32) {
  MLIRContext context;
  GptConfig c;
  c.vocab = int64_t{1} << 31;
  auto module = buildGptModel(context, c);
  ASSERT_FALSE(static_cast<bool>(module));
  EXPECT_NE(llvm::toString(module.takeError()).find("exceeds 2^31 - 1"), std::string::npos);
}

TEST(GptModel, Bf16ParametersAndActivations) {
  MLIRContext context;
  GptConfig c;
  c.dtype = ::ptc::FloatDtype::Bf16;
  auto module = buildGptModel(context, c);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  ModelStatistics stats = computeModelStatistics(trainStep(**module));
  EXPECT_EQ(stats.paramBytes, 2 * stats.numParams);
  EXPECT_TRUE(trainStep(**module).getResultTypes()[0] ==
              RankedTensorType::get({}, BFloat16Type::get(&context)));
}

TEST(MlpModel, ParameterCount) {
  MlpConfig c{/*layers=*/3, /*input=*/64, /*hidden=*/128, /*classes=*/10, /*batch=*/32, ::ptc::FloatDtype::F32};
  EXPECT_EQ(countElements(mlpParameters(c)), (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10));
  MLIRContext context;
  auto module = buildMlpModel(context, c);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  EXPECT_EQ(computeModelStatistics(trainStep(**module)).opCounts.lookup("ptc.relu"), 2);
}

TEST(MoeModel, CapacityAndRouting) {
  MoeConfig c;
  c.batch = 30;
  c.experts = 4;
  c.topK = 2;
  c.capacityFactor = 1.0;
  EXPECT_EQ(moeCapacity(c), 15); // ceil(30 * 2 / 4)
  MLIRContext context;
  auto module = buildMoeModel(context, c);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  ModelStatistics stats = computeModelStatistics(trainStep(**module));
  EXPECT_EQ(stats.opCounts.lookup("ptc.top_k_gate"), 1);
  EXPECT_EQ(stats.opCounts.lookup("ptc.moe_dispatch"), 1);
  EXPECT_EQ(stats.opCounts.lookup("ptc.moe_combine"), 1);
}

TEST(MoeModel, RejectsTopKAboveExperts) {
  MLIRContext context;
  MoeConfig c;
  c.topK = 5;
  c.experts = 4;
  auto module = buildMoeModel(context, c);
  ASSERT_FALSE(static_cast<bool>(module));
  EXPECT_EQ(llvm::toString(module.takeError()), "moe: --top-k 5 exceeds --experts 4");
}
} // namespace
