#include "baton/common/ordered_sums.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>

namespace baton {
namespace {

using Key = std::pair<std::int64_t, std::uint64_t>;

TEST(OrderedSums, SumsBelowAKeyLikeAWalkOfTheWholeMap) {
  OrderedSums<Key> sums;
  std::map<Key, std::uint64_t> reference;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 50'000; ++i) {
    const Key key{static_cast<std::int64_t>(rng() % 64) - 8, rng() % 32};
    switch (rng() % 3) {
      case 0: {
        const std::uint64_t value = rng() % 4 == 0 ? 0 : rng() % (1 << 30);
        sums.set(key, value);
        if (value == 0) {
          reference.erase(key);
        } else {
          reference[key] = value;
        }
        break;
      }
      case 1:
        sums.erase(key);
        reference.erase(key);
        break;
      default: {
        std::uint64_t want = 0;
        for (const auto& [k, v] : reference) {
          if (k < key) want += v;
        }
        ASSERT_EQ(sums.sum_below(key), want) << "step " << i;
      }
    }
    ASSERT_EQ(sums.size(), reference.size());
  }
}

TEST(OrderedSums, EmptyAndEdges) {
  OrderedSums<std::uint64_t> sums;
  EXPECT_EQ(sums.sum_below(0), 0u);
  EXPECT_EQ(sums.sum_below(~0ULL), 0u);
  sums.set(5, 10);
  sums.set(5, 7);  // replaces
  sums.set(9, 1);
  EXPECT_EQ(sums.sum_below(5), 0u);  // strictly below
  EXPECT_EQ(sums.sum_below(6), 7u);
  EXPECT_EQ(sums.sum_below(~0ULL), 8u);
  sums.erase(42);  // absent: nothing happens
  sums.set(9, 0);  // 0 removes
  EXPECT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums.sum_below(~0ULL), 7u);
}

}  // namespace
}  // namespace baton
