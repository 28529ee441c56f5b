#include "engine/thread_counts.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace baton::engine {

// A block is handed back when its thread exits, and another thread carries
// on adding to it: the blocks number the threads adding at once, not every
// thread that ever added.
struct ThreadCounts::Blocks {
  struct Entry {
    Block block;
    std::atomic<bool> owned{false};
    Entry* next = nullptr;  // set before it is listed, then fixed
  };
  std::atomic<Entry*> head{nullptr};
  std::mutex claiming;  // one thread claims or lists at a time

  ~Blocks() {
    for (Entry* e = head.load(); e != nullptr;) delete std::exchange(e, e->next);
  }
  Entry* claim() {
    std::lock_guard lock(claiming);
    for (Entry* e = head.load(std::memory_order_relaxed); e != nullptr; e = e->next) {
      if (!e->owned.load(std::memory_order_relaxed)) {
        e->owned.store(true, std::memory_order_relaxed);
        return e;
      }
    }
    auto* e = new Entry;
    e->owned.store(true, std::memory_order_relaxed);
    e->next = head.load(std::memory_order_relaxed);
    head.store(e, std::memory_order_release);  // totals() walks without the mutex
    return e;
  }
};

namespace {

// This thread's blocks, one per ThreadCounts it added to; the Blocks stay
// alive while a thread holds one of theirs.
struct Claimed {
  std::shared_ptr<ThreadCounts::Blocks> blocks;
  ThreadCounts::Blocks::Entry* entry;
};
struct ThreadClaims {
  std::vector<Claimed> claims;
  ~ThreadClaims() {
    for (Claimed& c : claims) {
      std::lock_guard lock(c.blocks->claiming);
      c.entry->owned.store(false, std::memory_order_relaxed);
    }
  }
};

}  // namespace

ThreadCounts::ThreadCounts() : blocks_(std::make_shared<Blocks>()) {}
ThreadCounts::~ThreadCounts() = default;

ThreadCounts::Block& ThreadCounts::mine() {
  thread_local ThreadClaims mine;
  for (Claimed& c : mine.claims) {
    if (c.blocks == blocks_) return c.entry->block;
  }
  // Counters whose owner is gone (only this thread holds them) go first.
  std::erase_if(mine.claims, [](const Claimed& c) { return c.blocks.use_count() == 1; });
  mine.claims.push_back({blocks_, blocks_->claim()});
  return mine.claims.back().entry->block;
}

ThreadCounts::Totals ThreadCounts::totals() const {
  Totals sum{};
  for (const Blocks::Entry* e = blocks_->head.load(std::memory_order_acquire); e != nullptr; e = e->next) {
    for (std::size_t i = 0; i < kCounters; ++i) sum[i] += e->block.value[i].load(std::memory_order_relaxed);
  }
  return sum;
}

std::size_t ThreadCounts::blocks() const {
  std::size_t n = 0;
  for (const Blocks::Entry* e = blocks_->head.load(std::memory_order_acquire); e != nullptr; e = e->next) ++n;
  return n;
}

}  // namespace baton::engine
