// NVML probe: GPUs, their PCI ids and NVLinks, read from the driver through
// libnvidia-ml.so.1 loaded with dlopen, so that Baton never needs NVML (or a
// GPU) at link time. The driver's answers go into an NvmlSnapshot first;
// facts_from_nvml turns a snapshot into facts, testable without a GPU.
#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "baton/topology/probe.h"
#include "topology/sysfs.h"
#include "topology/nvml_snapshot.h"

namespace baton::topology {
namespace {

// ---- The part of NVML's C API we use --------------------------------------
// nvml.h is not installed where Baton builds, so the few types and signatures
// are declared here, copied in meaning from nvml.h (NVML API Reference,
// "Initialization and Cleanup", "Device Queries" and "NvLink Methods").
// Only plain C types cross the boundary: NVML's enums are int-sized.

using NvmlReturn = int;                      // nvmlReturn_t
using NvmlDevice = struct NvmlDeviceOpaque*;  // nvmlDevice_t (opaque handle)
using NvmlEnableState = int;                 // nvmlEnableState_t
using NvmlNvLinkDeviceType = int;            // nvmlIntNvLinkDeviceType_t

constexpr NvmlReturn kNvmlSuccess = 0;            // NVML_SUCCESS
constexpr NvmlEnableState kNvmlFeatureEnabled = 1;  // NVML_FEATURE_ENABLED
// NVML_NVLINK_MAX_LINKS: 18 since Hopper (NVLink 4); older GPUs answer
// NOT_SUPPORTED / INVALID_ARGUMENT for the slots they lack.
constexpr unsigned kNvmlNvLinkMaxLinks = 18;
// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
constexpr unsigned kNvmlNameBufferSize = 96;
constexpr unsigned kNvmlUuidBufferSize = 96;
// nvmlIntNvLinkDeviceType_t.
constexpr NvmlNvLinkDeviceType kNvLinkDeviceGpu = 0x00;
constexpr NvmlNvLinkDeviceType kNvLinkDeviceIbmNpu = 0x01;
constexpr NvmlNvLinkDeviceType kNvLinkDeviceSwitch = 0x02;

// nvmlPciInfo_t, the layout used by nvmlDeviceGetPciInfo_v3 and
// nvmlDeviceGetNvLinkRemotePciInfo_v2.
struct NvmlPciInfo {
  char bus_id_legacy[16];  // busIdLegacy: "0000:17:00.0"
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];  // busId: "00000000:17:00.0"
};
static_assert(sizeof(NvmlPciInfo) == 68, "nvmlPciInfo_t is 16 + 5*4 + 32 bytes");

constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// One pointer per NVML entry point, named after it.
struct NvmlApi {
  NvmlReturn (*init)() = nullptr;                                   // nvmlInit_v2
  NvmlReturn (*shutdown)() = nullptr;                               // nvmlShutdown
  NvmlReturn (*get_count)(unsigned*) = nullptr;                     // nvmlDeviceGetCount_v2
  NvmlReturn (*get_handle)(unsigned, NvmlDevice*) = nullptr;        // nvmlDeviceGetHandleByIndex_v2
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned) = nullptr;    // nvmlDeviceGetName
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned) = nullptr;    // nvmlDeviceGetUUID
  NvmlReturn (*get_pci_info)(NvmlDevice, NvmlPciInfo*) = nullptr;   // nvmlDeviceGetPciInfo_v3 or _v2
  // nvmlDeviceGetNvLinkState
  NvmlReturn (*get_nvlink_state)(NvmlDevice, unsigned, NvmlEnableState*) = nullptr;
  // nvmlDeviceGetNvLinkRemotePciInfo_v2
  NvmlReturn (*get_nvlink_remote_pci)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  // Optional: absent from older drivers.
  const char* (*error_string)(NvmlReturn) = nullptr;                // nvmlErrorString
  NvmlReturn (*get_numa_node_id)(NvmlDevice, unsigned*) = nullptr;  // nvmlDeviceGetNumaNodeId
  // nvmlDeviceGetNvLinkRemoteDeviceType
  NvmlReturn (*get_nvlink_remote_type)(NvmlDevice, unsigned, NvmlNvLinkDeviceType*) = nullptr;
  NvmlReturn (*get_architecture)(NvmlDevice, unsigned*) = nullptr;  // nvmlDeviceGetArchitecture
};

