#include "baton/plan/materialize.h"

#include <algorithm>
#include <map>

namespace baton::plan {

Result<MaterializedPlan> materialize(const Plan& plan, const topology::TopologyGraph& topology,
                                     const MaterializeOptions& options) {
  if (options.max_op_bytes == 0 || options.stripe_bytes == 0) {
    return std::unexpected(Status::invalid_argument("materialize: max_op_bytes {} and stripe_bytes {} must be > 0",
                                                    options.max_op_bytes, options.stripe_bytes));
  }
  if (options.stripe_bytes > options.max_op_bytes) {
    return std::unexpected(Status::invalid_argument("materialize: stripe_bytes {} > max_op_bytes {}",
                                                    options.stripe_bytes, options.max_op_bytes));
  }
  if (Status s = validate(plan); !s.is_ok()) {
    return std::unexpected(Status::invalid_argument("materialize: {}", s.message()));
  }
  auto layout = layout_slabs(plan);
  if (!layout) return std::unexpected(layout.error());

  MaterializedPlan out;
  out.layout = std::move(*layout);

  // The NIC group of each NUMA node, as indexes into out.nics, with its
  // round-robin cursor (shared by every chunk of the node, so that many small
  // chunks spread over the NICs too).
  struct Group {
    std::vector<std::int32_t> nics;
    std::size_t cursor = 0;
  };
  std::vector<std::string> all_nics;
  for (const topology::Node* n : topology.nodes_of(topology::NodeKind::kNic)) all_nics.push_back(n->id);
  std::map<std::string, std::int32_t> nic_index;
  auto index_of = [&](const std::string& id) {
    auto [it, added] = nic_index.try_emplace(id, static_cast<std::int32_t>(out.nics.size()));
    if (added) out.nics.push_back(id);
    return it->second;
  };
  std::map<int, Group> groups;
  auto group_of = [&](int numa) -> Group& {
    auto [it, added] = groups.try_emplace(numa);
    if (added) {
      std::vector<std::string> ids = topology.nics_on_numa(numa);
      if (ids.empty()) ids = all_nics;  // none on this socket: cross it rather than stall
      for (const std::string& id : ids) it->second.nics.push_back(index_of(id));
    }
    return it->second;
  };

  auto piece_of = [&](const Chunk& chunk) {
    const bool stripe = group_of(chunk.numa).nics.size() > 1 && chunk.length > options.stripe_bytes;
    return stripe ? options.stripe_bytes : options.max_op_bytes;
  };
  // Counted before any is made: the sizes may ask for more than memory holds.
  std::uint64_t op_count = 0;
  for (const Chunk& chunk : plan.chunks) {
    const std::uint64_t piece = piece_of(chunk);
    const std::uint64_t ops = chunk.length / piece + (chunk.length % piece != 0 ? 1 : 0);
    op_count += std::min(ops, MaterializeOptions::kMaxOps + 1);  // a huge chunk cannot wrap the sum
    if (op_count > MaterializeOptions::kMaxOps) {
      return std::unexpected(Status::invalid_argument(
          "materialize: more than {} ops: stripe_bytes {} and max_op_bytes {} cut the plan's {} chunks too finely",
          MaterializeOptions::kMaxOps, options.stripe_bytes, options.max_op_bytes, plan.chunks.size()));
    }
  }
  out.ops.reserve(op_count);

  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    const ChunkLocation& where = out.layout.chunks[c];
    Group& group = group_of(chunk.numa);
    const std::uint64_t piece = piece_of(chunk);
    for (std::uint64_t done = 0; done < chunk.length;) {
      const std::uint64_t length = std::min(piece, chunk.length - done);
      std::int32_t nic = -1;
      if (!group.nics.empty()) nic = group.nics[group.cursor++ % group.nics.size()];
      out.ops.push_back({static_cast<std::uint32_t>(c), chunk.base + done, length, where.slab, where.offset + done, nic});
      done += length;
    }
  }
  return out;
}

}  // namespace baton::plan
