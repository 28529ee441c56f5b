#include "baton/plan/fixtures.h"

#include <gtest/gtest.h>

#include "baton/plan/encode.h"

namespace baton::plan {
namespace {

TEST(Fixtures, KvSplitSizesFollowTheModel) {
  // Qwen3-8B-like: 36 layers, 8 KV heads × 128 dims, bf16, TP 8 → 1 head per
  // rank: a 16-token block segment is 16 × 1 × 128 × 2 = 4 KiB.
  const FixtureSpec spec{.blocks = 10};
  auto regions = fixture_regions(spec);
  ASSERT_TRUE(regions.has_value());
  ASSERT_EQ(regions->size(), 288u);
  EXPECT_EQ((*regions)[0].bytes, 2u * 10 * 4096);  // K and V halves of 10 cache blocks
  PlacementTable t;
  ASSERT_TRUE(fill_fixture(spec, t).is_ok());
  EXPECT_EQ(t.slots(), 288u);
  EXPECT_EQ(t.segments_per_slot(), 2u);
  EXPECT_EQ(t.length(3, 7, 1), 4096u);
  EXPECT_EQ(t.address(3, 7, 1) - t.address(3, 7, 0), 10u * 4096);  // V follows K's cache blocks
  EXPECT_EQ(t.address(4, 7, 0) - t.address(3, 7, 0), 4096u);
}

TEST(Fixtures, TpAboveKvHeadsReplicatesOneHead) {
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 2, .layers = 1, .tp = 16, .kv_heads = 8}, t).is_ok());
  EXPECT_EQ(t.length(0, 0, 0), 16u * 128 * 2);
}

TEST(Fixtures, MlaHasOneLatentSegment) {
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 4, .layers = 61, .tp = 1, .mla = true, .head_dim = 576}, t).is_ok());
  EXPECT_EQ(t.slots(), 61u);
  EXPECT_EQ(t.segments_per_slot(), 1u);
  EXPECT_EQ(t.length(0, 0, 0), 16u * 576 * 2);
}

TEST(Fixtures, SlotsAcrossSocketsSplitRanksOverTwoNodes) {
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 3, .layers = 2, .tp = 8, .numa = NumaLayout::kSlotsAcrossSockets}, t).is_ok());
  for (std::uint32_t slot = 0; slot < 16; ++slot) {
    for (std::uint32_t b = 0; b < 3; ++b) EXPECT_EQ(t.numa(b, slot), (slot % 8) < 4 ? 0 : 1);
  }
  const Plan plan = encode_plan(t).value();
  EXPECT_EQ(plan.placements.size(), 32u);  // one run per slot segment
}

TEST(Fixtures, BlocksAlternateNodesInAReplica) {
  PlacementTable t;
  ASSERT_TRUE(
      fill_fixture({.blocks = 6, .layers = 2, .tp = 1, .mla = true, .numa = NumaLayout::kBlocksAlternate}, t).is_ok());
  for (std::uint32_t b = 0; b < 6; ++b) EXPECT_EQ(t.numa(b, 1), static_cast<int>(b % 2));
  // Blocks 0 and 2 are neighbours in node 0's half.
  EXPECT_EQ(t.address(2, 0, 0) - t.address(0, 0, 0), t.length(0, 0, 0));
  EXPECT_EQ(fixture_regions({.blocks = 6, .layers = 2, .tp = 1, .mla = true, .numa = NumaLayout::kBlocksAlternate})
                ->size(),
            4u);
}

TEST(Fixtures, FragmentationBreaksRuns) {
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 12, .layers = 1, .tp = 1, .run_blocks = 4}, t).is_ok());
  EXPECT_EQ(encode_plan(t)->placements.size(), 6u);  // 3 runs × K and V
  ASSERT_TRUE(fill_fixture({.blocks = 12, .layers = 1, .tp = 1, .numa = NumaLayout::kUnknown}, t).is_ok());
  EXPECT_EQ(t.numa(0, 0), kUnknownNuma);
}

TEST(Fixtures, UsesGivenRegionBases) {
  const FixtureSpec spec{.blocks = 2, .layers = 1, .tp = 2};
  PlacementTable t;
  ASSERT_TRUE(fill_fixture(spec, t, std::vector<std::uint64_t>{0x1000000, 0x2000000}).is_ok());
  EXPECT_EQ(t.address(0, 1, 0), 0x2000000u);
  EXPECT_EQ(fill_fixture(spec, t, std::vector<std::uint64_t>{1}).message(), "fill_fixture: 1 region bases for 2 regions");
  // A region that would pass 2^64 (its blocks' addresses wrapped to small ones).
  const Status wraps = fill_fixture(spec, t, std::vector<std::uint64_t>{0x1000000, UINT64_MAX - 4095});
  EXPECT_EQ(wraps.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wraps.message().find("region 1 at 0xfffffffffffff000"), std::string::npos) << wraps.message();
}

TEST(Fixtures, RefusesBadSpecs) {
  PlacementTable t;
  EXPECT_EQ(fill_fixture({.blocks = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.blocks = kMaxBlocks + 1}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.layers = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.tp = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.block_tokens = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.kv_heads = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.head_dim = 0}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.dtype_bytes = 0}, t).code(), StatusCode::kInvalidArgument);
  // Heads that do not split over TP: refused, not rounded down to one a rank.
  EXPECT_EQ(fill_fixture({.tp = 8, .kv_heads = 12}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.tp = 3, .kv_heads = 8}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.layers = 70000, .tp = 1}, t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_fixture({.tp = 1, .block_tokens = 1u << 20, .head_dim = 1u << 12}, t).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(fixture_regions({.blocks = 0}).error().code(), StatusCode::kInvalidArgument);
  // Four 32-bit factors past 2^64: the product wrapped to 2 GiB, and to 0
  // (bench plan ran on the wrong shape).
  EXPECT_EQ(fixture_regions({.tp = 1, .mla = true, .block_tokens = UINT32_MAX, .head_dim = UINT32_MAX,
                             .dtype_bytes = 1u << 31})
                .error()
                .message(),
            "fixture: a segment of 4294967295 tokens × 1 heads × 4294967295 dims × 2147483648 bytes is over 4 GiB");
  EXPECT_EQ(fixture_regions({.tp = 1, .block_tokens = 1u << 16, .kv_heads = 1u << 16, .head_dim = 1u << 16,
                             .dtype_bytes = 1u << 16})
                .error()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(fixture_regions({.numa = static_cast<NumaLayout>(9)}).error().message(),
            "fixture: NUMA layout 9 is not one of NumaLayout's");
}

}  // namespace
}  // namespace baton::plan
