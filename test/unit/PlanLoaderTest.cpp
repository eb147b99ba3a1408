// The plan loader rejects every malformed plan with a message naming the
// problem: bad identifier, truncation, newer format, bad indices, shapes,
// arena bounds, reads before writes.

#include "runtime/base/checked_math.h"
#include "runtime/base/mesh_text.h"
#include "runtime/plan/plan_format.h"
#include "runtime/plan/plan_loader.h"
#include "test/unit/PlanBuilder.h"

#include <gtest/gtest.h>

using namespace ptc;
namespace fb = flatbuffers;

namespace {
using test::TensorDesc;
using test::InstDesc;
using test::buildPlan;

// y[2x4] = x[2x3] @ w[3x4], loss-like output is the temporary.
std::vector<TensorDesc> matmulTensors() {
  return {{"x", plan::TensorKind::Input, {2, 3}},
          {"w", plan::TensorKind::Parameter, {3, 4}},
          {"y", plan::TensorKind::Temporary, {2, 4}, 0}};
}

std::string loadError(const std::vector<uint8_t> &bytes) {
  auto loaded = LoadedPlan::loadBytes(bytes, "test.plan");
  return loaded.isOk() ? "" : loaded.status().message();
}

TEST(PlanLoader, AcceptsAValidPlan) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  EXPECT_EQ(loadError(bytes), "");
}

TEST(PlanLoader, RejectsMissingIdentifier) {
  std::vector<uint8_t> bytes(64, 0);
  EXPECT_NE(loadError(bytes).find("not a ptc plan"), std::string::npos);
}

TEST(PlanLoader, RejectsTruncatedPlan) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  bytes.resize(bytes.size() / 2);
  std::string err = loadError(bytes);
  EXPECT_NE(err.find("corrupt or truncated plan"), std::string::npos) << err;
}

TEST(PlanLoader, RejectsNewerFormatVersion) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32,
                         plan::kFormatVersion + 1);
  std::string expected = "plan format version " + std::to_string(plan::kFormatVersion + 1) +
                         " is newer than this ptc-run supports (" +
                         std::to_string(plan::kFormatVersion) + ")";
  EXPECT_NE(loadError(bytes).find(expected), std::string::npos) << loadError(bytes);
}

TEST(PlanLoader, RejectsTensorIndexOutOfRange) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 7}, {2}, {0, 0}, {}}}, 32);
  EXPECT_NE(loadError(bytes).find("instruction #0 (Matmul): input tensor index 7 is out of range"),
            std::string::npos);
}

