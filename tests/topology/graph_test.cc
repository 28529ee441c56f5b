#include "baton/topology/graph.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

TopologyGraph model(std::string_view name) {
  auto facts = load_model(name);
  EXPECT_TRUE(facts.has_value());
  auto g = TopologyGraph::build(*facts);
  EXPECT_TRUE(g.has_value()) << g.error().to_string();
  return std::move(*g);
}

TopologyGraph file(const std::string& name) {
  auto facts = load_nvidia_smi_topo(std::string(BATON_TEST_DATA_DIR) + "/nvidia-smi-topo/" + name);
  EXPECT_TRUE(facts.has_value()) << facts.error().to_string();
  auto g = TopologyGraph::build(*facts);
  EXPECT_TRUE(g.has_value()) << g.error().to_string();
  return std::move(*g);
}

std::vector<PathType> chain(const TopologyGraph& g, std::string_view a, std::string_view b) {
  auto r = g.rank(a, b);
  EXPECT_TRUE(r.has_value()) << r.error().to_string();
  std::vector<PathType> out;
  if (r) {
    for (const Link& l : r->chain) out.push_back(l.path);
  }
  return out;
}

using P = PathType;

TEST(TopologyGraph, Nvswitch8RoutesOverTheFabricThenHost) {
  const auto g = model("nvswitch8");
  EXPECT_EQ(chain(g, "gpu0", "gpu5"), (std::vector{P::kNvswitch, P::kHostStaging}));
  const auto r = g.rank("gpu2", "gpu3").value();
  EXPECT_DOUBLE_EQ(r.best().cost.bandwidth_gbps, 450.0);
  EXPECT_EQ(r.from, "gpu2");
  EXPECT_EQ(r.best().from, "gpu2");  // links are oriented along the route
  EXPECT_EQ(r.best().to, "gpu3");
  const auto back = g.rank("gpu3", "gpu2").value();
  EXPECT_EQ(back.best().from, "gpu3");
}

TEST(TopologyGraph, PciePeersAndCrossSocket) {
  const auto g = model("pcie4");
  EXPECT_EQ(chain(g, "gpu0", "gpu1"), (std::vector{P::kPcieP2p, P::kHostStaging}));
  EXPECT_EQ(chain(g, "gpu0", "gpu2"), (std::vector{P::kHostStaging}));  // SYS: no P2P
  const double same_socket = g.rank("gpu0", "gpu1")->chain.back().cost.score;
  const double cross_socket = g.rank("gpu0", "gpu2")->chain.back().cost.score;
  EXPECT_GT(same_socket, cross_socket);
}

TEST(TopologyGraph, NvlinkPairsKeepPcieAsAFallback) {
  const auto g = model("nvlink-pairs");
  EXPECT_EQ(chain(g, "gpu0", "gpu1"), (std::vector{P::kNvlink, P::kPcieP2p, P::kHostStaging}));
  EXPECT_EQ(chain(g, "gpu1", "gpu2"), (std::vector{P::kHostStaging}));
  EXPECT_DOUBLE_EQ(g.rank("gpu2", "gpu3")->best().cost.bandwidth_gbps, 100.0);  // NV4
}

TEST(TopologyGraph, ChainIsOrderedByScoreAndEndsWithHostStaging) {
  for (const char* name : {"h200-8gpu-10nic-glm.txt", "dgx1-v100-msccl.txt", "fixture-pcie-all-localities.txt",
                           "dgx-a100-gengwg.txt", "traverse-power9-v100-nv3pairs.txt"}) {
    const auto g = file(name);
    const auto gpus = g.nodes_of(NodeKind::kGpu);
    std::vector<const Node*> ends = gpus;
    for (const Node* n : g.nodes_of(NodeKind::kNic)) ends.push_back(n);
    for (const Node* a : gpus) {
      for (const Node* b : ends) {
        if (a == b) continue;
        const auto r = g.rank(a->id, b->id);
        ASSERT_TRUE(r.has_value()) << name << " " << a->id << "-" << b->id;
        EXPECT_EQ(r->chain.back().path, P::kHostStaging) << name << " " << a->id << "-" << b->id;
        for (std::size_t i = 1; i + 1 < r->chain.size(); ++i) {
          EXPECT_GE(r->chain[i - 1].cost.score, r->chain[i].cost.score);
        }
      }
    }
  }
}

