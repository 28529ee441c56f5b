// hwloc probe: this host's NUMA nodes and CPUs, the NVIDIA GPUs and NICs on
// its PCI tree, and how close each pair of those devices sits on that tree
// (nvidia-smi's PIX/PXB/PHB/NODE/SYS). Needs no GPU driver: it reads sysfs.
#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

constexpr unsigned kNvidiaVendorId = 0x10de;
constexpr unsigned kPciClassDisplay = 0x03;  // base class: VGA, 3D controller, …

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string cpu_list(hwloc_const_bitmap_t cpuset) {
  if (cpuset == nullptr) return {};
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, cpuset) < 0 || text == nullptr) return {};
  std::string list(text);
  std::free(text);
  return list;
}

bool is_bridge(hwloc_obj_t obj, hwloc_obj_bridge_type_t upstream) {
  return obj->type == HWLOC_OBJ_BRIDGE && obj->attr->bridge.upstream_type == upstream;
}

std::string pci_bus_id_of(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
}

// The PCI function an OS device (mlx5_0, eth0) sits on, or null for a virtual one.
hwloc_obj_t pci_ancestor(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj->parent; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) return p;
  }
  return nullptr;
}

// The NUMA node an IO object hangs under, if its nearest CPU-side ancestor
// belongs to exactly one.
int numa_of(hwloc_topology_t topology, hwloc_obj_t obj) {
  hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(topology, obj);
  if (host == nullptr || host->nodeset == nullptr || hwloc_bitmap_weight(host->nodeset) != 1) {
    return kUnknownNuma;
  }
  return hwloc_bitmap_first(host->nodeset);  // nodesets hold OS indexes
}

// hwloc_get_common_ancestor_obj compares depths, which IO objects do not have
// (theirs are negative, special values), so walk the parent chains instead.
hwloc_obj_t lowest_common_ancestor(hwloc_obj_t a, hwloc_obj_t b) {
  for (hwloc_obj_t x = a; x != nullptr; x = x->parent) {
    for (hwloc_obj_t y = b; y != nullptr; y = y->parent) {
      if (x == y) return x;
    }
  }
  return nullptr;
}

int bridges_between(hwloc_obj_t obj, hwloc_obj_t ancestor) {
  int bridges = 0;
  for (hwloc_obj_t p = obj->parent; p != nullptr && p != ancestor; p = p->parent) {
    if (p->type == HWLOC_OBJ_BRIDGE) ++bridges;
  }
  return bridges;
}

// How two PCI functions reach each other, in nvidia-smi's classes.
//
// A PCIe switch appears in hwloc as an upstream-port bridge whose children
// are downstream-port bridges. nvidia-smi's PIX ("at most a single PCIe
// bridge", NVML_TOPOLOGY_SINGLE: "a single PCIe switch") covers two devices
// on different downstream ports of one switch, so PIX here means: the lowest
// common ancestor is a PCI bridge and each device is at most one more bridge
// (its downstream port) below it. Deeper than that crosses several switches
// (PXB) without reaching the host bridge (PHB). Above the host bridges only
// NUMA locality is left: the same node (NODE) or across the SMP
// interconnect (SYS); a node hwloc cannot tell counts as SYS.
PciLocality pci_locality(hwloc_obj_t a, hwloc_obj_t b, int numa_a, int numa_b) {
  if (a == nullptr || b == nullptr) return PciLocality::kUnknown;  // virtual device
  hwloc_obj_t common = lowest_common_ancestor(a, b);
  if (common == nullptr) return PciLocality::kUnknown;
  if (is_bridge(common, HWLOC_OBJ_BRIDGE_PCI)) {
    return bridges_between(a, common) <= 1 && bridges_between(b, common) <= 1 ? PciLocality::kPix
                                                                              : PciLocality::kPxb;
  }
  if (common->type == HWLOC_OBJ_PCI_DEVICE) return PciLocality::kPix;  // one device, two functions
  if (is_bridge(common, HWLOC_OBJ_BRIDGE_HOST)) return PciLocality::kPhb;
  if (numa_a != kUnknownNuma && numa_a == numa_b) return PciLocality::kNode;
  return PciLocality::kSys;
}

void add_numa_nodes(hwloc_topology_t topology, TopologyFacts& facts) {
  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr);
       node != nullptr; node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
    NumaInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.cpus = cpu_list(node->cpuset);  // empty for memory-only nodes (Grace HBM, CXL)
    if (node->cpuset != nullptr) {
      info.cpu_count = hwloc_get_nbobjs_inside_cpuset_by_type(topology, node->cpuset, HWLOC_OBJ_PU);
    }
    info.memory_bytes = node->attr->numanode.local_memory;
    facts.numa_nodes.push_back(std::move(info));
  }
}

