#include "baton/plan/plan.h"

#include <vector>

#include "plan/checked.h"

namespace baton::plan {

Status validate(const Plan& p) {
  if (p.blocks == 0 || p.blocks > kMaxBlocks) {
    return Status::invalid_argument("plan: {} blocks, expected 1..{}", p.blocks, kMaxBlocks);
  }
  if (p.slots == 0 || p.slots > kMaxSlots) {
    return Status::invalid_argument("plan: {} slots, expected 1..{}", p.slots, kMaxSlots);
  }
  if (p.segments_per_slot != 1 && p.segments_per_slot != 2) {
    return Status::invalid_argument("plan: {} segments per slot, expected 1 or 2", p.segments_per_slot);
  }
  const std::uint64_t columns = std::uint64_t{p.slots} * p.segments_per_slot;
  if (columns * p.blocks > kMaxCells) {
    return Status::invalid_argument("plan: {} blocks × {} slots × {} segments exceeds {} cells", p.blocks, p.slots,
                                    p.segments_per_slot, kMaxCells);
  }
  if (p.schema.size() != columns) {
    return Status::invalid_argument("plan: schema has {} segments, expected {} ({} slots × {})", p.schema.size(),
                                    columns, p.slots, p.segments_per_slot);
  }
  for (std::size_t i = 0; i < p.schema.size(); ++i) {
    const SegmentSchema& s = p.schema[i];
    if (s.bytes == 0) {
      return Status::invalid_argument("plan: slot {} segment {} has 0 bytes", i / p.segments_per_slot,
                                      i % p.segments_per_slot);
    }
    if (s.stride < s.bytes) {
      return Status::invalid_argument("plan: slot {} segment {} has stride {} < bytes {}", i / p.segments_per_slot,
                                      i % p.segments_per_slot, s.stride, s.bytes);
    }
  }
  for (std::size_t c = 0; c < p.chunks.size(); ++c) {
    const Chunk& chunk = p.chunks[c];
    std::uint64_t end = 0;
    if (chunk.length == 0) return Status::invalid_argument("plan: chunk {} has length 0", c);
    if (__builtin_add_overflow(chunk.base, chunk.length, &end)) {
      return Status::invalid_argument("plan: chunk {} at {:#x} + {} bytes passes 2^64", c, chunk.base, chunk.length);
    }
    if (chunk.numa < kUnknownNuma || chunk.numa > kMaxNuma) {
      return Status::invalid_argument("plan: chunk {} on NUMA node {}, expected {}..{}", c, chunk.numa, kUnknownNuma,
                                      kMaxNuma);
    }
  }
  if (p.block_hashes.size() != 0 && p.block_hashes.size() != p.blocks) {
    return Status::invalid_argument("plan: {} block hashes for {} blocks, expected none or one per block",
                                    p.block_hashes.size(), p.blocks);
  }

  // Placements walk the (slot, segment) columns in order, each tiling
  // [0, blocks) without gap or overlap.
  std::vector<bool> used(p.chunks.size(), false);
  std::uint64_t column = 0;
  std::uint32_t next_block = 0;
  for (std::size_t i = 0; i < p.placements.size(); ++i) {
    const Placement& pl = p.placements[i];
    if (pl.slot >= p.slots || pl.segment >= p.segments_per_slot) {
      return Status::invalid_argument("plan: placement {} names slot {} segment {}, plan has {} slots × {} segments",
                                      i, pl.slot, pl.segment, p.slots, p.segments_per_slot);
    }
    if (pl.chunk >= p.chunks.size()) {
      return Status::invalid_argument("plan: placement {} names chunk {}, plan has {} chunks", i, pl.chunk,
                                      p.chunks.size());
    }
    if (column >= columns) {
      return Status::invalid_argument("plan: placement {} is past the last slot's blocks", i);
    }
    const std::uint64_t expected_slot = column / p.segments_per_slot;
    const std::uint64_t expected_segment = column % p.segments_per_slot;
    if (pl.slot != expected_slot || pl.segment != expected_segment || pl.block_start != next_block) {
      return Status::invalid_argument(
          "plan: placement {} starts slot {} segment {} block {}, expected slot {} segment {} block {} "
          "(placements must be ordered and tile every slot segment)",
          i, pl.slot, pl.segment, pl.block_start, expected_slot, expected_segment, next_block);
    }
    if (pl.block_count == 0 || pl.block_count > p.blocks - next_block) {
      return Status::invalid_argument("plan: placement {} has {} blocks from block {}, expected 1..{}", i,
                                      pl.block_count, pl.block_start, p.blocks - next_block);
    }
    const SegmentSchema& s = p.segment(pl.slot, pl.segment);
    const Chunk& chunk = p.chunks[pl.chunk];
    const auto end = span_end(pl.offset, pl.block_count, s.stride, s.bytes);
    if (!end || *end > chunk.length) {
      return Status::invalid_argument(
          "plan: placement {} spans offset {} + {} blocks × stride {} (segment {} bytes), past chunk {} of {} bytes", i,
          pl.offset, pl.block_count, s.stride, s.bytes, pl.chunk, chunk.length);
    }
    used[pl.chunk] = true;
    next_block += pl.block_count;
    if (next_block == p.blocks) {
      ++column;
      next_block = 0;
    }
  }
  if (column != columns) {
    return Status::invalid_argument("plan: placements cover slot segments up to {} (block {}), expected all {}", column,
                                    next_block, columns);
  }
  for (std::size_t c = 0; c < used.size(); ++c) {
    if (!used[c]) return Status::invalid_argument("plan: chunk {} is named by no placement", c);
  }
  return Status::ok();
}

}  // namespace baton::plan
