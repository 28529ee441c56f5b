#include "baton/plan/naive.h"

#include <gtest/gtest.h>

#include "plan_test_util.h"

namespace baton::plan {
namespace {

using testing::varint;
std::string field(int number, std::uint64_t v) { return varint(number << 3) + varint(v); }
std::string message_field(int number, const std::string& body) {
  return varint((number << 3) | 2) + varint(body.size()) + body;
}
// A NaiveSlotEntry: block, slot, one address, one length, NUMA (zigzag).
std::string entry(std::uint64_t block, std::uint64_t slot, std::uint64_t address, std::uint64_t length,
                  std::uint64_t numa_zigzag = 0) {
  return message_field(5, field(1, block) + field(2, slot) + message_field(3, varint(address)) +
                              message_field(4, varint(length)) + field(5, numa_zigzag));
}
std::string header(std::uint64_t blocks, std::uint64_t slots) {
  return field(1, 1) + field(2, blocks) + field(3, slots) + field(4, 1);
}

TEST(Naive, RoundTripsTheTable) {
  auto t = testing::contiguous_table(5, 3, 2, 48, 1);
  t.set_numa(2, 2, kUnknownNuma);
  auto back = parse_naive(serialize_naive(t, std::vector<std::uint64_t>{1, 2, 3, 4, 5}).value());
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  for (std::uint32_t b = 0; b < 5; ++b) {
    for (std::uint32_t s = 0; s < 3; ++s) {
      EXPECT_EQ(back->numa(b, s), t.numa(b, s));
      for (std::uint32_t g = 0; g < 2; ++g) {
        EXPECT_EQ(back->address(b, s, g), t.address(b, s, g));
        EXPECT_EQ(back->length(b, s, g), t.length(b, s, g));
      }
    }
  }
}

TEST(Naive, GrowsWithBlocksTimesSlots) {
  const auto small = serialize_naive(testing::contiguous_table(10, 8, 2, 64)).value();
  const auto large = serialize_naive(testing::contiguous_table(10, 80, 2, 64)).value();
  EXPECT_GT(large.size(), 9 * small.size());
}

TEST(Naive, RefusesWrongHashCount) {
  const auto t = testing::contiguous_table(2, 1, 1, 8);
  EXPECT_EQ(serialize_naive(t, std::vector<std::uint64_t>{1}).error().code(), StatusCode::kInvalidArgument);
}

TEST(Naive, RefusesAnEmptyTable) {
  EXPECT_EQ(serialize_naive(PlacementTable{}).error().message(),
            "serialize_naive: the table is empty (create it first)");
}

std::string parse_error(const std::string& bytes) {
  auto t = parse_naive(bytes);
  return t ? std::string("accepted") : t.error().message();
}

TEST(Naive, AcceptsHandMadeBytes) {
  EXPECT_EQ(parse_error(header(2, 1) + entry(0, 0, 0x1000, 64) + entry(1, 0, 0x1040, 64)), "accepted");
}

TEST(Naive, RefusesMalformedInput) {
  EXPECT_EQ(parse_error("\xff\xff"), "parse_naive: 2 bytes are not a NaiveTransferPlan message");
  EXPECT_EQ(parse_error(field(1, 3)), "parse_naive: version 3, this build reads version 1");
  EXPECT_EQ(parse_error(field(1, 1)), "parse_naive: PlacementTable: 0 blocks, expected 1..4194304");
  EXPECT_EQ(parse_error(header(2, 1) + entry(0, 0, 0x1000, 64)), "parse_naive: 1 entries, expected 2 (2 blocks × 1 slots)");
  // A header naming 2^22 × 32 cells and no entry: refused before a table of
  // that size is made (it took 2.6 GB, or ended in bad_alloc).
  EXPECT_EQ(parse_error(header(1u << 22, 32)), "parse_naive: 0 entries, expected 134217728 (4194304 blocks × 32 slots)");
  // The count is looked at before the table's bounds (before anything is sized).
  EXPECT_EQ(parse_error(header(1u << 22, 1u << 16)),
            "parse_naive: 0 entries, expected 274877906944 (4194304 blocks × 65536 slots)");
  EXPECT_EQ(parse_error(header(2, 1) + entry(0, 0, 0x1000, 64) + entry(2, 0, 0x1040, 64)),
            "parse_naive: entry 1 names block 2 slot 0, plan has 2 × 1");
  EXPECT_EQ(parse_error(header(2, 1) + entry(0, 0, 0x1000, 64) + entry(0, 0, 0x1040, 64)),
            "parse_naive: block 0 slot 0 is listed twice");
  EXPECT_EQ(parse_error(header(1, 1) + message_field(5, field(1, 0) + field(2, 0))),
            "parse_naive: entry 0 has 0 addresses and 0 lengths, expected 1");
  EXPECT_EQ(parse_error(header(1, 1) + entry(0, 0, 0x1000, 1ull << 33)),
            "parse_naive: entry 0 segment 0 has 8589934592 bytes");
  EXPECT_EQ(parse_error(header(1, 1) + entry(0, 0, 0x1000, 64, 5)), "parse_naive: entry 0 on NUMA node -3");
  EXPECT_EQ(parse_error(header(2, 1) + entry(0, 0, 0x1000, 64) + entry(1, 0, 0x1040, 64) +
                        varint((6 << 3) | 1) + std::string(8, '\0')),
            "parse_naive: 1 block hashes for 2 blocks");
}

}  // namespace
}  // namespace baton::plan
