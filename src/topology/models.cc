// Synthetic machines: the shapes Baton must route well on, for tests,
// simulation and `baton topo --model`, when the real hardware is not here.
#include <functional>
#include <map>

#include <fmt/format.h>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

using K = DeviceRef::Kind;
constexpr std::uint64_t kGiB = 1ULL << 30;

// PCIe distance between two devices given the switch each hangs off and
// the NUMA node of each switch.
PciLocality pci_between(int switch_a, int switch_b, int numa_a, int numa_b) {
  if (switch_a == switch_b) return PciLocality::kPix;
  return numa_a == numa_b ? PciLocality::kNode : PciLocality::kSys;
}

struct Device {
  DeviceRef ref;
  int pcie_switch;
  int numa;
};

// Fills in every pairwise PCIe relation from the switch layout; NVLink is
// added on top by the model.
void relate_all(TopologyFacts& facts, const std::vector<Device>& devices,
                const std::function<int(int, int)>& gpu_nvlinks, bool via_nvswitch) {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = i + 1; j < devices.size(); ++j) {
      const Device& a = devices[i];
      const Device& b = devices[j];
      Relation r{a.ref, b.ref, pci_between(a.pcie_switch, b.pcie_switch, a.numa, b.numa), 0, false, false};
      if (a.ref.kind == K::kGpu && b.ref.kind == K::kGpu) {
        r.nvlinks = gpu_nvlinks(a.ref.index, b.ref.index);
        r.via_nvswitch = via_nvswitch && r.nvlinks > 0;
        if (r.nvlinks > 0) r.peer_access = true;
      }
      facts.relations.push_back(r);
    }
  }
}

void add_numa_pair(TopologyFacts& facts, const char* cpus0, const char* cpus1, int cpus_each,
                   std::uint64_t memory_each) {
  facts.numa_nodes.push_back({0, cpus0, cpus_each, memory_each});
  facts.numa_nodes.push_back({1, cpus1, cpus_each, memory_each});
}

// HGX H100: 8 GPUs all-to-all through NVSwitch (18 links each), one
// 400 Gb/s NIC per GPU under the GPU's PCIe switch, 4 GPUs per socket.
TopologyFacts nvswitch8() {
  TopologyFacts f;
  f.source = "model:nvswitch8";
  constexpr const char* kBus[] = {"1b", "43", "52", "61", "9d", "c3", "d1", "df"};
  std::vector<Device> devices;
  for (int i = 0; i < 8; ++i) {
    const int numa = i / 4;
    f.gpus.push_back({"NVIDIA H100 80GB HBM3", fmt::format("0000:{}:00.0", kBus[i]), "", numa,
                      numa == 0 ? "0-55,112-167" : "56-111,168-223", std::nullopt, 18});
    devices.push_back({{K::kGpu, i}, i, numa});
  }
  for (int i = 0; i < 8; ++i) {
    f.nics.push_back({fmt::format("mlx5_{}", i), fmt::format("0000:{}:00.1", kBus[i]), i / 4, NicKind::kRdma});
    devices.push_back({{K::kNic, i}, i, i / 4});
  }
  relate_all(f, devices, [](int, int) { return 18; }, true);
  add_numa_pair(f, "0-55,112-167", "56-111,168-223", 112, 1024 * kGiB);
  return f;
}

// Four PCIe GPUs, two per socket, each pair sharing a switch with one NIC.
TopologyFacts pcie4() {
  TopologyFacts f;
  f.source = "model:pcie4";
  std::vector<Device> devices;
  for (int i = 0; i < 4; ++i) {
    const int numa = i / 2;
    f.gpus.push_back({"NVIDIA L40S", fmt::format("0000:{:02x}:00.0", 0x21 + 0x40 * i), "", numa,
                      numa == 0 ? "0-31,64-95" : "32-63,96-127", std::nullopt, 0});
    devices.push_back({{K::kGpu, i}, i / 2, numa});
  }
  for (int i = 0; i < 2; ++i) {
    f.nics.push_back({fmt::format("mlx5_{}", i), fmt::format("0000:{:02x}:00.0", 0x22 + 0x80 * i), i,
                      NicKind::kRdma});
    devices.push_back({{K::kNic, i}, i, i});
  }
  relate_all(f, devices, [](int, int) { return 0; }, false);
  add_numa_pair(f, "0-31,64-95", "32-63,96-127", 64, 256 * kGiB);
  return f;
}

// Four GPUs with NVLink bridges between 0-1 and 2-3 only (RTX A6000 style,
// NV4); the pairs reach each other over PCIe across the sockets.
TopologyFacts nvlink_pairs() {
  TopologyFacts f;
  f.source = "model:nvlink-pairs";
  std::vector<Device> devices;
  for (int i = 0; i < 4; ++i) {
    const int numa = i / 2;
    f.gpus.push_back({"NVIDIA RTX A6000", fmt::format("0000:{:02x}:00.0", 0x01 + 0x40 * i), "", numa,
                      numa == 0 ? "0-15,32-47" : "16-31,48-63", std::nullopt, 4});
    devices.push_back({{K::kGpu, i}, i / 2, numa});
  }
  for (int i = 0; i < 2; ++i) {
    f.nics.push_back({fmt::format("mlx5_{}", i), fmt::format("0000:{:02x}:00.0", 0x02 + 0x80 * i), i,
                      NicKind::kRdma});
    devices.push_back({{K::kNic, i}, i, i});
  }
  relate_all(f, devices, [](int a, int b) { return a / 2 == b / 2 ? 4 : 0; }, false);
  add_numa_pair(f, "0-15,32-47", "16-31,48-63", 32, 128 * kGiB);
  return f;
}

const std::map<std::string, TopologyFacts (*)(), std::less<>>& registry() {
  static const std::map<std::string, TopologyFacts (*)(), std::less<>> kModels{
      {"nvswitch8", &nvswitch8}, {"pcie4", &pcie4}, {"nvlink-pairs", &nvlink_pairs}};
  return kModels;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : registry()) names.push_back(name);
  return names;
}

Result<TopologyFacts> load_model(std::string_view name) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    return std::unexpected(Status::not_found("topology model \"{}\" does not exist (expected one of: {})",
                                             name, fmt::join(model_names(), ", ")));
  }
  return it->second();
}

}  // namespace baton::topology
