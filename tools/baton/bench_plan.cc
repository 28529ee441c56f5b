// `baton bench plan`: how long the transfer plan takes at each step, holder
// to requester, and how small its wire form is against the naive encoding,
// on a vLLM-shaped fixture. Every timing is the median of --repeat runs.
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/clock.h"
#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/plan/encode.h"
#include "baton/plan/fixtures.h"
#include "baton/plan/materialize.h"
#include "baton/plan/naive.h"
#include "baton/plan/rebuild.h"
#include "baton/plan/wire.h"
#include "baton/topology/probe.h"
#include "commands.h"
#include "json_output.h"

namespace baton::cli {
namespace {

using namespace baton::plan;

struct PlanBenchOptions {
  FixtureSpec spec{.blocks = 4500};
  bool kv_split = false;
  std::string numa = "sockets";
  std::string topology_model = "nvswitch8";
  std::string max_op = "128MiB";
  std::string stripe = "8MiB";
  int repeat = 21;
  int naive_repeat = 5;
  std::string json_path;
};

double median_ms(std::vector<double> samples) { return percentile(samples, 50).value_or(0.0) / 1e6; }

int run_bench_plan(PlanBenchOptions o) {
  auto fail = [](const Status& s) {
    return fail_command("bench plan", s);
  };
  static const std::map<std::string, NumaLayout> kLayouts{{"single", NumaLayout::kSingle},
                                                          {"sockets", NumaLayout::kSlotsAcrossSockets},
                                                          {"alternate", NumaLayout::kBlocksAlternate}};
  o.spec.numa = kLayouts.at(o.numa);
  MaterializeOptions mopts;
  auto max_op = parse_size(o.max_op);
  if (!max_op) return fail(max_op.error());
  auto stripe = parse_size(o.stripe);
  if (!stripe) return fail(stripe.error());
  mopts.max_op_bytes = *max_op;
  mopts.stripe_bytes = *stripe;
  auto facts = topology::load_model(o.topology_model);
  if (!facts) return fail(facts.error());
  auto graph = topology::TopologyGraph::build(*facts);
  if (!graph) return fail(graph.error());

  const SteadyClock clock;
  auto timed = [&](auto&& body) {
    const TimeNs start = clock.now_ns();
    body();
    return static_cast<double>(clock.now_ns() - start);
  };

  PlacementTable table;
  std::vector<double> fill;
  Status status;
  for (int i = 0; i < 3 && status.is_ok(); ++i) fill.push_back(timed([&] { status = fill_fixture(o.spec, table); }));
  if (!status.is_ok()) return fail(status);
  std::vector<std::uint64_t> hashes(table.blocks());
  for (std::size_t b = 0; b < hashes.size(); ++b) hashes[b] = 0x9e3779b97f4a7c15ull * (b + 1);

  std::vector<double> encode, decode, materialize_ns, rebuild_ns, naive_encode, naive_decode;
  std::string wire;
  std::size_t ops = 0;
  Rebuilder rebuilder;
  for (int i = 0; i < o.repeat; ++i) {
    Result<Plan> plan;
    encode.push_back(timed([&] {
      plan = encode_plan(table, hashes);
      if (plan) wire = serialize_plan(*plan);
    }));
    if (!plan) return fail(plan.error());
    Result<Plan> decoded;
    decode.push_back(timed([&] { decoded = parse_plan(wire); }));
    if (!decoded) return fail(decoded.error());
    Result<MaterializedPlan> m;
    materialize_ns.push_back(timed([&] { m = materialize(*decoded, *graph, mopts); }));
    if (!m) return fail(m.error());
    ops = m->ops.size();
    Result<RebuiltPlan> rebuilt;
    rebuild_ns.push_back(timed([&] { rebuilt = rebuilder.rebuild(*decoded); }));
    if (!rebuilt) return fail(rebuilt.error());
  }
  // view(): every (block, slot, segment) of the last rebuilt plan, block by
  // block, as a requester walks its blocks' slots; ns per view.
  std::vector<double> view_ns;
  {
    auto rebuilt = rebuilder.rebuild(*parse_plan(wire));
    if (!rebuilt) return fail(rebuilt.error());
    const double views = static_cast<double>(rebuilt->blocks()) * rebuilt->slots() * rebuilt->segments_per_slot();
    std::uintptr_t sum = 0;
    for (int i = 0; i < 5; ++i) {
      view_ns.push_back(timed([&] {
        for (std::uint32_t b = 0; b < rebuilt->blocks(); ++b) {
          for (std::uint32_t s = 0; s < rebuilt->slots(); ++s) {
            for (std::uint32_t g = 0; g < rebuilt->segments_per_slot(); ++g) {
              sum += reinterpret_cast<std::uintptr_t>(rebuilt->view(b, s, g));
            }
          }
        }
      }) / views);
    }
    volatile std::uintptr_t sink = sum;  // keeps the loop
    (void)sink;
  }
  std::string naive;
  for (int i = 0; i < o.naive_repeat; ++i) {
    Result<std::string> bytes;
    naive_encode.push_back(timed([&] { bytes = serialize_naive(table, hashes); }));
    if (!bytes) return fail(bytes.error());
    naive = std::move(*bytes);
    Result<PlacementTable> back;
    naive_decode.push_back(timed([&] { back = parse_naive(naive); }));
    if (!back) return fail(back.error());
  }

  const nlohmann::json j{
      {"blocks", table.blocks()},
      {"slots", table.slots()},
      {"segments_per_slot", table.segments_per_slot()},
      {"numa", o.numa},
      {"repeat", o.repeat},
      {"fill_ms", median_ms(fill)},
      {"encode_ms", median_ms(encode)},
      {"decode_ms", median_ms(decode)},
      {"materialize_ms", median_ms(materialize_ns)},
      {"rebuild_ms", median_ms(rebuild_ns)},
      // The first rebuild of the process (its memory is fresh pages); the
      // median is the steady state.
      {"rebuild_first_ms", rebuild_ns.front() / 1e6},
      {"view_ns", median_ms(view_ns) * 1e6},
      {"naive_encode_ms", median_ms(naive_encode)},
      {"naive_decode_ms", median_ms(naive_decode)},
      {"wire_bytes", wire.size()},
      {"naive_wire_bytes", naive.size()},
      {"ops", ops},
  };
  if (Status s = write_json_output(j.dump(2), o.json_path); !s.is_ok()) return fail(s);
  if (o.json_path == "-") return 0;
  fmt::print("plan: {} blocks × {} slots × {} segments, NUMA {}, median of {} runs (naive: {})\n", table.blocks(),
             table.slots(), table.segments_per_slot(), o.numa, o.repeat, o.naive_repeat);
  fmt::print(
      "  fill {:.3f} ms  encode {:.3f} ms  decode {:.3f} ms  materialize {:.3f} ms ({} ops)  rebuild {:.3f} ms "
      "(first {:.3f} ms)  view {:.2f} ns\n",
      median_ms(fill), median_ms(encode), median_ms(decode), median_ms(materialize_ns), ops, median_ms(rebuild_ns),
      rebuild_ns.front() / 1e6, median_ms(view_ns) * 1e6);
  fmt::print("  wire {} B, naive {} B ({:.1f}×); naive encode {:.3f} ms, decode {:.3f} ms\n", wire.size(),
             naive.size(), static_cast<double>(naive.size()) / static_cast<double>(wire.size()),
             median_ms(naive_encode), median_ms(naive_decode));
  return 0;
}

}  // namespace

Command add_bench_plan(CLI::App& bench) {
  auto o = std::make_shared<PlanBenchOptions>();
  CLI::App* app = bench.add_subcommand("plan", "Transfer plan: encode, decode, materialize, rebuild; wire vs naive");
  app->add_option("--blocks", o->spec.blocks, "Blocks requested")->capture_default_str();
  app->add_option("--layers", o->spec.layers, "Layers")->capture_default_str();
  app->add_option("--tp", o->spec.tp, "Tensor-parallel ranks (slots = layers × TP)")->capture_default_str();
  auto* kv = app->add_flag("--kv-split", o->kv_split, "K and V segments per slot (the default)");
  app->add_flag("--mla", o->spec.mla, "One latent segment per slot (MLA)")->excludes(kv);
  app->add_option("--block-tokens", o->spec.block_tokens, "Tokens per block")->capture_default_str();
  app->add_option("--kv-heads", o->spec.kv_heads, "KV heads in the model (split over TP)")->capture_default_str();
  app->add_option("--head-dim", o->spec.head_dim, "Head dim (MLA: latent width)")->capture_default_str();
  app->add_option("--dtype-bytes", o->spec.dtype_bytes, "Bytes per element")->capture_default_str();
  app->add_option("--numa", o->numa, "single, sockets (TP ranks over two nodes), alternate (blocks); a layout needs each block's node, so "
                  "unknown is not one")
      ->check(CLI::IsMember({"single", "sockets", "alternate"}))
      ->capture_default_str();
  app->add_option("--run-blocks", o->spec.run_blocks, "A free cache block after every N requested (0: contiguous)")
      ->capture_default_str();
  app->add_option("--topology-model", o->topology_model, "Synthetic machine whose NICs the ops use")
      ->check(kTopologyModel)
      ->capture_default_str();
  app->add_option("--max-op", o->max_op, "Largest transport op")->capture_default_str();
  app->add_option("--stripe", o->stripe, "Stripe piece across the NICs of a node")->capture_default_str();
  app->add_option("--repeat", o->repeat, "Runs per timing (median)")->check(CLI::Range(1, 1000))->capture_default_str();
  app->add_option("--naive-repeat", o->naive_repeat, "Runs per naive timing (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--json", o->json_path, "Write the figures as JSON to PATH ('-': stdout only)");
  return {app, [o] { return run_bench_plan(*o); }};
}

}  // namespace baton::cli
