// Microbenchmarks of the transfer plan on the 36-layer × TP 8 K/V fixture
// (TP ranks over two sockets) at 1, 8, 64 and 4500 blocks: each step alone,
// and the naive per-(block, slot) encoding it replaces. The 4500-block
// encode and rebuild carry the targets in docs/results.md. BM_View* measure
// the rebuilt plan's view accessor in a requester's loop against the
// pointer table it replaced, on three shapes: one run per slot segment,
// a hole every 16 blocks, and an MLA replica whose blocks alternate nodes.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

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

// Shapes for the view benchmarks: state.range(1).
FixtureSpec view_spec(benchmark::State& state) {
  FixtureSpec spec{.blocks = static_cast<std::uint32_t>(state.range(0)), .numa = NumaLayout::kSlotsAcrossSockets};
  if (state.range(1) == 1) spec.run_blocks = 16;
  if (state.range(1) == 2) spec = {.blocks = spec.blocks, .layers = 61, .tp = 1, .mla = true, .head_dim = 576,
                                   .numa = NumaLayout::kBlocksAlternate};
  return spec;
}

RebuiltPlan rebuilt_for(benchmark::State& state, Rebuilder& rebuilder) {
  PlacementTable table;
  if (!fill_fixture(view_spec(state), table).is_ok()) state.SkipWithError("fixture");
  return rebuilder.rebuild(encode_plan(table).value()).value();
}

void count_views(benchmark::State& state, const RebuiltPlan& plan) {
  const double views = static_cast<double>(plan.blocks()) * plan.slots() * plan.segments_per_slot();
  state.SetItemsProcessed(static_cast<std::int64_t>(views * static_cast<double>(state.iterations())));
  state.counters["runs"] = static_cast<double>(plan.runs());
}

// Every view, block by block (a requester walking its blocks' slots).
void BM_ViewBlockOrder(benchmark::State& state) {
  Rebuilder rebuilder;
  const RebuiltPlan plan = rebuilt_for(state, rebuilder);
  for (auto _ : state) {
    std::uintptr_t sum = 0;
    for (std::uint32_t b = 0; b < plan.blocks(); ++b) {
      for (std::uint32_t s = 0; s < plan.slots(); ++s) {
        for (std::uint32_t g = 0; g < plan.segments_per_slot(); ++g) {
          sum += reinterpret_cast<std::uintptr_t>(plan.view(b, s, g));
        }
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  count_views(state, plan);
}

// Every view, slot segment by slot segment (block order inside).
void BM_ViewColumnOrder(benchmark::State& state) {
  Rebuilder rebuilder;
  const RebuiltPlan plan = rebuilt_for(state, rebuilder);
  for (auto _ : state) {
    std::uintptr_t sum = 0;
    for (std::uint32_t s = 0; s < plan.slots(); ++s) {
      for (std::uint32_t g = 0; g < plan.segments_per_slot(); ++g) {
        for (std::uint32_t b = 0; b < plan.blocks(); ++b) sum += reinterpret_cast<std::uintptr_t>(plan.view(b, s, g));
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  count_views(state, plan);
}

// views(): a slot segment's whole block table into the caller's buffer.
void BM_ViewBulk(benchmark::State& state) {
  Rebuilder rebuilder;
  const RebuiltPlan plan = rebuilt_for(state, rebuilder);
  std::vector<std::byte*> column(plan.blocks());
  for (auto _ : state) {
    for (std::uint32_t s = 0; s < plan.slots(); ++s) {
      for (std::uint32_t g = 0; g < plan.segments_per_slot(); ++g) {
        plan.views(s, g, 0, column);
        benchmark::DoNotOptimize(column.data());
      }
    }
  }
  count_views(state, plan);
}

// The baseline: the [slot][segment][block] pointer table the rebuild used to
// write (21 MB at 4500 blocks), read block by block as in BM_ViewBlockOrder.
void BM_ViewTableBlockOrder(benchmark::State& state) {
  Rebuilder rebuilder;
  const RebuiltPlan plan = rebuilt_for(state, rebuilder);
  const std::size_t columns = std::size_t{plan.slots()} * plan.segments_per_slot();
  std::vector<std::byte*> table(columns * plan.blocks());
  for (std::uint32_t s = 0; s < plan.slots(); ++s) {
    for (std::uint32_t g = 0; g < plan.segments_per_slot(); ++g) {
      plan.views(s, g, 0, std::span(table).subspan((std::size_t{s} * plan.segments_per_slot() + g) * plan.blocks(),
                                                   plan.blocks()));
    }
  }
  for (auto _ : state) {
    std::uintptr_t sum = 0;
    for (std::uint32_t b = 0; b < plan.blocks(); ++b) {
      for (std::size_t c = 0; c < columns; ++c) sum += reinterpret_cast<std::uintptr_t>(table[c * plan.blocks() + b]);
    }
    benchmark::DoNotOptimize(sum);
  }
  count_views(state, plan);
}

#define VIEW_SHAPES ->Args({4500, 0})->Args({1000, 1})->Args({1000, 2})->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_ViewBlockOrder) VIEW_SHAPES;
BENCHMARK(BM_ViewColumnOrder) VIEW_SHAPES;
BENCHMARK(BM_ViewBulk) VIEW_SHAPES;
BENCHMARK(BM_ViewTableBlockOrder) VIEW_SHAPES;

#define PLAN_SIZES ->Arg(1)->Arg(8)->Arg(64)->Arg(4500)->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_PlanEncode) PLAN_SIZES;
BENCHMARK(BM_NaiveEncode) PLAN_SIZES;
BENCHMARK(BM_PlanDecode) PLAN_SIZES;
BENCHMARK(BM_NaiveDecode) PLAN_SIZES;
BENCHMARK(BM_PlanMaterialize) PLAN_SIZES;
BENCHMARK(BM_PlanRebuild) PLAN_SIZES;

}  // namespace