TEST(TopologyGraph, EveryPcieLocalityMapsToTheRightPath) {
  const auto g = file("fixture-pcie-all-localities.txt");
  EXPECT_EQ(chain(g, "gpu0", "gpu1"), (std::vector{P::kPcieP2p, P::kHostStaging}));  // PIX
  EXPECT_EQ(chain(g, "gpu0", "gpu2"), (std::vector{P::kPcieP2p, P::kHostStaging}));  // PXB
  EXPECT_EQ(chain(g, "gpu4", "gpu5"), (std::vector{P::kPcieP2p, P::kHostStaging}));  // PHB
  EXPECT_EQ(chain(g, "gpu0", "gpu3"), (std::vector{P::kHostStaging}));               // NODE
  EXPECT_EQ(chain(g, "gpu0", "gpu4"), (std::vector{P::kHostStaging}));               // SYS
  const double pix = g.rank("gpu0", "gpu1")->best().cost.score;
  const double pxb = g.rank("gpu0", "gpu2")->best().cost.score;
  const double phb = g.rank("gpu4", "gpu5")->best().cost.score;
  EXPECT_GT(pix, pxb);
  EXPECT_GT(pxb, phb);
  EXPECT_EQ(chain(g, "gpu0", "nic0"), (std::vector{P::kGdr, P::kHostStaging}));  // PIX
  EXPECT_EQ(chain(g, "gpu3", "nic1"), (std::vector{P::kHostStaging}));           // SYS: no GDR
}

TEST(TopologyGraph, GdrPrefersTheNicUnderTheSameSwitch) {
  const auto nv = model("nvswitch8");
  for (int gpu = 0; gpu < 8; ++gpu) {
    const auto order = nv.nics_for_gpu(fmt::format("gpu{}", gpu)).value();
    ASSERT_EQ(order.size(), 8u);
    EXPECT_EQ(order.front(), fmt::format("nic{}", gpu));
    // Same-socket NICs (NODE) before cross-socket ones (no GDR).
    for (int k = 1; k < 4; ++k) EXPECT_EQ(nv.find(order[k])->numa, gpu / 4) << gpu;
    for (int k = 4; k < 8; ++k) EXPECT_NE(nv.find(order[k])->numa, gpu / 4) << gpu;
  }

  const auto h200 = file("h200-8gpu-10nic-glm.txt");
  const auto order = h200.nics_for_gpu("gpu3").value();
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(std::set<std::string>(order.begin(), order.begin() + 3), (std::set<std::string>{"nic0", "nic1", "nic2"}));
  EXPECT_EQ(std::set<std::string>(order.begin() + 3, order.begin() + 6), (std::set<std::string>{"nic3", "nic4", "nic5"}));
  EXPECT_EQ(h200.nics_for_gpu("gpu0").value().front(), "nic3");

  const auto dgx1 = file("dgx1-pcie-mp-gengwg.txt");  // PIX, then PHB, then SYS
  EXPECT_EQ(dgx1.nics_for_gpu("gpu0").value(), (std::vector<std::string>{"nic0", "nic1", "nic2", "nic3"}));
  EXPECT_EQ(dgx1.nics_for_gpu("gpu2").value().front(), "nic1");

  const auto a100 = file("dgx-a100-gengwg.txt");  // PXB before SYS
  const auto a_order = a100.nics_for_gpu("gpu6").value();
  EXPECT_EQ(std::set<std::string>(a_order.begin(), a_order.begin() + 2), (std::set<std::string>{"nic8", "nic9"}));
}

TEST(TopologyGraph, HostMemoryToGpuPrefersTheLocalSocket) {
  const auto g = model("nvswitch8");
  const auto local = g.rank("numa0", "gpu1").value();
  const auto remote = g.rank("numa1", "gpu1").value();
  EXPECT_EQ(local.best().path, P::kHostStaging);
  EXPECT_GT(local.best().cost.score, remote.best().cost.score);
  EXPECT_EQ(g.rank("numa0", "nic0")->best().path, P::kRdma);
  EXPECT_GT(g.rank("numa0", "nic0")->best().cost.score, g.rank("numa1", "nic0")->best().cost.score);
  EXPECT_EQ(g.rank("numa0", "numa1")->best().path, P::kShm);
}