template <typename Fn>
bool load_symbol(void* library, const char* symbol, Fn*& out) {
  out = reinterpret_cast<Fn*>(dlsym(library, symbol));
  return out != nullptr;
}

Result<NvmlApi> load_nvml_api(void* library) {
  NvmlApi api;
  auto require = [&](const char* symbol, auto*& out) -> Status {
    if (load_symbol(library, symbol, out)) return Status::ok();
    return Status::unavailable("nvml: {} has no symbol {} (driver too old?)", kNvmlLibrary, symbol);
  };
  for (Status s : {require("nvmlInit_v2", api.init), require("nvmlShutdown", api.shutdown),
                   require("nvmlDeviceGetCount_v2", api.get_count),
                   require("nvmlDeviceGetHandleByIndex_v2", api.get_handle),
                   require("nvmlDeviceGetName", api.get_name),
                   require("nvmlDeviceGetUUID", api.get_uuid),
                   require("nvmlDeviceGetNvLinkState", api.get_nvlink_state),
                   require("nvmlDeviceGetNvLinkRemotePciInfo_v2", api.get_nvlink_remote_pci)}) {
    if (!s.is_ok()) return std::unexpected(std::move(s));
  }
  // _v3 fills busId with the 8-digit domain; _v2 has the same layout.
  if (!load_symbol(library, "nvmlDeviceGetPciInfo_v3", api.get_pci_info) &&
      !load_symbol(library, "nvmlDeviceGetPciInfo_v2", api.get_pci_info)) {
    return std::unexpected(Status::unavailable(
        "nvml: {} has neither nvmlDeviceGetPciInfo_v3 nor _v2 (driver too old?)", kNvmlLibrary));
  }
  load_symbol(library, "nvmlErrorString", api.error_string);
  load_symbol(library, "nvmlDeviceGetNumaNodeId", api.get_numa_node_id);
  load_symbol(library, "nvmlDeviceGetNvLinkRemoteDeviceType", api.get_nvlink_remote_type);
  load_symbol(library, "nvmlDeviceGetArchitecture", api.get_architecture);
  return api;
}

std::string describe(const NvmlApi& api, NvmlReturn rc) {
  const char* text = api.error_string != nullptr ? api.error_string(rc) : nullptr;
  return text != nullptr ? fmt::format("{} (NVML error {})", text, rc)
                         : fmt::format("NVML error {}", rc);
}

// Calls nvmlShutdown when the probe leaves, whatever the path out.
class NvmlSession {
 public:
  explicit NvmlSession(const NvmlApi& api) : api_(api) {}
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;
  ~NvmlSession() { api_.shutdown(); }

 private:
  const NvmlApi& api_;
};

// NVML writes NUL-terminated strings into fixed buffers; never trust that the
// NUL is there.
std::string from_buffer(const char* buffer, std::size_t size) {
  return {buffer, std::find(buffer, buffer + size, '\0')};
}

std::optional<std::string> pci_id_of(const NvmlPciInfo& info) {
  for (std::string raw : {from_buffer(info.bus_id, sizeof(info.bus_id)),
                          from_buffer(info.bus_id_legacy, sizeof(info.bus_id_legacy))}) {
    if (auto id = normalize_pci_bus_id(raw)) return *std::move(id);
  }
  return std::nullopt;
}

// What is at the far end of a link, when the driver says.
enum class RemoteKind : std::uint8_t { kGpu, kCpu, kSwitch, kUnknown };

struct ProbedGpu {
  NvmlGpu gpu;
  std::vector<RemoteKind> remote_kinds;  // parallel to gpu.links
  std::optional<int> gpu_numa_id;
};

