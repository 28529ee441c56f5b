#include "baton/topology/graph.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace baton::topology {
namespace {

std::string device_id(DeviceRef d) {
  return fmt::format("{}{}", d.kind == DeviceRef::Kind::kGpu ? "gpu" : "nic", d.index);
}

std::string pair_key(std::string_view a, std::string_view b) {
  return a < b ? fmt::format("{}|{}", a, b) : fmt::format("{}|{}", b, a);
}

bool is_pcie_p2p_capable(PciLocality l) {
  return l == PciLocality::kPix || l == PciLocality::kPxb || l == PciLocality::kPhb;
}

// PCIe distance of a device pair for paths that bounce through host memory:
// the source's locality when it has one, else judged by NUMA node.
Proximity device_proximity(const Relation* r, int numa_a, int numa_b) {
  if (r != nullptr && r->pci != PciLocality::kUnknown) return proximity_of(r->pci);
  if (numa_a != kUnknownNuma && numa_b != kUnknownNuma && numa_a != numa_b) {
    return Proximity::kSys;
  }
  return Proximity::kNode;
}

Status check_ref(const TopologyFacts& f, DeviceRef d) {
  if (d.kind != DeviceRef::Kind::kGpu && d.kind != DeviceRef::Kind::kNic) {
    return Status::invalid_argument("TopologyGraph::build: a relation names device kind {} (expected GPU or NIC)",
                                    static_cast<int>(d.kind));
  }
  const std::size_t n = d.kind == DeviceRef::Kind::kGpu ? f.gpus.size() : f.nics.size();
  if (d.index < 0 || static_cast<std::size_t>(d.index) >= n) {
    return Status::invalid_argument(
        "TopologyGraph::build: relation names {} but the facts have {} {}", device_id(d), n,
        d.kind == DeviceRef::Kind::kGpu ? "GPUs" : "NICs");
  }
  return Status::ok();
}

// Devices joined by PIX share one PCIe switch. PIX is a pairwise fact, so a
// switch is a connected component of PIX pairs (exact on the trees seen in
// practice, where PIX means "same switch").
std::vector<std::vector<std::string>> pcie_switch_groups(const TopologyFacts& f) {
  std::vector<DeviceRef> devices;
  for (int i = 0; i < static_cast<int>(f.gpus.size()); ++i) devices.push_back({DeviceRef::Kind::kGpu, i});
  for (int i = 0; i < static_cast<int>(f.nics.size()); ++i) devices.push_back({DeviceRef::Kind::kNic, i});
  auto slot = [&](DeviceRef d) {
    return d.kind == DeviceRef::Kind::kGpu ? d.index : static_cast<int>(f.gpus.size()) + d.index;
  };
  std::vector<int> parent(devices.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto root = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const Relation& r : f.relations) {
    if (r.pci == PciLocality::kPix) parent[root(slot(r.a))] = root(slot(r.b));
  }
  std::vector<std::vector<std::string>> groups;
  std::vector<int> group_of(devices.size(), -1);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const int g = root(static_cast<int>(i));
    if (group_of[g] < 0) {
      group_of[g] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[group_of[g]].push_back(device_id(devices[i]));
  }
  std::erase_if(groups, [](const auto& g) { return g.size() < 2; });
  return groups;
}

}  // namespace

std::string_view to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::kGpu: return "gpu";
    case NodeKind::kNic: return "nic";
    case NodeKind::kNuma: return "numa";
    case NodeKind::kPcieSwitch: return "pcie_switch";
    case NodeKind::kNvswitch: return "nvswitch";
  }
  return "?";
}

