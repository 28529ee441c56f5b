#include "engine/nic_choice.h"

#include <sched.h>

#include <filesystem>
#include <string_view>

namespace baton::engine {

std::vector<std::string> rail_nics(const topology::TopologyFacts& facts, int numa) {
  constexpr std::size_t kMaxRails = 8;  // UcxConfig::nics' bound
  bool rdma = false;
  for (const topology::NicInfo& nic : facts.nics) rdma = rdma || nic.kind == topology::NicKind::kRdma;
  const auto kind = rdma ? topology::NicKind::kRdma : topology::NicKind::kEthernet;
  bool local = false;
  for (const topology::NicInfo& nic : facts.nics) local = local || (nic.kind == kind && nic.numa == numa);
  std::vector<std::string> out;
  for (const topology::NicInfo& nic : facts.nics) {
    if (nic.kind != kind || (local && nic.numa != numa) || nic.name.empty() || out.size() == kMaxRails) continue;
    out.push_back(rdma ? nic.name + ":1" : nic.name);
  }
  return out;
}

int current_numa_node() {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return -1;
  std::error_code ec;
  const std::filesystem::path dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("node") && name.size() > 4 && name.find_first_not_of("0123456789", 4) == std::string::npos) {
      return std::stoi(name.substr(4));
    }
  }
  return -1;
}

}  // namespace baton::engine
