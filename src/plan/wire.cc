#include "baton/plan/wire.h"

#include <algorithm>

#include "baton/plan.pb.h"  // generated (proto/baton/plan.proto)

namespace baton::plan {
namespace {

// Copies a packed column into a RepeatedField with one resize, no per-entry Add.
template <typename To, typename Range, typename Get>
void put_column(google::protobuf::RepeatedField<To>* field, const Range& range, Get get) {
  field->Resize(static_cast<int>(range.size()), To{});
  To* out = field->mutable_data();
  for (const auto& item : range) *out++ = static_cast<To>(get(item));
}

}  // namespace

std::string serialize_plan(const Plan& plan) {
  wire::TransferPlan w;
  w.set_version(kPlanVersion);
  w.set_blocks(plan.blocks);
  w.set_slots(plan.slots);
  w.set_segments_per_slot(plan.segments_per_slot);
  put_column(w.mutable_segment_bytes(), plan.schema, [](const SegmentSchema& s) { return s.bytes; });
  put_column(w.mutable_segment_stride(), plan.schema, [](const SegmentSchema& s) { return s.stride; });
  put_column(w.mutable_chunk_base(), plan.chunks, [](const Chunk& c) { return c.base; });
  put_column(w.mutable_chunk_length(), plan.chunks, [](const Chunk& c) { return c.length; });
  put_column(w.mutable_chunk_numa(), plan.chunks, [](const Chunk& c) { return c.numa; });
  put_column(w.mutable_placement_slot(), plan.placements, [](const Placement& p) { return p.slot; });
  put_column(w.mutable_placement_segment(), plan.placements, [](const Placement& p) { return p.segment; });
  put_column(w.mutable_placement_chunk(), plan.placements, [](const Placement& p) { return p.chunk; });
  put_column(w.mutable_placement_offset(), plan.placements, [](const Placement& p) { return p.offset; });
  put_column(w.mutable_placement_block_start(), plan.placements, [](const Placement& p) { return p.block_start; });
  put_column(w.mutable_placement_block_count(), plan.placements, [](const Placement& p) { return p.block_count; });
  put_column(w.mutable_block_hashes(), plan.block_hashes, [](std::uint64_t h) { return h; });
  if (std::any_of(plan.placements.begin(), plan.placements.end(), [](const Placement& p) { return p.block_step != 1; })) {
    put_column(w.mutable_placement_block_step(), plan.placements, [](const Placement& p) { return p.block_step; });
  }
  return w.SerializeAsString();
}

Result<Plan> parse_plan(std::string_view bytes) {
  wire::TransferPlan w;
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX) ||
      !w.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return std::unexpected(
        Status::invalid_argument("parse_plan: {} bytes are not a TransferPlan message", bytes.size()));
  }
  if (w.version() != kPlanVersion) {
    return std::unexpected(
        Status::invalid_argument("parse_plan: version {}, this build reads version {}", w.version(), kPlanVersion));
  }
  const int schema = w.segment_bytes_size();
  if (w.segment_stride_size() != schema) {
    return std::unexpected(Status::invalid_argument("parse_plan: {} segment sizes but {} strides", schema,
                                                    w.segment_stride_size()));
  }
  const int chunks = w.chunk_base_size();
  if (w.chunk_length_size() != chunks || w.chunk_numa_size() != chunks) {
    return std::unexpected(Status::invalid_argument("parse_plan: chunk columns disagree: {} bases, {} lengths, {} NUMA",
                                                    chunks, w.chunk_length_size(), w.chunk_numa_size()));
  }
  const int placements = w.placement_slot_size();
  if (w.placement_segment_size() != placements || w.placement_chunk_size() != placements ||
      w.placement_offset_size() != placements || w.placement_block_start_size() != placements ||
      w.placement_block_count_size() != placements) {
    return std::unexpected(Status::invalid_argument(
        "parse_plan: placement columns disagree: {} slots, {} segments, {} chunks, {} offsets, {} starts, {} counts",
        placements, w.placement_segment_size(), w.placement_chunk_size(), w.placement_offset_size(),
        w.placement_block_start_size(), w.placement_block_count_size()));
  }
  const bool steps = w.placement_block_step_size() != 0;
  if (steps && w.placement_block_step_size() != placements) {
    return std::unexpected(Status::invalid_argument(
        "parse_plan: {} block steps for {} placements, expected none or one per placement",
        w.placement_block_step_size(), placements));
  }

  Plan plan;
  plan.blocks = w.blocks();
  plan.slots = w.slots();
  plan.segments_per_slot = w.segments_per_slot();
  plan.schema.resize(static_cast<std::size_t>(schema));
  for (int i = 0; i < schema; ++i) plan.schema[i] = {w.segment_bytes(i), w.segment_stride(i)};
  plan.chunks.resize(static_cast<std::size_t>(chunks));
  for (int i = 0; i < chunks; ++i) plan.chunks[i] = {w.chunk_base(i), w.chunk_length(i), w.chunk_numa(i)};
  plan.placements.resize(static_cast<std::size_t>(placements));
  for (int i = 0; i < placements; ++i) {
    plan.placements[i] = {w.placement_slot(i),        w.placement_segment(i),
                          w.placement_chunk(i),       w.placement_offset(i),
                          w.placement_block_start(i), w.placement_block_count(i),
                          steps ? w.placement_block_step(i) : 1u};
  }
  plan.block_hashes.assign(w.block_hashes().begin(), w.block_hashes().end());
  if (Status s = validate(plan); !s.is_ok()) {
    return std::unexpected(Status::invalid_argument("parse_plan: {}", s.message()));
  }
  return plan;
}

}  // namespace baton::plan
