#include "baton/topology/json.h"

#include <nlohmann/json.hpp>

namespace baton::topology {
namespace {

nlohmann::ordered_json device_json(const Node& n) {
  nlohmann::ordered_json j{{"id", n.id}, {"name", n.name}, {"pci", n.pci_bus_id}};
  j["numa"] = n.numa == kUnknownNuma ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(n.numa);
  if (n.kind == NodeKind::kGpu && !n.cpus.empty()) j["cpu_affinity"] = n.cpus;
  return j;
}

nlohmann::ordered_json link_json(const Link& l) {
  return {{"from", l.from},
          {"to", l.to},
          {"path", std::string(to_string(l.path))},
          {"proximity", std::string(to_string(l.proximity))},
          {"nvlinks", l.nvlinks},
          {"bandwidth_gbps", l.cost.bandwidth_gbps},
          {"latency_us", l.cost.latency_us},
          {"score", l.cost.score}};
}

}  // namespace

std::string to_json(const TopologyGraph& graph, int indent) {
  nlohmann::ordered_json j;
  j["source"] = graph.source();
  j["notes"] = graph.notes();
  j["gpus"] = nlohmann::ordered_json::array();
  j["nics"] = nlohmann::ordered_json::array();
  j["numa_nodes"] = nlohmann::ordered_json::array();
  j["switches"] = nlohmann::ordered_json::array();
  for (const Node& n : graph.nodes()) {
    switch (n.kind) {
      case NodeKind::kGpu: j["gpus"].push_back(device_json(n)); break;
      case NodeKind::kNic: j["nics"].push_back(device_json(n)); break;
      case NodeKind::kNuma:
        j["numa_nodes"].push_back({{"id", n.id}, {"os_index", n.numa}, {"cpus", n.cpus}});
        break;
      case NodeKind::kPcieSwitch:
      case NodeKind::kNvswitch:
        j["switches"].push_back(
            {{"id", n.id}, {"kind", std::string(to_string(n.kind))}, {"members", n.members}});
        break;
    }
  }
  j["links"] = nlohmann::ordered_json::array();
  for (const Link& l : graph.links()) j["links"].push_back(link_json(l));

  // Every GPU pair (both directions are the same chain) and every GPU→NIC pair.
  j["routes"] = nlohmann::ordered_json::array();
  const auto gpus = graph.nodes_of(NodeKind::kGpu);
  const auto nics = graph.nodes_of(NodeKind::kNic);
  auto add_route = [&](const Node* a, const Node* b) {
    auto route = graph.rank(a->id, b->id);
    if (!route) return;  // every pair here has host staging, so this does not happen
    nlohmann::ordered_json chain = nlohmann::ordered_json::array();
    for (const Link& l : route->chain) chain.push_back(std::string(to_string(l.path)));
    j["routes"].push_back({{"from", a->id}, {"to", b->id}, {"chain", chain}});
  };
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    for (std::size_t k = i + 1; k < gpus.size(); ++k) add_route(gpus[i], gpus[k]);
  }
  for (const Node* g : gpus) {
    for (const Node* n : nics) add_route(g, n);
  }
  // Names come from files and probes: a byte that is not UTF-8 is replaced, not thrown.
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace baton::topology
