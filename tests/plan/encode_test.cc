#include "baton/plan/encode.h"

#include <gtest/gtest.h>

#include "plan_test_util.h"

namespace baton::plan {
namespace {

using testing::contiguous_table;

TEST(EncodePlan, OneRunPerColumnWhenBlocksAreContiguous) {
  const auto t = contiguous_table(10, 3, 2, 64);
  auto plan = encode_plan(t);
  ASSERT_TRUE(plan.has_value()) << plan.error().to_string();
  EXPECT_EQ(plan->blocks, 10u);
  EXPECT_EQ(plan->slots, 3u);
  EXPECT_EQ(plan->segments_per_slot, 2u);
  ASSERT_EQ(plan->schema.size(), 6u);
  for (const auto& s : plan->schema) EXPECT_EQ(s, (SegmentSchema{64, 64}));
  // Columns are 1 MiB apart: six chunks of 640 bytes, one placement each.
  ASSERT_EQ(plan->chunks.size(), 6u);
  ASSERT_EQ(plan->placements.size(), 6u);
  for (std::uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(plan->chunks[i], (Chunk{0x100000ull * (1 + i), 640, 0}));
    EXPECT_EQ(plan->placements[i], (Placement{i / 2, i % 2, i, 0, 0, 10}));
  }
  EXPECT_TRUE(validate(*plan).is_ok());
}

TEST(EncodePlan, TouchingRunsOnOneNodeMergeIntoOneChunk) {
  // Block-major store layout: block b holds slot 0 K, slot 0 V, slot 1 K,
  // slot 1 V back to back, so every column is strided and all touch.
  auto t = PlacementTable::create(4, 2, 2).value();
  for (std::uint32_t b = 0; b < 4; ++b) {
    for (std::uint32_t s = 0; s < 2; ++s) {
      for (std::uint32_t g = 0; g < 2; ++g) t.set(b, s, g, 0x10000 + b * 128 + (s * 2 + g) * 32, 32);
      t.set_numa(b, s, 1);
    }
  }
  auto plan = encode_plan(t).value();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0], (Chunk{0x10000, 512, 1}));
  ASSERT_EQ(plan.placements.size(), 4u);
  EXPECT_EQ(plan.placements[3], (Placement{1, 1, 0, 96, 0, 4}));
  EXPECT_EQ(plan.segment(1, 1), (SegmentSchema{32, 128}));
}

TEST(EncodePlan, RunsBreakAtGapsAndNumaChanges) {
  auto t = PlacementTable::create(6, 1, 1).value();
  const std::uint64_t addr[] = {0x1000, 0x1040, 0x1080, 0x2000, 0x2040, 0x2080};
  const int numa[] = {0, 0, 0, 0, 1, 1};
  for (std::uint32_t b = 0; b < 6; ++b) {
    t.set(b, 0, 0, addr[b], 64);
    t.set_numa(b, 0, numa[b]);
  }
  auto plan = encode_plan(t).value();
  EXPECT_EQ(plan.segment(0, 0), (SegmentSchema{64, 64}));
  ASSERT_EQ(plan.placements.size(), 3u);
  EXPECT_EQ(plan.placements[0].block_count, 3u);
  EXPECT_EQ(plan.placements[1].block_start, 3u);
  EXPECT_EQ(plan.placements[1].block_count, 1u);
  EXPECT_EQ(plan.placements[2].block_start, 4u);
  ASSERT_EQ(plan.chunks.size(), 3u);  // sorted by (node, address)
  EXPECT_EQ(plan.chunks[0], (Chunk{0x1000, 192, 0}));
  EXPECT_EQ(plan.chunks[1], (Chunk{0x2000, 64, 0}));
  EXPECT_EQ(plan.chunks[2], (Chunk{0x2040, 128, 1}));
}

TEST(EncodePlan, StrideIsTheCommonDistanceNotTheFirst) {
  // A hole after block 0, then a regular stride of 256.
  auto t = PlacementTable::create(5, 1, 1).value();
  const std::uint64_t addr[] = {0x0, 0x1000, 0x1100, 0x1200, 0x1300};
  for (std::uint32_t b = 0; b < 5; ++b) {
    t.set(b, 0, 0, addr[b], 64);
    t.set_numa(b, 0, 0);
  }
  auto plan = encode_plan(t).value();
  EXPECT_EQ(plan.segment(0, 0), (SegmentSchema{64, 256}));
  EXPECT_EQ(plan.placements.size(), 2u);
}