TEST(PlanLoader, RejectsMatmulShapeMismatch) {
  auto tensors = matmulTensors();
  tensors[1].shape = {5, 4};
  auto bytes = buildPlan(tensors, {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  EXPECT_NE(loadError(bytes).find("contracting dimensions differ: lhs has 3, rhs has 5"), std::string::npos);
}

// Matmul's optional third input is a bias of the result's last dimension.
TEST(PlanLoader, ChecksMatmulBiasShape) {
  auto withBias = [](std::vector<int64_t> bias, size_t extra = 0) {
    auto tensors = matmulTensors();
    tensors.push_back({"b", plan::TensorKind::Parameter, bias});
    std::vector<int32_t> inputs = {0, 1, 3};
    for (size_t i = 0; i < extra; ++i)
      inputs.push_back(3);
    return loadError(buildPlan(tensors, {{plan::OpCode::Matmul, inputs, {2}, {0, 0}, {}}}, 32));
  };
  EXPECT_EQ(withBias({4}), "");
  EXPECT_NE(withBias({3}).find("bias has shape 3, expected 4"), std::string::npos)
      << withBias({3});
  EXPECT_NE(withBias({4}, 1).find("expects 3 inputs and 1 outputs, has 4 and 1"),
            std::string::npos)
      << withBias({4}, 1);
}

// Matmul's optional second output is the bias gradient: lhs [3, 2] (with
// transpose_lhs) summed over its 3 rows, [2]; never beside a bias.
TEST(PlanLoader, ChecksMatmulBiasGradientShape) {
  auto withSums = [](std::vector<int64_t> sums, bool bias = false) {
    std::vector<TensorDesc> tensors = {{"dy", plan::TensorKind::Input, {3, 2}},
                                       {"x", plan::TensorKind::Input, {3, 4}},
                                       {"dw", plan::TensorKind::Temporary, {2, 4}, 0},
                                       {"db", plan::TensorKind::Temporary, sums, 64},
                                       {"b", plan::TensorKind::Parameter, {4}}};
    std::vector<int32_t> inputs = {0, 1};
    if (bias)
      inputs.push_back(4);
    return loadError(
        buildPlan(tensors, {{plan::OpCode::Matmul, inputs, {2, 3}, {1, 0}, {}}}, 128));
  };
  EXPECT_EQ(withSums({2}), "");
  EXPECT_NE(withSums({3}).find("bias gradient has shape 3, expected 2"), std::string::npos)
      << withSums({3});
  EXPECT_NE(withSums({2}, true).find("takes a bias or gives a bias gradient, not both"),
            std::string::npos)
      << withSums({2}, true);
}

// CausalAttention's optional integer is seq_major: [batch, seq, heads,
// head_dim] operands (here 4 tokens, 2 query heads over 1 kv head).
TEST(PlanLoader, ChecksSeqMajorAttentionShapes) {
  std::vector<TensorDesc> tensors = {{"q", plan::TensorKind::Input, {1, 4, 2, 8}},
                                     {"k", plan::TensorKind::Input, {1, 4, 1, 8}},
                                     {"v", plan::TensorKind::Input, {1, 4, 1, 8}},
                                     {"o", plan::TensorKind::Temporary, {1, 4, 2, 8}, 0}};
  auto attention = [&](std::vector<int64_t> ints) {
    return loadError(
        buildPlan(tensors, {{plan::OpCode::CausalAttention, {0, 1, 2}, {3}, ints, {0.35}}}, 256));
  };
  EXPECT_EQ(attention({1}), "");
  // Read heads-major, the same tensors do not fit (4 kv heads do not divide 2 query heads).
  EXPECT_NE(attention({}).find("key and value must have shape [batch, kv_heads, seq, head_dim]"), std::string::npos) << attention({});
  EXPECT_NE(attention({2}).find("seq_major must be 0 or 1, got 2"), std::string::npos) << attention({2});
  // The counts come from the attribute set (op_attrs.def), which names them.
  EXPECT_NE(attention({1, 0}).find("expects 0 to 1 integer and 1 float attributes, has 2 and 1 "
                                   "(seq_major, scale)"),
            std::string::npos)
      << attention({1, 0});
}

// Packed documents: attention may take one more input, the document positions
// [batch, seq] (i32, after the float inputs); any other input count is refused
// before an input is read, and so are positions of another shape or type.
TEST(PlanLoader, ChecksAttentionDocumentPositions) {
  std::vector<TensorDesc> tensors = {
      {"q", plan::TensorKind::Input, {1, 4, 2, 8}},
      {"k", plan::TensorKind::Input, {1, 4, 1, 8}},
      {"v", plan::TensorKind::Input, {1, 4, 1, 8}},
      {"o", plan::TensorKind::Temporary, {1, 4, 2, 8}, 0},
      {"positions", plan::TensorKind::Input, {1, 4}, -1, plan::DType::I32},
      {"short", plan::TensorKind::Input, {1, 3}, -1, plan::DType::I32},
      {"floats", plan::TensorKind::Input, {1, 4}}};
  auto attention = [&](std::vector<int32_t> in) {
    return loadError(
        buildPlan(tensors, {{plan::OpCode::CausalAttention, in, {3}, {1}, {0.35}}}, 256));
  };
  EXPECT_EQ(attention({0, 1, 2, 4}), "");
  for (std::vector<int32_t> in : {std::vector<int32_t>{0, 1}, {0, 1, 2, 4, 4}})
    EXPECT_NE(attention(in).find("expects 3 inputs, or 4 with the document positions"),
              std::string::npos)
        << attention(in);
  EXPECT_NE(attention({0, 1, 2, 5}).find("document positions has shape 1x3, expected 1x4"),
            std::string::npos)
      << attention({0, 1, 2, 5});
  EXPECT_NE(attention({0, 1, 2, 6}).find("expected i32"), std::string::npos)
      << attention({0, 1, 2, 6});
}

// The forward's softmax statistics saved for the gradient
// (ptc-save-attention-stats): the forward's optional second output, f32
// [batch, heads, seq] beside bf16 operands; the gradient's two inputs after
// the incoming gradient, the forward's result (or a reshape of it) and those
// statistics. Anything else is named.
TEST(PlanLoader, ChecksSavedAttentionStatistics) {
  const plan::DType bf16 = plan::DType::BF16;
  std::vector<TensorDesc> tensors = {{"qkv", plan::TensorKind::Input, {1, 4, 32}, -1, bf16},
                                     {"o", plan::TensorKind::Temporary, {1, 4, 2, 8}, 0, bf16},
                                     {"lse", plan::TensorKind::Temporary, {1, 2, 4}, 256},
                                     {"g", plan::TensorKind::Input, {1, 4, 2, 8}, -1, bf16},
                                     {"dqkv", plan::TensorKind::Temporary, {1, 4, 32}, 512, bf16},
                                     {"flat", plan::TensorKind::Input, {1, 4, 16}, -1, bf16},
                                     {"swapped", plan::TensorKind::Temporary, {1, 4, 2}, 1280},
                                     {"lse16", plan::TensorKind::Temporary, {1, 2, 4}, 1536, bf16},
                                     {"short", plan::TensorKind::Input, {1, 4, 12}, -1, bf16}};
  using plan::OpCode;
  // A gradient after the forward that writes its saved tensors.
  auto load = [&](OpCode op, std::vector<int32_t> in, std::vector<int32_t> out) {
    std::vector<InstDesc> insts;
    if (op == OpCode::CausalAttentionQkvGrad)
      insts.push_back({OpCode::CausalAttentionQkv, {0}, {1, 2}, {}, {0.35}});
    insts.push_back({op, in, out, {}, {0.35}});
    return loadError(buildPlan(tensors, insts, 4096));
  };
  EXPECT_EQ(load(OpCode::CausalAttentionQkv, {0}, {1, 2}), "");
  EXPECT_EQ(load(OpCode::CausalAttentionQkvGrad, {0, 3, 1, 2}, {4}), "");
  EXPECT_EQ(load(OpCode::CausalAttentionQkvGrad, {0, 3, 5, 2}, {4}), ""); // a reshape of o
  std::string shape = load(OpCode::CausalAttentionQkv, {0}, {1, 6});
  EXPECT_NE(shape.find("row statistics has shape 1x4x2, expected 1x2x4"), std::string::npos)
      << shape;
  std::string type = load(OpCode::CausalAttentionQkv, {0}, {1, 7});
  EXPECT_NE(type.find("row statistics 'lse16' are BF16, expected F32"), std::string::npos) << type;
  std::string saved = load(OpCode::CausalAttentionQkvGrad, {0, 3, 8, 2}, {4});
  EXPECT_NE(saved.find("saved result 1x4x12 is not the forward's result 1x4x2x8 or a reshape"),
            std::string::npos)
      << saved;
  std::string count = load(OpCode::CausalAttentionQkvGrad, {0, 3, 1, 2, 1, 2}, {4});
  EXPECT_NE(count.find("expects 2 inputs, or 3 with the document positions, 4 with the forward's "
                       "saved result and row statistics, 5 with both; has 6"),
            std::string::npos)
      << count;
  std::string outputs = load(OpCode::CausalAttentionQkv, {0}, {1, 2, 2});
  EXPECT_NE(outputs.find("expects 1 output, or 2 with the row statistics, has 3"),
            std::string::npos)
      << outputs;
}

// Ring attention (context parallelism) returns and reads the statistics like
// the causal attention ops: the forward's optional second output, f32 [batch,
// heads, block]; the gradient's two inputs after the incoming gradient,
// before the document positions.
TEST(PlanLoader, ChecksRingAttentionStatistics) {
  std::vector<TensorDesc> tensors = {{"q", plan::TensorKind::Input, {1, 2, 4, 8}},
                                     {"lse", plan::TensorKind::Temporary, {1, 2, 4}, 256},
                                     {"o", plan::TensorKind::Temporary, {1, 2, 4, 8}, 0},
                                     {"g", plan::TensorKind::Input, {1, 2, 4, 8}},
                                     {"dq", plan::TensorKind::Temporary, {1, 2, 4, 8}, 512},
                                     {"dk", plan::TensorKind::Temporary, {1, 2, 4, 8}, 768},
                                     {"dv", plan::TensorKind::Temporary, {1, 2, 4, 8}, 1024},
                                     {"positions", plan::TensorKind::Input, {1, 4}, -1,
                                      plan::DType::I32},
                                     {"swapped", plan::TensorKind::Temporary, {1, 4, 2}, 1280}};
  using plan::OpCode;
  auto load = [&](std::vector<int32_t> fwdOut, std::vector<int32_t> gradIn) {
    return loadError(buildPlan(tensors,
                               {{OpCode::RingAttention, {0, 0, 0}, fwdOut, {0}, {0.35}},
                                {OpCode::RingAttentionGrad, gradIn, {4, 5, 6}, {0}, {0.35}}},
                               2048, plan::kFormatVersion, {{"cp", 2}}));
  };
  EXPECT_EQ(load({2}, {0, 0, 0, 3}), "");
  EXPECT_EQ(load({2, 1}, {0, 0, 0, 3, 2, 1}), "");
  EXPECT_EQ(load({2, 1}, {0, 0, 0, 3, 2, 1, 7}), ""); // and the document positions
  std::string shape = load({2, 8}, {0, 0, 0, 3});
  EXPECT_NE(shape.find("row statistics has shape 1x4x2, expected 1x2x4"), std::string::npos)
      << shape;
  std::string saved = load({2, 1}, {0, 0, 0, 3, 2, 8});
  EXPECT_NE(saved.find("row statistics has shape 1x4x2, expected 1x2x4"), std::string::npos)
      << saved;
  std::string count = load({2, 1}, {0, 0, 0, 3, 2, 1, 7, 7});
  EXPECT_NE(count.find("expects 4 inputs, or 5 with the document positions, 6 with the forward's "
                       "saved result and row statistics, 7 with both; has 8"),
            std::string::npos)
      << count;
  std::string outputs = load({2, 1, 1}, {0, 0, 0, 3});
  EXPECT_NE(outputs.find("expects 1 output, or 2 with the row statistics, has 3"),
            std::string::npos)
      << outputs;
}

// CausalAttentionQkv reads [batch, seq, (heads + 2 kv_heads) * head_dim]
// (here 2 query heads over 1 kv head of 8: 32 columns) and gives [batch, seq,
// heads, head_dim]; its gradient maps (qkv, result gradient) to qkv's shape.
TEST(PlanLoader, ChecksFusedQkvAttentionShapes) {
  std::vector<TensorDesc> tensors = {{"qkv", plan::TensorKind::Input, {1, 4, 32}},
                                     {"o", plan::TensorKind::Temporary, {1, 4, 2, 8}, 0},
                                     {"dqkv", plan::TensorKind::Temporary, {1, 4, 32}, 256},
                                     {"odd", plan::TensorKind::Input, {1, 4, 28}},
                                     {"short", plan::TensorKind::Temporary, {1, 4, 24}, 768}};
  auto load = [&](plan::OpCode op, std::vector<int32_t> in, std::vector<int32_t> out) {
    return loadError(buildPlan(tensors, {{op, in, out, {}, {0.35}}}, 2048));
  };
  EXPECT_EQ(loadError(buildPlan(tensors,
                                {{plan::OpCode::CausalAttentionQkv, {0}, {1}, {}, {0.35}},
                                 {plan::OpCode::CausalAttentionQkvGrad, {0, 1}, {2}, {}, {0.35}}},
                                2048)),
            "");
  std::string width = load(plan::OpCode::CausalAttentionQkv, {3}, {1});
  EXPECT_NE(width.find("qkv's width 28 is not (2 heads + 2 * kv_heads) * 8"), std::string::npos)
      << width;
  std::string result = load(plan::OpCode::CausalAttentionQkvGrad, {0, 1}, {4});
  EXPECT_NE(result.find("result has shape 1x4x24, expected 1x4x32"), std::string::npos) << result;
}

TEST(PlanLoader, RejectsTemporaryOutsideArena) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 16);
  EXPECT_NE(loadError(bytes).find("lies outside the 16-byte arena"), std::string::npos);
}

