// The JSON form of a topology (the `baton topo --json` contract):
// {"source", "notes", "gpus", "nics", "numa_nodes", "switches", "links",
//  "routes"} with routes for every GPU pair and every GPU→NIC pair.
#pragma once

#include <string>

#include "baton/topology/graph.h"

namespace baton::topology {

[[nodiscard]] std::string to_json(const TopologyGraph& graph, int indent = 2);

}  // namespace baton::topology
