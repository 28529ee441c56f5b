// Counters that callers' threads add to and the loop reads, with no locked
// instruction on the adding side: each thread adds into a block of its own
// (a plain load and store), and the loop sums the blocks. A locked add right
// after a copy waits for the copy's stores to drain: the three counts of a
// one-block same-host read cost as much as its 4 KiB memcpy (perf).
// Private to engine/.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

namespace baton::engine {

class ThreadCounts {
 public:
  static constexpr std::size_t kCounters = 16;
  using Totals = std::array<std::uint64_t, kCounters>;

  ThreadCounts();
  ~ThreadCounts();
  ThreadCounts(const ThreadCounts&) = delete;
  ThreadCounts& operator=(const ThreadCounts&) = delete;

  // This thread's block: add to it only from this thread.
  struct alignas(64) Block {
    std::atomic<std::uint64_t> value[kCounters]{};
    void add(std::size_t counter, std::uint64_t n) {
      value[counter].store(value[counter].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  };
  [[nodiscard]] Block& mine();

  // What every thread added so far (each counter only grows). Any thread.
  [[nodiscard]] Totals totals() const;
  // The blocks made: the threads that added at once, at most. For tests.
  [[nodiscard]] std::size_t blocks() const;

  struct Blocks;  // shared with the threads' caches, which may outlive this

 private:
  std::shared_ptr<Blocks> blocks_;
};

}  // namespace baton::engine