Result<TopologyGraph> TopologyGraph::build(const TopologyFacts& facts, const CostModel& costs) {
  TopologyGraph g;
  g.source_ = facts.source;
  g.notes_ = facts.notes;

  std::set<std::pair<std::pair<int, int>, std::pair<int, int>>> pairs;  // (kind, index) of each end, ordered
  for (const Relation& r : facts.relations) {
    for (DeviceRef d : {r.a, r.b}) {
      if (auto s = check_ref(facts, d); !s.is_ok()) return std::unexpected(s);
    }
    if (r.a == r.b) {
      return std::unexpected(Status::invalid_argument(
          "TopologyGraph::build: relation joins {} to itself", device_id(r.a)));
    }
    if (r.nvlinks < 0 || r.nvlinks > kMaxNvlinksPerGpu) {
      return std::unexpected(Status::invalid_argument(
          "TopologyGraph::build: {}-{} has {} NVLinks (expected 0..{}: a GPU's ports)", device_id(r.a),
          device_id(r.b), r.nvlinks, kMaxNvlinksPerGpu));
    }
    if (static_cast<int>(r.pci) > static_cast<int>(PciLocality::kUnknown)) {
      return std::unexpected(Status::invalid_argument("TopologyGraph::build: {}-{} has PCIe locality {} (not one)",
                                                      device_id(r.a), device_id(r.b), static_cast<int>(r.pci)));
    }
    // One fact per pair: a second would be ignored (find() returns the first).
    const std::pair a{static_cast<int>(r.a.kind), r.a.index};
    const std::pair b{static_cast<int>(r.b.kind), r.b.index};
    if (!pairs.insert({std::min(a, b), std::max(a, b)}).second) {
      return std::unexpected(Status::invalid_argument("TopologyGraph::build: {}-{} has two relations",
                                                      device_id(r.a), device_id(r.b)));
    }
  }
  auto check_numa = [](std::string_view what, std::size_t i, int numa) {
    return numa == kUnknownNuma || (numa >= 0 && numa <= kMaxNumaNode)
               ? Status::ok()
               : Status::invalid_argument("TopologyGraph::build: {}{} is on NUMA node {} (expected 0..{}, or {} "
                                          "for unknown)", what, i, numa, kMaxNumaNode, kUnknownNuma);
  };
  for (std::size_t i = 0; i < facts.gpus.size(); ++i) {
    if (Status s = check_numa("gpu", i, facts.gpus[i].numa); !s.is_ok()) return std::unexpected(s);
    if (const double per = facts.gpus[i].nvlink_gbps_per_link;
        !(per == 0 || (per >= CostModel::kMinBandwidthGbps && per <= CostModel::kMaxBandwidthGbps))) {
      return std::unexpected(Status::invalid_argument(
          "TopologyGraph::build: gpu{} has NVLinks of {} GB/s (expected 0 for unknown, or {}..{})", i, per,
          CostModel::kMinBandwidthGbps, CostModel::kMaxBandwidthGbps));
    }
  }
  for (std::size_t i = 0; i < facts.nics.size(); ++i) {
    if (Status s = check_numa("nic", i, facts.nics[i].numa); !s.is_ok()) return std::unexpected(s);
  }
  for (std::size_t i = 0; i < facts.numa_nodes.size(); ++i) {
    if (const int id = facts.numa_nodes[i].os_index; id < 0 || id > kMaxNumaNode) {
      return std::unexpected(Status::invalid_argument("TopologyGraph::build: NUMA node {} (expected 0..{})", id,
                                                      kMaxNumaNode));
    }
  }

  // NUMA nodes: the facts' list, plus any node a device names but the list lacks.
  std::set<int> numa_ids;
  std::vector<NumaInfo> numa = facts.numa_nodes;
  for (const NumaInfo& n : numa) {
    if (!numa_ids.insert(n.os_index).second) {
      return std::unexpected(Status::invalid_argument(
          "TopologyGraph::build: NUMA node {} listed twice", n.os_index));
    }
  }
  auto add_numa = [&](int id) {
    if (id != kUnknownNuma && numa_ids.insert(id).second) numa.push_back({id, "", 0, 0});
  };
  for (const GpuInfo& gpu : facts.gpus) add_numa(gpu.numa);
  for (const NicInfo& nic : facts.nics) add_numa(nic.numa);
  std::ranges::sort(numa, {}, &NumaInfo::os_index);

  for (std::size_t i = 0; i < facts.gpus.size(); ++i) {
    const GpuInfo& gpu = facts.gpus[i];
    g.nodes_.push_back({fmt::format("gpu{}", i), NodeKind::kGpu,
                        gpu.name.empty() ? fmt::format("GPU{}", i) : gpu.name, gpu.pci_bus_id,
                        gpu.numa, gpu.cpu_affinity, {}});
  }
  for (std::size_t i = 0; i < facts.nics.size(); ++i) {
    const NicInfo& nic = facts.nics[i];
    g.nodes_.push_back({fmt::format("nic{}", i), NodeKind::kNic, nic.name, nic.pci_bus_id,
                        nic.numa, "", {}});
  }
  for (const NumaInfo& n : numa) {
    g.nodes_.push_back({fmt::format("numa{}", n.os_index), NodeKind::kNuma,
                        fmt::format("NUMA {}", n.os_index), "", n.os_index, n.cpus, {}});
  }
  int switch_count = 0;
  for (auto& members : pcie_switch_groups(facts)) {
    g.nodes_.push_back({fmt::format("pcisw{}", switch_count++), NodeKind::kPcieSwitch,
                        "PCIe switch", "", kUnknownNuma, "", std::move(members)});
  }
  std::set<int> fabric_gpus;
  for (const Relation& r : facts.relations) {
    if (r.via_nvswitch && r.nvlinks > 0) {
      fabric_gpus.insert(r.a.index);
      fabric_gpus.insert(r.b.index);
    }
  }
  if (!fabric_gpus.empty()) {
    std::vector<std::string> members;
    for (int i : fabric_gpus) members.push_back(fmt::format("gpu{}", i));
    g.nodes_.push_back({"nvswitch0", NodeKind::kNvswitch, "NVSwitch fabric", "", kUnknownNuma,
                        "", std::move(members)});
  }
  for (std::size_t i = 0; i < g.nodes_.size(); ++i) g.index_[g.nodes_[i].id] = i;

  auto add_link = [&](std::string from, std::string to, PathType path, Proximity proximity,
                      int nvlinks = 0, double gbps_per_link = 0) {
    const auto cost = costs.cost(path, proximity, nvlinks, gbps_per_link);
    if (!cost) return;  // the cost model says this combination is not usable
    g.pair_links_[pair_key(from, to)].push_back(g.links_.size());
    g.links_.push_back({std::move(from), std::move(to), path, proximity, nvlinks, *cost});
  };

  const int gpus = static_cast<int>(facts.gpus.size());
  const int nics = static_cast<int>(facts.nics.size());
  using K = DeviceRef::Kind;
  for (int i = 0; i < gpus; ++i) {
    for (int j = i + 1; j < gpus; ++j) {
      const Relation* r = facts.find({K::kGpu, i}, {K::kGpu, j});
      const std::string a = fmt::format("gpu{}", i);
      const std::string b = fmt::format("gpu{}", j);
      if (r != nullptr && r->nvlinks > 0) {
        // The slower end's generation, where the probe knows both.
        const double per_i = facts.gpus[i].nvlink_gbps_per_link;
        const double per_j = facts.gpus[j].nvlink_gbps_per_link;
        add_link(a, b, r->via_nvswitch ? PathType::kNvswitch : PathType::kNvlink,
                 Proximity::kLocal, r->nvlinks, per_i > 0 && per_j > 0 ? std::min(per_i, per_j) : 0);
      }
      // PCIe P2P stays a fallback beside NVLink when the PCIe path is known.
      // Peer access with no NVLink and no known path is P2P over PCIe too.
      if (r != nullptr && (is_pcie_p2p_capable(r->pci) ||
                           (r->pci == PciLocality::kUnknown && r->peer_access && r->nvlinks == 0))) {
        add_link(a, b, PathType::kPcieP2p, proximity_of(r->pci));
      }
      add_link(a, b, PathType::kHostStaging,
               device_proximity(r, facts.gpus[i].numa, facts.gpus[j].numa));
    }
  }
  for (int i = 0; i < gpus; ++i) {
    for (int j = 0; j < nics; ++j) {
      const Relation* r = facts.find({K::kGpu, i}, {K::kNic, j});
      const std::string a = fmt::format("gpu{}", i);
      const std::string b = fmt::format("nic{}", j);
      // GDR only where the PCIe path is known; an unknown path may cross sockets.
      if (r != nullptr && r->pci != PciLocality::kUnknown &&
          facts.nics[j].kind == NicKind::kRdma) {
        add_link(a, b, PathType::kGdr, proximity_of(r->pci));
      }
      add_link(a, b, PathType::kHostStaging,
               device_proximity(r, facts.gpus[i].numa, facts.nics[j].numa));
    }
  }
  auto host_proximity = [&](int device_numa, int numa_id) {
    if (device_numa == numa_id || (device_numa == kUnknownNuma && numa.size() == 1 && facts.numa_nodes_complete)) {
      return Proximity::kLocal;
    }
    return Proximity::kRemote;
  };
  for (const NumaInfo& n : numa) {
    const std::string host = fmt::format("numa{}", n.os_index);
    for (int i = 0; i < gpus; ++i) {
      add_link(host, fmt::format("gpu{}", i), PathType::kHostStaging,
               host_proximity(facts.gpus[i].numa, n.os_index));
    }
    for (int j = 0; j < nics; ++j) {
      add_link(host, fmt::format("nic{}", j),
               facts.nics[j].kind == NicKind::kRdma ? PathType::kRdma : PathType::kTcp,
               host_proximity(facts.nics[j].numa, n.os_index));
    }
  }
  for (std::size_t i = 0; i < numa.size(); ++i) {
    for (std::size_t j = i + 1; j < numa.size(); ++j) {
      add_link(fmt::format("numa{}", numa[i].os_index), fmt::format("numa{}", numa[j].os_index),
               PathType::kShm, Proximity::kRemote);
    }
  }
  return g;
}

