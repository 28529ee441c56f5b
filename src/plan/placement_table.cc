#include "baton/plan/placement_table.h"

namespace baton::plan {

Result<PlacementTable> PlacementTable::create(std::uint32_t blocks, std::uint32_t slots,
                                              std::uint32_t segments_per_slot) {
  PlacementTable table;
  if (Status s = table.reset(blocks, slots, segments_per_slot); !s.is_ok()) return std::unexpected(std::move(s));
  return table;
}

Status PlacementTable::reset(std::uint32_t blocks, std::uint32_t slots, std::uint32_t segments_per_slot) {
  if (blocks == 0 || blocks > kMaxBlocks) {
    return Status::invalid_argument("PlacementTable: {} blocks, expected 1..{}", blocks, kMaxBlocks);
  }
  if (slots == 0 || slots > kMaxSlots) {
    return Status::invalid_argument("PlacementTable: {} slots, expected 1..{}", slots, kMaxSlots);
  }
  if (segments_per_slot != 1 && segments_per_slot != 2) {
    return Status::invalid_argument("PlacementTable: {} segments per slot, expected 1 or 2", segments_per_slot);
  }
  const std::uint64_t cells = std::uint64_t{blocks} * slots * segments_per_slot;
  if (cells > kMaxCells) {
    return Status::invalid_argument("PlacementTable: {} blocks × {} slots × {} segments exceeds {} cells", blocks,
                                    slots, segments_per_slot, kMaxCells);
  }
  blocks_ = blocks;
  slots_ = slots;
  segments_ = segments_per_slot;
  addresses_.assign(cells, 0);
  lengths_.assign(cells, 0);
  numa_.assign(std::size_t{blocks} * slots, static_cast<std::int16_t>(kUnknownNuma));
  return Status::ok();
}

}  // namespace baton::plan