// a = relu(x), b = relu(a), loss = relu(b), at the given arena offsets.
std::vector<uint8_t> reluChain(int64_t a, int64_t b, int64_t loss) {
  return buildPlan({{"x", plan::TensorKind::Input, {2, 4}},
                    {"w", plan::TensorKind::Parameter, {2, 4}},
                    {"loss", plan::TensorKind::Temporary, {2, 4}, loss},
                    {"a", plan::TensorKind::Temporary, {2, 4}, a},
                    {"b", plan::TensorKind::Temporary, {2, 4}, b}},
                   {{plan::OpCode::Unary, {0}, {3}, {}, {}, "relu"},
                    {plan::OpCode::Unary, {3}, {4}, {}, {}, "relu"},
                    {plan::OpCode::Unary, {4}, {2}, {}, {}, "relu"}},
                   64);
}

TEST(PlanLoader, AcceptsArenaBytesReusedOnceTheirTemporaryIsDead) {
  EXPECT_EQ(loadError(reluChain(0, 32, 0)), ""); // 'a' is dead when 'loss' is written
}

TEST(PlanLoader, RejectsLiveTemporariesThatShareArenaBytes) {
  std::string error = loadError(reluChain(0, 16, 32)); // 'b' is written while 'a' is read
  EXPECT_NE(error.find("the memory plan overlaps live temporaries: tensor #4 ('b') at arena bytes "
                       "[16, 48), live from instruction #1 to #2 shares bytes with tensor #3 ('a') "
                       "at arena bytes [0, 32), live from instruction #0 to #1; both are live at "
                       "instruction #1 (Unary"),
            std::string::npos)
      << error;
  // The output lives to the end of the step: nothing may take its bytes after it is written.
  auto late = buildPlan({{"x", plan::TensorKind::Input, {2, 4}},
                         {"w", plan::TensorKind::Parameter, {2, 4}},
                         {"loss", plan::TensorKind::Temporary, {2, 4}, 0},
                         {"a", plan::TensorKind::Temporary, {2, 4}, 0}},
                        {{plan::OpCode::Unary, {0}, {2}, {}, {}, "relu"},
                         {plan::OpCode::Unary, {0}, {3}, {}, {}, "relu"}},
                        32);
  error = loadError(late);
  EXPECT_NE(error.find("live from instruction #0 to the end of the step"), std::string::npos)
      << error;
}