std::vector<const Node*> TopologyGraph::nodes_of(NodeKind kind) const {
  std::vector<const Node*> out;
  for (const Node& n : nodes_) {
    if (n.kind == kind) out.push_back(&n);
  }
  return out;
}

const Node* TopologyGraph::find(std::string_view id) const {
  const auto it = index_.find(std::string(id));
  return it == index_.end() ? nullptr : &nodes_[it->second];
}

Result<Route> TopologyGraph::rank(std::string_view from, std::string_view to) const {
  const Node* a = find(from);
  const Node* b = find(to);
  for (auto [node, id] : {std::pair{a, from}, std::pair{b, to}}) {
    if (node == nullptr) {
      return std::unexpected(Status::not_found("rank: no node \"{}\" in the topology", id));
    }
    if (node->kind == NodeKind::kPcieSwitch || node->kind == NodeKind::kNvswitch) {
      return std::unexpected(Status::invalid_argument(
          "rank: \"{}\" is a switch, not an endpoint (expected a gpu, nic or numa node)", id));
    }
  }
  if (a == b) {
    return std::unexpected(Status::invalid_argument("rank: \"{}\" to itself is not a transfer", from));
  }
  if (a->kind == NodeKind::kNic && b->kind == NodeKind::kNic) {
    return std::unexpected(Status::invalid_argument(
        "rank: {} to {} is NIC to NIC; route from the memory behind them instead", from, to));
  }
  Route route{std::string(from), std::string(to), {}};
  if (const auto it = pair_links_.find(pair_key(from, to)); it != pair_links_.end()) {
    for (std::size_t i : it->second) route.chain.push_back(links_[i]);
  }
  if (route.chain.empty()) {
    return std::unexpected(Status::not_found("rank: no usable path from {} to {}", from, to));
  }
  // Best score first; host staging always closes the chain: it is the path
  // of last resort even when the cost model scores it above a poor direct path.
  std::ranges::stable_sort(route.chain, [](const Link& x, const Link& y) {
    const bool xs = x.path == PathType::kHostStaging;
    const bool ys = y.path == PathType::kHostStaging;
    return std::tuple(xs, -x.cost.score) < std::tuple(ys, -y.cost.score);
  });
  for (Link& l : route.chain) {
    if (l.from != route.from) std::swap(l.from, l.to);
  }
  return route;
}

