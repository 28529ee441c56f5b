// ThreadCounts: counters threads add to without a locked instruction.
#include "engine/thread_counts.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace baton::engine {
namespace {

TEST(ThreadCounts, TotalsSumEveryThreadsAdds) {
  ThreadCounts counts;
  EXPECT_EQ(counts.totals(), ThreadCounts::Totals{});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&counts, t] {
      for (int i = 0; i < 10'000; ++i) {
        ThreadCounts::Block& mine = counts.mine();
        mine.add(0, 1);
        mine.add(1 + static_cast<std::size_t>(t), 3);
      }
    });
  }
  // Read while they add: each counter only grows.
  ThreadCounts::Totals seen{};
  for (int i = 0; i < 1000; ++i) {
    const ThreadCounts::Totals now = counts.totals();
    for (std::size_t c = 0; c < now.size(); ++c) EXPECT_GE(now[c], seen[c]);
    seen = now;
  }
  for (auto& t : threads) t.join();
  const ThreadCounts::Totals total = counts.totals();
  EXPECT_EQ(total[0], 40'000u);
  for (std::size_t c = 1; c <= 4; ++c) EXPECT_EQ(total[c], 30'000u) << "counter " << c;
  EXPECT_EQ(total[5], 0u);
}

// Threads that exit keep their counts, and hand their blocks to the next
// ones: a thread per request does not grow the blocks.
TEST(ThreadCounts, ExitedThreadsKeepTheirCountsAndGiveBackTheirBlocks) {
  ThreadCounts counts;
  for (int i = 0; i < 100; ++i) {
    std::thread([&counts] { counts.mine().add(2, 5); }).join();
  }
  EXPECT_EQ(counts.totals()[2], 500u);
  EXPECT_EQ(counts.blocks(), 1u);  // each thread took the block the one before gave back
  counts.mine().add(2, 1);  // this thread holds it while the next one comes
  std::thread([&counts] { counts.mine().add(2, 1); }).join();
  EXPECT_EQ(counts.totals()[2], 502u);
  EXPECT_EQ(counts.blocks(), 2u);
}

// A thread that added to counters now gone adds to new ones at the same
// address without touching the old (their blocks stay with the thread's
// claim until it next claims).
TEST(ThreadCounts, CountersMadeAfterOthersWentStartAtZero) {
  for (int round = 0; round < 20; ++round) {
    auto counts = std::make_unique<ThreadCounts>();
    counts->mine().add(0, static_cast<std::uint64_t>(round) + 1);
    EXPECT_EQ(counts->totals()[0], static_cast<std::uint64_t>(round) + 1) << "round " << round;
  }
}

}  // namespace
}  // namespace baton::engine
