// Encoding on the holder: from a PlacementTable to a Plan. Derives each slot
// segment's schema (bytes, stride), finds runs (consecutive blocks at the
// stride on one NUMA node, or groups of 2..8 interleaved lanes where blocks
// alternate between tensors, as on a replica spread over sockets), merges
// touching runs on one NUMA node into remote chunks and locates every run in
// its chunk as a placement.
#pragma once

#include <cstdint>
#include <span>

#include "baton/common/status.h"
#include "baton/plan/placement_table.h"
#include "baton/plan/plan.h"

namespace baton::plan {

// invalid_argument, naming the block, slot and segment, for: a zero length;
// a length that differs from block 0's (two KV layouts in one request);
// consecutive blocks closer than their length (stride < bytes, overlap); a
// run whose end passes 2^64; a NUMA value outside [kUnknownNuma, kMaxNuma];
// block_hashes neither empty nor one per block; an empty table. The result
// always passes validate().
[[nodiscard]] Result<Plan> encode_plan(const PlacementTable& table,
                                       std::span<const std::uint64_t> block_hashes = {});

}  // namespace baton::plan
