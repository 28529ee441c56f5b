// The naive baseline: one wire entry per (block, slot) listing every
// segment's address and length and the slot's NUMA node — what a holder sends
// without a plan. Kept to measure what the plan saves (tests, benchmarks).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "baton/common/status.h"
#include "baton/plan/placement_table.h"

namespace baton::plan {

// block_hashes neither empty nor one per block → invalid_argument.
[[nodiscard]] Result<std::string> serialize_naive(const PlacementTable& table,
                                                  std::span<const std::uint64_t> block_hashes = {});

// Back to a table. Malformed bytes, a wrong version, bad counts, an entry out
// of range, a (block, slot) listed twice or missing, or a segment count that
// disagrees → invalid_argument.
[[nodiscard]] Result<PlacementTable> parse_naive(std::string_view bytes);

}  // namespace baton::plan
