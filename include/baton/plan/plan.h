// The transfer plan: how a holder tells a requester where every byte of a set
// of KV blocks lives. A block has one slot per (layer × TP rank); a slot has
// one segment (MLA, fused KV) or two (K and V). Instead of listing every
// (block, slot, segment), a plan carries each slot's segment schema once
// (bytes, stride), the remote chunks (merged byte ranges, each on one NUMA
// node) and one placement per run (consecutive blocks at the stride inside a
// chunk). docs/plan.md describes the model, the wire form and the rules.
#pragma once

#include <cstdint>
#include <vector>

#include "baton/common/status.h"
#include "baton/topology/facts.h"

namespace baton::plan {

inline constexpr std::uint32_t kPlanVersion = 1;
inline constexpr int kUnknownNuma = topology::kUnknownNuma;
// NUMA os indexes run well below this on every machine we know (POWER9: 0, 8;
// Grace Hopper GPU memory nodes: < 40); a larger one is a corrupt plan.
inline constexpr int kMaxNuma = 1023;
// Bounds that keep a hostile plan from making the requester allocate without
// limit: the rebuild holds one pointer per cell (blocks × slots × segments).
inline constexpr std::uint32_t kMaxBlocks = 1u << 22;
inline constexpr std::uint32_t kMaxSlots = 1u << 16;
inline constexpr std::uint64_t kMaxCells = 1ull << 28;

struct SegmentSchema {
  std::uint64_t bytes = 0;   // one block's segment
  std::uint64_t stride = 0;  // from one block of a run to the next; >= bytes
  friend bool operator==(const SegmentSchema&, const SegmentSchema&) = default;
};

// A merged remote byte range on one NUMA node: the unit the requester reads.
struct Chunk {
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  int numa = kUnknownNuma;
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

// One run: blocks [block_start, block_start + block_count) of (slot, segment)
// start at chunks[chunk].base + offset, one segment stride apart.
struct Placement {
  std::uint32_t slot = 0;
  std::uint32_t segment = 0;
  std::uint32_t chunk = 0;
  std::uint64_t offset = 0;
  std::uint32_t block_start = 0;
  std::uint32_t block_count = 0;
  friend bool operator==(const Placement&, const Placement&) = default;
};

struct Plan {
  std::uint32_t blocks = 0;
  std::uint32_t slots = 0;
  std::uint32_t segments_per_slot = 0;
  std::vector<SegmentSchema> schema;  // [slot * segments_per_slot + segment]
  std::vector<Chunk> chunks;
  // Ordered by (slot, segment, block_start); together they cover every
  // (block, slot, segment) exactly once.
  std::vector<Placement> placements;
  std::vector<std::uint64_t> block_hashes;  // empty, or one per block

  [[nodiscard]] const SegmentSchema& segment(std::uint32_t slot, std::uint32_t segment) const {
    return schema[std::size_t{slot} * segments_per_slot + segment];
  }
  friend bool operator==(const Plan&, const Plan&) = default;
};

// Every rule a requester relies on (docs/plan.md, "Validation"): counts within
// bounds, schema sizes and strides, chunks non-empty and not wrapping, every
// placement's indices in range and its span inside its chunk, placements
// ordered and tiling each (slot, segment) exactly, every chunk used, hashes
// absent or one per block. The first violation → invalid_argument naming it.
Status validate(const Plan& plan);

}  // namespace baton::plan
