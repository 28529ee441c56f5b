#include "baton/plan/plan.h"

#include <gtest/gtest.h>

#include "baton/plan/encode.h"
#include "plan_test_util.h"

namespace baton::plan {
namespace {

// 4 blocks × 2 slots × 2 segments of 64 bytes, one chunk per column.
Plan valid_plan() { return encode_plan(testing::contiguous_table(4, 2, 2, 64)).value(); }

std::string why(const Plan& p) { return validate(p).message(); }

TEST(ValidatePlan, AcceptsAnEncodedPlan) { EXPECT_TRUE(validate(valid_plan()).is_ok()); }

TEST(ValidatePlan, RefusesCountsOutOfBounds) {
  Plan p = valid_plan();
  p.blocks = 0;
  EXPECT_EQ(why(p), "plan: 0 blocks, expected 1..4194304");
  p = valid_plan();
  p.slots = kMaxSlots + 1;
  EXPECT_EQ(why(p), "plan: 65537 slots, expected 1..65536");
  p = valid_plan();
  p.segments_per_slot = 3;
  EXPECT_EQ(why(p), "plan: 3 segments per slot, expected 1 or 2");
  p = valid_plan();
  p.blocks = kMaxBlocks;
  p.slots = kMaxSlots;
  EXPECT_NE(why(p).find("cells"), std::string::npos);
}

TEST(ValidatePlan, RefusesBadSchema) {
  Plan p = valid_plan();
  p.schema.pop_back();
  EXPECT_EQ(why(p), "plan: schema has 3 segments, expected 4 (2 slots × 2)");
  p = valid_plan();
  p.schema[3].bytes = 0;
  EXPECT_EQ(why(p), "plan: slot 1 segment 1 has 0 bytes");
  p = valid_plan();
  p.schema[2] = {64, 32};
  EXPECT_EQ(why(p), "plan: slot 1 segment 0 has stride 32 < bytes 64");
  // A holder's table holds 32-bit segments; 2^46 made a requester map 64 TiB.
  p = valid_plan();
  p.schema[2] = {1ull << 46, 1ull << 46};
  EXPECT_EQ(why(p), "plan: slot 1 segment 0 has 70368744177664 bytes, over a segment's 4 GiB");
}

TEST(ValidatePlan, RefusesBadChunks) {
  Plan p = valid_plan();
  p.chunks[1].length = 0;
  EXPECT_EQ(why(p), "plan: chunk 1 has length 0");
  p = valid_plan();
  p.chunks[0].base = UINT64_MAX - 10;
  EXPECT_NE(why(p).find("passes 2^64"), std::string::npos);
  p = valid_plan();
  p.chunks[2].numa = -5;
  EXPECT_EQ(why(p), "plan: chunk 2 on NUMA node -5, expected -1..1023");
  p = valid_plan();
  p.chunks[2].numa = kMaxNuma + 1;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
}

TEST(ValidatePlan, RefusesPlacementIndexesOutOfRange) {
  Plan p = valid_plan();
  p.placements[1].slot = 2;
  EXPECT_EQ(why(p), "plan: placement 1 names slot 2 segment 1, plan has 2 slots × 2 segments");
  p = valid_plan();
  p.placements[1].segment = 2;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
  p = valid_plan();
  p.placements[0].chunk = 4;
  EXPECT_EQ(why(p), "plan: placement 0 names chunk 4, plan has 4 chunks");
}

TEST(ValidatePlan, RefusesPlacementsOutOfOrderOrNotTiling) {
  Plan p = valid_plan();
  std::swap(p.placements[0], p.placements[1]);
  EXPECT_NE(why(p).find("placements must be ordered"), std::string::npos);
  p = valid_plan();
  p.placements[0].block_count = 3;  // a hole at block 3
  EXPECT_NE(why(p).find("expected slot 0 segment 0 block 3"), std::string::npos);
  p = valid_plan();
  p.placements[0].block_count = 5;
  EXPECT_EQ(why(p), "plan: placement 0 has 5 blocks from block 0, expected 1..4");
  p = valid_plan();
  p.placements[0].block_count = 0;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
  p = valid_plan();
  p.placements.pop_back();
  EXPECT_EQ(why(p), "plan: placements cover slot segments up to 3 (block 0), expected all 4");
  p = valid_plan();
  p.placements.push_back(p.placements.back());
  EXPECT_EQ(why(p), "plan: placement 4 is past the last slot's blocks");
}

TEST(ValidatePlan, RefusesASpanOutsideItsChunk) {
  Plan p = valid_plan();
  p.placements[2].offset = 1;  // 1 + 4 × 64 > 256
  EXPECT_NE(why(p).find("past chunk 2 of 256 bytes"), std::string::npos);
  p = valid_plan();
  p.placements[2].offset = UINT64_MAX - 8;  // the span itself overflows
  EXPECT_NE(why(p).find("past chunk 2"), std::string::npos);
}

// 8 blocks of one slot segment alternating two tensors: one group of two
// lanes of 4 blocks, one chunk each.
Plan grouped_plan() {
  auto t = PlacementTable::create(8, 1, 1).value();
  for (std::uint32_t b = 0; b < 8; ++b) {
    t.set(b, 0, 0, (b % 2 == 0 ? 0x10000 : 0x90000) + b / 2 * 64, 64);
    t.set_numa(b, 0, static_cast<int>(b % 2));
  }
  return encode_plan(t).value();
}

TEST(ValidatePlan, AcceptsAGroupOfLanes) {
  const Plan p = grouped_plan();
  ASSERT_EQ(p.placements.size(), 2u);
  EXPECT_EQ(p.placements[0], (Placement{0, 0, 0, 0, 0, 4, 2}));
  EXPECT_EQ(p.placements[1], (Placement{0, 0, 1, 0, 1, 4, 2}));
  EXPECT_TRUE(validate(p).is_ok());
  Plan shorter = p;  // lanes of 4 and 3 blocks tile 7 blocks
  shorter.blocks = 7;
  shorter.placements[1].block_count = 3;
  EXPECT_TRUE(validate(shorter).is_ok());
}

TEST(ValidatePlan, RefusesBlockStepsOutOfRange) {
  Plan p = grouped_plan();
  p.placements[0].block_step = 0;
  EXPECT_EQ(why(p), "plan: placement 0 has block step 0, expected 1..64");
  p = grouped_plan();
  p.placements[0].block_step = kMaxBlockStep + 1;
  EXPECT_EQ(why(p), "plan: placement 0 has block step 65, expected 1..64");
}

TEST(ValidatePlan, RefusesGroupsThatAreNotWhole) {
  Plan p = grouped_plan();
  p.placements[0].block_step = 3;
  EXPECT_EQ(why(p), "plan: placement 0 starts a group of 3 lanes but only 2 placements remain");
  p = grouped_plan();
  p.placements[1].block_step = 1;
  EXPECT_EQ(why(p), "plan: placement 1 has block step 1 inside a group of 2 lanes");
  p = grouped_plan();
  p.placements[1].block_start = 2;
  EXPECT_EQ(why(p),
            "plan: placement 1 starts slot 0 segment 0 block 2, expected slot 0 segment 0 block 1 (placements must be "
            "ordered and tile every slot segment)");
}

TEST(ValidatePlan, RefusesLanesThatDoNotTile) {
  Plan p = grouped_plan();
  p.placements[0].block_count = 3;
  p.placements[1].block_count = 5;  // longer than lane 0
  EXPECT_EQ(why(p),
            "plan: placement 1 (lane 1 of a group) has 5 blocks after a lane of 3, lane 0 has 3 (lanes must be "
            "longest first and differ by at most one)");
  p = grouped_plan();
  p.chunks[0].length = 1024;
  p.placements[0].block_count = 5;
  p.placements[1].block_count = 3;  // two shorter
  EXPECT_NE(why(p).find("differ by at most one"), std::string::npos);
  p = grouped_plan();
  p.chunks[0].length = 1024;
  p.placements[0].block_count = 5;  // 5 + 4 lanes > 8 blocks
  EXPECT_EQ(why(p), "plan: placement 1 has 4 blocks from block 1, expected 1..3");
  p = grouped_plan();
  p.placements[1].block_count = 3;  // block 7 uncovered
  EXPECT_EQ(why(p), "plan: placements cover slot segments up to 0 (block 7), expected all 1");
  p = grouped_plan();
  p.placements[1].offset = 64;  // lane 1's 4 blocks pass its 256-byte chunk
  EXPECT_NE(why(p).find("plan: placement 1 spans offset 64"), std::string::npos);
}

TEST(ValidatePlan, RefusesAGroupOfOneBlockLanes) {
  // Two lanes of one block are two runs; as a group, a decoder that ignored
  // steps would read them as valid runs.
  Plan p = grouped_plan();
  p.blocks = 2;
  p.placements[0].block_count = 1;
  p.placements[1].block_count = 1;
  EXPECT_EQ(why(p), "plan: placement 0 starts a group of 2 lanes of 1 block, expected ≥ 2 blocks in its first lane");
}

TEST(ValidatePlan, AGroupReadWithoutItsStepsIsRefused) {
  // What a decoder that does not know block_step sees: lane 1 starts inside
  // lane 0's blocks, so the plan is refused rather than misread.
  Plan p = grouped_plan();
  for (Placement& pl : p.placements) pl.block_step = 1;
  EXPECT_NE(why(p).find("placements must be ordered and tile"), std::string::npos);
}

TEST(ValidatePlan, RefusesAnUnusedChunk) {
  Plan p = valid_plan();
  p.chunks.push_back({0x9000000, 64, 0});
  EXPECT_EQ(why(p), "plan: chunk 4 is named by no placement");
}

TEST(ValidatePlan, RefusesAWrongHashCount) {
  Plan p = valid_plan();
  p.block_hashes = {1, 2};
  EXPECT_EQ(why(p), "plan: 2 block hashes for 4 blocks, expected none or one per block");
}

}  // namespace
}  // namespace baton::plan
