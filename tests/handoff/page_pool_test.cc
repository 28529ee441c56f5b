#include "baton/handoff/page_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace baton::handoff {
namespace {

TEST(PagePool, HandsOutLowestFirstAllOrNone) {
  PagePool pool(4096, 8);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(pool.allocate(6).error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.free_pages(), 5u) << "a refused allocation takes nothing";
  ASSERT_TRUE(pool.free(std::vector<std::uint32_t>{1}).is_ok());
  EXPECT_EQ(*pool.allocate(2), (std::vector<std::uint32_t>{1, 3}));
  EXPECT_EQ(pool.allocate(0).error().code(), StatusCode::kInvalidArgument);
}

TEST(PagePool, RefusesPagesOutsideThePoolFreeOrTwiceAndTakesNone) {
  PagePool pool(4096, 4);
  auto a = *pool.allocate(2);
  EXPECT_EQ(pool.free(std::vector<std::uint32_t>{0, 9}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(pool.free(std::vector<std::uint32_t>{0, 3}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.free(std::vector<std::uint32_t>{1, 1}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.free_pages(), 2u) << "every refused free left the pool as it was";
  EXPECT_TRUE(pool.check(a).is_ok());
  ASSERT_TRUE(pool.free(a).is_ok());
  EXPECT_EQ(pool.check(a).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.free_pages(), 4u);
}

TEST(PagePool, ThreadsNeverShareAPage) {
  PagePool pool(64, 1024);
  std::vector<std::vector<std::uint32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {
        auto p = pool.allocate(4);
        ASSERT_TRUE(p.has_value());
        got[t].insert(got[t].end(), p->begin(), p->end());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<bool> seen(1024, false);
  for (const auto& g : got) {
    for (auto p : g) {
      EXPECT_FALSE(seen[p]) << "page " << p << " handed out twice";
      seen[p] = true;
    }
  }
  EXPECT_EQ(pool.free_pages(), 0u);
}

}  // namespace
}  // namespace baton::handoff
