#include "baton/plan/encode.h"

#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "plan/checked.h"

namespace baton::plan {
namespace {

// A run before chunking: blocks block_start + i·step (i < count) of one
// slot segment, from `base` to `end` on `numa`.
struct Run {
  std::uint64_t base;
  std::uint64_t end;
  std::uint32_t block_start;
  std::uint32_t count;
  std::uint32_t column;  // slot * segments + segment
  std::uint16_t step;
  std::int16_t numa;
};

// The largest group the encoder looks for: 2 (blocks alternating two
// sockets) up to 8 sockets. validate() accepts up to kMaxBlockStep; trying
// every step on a table that has no pattern would cost 63 tests per block.
constexpr std::uint32_t kMaxEncodeStep = 8;
static_assert(kMaxEncodeStep <= kMaxBlockStep);

// The stride of a slot segment: the most common distance (>= bytes) between
// blocks on one node among the first few, so that one gap in the block table
// does not set it; ties go to the smaller. Neighbours first; blocks 2, 3 …
// apart only while no distance explains ¾ of its pairs, so that blocks
// alternating between tensors (on one node or two) get their lanes' stride.
// No such pair at all → bytes.
std::uint64_t choose_stride(std::span<const std::uint64_t> addr, std::span<const std::int16_t> numa,
                            std::uint64_t bytes) {
  constexpr std::size_t kSample = 16;
  std::uint64_t best = bytes;
  std::size_t best_count = 0;
  for (std::size_t distance = 1; distance <= kMaxEncodeStep && distance < addr.size(); ++distance) {
    std::array<std::uint64_t, kSample> deltas{};
    std::size_t n = 0;
    const std::size_t pairs = std::min(addr.size(), kSample + distance) - distance;
    for (std::size_t b = distance; b < distance + pairs; ++b) {
      const std::uint64_t d = addr[b] - addr[b - distance];
      if (numa[b] == numa[b - distance] && addr[b] > addr[b - distance] && d >= bytes) deltas[n++] = d;
    }
    std::sort(deltas.begin(), deltas.begin() + static_cast<std::ptrdiff_t>(n));
    for (std::size_t i = 0; i < n;) {
      std::size_t j = i;
      while (j < n && deltas[j] == deltas[i]) ++j;
      if (j - i > best_count) {
        best = deltas[i];
        best_count = j - i;
      }
      i = j;
    }
    if (best_count * 4 >= pairs * 3) break;
  }
  return best;
}

Status check_numa_column(std::span<const std::int16_t> numa, std::uint32_t slot) {
  // Branch-free min/max first (vectorizes); the slow scan only names the culprit.
  std::int16_t lo = numa[0];
  std::int16_t hi = numa[0];
  for (std::int16_t n : numa) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  if (lo >= kUnknownNuma && hi <= kMaxNuma) return Status::ok();
  for (std::size_t b = 0; b < numa.size(); ++b) {
    if (numa[b] == PlacementTable::kNumaOutOfRange) {
      return Status::invalid_argument("encode_plan: block {} slot {} was set a NUMA node outside {}..{}", b, slot,
                                      kUnknownNuma, kMaxNuma);
    }
    if (numa[b] < kUnknownNuma || numa[b] > kMaxNuma) {
      return Status::invalid_argument("encode_plan: block {} slot {} on NUMA node {}, expected {}..{}", b, slot,
                                      numa[b], kUnknownNuma, kMaxNuma);
    }
  }
  return Status::ok();
}

// Splits one slot segment column into runs, appending them to `runs`: the
// longest run of consecutive blocks from each position; where that is a
// single block, a group of k interleaved lanes (k = 2..kMaxEncodeStep) if
// one covers at least two blocks per lane.
Status find_runs(std::span<const std::uint64_t> addr, std::span<const std::uint32_t> len,
                 std::span<const std::int16_t> numa, std::uint32_t slot, std::uint32_t segment, std::uint32_t column,
                 SegmentSchema& schema, std::vector<Run>& runs) {
  const std::uint32_t bytes = len[0];
  if (bytes == 0) {
    return Status::invalid_argument("encode_plan: block 0 slot {} segment {} has length 0", slot, segment);
  }
  const std::uint64_t stride = choose_stride(addr, numa, bytes);
  schema = {bytes, stride};
  const std::size_t blocks = addr.size();

  auto add_run = [&](std::size_t first, std::size_t count, std::size_t step) -> Status {
    const auto end = span_end(addr[first], count, stride, bytes);
    if (!end) {
      return Status::invalid_argument("encode_plan: slot {} segment {} {} blocks from block {} at {:#x} pass 2^64",
                                      slot, segment, count, first, addr[first]);
    }
    runs.push_back({addr[first], *end, static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(count), column,
                    static_cast<std::uint16_t>(step), numa[first]});
    return Status::ok();
  };
  // Block b (> 0) against block 0's length and its neighbour b − 1.
  auto check_block = [&](std::size_t b) -> Status {
    if (len[b] != bytes) {
      if (len[b] == 0) {
        return Status::invalid_argument("encode_plan: block {} slot {} segment {} has length 0", b, slot, segment);
      }
      return Status::invalid_argument(
          "encode_plan: block {} slot {} segment {} has {} bytes, block 0 has {} (the blocks' layouts differ)", b, slot,
          segment, len[b], bytes);
    }
    // Either way round: a block below its predecessor may overlap it too.
    const std::uint64_t apart = addr[b] >= addr[b - 1] ? addr[b] - addr[b - 1] : addr[b - 1] - addr[b];
    if (apart < bytes) {
      return Status::invalid_argument(
          "encode_plan: slot {} segment {} blocks {} and {} are {} bytes apart, less than their {} bytes (they overlap)",
          slot, segment, b - 1, b, apart, bytes);
    }
    return Status::ok();
  };
  auto continues = [&](std::size_t b, std::size_t step) {
    return len[b] == bytes && addr[b] - addr[b - step] == stride && numa[b] == numa[b - step];
  };

  // Most windows continue the current run: test a whole window branch-free
  // (a fixed trip count, so GCC vectorizes it even at -O2) and walk it block
  // by block only when something breaks. The tail is always walked.
  constexpr std::size_t kWindow = 32;
  auto window_continues = [&](std::size_t w) {
    const std::uint64_t* a = addr.data() + w;
    const std::uint32_t* l = len.data() + w;
    const std::int16_t* n = numa.data() + w;
    std::uint64_t broken = 0;
    for (std::size_t i = 0; i < kWindow; ++i) {
      broken |= (l[i] ^ bytes) | (a[i] - a[i - 1] - stride) | static_cast<std::uint16_t>(n[i] ^ n[i - 1]);
    }
    return broken == 0;
  };

  std::size_t pos = 0;
  while (pos < blocks) {
    // The run of consecutive blocks from pos ends before block b.
    std::size_t b = pos + 1;
    for (;;) {
      while (b + kWindow <= blocks && window_continues(b)) b += kWindow;
      const std::size_t limit = std::min(blocks, b + kWindow);
      while (b < limit && continues(b, 1)) ++b;
      if (b < limit || b == blocks) break;
    }
    if (b < blocks) {
      if (Status s = check_block(b); !s.is_ok()) return s;
    }
    if (b == pos + 1 && b < blocks) {
      // A lone block: look for lanes. Lane j of a k-group holds blocks
      // pos + j, pos + j + k, …; the group grows while each next block
      // continues the block k before it.
      std::size_t group = 0;
      std::size_t group_step = 0;
      for (std::size_t k = 2; k <= kMaxEncodeStep && pos + 2 * k <= blocks; ++k) {
        if (!continues(pos + k, k)) continue;
        std::size_t n = k + 1;
        while (pos + n < blocks && continues(pos + n, k)) ++n;
        if (n >= 2 * k) {
          group = n;
          group_step = k;
          break;
        }
      }
      if (group != 0) {
        // Neighbours in a group sit in different lanes: check each pair once.
        for (std::size_t i = pos + 2; i < pos + group; ++i) {
          if (Status s = check_block(i); !s.is_ok()) return s;
        }
        for (std::size_t lane = 0; lane < group_step; ++lane) {
          if (Status s = add_run(pos + lane, (group - lane + group_step - 1) / group_step, group_step); !s.is_ok()) {
            return s;
          }
        }
        pos += group;
        if (pos < blocks) {
          if (Status s = check_block(pos); !s.is_ok()) return s;
        }
        continue;
      }
    }
    if (Status s = add_run(pos, b - pos, 1); !s.is_ok()) return s;
    pos = b;
  }
  return Status::ok();
}

}  // namespace

Result<Plan> encode_plan(const PlacementTable& table, std::span<const std::uint64_t> block_hashes) {
  const std::uint32_t blocks = table.blocks();
  const std::uint32_t slots = table.slots();
  const std::uint32_t segments = table.segments_per_slot();
  if (blocks == 0 || slots == 0) {
    return std::unexpected(Status::invalid_argument("encode_plan: the table is empty (create it first)"));
  }
  if (!block_hashes.empty() && block_hashes.size() != blocks) {
    return std::unexpected(Status::invalid_argument(
        "encode_plan: {} block hashes for {} blocks, expected none or one per block", block_hashes.size(), blocks));
  }

  Plan plan;
  plan.blocks = blocks;
  plan.slots = slots;
  plan.segments_per_slot = segments;
  plan.schema.resize(std::size_t{slots} * segments);
  plan.block_hashes.assign(block_hashes.begin(), block_hashes.end());

  std::vector<Run> runs;
  runs.reserve(plan.schema.size());
  for (std::uint32_t s = 0; s < slots; ++s) {
    const auto numa = table.numa_column(s);
    if (Status st = check_numa_column(numa, s); !st.is_ok()) return std::unexpected(std::move(st));
    for (std::uint32_t g = 0; g < segments; ++g) {
      const std::uint32_t column = s * segments + g;
      if (Status st = find_runs(table.addresses(s, g), table.lengths(s, g), numa, s, g, column, plan.schema[column], runs);
          !st.is_ok()) {
        return std::unexpected(std::move(st));
      }
    }
  }

  // Chunks: runs on one node sorted by address; a run that touches or
  // overlaps the current chunk extends it.
  std::vector<std::uint32_t> order(runs.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (runs[a].numa != runs[b].numa) return runs[a].numa < runs[b].numa;
    return runs[a].base < runs[b].base;
  });
  std::vector<std::uint32_t> run_chunk(runs.size());
  for (std::uint32_t i : order) {
    const Run& r = runs[i];
    if (plan.chunks.empty() || plan.chunks.back().numa != r.numa ||
        r.base > plan.chunks.back().base + plan.chunks.back().length) {
      plan.chunks.push_back({r.base, r.end - r.base, r.numa});
    } else {
      Chunk& c = plan.chunks.back();
      c.length = std::max(c.length, r.end - c.base);
    }
    run_chunk[i] = static_cast<std::uint32_t>(plan.chunks.size() - 1);
  }

  // Runs were found in (slot, segment, block) order: the placements' order.
  plan.placements.resize(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    const Chunk& c = plan.chunks[run_chunk[i]];
    plan.placements[i] = {r.column / segments, r.column % segments, run_chunk[i], r.base - c.base, r.block_start,
                          r.count, r.step};
  }
  return plan;
}

}  // namespace baton::plan
