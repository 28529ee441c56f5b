#include "baton/plan/fixtures.h"

#include <algorithm>

namespace baton::plan {
namespace {

struct Shape {
  std::uint32_t slots;
  std::uint32_t segments;
  std::uint32_t parts;         // regions per slot: 2 when blocks alternate nodes
  std::uint64_t segment_bytes;
  std::uint64_t part_blocks;   // cache blocks per region
};

// The cache index of requested block b: a one-block hole after every run.
std::uint64_t cache_index(const FixtureSpec& spec, std::uint64_t b) {
  return spec.run_blocks == 0 ? b : b + b / spec.run_blocks;
}

Result<Shape> shape_of(const FixtureSpec& spec) {
  if (spec.blocks == 0 || spec.blocks > kMaxBlocks) {
    return std::unexpected(Status::invalid_argument("fixture: {} blocks, expected 1..{}", spec.blocks, kMaxBlocks));
  }
  if (spec.layers == 0 || spec.tp == 0 || spec.block_tokens == 0 || spec.head_dim == 0 || spec.dtype_bytes == 0 ||
      (!spec.mla && spec.kv_heads == 0)) {
    return std::unexpected(Status::invalid_argument(
        "fixture: layers {}, tp {}, block tokens {}, KV heads {}, head dim {}, dtype bytes {} must all be > 0",
        spec.layers, spec.tp, spec.block_tokens, spec.kv_heads, spec.head_dim, spec.dtype_bytes));
  }
  // vLLM splits the KV heads over TP, or replicates them when TP is a
  // multiple of them; anything else (12 heads over TP 8) it refuses, and a
  // rounded-down share would describe KV no server holds.
  if (!spec.mla && spec.kv_heads % spec.tp != 0 && spec.tp % spec.kv_heads != 0) {
    return std::unexpected(Status::invalid_argument(
        "fixture: {} KV heads do not split over TP {} (one must divide the other)", spec.kv_heads, spec.tp));
  }
  Shape shape{};
  const std::uint64_t slots = std::uint64_t{spec.layers} * spec.tp;
  shape.segments = spec.mla ? 1 : 2;
  if (slots > kMaxSlots || slots * shape.segments * spec.blocks > kMaxCells) {
    return std::unexpected(Status::invalid_argument("fixture: {} layers × TP {} × {} blocks is past the plan bounds",
                                                    spec.layers, spec.tp, spec.blocks));
  }
  shape.slots = static_cast<std::uint32_t>(slots);
  // vLLM gives each rank kv_heads / tp heads, replicating when tp > kv_heads.
  const std::uint64_t heads = spec.mla ? 1 : std::max<std::uint64_t>(1, spec.kv_heads / spec.tp);
  // Checked: four 32-bit factors can pass 2^64 (and wrapped to a small size, or 0).
  std::uint64_t bytes = spec.block_tokens;
  if (__builtin_mul_overflow(bytes, heads, &bytes) || __builtin_mul_overflow(bytes, spec.head_dim, &bytes) ||
      __builtin_mul_overflow(bytes, spec.dtype_bytes, &bytes) || bytes > UINT32_MAX) {
    return std::unexpected(Status::invalid_argument(
        "fixture: a segment of {} tokens × {} heads × {} dims × {} bytes is over 4 GiB", spec.block_tokens, heads,
        spec.head_dim, spec.dtype_bytes));
  }
  shape.segment_bytes = bytes;
  if (spec.numa > NumaLayout::kUnknown) {
    return std::unexpected(
        Status::invalid_argument("fixture: NUMA layout {} is not one of NumaLayout's", static_cast<int>(spec.numa)));
  }
  shape.parts = spec.numa == NumaLayout::kBlocksAlternate ? 2 : 1;
  const std::uint64_t cache_blocks = cache_index(spec, spec.blocks - 1) + 1;
  shape.part_blocks = shape.parts == 2 ? cache_blocks / 2 + 1 : cache_blocks;
  return shape;
}

int region_numa(const FixtureSpec& spec, std::uint32_t rank, std::uint32_t part) {
  switch (spec.numa) {
    case NumaLayout::kSingle: return 0;
    case NumaLayout::kSlotsAcrossSockets: return static_cast<int>(rank * 2 / spec.tp);
    case NumaLayout::kBlocksAlternate: return static_cast<int>(part);
    case NumaLayout::kUnknown: return kUnknownNuma;
  }
  return kUnknownNuma;
}

}  // namespace

Result<std::vector<FixtureRegion>> fixture_regions(const FixtureSpec& spec) {
  auto shape = shape_of(spec);
  if (!shape) return std::unexpected(shape.error());
  std::vector<FixtureRegion> regions;
  regions.reserve(std::size_t{shape->slots} * shape->parts);
  for (std::uint32_t layer = 0; layer < spec.layers; ++layer) {
    for (std::uint32_t rank = 0; rank < spec.tp; ++rank) {
      for (std::uint32_t part = 0; part < shape->parts; ++part) {
        regions.push_back({shape->part_blocks * shape->segment_bytes * shape->segments, region_numa(spec, rank, part)});
      }
    }
  }
  return regions;
}

Status fill_fixture(const FixtureSpec& spec, PlacementTable& table, std::span<const std::uint64_t> region_bases) {
  auto shape = shape_of(spec);
  if (!shape) return shape.error();
  const auto regions = fixture_regions(spec);
  if (!regions) return regions.error();
  if (!region_bases.empty() && region_bases.size() != regions->size()) {
    return Status::invalid_argument("fill_fixture: {} region bases for {} regions", region_bases.size(),
                                    regions->size());
  }
  std::vector<std::uint64_t> bases(region_bases.begin(), region_bases.end());
  for (std::size_t i = 0; i < bases.size(); ++i) {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(bases[i], (*regions)[i].bytes, &end)) {
      return Status::invalid_argument("fill_fixture: region {} at {:#x} of {} bytes passes 2^64", i, bases[i],
                                      (*regions)[i].bytes);
    }
  }
  if (bases.empty()) {
    // Separate allocations, as a framework makes them: 2 MiB-aligned with a gap.
    constexpr std::uint64_t kHuge = 2ull << 20;
    std::uint64_t cursor = 0x7f0000000000ull;
    for (const FixtureRegion& r : *regions) {
      bases.push_back(cursor);
      cursor += (r.bytes + kHuge - 1) / kHuge * kHuge + kHuge;
    }
  }
  if (Status s = table.reset(spec.blocks, shape->slots, shape->segments); !s.is_ok()) return s;

  const std::uint64_t seg = shape->segment_bytes;
  for (std::uint32_t slot = 0; slot < shape->slots; ++slot) {
    const std::uint32_t rank = slot % spec.tp;
    auto numa = table.numa_column(slot);
    for (std::uint32_t b = 0; b < spec.blocks; ++b) {
      numa[b] = static_cast<std::int16_t>(region_numa(spec, rank, shape->parts == 2 ? b % 2 : 0));
    }
    for (std::uint32_t g = 0; g < shape->segments; ++g) {
      auto addr = table.addresses(slot, g);
      auto len = table.lengths(slot, g);
      std::fill(len.begin(), len.end(), static_cast<std::uint32_t>(seg));
      // K is the first half of the tensor, V the second: [2][cache blocks]...
      const std::uint64_t half = g * shape->part_blocks * seg;
      for (std::uint32_t b = 0; b < spec.blocks; ++b) {
        const std::uint32_t part = shape->parts == 2 ? b % 2 : 0;
        const std::uint64_t index = shape->parts == 2 ? cache_index(spec, b) / 2 : cache_index(spec, b);
        addr[b] = bases[std::size_t{slot} * shape->parts + part] + half + index * seg;
      }
    }
  }
  return Status::ok();
}

}  // namespace baton::plan
