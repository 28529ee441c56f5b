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
};

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