TEST(PlanLoader, AcceptsAReshapeThatViewsItsOperandsBytes) {
  auto plan = [](int64_t viewOffset) {
    return buildPlan({{"x", plan::TensorKind::Input, {2, 4}},
                      {"w", plan::TensorKind::Parameter, {2, 4}},
                      {"loss", plan::TensorKind::Temporary, {8}, 32},
                      {"a", plan::TensorKind::Temporary, {2, 4}, 0},
                      {"view", plan::TensorKind::Temporary, {8}, viewOffset}},
                     {{plan::OpCode::Unary, {0}, {3}, {}, {}, "relu"},
                      {plan::OpCode::Reshape, {3}, {4}, {}, {}},
                      {plan::OpCode::Unary, {4}, {2}, {}, {}, "relu"}},
                     64);
  };
  EXPECT_EQ(loadError(plan(0)), "");
  // A view at another offset is a copy, which must not overlap its operand.
  EXPECT_NE(loadError(plan(16)).find("overlaps live temporaries"), std::string::npos);
}

// Two 24-byte gradients summed in place as one bucket at offsets 0 and 64 (the
// reduction writes the padding [24, 64) too), and a 24-byte temporary 'c' at
// `c`, live across the all-reduce.
std::vector<uint8_t> inPlaceBucket(int64_t c) {
  return buildPlan({{"x", plan::TensorKind::Input, {2, 3}},
                    {"w", plan::TensorKind::Parameter, {2, 3}},
                    {"loss", plan::TensorKind::Temporary, {2, 3}, 128},
                    {"g0", plan::TensorKind::Temporary, {2, 3}, 0},
                    {"g1", plan::TensorKind::Temporary, {2, 3}, 64},
                    {"s0", plan::TensorKind::Temporary, {2, 3}, 0},
                    {"s1", plan::TensorKind::Temporary, {2, 3}, 64},
                    {"c", plan::TensorKind::Temporary, {2, 3}, c},
                    {"sum", plan::TensorKind::Temporary, {2, 3}, 192}},
                   {{plan::OpCode::Unary, {0}, {3}, {}, {}, "relu"},
                    {plan::OpCode::Unary, {0}, {4}, {}, {}, "relu"},
                    {plan::OpCode::Unary, {1}, {7}, {}, {}, "relu"},
                    {plan::OpCode::AllReduce, {3, 4}, {5, 6}, {0}, {}},
                    {plan::OpCode::Add, {5, 6}, {8}, {}, {}},
                    {plan::OpCode::Add, {8, 7}, {2}, {}, {}}},
                   256, plan::kFormatVersion, {{"dp", 2}});
}

