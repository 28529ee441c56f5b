// Microbenchmarks of the topology layer: how long a cold start spends parsing
// and building, and what one rank() costs (the scheduler calls it per
// request pair when it materialises chains).
#include <fstream>
#include <sstream>

#include <benchmark/benchmark.h>

#include "baton/topology/graph.h"
#include "baton/topology/probe.h"

namespace {

using namespace baton::topology;

std::string h200_text() {
  std::ifstream in(std::string(BATON_TEST_DATA_DIR) + "/nvidia-smi-topo/h200-8gpu-10nic-glm.txt");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void BM_ParseNvidiaSmiH200(benchmark::State& state) {
  const std::string text = h200_text();
  for (auto _ : state) benchmark::DoNotOptimize(parse_nvidia_smi_topo(text));
}
BENCHMARK(BM_ParseNvidiaSmiH200);

void BM_BuildGraphNvswitch8(benchmark::State& state) {
  const auto facts = load_model("nvswitch8").value();
  for (auto _ : state) benchmark::DoNotOptimize(TopologyGraph::build(facts));
}
BENCHMARK(BM_BuildGraphNvswitch8);

void BM_RankGpuPair(benchmark::State& state) {
  const auto graph = TopologyGraph::build(load_model("nvswitch8").value()).value();
  for (auto _ : state) benchmark::DoNotOptimize(graph.rank("gpu1", "gpu6"));
}
BENCHMARK(BM_RankGpuPair);

}  // namespace
