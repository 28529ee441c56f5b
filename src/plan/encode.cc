#include "baton/plan/encode.h"

#include <algorithm>
#include <array>
#include <vector>

#include "plan/checked.h"

namespace baton::plan {
namespace {

// A run before chunking: blocks [block_start, block_start + count) of one
// slot segment, from `base` to `end` on `numa`.
struct Run {
  std::uint64_t base;
  std::uint64_t end;
  std::uint32_t block_start;
  std::uint32_t count;
  std::uint32_t column;  // slot * segments + segment
  std::int16_t numa;
};

// The stride of a slot segment: the most common distance (>= bytes) between
// consecutive blocks on one node among the first few, so that one gap in
// the block table does not set it; ties go to the smaller. No such pair (one
// block, or every block on its own) → bytes.
std::uint64_t choose_stride(std::span<const std::uint64_t> addr, std::span<const std::int16_t> numa,
                            std::uint64_t bytes) {
  constexpr std::size_t kSample = 16;
  std::array<std::uint64_t, kSample> deltas{};
  std::size_t n = 0;
  for (std::size_t b = 1; b < addr.size() && b <= kSample; ++b) {
    const std::uint64_t d = addr[b] - addr[b - 1];
    if (numa[b] == numa[b - 1] && addr[b] > addr[b - 1] && d >= bytes) deltas[n++] = d;
  }
  if (n == 0) return bytes;
  std::sort(deltas.begin(), deltas.begin() + static_cast<std::ptrdiff_t>(n));
  std::uint64_t best = deltas[0];
  std::size_t best_count = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && deltas[j] == deltas[i]) ++j;
    if (j - i > best_count) {
      best = deltas[i];
      best_count = j - i;
    }
    i = j;
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
    if (numa[b] < kUnknownNuma || numa[b] > kMaxNuma) {
      return Status::invalid_argument("encode_plan: block {} slot {} on NUMA node {}, expected {}..{}", b, slot,
                                      numa[b], kUnknownNuma, kMaxNuma);
    }
  }
  return Status::ok();
}

// Splits one slot segment column into runs, appending them to `runs`.
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
  std::size_t run_start = 0;
  auto close_run = [&](std::size_t end_block) -> Status {
    const std::uint64_t count = end_block - run_start;
    const auto end = span_end(addr[run_start], count, stride, bytes);
    if (!end) {
      return Status::invalid_argument("encode_plan: slot {} segment {} blocks {}..{} from {:#x} pass 2^64", slot,
                                      segment, run_start, end_block - 1, addr[run_start]);
    }
    runs.push_back({addr[run_start], *end, static_cast<std::uint32_t>(run_start), static_cast<std::uint32_t>(count),
                    column, numa[run_start]});
    return Status::ok();
  };

  // Most windows continue the current run: test a whole window branch-free
  // (a fixed trip count, so GCC vectorizes it even at -O2) and walk it block
  // by block only when something breaks. The tail is always walked.
  constexpr std::size_t kWindow = 32;
  auto walk = [&](std::size_t from, std::size_t to) -> Status {
    for (std::size_t b = from; b < to; ++b) {
      if (len[b] != bytes) {
        if (len[b] == 0) {
          return Status::invalid_argument("encode_plan: block {} slot {} segment {} has length 0", b, slot, segment);
        }
        return Status::invalid_argument(
            "encode_plan: block {} slot {} segment {} has {} bytes, block 0 has {} (the blocks' layouts differ)", b,
            slot, segment, len[b], bytes);
      }
      const std::uint64_t delta = addr[b] - addr[b - 1];
      if (delta == stride && numa[b] == numa[b - 1]) continue;
      if (addr[b] >= addr[b - 1] && delta < bytes) {
        return Status::invalid_argument(
            "encode_plan: slot {} segment {} blocks {} and {} are {} bytes apart: stride {} < bytes {} (they overlap)",
            slot, segment, b - 1, b, delta, delta, bytes);
      }
      if (Status s = close_run(b); !s.is_ok()) return s;
      run_start = b;
    }
    return Status::ok();
  };
  std::size_t w = 1;
  for (; w + kWindow <= blocks; w += kWindow) {
    const std::uint64_t* a = addr.data() + w;
    const std::uint32_t* l = len.data() + w;
    const std::int16_t* n = numa.data() + w;
    std::uint64_t broken = 0;
    for (std::size_t i = 0; i < kWindow; ++i) {
      broken |= (l[i] ^ bytes) | (a[i] - a[i - 1] - stride) | static_cast<std::uint16_t>(n[i] ^ n[i - 1]);
    }
    if (broken == 0) continue;
    if (Status s = walk(w, w + kWindow); !s.is_ok()) return s;
  }
  if (Status s = walk(w, blocks); !s.is_ok()) return s;
  return close_run(blocks);
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
                          r.count};
  }
  return plan;
}

}  // namespace baton::plan