void probe_links(const NvmlApi& api, NvmlDevice device, ProbedGpu& out) {
  for (unsigned link = 0; link < kNvmlNvLinkMaxLinks; ++link) {
    NvmlEnableState state = 0;
    // A slot the GPU lacks (or a GPU without NVLink) answers an error: no link.
    if (api.get_nvlink_state(device, link, &state) != kNvmlSuccess) continue;
    NvmlLink nvlink;
    nvlink.active = state == kNvmlFeatureEnabled;
    RemoteKind kind = RemoteKind::kUnknown;
    if (nvlink.active) {
      NvmlNvLinkDeviceType type = -1;
      if (api.get_nvlink_remote_type != nullptr &&
          api.get_nvlink_remote_type(device, link, &type) == kNvmlSuccess) {
        kind = type == kNvLinkDeviceGpu      ? RemoteKind::kGpu
               : type == kNvLinkDeviceIbmNpu ? RemoteKind::kCpu
               : type == kNvLinkDeviceSwitch ? RemoteKind::kSwitch
                                             : RemoteKind::kUnknown;
      }
      // Hopper's NVSwitches are not on the host's PCI bus, so their remote PCI
      // query may fail or return junk; the empty id then means "not a GPU".
      NvmlPciInfo remote{};
      if (kind != RemoteKind::kSwitch &&
          api.get_nvlink_remote_pci(device, link, &remote) == kNvmlSuccess) {
        nvlink.remote_pci_bus_id = pci_id_of(remote).value_or("");
      }
    }
    out.gpu.links.push_back(std::move(nvlink));
    out.remote_kinds.push_back(kind);
  }
}

// Links that facts_from_nvml would misread as NVSwitch links, because their
// far end is not a GPU of the snapshot: a POWER9 CPU (NVLink to the host), or
// a GPU this process cannot open (a container's device cgroup hides it).
// Neither is a path between two GPUs we can use, so they are left out.
void drop_links_to_unusable_peers(std::vector<ProbedGpu>& gpus) {
  std::unordered_set<std::string> known;
  for (const ProbedGpu& g : gpus) known.insert(g.gpu.pci_bus_id);
  for (ProbedGpu& g : gpus) {
    std::vector<NvmlLink> kept;
    for (std::size_t l = 0; l < g.gpu.links.size(); ++l) {
      const NvmlLink& link = g.gpu.links[l];
      const RemoteKind kind = g.remote_kinds[l];
      if (link.active && kind == RemoteKind::kCpu) continue;
      if (link.active && kind == RemoteKind::kGpu && !known.contains(link.remote_pci_bus_id)) {
        continue;
      }
      kept.push_back(link);
    }
    g.gpu.links = std::move(kept);
  }
}

bool is_hex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

unsigned parse_hex(std::string_view s) {
  unsigned value = 0;
  std::from_chars(s.data(), s.data() + s.size(), value, 16);
  return value;
}

}  // namespace

Result<std::string> normalize_pci_bus_id(std::string_view id) {
  auto bad = [&](std::string_view why) {
    return std::unexpected(Status::invalid_argument(
        "normalize_pci_bus_id: '{}' is not a PCI bus id ({}; expected "
        "[domain:]bus:device.function, e.g. 0000:17:00.0)",
        id, why));
  };
  // Split "[domain:]bus:device.function".
  const std::size_t last_colon = id.rfind(':');
  if (last_colon == std::string_view::npos) return bad("no ':'");
  std::string_view head = id.substr(0, last_colon);
  const std::string_view device_function = id.substr(last_colon + 1);
  std::string_view domain = "0";
  std::string_view bus = head;
  if (const std::size_t colon = head.find(':'); colon != std::string_view::npos) {
    domain = head.substr(0, colon);
    bus = head.substr(colon + 1);
  }
  // NVML writes 8 domain digits, Linux at least 4; 32 bits is the limit.
  if (!is_hex(domain) || domain.size() > 8) return bad("bad domain");
  if (bus.size() != 2 || !is_hex(bus)) return bad("bus must be 2 hex digits");
  if (device_function.size() != 4 || device_function[2] != '.') {
    return bad("device.function must look like 00.0");
  }
  const std::string_view device = device_function.substr(0, 2);
  const char function = device_function[3];
  if (!is_hex(device) || parse_hex(device) > 0x1f) return bad("device must be 00-1f");
  if (function < '0' || function > '7') return bad("function must be 0-7");
  return fmt::format("{:04x}:{:02x}:{:02x}.{}", parse_hex(domain), parse_hex(bus),
                     parse_hex(device), function);
}

