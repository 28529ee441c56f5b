// facts_from_nvml's inference (direct NVLink vs NVSwitch fabric) on hand-built
// snapshots, PCI id normalisation, and the live NVML / CUDA probes, which must
// answer ok or unavailable on any machine, with or without a GPU.
#include <dlfcn.h>

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "baton/topology/cost_model.h"
#include "baton/topology/graph.h"
#include "baton/topology/probe.h"
#include "topology/nvml_snapshot.h"

namespace baton::topology {
namespace {

std::string gpu_pci(int i) { return fmt::format("0000:{:02x}:00.0", 0x10 + i); }

// `count` GPUs whose first `active[i]` of 18 links go, round robin, to four
// NVSwitches (as on an HGX H100/H200 board); the rest are down.
NvmlSnapshot nvswitch_snapshot(const std::vector<int>& active) {
  const std::vector<std::string> switches = {"0000:c0:00.0", "0000:c1:00.0", "0000:c2:00.0",
                                             "0000:c3:00.0"};
  NvmlSnapshot snapshot;
  for (std::size_t i = 0; i < active.size(); ++i) {
    NvmlGpu gpu;
    gpu.name = "NVIDIA H200";
    gpu.uuid = fmt::format("GPU-{}", i);
    gpu.pci_bus_id = gpu_pci(static_cast<int>(i));
    gpu.numa = i < active.size() / 2 ? 0 : 1;
    for (int l = 0; l < 18; ++l) {
      const bool up = l < active[i];
      gpu.links.push_back({up, up ? switches[l % 4] : ""});
    }
    snapshot.gpus.push_back(std::move(gpu));
  }
  return snapshot;
}

TEST(FactsFromNvml, NvSwitchBoardJoinsEveryPairThroughTheFabric) {
  auto facts = facts_from_nvml(nvswitch_snapshot(std::vector<int>(8, 18)));
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  EXPECT_EQ(facts->source, "nvml");
  ASSERT_EQ(facts->gpus.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(facts->gpus[i].name, "NVIDIA H200");
    EXPECT_EQ(facts->gpus[i].pci_bus_id, gpu_pci(static_cast<int>(i)));
    EXPECT_EQ(facts->gpus[i].uuid, fmt::format("GPU-{}", i));
    EXPECT_EQ(facts->gpus[i].numa, i < 4 ? 0 : 1);
    EXPECT_EQ(facts->gpus[i].nvlink_active, 18);
  }
  ASSERT_EQ(facts->relations.size(), 28u);  // 8 choose 2
  for (const Relation& r : facts->relations) {
    EXPECT_TRUE(r.via_nvswitch);
    EXPECT_EQ(r.nvlinks, 18);
    EXPECT_EQ(r.pci, PciLocality::kUnknown);
    EXPECT_FALSE(r.peer_access);
  }
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      EXPECT_NE(facts->find({DeviceRef::Kind::kGpu, i}, {DeviceRef::Kind::kGpu, j}), nullptr)
          << i << "-" << j;
    }
  }
}

