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
    if (s.bytes > UINT32_MAX) {  // as a holder's table holds them
      return Status::invalid_argument("plan: slot {} segment {} has {} bytes, over a segment's 4 GiB",
                                      i / p.segments_per_slot, i % p.segments_per_slot, s.bytes);
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
  // [0, blocks) without gap or overlap; a group of k lanes (block_step k)
  // is checked as a whole and tiles [b, b + its blocks).
  std::vector<bool> used(p.chunks.size(), false);
  std::uint64_t column = 0;
  std::uint32_t next_block = 0;
  for (std::size_t i = 0; i < p.placements.size();) {
    const Placement& head = p.placements[i];
    const std::uint32_t step = head.block_step;
    if (step == 0 || step > kMaxBlockStep) {
      return Status::invalid_argument("plan: placement {} has block step {}, expected 1..{}", i, step, kMaxBlockStep);
    }
    if (step > p.placements.size() - i) {
      return Status::invalid_argument("plan: placement {} starts a group of {} lanes but only {} placements remain", i,
                                      step, p.placements.size() - i);
    }
    if (column >= columns) {
      return Status::invalid_argument("plan: placement {} is past the last slot's blocks", i);
    }
    const std::uint64_t expected_slot = column / p.segments_per_slot;
    const std::uint64_t expected_segment = column % p.segments_per_slot;
    std::uint64_t group_blocks = 0;
    for (std::uint32_t lane = 0; lane < step; ++lane) {
      const std::size_t at = i + lane;
      const Placement& pl = p.placements[at];
      if (pl.slot >= p.slots || pl.segment >= p.segments_per_slot) {
        return Status::invalid_argument(
            "plan: placement {} names slot {} segment {}, plan has {} slots × {} segments", at, pl.slot, pl.segment,
            p.slots, p.segments_per_slot);
      }
      if (pl.chunk >= p.chunks.size()) {
        return Status::invalid_argument("plan: placement {} names chunk {}, plan has {} chunks", at, pl.chunk,
                                        p.chunks.size());
      }
      if (pl.block_step != step) {
        return Status::invalid_argument("plan: placement {} has block step {} inside a group of {} lanes", at,
                                        pl.block_step, step);
      }
      if (pl.slot != expected_slot || pl.segment != expected_segment || pl.block_start != next_block + lane) {
        return Status::invalid_argument(
            "plan: placement {} starts slot {} segment {} block {}, expected slot {} segment {} block {} "
            "(placements must be ordered and tile every slot segment)",
            at, pl.slot, pl.segment, pl.block_start, expected_slot, expected_segment, std::uint64_t{next_block} + lane);
      }
      if (pl.block_count == 0 || pl.block_count > p.blocks - next_block - group_blocks) {
        return Status::invalid_argument("plan: placement {} has {} blocks from block {}, expected 1..{}", at,
                                        pl.block_count, pl.block_start, p.blocks - next_block - group_blocks);
      }
      if (lane > 0) {
        // Lanes of a group: counts c, …, c, c − 1, …, c − 1 (the group's
        // blocks [b, b + n) dealt round-robin), so the lanes tile exactly.
        const std::uint32_t first = p.placements[i].block_count;
        const std::uint32_t previous = p.placements[at - 1].block_count;
        if (pl.block_count > previous || pl.block_count + 1 < first) {
          return Status::invalid_argument(
              "plan: placement {} (lane {} of a group) has {} blocks after a lane of {}, lane 0 has {} (lanes "
              "must be longest first and differ by at most one)",
              at, lane, pl.block_count, previous, first);
        }
      }
      group_blocks += pl.block_count;
      const SegmentSchema& s = p.segment(pl.slot, pl.segment);
      const Chunk& chunk = p.chunks[pl.chunk];
      const auto end = span_end(pl.offset, pl.block_count, s.stride, s.bytes);
      if (!end || *end > chunk.length) {
        return Status::invalid_argument(
            "plan: placement {} spans offset {} + {} blocks × stride {} (segment {} bytes), past chunk {} of {} bytes",
            at, pl.offset, pl.block_count, s.stride, s.bytes, pl.chunk, chunk.length);
      }
      used[pl.chunk] = true;
    }
    if (step > 1 && head.block_count < 2) {
      // One block per lane is plain runs; requiring two also makes a decoder
      // that ignores block_step refuse the plan (lane 1 then starts inside
      // lane 0's blocks) instead of misreading it.
      return Status::invalid_argument("plan: placement {} starts a group of {} lanes of 1 block, expected ≥ 2 blocks "
                                      "in its first lane",
                                      i, step);
    }
    next_block += static_cast<std::uint32_t>(group_blocks);
    if (next_block == p.blocks) {
      ++column;
      next_block = 0;
    }
    i += step;
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
