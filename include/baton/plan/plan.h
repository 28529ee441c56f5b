// The transfer plan: how a holder tells a requester where every byte of a set
// of KV blocks lives. A block has one slot per (layer × TP rank); a slot has
// one segment (MLA, fused KV) or two (K and V). Instead of listing every
// (block, slot, segment), a plan carries each slot's segment schema once
// (bytes, stride), the remote chunks (merged byte ranges, each on one NUMA
// node) and one placement per run (blocks one block step apart, at the
// stride, inside a chunk). docs/plan.md describes the model, the wire form
// and the rules.
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
// Bounds that keep a hostile plan from making the requester work without
// limit (the naive baseline and the holder's table hold one entry per cell,
// blocks × slots × segments).
inline constexpr std::uint32_t kMaxBlocks = 1u << 22;
inline constexpr std::uint32_t kMaxSlots = 1u << 16;
inline constexpr std::uint64_t kMaxCells = 1ull << 28;
// The most lanes a group of interleaved runs may have (block_step). A holder
// interleaves blocks over its NUMA nodes (2, 4, 8 sockets); 64 leaves room and
// bounds the requester's per-block checks (step²) on a hostile plan.
inline constexpr std::uint32_t kMaxBlockStep = 64;

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

// One run: blocks block_start + i·block_step (i < block_count) of
// (slot, segment) lie at chunks[chunk].base + offset + i·stride (the
// segment's stride).
//
// block_step 1 is a run of consecutive blocks. A step k > 1 is one lane of a
// group of k interleaved runs (a holder whose blocks alternate NUMA nodes
// puts blocks 0, 2, 4… in one tensor and 1, 3, 5… in another): the group is
// k consecutive placements of one (slot, segment), all with step k, lane j
// starting at block b + j, and together they cover blocks [b, b + n) exactly
// — lane counts non-increasing, the first ≥ 2 and the last at most one below
// it.
struct Placement {
  std::uint32_t slot = 0;
  std::uint32_t segment = 0;
  std::uint32_t chunk = 0;
  std::uint64_t offset = 0;
  std::uint32_t block_start = 0;
  std::uint32_t block_count = 0;
  std::uint32_t block_step = 1;
  friend bool operator==(const Placement&, const Placement&) = default;
};

struct Plan {
  std::uint32_t blocks = 0;
  std::uint32_t slots = 0;
  std::uint32_t segments_per_slot = 0;
  std::vector<SegmentSchema> schema;  // [slot * segments_per_slot + segment]
  std::vector<Chunk> chunks;
  // Ordered by (slot, segment, block_start); together they cover every
  // (block, slot, segment) exactly once (groups of lanes as above).
  std::vector<Placement> placements;
  std::vector<std::uint64_t> block_hashes;  // empty, or one per block

  [[nodiscard]] const SegmentSchema& segment(std::uint32_t slot, std::uint32_t segment) const {
    return schema[std::size_t{slot} * segments_per_slot + segment];
  }
  friend bool operator==(const Plan&, const Plan&) = default;
};

// Every rule a requester relies on (docs/plan.md, "Validation"): counts within
// bounds, schema sizes (1 byte .. 4 GiB, as a PlacementTable holds them) and
// strides, chunks non-empty and not wrapping, every
// placement's indices in range and its span inside its chunk, block steps in
// 1..kMaxBlockStep forming whole groups, placements ordered and tiling each
// (slot, segment) exactly, every chunk used, hashes absent or one per block.
// The first violation → invalid_argument naming it. O(slots + chunks +
// placements): it never walks the blocks.
Status validate(const Plan& plan);

}  // namespace baton::plan
