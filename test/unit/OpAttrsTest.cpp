// The named attributes of instructions (kernels/common/op_attrs.h): the
// counts a set allows, reading absent optional values as their fallbacks,
// and writing by name with trailing fallbacks left out.
#include "kernels/common/kernel_call.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace ptc::kernels;

TEST(OpAttrs, EverySetIsAnOpsAndItsSlotsAreOrdered) {
  // No set without an op kind (a row nothing reads).
  constexpr size_t kSets = 0
#define PTC_ATTR_SET(set) +1
#define PTC_ATTR(...)
#include "kernels/common/op_attrs.def"
#undef PTC_ATTR
#undef PTC_ATTR_SET
      ;
  std::vector<bool> used(kSets, false);
  for (size_t i = 0; i < kNumOpKinds; ++i)
    used[static_cast<size_t>(attrSetOf(static_cast<OpKind>(i)))] = true;
  for (size_t s = 0; s < kSets; ++s)
    EXPECT_TRUE(used[s]) << "attribute set #" << s << " of op_attrs.def has no op kind";
  // Within a set and kind: slots 0, 1, ... in order, required before
  // optional, at most one list and it comes last.
  for (const AttrInfo &a : kAttrTable) {
    const bool ints = a.kind == AttrKind::Int || a.kind == AttrKind::Ints;
    for (size_t slot = 0; slot < a.index; ++slot) {
      const AttrInfo *before = attrAt(a.set, ints, slot);
      ASSERT_NE(before, nullptr) << a.name << " leaves slot " << slot << " unnamed";
      EXPECT_TRUE(before->kind == AttrKind::Int || before->kind == AttrKind::Float)
          << a.name << " comes after a list";
      if (a.presence == AttrPresence::Required)
        EXPECT_EQ(before->presence, AttrPresence::Required)
            << a.name << " is required after the optional " << before->name;
    }
    for (const AttrInfo &b : kAttrTable)
      if (&a != &b && a.set == b.set)
        EXPECT_NE(std::strcmp(a.name, b.name), 0) << "two attributes named " << a.name;
  }
}

TEST(OpAttrs, CountsFollowTheSet) {
  const AttrCounts matmul = attrCounts(attrSetOf(OpKind::Matmul));
  EXPECT_EQ(matmul.minInts, 2u);
  EXPECT_EQ(matmul.maxInts, 2u);
  EXPECT_EQ(matmul.maxFloats, 0u);
  const AttrCounts rotary = attrCounts(AttrSet::Rotary);
  EXPECT_EQ(rotary.minInts, 1u);
  EXPECT_EQ(rotary.maxInts, 3u);
  EXPECT_EQ(rotary.minFloats, 1u);
  EXPECT_EQ(rotary.maxFloats, 1u);
  const AttrCounts clip = attrCounts(AttrSet::ClipGradNorm);
  EXPECT_EQ(clip.minInts, 0u);
  EXPECT_EQ(clip.maxInts, kUnboundedAttrs);
  EXPECT_EQ(clip.minFloats, 1u);
  EXPECT_EQ(clip.maxFloats, kUnboundedAttrs);
  const AttrCounts dropout = attrCounts(AttrSet::Dropout);
  EXPECT_EQ(dropout.minInts, 1u);
  EXPECT_EQ(dropout.maxInts, kUnboundedAttrs);
  EXPECT_EQ(attrCounts(AttrSet::None).maxInts, 0u);
}

TEST(OpAttrs, WritesByNameAndLeavesTrailingFallbacksOut) {
  // A Rotary without a sequence axis and heads-major: just [inverse].
  AttrValues plain(AttrSet::Rotary);
  plain.set(attr::Rotary::inverse, 1)
      .set(attr::Rotary::seq_axis, -1)
      .set(attr::Rotary::seq_major, 0)
      .set(attr::Rotary::theta, 10000.0)
      .compact();
  EXPECT_EQ(plain.ints(), (std::vector<int64_t>{1}));
  EXPECT_EQ(plain.floats(), (std::vector<double>{10000.0}));
  // seq_major alone: the axis between reads as its fallback, -1.
  AttrValues seqMajor(AttrSet::Rotary);
  seqMajor.set(attr::Rotary::inverse, 0).set(attr::Rotary::seq_major, 1).compact();
  EXPECT_EQ(seqMajor.ints(), (std::vector<int64_t>{0, -1, 1}));
  // A list after a scalar.
  AttrValues dropout(AttrSet::Dropout);
  dropout.set(attr::Dropout::stream, 7).set(attr::Dropout::layout, std::vector<int64_t>{1, 0, 2, 1, 0});
  EXPECT_EQ(dropout.ints(), (std::vector<int64_t>{7, 1, 0, 2, 1, 0}));
  // Required values stay whatever they are.
  AttrValues matmul(AttrSet::Matmul);
  matmul.set(attr::Matmul::transpose_lhs, 0).set(attr::Matmul::transpose_rhs, 0).compact();
  EXPECT_EQ(matmul.ints(), (std::vector<int64_t>{0, 0}));
}

TEST(OpAttrs, ReadsAbsentOptionalValuesAsFallbacks) {
  const std::vector<int64_t> ints{1};
  const std::vector<double> floats{500000.0};
  std::vector<TensorView> none;
  KernelCall call = makeKernelCall(OpKind::Rotary, none, none, ints, floats);
  EXPECT_EQ(call.attr(attr::Rotary::inverse), 1);
  EXPECT_EQ(call.attr(attr::Rotary::seq_axis), -1);
  EXPECT_EQ(call.attr(attr::Rotary::seq_major), 0);
  EXPECT_EQ(call.attr(attr::Rotary::theta), 500000.0);
  EXPECT_FALSE(rotarySeqMajor(call));
  EXPECT_EQ(rotaryFirstPosition(call), 0);
  const std::vector<int64_t> axes{0, 2};
  KernelCall reduce = makeKernelCall(OpKind::ReduceSum, none, none, axes, std::vector<double>{});
  EXPECT_EQ(reduce.attr(attr::Reduction::axes), (Shape{0, 2}));
  // An update names where its scheduled learning rate is.
  EXPECT_EQ(updateInputs(OpKind::AdamWUpdate, 6, ints.data(), 1).lr, 5);
  EXPECT_EQ(updateInputs(OpKind::AdamWUpdate, 5, nullptr, 0).lr, -1);
  EXPECT_EQ(learningRateSlot(OpKind::SgdUpdate), attr::SgdUpdate::lr.index);
}