TEST(TopologyGraph, NodesSwitchesAndNicsOnNuma) {
  const auto g = model("nvswitch8");
  EXPECT_EQ(g.nodes_of(NodeKind::kGpu).size(), 8u);
  EXPECT_EQ(g.nodes_of(NodeKind::kNic).size(), 8u);
  EXPECT_EQ(g.nodes_of(NodeKind::kNuma).size(), 2u);
  const auto fabric = g.nodes_of(NodeKind::kNvswitch);
  ASSERT_EQ(fabric.size(), 1u);
  EXPECT_EQ(fabric[0]->members.size(), 8u);
  const auto switches = g.nodes_of(NodeKind::kPcieSwitch);
  ASSERT_EQ(switches.size(), 8u);
  for (const Node* s : switches) EXPECT_EQ(s->members.size(), 2u);  // a GPU and its NIC
  EXPECT_EQ(g.nics_on_numa(1), (std::vector<std::string>{"nic4", "nic5", "nic6", "nic7"}));
  EXPECT_TRUE(g.nics_on_numa(5).empty());
  EXPECT_EQ(g.find("gpu7")->name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(g.find("gpu8"), nullptr);

  const auto pcie = model("pcie4");
  EXPECT_TRUE(pcie.nodes_of(NodeKind::kNvswitch).empty());
}

TEST(TopologyGraph, RankRefusesBadEndpoints) {
  const auto g = model("nvswitch8");
  EXPECT_EQ(g.rank("gpu0", "gpu99").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(g.rank("", "gpu1").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(g.rank("gpu0", "gpu0").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.rank("nic0", "nic1").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.rank("gpu0", "nvswitch0").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.nics_for_gpu("nic0").error().code(), StatusCode::kNotFound);
  const auto missing = g.rank("gpu0", "gpu99");
  EXPECT_NE(missing.error().message().find("\"gpu99\""), std::string::npos);
}

TEST(TopologyGraph, BuildRefusesFactsThatContradictThemselves) {
  TopologyFacts f;
  f.gpus.resize(2);
  using K = DeviceRef::Kind;
  f.relations.push_back({{K::kGpu, 0}, {K::kGpu, 2}, PciLocality::kPix, 0, false, false});
  EXPECT_EQ(TopologyGraph::build(f).error().code(), StatusCode::kInvalidArgument);
  f.relations = {{{K::kGpu, 0}, {K::kNic, 0}, PciLocality::kPix, 0, false, false}};
  EXPECT_EQ(TopologyGraph::build(f).error().code(), StatusCode::kInvalidArgument);
  f.relations = {{{K::kGpu, 1}, {K::kGpu, 1}, PciLocality::kPix, 0, false, false}};
  EXPECT_EQ(TopologyGraph::build(f).error().code(), StatusCode::kInvalidArgument);
  f.relations = {{{K::kGpu, 0}, {K::kGpu, 1}, PciLocality::kPix, -2, false, false}};
  EXPECT_EQ(TopologyGraph::build(f).error().code(), StatusCode::kInvalidArgument);
  f.relations.clear();
  f.numa_nodes = {{0, "0-3", 4, 0}, {0, "4-7", 4, 0}};
  EXPECT_EQ(TopologyGraph::build(f).error().code(), StatusCode::kInvalidArgument);
  f.numa_nodes = {{0, "0-3", 4, 0}};
  EXPECT_TRUE(TopologyGraph::build(f).has_value());
}

// What the nvidia-smi parser refuses, build refuses from any caller: it made
// a 25 000 GB/s NVLink, a PCIe locality cast from 77 a PHB-local GDR link,
// and a second relation for a pair was silently ignored.
TEST(TopologyGraph, BuildRefusesFactsNoMachineHas) {
  using K = DeviceRef::Kind;
  auto refused = [](const TopologyFacts& f, std::string_view says) {
    const auto g = TopologyGraph::build(f);
    ASSERT_FALSE(g.has_value());
    EXPECT_EQ(g.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.error().message().find(says), std::string::npos) << g.error().message();
  };
  TopologyFacts f;
  f.gpus.resize(2);
  f.nics.resize(1);
  f.relations = {{{K::kGpu, 0}, {K::kGpu, 1}, PciLocality::kSys, 1000, false, false}};
  refused(f, "gpu0-gpu1 has 1000 NVLinks (expected 0..18");
  f.relations = {{{K::kGpu, 0}, {K::kGpu, 1}, PciLocality::kSys, 18, false, false}};
  EXPECT_TRUE(TopologyGraph::build(f).has_value());
  f.relations = {{{K::kGpu, 0}, {K::kGpu, 1}, PciLocality::kSys, 4, false, false},
                 {{K::kGpu, 1}, {K::kGpu, 0}, PciLocality::kSys, 0, false, false}};
  refused(f, "gpu1-gpu0 has two relations");
  f.relations = {{{K::kGpu, 0}, {K::kNic, 0}, static_cast<PciLocality>(77), 0, false, false}};
  refused(f, "gpu0-nic0 has PCIe locality 77");
  f.relations = {{{K::kGpu, 0}, {static_cast<K>(9), 0}, PciLocality::kPix, 0, false, false}};
  refused(f, "device kind 9 (expected GPU or NIC)");
  f.relations.clear();
  f.gpus[1].numa = -5;
  refused(f, "gpu1 is on NUMA node -5");
  f.gpus[1].numa = kUnknownNuma;
  f.nics[0].numa = 2'000'000'000;
  refused(f, "nic0 is on NUMA node 2000000000");
  f.nics[0].numa = kMaxNumaNode;
  EXPECT_TRUE(TopologyGraph::build(f).has_value());
  f.numa_nodes = {{-3, "", 0, 0}};
  refused(f, "NUMA node -3 (expected 0..1023)");
}

TEST(TopologyGraph, CostOverridesChangeTheRanking) {
  CostModel costs;
  // An operator who measured slow NVLink on this box: P2P over PCIe now
  // beats NVLink, and host staging still closes the chain.
  ASSERT_TRUE(costs.set(P::kNvlink, Proximity::kLocal, 1.0, 2.0).is_ok());
  const auto g = TopologyGraph::build(load_model("nvlink-pairs").value(), costs).value();
  EXPECT_EQ(chain(g, "gpu0", "gpu1"), (std::vector{P::kPcieP2p, P::kNvlink, P::kHostStaging}));
  EXPECT_DOUBLE_EQ(g.rank("gpu0", "gpu1")->chain[1].cost.bandwidth_gbps, 4.0);  // NV4 at 1 GB/s a link
}

}  // namespace
}  // namespace baton::topology
