// probe_hwloc on the machine running the tests: whatever the machine, its
// facts must be self-consistent and agree with what the kernel tells this
// process directly.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

int cpus_this_process_may_use() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

// "0-3,8,10-11" → 7; -1 if the text is not a cpu list.
int count_cpu_list(const std::string& list) {
  if (list.empty()) return 0;
  int count = 0;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string range = list.substr(pos, comma - pos);
    const std::size_t dash = range.find('-');
    try {
      const int first = std::stoi(range.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      if (last < first) return -1;
      count += last - first + 1;
    } catch (const std::exception&) {
      return -1;
    }
    pos = comma + 1;
  }
  return count;
}

TEST(CountCpuList, CountsRangesAndSingles) {
  EXPECT_EQ(count_cpu_list("0-3,8,10-11"), 7);
  EXPECT_EQ(count_cpu_list("5"), 1);
  EXPECT_EQ(count_cpu_list(""), 0);
  EXPECT_EQ(count_cpu_list("3-1"), -1);
  EXPECT_EQ(count_cpu_list("a"), -1);
}

class ProbeHwlocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto result = probe_hwloc();
    ASSERT_TRUE(result.has_value()) << result.error().to_string();
    facts_ = *std::move(result);
  }
  TopologyFacts facts_;
};

TEST_F(ProbeHwlocTest, NamesItsSource) { EXPECT_EQ(facts_.source, "hwloc"); }

TEST_F(ProbeHwlocTest, NumaNodesCoverTheCpusThisProcessMayUse) {
  ASSERT_GE(facts_.numa_nodes.size(), 1u);
  const int allowed = cpus_this_process_may_use();
  ASSERT_GT(allowed, 0);
  int sum = 0;
  std::set<int> os_indexes;
  for (const NumaInfo& node : facts_.numa_nodes) {
    EXPECT_GE(node.os_index, 0);
    EXPECT_TRUE(os_indexes.insert(node.os_index).second) << "node " << node.os_index << " twice";
    EXPECT_GE(node.cpu_count, 0);
    // The list and the count describe the same CPUs.
    EXPECT_EQ(count_cpu_list(node.cpus), node.cpu_count) << "node " << node.os_index << ": '"
                                                         << node.cpus << "'";
    sum += node.cpu_count;
  }
  EXPECT_EQ(sum, allowed);
}

TEST_F(ProbeHwlocTest, NodesWithCpusReportTheirMemory) {
  for (const NumaInfo& node : facts_.numa_nodes) {
    // hwloc reads each node's meminfo; a node with CPUs and no memory would be
    // a misread (memory-only nodes are the opposite case and are allowed).
    if (node.cpu_count > 0) {
      EXPECT_GT(node.memory_bytes, 0u) << "node " << node.os_index;
    }
  }
}

TEST_F(ProbeHwlocTest, RelationsNameExistingDevicesOncePerPair) {
  const std::size_t devices = facts_.gpus.size() + facts_.nics.size();
  // Every pair of devices has one relation.
  EXPECT_EQ(facts_.relations.size(), devices * (devices - (devices > 0 ? 1 : 0)) / 2);
  std::set<std::pair<std::pair<int, int>, std::pair<int, int>>> seen;
  for (const Relation& r : facts_.relations) {
    for (const DeviceRef& d : {r.a, r.b}) {
      const std::size_t limit =
          d.kind == DeviceRef::Kind::kGpu ? facts_.gpus.size() : facts_.nics.size();
      EXPECT_GE(d.index, 0);
      EXPECT_LT(static_cast<std::size_t>(d.index), limit);
    }
    EXPECT_FALSE(r.a == r.b);
    EXPECT_EQ(r.nvlinks, 0);  // hwloc sees PCIe, not NVLink
    const auto key = std::minmax(std::pair{static_cast<int>(r.a.kind), r.a.index},
                                 std::pair{static_cast<int>(r.b.kind), r.b.index});
    EXPECT_TRUE(seen.insert(key).second) << "pair stored twice";
  }
}

