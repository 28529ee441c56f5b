#include <gtest/gtest.h>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

int nvlink_pairs(const TopologyFacts& f) {
  int n = 0;
  for (const Relation& r : f.relations) n += r.nvlinks > 0;
  return n;
}

TEST(Models, Nvswitch8) {
  const auto f = load_model("nvswitch8").value();
  EXPECT_EQ(f.gpus.size(), 8u);
  EXPECT_EQ(f.nics.size(), 8u);
  EXPECT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(nvlink_pairs(f), 28);
  for (int g = 0; g < 8; ++g) {
    const Relation* r = f.find({DeviceRef::Kind::kGpu, g}, {DeviceRef::Kind::kNic, g});
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->pci, PciLocality::kPix);  // each NIC under its GPU's switch
    EXPECT_EQ(f.nics[g].kind, NicKind::kRdma);
  }
  for (const Relation& r : f.relations) {
    EXPECT_EQ(r.via_nvswitch, r.nvlinks > 0);
  }
}

TEST(Models, Pcie4HasNoNvlink) {
  const auto f = load_model("pcie4").value();
  EXPECT_EQ(f.gpus.size(), 4u);
  EXPECT_EQ(f.nics.size(), 2u);
  EXPECT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(nvlink_pairs(f), 0);
}

TEST(Models, NvlinkPairsBridgesOnlyZeroOneAndTwoThree) {
  const auto f = load_model("nvlink-pairs").value();
  EXPECT_EQ(f.gpus.size(), 4u);
  EXPECT_EQ(nvlink_pairs(f), 2);
  using K = DeviceRef::Kind;
  EXPECT_GT(f.find({K::kGpu, 0}, {K::kGpu, 1})->nvlinks, 0);
  EXPECT_GT(f.find({K::kGpu, 2}, {K::kGpu, 3})->nvlinks, 0);
  EXPECT_EQ(f.find({K::kGpu, 1}, {K::kGpu, 2})->nvlinks, 0);
  EXPECT_FALSE(f.find({K::kGpu, 0}, {K::kGpu, 1})->via_nvswitch);
}

TEST(Models, UnknownNameListsTheKnownOnes) {
  EXPECT_EQ(model_names(), (std::vector<std::string>{"nvlink-pairs", "nvswitch8", "pcie4"}));
  const auto r = load_model("dgx9000");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
  EXPECT_NE(r.error().message().find("\"dgx9000\""), std::string::npos);
  EXPECT_NE(r.error().message().find("nvswitch8"), std::string::npos);
}

}  // namespace
}  // namespace baton::topology