// The same 18 links carry twice the bytes on Blackwell (NVLink 5): the
// architecture NVML reports sets the speed per link, the slower end's for a
// pair, and a policy's measured figure still wins.
TEST(FactsFromNvml, TheArchitectureSetsTheNvlinkSpeedAndAPolicyFigureWins) {
  EXPECT_EQ(nvlink_gbps_for_architecture(9), 25.0);   // Hopper
  EXPECT_EQ(nvlink_gbps_for_architecture(10), 50.0);  // Blackwell
  EXPECT_EQ(nvlink_gbps_for_architecture(8), 0.0);    // Ada: no NVLink
  EXPECT_EQ(nvlink_gbps_for_architecture(0), 0.0);    // unknown: the cost model's
  auto bandwidth = [](unsigned arch0, unsigned arch1, const CostModel& costs) {
    NvmlSnapshot snapshot = nvswitch_snapshot({18, 18});
    snapshot.gpus[0].architecture = arch0;
    snapshot.gpus[1].architecture = arch1;
    auto facts = facts_from_nvml(snapshot);
    EXPECT_TRUE(facts.has_value()) << facts.error().to_string();
    auto graph = TopologyGraph::build(*facts, costs);
    EXPECT_TRUE(graph.has_value()) << graph.error().to_string();
    auto route = graph->rank("gpu0", "gpu1");
    EXPECT_TRUE(route.has_value());
    EXPECT_EQ(route->best().path, PathType::kNvswitch);
    return route->best().cost.bandwidth_gbps;
  };
  const CostModel defaults;
  EXPECT_DOUBLE_EQ(bandwidth(10, 10, defaults), 900.0);  // B200: 18 x 50
  EXPECT_DOUBLE_EQ(bandwidth(9, 9, defaults), 450.0);    // H100: 18 x 25
  EXPECT_DOUBLE_EQ(bandwidth(10, 9, defaults), 450.0);   // the slower end
  EXPECT_DOUBLE_EQ(bandwidth(10, 0, defaults), 450.0);   // one end unknown: the model's
  CostModel measured;
  ASSERT_TRUE(measured.set(PathType::kNvswitch, Proximity::kLocal, 40.0, 2.5).is_ok());
  EXPECT_DOUBLE_EQ(bandwidth(10, 10, measured), 720.0);  // 18 x the policy's 40

  TopologyFacts bad;
  bad.gpus.resize(1);
  bad.gpus[0].nvlink_gbps_per_link = -1;
  EXPECT_EQ(TopologyGraph::build(bad).error().code(), StatusCode::kInvalidArgument);
}

TEST(FactsFromNvml, FabricPairsUseTheSmallerActiveLinkCount) {
  std::vector<int> active(8, 18);
  active[3] = 12;  // six links of GPU3 are down
  auto facts = facts_from_nvml(nvswitch_snapshot(active));
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  ASSERT_EQ(facts->relations.size(), 28u);
  EXPECT_EQ(facts->gpus[3].nvlink_active, 12);
  int pairs_with_gpu3 = 0;
  for (const Relation& r : facts->relations) {
    const bool has_gpu3 = r.a.index == 3 || r.b.index == 3;
    pairs_with_gpu3 += has_gpu3 ? 1 : 0;
    EXPECT_EQ(r.nvlinks, has_gpu3 ? 12 : 18) << r.a.index << "-" << r.b.index;
    EXPECT_TRUE(r.via_nvswitch);
  }
  EXPECT_EQ(pairs_with_gpu3, 7);
}

TEST(FactsFromNvml, GpuWithoutActiveSwitchLinksJoinsNoPair) {
  std::vector<int> active(4, 18);
  active[2] = 0;
  auto facts = facts_from_nvml(nvswitch_snapshot(active));
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  EXPECT_EQ(facts->relations.size(), 3u);  // pairs among GPUs 0, 1, 3
  for (const Relation& r : facts->relations) {
    EXPECT_NE(r.a.index, 2);
    EXPECT_NE(r.b.index, 2);
  }
}

TEST(FactsFromNvml, DirectLinksAreCountedPerPeerAndInactiveGpusJoinNothing) {
  NvmlSnapshot snapshot;
  for (int i = 0; i < 3; ++i) {
    NvmlGpu gpu;
    gpu.name = "NVIDIA A100-SXM4-40GB";
    gpu.pci_bus_id = gpu_pci(i);
    snapshot.gpus.push_back(gpu);
  }
  // NVML writes ids with 8 domain digits and in upper case; they must match.
  for (int l = 0; l < 12; ++l) {
    const bool up = l < 4;
    snapshot.gpus[0].links.push_back({up, up ? "00000000:11:00.0" : ""});
    snapshot.gpus[1].links.push_back({up, up ? "00000000:10:00.0" : ""});
    snapshot.gpus[2].links.push_back({false, ""});
  }
  auto facts = facts_from_nvml(snapshot);
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  ASSERT_EQ(facts->relations.size(), 1u);
  const Relation& r = facts->relations[0];
  EXPECT_EQ(r.a, (DeviceRef{DeviceRef::Kind::kGpu, 0}));
  EXPECT_EQ(r.b, (DeviceRef{DeviceRef::Kind::kGpu, 1}));
  EXPECT_EQ(r.nvlinks, 4);
  EXPECT_FALSE(r.via_nvswitch);
  EXPECT_EQ(facts->gpus[0].nvlink_active, 4);
  EXPECT_EQ(facts->gpus[2].nvlink_active, 0);
  EXPECT_EQ(facts->find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 2}), nullptr);
  EXPECT_EQ(facts->find({DeviceRef::Kind::kGpu, 1}, {DeviceRef::Kind::kGpu, 2}), nullptr);
}