TEST_F(ProbeHwlocTest, DevicesHaveNamesAndPlausibleNuma) {
  std::set<int> nodes;
  for (const NumaInfo& node : facts_.numa_nodes) nodes.insert(node.os_index);
  std::set<std::string> rdma_functions;
  for (const NicInfo& nic : facts_.nics) {
    EXPECT_FALSE(nic.name.empty());
    EXPECT_TRUE(nic.numa == kUnknownNuma || nodes.contains(nic.numa)) << nic.name << " " << nic.numa;
    if (nic.kind == NicKind::kRdma && !nic.pci_bus_id.empty()) {
      EXPECT_TRUE(rdma_functions.insert(nic.pci_bus_id).second) << nic.name << " " << nic.pci_bus_id;
    }
  }
  // An HCA's netdev (ib0 next to mlx5_0) must not come back as a second NIC.
  for (const NicInfo& nic : facts_.nics) {
    if (nic.kind == NicKind::kEthernet) {
      EXPECT_FALSE(rdma_functions.contains(nic.pci_bus_id)) << nic.name << " " << nic.pci_bus_id;
    }
  }
  for (const GpuInfo& gpu : facts_.gpus) {
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_EQ(gpu.pci_bus_id.size(), 12u) << gpu.pci_bus_id;  // "0000:17:00.0"
    EXPECT_TRUE(gpu.numa == kUnknownNuma || nodes.contains(gpu.numa)) << gpu.pci_bus_id;
  }
}


// A two-socket host as hwloc would export it (lstopo --of xml), trimmed:
// socket 0 has host bridge A with a two-level PCIe switch tree (GPU 13:00.0
// and HCA 14:00.0/.1 on one switch, GPU 17:00.0 one switch further down) and
// an Ethernet NIC on a second root port, and host bridge B with a GeForce
// (plus its audio function), an NVSwitch and an NVIDIA co-processor-class
// function (which hwloc keeps, unlike the other two); socket 1 has GPU 81:00.0.
constexpr const char* kTwoSocketXml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[10-1f]">
        <object type="Bridge" gp_index="21" bridge_type="1-1" depth="1" bridge_pci="0000:[11-18]" pci_busid="0000:10:01.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="Bridge" gp_index="22" bridge_type="1-1" depth="2" bridge_pci="0000:[12-18]" pci_busid="0000:11:00.0" pci_type="0604 [1000:c010] [0000:0000] b0">
            <object type="Bridge" gp_index="23" bridge_type="1-1" depth="3" bridge_pci="0000:[13-13]" pci_busid="0000:12:00.0" pci_type="0604 [1000:c010] [0000:0000] b0">
              <object type="PCIDev" gp_index="24" pci_busid="0000:13:00.0" pci_type="0302 [10de:2335] [10de:18be] a1">
                <info name="PCIDevice" value="GH100 [H200 SXM 141GB]"/>
              </object>
            </object>
            <object type="Bridge" gp_index="25" bridge_type="1-1" depth="3" bridge_pci="0000:[14-14]" pci_busid="0000:12:01.0" pci_type="0604 [1000:c010] [0000:0000] b0">
              <object type="PCIDev" gp_index="26" pci_busid="0000:14:00.0" pci_type="0207 [15b3:1021] [15b3:0023] 00">
                <object type="OSDev" gp_index="27" name="ib0" osdev_type="2"/>
                <object type="OSDev" gp_index="28" name="mlx5_0" osdev_type="3"/>
              </object>
              <object type="PCIDev" gp_index="70" pci_busid="0000:14:00.1" pci_type="0207 [15b3:1021] [15b3:0023] 00">
                <object type="OSDev" gp_index="71" name="mlx5_1" osdev_type="3"/>
                <object type="OSDev" gp_index="72" name="ib1" osdev_type="2"/>
              </object>
            </object>
            <object type="Bridge" gp_index="29" bridge_type="1-1" depth="3" bridge_pci="0000:[15-18]" pci_busid="0000:12:02.0" pci_type="0604 [1000:c010] [0000:0000] b0">
              <object type="Bridge" gp_index="30" bridge_type="1-1" depth="4" bridge_pci="0000:[16-18]" pci_busid="0000:15:00.0" pci_type="0604 [1000:c010] [0000:0000] b0">
                <object type="Bridge" gp_index="31" bridge_type="1-1" depth="5" bridge_pci="0000:[17-17]" pci_busid="0000:16:00.0" pci_type="0604 [1000:c010] [0000:0000] b0">
                  <object type="PCIDev" gp_index="32" pci_busid="0000:17:00.0" pci_type="0302 [10de:2335] [10de:18be] a1"/>
                </object>
              </object>
            </object>
          </object>
        </object>
        <object type="Bridge" gp_index="33" bridge_type="1-1" depth="1" bridge_pci="0000:[1a-1a]" pci_busid="0000:10:02.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="PCIDev" gp_index="34" pci_busid="0000:1a:00.0" pci_type="0200 [8086:1592] [8086:0002] 02">
            <object type="OSDev" gp_index="35" name="eth0" osdev_type="2"/>
          </object>
        </object>
      </object>
      <object type="Bridge" gp_index="40" bridge_type="0-1" depth="0" bridge_pci="0000:[20-2f]">
        <object type="Bridge" gp_index="41" bridge_type="1-1" depth="1" bridge_pci="0000:[21-21]" pci_busid="0000:20:01.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="PCIDev" gp_index="42" pci_busid="0000:21:00.0" pci_type="0300 [10de:2684] [10de:16f3] a1"/>
          <object type="PCIDev" gp_index="43" pci_busid="0000:21:00.1" pci_type="0403 [10de:22ba] [10de:16f3] a1"/>
        </object>
        <object type="Bridge" gp_index="44" bridge_type="1-1" depth="1" bridge_pci="0000:[22-22]" pci_busid="0000:20:02.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="PCIDev" gp_index="45" pci_busid="0000:22:00.0" pci_type="0680 [10de:22a3] [10de:1796] a1"/>
        </object>
        <object type="Bridge" gp_index="46" bridge_type="1-1" depth="1" bridge_pci="0000:[23-23]" pci_busid="0000:20:03.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="PCIDev" gp_index="47" pci_busid="0000:23:00.0" pci_type="0b40 [10de:0001] [10de:0001] a1"/>
        </object>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="50">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="51" local_memory="2147483648"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="52">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="53"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="54">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="55"/>
      </object>
      <object type="Bridge" gp_index="60" bridge_type="0-1" depth="0" bridge_pci="0000:[80-8f]">
        <object type="Bridge" gp_index="61" bridge_type="1-1" depth="1" bridge_pci="0000:[81-81]" pci_busid="0000:80:01.0" pci_type="0604 [8086:2030] [0000:0000] 00">
          <object type="PCIDev" gp_index="62" pci_busid="0000:81:00.0" pci_type="0302 [10de:2335] [10de:18be] a1"/>
        </object>
      </object>
    </object>
  </object>
