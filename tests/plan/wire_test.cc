#include "baton/plan/wire.h"

#include <gtest/gtest.h>

#include "baton/plan/encode.h"
#include "baton/plan/fixtures.h"
#include "baton/plan/naive.h"
#include "plan_test_util.h"

namespace baton::plan {
namespace {

// Protobuf merges concatenated messages (repeated fields append, scalars are
// replaced), so appending hand-made fields to a valid plan makes each kind
// of malformed input without the generated header.
using testing::varint;
std::string scalar_field(int number, std::uint64_t v) { return varint(number << 3) + varint(v); }
std::string packed_field(int number, const std::vector<std::uint64_t>& values) {
  std::string body;
  for (std::uint64_t v : values) body += varint(v);
  return varint((number << 3) | 2) + varint(body.size()) + body;
}

Plan small_plan() { return encode_plan(testing::contiguous_table(4, 2, 2, 64), std::vector<std::uint64_t>{1, 2, 3, 4}).value(); }

TEST(Wire, RoundTripsExactly) {
  const Plan plan = small_plan();
  auto back = parse_plan(serialize_plan(plan));
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, plan);
}

TEST(Wire, RoundTripsEveryFixtureLayout) {
  for (NumaLayout numa : {NumaLayout::kSingle, NumaLayout::kSlotsAcrossSockets, NumaLayout::kBlocksAlternate,
                          NumaLayout::kUnknown}) {
    for (bool mla : {false, true}) {
      PlacementTable t;
      ASSERT_TRUE(fill_fixture({.blocks = 50, .layers = 3, .tp = 4, .mla = mla, .numa = numa, .run_blocks = 7}, t)
                      .is_ok());
      const Plan plan = encode_plan(t).value();
      EXPECT_EQ(parse_plan(serialize_plan(plan)).value(), plan);
    }
  }
}

TEST(Wire, GrowsWithRunsNotWithSlots) {
  // 1000 contiguous blocks of a 36-layer × TP 8 K/V model: ≥ 50× below naive.
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 1000, .numa = NumaLayout::kSlotsAcrossSockets}, t).is_ok());
  const std::string wire = serialize_plan(encode_plan(t).value());
  const std::string naive = serialize_naive(t).value();
  EXPECT_GE(naive.size(), 50 * wire.size()) << wire.size() << " vs " << naive.size();
  // Twice the blocks: the same runs, so the same size give or take varint widths.
  PlacementTable t2;
  ASSERT_TRUE(fill_fixture({.blocks = 2000, .numa = NumaLayout::kSlotsAcrossSockets}, t2).is_ok());
  EXPECT_LT(serialize_plan(encode_plan(t2).value()).size(), wire.size() * 11 / 10);
}

TEST(Wire, AnMlaReplicaWhoseBlocksAlternateNodesIsCompact) {
  // 1000 blocks of a 61-layer MLA replica, block b on node b % 2: one group
  // of two lanes per slot instead of 1000 one-block runs.
  PlacementTable t;
  ASSERT_TRUE(
      fill_fixture({.blocks = 1000, .layers = 61, .tp = 1, .mla = true, .head_dim = 576, .numa = NumaLayout::kBlocksAlternate},
                   t)
          .is_ok());
  const Plan plan = encode_plan(t).value();
  EXPECT_EQ(plan.placements.size(), 61u * 2);
  const std::string wire = serialize_plan(plan);
  const std::string naive = serialize_naive(t).value();
  EXPECT_GE(naive.size(), 50 * wire.size()) << wire.size() << " vs " << naive.size();
  EXPECT_EQ(parse_plan(wire).value(), plan);
}

TEST(Wire, PlansWithoutGroupsCarryNoStepsAndExplicitOnesAreRead) {
  const Plan plan = small_plan();
  const std::string wire = serialize_plan(plan);
  const std::string step_tag = varint((17 << 3) | 2);
  EXPECT_EQ(wire.find(step_tag), std::string::npos);
  EXPECT_EQ(parse_plan(wire + packed_field(17, {1, 1, 1, 1})).value(), plan);
}

std::string parse_error(const std::string& bytes) {
  auto plan = parse_plan(bytes);
  EXPECT_FALSE(plan.has_value());
  return plan ? std::string() : plan.error().message();
}

