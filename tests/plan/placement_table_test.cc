#include "baton/plan/placement_table.h"

#include <gtest/gtest.h>

namespace baton::plan {
namespace {

TEST(PlacementTable, CreateLaysOutColumnsSlotSegmentBlock) {
  auto t = PlacementTable::create(3, 2, 2);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->blocks(), 3u);
  EXPECT_EQ(t->slots(), 2u);
  EXPECT_EQ(t->segments_per_slot(), 2u);
  t->set(2, 1, 1, 0xabc, 64);
  t->set_numa(2, 1, 1);
  EXPECT_EQ(t->addresses(1, 1)[2], 0xabcu);
  EXPECT_EQ(t->lengths(1, 1)[2], 64u);
  EXPECT_EQ(t->numa_column(1)[2], 1);
  EXPECT_EQ(t->address(2, 1, 1), 0xabcu);
  EXPECT_EQ(t->length(0, 0, 0), 0u);
  EXPECT_EQ(t->numa(0, 0), kUnknownNuma);
  EXPECT_EQ(t->addresses(0, 0).size(), 3u);
}

TEST(PlacementTable, ResetKeepsNothingOfTheOldContents) {
  auto t = PlacementTable::create(2, 1, 1).value();
  t.set(1, 0, 0, 7, 8);
  ASSERT_TRUE(t.reset(4, 2, 1).is_ok());
  EXPECT_EQ(t.blocks(), 4u);
  EXPECT_EQ(t.address(1, 0, 0), 0u);
  EXPECT_EQ(t.length(1, 0, 0), 0u);
}

TEST(PlacementTable, RefusesBadShapes) {
  EXPECT_EQ(PlacementTable::create(0, 1, 1).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlacementTable::create(kMaxBlocks + 1, 1, 1).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlacementTable::create(1, 0, 1).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlacementTable::create(1, kMaxSlots + 1, 1).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlacementTable::create(1, 1, 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlacementTable::create(1, 1, 3).error().code(), StatusCode::kInvalidArgument);
  const auto too_many = PlacementTable::create(kMaxBlocks, kMaxSlots, 2);
  ASSERT_FALSE(too_many.has_value());
  EXPECT_NE(too_many.error().message().find("cells"), std::string::npos);
  PlacementTable t;
  EXPECT_EQ(t.reset(1, 1, 5).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::plan