</topology>
)";

// Points hwloc at an XML file for the life of the object (hwloc's documented
// HWLOC_XMLFILE variable), so that probe_hwloc reads a machine we lack.
class ScopedHwlocXml {
 public:
  explicit ScopedHwlocXml(const std::string& xml)
      : path_(::testing::TempDir() + "baton_hwloc_" + std::to_string(getpid()) + ".xml") {
    if (const char* old = std::getenv("HWLOC_XMLFILE")) previous_ = old;
    // A component list (sanitizer runs set one) would override the XML file.
    if (const char* old = std::getenv("HWLOC_COMPONENTS")) previous_components_ = old;
    unsetenv("HWLOC_COMPONENTS");
    std::ofstream(path_) << xml;
    setenv("HWLOC_XMLFILE", path_.c_str(), 1);
  }
  ~ScopedHwlocXml() {
    if (previous_) {
      setenv("HWLOC_XMLFILE", previous_->c_str(), 1);
    } else {
      unsetenv("HWLOC_XMLFILE");
    }
    if (previous_components_) setenv("HWLOC_COMPONENTS", previous_components_->c_str(), 1);
    std::remove(path_.c_str());
  }
  ScopedHwlocXml(const ScopedHwlocXml&) = delete;
  ScopedHwlocXml& operator=(const ScopedHwlocXml&) = delete;

 private:
  std::string path_;
  std::optional<std::string> previous_;
  std::optional<std::string> previous_components_;
};

