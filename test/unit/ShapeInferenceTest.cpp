// Tests of the ptc shape functions that both verifiers and builders use.

#include "dialects/ptc/PtcOps.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::ptc;

namespace {
class ShapeInference : public ::testing::Test {
protected:
  ShapeInference() : handler(&context, [this](Diagnostic &d) { messages.push_back(d.str()); }) {
    context.loadDialect<PtcDialect>();
  }
  RankedTensorType f32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, Float32Type::get(&context));
  }
  InFlightDiagnostic emit() { return mlir::emitError(UnknownLoc::get(&context)); }

  MLIRContext context;
  ScopedDiagnosticHandler handler;
  std::vector<std::string> messages;
};

TEST_F(ShapeInference, MatmulWithSharedWeight) {
  auto t = inferMatmulType(f32({8, 64, 128}), f32({384, 128}), false, true, [&] { return emit(); });
  ASSERT_TRUE(succeeded(t));
  EXPECT_EQ(*t, f32({8, 64, 384}));
}

TEST_F(ShapeInference, BatchedMatmulWithTransposedLhs) {
  auto t = inferMatmulType(f32({4, 16, 8}), f32({4, 16, 32}), true, false, [&] { return emit(); });
  ASSERT_TRUE(succeeded(t));
  EXPECT_EQ(*t, f32({4, 8, 32}));
}

TEST_F(ShapeInference, MatmulContractingMismatchIsReported) {
  auto t = inferMatmulType(f32({8, 64}), f32({32, 16}), false, false, [&] { return emit(); });
  EXPECT_TRUE(failed(t));
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0], "contracting dimensions differ: lhs has 64, rhs has 32 (lhs 8x64, rhs 32x16)");
}

TEST_F(ShapeInference, BroadcastAlignsTrailingDimensions) {
  auto t = inferBroadcastType(f32({8, 1, 16}), f32({4, 1}), [&] { return emit(); });
  ASSERT_TRUE(succeeded(t));
  EXPECT_EQ(*t, f32({8, 4, 16}));
  EXPECT_TRUE(failed(inferBroadcastType(f32({8, 3}), f32({4}), [&] { return emit(); })));
  EXPECT_EQ(messages.size(), 1u);
}

TEST_F(ShapeInference, ReduceWithAndWithoutKeepDims) {
  auto dropped = inferReduceType(f32({2, 3, 4}), {0, -1}, false, [&] { return emit(); });
  ASSERT_TRUE(succeeded(dropped));
  EXPECT_EQ(*dropped, f32({3}));
  auto kept = inferReduceType(f32({2, 3, 4}), {1}, true, [&] { return emit(); });
  ASSERT_TRUE(succeeded(kept));
  EXPECT_EQ(*kept, f32({2, 1, 4}));
  EXPECT_TRUE(failed(inferReduceType(f32({2, 3}), {1, -1}, false, [&] { return emit(); })));
  EXPECT_EQ(messages.back(), "axis -1 is reduced twice");
}

TEST_F(ShapeInference, TransposeChecksPermutation) {
  auto t = inferTransposeType(f32({2, 3, 4}), {2, 0, 1}, [&] { return emit(); });
  ASSERT_TRUE(succeeded(t));
  EXPECT_EQ(*t, f32({4, 2, 3}));
  EXPECT_TRUE(failed(inferTransposeType(f32({2, 3}), {0, 0}, [&] { return emit(); })));
}
} // namespace
