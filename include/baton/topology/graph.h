// TopologyGraph: the machine as Baton routes over it. Nodes are GPUs, NICs,
// NUMA nodes (with their CPU sets) and switches; links are usable paths between
// two endpoints, each with a PathType and a cost. rank(src, dst) gives the best
// path and the fallback chain that the scheduler walks when a path is busy or
// dead. Immutable once built; safe to share between threads.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "baton/common/status.h"
#include "baton/topology/cost_model.h"
#include "baton/topology/facts.h"

namespace baton::topology {

enum class NodeKind : std::uint8_t { kGpu, kNic, kNuma, kPcieSwitch, kNvswitch };
[[nodiscard]] std::string_view to_string(NodeKind kind);

struct Node {
  std::string id;    // "gpu0", "nic3", "numa1", "pcisw0", "nvswitch0"
  NodeKind kind = NodeKind::kGpu;
  std::string name;  // "NVIDIA H200", "mlx5_3", "NUMA 1", …
  std::string pci_bus_id;
  int numa = kUnknownNuma;  // for a NUMA node: its OS index
  std::string cpus;         // cpu list (NUMA node, or a GPU's affinity)
  // Switches: the device ids below them. Devices: empty.
  std::vector<std::string> members;
};

struct Link {
  std::string from;  // node ids; links are symmetric and stored once
  std::string to;
  PathType path = PathType::kHostStaging;
  Proximity proximity = Proximity::kLocal;
  int nvlinks = 0;
  PathCost cost;
};

// The paths from `from` to `to`, best first; the last is host staging for
// device pairs (the path that always exists).
struct Route {
  std::string from;
  std::string to;
  std::vector<Link> chain;
  [[nodiscard]] const Link& best() const { return chain.front(); }
};

class TopologyGraph {
 public:
  // Builds nodes and costed links from probe facts. Refuses facts that
  // contradict themselves (a relation naming a device that does not exist,
  // two relations for one pair) or that no machine has (more NVLinks than
  // kMaxNvlinksPerGpu, a NUMA id beyond kMaxNumaNode, an enum value cast
  // from an integer outside it).
  [[nodiscard]] static Result<TopologyGraph> build(const TopologyFacts& facts,
                                                   const CostModel& costs = {});

  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const std::vector<std::string>& notes() const { return notes_; }
  [[nodiscard]] const std::vector<Node>& nodes() const { return nodes_; }
  [[nodiscard]] const std::vector<Link>& links() const { return links_; }
  [[nodiscard]] std::vector<const Node*> nodes_of(NodeKind kind) const;
  [[nodiscard]] const Node* find(std::string_view id) const;

  // Best path plus the fallback chain from `from` to `to`, for GPU↔GPU,
  // GPU↔NIC and NUMA (host memory)↔GPU/NIC. Unknown id → not_found; a pair with
  // no data path between them (the same node, NIC↔NIC) → invalid_argument.
  [[nodiscard]] Result<Route> rank(std::string_view from,
                                   std::string_view to) const;

  // NICs for GPUDirect RDMA from `gpu`, best first: those sharing a PCIe
  // switch (PIX, PXB), then GDR through host bridges (PHB/NODE, where a
  // policy prices it), then NICs reached by host staging, best first.
  // Every NIC appears once.
  [[nodiscard]] Result<std::vector<std::string>> nics_for_gpu(
      std::string_view gpu) const;

  // NICs attached to NUMA node `numa_os_index`, in source order.
  [[nodiscard]] std::vector<std::string> nics_on_numa(int numa_os_index) const;

 private:
  std::string source_;
  std::vector<std::string> notes_;
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::unordered_map<std::string, std::size_t> index_;  // id → nodes_ slot
  // "a|b" (a < b) → indices into links_, for rank() without a scan.
  std::unordered_map<std::string, std::vector<std::size_t>> pair_links_;
};

}  // namespace baton::topology
