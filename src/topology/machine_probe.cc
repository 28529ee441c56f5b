// probe_machine: the sources tried in order, and how their facts are merged.
// GPU facts come from the richest source that answers (NVML, then CUDA, then
// the nvidia-smi command); the host (NUMA nodes, CPUs, NICs, PCIe tree) comes
// from hwloc. Every source that did not answer leaves a note.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "baton/common/log.h"
#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::istringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_regular_file(std::filesystem::path(dir) / program, ec)) {
      return true;
    }
  }
  return false;
}

// Overlays GPU facts from NVML or CUDA onto hwloc's view, matching GPUs by
// PCI bus id: hwloc knows where each GPU sits on PCIe, the driver knows its
// name and its NVLinks.
TopologyFacts merge_driver_into_host(const TopologyFacts& driver, TopologyFacts host) {
  using K = DeviceRef::Kind;
  std::vector<int> host_index(driver.gpus.size(), -1);
  for (std::size_t i = 0; i < driver.gpus.size(); ++i) {
    const GpuInfo& d = driver.gpus[i];
    for (std::size_t h = 0; h < host.gpus.size(); ++h) {
      if (!d.pci_bus_id.empty() && host.gpus[h].pci_bus_id == d.pci_bus_id) host_index[i] = static_cast<int>(h);
    }
    if (host_index[i] < 0) {
      host_index[i] = static_cast<int>(host.gpus.size());
      host.gpus.push_back(d);
      continue;
    }
    GpuInfo& g = host.gpus[host_index[i]];
    g.name = d.name.empty() ? g.name : d.name;
    g.uuid = d.uuid;
    g.nvlink_active = d.nvlink_active;
    g.nvlink_gbps_per_link = d.nvlink_gbps_per_link;
    g.gpu_numa_id = d.gpu_numa_id;
    if (g.numa == kUnknownNuma) g.numa = d.numa;
  }
  for (const Relation& r : driver.relations) {
    if (r.a.kind != K::kGpu || r.b.kind != K::kGpu) continue;
    const DeviceRef a{K::kGpu, host_index[r.a.index]};
    const DeviceRef b{K::kGpu, host_index[r.b.index]};
    Relation* existing = nullptr;
    for (Relation& h : host.relations) {
      if ((h.a == a && h.b == b) || (h.a == b && h.b == a)) existing = &h;
    }
    if (existing == nullptr) {
      host.relations.push_back({a, b, r.pci, r.nvlinks, r.via_nvswitch, r.peer_access});
    } else {
      existing->nvlinks = r.nvlinks;
      existing->via_nvswitch = r.via_nvswitch;
      existing->peer_access = existing->peer_access || r.peer_access;
    }
  }
  host.notes.insert(host.notes.end(), driver.notes.begin(), driver.notes.end());
  host.source = driver.source + "+hwloc";
  return host;
}

// The last resort: one NUMA node holding every CPU this process may use.
TopologyFacts single_node_host() {
  TopologyFacts f;
  f.source = "model:host";
  const int cpus = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  f.numa_nodes.push_back({0, fmt::format("0-{}", cpus - 1), cpus, 0});
  return f;
}

}  // namespace

Result<TopologyFacts> probe_nvidia_smi() {
  if (!on_path("nvidia-smi")) {
    return std::unexpected(Status::unavailable("nvidia-smi: not found on PATH"));
  }
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen("nvidia-smi topo -m 2>&1", "r"), &pclose);
  if (!pipe) return std::unexpected(Status::unavailable("nvidia-smi: could not start the command"));
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe.get())) out.append(buf.data(), n);
  const int rc = pclose(pipe.release());
  if (rc != 0) {
    return std::unexpected(Status::unavailable("nvidia-smi: `nvidia-smi topo -m` failed (status {}): {}", rc,
                                               out.substr(0, out.find('\n'))));
  }
  return parse_nvidia_smi_topo(out);
}

Result<TopologyFacts> probe_machine() {
  std::vector<std::string> notes;
  std::optional<TopologyFacts> gpus;
  for (auto probe : {&probe_nvml, &probe_cuda, &probe_nvidia_smi}) {
    auto facts = probe();
    if (facts) {
      gpus = std::move(*facts);
      break;
    }
    notes.push_back(facts.error().message());
  }
  auto host = probe_hwloc();
  if (!host) {
    baton::logger().warn("topology: hwloc failed: {}", host.error().message());
    notes.push_back(host.error().message());
    host = single_node_host();
  }

  TopologyFacts merged;
  if (!gpus) {
    merged = std::move(*host);
  } else if (gpus->source.starts_with("nvidia-smi")) {
    // nvidia-smi already lists the NICs; hwloc adds the full NUMA picture.
    merged = std::move(*gpus);
    merged.numa_nodes = host->numa_nodes;
    merged.source += "+" + host->source;
  } else {
    merged = merge_driver_into_host(*gpus, std::move(*host));
  }
  merged.notes.insert(merged.notes.begin(), notes.begin(), notes.end());
  return merged;
}

bool has_numa_node(int node) {
  std::error_code ignored;
  return node >= 0 && std::filesystem::exists("/sys/devices/system/node/node" + std::to_string(node), ignored);
}

}  // namespace baton::topology
