// `baton topo` as a user runs it: the JSON contract, the table, and a clear
// one-line error with a non-zero exit for every bad input.
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/baton_cli.h"

namespace {

using baton::testing::CommandRun;
using baton::testing::slurp;

CommandRun baton(const std::string& args) { return baton::testing::run_baton(args); }

std::string data(const std::string& name) {
  return std::string(BATON_TEST_DATA_DIR) + "/nvidia-smi-topo/" + name;
}

nlohmann::json json_of(const CommandRun& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

void expect_contract(const nlohmann::json& j, std::size_t gpus, std::size_t nics) {
  for (const char* key : {"source", "gpus", "nics", "numa_nodes", "links", "routes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
  }
  ASSERT_EQ(j["gpus"].size(), gpus);
  ASSERT_EQ(j["nics"].size(), nics);
  for (std::size_t i = 0; i < gpus; ++i) {
    const auto& g = j["gpus"][i];
    EXPECT_EQ(g["id"], "gpu" + std::to_string(i));
    for (const char* key : {"name", "pci", "numa"}) EXPECT_TRUE(g.contains(key)) << key;
  }
  for (std::size_t i = 0; i < nics; ++i) EXPECT_EQ(j["nics"][i]["id"], "nic" + std::to_string(i));
  for (const auto& l : j["links"]) {
    for (const char* key : {"from", "to", "path", "bandwidth_gbps", "latency_us", "score"}) {
      EXPECT_TRUE(l.contains(key)) << key;
    }
    EXPECT_GT(l["bandwidth_gbps"].get<double>(), 0);
  }
  // Every GPU pair once and every GPU→NIC pair, each chain ending in host staging.
  EXPECT_EQ(j["routes"].size(), gpus * (gpus - 1) / 2 + gpus * nics);
  for (const auto& r : j["routes"]) {
    ASSERT_FALSE(r["chain"].empty());
    EXPECT_EQ(r["chain"].back(), "host_staging");
  }
}

TEST(TopoCommand, ModelNvswitch8Json) {
  const auto j = json_of(baton("topo --model nvswitch8 --json -"));
  expect_contract(j, 8, 8);
  EXPECT_EQ(j["source"], "model:nvswitch8");
  EXPECT_EQ(j["numa_nodes"].size(), 2u);
  EXPECT_EQ(j["routes"][0]["from"], "gpu0");
  EXPECT_EQ(j["routes"][0]["to"], "gpu1");
  EXPECT_EQ(j["routes"][0]["chain"], nlohmann::json::parse(R"(["nvswitch", "host_staging"])"));
  int gdr_pix = 0;
  for (const auto& r : j["routes"]) {
    if (r["to"].get<std::string>().starts_with("nic") && r["chain"][0] == "gdr") ++gdr_pix;
  }
  EXPECT_EQ(gdr_pix, 8);  // each GPU: its own NIC (PIX); at NODE, host staging (NCCL's default GDR level)
}

TEST(TopoCommand, ProbeThisMachineJson) {
  const auto j = json_of(baton("topo --json -"));
  expect_contract(j, j["gpus"].size(), j["nics"].size());
  EXPECT_GE(j["numa_nodes"].size(), 1u);
  EXPECT_NE(j["source"].get<std::string>().find("hwloc"), std::string::npos);
  // The explicit flag is the same as the default.
  EXPECT_EQ(json_of(baton("topo --probe --json -"))["numa_nodes"], j["numa_nodes"]);
}

TEST(TopoCommand, RealNvidiaSmiFileJson) {
  const auto j = json_of(baton("topo --nvidia-smi " + data("h200-8gpu-10nic-glm.txt") + " --json -"));
  expect_contract(j, 8, 10);
  EXPECT_EQ(j["nics"][9]["name"], "mlx5_9");
  std::set<std::string> paths;
  for (const auto& l : j["links"]) paths.insert(l["path"]);
  EXPECT_TRUE(paths.contains("nvswitch"));
  EXPECT_TRUE(paths.contains("gdr"));
  EXPECT_TRUE(paths.contains("host_staging"));
  EXPECT_FALSE(paths.contains("nvlink"));
}

TEST(TopoCommand, JsonToAFileAndTableToStdout) {
  const std::string path = fmt::format("{}/topo-{}.json", ::testing::TempDir(), getpid());
  const CommandRun r = baton("topo --model pcie4 --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Topology from model:pcie4"), std::string::npos);
  EXPECT_NE(r.out.find("gpu3"), std::string::npos);
  expect_contract(nlohmann::json::parse(slurp(path)), 4, 2);
  std::remove(path.c_str());
}

TEST(TopoCommand, TableShowsTheRouteMatrix) {
  const CommandRun r = baton("topo --model nvlink-pairs");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NV4"), std::string::npos);
  EXPECT_NE(r.out.find("nvlink 100 GB/s"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(TopoCommand, BadInputFailsWithOneLine) {
  const std::string malformed = fmt::format("{}/malformed-topo-{}.txt", ::testing::TempDir(), getpid());
  std::ofstream(malformed) << "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tBOGUS\t X \n";
  const std::pair<std::string, std::string> cases[] = {
      {"topo --model dgx9000", "\"dgx9000\""},
      {"topo --nvidia-smi /nonexistent/topo.txt", "/nonexistent/topo.txt"},
      {"topo --nvidia-smi " + malformed, "line 3"},
      {"topo --json /nonexistent/dir/out.json --model pcie4", "/nonexistent/dir/out.json"},
  };
  for (const auto& [args, needle] : cases) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args;  // each is the caller's input
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
  // Two sources at once is a usage error from the command line parser.
  EXPECT_NE(baton("topo --model pcie4 --nvidia-smi " + malformed).exit_code, 0);
  std::remove(malformed.c_str());
  EXPECT_NE(baton("topo --no-such-flag").exit_code, 0);
  EXPECT_NE(baton("").exit_code, 0);
  // An empty path or model fell back to probing this machine without a word.
  for (const char* empty : {"topo --nvidia-smi ''", "topo --model ''"}) {
    const CommandRun r = baton(empty);
    EXPECT_EQ(r.exit_code, 2) << empty;
    EXPECT_NE(r.err.find("an empty value"), std::string::npos) << empty << ": " << r.err;
  }
}

// Output that cannot be written (a full disk, here /dev/full) fails the
// run and says so; it exited 0 with the table lost.
TEST(TopoCommand, OutputThatCannotBeWrittenFailsTheRun) {
  const std::string err = fmt::format("{}/full-{}.err", ::testing::TempDir(), getpid());
  const int status = std::system(fmt::format("{} topo --model pcie4 >/dev/full 2>{}", BATON_BINARY, err).c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(baton::testing::slurp(err).find("baton topo: writing the output failed"), std::string::npos)
      << baton::testing::slurp(err);
  std::remove(err.c_str());
}

// Any flag given an empty value (an unset variable in a script) is refused
// in one line; some fell back to their defaults without a word.
TEST(TopoCommand, AnEmptyValueIsRefusedEverywhere) {
  for (const std::string args : {"bench mixed --decode-size ''", "bench mlu-sweep --request-size ''",
                                 "serve --token-file ''", "demo --target ''", "bench deadlines --background-size ''"}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find(": an empty value"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

}  // namespace
