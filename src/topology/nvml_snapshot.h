// What the NVML probe reads from the driver, kept apart from the dlopen calls
// so that the inference below (direct NVLink vs NVSwitch fabric) is testable
// on machines without a GPU. Private to topology/.
#pragma once

#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/topology/facts.h"

namespace baton::topology {

struct NvmlLink {
  bool active = false;
  std::string remote_pci_bus_id;  // normalised like GpuInfo::pci_bus_id
};

struct NvmlGpu {
  std::string name;
  std::string uuid;
  std::string pci_bus_id;  // normalised: "0000:17:00.0"
  int numa = kUnknownNuma;
  std::vector<NvmlLink> links;  // one per NVLink slot the device has
  unsigned architecture = 0;    // nvmlDeviceArchitecture_t (Hopper 9, Blackwell 10); 0: unknown
};

// One NVLink's GB/s per direction for an nvmlDeviceArchitecture_t: Pascal's
// NVLink 1 20, Volta to Hopper (NVLink 2-4) 25, Blackwell's NVLink 5 50; 0
// for an architecture without NVLink or one this table does not know. (The
// per-link nvmlDeviceGetNvLinkVersion is not used: drivers answer NVLink 5
// for H100.)
[[nodiscard]] double nvlink_gbps_for_architecture(unsigned architecture);

struct NvmlSnapshot {
  std::vector<NvmlGpu> gpus;
};

// Facts from a snapshot. An active link whose remote PCI id is another GPU is
// a direct NVLink (bonded links counted per peer). On an NVSwitch fabric the
// remote id is the switch, not a peer, so GPUs with such links are joined
// all-to-all via the fabric, at the smaller of the two active link counts.
[[nodiscard]] Result<TopologyFacts> facts_from_nvml(const NvmlSnapshot& snapshot);

// "00000000:17:00.0" (NVML's 8-digit domain), "0000:17:00.0" or "17:00.0" →
// "0000:17:00.0", lower case. Anything else → invalid_argument.
[[nodiscard]] Result<std::string> normalize_pci_bus_id(std::string_view id);

}  // namespace baton::topology
