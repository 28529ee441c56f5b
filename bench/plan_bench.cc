// Microbenchmarks of the transfer plan on the 36-layer × TP 8 K/V fixture
// (TP ranks over two sockets) at 1, 8, 64 and 4500 blocks: each step alone,
// and the naive per-(block, slot) encoding it replaces. The 4500-block
// encode and rebuild carry the targets in docs/results.md.
#include <benchmark/benchmark.h>

#include "baton/plan/encode.h"
#include "baton/plan/fixtures.h"
#include "baton/plan/materialize.h"
#include "baton/plan/naive.h"
#include "baton/plan/rebuild.h"
#include "baton/plan/wire.h"
#include "baton/topology/probe.h"

namespace {

using namespace baton::plan;

PlacementTable fixture(benchmark::State& state) {
  PlacementTable table;
  const FixtureSpec spec{.blocks = static_cast<std::uint32_t>(state.range(0)),
                         .numa = NumaLayout::kSlotsAcrossSockets};
  if (!fill_fixture(spec, table).is_ok()) state.SkipWithError("fixture");
  return table;
}

void report(benchmark::State& state, std::size_t wire_bytes) {
  state.counters["blocks"] = static_cast<double>(state.range(0));
  state.counters["wire_bytes"] = static_cast<double>(wire_bytes);
}

void BM_PlanEncode(benchmark::State& state) {
  const PlacementTable table = fixture(state);
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string wire = serialize_plan(encode_plan(table).value());
    bytes = wire.size();
    benchmark::DoNotOptimize(wire.data());
  }
  report(state, bytes);
}

void BM_NaiveEncode(benchmark::State& state) {
  const PlacementTable table = fixture(state);
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string wire = serialize_naive(table).value();
    bytes = wire.size();
    benchmark::DoNotOptimize(wire.data());
  }
  report(state, bytes);
}

void BM_PlanDecode(benchmark::State& state) {
  const std::string wire = serialize_plan(encode_plan(fixture(state)).value());
  for (auto _ : state) benchmark::DoNotOptimize(parse_plan(wire));
  report(state, wire.size());
}

void BM_NaiveDecode(benchmark::State& state) {
  const std::string wire = serialize_naive(fixture(state)).value();
  for (auto _ : state) benchmark::DoNotOptimize(parse_naive(wire));
  report(state, wire.size());
}

void BM_PlanMaterialize(benchmark::State& state) {
  const Plan plan = encode_plan(fixture(state)).value();
  const auto graph = baton::topology::TopologyGraph::build(baton::topology::load_model("nvswitch8").value()).value();
  std::size_t ops = 0;
  for (auto _ : state) {
    auto m = materialize(plan, graph);
    ops = m->ops.size();
    benchmark::DoNotOptimize(m);
  }
  state.counters["ops"] = static_cast<double>(ops);
}

void BM_PlanRebuild(benchmark::State& state) {
  const Plan plan = encode_plan(fixture(state)).value();
  Rebuilder rebuilder;
  for (auto _ : state) benchmark::DoNotOptimize(rebuilder.rebuild(plan));
}

#define PLAN_SIZES ->Arg(1)->Arg(8)->Arg(64)->Arg(4500)->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_PlanEncode) PLAN_SIZES;
BENCHMARK(BM_NaiveEncode) PLAN_SIZES;
BENCHMARK(BM_PlanDecode) PLAN_SIZES;
BENCHMARK(BM_NaiveDecode) PLAN_SIZES;
BENCHMARK(BM_PlanMaterialize) PLAN_SIZES;
BENCHMARK(BM_PlanRebuild) PLAN_SIZES;

}  // namespace
