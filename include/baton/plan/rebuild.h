// Rebuilding a plan on the requester: one slab per distinct source NUMA node
// (laid out by layout_slabs) and, for every block, its slot views — where
// each (block, slot, segment) lands once the plan's ops have run.
// Every (block, slot) is rebuilt on the NUMA node the holder used: a chunk on
// an unknown node, or a slot whose segments come from two nodes, is refused
// and counted, never placed elsewhere.
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
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

// A rebuilt plan: its slabs and, instead of a pointer per (block, slot,
// segment), one descriptor per run (its slab address, stride, first block,
// step and node) from which every view is computed on demand. A 4500-block
// plan of 36 layers × TP 8 with K and V has 2.6 M views (21 MB as a table,
// whose first write costs ~80 ms of page faults on the 2-core VM) but 1,440
// runs (35 KB), so a rebuild costs the same in a fresh process as in a warm
// one (docs/plan.md, "Rebuild").
class RebuiltPlan {
 public:
  [[nodiscard]] std::uint32_t blocks() const { return blocks_; }
  [[nodiscard]] std::uint32_t slots() const { return slots_; }
  [[nodiscard]] std::uint32_t segments_per_slot() const { return segments_; }

  // Where (block, slot, segment) lands once the plan's ops have run: its
  // run's slab address + index × stride. A slot segment that is one run (the
  // usual case) costs a few loads and a multiply; otherwise a branch-free
  // binary search over its runs comes first. Indices are the caller's
  // invariant (asserted).
  [[nodiscard]] std::byte* view(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    const auto [run, index] = locate(block, column(slot, segment));
    return run->base + index * run->stride;
  }
  // The views of blocks [first_block, first_block + out.size()) of
  // (slot, segment), in block order, into `out` (a table in the caller's
  // memory, for a kernel's block table or a registration): one search, then
  // O(1) per view. The range is the caller's invariant (asserted).
  void views(std::uint32_t slot, std::uint32_t segment, std::uint32_t first_block, std::span<std::byte*> out) const;

  [[nodiscard]] std::uint64_t segment_bytes(std::uint32_t slot, std::uint32_t segment) const {
    return segment_bytes_[column(slot, segment)];
  }
  // The NUMA node of the slab that holds (block, slot).
  [[nodiscard]] int numa(std::uint32_t block, std::uint32_t slot) const {
    return locate(block, column(slot, 0)).first->numa;
  }
  // Runs (placements) behind the views.
  [[nodiscard]] std::size_t runs() const { return runs_.size(); }

  [[nodiscard]] const SlabLayout& layout() const { return layout_; }
  // Indexed like layout().slabs; the ops of materialize() write into these.
  [[nodiscard]] const std::vector<SlabMemory>& slabs() const { return slabs_; }

 private:
  friend class Rebuilder;
  // One placement, resolved: blocks begin + i·step (lane groups: + lane)
  // lie at base + i·stride, where begin is run_begin_[this run]. For a group
  // of k lanes, all k carry the group's first block as begin, so a search
  // lands on the group's last lane.
  struct Run {
    std::byte* base;
    std::uint64_t stride;
    std::uint16_t step;
    std::uint8_t step_shift;  // log2(step) when step is a power of two, else kNoShift
    std::int16_t numa;
  };
  static constexpr std::uint8_t kNoShift = 0xff;

  [[nodiscard]] std::size_t column(std::uint32_t slot, std::uint32_t segment) const {
    assert(slot < slots_ && segment < segments_);
    return std::size_t{slot} * segments_ + segment;
  }
  // The index of the last run of `column` that starts at or before `block`:
  // a lone run, or the last lane of a group. A branch-free binary search over
  // the column's run starts, kept apart from the runs so that it reads 4
  // bytes per run.
  [[nodiscard]] std::uint32_t search(std::uint32_t block, std::size_t column) const {
    assert(block < blocks_);
    std::uint32_t first = column_runs_[column];
    std::uint32_t n = column_runs_[column + 1] - first;
    const std::uint32_t* begin = run_begin_.data();
    while (n > 1) {
      const std::uint32_t half = n / 2;
      first = begin[first + half] <= block ? first + half : first;
      n -= half;
    }
    return first;
  }
  // The run that holds `block` of `column`, and the block's index in it.
  [[nodiscard]] std::pair<const Run*, std::uint64_t> locate(std::uint32_t block, std::size_t column) const {
    const std::uint32_t at = search(block, column);
    const Run* run = runs_.data() + at;
    const std::uint32_t offset = block - run_begin_[at];
    if (run->step == 1) [[likely]] return {run, offset};
    const Run* lanes = run - (run->step - 1);
    if (run->step_shift != kNoShift) return {lanes + (offset & (run->step - 1u)), offset >> run->step_shift};
    return {lanes + offset % run->step, offset / run->step};
  }

  std::uint32_t blocks_ = 0;
  std::uint32_t slots_ = 0;
  std::uint32_t segments_ = 0;
  SlabLayout layout_;
  std::vector<SlabMemory> slabs_;
  std::vector<std::uint64_t> segment_bytes_;  // [slot][segment]
  std::vector<std::uint32_t> column_runs_;    // [slot][segment] → first run; one more at the end
  std::vector<Run> runs_;                     // in placement order
  std::vector<std::uint32_t> run_begin_;      // the runs' (groups') first blocks
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
