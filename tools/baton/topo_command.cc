// `baton topo`: what Baton sees of a machine and how it would route on it.
#include <cstdio>
#include <map>

#include <fmt/core.h>
#include <fmt/format.h>

#include "baton/topology/graph.h"
#include "baton/topology/json.h"
#include "baton/topology/probe.h"
#include "commands.h"
#include "json_output.h"

namespace baton::cli {
namespace {

using namespace baton::topology;

struct TopoOptions {
  bool probe = false;
  std::string model;
  std::string nvidia_smi_file;
  std::string json_path;
};

// Short cell for the route matrix: "NVS18", "NV4", "P2P", "HOST".
std::string cell(const Link& l) {
  switch (l.path) {
    case PathType::kNvswitch: return fmt::format("NVS{}", l.nvlinks);
    case PathType::kNvlink: return fmt::format("NV{}", l.nvlinks);
    case PathType::kPcieP2p: return "P2P";
    case PathType::kGdr: return fmt::format("GDR-{}", to_string(l.proximity));
    case PathType::kHostStaging: return "HOST";
    default: return std::string(to_string(l.path));
  }
}

void print_table(const TopologyGraph& g) {
  fmt::print("Topology from {}\n", g.source());
  for (const std::string& note : g.notes()) fmt::print("  note: {}\n", note);
  auto numa_text = [](int numa) { return numa == kUnknownNuma ? std::string("-") : std::to_string(numa); };

  const auto gpus = g.nodes_of(NodeKind::kGpu);
  const auto nics = g.nodes_of(NodeKind::kNic);
  fmt::print("\nGPUs: {}\n", gpus.size());
  for (const Node* n : gpus) {
    fmt::print("  {:<7} {:<26} pci {:<13} numa {:<3} cpus {}\n", n->id, n->name,
               n->pci_bus_id.empty() ? "-" : n->pci_bus_id, numa_text(n->numa), n->cpus.empty() ? "-" : n->cpus);
  }
  fmt::print("\nNICs: {}\n", nics.size());
  for (const Node* n : nics) {
    fmt::print("  {:<7} {:<26} pci {:<13} numa {}\n", n->id, n->name,
               n->pci_bus_id.empty() ? "-" : n->pci_bus_id, numa_text(n->numa));
  }
  const auto numa = g.nodes_of(NodeKind::kNuma);
  fmt::print("\nNUMA nodes: {}\n", numa.size());
  for (const Node* n : numa) fmt::print("  {:<7} cpus {}\n", n->id, n->cpus.empty() ? "-" : n->cpus);
  const auto pcie = g.nodes_of(NodeKind::kPcieSwitch);
  const auto fabric = g.nodes_of(NodeKind::kNvswitch);
  if (!pcie.empty() || !fabric.empty()) fmt::print("\nSwitches: {}\n", pcie.size() + fabric.size());
  for (const Node* s : g.nodes_of(NodeKind::kPcieSwitch)) {
    fmt::print("  {:<7} PCIe switch over {}\n", s->id, fmt::join(s->members, " "));
  }
  for (const Node* s : g.nodes_of(NodeKind::kNvswitch)) {
    fmt::print("  {:<9} NVSwitch fabric over {}\n", s->id, fmt::join(s->members, " "));
  }

  if (!gpus.empty()) {
    fmt::print("\nBest path between GPUs (NVS# NVSwitch, NV# NVLink, P2P PCIe peer, HOST staging)\n{:<7}", "");
    for (const Node* b : gpus) fmt::print("{:>7}", b->id);
    fmt::print("\n");
    for (const Node* a : gpus) {
      fmt::print("{:<7}", a->id);
      for (const Node* b : gpus) {
        auto r = g.rank(a->id, b->id);
        fmt::print("{:>7}", r ? cell(r->best()) : "X");
      }
      fmt::print("\n");
    }
    fmt::print("\nRoutes (best first, then the fallback chain)\n");
    for (const Node* a : gpus) {
      for (const Node* b : gpus) {
        if (a->id >= b->id) continue;
        auto r = g.rank(a->id, b->id);
        if (!r) continue;
        std::vector<std::string> chain;
        for (const Link& l : r->chain) chain.push_back(fmt::format("{} {:.0f} GB/s", to_string(l.path), l.cost.bandwidth_gbps));
        fmt::print("  {} -> {}: {}\n", a->id, b->id, fmt::join(chain, "  >  "));
      }
      if (auto order = g.nics_for_gpu(a->id); order && !order->empty()) {
        std::vector<std::string> ranked;
        for (const std::string& nic : *order) {
          auto r = g.rank(a->id, nic);
          ranked.push_back(fmt::format("{}({})", g.find(nic)->name, r ? cell(r->best()) : "?"));
        }
        fmt::print("  {} NICs for GPUDirect: {}\n", a->id, fmt::join(ranked, " "));
      }
    }
  }
}

int run_topo(const TopoOptions& o) {
  auto fail = [](const Status& s) {
    return fail_command("topo", s);
  };
  Result<TopologyFacts> facts = !o.model.empty()             ? load_model(o.model)
                                : !o.nvidia_smi_file.empty() ? load_nvidia_smi_topo(o.nvidia_smi_file)
                                                             : probe_machine();
  if (!facts) {
    // A model or file the caller named that is not there is their input (exit 2).
    const Status& e = facts.error();
    return fail(e.code() == StatusCode::kNotFound ? Status::invalid_argument("{}", e.message()) : e);
  }
  auto graph = TopologyGraph::build(*facts);
  if (!graph) return fail(graph.error());

  if (Status s = write_json_output(to_json(*graph), o.json_path); !s.is_ok()) return fail(s);
  if (o.json_path == "-") return 0;
  print_table(*graph);
  return 0;
}

}  // namespace

Command add_topo_command(CLI::App& parent) {
  auto options = std::make_shared<TopoOptions>();
  CLI::App* app = parent.add_subcommand("topo", "Show the machine's GPUs, NICs, NUMA nodes, paths and routes");
  auto* probe = app->add_flag("--probe", options->probe, "Probe this machine (the default)");
  // An empty value would fall back to probing this machine without a word.
  const auto not_empty = [](const std::string& v) { return v.empty() ? std::string("an empty value") : std::string(); };
  auto* model = app->add_option("--model", options->model, "A synthetic machine: nvswitch8, pcie4, nvlink-pairs")
                    ->check(not_empty);
  auto* file = app->add_option("--nvidia-smi", options->nvidia_smi_file, "Parse `nvidia-smi topo -m` output: a saved file, or - for standard input")
                   ->check(not_empty);
  probe->excludes(model)->excludes(file);
  model->excludes(file);
  app->add_option("--json", options->json_path, "Write the topology as JSON to PATH ('-': stdout, no table)");
  return {app, [options] { return run_topo(*options); }};
}

}  // namespace baton::cli
