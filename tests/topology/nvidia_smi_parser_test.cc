// The nvidia-smi topo parser against real published outputs (tests/data, with
// the ground truth from its README) and fixtures of our own for shapes the real
// set lacks, plus malformed text.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "baton/topology/graph.h"
#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

std::string data(const std::string& name) {
  return std::string(BATON_TEST_DATA_DIR) + "/nvidia-smi-topo/" + name;
}

TopologyFacts load(const std::string& name) {
  auto facts = load_nvidia_smi_topo(data(name));
  EXPECT_TRUE(facts.has_value()) << name << ": " << facts.error().to_string();
  return facts.value_or(TopologyFacts{});
}

// "GPU3" → gpu 3; "NIC2" → the third NIC as listed; "mlx5_2" → the NIC with that name.
DeviceRef ref(const TopologyFacts& f, std::string_view name) {
  if (name.starts_with("GPU")) return {DeviceRef::Kind::kGpu, std::stoi(std::string(name.substr(3)))};
  if (name.starts_with("NIC")) return {DeviceRef::Kind::kNic, std::stoi(std::string(name.substr(3)))};
  for (std::size_t i = 0; i < f.nics.size(); ++i) {
    if (f.nics[i].name == name) return {DeviceRef::Kind::kNic, static_cast<int>(i)};
  }
  ADD_FAILURE() << "no device " << name;
  return {};
}

// The cell the way nvidia-smi prints it: "NV18", "PIX", …
std::string cell(const TopologyFacts& f, std::string_view a, std::string_view b) {
  const Relation* r = f.find(ref(f, a), ref(f, b));
  if (r == nullptr) return "none";
  if (r->nvlinks > 0) return "NV" + std::to_string(r->nvlinks);
  return to_string(r->pci);
}

TEST(NvidiaSmiParser, H200EightGpusTenNicsWithLegendAndAnsi) {
  const auto f = load("h200-8gpu-10nic-glm.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 10u);
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      EXPECT_EQ(cell(f, "GPU" + std::to_string(a), "GPU" + std::to_string(b)), "NV18");
      EXPECT_TRUE(f.find({DeviceRef::Kind::kGpu, a}, {DeviceRef::Kind::kGpu, b})->via_nvswitch);
    }
  }
  const std::pair<const char*, const char*> pix[] = {
      {"GPU0", "NIC3"}, {"GPU1", "NIC5"}, {"GPU2", "NIC4"}, {"GPU3", "NIC0"}, {"GPU3", "NIC1"},
      {"GPU3", "NIC2"}, {"GPU4", "NIC7"}, {"GPU5", "NIC9"}, {"GPU6", "NIC8"}, {"GPU7", "NIC6"}};
  for (auto [g, n] : pix) EXPECT_EQ(cell(f, g, n), "PIX") << g << "-" << n;
  int pix_for_gpu3 = 0;
  for (int k = 0; k < 10; ++k) pix_for_gpu3 += cell(f, "GPU3", "NIC" + std::to_string(k)) == "PIX";
  EXPECT_EQ(pix_for_gpu3, 3);
  EXPECT_EQ(cell(f, "GPU0", "NIC0"), "NODE");
  EXPECT_EQ(cell(f, "GPU0", "NIC6"), "SYS");
  EXPECT_EQ(cell(f, "NIC0", "NIC1"), "PIX");
  EXPECT_EQ(cell(f, "NIC0", "NIC2"), "PIX");
  EXPECT_EQ(cell(f, "NIC1", "NIC2"), "PIX");
  for (int k = 0; k < 10; ++k) EXPECT_EQ(f.nics[k].name, "mlx5_" + std::to_string(k));
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(f.gpus[g].cpu_affinity, g < 4 ? "0-63,128-191" : "64-127,192-255");
    EXPECT_EQ(f.gpus[g].numa, g < 4 ? 0 : 1);
    EXPECT_FALSE(f.gpus[g].gpu_numa_id.has_value());  // N/A
    EXPECT_EQ(f.gpus[g].nvlink_active, 18);
  }
  EXPECT_EQ(f.nics[3].numa, 0);  // PIX to GPU0
  EXPECT_EQ(f.nics[6].numa, 1);  // PIX to GPU7
  ASSERT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(f.numa_nodes[1].cpu_count, 128);
}

TEST(NvidiaSmiParser, DgxA100NamedNicColumnsNoLegend) {
  const auto f = load("dgx-a100-gengwg.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 12u);
  EXPECT_EQ(cell(f, "GPU0", "GPU7"), "NV12");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_0"), "PXB");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_1"), "PXB");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_2"), "SYS");
  for (const char* g : {"GPU2", "GPU3"}) {
    EXPECT_EQ(cell(f, g, "mlx5_2"), "PXB");
    EXPECT_EQ(cell(f, g, "mlx5_3"), "PXB");
  }
  for (const char* g : {"GPU4", "GPU5"}) EXPECT_EQ(cell(f, g, "mlx5_7"), "PXB");
  for (const char* g : {"GPU6", "GPU7"}) EXPECT_EQ(cell(f, g, "mlx5_9"), "PXB");
  for (int g = 0; g < 8; ++g) {
    for (const char* n : {"mlx5_4", "mlx5_5", "mlx5_10", "mlx5_11"}) {
      EXPECT_EQ(cell(f, "GPU" + std::to_string(g), n), "SYS");
    }
  }
  EXPECT_EQ(cell(f, "mlx5_4", "mlx5_5"), "PIX");
  EXPECT_EQ(cell(f, "mlx5_10", "mlx5_11"), "PIX");
  const int numa[] = {3, 3, 1, 1, 7, 7, 5, 5};
  const char* cpus[] = {"48-63,176-191", "48-63,176-191", "16-31,144-159", "16-31,144-159",
                        "112-127,240-255", "112-127,240-255", "80-95,208-223", "80-95,208-223"};
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(f.gpus[g].numa, numa[g]);
    EXPECT_EQ(f.gpus[g].cpu_affinity, cpus[g]);
  }
  EXPECT_EQ(f.nics[0].numa, 3);             // mlx5_0 is PXB to GPU0
  EXPECT_EQ(f.nics[4].numa, kUnknownNuma);  // mlx5_4 is SYS to every GPU
  EXPECT_EQ(f.numa_nodes.size(), 4u);
}