TEST(PlanLoader, ChecksTheBytesOfAnInPlaceBucket) {
  EXPECT_EQ(loadError(inPlaceBucket(224)), "");
  std::string error = loadError(inPlaceBucket(32));
  EXPECT_NE(error.find("the padding of the in-place bucket of instruction #3 at arena bytes "
                       "[24, 64), live from instruction #3 to #3 shares bytes with tensor #7 ('c')"),
            std::string::npos)
      << error;
}

TEST(PlanLoader, RejectsReadBeforeWrite) {
  auto tensors = matmulTensors();
  tensors.push_back({"z", plan::TensorKind::Temporary, {2, 4}, 32});
  auto bytes = buildPlan(tensors, {{plan::OpCode::Unary, {3}, {2}, {}, {}, "relu"}}, 64);
  EXPECT_NE(loadError(bytes).find("reads temporary 'z' before any instruction writes it"),
            std::string::npos);
}

TEST(PlanLoader, RejectsWritingAnInput) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Unary, {1}, {0}, {}, {}, "relu"}}, 32);
  EXPECT_NE(loadError(bytes).find("writes Input tensor 'x'"), std::string::npos);
}

TEST(PlanLoader, RejectsAPlanOlderThanTheOpcodesItUses) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32,
                         plan::kOldestFormatVersion - 1);
  EXPECT_NE(loadError(bytes).find("plan format version 3 is older than this ptc-run reads (4 to "),
            std::string::npos)
      << loadError(bytes);
}

