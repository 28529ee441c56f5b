// Readers: lock-free reading of a table one thread replaces. The test that
// matters is the last: readers that keep reading while a writer replaces
// and frees tables (ASan reports a read of a freed one, TSan a race). ctest
// runs these twice: with the writer's membarrier, and with the readers'
// own fences (BATON_NO_MEMBARRIER=1, readers_without_membarrier).
#include "transport/ucx/readers.h"

#include <gtest/gtest.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace baton::transport::ucx {
namespace {

// Bounded: a reader that never leaves fails the test, not the suite's clock.
bool left_within(Readers::Snapshot& snapshot, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!snapshot.left()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// The writer's membarrier is used where this kernel offers the expedited
// command, unless BATON_NO_MEMBARRIER says no: then the readers fence
// themselves (ctest runs this file both ways: readers_without_membarrier).
TEST(Readers, UseMembarrierWhereTheKernelOffersItUnlessTheEnvironmentSaysNo) {
  const char* off = std::getenv("BATON_NO_MEMBARRIER");
  const bool turned_off = off != nullptr && *off != '\0' && std::string_view(off) != "0";
  const long offered = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  const bool expedited = offered > 0 && (offered & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0;
  EXPECT_EQ(Readers::membarrier(), expedited && !turned_off)
      << "BATON_NO_MEMBARRIER=" << (off != nullptr ? off : "(unset)") << ", kernel commands " << offered;
}

TEST(Readers, WithNoReaderASnapshotHasLeftAtOnce) {
  { const Readers::Section done; }  // one that already left does not count
  Readers::Snapshot snapshot = Readers::snapshot();
  EXPECT_TRUE(snapshot.left());
}

TEST(Readers, ASnapshotWaitsForTheReadersInsideAndOnlyThem) {
  std::atomic<int> step{0};
  std::thread reader([&] {
    const Readers::Section outer;
    {
      const Readers::Section inner;  // nested: leaving it is not leaving
    }
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  Readers::Snapshot snapshot = Readers::snapshot();
  EXPECT_FALSE(snapshot.left());
  EXPECT_FALSE(snapshot.left());  // asking again does not wear it out
  // A reader that enters after the snapshot is not waited for.
  const Readers::Section later;
  step = 2;
  reader.join();
  EXPECT_TRUE(snapshot.left());
}

TEST(Readers, SlotsAreHandedBackWhenThreadsExit) {
  { const Readers::Section warm; }
  const std::size_t before = Readers::slots();
  for (int i = 0; i < 50; ++i) {
    std::thread([] { const Readers::Section s; }).join();
  }
  // One thread at a time: each takes the slot the one before gave back
  // (at most one more, should this thread's be the one free).
  EXPECT_LE(Readers::slots(), before + 1);
}

// fork() while another thread is inside a section: in the child that
// thread does not exist, so its section must not hold the child's tables
// (an engine made there never finished a revocation). The forking thread's
// own section still counts.
TEST(Readers, AChildOfForkWaitsOnlyForItsOwnReaders) {
  std::atomic<int> step{0};
  std::thread reader([&] {
    const Readers::Section inside;
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  const pid_t child = ::fork();
  if (child == 0) {
    Readers::Snapshot others = Readers::snapshot();
    const bool others_left = others.left();
    bool own_counts = false;
    {
      const Readers::Section mine;
      own_counts = !Readers::snapshot().left();
    }
    ::_exit(others_left && own_counts ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  Readers::Snapshot parent = Readers::snapshot();
  EXPECT_FALSE(parent.left()) << "the parent's reader is still inside";
  step = 2;
  reader.join();
  EXPECT_TRUE(parent.left());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child waited for a reader it does not have, or not for its own";
}

// Two readers walk the published table and check its contents while the
// writer publishes a new one, waits for a snapshot to leave, then poisons
// and frees the old one: no reader may ever see a poisoned or freed table.
TEST(Readers, NoReaderSeesATableAfterItWasFreed) {
  struct Table {
    std::vector<std::uint64_t> values;
    std::uint64_t sum = 0;
  };
  auto make = [](std::uint64_t seed) {
    auto t = std::make_unique<Table>();
    t->values.resize(4096);  // a read long enough that a writer that did not wait catches it inside
    std::iota(t->values.begin(), t->values.end(), seed);
    t->sum = std::accumulate(t->values.begin(), t->values.end(), std::uint64_t{0});
    return t;
  };
  std::unique_ptr<Table> current = make(1);
  std::atomic<const Table*> published{current.get()};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const Readers::Section reading;
        const Table* t = published.load(std::memory_order_seq_cst);
        const std::uint64_t sum = std::accumulate(t->values.begin(), t->values.end(), std::uint64_t{0});
        if (sum != t->sum) bad.fetch_add(1, std::memory_order_relaxed);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  // Each round starts once the readers read since the last: without
  // membarrier's cost the writer would otherwise finish before they start.
  auto readers_moved_on = [&](std::uint64_t since) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (reads.load(std::memory_order_relaxed) == since) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();
    }
    return true;
  };
  // The rounds, in a function so that a failure still stops and joins the
  // readers below.
  int freed = 0;
  auto rounds = [&]() -> std::string {
    std::uint64_t seen = 0;
    for (std::uint64_t round = 2; round < 302; ++round) {
      if (!readers_moved_on(seen)) return "round " + std::to_string(round) + ": no read for 20 s";
      std::unique_ptr<Table> next = make(round);
      published.store(next.get(), std::memory_order_seq_cst);
      std::unique_ptr<Table> old = std::exchange(current, std::move(next));
      Readers::Snapshot snapshot = Readers::snapshot();
      if (!left_within(snapshot, std::chrono::seconds(20))) {
        (void)old.release();  // a reader may still be inside: never freed
        return "round " + std::to_string(round) + ": a reader stayed inside for 20 s";
      }
      std::ranges::fill(old->values, 0);  // what a reader still inside would see
      old->sum = 1;
      old.reset();
      ++freed;
      seen = reads.load(std::memory_order_relaxed);
    }
    return {};
  };
  const std::string failed = rounds();
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(failed, "");
  EXPECT_EQ(freed, 300);
  EXPECT_GT(reads.load(), 0u);
  EXPECT_EQ(bad.load(), 0u);
}

}  // namespace
}  // namespace baton::transport::ucx
