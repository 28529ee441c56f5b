// Shared helpers for the plan suite: small tables and topologies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/plan/placement_table.h"
#include "baton/topology/graph.h"

namespace baton::plan::testing {

// `blocks` blocks of `slots` slots × `segments` segments of `bytes` each,
// column (slot, segment) a contiguous array starting at a distinct base, all
// on `numa`: one run per column.
inline PlacementTable contiguous_table(std::uint32_t blocks, std::uint32_t slots, std::uint32_t segments,
                                       std::uint32_t bytes, int numa = 0) {
  PlacementTable t = PlacementTable::create(blocks, slots, segments).value();
  for (std::uint32_t s = 0; s < slots; ++s) {
    for (std::uint32_t g = 0; g < segments; ++g) {
      const std::uint64_t base = 0x100000ull * (1 + s * segments + g);
      for (std::uint32_t b = 0; b < blocks; ++b) t.set(b, s, g, base + std::uint64_t{b} * bytes, bytes);
    }
    for (std::uint32_t b = 0; b < blocks; ++b) t.set_numa(b, s, numa);
  }
  return t;
}

// A host with NICs on NUMA nodes: nics_per_numa[n] NICs on node n.
inline topology::TopologyGraph nic_graph(const std::vector<int>& nics_per_numa) {
  topology::TopologyFacts f;
  f.source = "test";
  for (std::size_t n = 0; n < nics_per_numa.size(); ++n) {
    f.numa_nodes.push_back({static_cast<int>(n), "", 0, 0});
    for (int i = 0; i < nics_per_numa[n]; ++i) {
      f.nics.push_back({"mlx5_" + std::to_string(f.nics.size()), "", static_cast<int>(n), topology::NicKind::kRdma});
    }
  }
  return topology::TopologyGraph::build(f).value();
}

// Protobuf's base-128 varint, for hand-made (and malformed) wire bytes.
inline std::string varint(std::uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

}  // namespace baton::plan::testing