TEST(EncodePlan, BlockCountPastAWindowKeepsOneRun) {
  // More blocks than the vectorized window, with a break inside the tail.
  const auto t = contiguous_table(100, 1, 1, 16);
  EXPECT_EQ(encode_plan(t)->placements.size(), 1u);
  auto broken = contiguous_table(100, 1, 1, 16);
  broken.set(97, 0, 0, 0x900000, 16);
  EXPECT_EQ(encode_plan(broken)->placements.size(), 3u);
}

TEST(EncodePlan, CarriesBlockHashes) {
  const auto t = contiguous_table(3, 1, 1, 8);
  const std::vector<std::uint64_t> hashes{7, 8, 9};
  EXPECT_EQ(encode_plan(t, hashes)->block_hashes, hashes);
}

TEST(EncodePlan, KeepsUnknownNuma) {
  const auto t = contiguous_table(3, 1, 1, 8, kUnknownNuma);
  EXPECT_EQ(encode_plan(t)->chunks.at(0).numa, kUnknownNuma);
}

Status encode_error(const PlacementTable& t, std::span<const std::uint64_t> hashes = {}) {
  auto plan = encode_plan(t, hashes);
  return plan ? Status::ok() : plan.error();
}

TEST(EncodePlan, RefusesZeroLength) {
  auto t = contiguous_table(40, 2, 2, 64);
  t.set(0, 1, 0, 0x5000, 0);
  EXPECT_EQ(encode_error(t).message(), "encode_plan: block 0 slot 1 segment 0 has length 0");
  auto u = contiguous_table(40, 2, 2, 64);
  u.set(35, 0, 1, u.address(35, 0, 1), 0);
  EXPECT_EQ(encode_error(u).message(), "encode_plan: block 35 slot 0 segment 1 has length 0");
}

TEST(EncodePlan, RefusesGeometryThatDiffersAcrossBlocks) {
  auto t = contiguous_table(8, 1, 2, 64);
  t.set(5, 0, 1, t.address(5, 0, 1), 128);
  const Status s = encode_error(t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "encode_plan: block 5 slot 0 segment 1 has 128 bytes, block 0 has 64 (the blocks' layouts differ)");
}

TEST(EncodePlan, RefusesOverlappingBlocks) {
  auto t = contiguous_table(4, 1, 1, 64);
  t.set(2, 0, 0, t.address(1, 0, 0) + 32, 64);
  EXPECT_EQ(encode_error(t).message(),
            "encode_plan: slot 0 segment 0 blocks 1 and 2 are 32 bytes apart: stride 32 < bytes 64 (they overlap)");
  auto same = contiguous_table(4, 1, 1, 64);
  same.set(3, 0, 0, same.address(2, 0, 0), 64);
  EXPECT_EQ(encode_error(same).code(), StatusCode::kInvalidArgument);
}

TEST(EncodePlan, RefusesARunPastTheAddressSpace) {
  auto t = PlacementTable::create(2, 1, 1).value();
  t.set(0, 0, 0, UINT64_MAX - 100, 64);
  t.set(1, 0, 0, UINT64_MAX - 36, 64);  // 64 apart, ends past 2^64
  t.set_numa(0, 0, 0);
  t.set_numa(1, 0, 0);
  EXPECT_NE(encode_error(t).message().find("pass 2^64"), std::string::npos);
}

TEST(EncodePlan, RefusesNumaOutOfRange) {
  auto t = contiguous_table(4, 2, 1, 8);
  t.set_numa(3, 1, -2);
  EXPECT_EQ(encode_error(t).message(), "encode_plan: block 3 slot 1 on NUMA node -2, expected -1..1023");
  t.set_numa(3, 1, kMaxNuma + 1);
  EXPECT_EQ(encode_error(t).code(), StatusCode::kInvalidArgument);
}

TEST(EncodePlan, RefusesWrongHashCountAndEmptyTable) {
  const auto t = contiguous_table(3, 1, 1, 8);
  const std::vector<std::uint64_t> two{1, 2};
  EXPECT_EQ(encode_error(t, two).message(),
            "encode_plan: 2 block hashes for 3 blocks, expected none or one per block");
  EXPECT_EQ(encode_error(PlacementTable{}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::plan
