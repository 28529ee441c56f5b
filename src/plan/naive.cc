#include "baton/plan/naive.h"

#include <vector>

#include "baton/plan.pb.h"  // generated (proto/baton/plan.proto)

namespace baton::plan {

Result<std::string> serialize_naive(const PlacementTable& table, std::span<const std::uint64_t> block_hashes) {
  if (!block_hashes.empty() && block_hashes.size() != table.blocks()) {
    return std::unexpected(Status::invalid_argument(
        "serialize_naive: {} block hashes for {} blocks, expected none or one per block", block_hashes.size(),
        table.blocks()));
  }
  if (table.blocks() == 0) {  // what parse_naive and encode_plan refuse
    return std::unexpected(Status::invalid_argument("serialize_naive: the table is empty (create it first)"));
  }
  wire::NaiveTransferPlan w;
  w.set_version(kPlanVersion);
  w.set_blocks(table.blocks());
  w.set_slots(table.slots());
  w.set_segments_per_slot(table.segments_per_slot());
  w.mutable_entries()->Reserve(static_cast<int>(std::uint64_t{table.blocks()} * table.slots()));
  for (std::uint32_t b = 0; b < table.blocks(); ++b) {
    for (std::uint32_t s = 0; s < table.slots(); ++s) {
      wire::NaiveSlotEntry* e = w.add_entries();
      e->set_block(b);
      e->set_slot(s);
      for (std::uint32_t g = 0; g < table.segments_per_slot(); ++g) {
        e->add_address(table.address(b, s, g));
        e->add_length(table.length(b, s, g));
      }
      e->set_numa(table.numa(b, s));
    }
  }
  w.mutable_block_hashes()->Add(block_hashes.begin(), block_hashes.end());
  return w.SerializeAsString();
}

Result<PlacementTable> parse_naive(std::string_view bytes) {
  wire::NaiveTransferPlan w;
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX) ||
      !w.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return std::unexpected(
        Status::invalid_argument("parse_naive: {} bytes are not a NaiveTransferPlan message", bytes.size()));
  }
  if (w.version() != kPlanVersion) {
    return std::unexpected(
        Status::invalid_argument("parse_naive: version {}, this build reads version {}", w.version(), kPlanVersion));
  }
  // The count first: the table is sized from the header, and an 11-byte
  // message whose header names 2^22 × 32 cells took 2.6 GB before this check.
  const std::uint64_t cells = std::uint64_t{w.blocks()} * w.slots();
  if (static_cast<std::uint64_t>(w.entries_size()) != cells) {
    return std::unexpected(Status::invalid_argument("parse_naive: {} entries, expected {} ({} blocks × {} slots)",
                                                    w.entries_size(), cells, w.blocks(), w.slots()));
  }
  auto table = PlacementTable::create(w.blocks(), w.slots(), w.segments_per_slot());
  if (!table) return std::unexpected(Status::invalid_argument("parse_naive: {}", table.error().message()));
  std::vector<bool> seen(cells, false);
  for (int i = 0; i < w.entries_size(); ++i) {
    const wire::NaiveSlotEntry& e = w.entries(i);
    if (e.block() >= w.blocks() || e.slot() >= w.slots()) {
      return std::unexpected(Status::invalid_argument("parse_naive: entry {} names block {} slot {}, plan has {} × {}",
                                                      i, e.block(), e.slot(), w.blocks(), w.slots()));
    }
    if (e.address_size() != static_cast<int>(w.segments_per_slot()) || e.length_size() != e.address_size()) {
      return std::unexpected(Status::invalid_argument(
          "parse_naive: entry {} has {} addresses and {} lengths, expected {}", i, e.address_size(), e.length_size(),
          w.segments_per_slot()));
    }
    const std::size_t cell = std::size_t{e.slot()} * w.blocks() + e.block();
    if (seen[cell]) {
      return std::unexpected(
          Status::invalid_argument("parse_naive: block {} slot {} is listed twice", e.block(), e.slot()));
    }
    seen[cell] = true;
    if (e.numa() < kUnknownNuma || e.numa() > kMaxNuma) {
      return std::unexpected(Status::invalid_argument("parse_naive: entry {} on NUMA node {}", i, e.numa()));
    }
    for (int g = 0; g < e.address_size(); ++g) {
      if (e.length(g) > UINT32_MAX) {
        return std::unexpected(Status::invalid_argument("parse_naive: entry {} segment {} has {} bytes", i, g,
                                                        e.length(g)));
      }
      table->set(e.block(), e.slot(), static_cast<std::uint32_t>(g), e.address(g),
                 static_cast<std::uint32_t>(e.length(g)));
    }
    table->set_numa(e.block(), e.slot(), e.numa());
  }
  if (!w.block_hashes().empty() && static_cast<std::uint32_t>(w.block_hashes_size()) != w.blocks()) {
    return std::unexpected(Status::invalid_argument("parse_naive: {} block hashes for {} blocks",
                                                    w.block_hashes_size(), w.blocks()));
  }
  return table;
}

}  // namespace baton::plan
