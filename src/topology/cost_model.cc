#include "baton/topology/cost_model.h"

#include <array>
#include <cmath>

namespace baton::topology {
namespace {

constexpr std::array<std::string_view, kPathTypeCount> kPathNames{
    "nvlink", "nvswitch", "pcie_p2p", "host_staging", "gdr", "rdma", "tcp", "shm"};

int idx(PathType p) { return static_cast<int>(p); }
int idx(Proximity p) { return static_cast<int>(p); }

// Enumerators cast from a caller's integer are checked before they index.
bool known(PathType p) { return idx(p) < kPathTypeCount; }
bool known(Proximity p) { return idx(p) < kProximityCount; }

}  // namespace

std::string_view to_string(PathType path) { return known(path) ? kPathNames[idx(path)] : "unknown"; }

std::string_view to_string(Proximity proximity) {
  static constexpr std::array<std::string_view, kProximityCount> kNames{
      "PIX", "PXB", "PHB", "NODE", "SYS", "local", "remote"};
  return known(proximity) ? kNames[idx(proximity)] : "unknown";
}

Result<PathType> parse_path_type(std::string_view name) {
  for (int i = 0; i < kPathTypeCount; ++i) {
    if (kPathNames[i] == name) return static_cast<PathType>(i);
  }
  return std::unexpected(Status::invalid_argument(
      "parse_path_type: unknown path \"{}\" (expected nvlink, nvswitch, pcie_p2p, "
      "host_staging, gdr, rdma, tcp or shm)",
      name));
}

Proximity proximity_of(PciLocality locality) {
  switch (locality) {
    case PciLocality::kPix: return Proximity::kPix;
    case PciLocality::kPxb: return Proximity::kPxb;
    case PciLocality::kPhb: return Proximity::kPhb;
    case PciLocality::kNode: return Proximity::kNode;
    case PciLocality::kSys: return Proximity::kSys;
    case PciLocality::kUnknown: return Proximity::kPhb;
  }
  return Proximity::kPhb;
}

// Defaults (one direction; docs/topology.md explains each figure):
// - NVLink / NVSwitch: 25 GB/s per link (see kNvlinkGbpsPerLink); ~2 µs.
// - PCIe Gen4 x16 moves ~24 GB/s in practice. P2P through more bridges or the
//   host bridge loses bandwidth (PHB P2P is often throttled by the root
//   complex); NODE/SYS P2P is unsupported or slower than staging on most
//   platforms, so it is not offered.
// - Host staging of GPU↔GPU is two PCIe copies through pinned memory: about
//   half the PCIe bandwidth, less across the socket link.
// - GPUDirect RDMA at 200 Gb/s (25 GB/s) HDR: full rate under one switch.
//   Through the host bridge and beyond it is often slower than staging, so
//   NCCL's default (NCCL_NET_GDR_LEVEL=PXB) stops at PXB, and so do we: PHB,
//   NODE and SYS are off until a policy gives them a cost.
// - rdma/tcp/shm from host memory: local NUMA vs remote NUMA.
CostModel::CostModel() {
  auto put = [this](PathType p, Proximity x, double gbps, double us) {
    table_[idx(p)][idx(x)] = {true, gbps, us};
  };
  using P = PathType;
  using X = Proximity;
  put(P::kNvlink, X::kLocal, kNvlinkGbpsPerLink, 2.0);
  put(P::kNvswitch, X::kLocal, kNvlinkGbpsPerLink, 2.5);

  put(P::kPcieP2p, X::kPix, 24.0, 3.0);
  put(P::kPcieP2p, X::kPxb, 22.0, 3.5);
  put(P::kPcieP2p, X::kPhb, 14.0, 4.5);

  put(P::kHostStaging, X::kPix, 11.0, 10.0);  // GPU↔GPU or GPU↔NIC via host
  put(P::kHostStaging, X::kPxb, 11.0, 10.0);
  put(P::kHostStaging, X::kPhb, 11.0, 10.0);
  put(P::kHostStaging, X::kNode, 10.0, 11.0);
  put(P::kHostStaging, X::kSys, 6.0, 14.0);
  put(P::kHostStaging, X::kLocal, 24.0, 5.0);   // host memory ↔ GPU, same NUMA
  put(P::kHostStaging, X::kRemote, 16.0, 7.0);  // host memory ↔ GPU, other NUMA

  put(P::kGdr, X::kPix, 24.0, 2.0);
  put(P::kGdr, X::kPxb, 23.0, 2.2);

  put(P::kRdma, X::kLocal, 24.0, 2.5);
  put(P::kRdma, X::kRemote, 14.0, 3.5);
  put(P::kTcp, X::kLocal, 3.0, 30.0);
  put(P::kTcp, X::kRemote, 2.5, 35.0);
  put(P::kShm, X::kLocal, 12.0, 1.0);
  put(P::kShm, X::kRemote, 8.0, 1.5);
}

double CostModel::score(double bandwidth_gbps, double latency_us) {
  const double bytes = static_cast<double>(kScoreReferenceBytes);
  const double seconds = latency_us * 1e-6 + bytes / (bandwidth_gbps * 1e9);
  return bytes / seconds / 1e9;
}

std::optional<PathCost> CostModel::cost(PathType path, Proximity proximity,
                                        int nvlinks, double gbps_per_link) const {
  if (!known(path) || !known(proximity)) return std::nullopt;
  const Entry& e = table_[idx(path)][idx(proximity)];
  if (!e.usable) return std::nullopt;
  double gbps = e.bandwidth_gbps;
  if (path == PathType::kNvlink || path == PathType::kNvswitch) {
    if (nvlinks <= 0) return std::nullopt;
    if (!e.overridden && gbps_per_link >= kMinBandwidthGbps && gbps_per_link <= kMaxBandwidthGbps) {
      gbps = gbps_per_link;
    }
    gbps *= nvlinks;
  }
  return PathCost{gbps, e.latency_us, score(gbps, e.latency_us)};
}

Status CostModel::set(PathType path, Proximity proximity, double bandwidth_gbps,
                      double latency_us) {
  if (!known(path) || !known(proximity)) {
    return Status::invalid_argument("CostModel::set: path {} at proximity {} (expected path < {}, proximity < {})",
                                    idx(path), idx(proximity), kPathTypeCount, kProximityCount);
  }
  if (!(bandwidth_gbps >= kMinBandwidthGbps && bandwidth_gbps <= kMaxBandwidthGbps)) {
    return Status::invalid_argument("CostModel::set: {} bandwidth {} GB/s (expected {}..{})", to_string(path),
                                    bandwidth_gbps, kMinBandwidthGbps, kMaxBandwidthGbps);
  }
  if (!(latency_us >= 0 && latency_us <= kMaxLatencyUs)) {
    return Status::invalid_argument("CostModel::set: {} latency {} us (expected 0..{})", to_string(path),
                                    latency_us, kMaxLatencyUs);
  }
  table_[idx(path)][idx(proximity)] = {true, bandwidth_gbps, latency_us, true};
  return Status::ok();
}

bool CostModel::priced(PathType path, Proximity proximity) {
  static const CostModel defaults;
  return defaults.cost(path, proximity, 1).has_value() ||
         (path == PathType::kGdr &&
          (proximity == Proximity::kPhb || proximity == Proximity::kNode || proximity == Proximity::kSys));
}

void CostModel::disable(PathType path, Proximity proximity) {
  if (!known(path) || !known(proximity)) return;  // nothing there to disable
  table_[idx(path)][idx(proximity)] = {};
}

}  // namespace baton::topology
