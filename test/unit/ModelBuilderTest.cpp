// Tests of the model builders: parameter names and counts, verified IR, and
// configuration errors.

#include "models/Models.h"

#include "dialects/ptc/PtcOps.h"
#include "passes/analysis/ModelStatistics.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>

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

// The model key table (models/ModelKeys.h) is the one list of the builders'
// settings: every key of every builder that takes it must change what that
// builder builds, so a key cannot be listed and then ignored.
namespace {
/// A valid value other than the default for each key (with moe_experts set
/// for the MoE-layer keys). A key added to the table needs one here.
std::optional<::ptc::models::ModelValue> changedValue(std::string_view key) {
  using V = ::ptc::models::ModelValue;
  static const std::map<std::string, V, std::less<>> values = {
      {"preset", V(std::string("gpt2"))}, {"layers", V(int64_t{4})}, {"hidden", V(int64_t{256})},
      {"heads", V(int64_t{2})}, {"kv_heads", V(int64_t{4})}, {"intermediate", V(int64_t{128})},
      {"vocab", V(int64_t{300})}, {"rope_theta", V(500000.0)}, {"rms_norm_eps", V(1e-6)},
      {"tie_embeddings", V(true)}, {"dtype", V(std::string("bf16"))}, {"dropout", V(0.1)},
      {"document_end", V(int64_t{5})}, {"input", V(int64_t{32})}, {"classes", V(int64_t{7})},
      {"experts", V(int64_t{8})}, {"top_k", V(int64_t{1})}, {"groups", V(int64_t{2})},
      {"capacity_factor", V(2.0)}, {"moe_experts", V(int64_t{4})}, {"moe_top_k", V(int64_t{1})},
      {"moe_every", V(int64_t{2})}, {"moe_ffn", V(int64_t{64})}, {"moe_capacity_factor", V(2.0)},
      {"moe_aux_loss", V(0.5)}, {"moe_z_loss", V(0.1)}, {"moe_shared_experts", V(int64_t{1})},
      {"moe_bias_balancing", V(0.01)}, {"batch", V(int64_t{4})}, {"seq", V(int64_t{32})}};
  auto it = values.find(key);
  if (it == values.end())
    return std::nullopt;
  return it->second;
}

std::string printedModel(MLIRContext &context, ::ptc::BuilderKind builder,
                         const ::ptc::models::ModelArgs &args) {
  llvm::Expected<BuiltModel> built = buildModel(context, builder, args);
  if (!built)
    return "error: " + llvm::toString(built.takeError());
  std::string text;
  llvm::raw_string_ostream os(text);
  built->module->print(os);
  return text;
}
} // namespace

TEST(ModelKeys, EveryKeyChangesTheModelOfEachBuilderThatTakesIt) {
  MLIRContext context;
  for (const ::ptc::models::ModelKey &key : ::ptc::models::modelKeys()) {
    ASSERT_FALSE(key.builders.empty()) << key.name;
    ASSERT_TRUE(changedValue(key.name).has_value()) << "no test value for model key " << key.name;
    for (::ptc::BuilderKind builder : key.builders) {
      ::ptc::models::ModelArgs base;
      if (std::string_view(key.name).rfind("moe_", 0) == 0 && key.name != std::string("moe_experts"))
        base.set("moe_experts", int64_t{4});
      if (key.name == std::string("preset") && builder == ::ptc::BuilderKind::Llama) {
        // A small published shape would do; the smallest is 7B: check the
        // configuration instead of building it.
        ::ptc::models::ModelArgs args = base;
        args.set("preset", std::string("mistral-7b"));
        llvm::Expected<LlamaConfig> c = llamaConfigFrom(args);
        ASSERT_TRUE(static_cast<bool>(c)) << llvm::toString(c.takeError());
        EXPECT_EQ(c->hidden, 4096);
        continue;
      }
      ::ptc::models::ModelArgs changed = base;
      changed.set(key.name, *changedValue(key.name));
      const std::string before = printedModel(context, builder, base);
      const std::string after = printedModel(context, builder, changed);
      ASSERT_EQ(before.rfind("error: ", 0), std::string::npos) << before;
      ASSERT_EQ(after.rfind("error: ", 0), std::string::npos)
          << key.name << " for " << ::ptc::optionName(builder) << ": " << after;
      EXPECT_NE(before, after) << "model key " << key.name << " does not change the "
                               << ::ptc::optionName(builder) << " model";
    }
  }
}

TEST(ModelKeys, GivenValuesAreCheckedAgainstTheirBounds) {
  const ::ptc::models::ModelKey *layers = ::ptc::models::findModelKey("model", "layers");
  ASSERT_NE(layers, nullptr);
  EXPECT_EQ(layers->flag(), "--layers");
  EXPECT_EQ(::ptc::models::checkModelValue(*layers, int64_t{0}).value_or(""),
            "must be at least 1, got 0");
  EXPECT_EQ(::ptc::models::checkModelValue(*layers, int64_t{5000}).value_or(""),
            "must be at most 4096, got 5000");
  EXPECT_FALSE(::ptc::models::checkModelValue(*layers, int64_t{12}));
  const ::ptc::models::ModelKey *dtype = ::ptc::models::findModelKey("dtype");
  ASSERT_NE(dtype, nullptr);
  EXPECT_EQ(::ptc::models::checkModelValue(*dtype, std::string("f64")).value_or(""),
            "must be f32, bf16 or f16, got 'f64'");
  const ::ptc::models::ModelKey *theta = ::ptc::models::findModelKey("rope_theta");
  ASSERT_NE(theta, nullptr);
  EXPECT_EQ(::ptc::models::checkModelValue(*theta, std::nan("")).value_or(""),
            "must be a finite number, got nan");
  EXPECT_EQ(::ptc::models::findModelKey("kv_heads")->flag(), "--kv-heads");
}