void add_gpus(hwloc_topology_t topology, TopologyFacts& facts, std::vector<hwloc_obj_t>& pci) {
  for (hwloc_obj_t dev = hwloc_get_next_pcidev(topology, nullptr); dev != nullptr;
       dev = hwloc_get_next_pcidev(topology, dev)) {
    const auto& a = dev->attr->pcidev;
    // NVSwitches (class 0x0680) and the GPU's audio function (0x0403) are not GPUs.
    if (a.vendor_id != kNvidiaVendorId || (a.class_id >> 8) != kPciClassDisplay) continue;
    GpuInfo gpu;
    const char* model = hwloc_obj_get_info_by_name(dev, "PCIDevice");
    gpu.name = model != nullptr && *model != '\0' ? model : "NVIDIA GPU";
    gpu.pci_bus_id = pci_bus_id_of(dev);
    gpu.numa = numa_of(topology, dev);
    hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(topology, dev);
    gpu.cpu_affinity = host != nullptr ? cpu_list(host->cpuset) : std::string();
    facts.gpus.push_back(std::move(gpu));
    pci.push_back(dev);
  }
}

// One NIC per PCI function: an RDMA HCA exposes both an OpenFabrics device
// (mlx5_0) and a netdev (ib0, ens1f0) on the same function, and it is one
// NIC, best used through RDMA. Netdevs with no RDMA device are plain
// Ethernet, one NIC each.
void add_nics(hwloc_topology_t topology, TopologyFacts& facts, std::vector<hwloc_obj_t>& pci) {
  struct Candidate {
    hwloc_obj_t osdev;
    hwloc_obj_t pci;
    NicKind kind;
  };
  std::vector<Candidate> rdma;
  std::vector<Candidate> ethernet;
  for (hwloc_obj_t osdev = hwloc_get_next_osdev(topology, nullptr); osdev != nullptr;
       osdev = hwloc_get_next_osdev(topology, osdev)) {
    if (osdev->name == nullptr || *osdev->name == '\0') continue;
    if (osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      rdma.push_back({osdev, pci_ancestor(osdev), NicKind::kRdma});
    } else if (osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) {
      ethernet.push_back({osdev, pci_ancestor(osdev), NicKind::kEthernet});
    }
  }
  std::vector<Candidate> nics;
  auto claimed = [&](hwloc_obj_t function) {
    if (function == nullptr) return false;
    for (const Candidate& c : nics) {
      if (c.pci == function) return true;
    }
    return false;
  };
  for (const Candidate& c : rdma) {
    if (!claimed(c.pci)) nics.push_back(c);
  }
  for (const Candidate& c : ethernet) {
    // Only an RDMA device claims a function; two netdevs on one function
    // (multi-port cards) stay two interfaces.
    bool has_rdma = false;
    for (const Candidate& r : rdma) has_rdma = has_rdma || (c.pci != nullptr && r.pci == c.pci);
    if (!has_rdma) nics.push_back(c);
  }
  for (const Candidate& c : nics) {
    NicInfo nic;
    nic.name = c.osdev->name;
    nic.pci_bus_id = c.pci != nullptr ? pci_bus_id_of(c.pci) : std::string();
    nic.numa = numa_of(topology, c.osdev);
    nic.kind = c.kind;
    facts.nics.push_back(std::move(nic));
    pci.push_back(c.pci);
  }
}

// Every GPU–GPU, GPU–NIC and NIC–NIC pair, in that order.
void add_relations(const std::vector<hwloc_obj_t>& gpu_pci, const std::vector<hwloc_obj_t>& nic_pci,
                   TopologyFacts& facts) {
  struct Device {
    DeviceRef ref;
    hwloc_obj_t pci;
    int numa;
  };
  std::vector<Device> devices;
  for (std::size_t i = 0; i < gpu_pci.size(); ++i) {
    devices.push_back({{DeviceRef::Kind::kGpu, static_cast<int>(i)}, gpu_pci[i], facts.gpus[i].numa});
  }
  for (std::size_t i = 0; i < nic_pci.size(); ++i) {
    devices.push_back({{DeviceRef::Kind::kNic, static_cast<int>(i)}, nic_pci[i], facts.nics[i].numa});
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = i + 1; j < devices.size(); ++j) {
      Relation r;
      r.a = devices[i].ref;
      r.b = devices[j].ref;
      r.pci = pci_locality(devices[i].pci, devices[j].pci, devices[i].numa, devices[j].numa);
      facts.relations.push_back(r);
    }
  }
}

}  // namespace

Result<TopologyFacts> probe_hwloc() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return std::unexpected(Status::internal("hwloc: hwloc_topology_init failed: {}",
                                            std::generic_category().message(errno)));
  }
  const TopologyPtr topology(raw);
  // IO objects are filtered out by default; KEEP_IMPORTANT keeps GPUs, NICs,
  // HCAs and the bridges above them, not every PCI function.
  if (hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
    return std::unexpected(Status::internal("hwloc: hwloc_topology_set_io_types_filter failed: {}",
                                            std::generic_category().message(errno)));
  }
  if (hwloc_topology_load(raw) != 0) {
    return std::unexpected(Status::internal("hwloc: hwloc_topology_load failed: {}",
                                            std::generic_category().message(errno)));
  }

  TopologyFacts facts;
  facts.source = "hwloc";
  add_numa_nodes(raw, facts);
  std::vector<hwloc_obj_t> gpu_pci;
  std::vector<hwloc_obj_t> nic_pci;
  add_gpus(raw, facts, gpu_pci);
  add_nics(raw, facts, nic_pci);
  add_relations(gpu_pci, nic_pci, facts);
  return facts;
}

}  // namespace baton::topology
