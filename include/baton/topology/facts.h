// TopologyFacts: what a probe learns about a machine (devices, NUMA nodes and
// how each pair of devices is connected), before any cost is attached. Every
// probe (NVML, CUDA, nvidia-smi text, hwloc, synthetic models) produces facts;
// TopologyGraph::build turns them into costed links and routes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace baton::topology {

inline constexpr int kUnknownNuma = -1;

// Bounds of a real machine, which every source and TopologyGraph::build
// hold facts to. A GPU has at most 18 NVLink ports (H100/H200/B200): one
// whose bonds to its peers add up to more is on an NVSwitch fabric. NUMA
// ids and CPUs: Linux's MAX_NUMNODES and NR_CPUS at their largest.
inline constexpr int kMaxNvlinksPerGpu = 18;
inline constexpr int kMaxNumaNode = 1023;
inline constexpr int kMaxCpu = 8191;

// How two PCIe devices reach each other, best first, in nvidia-smi's words.
enum class PciLocality : std::uint8_t {
  kPix,      // at most one PCIe bridge (same switch)
  kPxb,      // several bridges, no host bridge
  kPhb,      // through a PCIe host bridge (the CPU)
  kNode,     // between host bridges within one NUMA node
  kSys,      // across the SMP interconnect between NUMA nodes (QPI/UPI)
  kUnknown,  // the source does not say (e.g. hidden behind NV#)
};

enum class NicKind : std::uint8_t {
  kRdma,      // an RDMA-capable HCA (mlx5_*, OpenFabrics device)
  kEthernet,  // a plain network interface: TCP only
};

struct GpuInfo {
  std::string name;         // "NVIDIA H200", or "GPU0" when the source has no name
  std::string pci_bus_id;   // "0000:17:00.0" (lower case), empty if unknown
  std::string uuid;         // empty if unknown
  int numa = kUnknownNuma;  // NUMA node the GPU is attached to
  std::string cpu_affinity; // "0-63,128-191" as the source wrote it
  std::optional<int> gpu_numa_id;  // the GPU's own memory NUMA id (Grace: a number; else unset)
  int nvlink_active = 0;    // active NVLink links, when the source knows
  // One NVLink's speed per direction in GB/s, when the source knows the
  // generation (NVML's architecture: Blackwell's NVLink 5 carries 50, twice
  // the 25 of NVLink 2-4, with the same link count); 0: the cost model's.
  double nvlink_gbps_per_link = 0;
};

struct NicInfo {
  std::string name;  // "mlx5_0", "eth0"; the NIC Legend's name when given
  std::string pci_bus_id;
  int numa = kUnknownNuma;
  NicKind kind = NicKind::kRdma;
};

struct NumaInfo {
  int os_index = 0;  // the OS's node id (need not be contiguous: 0, 8)
  std::string cpus;  // cpu list "0-31,64-95"; empty if unknown
  int cpu_count = 0;
  std::uint64_t memory_bytes = 0;  // 0 if unknown
};

// A device named by kind and index into TopologyFacts::gpus / nics.
struct DeviceRef {
  enum class Kind : std::uint8_t { kGpu, kNic };
  Kind kind = Kind::kGpu;
  int index = 0;
  friend bool operator==(const DeviceRef&, const DeviceRef&) = default;
};

// How device `a` reaches device `b` (symmetric; stored once per pair).
struct Relation {
  DeviceRef a;
  DeviceRef b;
  PciLocality pci = PciLocality::kUnknown;
  int nvlinks = 0;            // bonded NVLinks between the two (NV#)
  bool via_nvswitch = false;  // those links go through an NVSwitch fabric
  bool peer_access = false;   // the driver reports P2P access (CUDA)
};

struct TopologyFacts {
  std::string source;  // "nvidia-smi", "nvml+hwloc", "model:nvswitch8", …
  std::vector<GpuInfo> gpus;
  std::vector<NicInfo> nics;
  std::vector<NumaInfo> numa_nodes;
  // Whether numa_nodes is every node of the machine (a probe, a model) or
  // only those its devices name (nvidia-smi). With one node listed, a
  // device of unknown node is taken as on it only when the list is whole:
  // a NIC that nvidia-smi puts across the socket link from every GPU is on
  // a node the text never names.
  bool numa_nodes_complete = true;
  std::vector<Relation> relations;
  // Why better sources were skipped ("nvml: libnvidia-ml.so.1 not found").
  std::vector<std::string> notes;

  // The relation between two devices, if the source gave one.
  [[nodiscard]] const Relation* find(DeviceRef a, DeviceRef b) const;
};

// "PIX", "NODE", …; "?" for kUnknown.
[[nodiscard]] const char* to_string(PciLocality locality);

}  // namespace baton::topology
