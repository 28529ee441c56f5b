#include "engine/nic_choice.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace baton::engine {
namespace {

topology::NicInfo nic(std::string name, int numa, topology::NicKind kind) {
  return {std::move(name), "", numa, kind};
}

TEST(RailNics, RdmaNicsOfTheNumaNodeFirstWithTheirPort) {
  using topology::NicKind;
  topology::TopologyFacts f;
  f.nics = {nic("eth0", 0, NicKind::kEthernet), nic("mlx5_0", 0, NicKind::kRdma), nic("mlx5_1", 1, NicKind::kRdma),
            nic("mlx5_2", 0, NicKind::kRdma)};
  EXPECT_EQ(rail_nics(f, 0), (std::vector<std::string>{"mlx5_0:1", "mlx5_2:1"}));
  EXPECT_EQ(rail_nics(f, 1), (std::vector<std::string>{"mlx5_1:1"}));
  // Unknown node, or one without NICs: all of them.
  EXPECT_EQ(rail_nics(f, -1), (std::vector<std::string>{"mlx5_0:1", "mlx5_1:1", "mlx5_2:1"}));
  EXPECT_EQ(rail_nics(f, 7), (std::vector<std::string>{"mlx5_0:1", "mlx5_1:1", "mlx5_2:1"}));
}

TEST(RailNics, EthernetOnlyWithoutRdmaAndAtMostEight) {
  using topology::NicKind;
  topology::TopologyFacts f;
  EXPECT_TRUE(rail_nics(f, 0).empty());
  f.nics = {nic("eth0", 0, NicKind::kEthernet), nic("eth1", 0, NicKind::kEthernet), nic("", 0, NicKind::kEthernet)};
  EXPECT_EQ(rail_nics(f, 0), (std::vector<std::string>{"eth0", "eth1"}));  // a nameless NIC is no device
  f.nics.clear();
  for (int i = 0; i < 10; ++i) f.nics.push_back(nic("mlx5_" + std::to_string(i), 0, NicKind::kRdma));
  EXPECT_EQ(rail_nics(f, 0).size(), 8u);
}

TEST(RailNics, TheCurrentNumaNodeIsOneOfThisMachines) {
  const int node = current_numa_node();
  EXPECT_GE(node, -1);
  if (node >= 0) {
    EXPECT_TRUE(std::filesystem::exists("/sys/devices/system/node/node" + std::to_string(node)));
  }
}

}  // namespace
}  // namespace baton::engine
