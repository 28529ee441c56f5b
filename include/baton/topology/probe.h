// Probes: where TopologyFacts come from. probe_machine() tries the sources
// from richest to poorest (NVML → CUDA → `nvidia-smi topo -m` → hwloc) and
// merges what it finds with hwloc's view of the host; each skipped source
// leaves a note saying why. Synthetic models stand in for machines we lack.
#pragma once

#include <chrono>

#include <string>
#include <string_view>
#include <vector>

#include "baton/common/status.h"
#include "baton/topology/facts.h"

namespace baton::topology {

// Parses the text of `nvidia-smi topo -m` (or `-mp`): GPU and NIC rows and
// columns, X/SYS/NODE/PHB/PXB/PIX/NV#, CPU/NUMA affinity and GPU NUMA ID
// columns, tabs or spaces, ANSI escapes, CRLF, with or without legends.
// Text that is not such a matrix → invalid_argument naming the line.
[[nodiscard]] Result<TopologyFacts> parse_nvidia_smi_topo(std::string_view text);

// Reads `path` (a file, a pipe, or "-" for standard input; at most 16 MiB)
// and parses it as above; unreadable → not_found/unavailable.
[[nodiscard]] Result<TopologyFacts> load_nvidia_smi_topo(const std::string& path);

// Runs `nvidia-smi topo -m` on this machine; unavailable when the command is
// missing or fails, prints more than 16 MiB, or has not ended within
// `timeout` (a wedged driver): it is then killed, with its children.
[[nodiscard]] Result<TopologyFacts> probe_nvidia_smi(std::chrono::milliseconds timeout = std::chrono::seconds(10));

// NVML, loaded with dlopen("libnvidia-ml.so.1") at run time (never linked).
// unavailable when the library or a GPU is missing.
[[nodiscard]] Result<TopologyFacts> probe_nvml();

// CUDA runtime (cudaDeviceCanAccessPeer, PCI bus ids); unavailable in a build
// without CUDA or on a machine without a GPU.
[[nodiscard]] Result<TopologyFacts> probe_cuda();

// hwloc: this machine's NUMA nodes, CPUs, NVIDIA GPUs seen on PCI, network
// and OpenFabrics devices, and the PCIe locality between those devices.
[[nodiscard]] Result<TopologyFacts> probe_hwloc();

// This machine, from the best source available, merged with hwloc.
[[nodiscard]] Result<TopologyFacts> probe_machine();

// Whether this machine has NUMA node `node` (/sys/devices/system/node).
[[nodiscard]] bool has_numa_node(int node);

// Synthetic machines: "nvswitch8", "pcie4", "nvlink-pairs".
[[nodiscard]] std::vector<std::string> model_names();
[[nodiscard]] Result<TopologyFacts> load_model(std::string_view name);

}  // namespace baton::topology