TEST(PlanLoader, RejectsUnknownOrMissingElementwiseFunction) {
  auto tensors = matmulTensors();
  auto unknown = buildPlan(tensors, {{plan::OpCode::Unary, {2}, {2}, {}, {}, "swish"}}, 32);
  EXPECT_NE(loadError(unknown).find("names the unknown elementwise function 'swish' (known: gelu, "
                                    "gelu_tanh, tanh, relu, silu, rsqrt, exp, log, sign)"),
            std::string::npos)
      << loadError(unknown);
  auto missing = buildPlan(tensors, {{plan::OpCode::UnaryGrad, {2, 2}, {2}, {}, {}}}, 32);
  EXPECT_NE(loadError(missing).find("names no elementwise function"), std::string::npos)
      << loadError(missing);
}

// GatedUnary (gate, up) -> result and GatedUnaryGrad (gate, up, grad) ->
// (gate grad, up grad): one shape throughout, and a known function.
TEST(PlanLoader, ChecksGatedActivationShapesAndFunction) {
  std::vector<TensorDesc> tensors = {{"gate", plan::TensorKind::Input, {2, 6}},
                                     {"up", plan::TensorKind::Input, {2, 6}},
                                     {"g", plan::TensorKind::Input, {2, 6}},
                                     {"h", plan::TensorKind::Temporary, {2, 6}, 0},
                                     {"dgate", plan::TensorKind::Temporary, {2, 6}, 64},
                                     {"dup", plan::TensorKind::Temporary, {2, 6}, 128},
                                     {"v", plan::TensorKind::Input, {6}},
                                     {"w", plan::TensorKind::Temporary, {2, 3}, 192}};
  auto load = [&](InstDesc inst) { return loadError(buildPlan(tensors, {inst}, 256)); };
  EXPECT_EQ(load({plan::OpCode::GatedUnary, {0, 1}, {3}, {}, {}, "silu"}), "");
  EXPECT_EQ(load({plan::OpCode::GatedUnaryGrad, {0, 1, 2}, {4, 5}, {}, {}, "silu"}), "");
  std::string broadcast = load({plan::OpCode::GatedUnary, {0, 6}, {3}, {}, {}, "silu"});
  EXPECT_NE(broadcast.find("up has shape 6, expected 2x6"), std::string::npos) << broadcast;
  std::string result = load({plan::OpCode::GatedUnaryGrad, {0, 1, 2}, {4, 7}, {}, {}, "silu"});
  EXPECT_NE(result.find("result has shape 2x3, expected 2x6"), std::string::npos) << result;
  std::string unknown = load({plan::OpCode::GatedUnary, {0, 1}, {3}, {}, {}, "swish"});
  EXPECT_NE(unknown.find("names the unknown elementwise function 'swish'"), std::string::npos)
      << unknown;
}

// ClipGradNorm: n gradients -> n clipped and the norm; its floats are
// max_norm, or max_norm and one weight in (0, 1] per gradient (split
// gradients' sums of squares over the group of its axes).
TEST(PlanLoader, ChecksGradientClippingWeights) {
  std::vector<TensorDesc> tensors = {{"a", plan::TensorKind::Input, {4}},
                                     {"b", plan::TensorKind::Input, {2}},
                                     {"ca", plan::TensorKind::Temporary, {4}, 0},
                                     {"cb", plan::TensorKind::Temporary, {2}, 64},
                                     {"norm", plan::TensorKind::Temporary, {}, 128}};
  auto load = [&](std::vector<double> floats) {
    return loadError(buildPlan(tensors, {{plan::OpCode::ClipGradNorm, {0, 1}, {2, 3, 4}, {}, floats}}, 192));
  };
  EXPECT_EQ(load({1.0}), "");
  EXPECT_EQ(load({1.0, 1.0, 0.5}), "");
  std::string count = load({1.0, 0.5});
  EXPECT_NE(count.find("expects n gradients (at least one without mesh axes), n + 1 results and "
                       "max_norm (and a weight per gradient)"),
            std::string::npos)
      << count;
  std::string range = load({1.0, 1.0, 0.0});
  EXPECT_NE(range.find("weight #1 is 0, not in (0, 1]"), std::string::npos) << range;
}