TEST(NvidiaSmiParser, Dgx1PcieOnlyViewHasNoNvlink) {
  const auto f = load("dgx1-pcie-mp-gengwg.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 4u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "GPU2"), "PHB");
  EXPECT_EQ(cell(f, "GPU0", "GPU4"), "SYS");
  EXPECT_EQ(cell(f, "GPU2", "GPU3"), "PIX");
  EXPECT_EQ(cell(f, "GPU4", "GPU5"), "PIX");
  EXPECT_EQ(cell(f, "GPU6", "GPU7"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_0"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_1"), "PHB");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_2"), "SYS");
  EXPECT_EQ(cell(f, "GPU2", "mlx5_1"), "PIX");
  EXPECT_EQ(cell(f, "GPU4", "mlx5_2"), "PIX");
  EXPECT_EQ(cell(f, "GPU6", "mlx5_3"), "PIX");
  EXPECT_EQ(cell(f, "mlx5_0", "mlx5_1"), "PHB");
  EXPECT_EQ(cell(f, "mlx5_0", "mlx5_2"), "SYS");
  for (const Relation& r : f.relations) EXPECT_EQ(r.nvlinks, 0);
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(f.gpus[g].numa, g < 4 ? 0 : 1);
    EXPECT_EQ(f.gpus[g].cpu_affinity, g < 4 ? "0-19,40-59" : "20-39,60-79");
  }
}