TEST(ProbeHwlocXml, ClassifiesEveryPairOnATwoSocketTree) {
  Result<TopologyFacts> facts;
  {
    const ScopedHwlocXml xml(kTwoSocketXml);
    facts = probe_hwloc();
  }
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();

  ASSERT_EQ(facts->numa_nodes.size(), 2u);
  EXPECT_EQ(facts->numa_nodes[0].os_index, 0);
  EXPECT_EQ(facts->numa_nodes[0].cpus, "0-1");
  EXPECT_EQ(facts->numa_nodes[0].cpu_count, 2);
  EXPECT_EQ(facts->numa_nodes[0].memory_bytes, 1073741824u);
  EXPECT_EQ(facts->numa_nodes[1].cpus, "2-3");
  EXPECT_EQ(facts->numa_nodes[1].memory_bytes, 2147483648u);

  // NVIDIA display/3D functions only: not the audio function, the NVSwitch
  // or the co-processor.
  ASSERT_EQ(facts->gpus.size(), 4u);
  const std::vector<std::string> gpu_ids = {"0000:13:00.0", "0000:17:00.0", "0000:21:00.0",
                                            "0000:81:00.0"};
  const std::vector<int> gpu_numa = {0, 0, 0, 1};
  for (std::size_t i = 0; i < gpu_ids.size(); ++i) {
    EXPECT_EQ(facts->gpus[i].pci_bus_id, gpu_ids[i]);
    EXPECT_EQ(facts->gpus[i].numa, gpu_numa[i]) << gpu_ids[i];
  }
  EXPECT_EQ(facts->gpus[0].name, "GH100 [H200 SXM 141GB]");  // from the PCIDevice info
  EXPECT_EQ(facts->gpus[1].name, "NVIDIA GPU");
  EXPECT_EQ(facts->gpus[3].cpu_affinity, "2-3");

  // ib0 and ib1 are the HCA's netdevs: the same functions as mlx5_0/1.
  ASSERT_EQ(facts->nics.size(), 3u);
  EXPECT_EQ(facts->nics[0].name, "mlx5_0");
  EXPECT_EQ(facts->nics[0].pci_bus_id, "0000:14:00.0");
  EXPECT_EQ(facts->nics[0].kind, NicKind::kRdma);
  EXPECT_EQ(facts->nics[1].name, "mlx5_1");
  EXPECT_EQ(facts->nics[1].pci_bus_id, "0000:14:00.1");
  EXPECT_EQ(facts->nics[2].name, "eth0");
  EXPECT_EQ(facts->nics[2].kind, NicKind::kEthernet);
  for (const NicInfo& nic : facts->nics) EXPECT_EQ(nic.numa, 0) << nic.name;

  auto name = [&](DeviceRef d) {
    return d.kind == DeviceRef::Kind::kGpu ? "GPU" + std::to_string(d.index)
                                           : facts->nics[d.index].name;
  };
  std::map<std::string, std::string> got;
  for (const Relation& r : facts->relations) {
    got[name(r.a) + "-" + name(r.b)] = to_string(r.pci);
  }
  const std::map<std::string, std::string> want = {
      {"GPU0-GPU1", "PXB"},     {"GPU0-GPU2", "NODE"},    {"GPU0-GPU3", "SYS"},
      {"GPU0-mlx5_0", "PIX"},   {"GPU0-mlx5_1", "PIX"},   {"GPU0-eth0", "PHB"},
      {"GPU1-GPU2", "NODE"},    {"GPU1-GPU3", "SYS"},     {"GPU1-mlx5_0", "PXB"},
      {"GPU1-mlx5_1", "PXB"},   {"GPU1-eth0", "PHB"},     {"GPU2-GPU3", "SYS"},
      {"GPU2-mlx5_0", "NODE"},  {"GPU2-mlx5_1", "NODE"},  {"GPU2-eth0", "NODE"},
      {"GPU3-mlx5_0", "SYS"},   {"GPU3-mlx5_1", "SYS"},   {"GPU3-eth0", "SYS"},
      {"mlx5_0-mlx5_1", "PIX"}, {"mlx5_0-eth0", "PHB"},   {"mlx5_1-eth0", "PHB"},
  };
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace baton::topology