// An update's parameter, gradient and state share one float type, except
// that an f32 parameter's gradient may be bf16 or f16 (read widened).
TEST(PlanLoader, ChecksOptimizerUpdateDtypes) {
  using plan::DType;
  using plan::TensorKind;
  auto load = [](DType param, DType grad) {
    std::vector<TensorDesc> tensors = {{"step", TensorKind::OptimizerState, {}},
                                       {"p", TensorKind::Parameter, {4}, -1, param},
                                       {"g", TensorKind::Input, {4}, -1, grad},
                                       {"m", TensorKind::OptimizerState, {4}, -1, param},
                                       {"v", TensorKind::OptimizerState, {4}, -1, param}};
    return loadError(buildPlan(tensors,
                               {{plan::OpCode::AdamWUpdate, {1, 2, 3, 4, 0}, {1, 3, 4}, {},
                                 {1e-3, 0.9, 0.95, 1e-8, 0.0}},
                                {plan::OpCode::SgdUpdate, {1, 2, 3}, {1, 3}, {}, {0.1, 0.9, 0.0}}},
                               0));
  };
  EXPECT_EQ(load(DType::F32, DType::F32), "");
  EXPECT_EQ(load(DType::F32, DType::BF16), "");
  EXPECT_EQ(load(DType::F32, DType::F16), "");
  EXPECT_EQ(load(DType::BF16, DType::BF16), "");
  std::string wider = load(DType::BF16, DType::F32);
  EXPECT_NE(wider.find("input #1 ('g') is F32, expected BF16"), std::string::npos) << wider;
  std::string ints = load(DType::F32, DType::I32);
  EXPECT_NE(ints.find("input #1 ('g') is I32, expected F32 (or bf16 / f16)"), std::string::npos)
      << ints;
}

// The whole-vocabulary cross-entropy over bf16 logits may keep its loss (and
// the loss gradient it reads) in f32 (ptc-fuse-loss-widening); the logits'
// gradient has the logits' type, and f32 logits keep an f32 loss.
TEST(PlanLoader, ChecksCrossEntropyLossDtypes) {
  using plan::DType;
  using plan::TensorKind;
  auto load = [](DType logits, DType scalar, DType grad) {
    std::vector<TensorDesc> tensors = {{"logits", TensorKind::Input, {2, 8}, -1, logits},
                                       {"targets", TensorKind::Input, {2}, -1, DType::I32},
                                       {"loss", TensorKind::Temporary, {}, 0, scalar},
                                       {"seed", TensorKind::Input, {}, -1, scalar},
                                       {"dlogits", TensorKind::Temporary, {2, 8}, 64, grad}};
    return loadError(buildPlan(tensors,
                               {{plan::OpCode::CrossEntropy, {0, 1}, {2}, {}, {}},
                                {plan::OpCode::CrossEntropyGrad, {0, 1, 3}, {4}, {}, {}}},
                               128));
  };
  EXPECT_EQ(load(DType::F32, DType::F32, DType::F32), "");
  EXPECT_EQ(load(DType::BF16, DType::F32, DType::BF16), "");
  EXPECT_EQ(load(DType::BF16, DType::BF16, DType::BF16), "");
  std::string wideGrad = load(DType::BF16, DType::F32, DType::F32);
  EXPECT_NE(wideGrad.find("output #0 is F32, but the instruction's other float tensors are BF16"),
            std::string::npos)
      << wideGrad;
  std::string narrowLoss = load(DType::F32, DType::BF16, DType::F32);
  EXPECT_NE(narrowLoss.find("output #0 is BF16, but the instruction's other float tensors are F32"),
            std::string::npos)
      << narrowLoss;
}

// CrossEntropyGrad may give the loss as a second output (ptc.cross_entropy_with_grad):
// a scalar, f32 or of the logits' type, as CrossEntropy's.
TEST(PlanLoader, ChecksCrossEntropyGradWithLoss) {
  using plan::DType;
  using plan::TensorKind;
  std::vector<TensorDesc> tensors = {{"logits", TensorKind::Input, {2, 8}, -1, DType::BF16},
                                     {"targets", TensorKind::Input, {2}, -1, DType::I32},
                                     {"seed", TensorKind::Input, {}, -1},
                                     {"dlogits", TensorKind::Temporary, {2, 8}, 0, DType::BF16},
                                     {"loss", TensorKind::Temporary, {}, 64},
                                     {"loss16", TensorKind::Temporary, {}, 128, DType::F16},
                                     {"losses", TensorKind::Temporary, {2}, 192}};
  auto load = [&](std::vector<int32_t> out) {
    return loadError(
        buildPlan(tensors, {{plan::OpCode::CrossEntropyGrad, {0, 1, 2}, out, {}, {}}}, 256));
  };
  EXPECT_EQ(load({3}), "");
  EXPECT_EQ(load({3, 4}), "");
  std::string type = load({3, 5});
  EXPECT_NE(type.find("loss is F16, expected F32 or the logits' BF16"), std::string::npos) << type;
  std::string shape = load({3, 6});
  EXPECT_NE(shape.find("loss has shape 2, expected scalar"), std::string::npos) << shape;
  std::string count = load({3, 4, 4});
  EXPECT_NE(count.find("expects 1 output, or 2 with the loss, has 3"), std::string::npos) << count;
}

TEST(PlanLoader, RejectsWrongAttributeCount) {
  auto bytes = buildPlan(matmulTensors(), {{plan::OpCode::Matmul, {0, 1}, {2}, {0}, {}}}, 32);
  EXPECT_NE(loadError(bytes).find("expects 2 integer and 0 float attributes"), std::string::npos);
}

