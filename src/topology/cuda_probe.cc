// CUDA probe: the GPUs the CUDA runtime sees, their PCI ids and which pairs
// the driver lets access each other's memory (P2P). Poorer than NVML (no
// NVLink counts) but present wherever CUDA is. Compiled in every build; in a
// build without CUDA it only says so.
#include <string>

#include "baton/topology/probe.h"
#include "topology/sysfs.h"

#ifdef BATON_WITH_CUDA
#include <cuda_runtime_api.h>

#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "topology/nvml_snapshot.h"  // normalize_pci_bus_id
#endif

namespace baton::topology {

#ifdef BATON_WITH_CUDA
namespace {

std::string describe(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

// The device's PCI id, from the runtime's string or, failing that, from the
// numeric properties (the function number is not among them: 0).
std::string pci_bus_id_of(int device, const cudaDeviceProp& prop) {
  char raw[32] = {};
  if (cudaDeviceGetPCIBusId(raw, sizeof(raw), device) == cudaSuccess) {
    if (auto id = normalize_pci_bus_id(raw)) return *std::move(id);
  }
  return fmt::format("{:04x}:{:02x}:{:02x}.0", static_cast<unsigned>(prop.pciDomainID),
                     static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
}

}  // namespace
#endif

Result<TopologyFacts> probe_cuda() {
#ifndef BATON_WITH_CUDA
  return std::unexpected(Status::unavailable("cuda: built without CUDA (BATON_WITH_CUDA=OFF)"));
#else
  // Note: the runtime shows only the GPUs CUDA_VISIBLE_DEVICES lets through,
  // numbered as this process sees them.
  int count = 0;
  if (cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return std::unexpected(
        Status::unavailable("cuda: cudaGetDeviceCount failed: {}", describe(error)));
  }
  if (count <= 0) return std::unexpected(Status::unavailable("cuda: the runtime reports no GPU"));

  TopologyFacts facts;
  facts.source = "cuda";
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaError_t error = cudaGetDeviceProperties(&prop, d); error != cudaSuccess) {
      return std::unexpected(Status::unavailable("cuda: cudaGetDeviceProperties({}) failed: {}",
                                                 d, describe(error)));
    }
    GpuInfo gpu;
    gpu.name = prop.name[0] != '\0' ? std::string(prop.name) : fmt::format("GPU{}", d);
    gpu.pci_bus_id = pci_bus_id_of(d, prop);
    gpu.numa = read_sysfs_numa_node(gpu.pci_bus_id);
    facts.gpus.push_back(std::move(gpu));
  }

  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      int i_to_j = 0;
      int j_to_i = 0;
      // A relation is used both ways, so it needs P2P both ways.
      if (cudaDeviceCanAccessPeer(&i_to_j, i, j) != cudaSuccess ||
          cudaDeviceCanAccessPeer(&j_to_i, j, i) != cudaSuccess || i_to_j == 0 || j_to_i == 0) {
        continue;
      }
      Relation r;
      r.a = {DeviceRef::Kind::kGpu, i};
      r.b = {DeviceRef::Kind::kGpu, j};
      r.pci = PciLocality::kUnknown;  // CUDA does not say how; hwloc does
      r.peer_access = true;
      facts.relations.push_back(r);
    }
  }
  return facts;
#endif
}

}  // namespace baton::topology
