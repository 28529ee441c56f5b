// vLLM-shaped fixtures: placement tables with the slot sizes, strides and
// NUMA layouts of real holders, for tests, benchmarks and `baton bench plan`.
// The holder keeps one KV tensor per (layer, TP rank), laid out as vLLM's
// FlashAttention backend does: [2][cache blocks][block tokens][KV heads per
// rank][head dim] for K/V split (K then V), [cache blocks][tokens][latent] for
// MLA.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "baton/common/status.h"
#include "baton/plan/placement_table.h"

namespace baton::plan {

enum class NumaLayout : std::uint8_t {
  kSingle,          // everything on node 0
  kSlotsAcrossSockets,  // TP ranks split over two sockets: rank r on node r·2/TP
  kBlocksAlternate,  // a replica whose blocks alternate nodes: block b on node b % 2
  kUnknown,          // the holder does not know (kUnknownNuma everywhere)
};

struct FixtureSpec {
  std::uint32_t blocks = 1000;  // requested
  std::uint32_t layers = 36;
  std::uint32_t tp = 8;
  bool mla = false;  // one latent segment per slot (replicated per rank); else K and V
  std::uint32_t block_tokens = 16;
  std::uint32_t kv_heads = 8;    // total, split over TP (one divides the other); ignored for MLA
  std::uint32_t head_dim = 128;  // MLA: the latent width (DeepSeek-V3: 512 + 64 = 576)
  std::uint32_t dtype_bytes = 2;
  NumaLayout numa = NumaLayout::kSingle;
  // 0: the requested blocks sit at consecutive cache indexes; k > 0: one free
  // cache block after every k requested ones (a fragmented block table).
  std::uint32_t run_blocks = 0;
};

// One holder tensor (or, for kBlocksAlternate, one NUMA half of it), in the
// order (layer, rank, half).
struct FixtureRegion {
  std::uint64_t bytes = 0;
  int numa = kUnknownNuma;
};

// Zero counts or sizes, a segment over 4 GiB, a NUMA layout outside the
// enum, or a table past the plan bounds → invalid_argument.
[[nodiscard]] Result<std::vector<FixtureRegion>> fixture_regions(const FixtureSpec& spec);

// Fills `table` (reset to the spec's shape). `region_bases` gives each
// region's address (real memory, for round trips); empty → synthetic
// addresses, regions 2 MiB-aligned with gaps between them as separate
// allocations have. A wrong number of bases, or a region whose end passes
// 2^64 → invalid_argument.
Status fill_fixture(const FixtureSpec& spec, PlacementTable& table,
                    std::span<const std::uint64_t> region_bases = {});

}  // namespace baton::plan
