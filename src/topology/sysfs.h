// Reading the kernel's view of PCI devices. Private to topology/.
#pragma once

#include <fstream>
#include <string>

#include "baton/topology/facts.h"

namespace baton::topology {

// The NUMA node the kernel attributes a PCI device to; -1 there (no NUMA, or
// a firmware that does not say) and an unreadable file both mean unknown.
inline int read_sysfs_numa_node(const std::string& pci_bus_id) {
  std::ifstream file("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = kUnknownNuma;
  if (!(file >> node) || node < 0) return kUnknownNuma;
  return node;
}

}  // namespace baton::topology
