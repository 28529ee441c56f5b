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

// One slot of one segment, `bytes` long, at the given addresses and nodes.
PlacementTable column_table(const std::vector<std::uint64_t>& addr, const std::vector<int>& numa,
                            std::uint32_t bytes = 64) {
  auto t = PlacementTable::create(static_cast<std::uint32_t>(addr.size()), 1, 1).value();
  for (std::uint32_t b = 0; b < addr.size(); ++b) {
    t.set(b, 0, 0, addr[b], bytes);
    t.set_numa(b, 0, numa[b]);
  }
  return t;
}

TEST(EncodePlan, BlocksAlternatingTwoTensorsBecomeOneGroupOfTwoLanes) {
  // An MLA replica over two sockets: even blocks in the node-0 tensor, odd
  // blocks in the node-1 tensor, each contiguous there.
  std::vector<std::uint64_t> addr;
  std::vector<int> numa;
  for (std::uint64_t b = 0; b < 9; ++b) {
    addr.push_back((b % 2 == 0 ? 0x10000 : 0x90000) + b / 2 * 64);
    numa.push_back(static_cast<int>(b % 2));
  }
  const Plan plan = encode_plan(column_table(addr, numa)).value();
  EXPECT_EQ(plan.segment(0, 0), (SegmentSchema{64, 64}));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0], (Chunk{0x10000, 5 * 64, 0}));
  EXPECT_EQ(plan.chunks[1], (Chunk{0x90000, 4 * 64, 1}));
  ASSERT_EQ(plan.placements.size(), 2u);
  EXPECT_EQ(plan.placements[0], (Placement{0, 0, 0, 0, 0, 5, 2}));
  EXPECT_EQ(plan.placements[1], (Placement{0, 0, 1, 0, 1, 4, 2}));
  EXPECT_TRUE(validate(plan).is_ok());
}

TEST(EncodePlan, FindsGroupsOfMoreLanesAndRunsAroundThem) {
  // Blocks 0-3 one run; blocks 4-12 three lanes (tensors A, B, C); blocks
  // 13-14 a run elsewhere.
  std::vector<std::uint64_t> addr{0x1000, 0x1040, 0x1080, 0x10c0};
  std::vector<int> numa{0, 0, 0, 0};
  for (std::uint64_t i = 0; i < 9; ++i) {
    addr.push_back(0x100000 * (1 + i % 3) + i / 3 * 64);
    numa.push_back(static_cast<int>(i % 3));
  }
  addr.insert(addr.end(), {0x800000, 0x800040});
  numa.insert(numa.end(), {1, 1});
  const Plan plan = encode_plan(column_table(addr, numa)).value();
  ASSERT_EQ(plan.placements.size(), 5u);
  EXPECT_EQ(plan.placements[0].block_count, 4u);
  EXPECT_EQ(plan.placements[0].block_step, 1u);
  for (std::uint32_t lane = 0; lane < 3; ++lane) {
    const Placement& p = plan.placements[1 + lane];
    EXPECT_EQ(p.block_start, 4 + lane);
    EXPECT_EQ(p.block_count, 3u);
    EXPECT_EQ(p.block_step, 3u);
    EXPECT_EQ(plan.chunks[p.chunk].base, 0x100000 * (1 + lane));
  }
  EXPECT_EQ(plan.placements[4], (Placement{0, 0, plan.placements[4].chunk, 0, 13, 2, 1}));
  EXPECT_TRUE(validate(plan).is_ok());
}