TEST(FactsFromNvml, BondedPairsOnOneBoardAreSeparateRelations) {
  // Two NVLink bridges: GPU0–GPU1 with 2 links, GPU2–GPU3 with 3, no switch.
  NvmlSnapshot snapshot;
  for (int i = 0; i < 4; ++i) snapshot.gpus.push_back({"GPU", "", gpu_pci(i), kUnknownNuma, {}});
  auto bond = [&](int a, int b, int links) {
    for (int l = 0; l < links; ++l) {
      snapshot.gpus[a].links.push_back({true, gpu_pci(b)});
      snapshot.gpus[b].links.push_back({true, gpu_pci(a)});
    }
  };
  bond(0, 1, 2);
  bond(2, 3, 3);
  auto facts = facts_from_nvml(snapshot);
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  ASSERT_EQ(facts->relations.size(), 2u);
  const Relation* r01 = facts->find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1});
  const Relation* r23 = facts->find({DeviceRef::Kind::kGpu, 2}, {DeviceRef::Kind::kGpu, 3});
  ASSERT_NE(r01, nullptr);
  ASSERT_NE(r23, nullptr);
  EXPECT_EQ(r01->nvlinks, 2);
  EXPECT_EQ(r23->nvlinks, 3);
  EXPECT_FALSE(r01->via_nvswitch);
}

TEST(FactsFromNvml, UnnamedGpuGetsItsIndex) {
  NvmlSnapshot snapshot;
  snapshot.gpus.push_back({"", "", gpu_pci(0), kUnknownNuma, {}});
  auto facts = facts_from_nvml(snapshot);
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  EXPECT_EQ(facts->gpus[0].name, "GPU0");
}

TEST(FactsFromNvml, EmptySnapshotGivesNoDevices) {
  auto facts = facts_from_nvml({});
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  EXPECT_TRUE(facts->gpus.empty());
  EXPECT_TRUE(facts->relations.empty());
}

