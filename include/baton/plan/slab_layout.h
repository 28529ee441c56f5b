// Where each remote chunk lands on the requester: one slab per distinct
// source NUMA node, chunks packed in plan order at kSlabAlignment. Shared by
// materialize() (op destinations) and the rebuild (slot views).
#pragma once

#include <cstdint>
#include <vector>

#include "baton/common/status.h"
#include "baton/plan/plan.h"

namespace baton::plan {

// Each chunk starts on a cache line of its slab, so no two chunks' copies
// write the same line.
inline constexpr std::uint64_t kSlabAlignment = 64;

struct SlabSpec {
  int numa = kUnknownNuma;  // the holder's NUMA node; the slab belongs there
  std::uint64_t bytes = 0;
  friend bool operator==(const SlabSpec&, const SlabSpec&) = default;
};

struct ChunkLocation {
  std::uint32_t slab = 0;
  std::uint64_t offset = 0;  // inside the slab
  friend bool operator==(const ChunkLocation&, const ChunkLocation&) = default;
};

struct SlabLayout {
  std::vector<SlabSpec> slabs;        // by NUMA node, ascending
  std::vector<ChunkLocation> chunks;  // one per plan chunk
};

// A chunk on kUnknownNuma → invalid_argument: its bytes cannot be rebuilt on
// the node the holder used, and placing them elsewhere silently would undo
// the point of the plan. A slab whose size passes 2^64 → out_of_range.
[[nodiscard]] Result<SlabLayout> layout_slabs(const Plan& plan);

}  // namespace baton::plan