double nvlink_gbps_for_architecture(unsigned architecture) {
  switch (architecture) {
    case 4: return 20.0;                            // Pascal (P100): NVLink 1
    case 5: case 6: case 7: case 9: return 25.0;    // Volta, Turing, Ampere, Hopper: NVLink 2-4
    case 10: return 50.0;                           // Blackwell: NVLink 5
    default: return 0.0;                            // Ada (none), or unknown to this table
  }
}

Result<TopologyFacts> facts_from_nvml(const NvmlSnapshot& snapshot) {
  const std::size_t n = snapshot.gpus.size();
  TopologyFacts facts;
  facts.source = "nvml";

  std::unordered_map<std::string, int> index_of;  // normalised PCI id → GPU
  for (std::size_t i = 0; i < n; ++i) {
    const NvmlGpu& gpu = snapshot.gpus[i];
    auto id = normalize_pci_bus_id(gpu.pci_bus_id);
    if (!id) {
      return std::unexpected(Status::invalid_argument("facts_from_nvml: GPU {}: {}", i,
                                                      id.error().message()));
    }
    auto [it, inserted] = index_of.emplace(*id, static_cast<int>(i));
    if (!inserted) {
      return std::unexpected(Status::invalid_argument(
          "facts_from_nvml: GPU {} and GPU {} share PCI bus id {}", it->second, i, *id));
    }
    GpuInfo info;
    info.name = gpu.name.empty() ? fmt::format("GPU{}", i) : gpu.name;
    info.pci_bus_id = *id;
    info.uuid = gpu.uuid;
    info.numa = gpu.numa;
    info.nvlink_gbps_per_link = nvlink_gbps_for_architecture(gpu.architecture);
    facts.gpus.push_back(std::move(info));
  }

  // direct[i][j]: active links from GPU i whose far end is GPU j.
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<int> switch_links(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    for (const NvmlLink& link : snapshot.gpus[i].links) {
      if (!link.active) continue;
      ++facts.gpus[i].nvlink_active;
      if (link.remote_pci_bus_id.empty()) {  // the driver could not name it
        ++switch_links[i];
        continue;
      }
      auto remote = normalize_pci_bus_id(link.remote_pci_bus_id);
      if (!remote) {
        return std::unexpected(Status::invalid_argument("facts_from_nvml: GPU {} link remote: {}",
                                                        i, remote.error().message()));
      }
      auto peer = index_of.find(*remote);
      if (peer == index_of.end()) {
        ++switch_links[i];
      } else if (peer->second != static_cast<int>(i)) {  // a loopback joins no pair
        ++direct[i][peer->second];
      }
    }
  }

  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      // Both ends see the same cables; if one end could not name its remote,
      // the other end's count is the better evidence.
      const int direct_links = std::max(direct[i][j], direct[j][i]);
      // Traffic between two GPUs on the fabric is striped over every link each
      // has to the switches, so the narrower side bounds it.
      const int fabric_links = std::min(switch_links[i], switch_links[j]);
      if (direct_links + fabric_links == 0) continue;
      Relation r;
      r.a = {DeviceRef::Kind::kGpu, static_cast<int>(i)};
      r.b = {DeviceRef::Kind::kGpu, static_cast<int>(j)};
      r.pci = PciLocality::kUnknown;  // hwloc supplies PCIe locality
      r.nvlinks = direct_links + fabric_links;
      r.via_nvswitch = fabric_links > 0;
      facts.relations.push_back(r);
    }
  }
  return facts;
}