TEST(FactsFromNvml, DuplicatePciIdIsInvalid) {
  NvmlSnapshot snapshot = nvswitch_snapshot({18, 18});
  // The same function written two ways is still one function.
  snapshot.gpus[1].pci_bus_id = "00000000:10:00.0";
  auto facts = facts_from_nvml(snapshot);
  ASSERT_FALSE(facts.has_value());
  EXPECT_EQ(facts.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(facts.error().message().find("0000:10:00.0"), std::string::npos)
      << facts.error().message();
}

TEST(FactsFromNvml, UnparsableGpuPciIdIsInvalid) {
  for (const char* bad : {"", "gpu0", "0000:10:00"}) {
    NvmlSnapshot snapshot = nvswitch_snapshot({18, 18});
    snapshot.gpus[0].pci_bus_id = bad;
    auto facts = facts_from_nvml(snapshot);
    ASSERT_FALSE(facts.has_value()) << "'" << bad << "'";
    EXPECT_EQ(facts.error().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(FactsFromNvml, UnparsableRemotePciIdIsInvalid) {
  NvmlSnapshot snapshot = nvswitch_snapshot({18, 18});
  snapshot.gpus[1].links[0].remote_pci_bus_id = "switch";
  auto facts = facts_from_nvml(snapshot);
  ASSERT_FALSE(facts.has_value());
  EXPECT_EQ(facts.error().code(), StatusCode::kInvalidArgument);
}

TEST(NormalizePciBusId, AcceptsNvmlLinuxAndShortForms) {
  struct Case {
    const char* in;
    const char* out;
  };
  for (const Case& c : {Case{"00000000:17:00.0", "0000:17:00.0"}, Case{"0000:17:00.0", "0000:17:00.0"},
                        Case{"17:00.0", "0000:17:00.0"}, Case{"0000:AB:00.0", "0000:ab:00.0"},
                        Case{"00000001:C5:1F.7", "0001:c5:1f.7"}}) {
    auto id = normalize_pci_bus_id(c.in);
    ASSERT_TRUE(id.has_value()) << c.in << ": " << id.error().to_string();
    EXPECT_EQ(*id, c.out) << c.in;
  }
}

TEST(NormalizePciBusId, RejectsWhatIsNotABusId) {
  for (const char* bad : {"", "17:00", "zz:00.0", "0000:17:00.9x", "0000:17:00.8", "0000:17:20.0",
                          "0000:170:00.0", "000000000:17:00.0", "0000:17:00.0 ", ":17:00.0",
                          "0000:17:0.0", "x0000:17:00.0"}) {
    auto id = normalize_pci_bus_id(bad);
    ASSERT_FALSE(id.has_value()) << "'" << bad << "' gave " << *id;
    EXPECT_EQ(id.error().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_NE(id.error().message().find("normalize_pci_bus_id"), std::string::npos);
  }
}

bool nvml_library_present() {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

TEST(ProbeNvml, AnswersOkWithGpusOrUnavailable) {
  auto facts = probe_nvml();
  if (!nvml_library_present()) {
    ASSERT_FALSE(facts.has_value());
    EXPECT_EQ(facts.error().code(), StatusCode::kUnavailable);
    EXPECT_NE(facts.error().message().find("libnvidia-ml.so.1"), std::string::npos)
        << facts.error().message();
    return;
  }
  // With a driver: GPUs, or a reason (no GPU, init refused).
  if (!facts.has_value()) {
    EXPECT_EQ(facts.error().code(), StatusCode::kUnavailable) << facts.error().to_string();
    return;
  }
  EXPECT_EQ(facts->source, "nvml");
  ASSERT_FALSE(facts->gpus.empty());
  for (const GpuInfo& gpu : facts->gpus) {
    EXPECT_TRUE(normalize_pci_bus_id(gpu.pci_bus_id).has_value()) << gpu.pci_bus_id;
    EXPECT_EQ(*normalize_pci_bus_id(gpu.pci_bus_id), gpu.pci_bus_id);
    EXPECT_FALSE(gpu.name.empty());
  }
  for (const Relation& r : facts->relations) {
    EXPECT_LT(r.a.index, static_cast<int>(facts->gpus.size()));
    EXPECT_LT(r.b.index, static_cast<int>(facts->gpus.size()));
    EXPECT_GT(r.nvlinks, 0);
  }
}

// probe_cuda has no test file of its own; it lives here with its sibling.
TEST(ProbeCuda, AnswersOkWithGpusOrUnavailable) {
  auto facts = probe_cuda();
  if (!facts.has_value()) {
    EXPECT_EQ(facts.error().code(), StatusCode::kUnavailable) << facts.error().to_string();
    EXPECT_EQ(facts.error().message().rfind("cuda: ", 0), 0u) << facts.error().message();
    return;
  }
  EXPECT_EQ(facts->source, "cuda");
  ASSERT_GE(facts->gpus.size(), 1u);
  for (const GpuInfo& gpu : facts->gpus) {
    EXPECT_TRUE(normalize_pci_bus_id(gpu.pci_bus_id).has_value()) << gpu.pci_bus_id;
  }
  for (const Relation& r : facts->relations) {
    EXPECT_TRUE(r.peer_access);
    EXPECT_LT(r.b.index, static_cast<int>(facts->gpus.size()));
  }
}

}  // namespace
}  // namespace baton::topology
