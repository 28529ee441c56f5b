// The Harness's configuration: where its topology comes from.
#include "baton/engine/harness.h"

#include <gtest/gtest.h>

namespace baton::engine {
namespace {

std::string topo_file(const std::string& name) {
  return std::string(BATON_TEST_DATA_DIR) + "/nvidia-smi-topo/" + name;
}

// The harness has a model by default (nvswitch8, 8 GPUs); a file given
// beside it was ignored without a word. It now replaces the model, as a
// policy file replaces the policy, and its errors come back from create().
TEST(Harness, ATopologyFileReplacesTheModel) {
  HarnessConfig config;
  ASSERT_FALSE(config.topology_model.empty());
  config.topology_file = topo_file("della-a100-2gpu-pcie.txt");
  auto e = Harness::create(config);
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ((*e)->topology().nodes_of(topology::NodeKind::kGpu).size(), 2u);
  EXPECT_NE((*e)->topology().find("nic1"), nullptr);
  EXPECT_EQ((*e)->topology().find("nvswitch0"), nullptr);

  config.topology_file = topo_file("no-such-file.txt");
  auto missing = Harness::create(config);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find("no-such-file.txt"), std::string::npos) << missing.error().to_string();

  config.topology_file.clear();  // the model again
  auto model = Harness::create(config);
  ASSERT_TRUE(model.has_value()) << model.error().to_string();
  EXPECT_EQ((*model)->topology().nodes_of(topology::NodeKind::kGpu).size(), 8u);
}

}  // namespace
}  // namespace baton::engine