TEST(NvidiaSmiParser, A800SpaceAlignedCrlf) {
  const auto f = load("a800-8gpu-4nic-llmaction.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 4u);
  EXPECT_EQ(cell(f, "GPU0", "GPU5"), "NV8");
  EXPECT_EQ(cell(f, "GPU0", "NIC0"), "NODE");
  EXPECT_EQ(cell(f, "GPU1", "NIC0"), "PIX");
  EXPECT_EQ(cell(f, "GPU3", "NIC1"), "PIX");
  EXPECT_EQ(cell(f, "GPU7", "NIC2"), "PIX");
  EXPECT_EQ(cell(f, "GPU7", "NIC3"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "NIC2"), "SYS");
  EXPECT_EQ(cell(f, "GPU4", "NIC2"), "NODE");
  EXPECT_EQ(cell(f, "NIC0", "NIC1"), "NODE");
  EXPECT_EQ(cell(f, "NIC2", "NIC3"), "PIX");
  for (int k = 0; k < 4; ++k) EXPECT_EQ(f.nics[k].name, "mlx5_" + std::to_string(k));
  EXPECT_EQ(f.gpus[0].cpu_affinity, "0-31,64-95");
  EXPECT_EQ(f.gpus[4].cpu_affinity, "32-63,96-127");
  EXPECT_EQ(f.gpus[4].numa, 1);
  // 7 peers × NV8 is more than a GPU has: an NVSwitch fabric.
  EXPECT_TRUE(f.find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
}

TEST(NvidiaSmiParser, H20WithoutLegends) {
  const auto f = load("h20-8gpu-2nic-arthurchiao.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 2u);
  EXPECT_EQ(cell(f, "GPU2", "GPU6"), "NV18");
  for (const char* g : {"GPU0", "GPU1", "GPU2", "GPU3"}) {
    EXPECT_EQ(cell(f, g, "NIC0"), "SYS");
    EXPECT_EQ(cell(f, g, "NIC1"), "SYS");
  }
  for (const char* g : {"GPU4", "GPU5", "GPU7"}) EXPECT_EQ(cell(f, g, "NIC0"), "NODE");
  EXPECT_EQ(cell(f, "GPU6", "NIC0"), "PHB");
  EXPECT_EQ(cell(f, "GPU6", "NIC1"), "PHB");
  EXPECT_EQ(cell(f, "NIC0", "NIC1"), "PIX");
  EXPECT_EQ(f.nics[0].name, "NIC0");  // no NIC Legend: the column name stays
  EXPECT_EQ(f.gpus[5].cpu_affinity, "96-191,288-383");
  EXPECT_EQ(f.gpus[5].numa, 1);
  EXPECT_FALSE(f.gpus[5].gpu_numa_id.has_value());
  EXPECT_EQ(f.nics[0].numa, 1);
}

TEST(NvidiaSmiParser, RtxA6000BridgedPairPlusPcieGpu) {
  const auto f = load("rtxa6000-3gpu-nvbridge-ansi.txt");
  ASSERT_EQ(f.gpus.size(), 3u);
  EXPECT_EQ(f.nics.size(), 0u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "NV4");
  EXPECT_FALSE(f.find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
  EXPECT_EQ(cell(f, "GPU0", "GPU2"), "NODE");
  EXPECT_EQ(cell(f, "GPU1", "GPU2"), "NODE");
  for (const GpuInfo& g : f.gpus) {
    EXPECT_EQ(g.cpu_affinity, "0-31,64-95");
    EXPECT_EQ(g.numa, 0);
  }
  EXPECT_EQ(f.gpus[0].nvlink_active, 4);
  EXPECT_EQ(f.gpus[2].nvlink_active, 0);
}

TEST(NvidiaSmiParser, Power9NonContiguousNumaIds) {
  const auto f = load("traverse-power9-v100-nv3pairs.txt");
  ASSERT_EQ(f.gpus.size(), 4u);
  ASSERT_EQ(f.nics.size(), 4u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "NV3");
  EXPECT_EQ(cell(f, "GPU2", "GPU3"), "NV3");
  for (auto [a, b] : {std::pair{"GPU0", "GPU2"}, {"GPU0", "GPU3"}, {"GPU1", "GPU2"}, {"GPU1", "GPU3"}}) {
    EXPECT_EQ(cell(f, a, b), "SYS");
  }
  EXPECT_EQ(cell(f, "GPU0", "mlx5_0"), "NODE");
  EXPECT_EQ(cell(f, "GPU1", "mlx5_1"), "NODE");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_2"), "SYS");
  EXPECT_EQ(cell(f, "GPU3", "mlx5_3"), "NODE");
  EXPECT_EQ(cell(f, "mlx5_0", "mlx5_1"), "PIX");
  EXPECT_EQ(cell(f, "mlx5_2", "mlx5_3"), "PIX");
  EXPECT_EQ(f.gpus[2].numa, 8);
  EXPECT_EQ(f.gpus[2].cpu_affinity, "64-127");
  ASSERT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(f.numa_nodes[1].os_index, 8);
  EXPECT_EQ(f.nics[2].numa, 8);
}

TEST(NvidiaSmiParser, DellaTwoSocketPcie) {
  const auto f = load("della-a100-2gpu-pcie.txt");
  ASSERT_EQ(f.gpus.size(), 2u);
  ASSERT_EQ(f.nics.size(), 2u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "SYS");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_0"), "NODE");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_1"), "SYS");
  EXPECT_EQ(cell(f, "GPU1", "mlx5_0"), "SYS");
  EXPECT_EQ(cell(f, "GPU1", "mlx5_1"), "NODE");
  EXPECT_EQ(cell(f, "mlx5_0", "mlx5_1"), "SYS");
  EXPECT_EQ(f.gpus[1].cpu_affinity, "64-127");
  EXPECT_EQ(f.gpus[1].numa, 1);
}

TEST(NvidiaSmiParser, Dgx1HybridCubeMeshUnsortedNicsCpuAffinityOnly) {
  const auto f = load("dgx1-v100-msccl.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 4u);
  // NICs keep the order the source lists them.
  EXPECT_EQ(f.nics[0].name, "mlx5_0");
  EXPECT_EQ(f.nics[1].name, "mlx5_2");
  EXPECT_EQ(f.nics[2].name, "mlx5_1");
  EXPECT_EQ(f.nics[3].name, "mlx5_3");
  struct Row {
    const char* gpu;
    std::vector<const char*> nv1, nv2;
  };
  const Row rows[] = {{"GPU0", {"GPU1", "GPU2"}, {"GPU3", "GPU4"}},
                      {"GPU1", {"GPU0", "GPU3"}, {"GPU2", "GPU5"}},
                      {"GPU4", {"GPU5", "GPU6"}, {"GPU0", "GPU7"}},
                      {"GPU7", {"GPU3", "GPU5"}, {"GPU4", "GPU6"}}};
  for (const Row& r : rows) {
    for (const char* p : r.nv1) EXPECT_EQ(cell(f, r.gpu, p), "NV1") << r.gpu << "-" << p;
    for (const char* p : r.nv2) EXPECT_EQ(cell(f, r.gpu, p), "NV2") << r.gpu << "-" << p;
  }
  for (const char* p : {"GPU5", "GPU6", "GPU7"}) EXPECT_EQ(cell(f, "GPU0", p), "SYS");
  for (int g = 0; g < 8; ++g) {
    int peers = 0;
    for (int h = 0; h < 8; ++h) {
      if (h != g) peers += cell(f, "GPU" + std::to_string(g), "GPU" + std::to_string(h)).starts_with("NV");
    }
    EXPECT_EQ(peers, 4) << "GPU" << g;
    EXPECT_EQ(f.gpus[g].nvlink_active, 6);  // V100: six links, direct (no NVSwitch)
  }
  EXPECT_FALSE(f.find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
  EXPECT_EQ(cell(f, "GPU0", "mlx5_0"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_1"), "PHB");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_2"), "SYS");
  EXPECT_EQ(cell(f, "GPU4", "mlx5_2"), "PIX");
  EXPECT_EQ(cell(f, "GPU6", "mlx5_3"), "PIX");
  EXPECT_EQ(cell(f, "mlx5_0", "mlx5_1"), "PHB");
  EXPECT_EQ(f.gpus[0].cpu_affinity, "0-19,40-59");
  EXPECT_EQ(f.gpus[7].cpu_affinity, "20-39,60-79");
  // No NUMA column: sockets inferred from the CPU sets, and said so.
  EXPECT_EQ(f.gpus[0].numa, 0);
  EXPECT_EQ(f.gpus[7].numa, 1);
  ASSERT_EQ(f.notes.size(), 1u);
}

// NUMA Affinity N/A (a VM, firmware without PCI NUMA) or a list of nodes
// ("0-1", a dual-socket board that left the device's node unset): no GPU
// names its node, so the sockets come from the CPU sets, as with drivers
// that print no NUMA column, and the note says why. Before, N/A left no NUMA
// node and no host path at all, and "0-1" was refused.
TEST(NvidiaSmiParser, NumaAffinityNaOrAListInfersTheNodesFromTheCpus) {
  const auto vm = load("fixture-p4-vm-numa-na.txt");
  ASSERT_EQ(vm.gpus.size(), 1u);
  EXPECT_EQ(vm.gpus[0].numa, 0);
  ASSERT_EQ(vm.numa_nodes.size(), 1u);
  EXPECT_EQ(vm.numa_nodes[0].cpus, "0-7");
  ASSERT_EQ(vm.notes.size(), 1u);
  EXPECT_NE(vm.notes[0].find("GPU0 \"N/A\"; NUMA nodes inferred from CPU Affinity"), std::string::npos) << vm.notes[0];

  // Every GPU shows the CPUs 0-31, but GPU0 is SYS to the others: the CPU
  // set spans both sockets (a job's CPU set), so it places no GPU. It was
  // one node for all three, GPU0 local to memory across the socket link.
  const auto board = load("fixture-dual-socket-numa-list.txt");
  ASSERT_EQ(board.gpus.size(), 3u);
  for (const GpuInfo& g : board.gpus) EXPECT_EQ(g.numa, kUnknownNuma) << g.name;
  ASSERT_EQ(board.numa_nodes.size(), 1u);
  EXPECT_EQ(board.numa_nodes[0].cpus, "0-31");
  EXPECT_FALSE(board.numa_nodes_complete);
  ASSERT_EQ(board.notes.size(), 1u);
  EXPECT_NE(board.notes[0].find("GPU2 \"0-1\""), std::string::npos) << board.notes[0];
  EXPECT_NE(board.notes[0].find("GPU0 and GPU1 share CPU Affinity \"0-31\" but the matrix puts them on different "
                                "sockets (SYS between them)"), std::string::npos) << board.notes[0];
  // The graph still has host memory to stage through, into every GPU, as
  // remote: no GPU is known to be on its node.
  auto graph = TopologyGraph::build(board);
  ASSERT_TRUE(graph.has_value()) << graph.error().to_string();
  for (const char* gpu : {"gpu0", "gpu1", "gpu2"}) {
    auto route = graph->rank("numa0", gpu);
    ASSERT_TRUE(route.has_value()) << gpu << ": " << route.error().to_string();
    EXPECT_EQ(route->best().path, PathType::kHostStaging) << gpu;
    EXPECT_EQ(route->best().proximity, Proximity::kRemote) << gpu;
  }
}

// Where some GPUs name their node, a guessed id could collide with a given
// one: the others stay unknown, said in a note; with neither NUMA nor CPU
// affinity known, the note says there is no host-memory path.
TEST(NvidiaSmiParser, AGpuWithoutANodeAmongGpusWithOneStaysUnknown) {
  auto mixed = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-7\t1\nGPU1\tSYS\t X \t8-15\tN/A\n");
  ASSERT_TRUE(mixed.has_value()) << mixed.error().to_string();
  EXPECT_EQ(mixed->gpus[0].numa, 1);
  EXPECT_EQ(mixed->gpus[1].numa, kUnknownNuma);
  ASSERT_EQ(mixed->notes.size(), 1u);
  EXPECT_NE(mixed->notes[0].find("GPU1 \"N/A\": their NUMA node unknown"), std::string::npos) << mixed->notes[0];

  auto nothing = parse_nvidia_smi_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tN/A\tN/A\n");
  ASSERT_TRUE(nothing.has_value()) << nothing.error().to_string();
  EXPECT_EQ(nothing->gpus[0].numa, kUnknownNuma);
  EXPECT_TRUE(nothing->numa_nodes.empty());
  ASSERT_EQ(nothing->notes.size(), 1u);
  EXPECT_NE(nothing->notes[0].find("no host-memory paths"), std::string::npos) << nothing->notes[0];

  // A list that is no list of nodes is still refused.
  for (const char* bad : {"0-", "1-0", "0,,1"}) {
    auto r = parse_nvidia_smi_topo(fmt::format("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\t{}\n", bad));
    EXPECT_FALSE(r.has_value()) << bad;
  }
}

TEST(NvidiaSmiParser, OwnFixtureHgxH100) {
  const auto f = load("fixture-hgx-h100-nv18-mlx5.txt");
  ASSERT_EQ(f.gpus.size(), 8u);
  ASSERT_EQ(f.nics.size(), 8u);
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(cell(f, "GPU" + std::to_string(g), "NIC" + std::to_string(g)), "PIX");
    EXPECT_EQ(f.nics[g].name, "mlx5_" + std::to_string(g));
    EXPECT_EQ(f.nics[g].numa, g / 4);
  }
  EXPECT_EQ(cell(f, "GPU0", "NIC1"), "NODE");
  EXPECT_EQ(cell(f, "GPU0", "NIC4"), "SYS");
  EXPECT_EQ(cell(f, "GPU1", "GPU6"), "NV18");
}

// Output pasted with what came before it (a title, a shell prompt) reads
// as the same machine, with a note; text with no header at all is still
// refused at its first line (NvidiaSmiParserMalformed: prose).
TEST(NvidiaSmiParser, LinesBeforeTheHeaderAreSkippedWithANote) {
  const auto f = load("fixture-h800-17nic-check-env-title.txt");
  ASSERT_EQ(f.gpus.size(), 4u);
  ASSERT_EQ(f.nics.size(), 17u);
  EXPECT_EQ(cell(f, "GPU0", "GPU3"), "NV8");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_4"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "mlx5_13"), "PIX");
  EXPECT_EQ(cell(f, "GPU3", "mlx5_16"), "PIX");
  EXPECT_EQ(cell(f, "GPU1", "mlx5_4"), "SYS");
  EXPECT_EQ(f.nics[16].name, "mlx5_16");
  EXPECT_TRUE(std::ranges::any_of(f.notes, [](const std::string& n) {
    return n.find("1 line before the matrix header skipped (line 1: \"NVIDIA Topology: \")") != std::string::npos;
  })) << fmt::format("{}", f.notes);

  const std::string matrix = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n";
  const auto plain = parse_nvidia_smi_topo(matrix);
  ASSERT_TRUE(plain.has_value()) << plain.error().to_string();
  EXPECT_TRUE(std::ranges::none_of(plain->notes, [](const std::string& n) { return n.find("skipped") != std::string::npos; }));
  const auto prompted = parse_nvidia_smi_topo("\nuser@node:~$ nvidia-smi topo -m\n   \n" + matrix);
  ASSERT_TRUE(prompted.has_value()) << prompted.error().to_string();
  EXPECT_EQ(cell(*prompted, "GPU0", "GPU1"), "NV4");
  EXPECT_TRUE(std::ranges::any_of(prompted->notes, [](const std::string& n) {
    return n.find("2 lines before the matrix header skipped (line 2: \"user@node:~$ nvidia-smi topo -m\")") !=
           std::string::npos;
  })) << fmt::format("{}", prompted->notes);
  // "GPU0" must be the whole first word: "GPU0:" begins no matrix.
  const auto listed = parse_nvidia_smi_topo("GPU0: NVIDIA H100 (UUID: GPU-1)\n");
  ASSERT_FALSE(listed.has_value());
  EXPECT_NE(listed.error().message().find("line 1: expected the matrix header"), std::string::npos)
      << listed.error().message();
}

TEST(NvidiaSmiParser, OwnFixtureEveryPcieLocality) {
  const auto f = load("fixture-pcie-all-localities.txt");
  ASSERT_EQ(f.gpus.size(), 6u);
  ASSERT_EQ(f.nics.size(), 2u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "GPU2"), "PXB");
  EXPECT_EQ(cell(f, "GPU4", "GPU5"), "PHB");
  EXPECT_EQ(cell(f, "GPU0", "GPU3"), "NODE");
  EXPECT_EQ(cell(f, "GPU0", "GPU4"), "SYS");
  EXPECT_EQ(cell(f, "GPU4", "mlx5_1"), "PXB");
  EXPECT_EQ(f.nics[1].numa, 1);
}

TEST(NvidiaSmiParser, OwnFixtureA100BridgedNoLegend) {
  const auto f = load("fixture-a100-nv12-bridged-nolegend.txt");
  ASSERT_EQ(f.gpus.size(), 4u);
  ASSERT_EQ(f.nics.size(), 1u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "NV12");
  EXPECT_EQ(cell(f, "GPU2", "GPU3"), "NV12");
  EXPECT_EQ(cell(f, "GPU1", "GPU2"), "SYS");
  EXPECT_FALSE(f.find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
  EXPECT_EQ(f.gpus[2].numa, 1);
}

TEST(NvidiaSmiParser, OwnFixtureOldDriverSoc) {
  const auto f = load("fixture-k80-old-driver-soc.txt");
  ASSERT_EQ(f.gpus.size(), 4u);
  EXPECT_EQ(cell(f, "GPU0", "GPU1"), "PIX");
  EXPECT_EQ(cell(f, "GPU0", "GPU2"), "SYS");  // SOC is the old name of SYS
  EXPECT_EQ(cell(f, "GPU2", "GPU3"), "PHB");
  EXPECT_EQ(f.gpus[2].numa, 1);  // inferred from CPU Affinity
}

// Malformed text: every case is refused with the line that is wrong.
struct Malformed {
  const char* name;
  std::string text;
  std::string expect;  // a substring of the message
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

class NvidiaSmiParserMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(NvidiaSmiParserMalformed, IsRefusedNamingTheLine) {
  const auto r = parse_nvidia_smi_topo(GetParam().text);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find(GetParam().expect), std::string::npos) << r.error().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NvidiaSmiParserMalformed,
    ::testing::Values(
        Malformed{"empty", "", "empty"},
        Malformed{"blank", "\n  \n\t\n", "empty"},
        Malformed{"prose", "hello world\nthis is not a matrix\n", "line 1: expected the matrix header"},
        Malformed{"nvidia_smi_error",
                  "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
                  "line 1"},
        Malformed{"missing_row", "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\n\n", "line 3: the matrix ends after 1 rows"},
        Malformed{"truncated", "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7", "the matrix ends after 1 rows"},
        Malformed{"wrong_row_order", "\tGPU0\tGPU1\nGPU1\tNV4\t X \nGPU0\t X \tNV4\n", "line 2: expected the row of \"GPU0\""},
        Malformed{"unknown_cell", "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n", "line 2: GPU0-GPU1: unknown value \"FOO\""},
        Malformed{"nv_zero", "\tGPU0\tGPU1\nGPU0\t X \tNV0\nGPU1\tNV0\t X \n", "unknown value \"NV0\""},
        Malformed{"nv_beyond_ports", "\tGPU0\tGPU1\nGPU0\t X \tNV99\nGPU1\tNV99\t X \n", "unknown value \"NV99\""},
        Malformed{"x_off_diagonal", "\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\t X \t X \n", "X off the diagonal"},
        Malformed{"no_x_on_diagonal", "\tGPU0\tGPU1\nGPU0\tSYS\tSYS\nGPU1\tSYS\t X \n", "on the diagonal must be X"},
        Malformed{"short_row", "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n",
                  "line 2: row \"GPU0\" has 2 cells, expected 3"},
        Malformed{"asymmetric", "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tSYS\t X \n", "line 3: GPU1-GPU0 differs"},
        Malformed{"too_many_values", "\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\t0\t1\n", "has 3 values after the matrix"},
        Malformed{"gpu_gap", "\tGPU0\tGPU2\nGPU0\t X \tNV4\nGPU2\tNV4\t X \n", "column \"GPU2\" where GPU1 was expected"},
        Malformed{"duplicate_column", "\tGPU0\tmlx5_0\tmlx5_0\n", "appears twice"},
        Malformed{"numa_negative", "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-3\t-5\n",
                  "line 2: GPU0: NUMA Affinity \"-5\" (expected 0..1023, a list of nodes or N/A)"},
        Malformed{"numa_huge", "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-3\t99999999999\n",
                  "NUMA Affinity \"99999999999\""},
        Malformed{"cpu_affinity_huge", "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-999999999999\t0\n",
                  "GPU0: CPU Affinity \"0-999999999999\" is not a CPU list"},
        Malformed{"too_many_devices", [] {
                    std::string header;
                    for (int g = 0; g < 257; ++g) header += "\tGPU" + std::to_string(g);
                    return header + "\n";
                  }(), "257 devices in the matrix (at most 256)"},
        Malformed{"nvlink_to_a_nic", "\tGPU0\tNIC0\nGPU0\t X \tNV2\nNIC0\tNV2\t X \n",
                  "line 2: GPU0-NIC0: \"NV2\" but NVLink joins GPUs only; NIC0 is a NIC"},
        Malformed{"values_on_a_nic_row",
                  "\tGPU0\tNIC0\tCPU Affinity\nGPU0\t X \tPIX\t0-7\nNIC0\tPIX\t X \t0-7\n",
                  "line 3: row \"NIC0\" is a NIC's but has 1 values after the matrix"},
        Malformed{"utf16", std::string("\xFF\xFE\tGPU0\n", 7), "UTF-16"},
        Malformed{"nic_legend_index_overflow",
                  "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC99999999999: mlx5_0\n",
                  "line 7: NIC legend index \"99999999999\" is out of range"},
        // A GPU row that stops short would have its values read as other
        // columns' (a guessed NUMA id that collided with a given one).
        Malformed{"gpu_row_short_of_the_header",
                  "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-7\t1\nGPU1\tSYS\t X \t8-15\n",
                  "line 3: row \"GPU1\" has no NUMA Affinity value (the header names one"},
        // Names reach a terminal: an escape sequence in one would act there.
        Malformed{"legend_name_with_escapes",
                  "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\n  NIC0: mlx5_0\x07\x1b]0;pwned\x07\n",
                  "line 5: NIC0 legend name \"mlx5_0"},
        Malformed{"legend_name_not_ascii",
                  "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\n  NIC0: \xE2\x80\xAEmlx5_0\n",
                  "is not a device name"},
        Malformed{"column_name_with_escapes", "\tGPU0\tmlx5\x1b]0;x\x07\n", "line 1: column \"mlx5"},
        Malformed{"column_name_too_long", "\tGPU0\t" + std::string(300, 'n') + "\n", "is not a device name"},
        Malformed{"legend_twice",
                  "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\n  NIC0: mlx5_0\n  NIC0: mlx5_9\n",
                  "line 6: NIC0 named twice (\"mlx5_0\", then \"mlx5_9\")"},
        Malformed{"legend_same_name",
                  "\tGPU0\tNIC0\tNIC1\nGPU0\t X \tPIX\tPIX\nNIC0\tPIX\t X \tPIX\nNIC1\tPIX\tPIX\t X \n\n"
                  "  NIC0: mlx5_0\n  NIC1: mlx5_0\n",
                  "line 7: NIC0 and NIC1 both named \"mlx5_0\""},
        Malformed{"legend_for_a_missing_nic",
                  "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\n  NIC0: mlx5_0\n  NIC7: foo\n",
                  "line 6: legend for NIC7, which is not a column of the matrix"},
        // Two outputs pasted together, or a row the header does not name:
        // the rest was dropped without a word.
        Malformed{"second_matrix",
                  "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n\n\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tNV4\n",
                  "line 5: \"GPU0 GPU1 GPU2\" after the matrix ended (its header names 2 devices, GPU0 .. GPU1)"},
        Malformed{"row_beyond_the_header",
                  "\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\t X \nGPU2\tSYS\tSYS\t X \n",
                  "line 4: \"GPU2 SYS SYS X\" after the matrix ended"},
        // 16 MiB of empty lines took 1.4 GB and 6 s to say "empty".
        Malformed{"too_many_lines", std::string(100'000, '\n'), "more than 65536 lines"}),
    [](const auto& info) { return std::string(info.param.name); });

// A NIC that reaches GPUs of two NUMA nodes without the socket link is on
// neither, whatever order the GPUs come in (the third GPU set it again).
TEST(NvidiaSmiParser, ANicBetweenTwoNodesIsUnknownInAnyOrder) {
  auto matrix = [](int a, int b, int c) {
    return fmt::format(
        "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\tSYS\tNODE\t0-7\t{}\nGPU1\tSYS\t X \tSYS\tNODE\t0-7\t{}\n"
        "GPU2\tSYS\tSYS\t X \tNODE\t0-7\t{}\nNIC0\tNODE\tNODE\tNODE\t X \n",
        a, b, c);
  };
  for (const auto& [a, b, c] : {std::tuple{0, 1, 0}, std::tuple{0, 0, 1}, std::tuple{1, 0, 0}}) {
    const auto f = parse_nvidia_smi_topo(matrix(a, b, c));
    ASSERT_TRUE(f.has_value()) << f.error().to_string();
    EXPECT_EQ(f->nics[0].numa, kUnknownNuma) << a << b << c;
  }
  const auto agreed = parse_nvidia_smi_topo(matrix(1, 1, 1));
  ASSERT_TRUE(agreed.has_value()) << agreed.error().to_string();
  EXPECT_EQ(agreed->nics[0].numa, 1);
}

// A GB200 tray in a container: GPU2 and GPU3 print an empty CPU Affinity
// (`\t\t1\t\tN/A`). Read as tokens, their NUMA node 1 became the CPU list
// "1", their node unknown and NUMA node 1 missing.
TEST(NvidiaSmiParser, Gb200InAContainerWithAnEmptyCpuAffinity) {
  const auto f = load("gb200-4gpu-6nic-container-empty-cpu-affinity.txt");
  ASSERT_EQ(f.gpus.size(), 4u);
  ASSERT_EQ(f.nics.size(), 6u);
  EXPECT_EQ(f.nics[5].name, "mlx5_5");
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(f.gpus[g].numa, g < 2 ? 0 : 1) << g;
    EXPECT_EQ(f.gpus[g].cpu_affinity, g < 2 ? "0-35" : "") << g;
    EXPECT_FALSE(f.gpus[g].gpu_numa_id.has_value()) << g;
  }
  EXPECT_EQ(cell(f, "GPU0", "GPU3"), "NV18");
  EXPECT_EQ(cell(f, "GPU2", "NIC4"), "NODE");
  ASSERT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(f.numa_nodes[1].os_index, 1);
  EXPECT_TRUE(f.notes.empty()) << f.notes.front();
}

// Tab-separated values after the matrix: an empty field is a value (an
// unknown one), except just before an N/A, where nvidia-smi pads with a
// second tab; trailing tabs are nothing. Space-aligned text has no empty
// values to find.
TEST(NvidiaSmiParser, AnEmptyAffinityFieldKeepsTheColumnsAfterIt) {
  auto numa_of = [](std::string_view values) {
    const auto f = parse_nvidia_smi_topo(fmt::format(
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tSYS\t0-7\t0\t\tN/A\n"
        "GPU1\tSYS\t X \t{}\n", values));
    EXPECT_TRUE(f.has_value()) << values << ": " << f.error().to_string();
    return f ? std::pair{f->gpus[1].numa, f->gpus[1].cpu_affinity} : std::pair{-2, std::string("?")};
  };
  EXPECT_EQ(numa_of("8-15\t1\t\tN/A"), (std::pair{1, std::string("8-15")}));
  EXPECT_EQ(numa_of("\t1\t\tN/A"), (std::pair{1, std::string()}));         // empty CPU Affinity
  EXPECT_EQ(numa_of("\t1\t\tN/A\t\t"), (std::pair{1, std::string()}));     // trailing tabs
  EXPECT_EQ(numa_of("8-15\t\t\tN/A"), (std::pair{kUnknownNuma, std::string("8-15")}));  // empty NUMA
  EXPECT_EQ(numa_of("8-15\t\tN/A\t\tN/A"), (std::pair{kUnknownNuma, std::string("8-15")}));  // N/A, padded
  EXPECT_EQ(numa_of("8-15   1   N/A\t"), (std::pair{1, std::string("8-15")}));  // spaces, then a tab at the end
  const auto spaced = parse_nvidia_smi_topo(
      "        GPU0    CPU Affinity    NUMA Affinity   GPU NUMA ID\nGPU0     X      0-7             1               N/A\n");
  ASSERT_TRUE(spaced.has_value()) << spaced.error().to_string();
  EXPECT_EQ(spaced->gpus[0].numa, 1);
}

// The node a NIC is on when it is SYS to every GPU of the one node the text
// names: not that one. It was taken as local to it, priced at RDMA's local
// 24 GB/s (a real output: 4 of 8 A100s, all on node 1, and a RoCE NIC
// across the socket link).
TEST(NvidiaSmiParser, ANicAcrossTheSocketLinkFromTheOnlyNamedNodeIsRemoteToIt) {
  const auto f = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV12\tSYS\t32-63\t1\nGPU1\tNV12\t X \tSYS\t32-63\t1\nNIC0\tSYS\tSYS\t X \n");
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  EXPECT_EQ(f->nics[0].numa, kUnknownNuma);
  EXPECT_FALSE(f->numa_nodes_complete);
  auto graph = TopologyGraph::build(*f);
  ASSERT_TRUE(graph.has_value()) << graph.error().to_string();
  auto nic = graph->rank("numa1", "nic0");
  ASSERT_TRUE(nic.has_value()) << nic.error().to_string();
  EXPECT_EQ(nic->best().proximity, Proximity::kRemote);
  auto gpu = graph->rank("numa1", "gpu0");
  ASSERT_TRUE(gpu.has_value()) << gpu.error().to_string();
  EXPECT_EQ(gpu->best().proximity, Proximity::kLocal);
}

// A CPU set that a job or container gives every GPU is no socket where the
// matrix says two of them are on different ones, by SYS between them or
// through a NIC near one and SYS to the other: their node stays unknown
// (it was one node for all). Another CPU set is still a node of its own.
TEST(NvidiaSmiParser, ACpuSetSharedAcrossTheSocketLinkPlacesNoGpu) {
  const auto through_nic = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV4\tNV4\tSYS\t0,64\t0-3\nGPU1\tNV4\t X \tNV4\tSYS\t0,64\t0-3\n"
      "GPU2\tNV4\tNV4\t X \tPHB\t0,64\t0-3\nNIC0\tSYS\tSYS\tPHB\t X \n");
  ASSERT_TRUE(through_nic.has_value()) << through_nic.error().to_string();
  for (const GpuInfo& g : through_nic->gpus) EXPECT_EQ(g.numa, kUnknownNuma) << g.name;
  EXPECT_EQ(through_nic->nics[0].numa, kUnknownNuma);
  ASSERT_EQ(through_nic->numa_nodes.size(), 1u);
  EXPECT_EQ(through_nic->numa_nodes[0].cpus, "0,64");
  ASSERT_EQ(through_nic->notes.size(), 1u);
  EXPECT_NE(through_nic->notes[0].find("(NIC0 is SYS to one of them only)"), std::string::npos)
      << through_nic->notes[0];

  const auto two_sets = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tSYS\tSYS\t0-3\nGPU1\tSYS\t X \tSYS\t0-3\n"
      "GPU2\tSYS\tSYS\t X \t4-7\n");
  ASSERT_TRUE(two_sets.has_value()) << two_sets.error().to_string();
  EXPECT_EQ(two_sets->gpus[0].numa, kUnknownNuma);
  EXPECT_EQ(two_sets->gpus[1].numa, kUnknownNuma);
  EXPECT_EQ(two_sets->gpus[2].numa, 1);
  EXPECT_EQ(two_sets->numa_nodes.size(), 2u);
  ASSERT_EQ(two_sets->notes.size(), 1u);
  EXPECT_NE(two_sets->notes[0].find("GPU0 and GPU1 share CPU Affinity \"0-3\""), std::string::npos)
      << two_sets->notes[0];
  EXPECT_NE(two_sets->notes[0].find("the others' inferred from CPU Affinity"), std::string::npos)
      << two_sets->notes[0];
}

// A NUMA node's CPU count counts each CPU once, and cannot wrap.
TEST(NvidiaSmiParser, CpuCountsAreOfDistinctCpus) {
  const auto f = parse_nvidia_smi_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-3,0-3,2\t0\n");
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  ASSERT_EQ(f->numa_nodes.size(), 1u);
  EXPECT_EQ(f->numa_nodes[0].cpu_count, 4);
  std::string many = "0-8191";
  for (int i = 0; i < 2000; ++i) many += ",0-8191";
  const auto g = parse_nvidia_smi_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t" + many + "\t0\n");
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_EQ(g->numa_nodes[0].cpu_count, 8192);
}

// A file saved with a UTF-8 byte order mark reads as the same machine.
TEST(NvidiaSmiParser, AByteOrderMarkIsSkipped) {
  const std::string matrix = "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n";
  const auto plain = parse_nvidia_smi_topo(matrix);
  const auto marked = parse_nvidia_smi_topo("\xEF\xBB\xBF" + matrix);
  ASSERT_TRUE(plain.has_value()) << plain.error().to_string();
  ASSERT_TRUE(marked.has_value()) << marked.error().to_string();
  EXPECT_EQ(marked->gpus.size(), 2u);
  EXPECT_EQ(marked->relations.size(), plain->relations.size());
}

// The same file with classic Mac line ends (a lone CR), or with CRLF
// converted twice (CR CR LF), reads as the same machine.
TEST(NvidiaSmiParser, AnyLineEndReadsAsTheSameMachine) {
  std::ifstream in(data("h200-8gpu-10nic-glm.txt"), std::ios::binary);
  std::string lf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::erase(lf, '\r');
  std::string cr = lf, crcrlf;
  std::ranges::replace(cr, '\n', '\r');
  for (char c : lf) crcrlf += c == '\n' ? std::string("\r\r\n") : std::string(1, c);
  const auto plain = parse_nvidia_smi_topo(lf);
  ASSERT_TRUE(plain.has_value()) << plain.error().to_string();
  for (const std::string& text : {cr, crcrlf}) {
    const auto f = parse_nvidia_smi_topo(text);
    ASSERT_TRUE(f.has_value()) << f.error().to_string();
    EXPECT_EQ(f->gpus.size(), plain->gpus.size());
    EXPECT_EQ(f->nics.size(), plain->nics.size());
    ASSERT_EQ(f->relations.size(), plain->relations.size());
    for (std::size_t i = 0; i < f->relations.size(); ++i) {
      EXPECT_EQ(f->relations[i].nvlinks, plain->relations[i].nvlinks) << i;
      EXPECT_EQ(f->relations[i].pci, plain->relations[i].pci) << i;
    }
  }
  // An error's line number counts a lone CR as a line end too.
  const auto bad = parse_nvidia_smi_topo("\tGPU0\tGPU1\rGPU0\t X \tNV4\rGPU1\tNV4\t Q \r");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("line 3"), std::string::npos) << bad.error().message();
}

// What the file says is quoted back bounded and printable: a huge line or
// binary garbage does not become a huge or binary message.
TEST(NvidiaSmiParser, ErrorsQuoteAtMostEightyPrintableBytes) {
  std::string garbage(1 << 20, 'A');
  garbage[3] = '\0';
  garbage[4] = '\x1b';
  const auto header = parse_nvidia_smi_topo(garbage + "\n");
  ASSERT_FALSE(header.has_value());
  const std::string& m = header.error().message();
  EXPECT_LT(m.size(), 300u) << m.size();
  EXPECT_NE(m.find("AAA\\x00\\x1bAAA"), std::string::npos) << m;
  EXPECT_NE(m.find("(1048576 bytes)"), std::string::npos) << m;
  EXPECT_EQ(m.find('\0'), std::string::npos);
  const auto cell = parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tNV\x01\x02\nGPU1\tNV2\t X \n");
  ASSERT_FALSE(cell.has_value());
  EXPECT_NE(cell.error().message().find("\"NV\\x01\\x02\""), std::string::npos) << cell.error().message();
}

// A legend line of any length is read or skipped, never a crash (a regex
// recursed per character and overflowed the stack at about 26 000); text
// copied from a web page, non-breaking spaces between its columns, reads
// as the same machine.
TEST(NvidiaSmiParser, LongLegendLinesAndNonBreakingSpacesParse) {
  const std::string matrix = "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC0: mlx5_7\n";
  for (const std::string& tail : {std::string(1 << 20, ' '), "  NIC1:" + std::string(1 << 20, ' ') + "mlx5_1 x",
                                  "NIC0:" + std::string(1 << 20, ' ') + "mlx5_9 trailing"}) {
    const auto f = parse_nvidia_smi_topo(matrix + tail + "\n");
    ASSERT_TRUE(f.has_value()) << f.error().to_string();
    ASSERT_EQ(f->nics.size(), 1u);
    EXPECT_EQ(f->nics[0].name, "mlx5_7");
  }
  const auto long_name = parse_nvidia_smi_topo(matrix + "  NIC0: " + std::string(1 << 20, 'x') + "\n");
  ASSERT_FALSE(long_name.has_value());
  EXPECT_NE(long_name.error().message().find("NIC0 legend name of 1048576 bytes (at most 255)"), std::string::npos)
      << long_name.error().message();
  std::string copied = matrix;
  for (std::size_t at = copied.find('\t'); at != std::string::npos; at = copied.find('\t', at)) {
    copied.replace(at, 1, "\xC2\xA0");
  }
  const auto f = parse_nvidia_smi_topo(copied);
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  EXPECT_EQ(f->gpus.size(), 1u);
  EXPECT_EQ(f->nics.size(), 1u);
}

// A pipe reads as a file does (`--nvidia-smi <(nvidia-smi topo -m)`).
TEST(NvidiaSmiParser, APipeReadsAsAFile) {
  const std::string path = (std::filesystem::temp_directory_path() / ("baton-topo-fifo-" + std::to_string(::getpid()))).string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(path, std::ios::binary);
    out << "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n";
  });
  const auto f = load_nvidia_smi_topo(path);
  writer.join();
  std::filesystem::remove(path);
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  EXPECT_EQ(f->gpus.size(), 2u);
}

