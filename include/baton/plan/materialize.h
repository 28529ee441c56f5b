// Materializing a plan on the requester: the transport ops that fetch it. One
// op per chunk, split so that no op passes max_op_bytes, and chunks larger
// than stripe_bytes striped into stripe_bytes pieces round-robin across the
// NICs of the chunk's NUMA node (from topology/), so that one large chunk
// keeps every NIC of its socket busy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/plan/plan.h"
#include "baton/plan/slab_layout.h"
#include "baton/topology/graph.h"

namespace baton::plan {

struct MaterializeOptions {
  // mlx5 fails work requests above ≈ 1 GiB; 128 MiB keeps each op short
  // enough to preempt behind and far from that edge.
  std::uint64_t max_op_bytes = 128ull << 20;
  std::uint64_t stripe_bytes = 8ull << 20;
  // Ops one plan may become (48 bytes each): a 1-byte stripe of 100 blocks
  // asked for 236 million and ended in bad_alloc.
  static constexpr std::uint64_t kMaxOps = 1ull << 24;
};

// One read: `length` bytes at the holder's `remote_address` into slab `slab`
// at `slab_offset`, posted on nics[nic] (-1: the topology has no NIC).
struct TransferOp {
  std::uint32_t chunk = 0;
  std::uint64_t remote_address = 0;
  std::uint64_t length = 0;
  std::uint32_t slab = 0;
  std::uint64_t slab_offset = 0;
  std::int32_t nic = -1;
  friend bool operator==(const TransferOp&, const TransferOp&) = default;
};

struct MaterializedPlan {
  SlabLayout layout;
  std::vector<std::string> nics;  // topology NIC ids the ops name
  std::vector<TransferOp> ops;    // by chunk, then by offset
};

// NICs: those on the chunk's NUMA node; none there → every NIC of the graph
// (across the socket, still correct); no NIC at all → nic -1. With one NIC,
// chunks are only split at max_op_bytes. Errors: max_op_bytes or
// stripe_bytes 0, stripe_bytes > max_op_bytes → invalid_argument; a plan that
// fails validate() or layout_slabs() → its error.
[[nodiscard]] Result<MaterializedPlan> materialize(const Plan& plan, const topology::TopologyGraph& topology,
                                                   const MaterializeOptions& options = {});

}  // namespace baton::plan
