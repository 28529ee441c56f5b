// Which NICs an engine's UCX rails use when told "auto" (UcxConfig::nics
// {"auto"}): chosen from the engine's topology, NUMA-local first.
#pragma once

#include <string>
#include <vector>

#include "baton/topology/facts.h"

namespace baton::engine {

// UCX device names for the rails: the RDMA NICs ("mlx5_0:1", port 1) if the
// topology has any, else its Ethernet NICs ("eth1"); those on NUMA node
// `numa` when any are (numa < 0 or none there: all of them), in topology
// order, at most 8. Fewer than two means one rail is as good as UCX's own
// choice: the caller then leaves the choice to UCX.
[[nodiscard]] std::vector<std::string> rail_nics(const topology::TopologyFacts& facts, int numa);

// The NUMA node of the CPU this thread runs on (sysfs), or -1 when unknown.
[[nodiscard]] int current_numa_node();

}  // namespace baton::engine