Result<std::vector<std::string>> TopologyGraph::nics_for_gpu(std::string_view gpu) const {
  const Node* g = find(gpu);
  if (g == nullptr || g->kind != NodeKind::kGpu) {
    return std::unexpected(Status::not_found("nics_for_gpu: \"{}\" is not a GPU of this topology", gpu));
  }
  struct Candidate {
    int group;  // 0: GDR under a shared switch, 1: GDR through host bridges, 2: no GDR
    double score;
    std::string id;
  };
  std::vector<Candidate> candidates;
  for (const Node* nic : nodes_of(NodeKind::kNic)) {
    auto route = rank(gpu, nic->id);
    if (!route) continue;
    const Link& best = route->best();
    int group = 2;
    if (best.path == PathType::kGdr) {
      group = best.proximity == Proximity::kPix || best.proximity == Proximity::kPxb ? 0 : 1;
    }
    candidates.push_back({group, best.cost.score, nic->id});
  }
  std::ranges::stable_sort(candidates, [](const Candidate& x, const Candidate& y) {
    return std::tuple(x.group, -x.score) < std::tuple(y.group, -y.score);
  });
  std::vector<std::string> out;
  for (auto& c : candidates) out.push_back(std::move(c.id));
  return out;
}

std::vector<std::string> TopologyGraph::nics_on_numa(int numa_os_index) const {
  std::vector<std::string> out;
  for (const Node* nic : nodes_of(NodeKind::kNic)) {
    if (nic->numa == numa_os_index) out.push_back(nic->id);
  }
  return out;
}

}  // namespace baton::topology