// Two GPUs at NV18, every link of each to the other: a bridged pair (H200
// NVL) or two GPUs of an NVSwitch machine (a container given two of its
// eight) — nvidia-smi cannot tell them apart. A bond, with a note; the
// legend after the matrix still reads.
TEST(NvidiaSmiParser, TwoGpusBondedByAllTheirLinksAreABondWithANote) {
  const auto f = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV18\tPXB\t0-31\t0\n"
      "GPU1\tNV18\t X \tNODE\t0-31\t0\n"
      "NIC0\tPXB\tNODE\t X \n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
      "NIC Legend:\n\n  NIC0: mlx5_0\n");
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  EXPECT_FALSE(f->find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
  EXPECT_EQ(f->gpus[0].nvlink_active, 18);
  EXPECT_EQ(f->nics[0].name, "mlx5_0");
  ASSERT_EQ(f->notes.size(), 1u) << fmt::format("{}", fmt::join(f->notes, "; "));
  EXPECT_NE(f->notes[0].find("GPU0-GPU1 is NV18, every link of each to the other"), std::string::npos) << f->notes[0];
  // Twelve links to one peer say nothing (an A100 pair's NVLink bridges).
  const auto bridged = parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV12\t X \n");
  ASSERT_TRUE(bridged.has_value());
  EXPECT_FALSE(bridged->find({DeviceRef::Kind::kGpu, 0}, {DeviceRef::Kind::kGpu, 1})->via_nvswitch);
  for (const std::string& note : bridged->notes) EXPECT_EQ(note.find("every link"), std::string::npos) << note;
}

