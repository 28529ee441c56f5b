// `baton bench mixed` and `baton bench ablation`: the scheduler's claims,
// measured on the seed workload under the virtual clock (same seed, same JSON).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/common/units.h"
#include "baton/topology/graph.h"
#include "baton/topology/probe.h"
#include "workloads/mixed.h"
#include "commands.h"
#include "json_output.h"
#include "ucx_options.h"
#include "workloads/outcome.h"

namespace baton::cli {
namespace {

using nlohmann::ordered_json;

struct SchedBenchOptions {
  std::string command;  // "bench mixed" or "bench ablation": how its errors begin
  std::string policy = "all";
  std::string policy_file;
  std::uint64_t seed = 1;
  double duration_ms = 100;
  workloads::MixedWorkload workload;  // the stream shapes; seed and duration come from above
  std::string json_path;
  std::vector<std::string> slice_sizes{"64KiB", "128KiB", "256KiB", "512KiB", "1MiB", "2MiB", "4MiB"};
  std::vector<std::string> budgets{"1MiB", "2MiB", "4MiB", "8MiB", "16MiB", "32MiB"};
  PeerOptions peer;  // bench mixed over a real link
  std::string prefill_size;
  std::string decode_size;
  bool real_cuda = false;  // bench mixed --real: real copies over the CUDA transport
  std::vector<int> gpus;
};

// The mixed workload sized for one real PCIe path (a GPU and its host
// memory, ~50 GB/s on Gen5): 8 × 32 MiB prefill bursts every 10 ms on
// average (about half of it) against the usual 256 KiB decode every
// 100 µs due 2 ms later, for 2 s of arrivals.
void apply_cuda_defaults(CLI::App& app, SchedBenchOptions& o) {
  if (app.count("--prefill-burst") == 0) o.workload.prefill_burst = 8;
  if (app.count("--duration-ms") == 0) o.duration_ms = 2000;
}

// The endpoints of the real path: GPU a → GPU b for two GPUs; for one, the
// host memory of the GPU's own NUMA node → the GPU.
Status choose_cuda_path(SchedBenchOptions& o) {
  if (o.gpus.empty() || o.gpus.size() > 2) {
    return Status::invalid_argument("--real needs --gpus with one GPU (host -> GPU) or two (GPU -> GPU), got {}",
                                    o.gpus.size());
  }
  for (int g : o.gpus) {
    if (g < 0) return Status::invalid_argument("--gpus: GPU {} is below 0", g);
  }
  if (o.gpus.size() == 2 && o.gpus[0] == o.gpus[1]) {
    return Status::invalid_argument("--gpus {0},{0}: the same GPU twice (name one for host -> GPU)", o.gpus[0]);
  }
  workloads::MixedWorkload& w = o.workload;
  w.topology_model.clear();  // this machine's probe
  w.to = fmt::format("gpu{}", o.gpus.back());
  if (o.gpus.size() == 2) {
    w.from = fmt::format("gpu{}", o.gpus[0]);
    return Status::ok();
  }
  auto facts = topology::probe_machine();
  if (!facts) return facts.error();
  auto graph = topology::TopologyGraph::build(*facts);
  if (!graph) return graph.error();
  const auto numa = graph->nodes_of(topology::NodeKind::kNuma);
  if (numa.empty()) return Status::not_found("--real: the topology has no NUMA node (host memory)");
  w.from = numa.front()->id;
  for (const topology::Node* n : numa) {
    auto route = graph->rank(n->id, w.to);
    if (route && route->best().proximity == topology::Proximity::kLocal) {
      w.from = n->id;
      break;
    }
  }
  return Status::ok();
}

// The mixed workload sized for a loopback socket rather than an NVSwitch:
// 4 × 4 MiB prefill bursts every 80 ms on average (about 40% of the
// ~0.5 GB/s UCX over loopback TCP carries on a 2-core VM), and a 64 KiB
// decode read every 2 ms due 5 ms later (inside decode_critical's class
// priority of 10 ms of laxity, so a decode outranks bulk at once). Applied
// to the options the command line left alone.
void apply_ucx_defaults(CLI::App& app, SchedBenchOptions& o) {
  workloads::MixedWorkload& w = o.workload;
  if (app.count("--prefill-size") == 0) w.prefill_bytes = 4ULL << 20;
  if (app.count("--prefill-burst") == 0) w.prefill_burst = 4;
  if (app.count("--prefill-interval-ms") == 0) w.prefill_interval_ns = 80'000'000;
  if (app.count("--decode-size") == 0) w.decode_bytes = 64ULL << 10;
  if (app.count("--decode-interval-us") == 0) w.decode_interval_ns = 2'000'000;
  if (app.count("--decode-deadline-ms") == 0) w.decode_deadline_ns = 5'000'000;
  if (app.count("--duration-ms") == 0) o.duration_ms = 2000;
}

int fail(const SchedBenchOptions& o, const Status& s) { return fail_command(o.command, s); }

Result<sched::SchedPolicy> base_policy(const SchedBenchOptions& o) {
  if (o.policy_file.empty()) return sched::SchedPolicy::defaults();
  return sched::load_policy(o.policy_file);
}

Result<workloads::MixedWorkload> workload(const SchedBenchOptions& o) {
  if (Status s = check_duration_ms(o.duration_ms); !s.is_ok()) return std::unexpected(s);
  workloads::MixedWorkload w = o.workload;
  for (auto [text, field, name] : {std::tuple{&o.prefill_size, &w.prefill_bytes, "--prefill-size"},
                                   std::tuple{&o.decode_size, &w.decode_bytes, "--decode-size"}}) {
    if (text->empty()) continue;
    auto bytes = parse_size(*text);
    if (!bytes) return std::unexpected(Status::invalid_argument("{}: {}", name, bytes.error().message()));
    *field = *bytes;
  }
  w.seed = o.seed;
  w.duration_ns = static_cast<TimeNs>(o.duration_ms * 1e6);
  return w;
}

ordered_json workload_json(const workloads::MixedWorkload& w, const PeerOptions& peer) {
  return {{"transport", peer.transport},
          {"topology", peer.real() ? std::string("loopback") : w.topology_model},
          {"link", peer.real() ? peer.link() : fmt::format("{}->{}", w.from, w.to)},
          {"prefill", {{"request_bytes", w.prefill_bytes}, {"burst", w.prefill_burst},
                       {"mean_burst_interval_us", static_cast<double>(w.prefill_interval_ns) / 1e3}}},
          {"decode", {{"request_bytes", w.decode_bytes},
                      {"mean_interval_us", static_cast<double>(w.decode_interval_ns) / 1e3},
                      {"deadline_us", static_cast<double>(w.decode_deadline_ns) / 1e3}}},
          {"duration_ms", static_cast<double>(w.duration_ns) / 1e6},
          {"seed", w.seed}};
}

ordered_json class_json(const workloads::ClassResult& r, bool decode) {
  ordered_json j{{"count", r.count}, {"p50_us", r.p50_us}, {"p95_us", r.p95_us}, {"p99_us", r.p99_us}};
  if (decode) {
    j["miss_ratio"] = r.miss_ratio;
    j["cdf_us"] = r.cdf_us;  // percentiles 0..100, for the CDF plot
  } else {
    j["throughput_gbps"] = r.throughput_gbps;
  }
  return j;
}

// Over every submitted request (bench/workloads/outcome.h).
ordered_json outcome_json(const workloads::ClassOutcome& c) {
  return {{"submitted", c.submitted}, {"completed", c.completed}, {"failed", c.failed},
          {"unfinished", c.unfinished}, {"missed", c.missed},      {"p50_us", c.p50_us},
          {"p99_us", c.p99_us},        {"p999_us", c.p999_us}};
}

int run_mixed_bench(const SchedBenchOptions& o) {
  auto w = workload(o);
  if (!w) return fail(o, w.error());
  auto base = base_policy(o);
  if (!base) return fail(o, base.error());
  std::vector<sched::PolicyKind> kinds;
  if (o.policy == "all") {
    kinds = {sched::PolicyKind::kBaselineFifo, sched::PolicyKind::kStrictPriority, sched::PolicyKind::kEdf,
             sched::PolicyKind::kDeadlineAware};
  } else if (o.policy == "both") {
    kinds = {sched::PolicyKind::kBaselineFifo, sched::PolicyKind::kDeadlineAware};
  } else if (auto k = sched::parse_policy_kind(o.policy)) {
    kinds = {*k};
  } else {
    return fail(o, Status::invalid_argument(
        "--policy \"{}\": expected deadline_aware, baseline_fifo, strict_priority, edf, both or all", o.policy));
  }
  std::shared_ptr<transport::CudaRuntime> cuda;
  if (o.real_cuda) {
    if (o.peer.real()) return fail(o, Status::invalid_argument("--real (CUDA copies) and a UCX peer exclude each other"));
    auto rt = transport::cuda_runtime();
    if (!rt) return fail(o, rt.error());
    cuda = *rt;
  }
  PeerOptions peer = o.peer;
  auto child = resolve_peer(peer, w->prefill_bytes + w->decode_bytes);
  if (!child) return fail(o, child.error());
  ordered_json j{{"workload", workload_json(*w, peer)}, {"policies", ordered_json::object()}};
  if (cuda) {
    j["workload"]["transport"] = "cuda";
    j["workload"]["topology"] = "probe";
    j["workload"]["link"] = fmt::format("{}->{}", w->from, w->to);
  }
  std::map<sched::PolicyKind, workloads::MixedResult> results;
  for (sched::PolicyKind kind : kinds) {
    sched::SchedPolicy policy = *base;
    policy.kind = kind;
    auto r = cuda         ? workloads::run_mixed_cuda(*w, policy, cuda)
             : peer.real() ? workloads::run_mixed_ucx(*w, policy, peer.target, peer.ucx)
                           : workloads::run_mixed(*w, policy);
    if (!r) return fail(o, r.error());
    results[kind] = *r;
    const workloads::ClassOutcome decode = workloads::summarize_class(r->decode_requests, r->end_ns);
    const workloads::ClassOutcome prefill = workloads::summarize_class(r->prefill_requests, r->end_ns);
    j["policies"][std::string(sched::to_string(kind))] = {
        {"decode_critical", class_json(r->decode, true)},
        {"prefill_bulk", class_json(r->prefill, false)},
        {"classes", {{"decode_critical", outcome_json(decode)}, {"prefill_bulk", outcome_json(prefill)}}},
        {"goodput_gbps", r->end_ns > 0 ? static_cast<double>(decode.bytes_on_time + prefill.bytes_on_time) /
                                             static_cast<double>(r->end_ns)
                                       : 0.0},
        {"slices_preempted", r->stats.slices_preempted},
        {"slices_spilled", r->stats.slices_spilled},
        {"bytes_wasted", r->stats.bytes_wasted}};
    if (peer.real()) {
      auto& p = j["policies"][std::string(sched::to_string(kind))];
      p["batches"] = r->batches;
      p["direct_batches"] = r->direct_batches;  // copied without the loop: no policy ordered them
    }
  }
  const bool both = results.contains(sched::PolicyKind::kBaselineFifo) &&
                    results.contains(sched::PolicyKind::kDeadlineAware);
  if (both) {
    const double fifo = results[sched::PolicyKind::kBaselineFifo].decode.p99_us;
    const double aware = results[sched::PolicyKind::kDeadlineAware].decode.p99_us;
    // ours / FIFO's; null where FIFO has no figure (no decode request
    // completed): no ratio to report, not a 0% one.
    auto ratio = [](double ours, double fifo) { return fifo > 0 ? nlohmann::json(ours / fifo) : nlohmann::json(); };
    auto cut = [](double ours, double fifo) { return fifo > 0 ? nlohmann::json(1.0 - ours / fifo) : nlohmann::json(); };
    j["decode_p99_reduction"] = cut(aware, fifo);
    // Issue 15's measures on real copies: the P95 cut, and bulk kept.
    const auto& f = results[sched::PolicyKind::kBaselineFifo];
    const auto& a = results[sched::PolicyKind::kDeadlineAware];
    j["decode_p95_reduction"] = cut(a.decode.p95_us, f.decode.p95_us);
    j["prefill_throughput_vs_fifo"] = ratio(a.prefill.throughput_gbps, f.prefill.throughput_gbps);
  }
  if (o.json_path != "-") {
    for (const auto& [kind, r] : results) {
      const std::string decode =
          r.decode.count == 0 ? fmt::format("{:<46}", "no decode request completed")
                              : fmt::format("decode p50 {:>9.1f} us  p99 {:>9.1f} us  miss {:>6.2f}%", r.decode.p50_us,
                                            r.decode.p99_us, 100 * r.decode.miss_ratio);
      fmt::print("{:<15} {}   prefill {:>6.1f} GB/s  (preempted {}, spilled {}, wasted {})\n", sched::to_string(kind),
                 decode, r.prefill.throughput_gbps, r.stats.slices_preempted, r.stats.slices_spilled,
                 format_size(r.stats.bytes_wasted));
    }
    if (both && !j["decode_p99_reduction"].is_null()) {
      // Over shared memory with the loop-free path, the policies may order
      // nothing: a reduction between them then measures noise.
      const bool unordered = peer.real() && std::ranges::all_of(results, [](const auto& kr) {
        return kr.second.batches > 0 && kr.second.direct_batches == kr.second.batches;
      });
      fmt::print("decode P99 reduction: {:.1f}%{}\n", 100 * j["decode_p99_reduction"].get<double>(),
                 unordered ? " (every batch was copied without the loop, so no policy ordered any: "
                             "--direct-copy-max 0 compares them)"
                           : "");
    }
  }
  if (*child) {
    if (Status s = (*child)->stop(); !s.is_ok()) return fail(o, s);
  }
  return emit_json(o.command, j.dump(2), o.json_path);
}

int run_ablation_bench(const SchedBenchOptions& o) {
  auto w = workload(o);
  if (!w) return fail(o, w.error());
  auto base = base_policy(o);
  if (!base) return fail(o, base.error());
  ordered_json cells = ordered_json::array();
  const auto path = topology::PathType::kNvswitch;  // the hot link of the workload
  // Parsed and checked before a row is printed: a table of skips is no result.
  std::vector<std::uint64_t> slices, budgets;
  for (const std::string& text : o.slice_sizes) {
    auto v = parse_size(text);
    if (!v) return fail(o, v.error());
    slices.push_back(*v);
  }
  for (const std::string& text : o.budgets) {
    auto v = parse_size(text);
    if (!v) return fail(o, v.error());
    budgets.push_back(*v);
  }
  if (std::ranges::none_of(slices, [&](std::uint64_t s) {
        return std::ranges::any_of(budgets, [s](std::uint64_t b) { return b >= s; });
      })) {
    return fail(o, Status::invalid_argument("every --budgets value is below every --slice-sizes value: nothing to "
                                         "measure (a budget must hold at least one slice)"));
  }
  for (const std::uint64_t slice : slices) {
    for (const std::uint64_t budget : budgets) {
      sched::SchedPolicy policy = *base;
      policy.kind = sched::PolicyKind::kDeadlineAware;
      policy.slice_bytes[static_cast<int>(path)] = slice;
      policy.credits[static_cast<int>(path)].inflight_bytes = budget;
      ordered_json cell{{"slice_bytes", slice}, {"inflight_bytes", budget}};
      if (budget < slice) {
        cell["skipped"] = "budget smaller than one slice";
        if (o.json_path != "-") {
          fmt::print("slice {:>8}  budget {:>8}  skipped: the budget is smaller than one slice\n", format_size(slice),
                     format_size(budget));
        }
        cells.push_back(cell);
        continue;
      }
      auto r = workloads::run_mixed(*w, policy);
      if (!r) return fail(o, r.error());
      cell["decode_p99_us"] = r->decode.p99_us;
      cell["decode_miss_ratio"] = r->decode.miss_ratio;
      cell["prefill_throughput_gbps"] = r->prefill.throughput_gbps;
      cell["bytes_wasted"] = r->stats.bytes_wasted;
      if (o.json_path != "-") {
        fmt::print("slice {:>8}  budget {:>8}  decode p99 {:>8.1f} us  miss {:>6.2f}%  prefill {:>6.1f} GB/s\n",
                   format_size(slice), format_size(budget), r->decode.p99_us, 100 * r->decode.miss_ratio,
                   r->prefill.throughput_gbps);
      }
      cells.push_back(cell);
    }
  }
  return emit_json(o.command,
                   ordered_json{{"workload", workload_json(*w, o.peer)}, {"path", "nvswitch"}, {"cells", cells}}.dump(2),
                   o.json_path);
}

void add_common(CLI::App* app, SchedBenchOptions& o) {
  app->add_option("--seed", o.seed, "Seed of the arrivals and the simulated lanes")->check(kUnsigned64);
  app->add_option("--duration-ms", o.duration_ms, "Virtual time over which requests arrive");
  app->add_option("--policy-file", o.policy_file,
                  "Start from this policy YAML instead of the defaults (its `policy:` is replaced by each policy "
                  "the bench compares: --policy)")
      ->check(kPolicyFile);
  app->add_option("--json", o.json_path, "Write the results as JSON to PATH ('-': stdout only)");
  auto* w = &o.workload;
  app->add_option_function<double>(
      "--prefill-interval-ms", [w](double ms) { w->prefill_interval_ns = static_cast<TimeNs>(ms * 1e6); },
      "Mean gap between prefill bursts")
      ->check(positive_at_most(3.15e10, "a year"));
  app->add_option("--prefill-burst", w->prefill_burst, "32 MiB prefill requests per burst");
  app->add_option_function<double>(
      "--decode-interval-us", [w](double v) { w->decode_interval_ns = static_cast<TimeNs>(v * 1e3); },
      "Mean gap between decode requests")
      ->check(positive_at_most(3.15e13, "a year"));
  app->add_option_function<double>(
      "--decode-deadline-ms", [w](double ms) { w->decode_deadline_ns = static_cast<TimeNs>(ms * 1e6); },
      "Decode deadline after arrival")
      ->check(positive_at_most(3.6e6, "an hour"));
}

}  // namespace

Command add_bench_mixed(CLI::App& bench) {
  auto o = std::make_shared<SchedBenchOptions>();
  o->command = "bench mixed";
  CLI::App* app = bench.add_subcommand("mixed", "32 MB prefill vs 256 KB / 2 ms decode on one NVLink: FIFO, strict priority, EDF, deadline-aware");
  add_common(app, *o);
  app->add_option("--policy", o->policy, "all (default), both (baseline_fifo and deadline_aware), or one policy");
  add_peer_options(*app, o->peer);
  app->add_option("--prefill-size", o->prefill_size, "Bytes per prefill request (size)");
  app->add_option("--decode-size", o->decode_size, "Bytes per decode request (size)");
  app->add_flag("--real", o->real_cuda, "Real copies over the CUDA transport, on the wall clock (needs --gpus)");
  app->add_option("--gpus", o->gpus, "With --real: one GPU (host -> GPU) or two (GPU -> GPU), as `baton topo` numbers them")
      ->delimiter(',');
  return {app, [o, app] {
            if (!o->real_cuda && !o->gpus.empty()) {
              return fail(*o, Status::invalid_argument("--gpus needs --real (the simulator's path is a model's)"));
            }
            if (o->real_cuda) {
              if (Status s = choose_cuda_path(*o); !s.is_ok()) return fail(*o, s);
              apply_cuda_defaults(*app, *o);
            } else if (o->peer.real()) {
              apply_ucx_defaults(*app, *o);
            }
            return run_mixed_bench(*o);
          }};
}

Command add_bench_ablation(CLI::App& bench) {
  auto o = std::make_shared<SchedBenchOptions>();
  o->command = "bench ablation";
  CLI::App* app = bench.add_subcommand("ablation", "The mixed workload across slice sizes and in-flight byte budgets");
  add_common(app, *o);
  app->add_option("--slice-sizes", o->slice_sizes, "Slice sizes to sweep")->delimiter(',');
  app->add_option("--budgets", o->budgets, "In-flight byte budgets to sweep")->delimiter(',');
  return {app, [o] { return run_ablation_bench(*o); }};
}

}  // namespace baton::cli
