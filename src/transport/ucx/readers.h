// Lock-free reading of a table that one thread replaces and other threads
// read (the direct-copy table: callers' threads copy through it while the
// loop publishes a new one). A reader marks itself with two plain stores;
// the replacing thread pays instead: after it published the new table it
// takes a snapshot of the readers that may still hold the old one and frees
// the old table once each of them left. A mutex and a reference count per
// copy were a third of a one-block same-host read (perf).
//
// Each reading thread owns a slot: a count it makes odd on entering and
// even on leaving, with stores only it writes. The snapshot first makes
// every reader's entering store visible (membarrier(2), expedited: an
// interrupt on the CPUs that run this process, instead of a fence on each
// read), so a reader either shows up odd in the snapshot or reads the new
// table. Where the kernel refuses membarrier (or BATON_NO_MEMBARRIER is
// set), readers enter with a sequentially consistent store instead. The
// table pointer is stored and loaded sequentially consistent.
// Process-wide; slots are reused after their threads exit.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace baton::transport::ucx {

class Readers {
 public:
  struct Slot;

  // While one lives, this thread may hold pointers into a published table.
  // Sections nest.
  class Section {
   public:
    Section();
    ~Section();
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;

   private:
    Slot* slot_;
  };

  // The readers that entered before the snapshot and had not yet left:
  // a table unpublished before it was taken is free once left() is true.
  class Snapshot {
   public:
    [[nodiscard]] bool left();  // drops the readers that moved on since

   private:
    friend class Readers;
    std::vector<std::pair<const Slot*, std::uint64_t>> inside_;
  };
  // Call after the new table is published (a sequentially consistent store).
  [[nodiscard]] static Snapshot snapshot();

  // The slots ever made (readers at once, at most); for tests.
  [[nodiscard]] static std::size_t slots();
  // Whether the writer's membarrier stands in for the readers' fences:
  // false where the kernel refuses it or BATON_NO_MEMBARRIER is set.
  [[nodiscard]] static bool membarrier();
};

}  // namespace baton::transport::ucx