// What a matrix says that no machine shows is used as written, with a note
// (a VM's nvidia-smi may get either side wrong), never without a word.
TEST(NvidiaSmiParser, ContradictionsAreUsedAsWrittenWithANote) {
  auto notes = [](const std::string& text) {
    auto f = parse_nvidia_smi_topo(text);
    EXPECT_TRUE(f.has_value()) << f.error().to_string();
    return f ? fmt::format("{}", fmt::join(f->notes, "; ")) : std::string();
  };
  // NV2 between two GPUs that reach a third over the fabric with NV18.
  EXPECT_NE(notes("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV18\tNV2\nGPU1\tNV18\t X \tNV18\nGPU2\tNV2\tNV18\t X \n")
                .find("GPU0-GPU2 is NV2 on an NVSwitch fabric where both show NV18"),
            std::string::npos);
  // One switch's PCIe, two NUMA nodes.
  EXPECT_NE(notes("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPIX\t0-15\t0\nGPU1\tPIX\t X \t16-31\t1\n")
                .find("GPU0-GPU1 is PIX but their NUMA Affinity is 0 and 1"),
            std::string::npos);
  // The socket link between two GPUs of one node.
  EXPECT_NE(notes("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-15\t0\nGPU1\tSYS\t X \t0-15\t0\n")
                .find("GPU0-GPU1 is SYS but their NUMA Affinity is 0 and 0"),
            std::string::npos);
  // A legend that names one NIC of two.
  EXPECT_NE(notes("\tGPU0\tNIC0\tNIC1\nGPU0\t X \tPIX\tSYS\nNIC0\tPIX\t X \tSYS\nNIC1\tSYS\tSYS\t X \n\n"
                  "NIC Legend:\n\n  NIC0: mlx5_0\n")
                .find("the NIC Legend names no device for NIC1"),
            std::string::npos);
  // Two GPUs of one node with different CPU sets: the node takes both.
  EXPECT_NE(notes("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPIX\t0-7\t0\nGPU1\tPIX\t X \t8-15,32\t0\n")
                .find("the GPUs of NUMA node 0 give different CPU Affinity (0-7 / 8-15,32): the node takes them all "
                      "(0-15,32)"),
            std::string::npos);
  {
    auto f = parse_nvidia_smi_topo(
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPIX\tSYS\t\t0\nGPU1\tPIX\t X \tSYS\t0-7\t0\n"
        "GPU2\tSYS\tSYS\t X \t8-15,17,19-20\t0\n");
    ASSERT_TRUE(f.has_value()) << f.error().to_string();
    ASSERT_EQ(f->numa_nodes.size(), 1u);
    EXPECT_EQ(f->numa_nodes[0].cpus, "0-15,17,19-20") << "the first GPU gave no set: the others' union";
    EXPECT_EQ(f->numa_nodes[0].cpu_count, 19);
    EXPECT_EQ(f->gpus[1].cpu_affinity, "0-7") << "each GPU keeps its own";
  }
  // What agrees says nothing.
  EXPECT_EQ(notes("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-15\t0\nGPU1\tSYS\t X \t16-31\t1\n"),
            "");
}

TEST(NvidiaSmiParser, UnreadableFileIsNotFound) {
  EXPECT_EQ(load_nvidia_smi_topo(data("no-such-file.txt")).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(load_nvidia_smi_topo(std::string(BATON_TEST_DATA_DIR)).error().code(), StatusCode::kNotFound);
  // A NUL ends the path for the system calls: the directory would be opened.
  EXPECT_EQ(load_nvidia_smi_topo(std::string(BATON_TEST_DATA_DIR) + std::string("\0x", 2)).error().code(),
            StatusCode::kInvalidArgument);
}

TEST(NvidiaSmiParser, FileErrorsNameTheFile) {
  const auto r = load_nvidia_smi_topo(data("README.md"));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("README.md"), std::string::npos);
  EXPECT_NE(r.error().message().find("line 1"), std::string::npos);
}

}  // namespace
}  // namespace baton::topology