Result<TopologyFacts> probe_nvml() {
  dlerror();  // clear a stale error so the text below is this call's
  void* handle = dlopen(kNvmlLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return std::unexpected(Status::unavailable("nvml: {} not found ({})", kNvmlLibrary,
                                               error != nullptr ? error : "no dlerror text"));
  }
  const std::unique_ptr<void, int (*)(void*)> library(handle, &dlclose);

  auto api = load_nvml_api(handle);
  if (!api) return std::unexpected(api.error());
  if (NvmlReturn rc = api->init(); rc != kNvmlSuccess) {
    return std::unexpected(Status::unavailable("nvml: nvmlInit_v2 failed: {}", describe(*api, rc)));
  }
  const NvmlSession session(*api);

  unsigned count = 0;
  if (NvmlReturn rc = api->get_count(&count); rc != kNvmlSuccess) {
    return std::unexpected(
        Status::unavailable("nvml: nvmlDeviceGetCount_v2 failed: {}", describe(*api, rc)));
  }
  if (count == 0) return std::unexpected(Status::unavailable("nvml: the driver reports no GPU"));

  std::vector<std::string> notes;
  std::vector<ProbedGpu> probed;
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice device = nullptr;
    // A GPU that is lost or that this process may not open is skipped, not
    // fatal: the others are still worth knowing.
    if (NvmlReturn rc = api->get_handle(i, &device); rc != kNvmlSuccess) {
      notes.push_back(fmt::format("nvml: GPU {} skipped: nvmlDeviceGetHandleByIndex_v2: {}", i,
                                  describe(*api, rc)));
      continue;
    }
    NvmlPciInfo pci{};
    if (NvmlReturn rc = api->get_pci_info(device, &pci); rc != kNvmlSuccess) {
      notes.push_back(fmt::format("nvml: GPU {} skipped: nvmlDeviceGetPciInfo: {}", i,
                                  describe(*api, rc)));
      continue;
    }
    const std::optional<std::string> pci_id = pci_id_of(pci);
    if (!pci_id) {
      notes.push_back(fmt::format("nvml: GPU {} skipped: unreadable PCI bus id '{}'", i,
                                  from_buffer(pci.bus_id, sizeof(pci.bus_id))));
      continue;
    }

    ProbedGpu g;
    g.gpu.pci_bus_id = *pci_id;
    char name[kNvmlNameBufferSize] = {};
    if (api->get_name(device, name, sizeof(name)) == kNvmlSuccess) {
      g.gpu.name = from_buffer(name, sizeof(name));
    }
    char uuid[kNvmlUuidBufferSize] = {};
    if (api->get_uuid(device, uuid, sizeof(uuid)) == kNvmlSuccess) {
      g.gpu.uuid = from_buffer(uuid, sizeof(uuid));
    }
    // nvmlDeviceGetNumaNodeId names the GPU's *own* memory node (Grace:
    // coherent HBM onlined as a NUMA node), not where the GPU is attached;
    // the attachment comes from the kernel's view of the PCI device.
    g.gpu.numa = read_sysfs_numa_node(*pci_id);
    unsigned gpu_node = 0;
    if (api->get_numa_node_id != nullptr &&
        api->get_numa_node_id(device, &gpu_node) == kNvmlSuccess) {
      g.gpu_numa_id = static_cast<int>(gpu_node);
    }
    unsigned architecture = 0;
    if (api->get_architecture != nullptr && api->get_architecture(device, &architecture) == kNvmlSuccess) {
      g.gpu.architecture = architecture;
    }
    probe_links(*api, device, g);
    probed.push_back(std::move(g));
  }
  if (probed.empty()) {
    return std::unexpected(Status::unavailable("nvml: none of the {} GPUs could be read ({})",
                                               count, fmt::join(notes, "; ")));
  }

  drop_links_to_unusable_peers(probed);
  NvmlSnapshot snapshot;
  for (const ProbedGpu& g : probed) snapshot.gpus.push_back(g.gpu);
  auto facts = facts_from_nvml(snapshot);
  if (!facts) {
    return std::unexpected(Status::internal("nvml: the driver's answers are inconsistent: {}",
                                            facts.error().message()));
  }
  // facts_from_nvml keeps the snapshot's GPU order.
  for (std::size_t i = 0; i < probed.size(); ++i) facts->gpus[i].gpu_numa_id = probed[i].gpu_numa_id;
  facts->notes = std::move(notes);
  return facts;
}

}  // namespace baton::topology