TEST(EncodePlan, LanesOfUnequalLengthEndTheGroupWhereALaneBreaks) {
  // Two lanes; lane 1 breaks at block 7, so the group is blocks 0-6 (lane 0
  // has 4, lane 1 has 3) and block 7 starts a run of its own.
  std::vector<std::uint64_t> addr;
  std::vector<int> numa;
  for (std::uint64_t b = 0; b < 7; ++b) {
    addr.push_back((b % 2 == 0 ? 0x10000 : 0x90000) + b / 2 * 64);
    numa.push_back(static_cast<int>(b % 2));
  }
  addr.push_back(0x70000);
  numa.push_back(1);
  const Plan plan = encode_plan(column_table(addr, numa)).value();
  ASSERT_EQ(plan.placements.size(), 3u);
  EXPECT_EQ(plan.placements[0].block_count, 4u);
  EXPECT_EQ(plan.placements[1].block_count, 3u);
  EXPECT_EQ(plan.placements[2], (Placement{0, 0, plan.placements[2].chunk, 0, 7, 1, 1}));
}

TEST(EncodePlan, AGroupNeedsTwoBlocksInEveryLane) {
  // Blocks 0, 2 continue each other but block 1 has no partner: no group.
  const Plan plan = encode_plan(column_table({0x1000, 0x9000, 0x1040, 0x5000}, {0, 1, 0, 1})).value();
  EXPECT_EQ(plan.placements.size(), 4u);
  for (const Placement& p : plan.placements) EXPECT_EQ(p.block_step, 1u);
}

TEST(EncodePlan, ChecksEveryBlockOfAGroup) {
  // Two lanes on two nodes interleaved in one range: even blocks at
  // 0x10000 + i·64, odd ones 32 bytes after them.
  std::vector<std::uint64_t> addr;
  std::vector<int> numa;
  for (std::uint64_t b = 0; b < 8; ++b) {
    addr.push_back((b % 2 == 0 ? 0x10000 : 0x10020) + b / 2 * 64);
    numa.push_back(static_cast<int>(b % 2));
  }
  auto t = column_table(addr, numa, 32);
  // 32-byte segments fit: one group, lanes 64 apart.
  const Plan plan = encode_plan(t).value();
  EXPECT_EQ(plan.segment(0, 0), (SegmentSchema{32, 64}));
  ASSERT_EQ(plan.placements.size(), 2u);
  EXPECT_EQ(plan.placements[1].block_step, 2u);
  // A longer segment in the middle of the group is a different layout.
  t.set(5, 0, 0, t.address(5, 0, 0), 48);
  EXPECT_EQ(encode_plan(t).error().message(),
            "encode_plan: block 5 slot 0 segment 0 has 48 bytes, block 0 has 32 (the blocks' layouts differ)");
  // Neighbours 32 bytes apart cannot hold 64-byte segments.
  EXPECT_EQ(encode_plan(column_table(addr, numa, 64)).error().message(),
            "encode_plan: slot 0 segment 0 blocks 0 and 1 are 32 bytes apart, less than their 64 bytes (they overlap)");
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
            "encode_plan: slot 0 segment 0 blocks 1 and 2 are 32 bytes apart, less than their 64 bytes (they overlap)");
  auto same = contiguous_table(4, 1, 1, 64);
  same.set(3, 0, 0, same.address(2, 0, 0), 64);
  EXPECT_EQ(encode_error(same).code(), StatusCode::kInvalidArgument);
  // Below its predecessor too (it was taken as a 96-byte chunk, two blocks aliased).
  auto below = contiguous_table(4, 1, 1, 64);
  below.set(2, 0, 0, below.address(1, 0, 0) - 16, 64);
  EXPECT_EQ(encode_error(below).message(),
            "encode_plan: slot 0 segment 0 blocks 1 and 2 are 16 bytes apart, less than their 64 bytes (they overlap)");
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
  // Past 16 bits: cast, 65537 read back as node 1 and was encoded there.
  t.set_numa(3, 1, 65537);
  EXPECT_EQ(t.numa(3, 1), PlacementTable::kNumaOutOfRange);
  EXPECT_EQ(encode_error(t).message(), "encode_plan: block 3 slot 1 was set a NUMA node outside -1..1023");
  t.set_numa(3, 1, kMaxNuma);
  EXPECT_TRUE(encode_error(t).is_ok());
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