TEST(Wire, RefusesBytesThatAreNotAPlan) {
  EXPECT_EQ(parse_error("\xff\xff\xff\xff"), "parse_plan: 4 bytes are not a TransferPlan message");
  // Cut inside the last field (the packed hashes).
  const std::string wire = serialize_plan(small_plan());
  EXPECT_EQ(parse_error(wire.substr(0, wire.size() - 3)),
            fmt::format("parse_plan: {} bytes are not a TransferPlan message", wire.size() - 3));
}

TEST(Wire, RefusesEmptyInputAndOtherVersions) {
  EXPECT_EQ(parse_error(""), "parse_plan: version 0, this build reads version 1");
  EXPECT_EQ(parse_error(serialize_plan(small_plan()) + scalar_field(1, 2)),
            "parse_plan: version 2, this build reads version 1");
}

TEST(Wire, RefusesColumnsThatDisagree) {
  const std::string wire = serialize_plan(small_plan());
  EXPECT_EQ(parse_error(wire + packed_field(6, {64})), "parse_plan: 4 segment sizes but 5 strides");
  EXPECT_EQ(parse_error(wire + packed_field(8, {64})),
            "parse_plan: chunk columns disagree: 4 bases, 5 lengths, 4 NUMA");
  EXPECT_EQ(parse_error(wire + packed_field(13, {0})),
            "parse_plan: placement columns disagree: 4 slots, 4 segments, 4 chunks, 5 offsets, 4 starts, 4 counts");
}

TEST(Wire, RefusesBlockStepsThatDisagreeOrAreOutOfRange) {
  const std::string wire = serialize_plan(small_plan());
  EXPECT_EQ(parse_error(wire + packed_field(17, {1})),
            "parse_plan: 1 block steps for 4 placements, expected none or one per placement");
  EXPECT_EQ(parse_error(wire + packed_field(17, {0, 1, 1, 1})),
            "parse_plan: plan: placement 0 has block step 0, expected 1..64");
  EXPECT_EQ(parse_error(wire + packed_field(17, {1, 1, 1, 65})),
            "parse_plan: plan: placement 3 has block step 65, expected 1..64");
  // A group whose second lane is a plain run; a group across two segments.
  EXPECT_EQ(parse_error(wire + packed_field(17, {2, 1, 1, 1})),
            "parse_plan: plan: placement 1 has block step 1 inside a group of 2 lanes");
  EXPECT_EQ(parse_error(wire + packed_field(17, {2, 2, 1, 1})),
            "parse_plan: plan: placement 1 starts slot 0 segment 1 block 0, expected slot 0 segment 0 block 1 "
            "(placements must be ordered and tile every slot segment)");
}

TEST(Wire, RefusesWhatValidateRefuses) {
  const std::string wire = serialize_plan(small_plan());
  // A fifth chunk nobody names.
  EXPECT_EQ(parse_error(wire + packed_field(7, {1}) + packed_field(8, {1}) + packed_field(9, {0})),
            "parse_plan: plan: chunk 4 is named by no placement");
  // A fifth placement past the end.
  EXPECT_EQ(parse_error(wire + packed_field(10, {1}) + packed_field(11, {1}) + packed_field(12, {0}) +
                        packed_field(13, {0}) + packed_field(14, {0}) + packed_field(15, {1})),
            "parse_plan: plan: placement 4 is past the last slot's blocks");
  // Counts changed under the columns.
  EXPECT_EQ(parse_error(wire + scalar_field(3, 3)), "parse_plan: plan: schema has 4 segments, expected 6 (3 slots × 2)");
  EXPECT_EQ(parse_error(wire + scalar_field(2, 0)), "parse_plan: plan: 0 blocks, expected 1..4194304");
}

TEST(Wire, RefusesAWrongHashCount) {
  const std::string wire = serialize_plan(small_plan());
  std::string extra = varint((16 << 3) | 1) + std::string(8, '\x01');  // one more fixed64 hash
  EXPECT_EQ(parse_error(wire + extra), "parse_plan: plan: 5 block hashes for 4 blocks, expected none or one per block");
}

}  // namespace
}  // namespace baton::plan