TEST(PlanLoader, RejectsDuplicateParameterNames) {
  auto tensors = matmulTensors();
  tensors.push_back({"w", plan::TensorKind::Parameter, {3, 4}});
  auto bytes = buildPlan(tensors, {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  EXPECT_NE(loadError(bytes).find("two Parameter tensors are named 'w'"), std::string::npos);
}
TEST(PlanLoader, RejectsAShapeWhoseElementCountOverflows) {
  // 2^32 x 2^32 x 2 wraps to 0 in int64 arithmetic; each dimension alone is fine.
  auto tensors = matmulTensors();
  tensors.push_back({"huge", plan::TensorKind::Parameter, {int64_t(1) << 32, int64_t(1) << 32, 2}});
  auto bytes = buildPlan(tensors, {{plan::OpCode::Matmul, {0, 1}, {2}, {0, 0}, {}}}, 32);
  EXPECT_NE(loadError(bytes).find("tensor #3 ('huge') of shape 4294967296x4294967296x2 has more "
                                  "than 1099511627776 elements"),
            std::string::npos)
      << loadError(bytes);
}

TEST(CheckedMath, ProductsAndSumsThatOverflowAreRefused) {
  EXPECT_EQ(checkedMul(int64_t(1) << 31, int64_t(1) << 31), int64_t(1) << 62);
  EXPECT_EQ(checkedMul(int64_t(1) << 32, int64_t(1) << 31), std::nullopt);
  EXPECT_EQ(checkedMul(INT64_MIN, -1), std::nullopt);
  EXPECT_EQ(checkedAdd(INT64_MAX, 0), INT64_MAX);
  EXPECT_EQ(checkedAdd(INT64_MAX - 3, 128), std::nullopt);
  std::vector<int64_t> mesh = {65536, 65536, 65536, 15625, 16};
  EXPECT_EQ(checkedProduct(mesh), std::nullopt);
  EXPECT_EQ(checkedProduct(std::vector<int64_t>{65536, 16}, 1 << 20), 1 << 20);
  EXPECT_EQ(checkedProduct(std::vector<int64_t>{65536, 17}, 1 << 20), std::nullopt);
  EXPECT_EQ(checkedProduct(std::vector<int64_t>{4, -1}), std::nullopt);
  EXPECT_EQ(checkedProduct(std::vector<int64_t>{}), 1);
  // A zero after an overflowing prefix is still an overflow: the running
  // product is never allowed to wrap.
  EXPECT_EQ(checkedProduct(std::vector<int64_t>{int64_t(1) << 40, int64_t(1) << 40, 0}),
            std::nullopt);
}
// The mesh text every tool reads: axes in order, spaces and empty parts
// allowed; an error names the part at fault.
TEST(MeshText, ParsesAxesInOrderAndNamesTheFaultyPart) {
  StatusOr<MeshText> mesh = parseMeshText(" pp:2, dp:4,,tp:8 ");
  ASSERT_TRUE(mesh.isOk()) << mesh.status().message();
  ASSERT_EQ(mesh->axes.size(), 3u);
  EXPECT_EQ(mesh->axes[0].name, "pp");
  EXPECT_EQ(mesh->axes[2].size, 8);
  EXPECT_EQ(mesh->size("dp"), 4);
  EXPECT_EQ(mesh->size("cp"), 1);
  EXPECT_EQ(mesh->devices(), 64);
  EXPECT_TRUE(parseMeshText("").isOk());
  auto message = [](const char *text) { return parseMeshText(text).status().message(); };
  EXPECT_EQ(message("dp:2,tp2"), "mesh axis 'tp2' must be written name:size (e.g. dp:2)");
  EXPECT_EQ(message(":2"), "mesh axis ':2' must be written name:size (e.g. dp:2)");
  EXPECT_EQ(message("dp:2x"), "mesh axis 'dp:2x' must be written name:size (e.g. dp:2)");
  EXPECT_EQ(message("dp:0"), "mesh axis 'dp' has size 0; sizes must be at least 1");
  EXPECT_EQ(message("dp:-3"), "mesh axis 'dp' has size -3; sizes must be at least 1");
  EXPECT_EQ(message("dp:65537"), "mesh axis 'dp' has size 65537; sizes must be at most 65536");
  EXPECT_EQ(message("dp:1024,tp:1024,pp:2"),
            "the mesh has more than 1048576 devices (at axis 'pp')");
  EXPECT_EQ(message("dp:99999999999999999999"),
            "mesh axis 'dp:99999999999999999999' must be written name:size (e.g. dp:2)");
}
} // namespace
