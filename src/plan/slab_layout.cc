#include "baton/plan/slab_layout.h"

#include <algorithm>

namespace baton::plan {

Result<SlabLayout> layout_slabs(const Plan& plan) {
  SlabLayout layout;
  layout.chunks.resize(plan.chunks.size());
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    if (chunk.numa == kUnknownNuma) {
      return std::unexpected(Status::invalid_argument(
          "layout_slabs: chunk {} ({} bytes at {:#x}) is on an unknown NUMA node; refusing to guess one", c,
          chunk.length, chunk.base));
    }
    auto it = std::lower_bound(layout.slabs.begin(), layout.slabs.end(), chunk.numa,
                               [](const SlabSpec& s, int numa) { return s.numa < numa; });
    if (it == layout.slabs.end() || it->numa != chunk.numa) it = layout.slabs.insert(it, {chunk.numa, 0});
  }
  // Second pass, now that slab indexes are final: pack chunks in plan order.
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    const auto it = std::lower_bound(layout.slabs.begin(), layout.slabs.end(), chunk.numa,
                                     [](const SlabSpec& s, int numa) { return s.numa < numa; });
    const std::uint64_t offset = (it->bytes + kSlabAlignment - 1) & ~(kSlabAlignment - 1);
    if (offset < it->bytes || __builtin_add_overflow(offset, chunk.length, &it->bytes)) {
      return std::unexpected(
          Status::out_of_range("layout_slabs: the slab for NUMA node {} passes 2^64 bytes at chunk {}", chunk.numa, c));
    }
    layout.chunks[c] = {static_cast<std::uint32_t>(it - layout.slabs.begin()), offset};
  }
  return layout;
}

}  // namespace baton::plan
