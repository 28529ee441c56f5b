// The cost model: what a path costs (bandwidth, latency) and how paths are
// ranked. Defaults come from public hardware figures (see docs/topology.md);
// every entry can be overridden, e.g. from the policy file.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "baton/common/status.h"
#include "baton/topology/facts.h"

namespace baton::topology {

// One physical route between two endpoints (docs/architecture.md, "Names").
enum class PathType : std::uint8_t {
  kNvlink,       // direct NVLink bridge or mesh
  kNvswitch,     // NVLink through an NVSwitch fabric
  kPcieP2p,      // GPU peer-to-peer DMA over the PCIe hierarchy
  kHostStaging,  // bounce through pinned host memory (always possible)
  kGdr,          // GPUDirect RDMA: the NIC reads/writes GPU memory
  kRdma,         // the NIC reads/writes host memory
  kTcp,          // sockets over a plain NIC
  kShm,          // shared memory between processes on one host
};
inline constexpr int kPathTypeCount = 8;

[[nodiscard]] std::string_view to_string(PathType path);
[[nodiscard]] Result<PathType> parse_path_type(std::string_view name);

// How close the two endpoints of a path are. PCIe distance for paths that
// cross PCIe; kLocal / kRemote for host-memory paths (same NUMA node or not).
enum class Proximity : std::uint8_t {
  kPix,
  kPxb,
  kPhb,
  kNode,
  kSys,
  kLocal,   // same NUMA node, or a fabric link (NVLink) where distance is moot
  kRemote,  // across NUMA nodes
};
inline constexpr int kProximityCount = 7;

// "PIX" … "SYS", "local", "remote".
[[nodiscard]] std::string_view to_string(Proximity proximity);

struct PathCost {
  double bandwidth_gbps = 0;  // GB/s (10^9 bytes per second), one direction
  double latency_us = 0;      // time to first byte
  // Higher is better: the effective GB/s of a kScoreReferenceBytes transfer,
  // bytes / (latency + bytes / bandwidth). Ranks fast-but-far against
  // slow-but-near paths the way a 1 MiB slice experiences them.
  double score = 0;
};

// A reference slice: large enough that bandwidth matters, small enough that
// latency still does.
inline constexpr std::uint64_t kScoreReferenceBytes = 1 << 20;

// Bandwidth of one NVLink, one direction. NVLink 2, 3 and 4 all carry 25 GB/s
// per link per direction (V100: 6 links = 150 GB/s, A100: 12 = 300,
// H100/H200: 18 = 450). Blackwell's NVLink 5 carries 50 with the same 18
// links; nvidia-smi does not say which, the NVML probe does
// (GpuInfo::nvlink_gbps_per_link).
inline constexpr double kNvlinkGbpsPerLink = 25.0;

class CostModel {
 public:
  // The documented defaults.
  CostModel();

  // Cost of `path` at `proximity`. nvlink/nvswitch scale with `nvlinks`,
  // at `gbps_per_link` where the probe knows the GPUs' NVLink generation
  // (> 0), unless set() overrode the entry: a measured figure wins. nullopt
  // when that combination is not a usable path (e.g. GDR across the SMP
  // interconnect, which NCCL also refuses by default, or a value outside the
  // enums).
  [[nodiscard]] std::optional<PathCost> cost(PathType path, Proximity proximity,
                                             int nvlinks = 0, double gbps_per_link = 0) const;

  // Beyond these a figure is a typo, and its inverse (ns per byte)
  // overflows or rounds to nothing (1e308 GB/s scored inf); a second per
  // transfer is no link's.
  static constexpr double kMinBandwidthGbps = 1e-3;
  static constexpr double kMaxBandwidthGbps = 1e5;
  static constexpr double kMaxLatencyUs = 1e6;

  // Overrides one entry (bandwidth per link for nvlink/nvswitch). Refuses
  // a path or proximity outside its enum (a cast integer), a bandwidth
  // outside kMin..kMaxBandwidthGbps, a latency outside 0..kMaxLatencyUs, or
  // either not finite.
  Status set(PathType path, Proximity proximity, double bandwidth_gbps,
             double latency_us);
  // Marks a combination unusable (one outside the enums is none: ignored).
  void disable(PathType path, Proximity proximity);

  // Whether a topology graph ever prices `path` at `proximity`: the
  // defaults' usable entries, and GDR past the PCIe switches (PHB, NODE,
  // SYS: off by default, as NCCL has it, on once given a cost). An override of anything else could
  // never take effect (PCIe P2P at NODE or SYS, NVLink anywhere but local).
  [[nodiscard]] static bool priced(PathType path, Proximity proximity);

  [[nodiscard]] static double score(double bandwidth_gbps, double latency_us);

 private:
  struct Entry {
    bool usable = false;
    double bandwidth_gbps = 0;
    double latency_us = 0;
    bool overridden = false;  // by set(): it wins over a probed NVLink speed
  };
  std::array<std::array<Entry, kProximityCount>, kPathTypeCount> table_{};
};

// PIX → kPix …; kUnknown maps to kPhb (assume a host bridge in between).
[[nodiscard]] Proximity proximity_of(PciLocality locality);

}  // namespace baton::topology
