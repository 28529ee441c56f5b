// Rebuilding a plan on the requester: one slab per distinct source NUMA node
// (laid out by layout_slabs) and, for every block, its slot views — pointers
// to where each (block, slot, segment) lands once the plan's ops have run.
// Every (block, slot) is rebuilt on the NUMA node the holder used: a chunk on
// an unknown node, or a slot whose segments come from two nodes, is refused
// and counted, never placed elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "baton/common/status.h"
#include "baton/plan/plan.h"
#include "baton/plan/slab_layout.h"

namespace baton::plan {

// One slab's memory, owned: released by the function it was made with.
class SlabMemory {
 public:
  using Release = std::function<void(std::byte* data, std::uint64_t bytes)>;

  SlabMemory() = default;
  SlabMemory(std::byte* data, std::uint64_t bytes, int numa, bool bound, Release release)
      : data_(data), bytes_(bytes), numa_(numa), bound_(bound), release_(std::move(release)) {}
  SlabMemory(SlabMemory&& other) noexcept { *this = std::move(other); }
  SlabMemory& operator=(SlabMemory&& other) noexcept;
  SlabMemory(const SlabMemory&) = delete;
  SlabMemory& operator=(const SlabMemory&) = delete;
  ~SlabMemory();

  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] std::uint64_t bytes() const { return bytes_; }
  [[nodiscard]] int numa() const { return numa_; }  // the node it is meant for
  // Whether the pages are bound to numa() (false when this machine has no
  // such node, or the allocator does not bind).
  [[nodiscard]] bool bound() const { return bound_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  int numa_ = kUnknownNuma;
  bool bound_ = false;
  Release release_;
};

// Makes a slab of `bytes` for NUMA node `numa`. The engine will pass one that
// hands out registered memory.
using SlabAllocator = std::function<Result<SlabMemory>(int numa, std::uint64_t bytes)>;

// The default allocator: anonymous pages mapped lazily (a slab costs nothing
// until its bytes arrive), bound to `numa` with mbind(MPOL_BIND) when this
// machine has that node; otherwise unbound, with the intended node recorded.
// bytes 0 or numa outside [0, kMaxNuma] → invalid_argument; the mapping
// refused → resource_exhausted.
[[nodiscard]] Result<SlabMemory> allocate_slab(int numa, std::uint64_t bytes);

class RebuiltPlan {
 public:
  [[nodiscard]] std::uint32_t blocks() const { return blocks_; }
  [[nodiscard]] std::uint32_t slots() const { return slots_; }
  [[nodiscard]] std::uint32_t segments_per_slot() const { return segments_; }

  // Where (block, slot, segment) lands; indices are the caller's invariant.
  [[nodiscard]] std::byte* view(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    return views_[(std::size_t{slot} * segments_ + segment) * blocks_ + block];
  }
  [[nodiscard]] std::uint64_t segment_bytes(std::uint32_t slot, std::uint32_t segment) const {
    return segment_bytes_[std::size_t{slot} * segments_ + segment];
  }
  // The NUMA node of the slab that holds (block, slot).
  [[nodiscard]] int numa(std::uint32_t block, std::uint32_t slot) const;

  [[nodiscard]] const SlabLayout& layout() const { return layout_; }
  // Indexed like layout().slabs; the ops of materialize() write into these.
  [[nodiscard]] const std::vector<SlabMemory>& slabs() const { return slabs_; }

 private:
  friend class Rebuilder;
  std::uint32_t blocks_ = 0;
  std::uint32_t slots_ = 0;
  std::uint32_t segments_ = 0;
  SlabLayout layout_;
  std::vector<SlabMemory> slabs_;
  std::vector<std::uint64_t> segment_bytes_;
  // From the heap on purpose: a requester rebuilds plan after plan, and the
  // allocator hands back warm pages. Fresh pages would cost a fault each
  // (docs/plan.md, "Rebuild": 83 ms for 21 MB on the 2-core VM).
  std::unique_ptr<std::byte*[]> views_;  // [slot][segment][block]
};

// What the rebuild refused; read by metrics.
struct RebuildMetrics {
  std::uint64_t plans_rebuilt = 0;
  std::uint64_t rejected_unknown_numa = 0;  // a chunk on kUnknownNuma
  std::uint64_t rejected_split_slot = 0;    // a (block, slot) across two nodes
  std::uint64_t rejected_invalid = 0;       // failed validate(), or allocation
};

// Lives on the requester's loop: not thread-safe, no locks.
class Rebuilder {
 public:
  explicit Rebuilder(SlabAllocator allocator = allocate_slab) : allocator_(std::move(allocator)) {}

  // A plan that fails validate() → its error; a chunk on kUnknownNuma or a
  // (block, slot) whose segments lie on two NUMA nodes → invalid_argument;
  // an allocator failure → its error. Each refusal is counted.
  [[nodiscard]] Result<RebuiltPlan> rebuild(const Plan& plan);

  [[nodiscard]] const RebuildMetrics& metrics() const { return metrics_; }

 private:
  SlabAllocator allocator_;
  RebuildMetrics metrics_;
};

}  // namespace baton::plan
