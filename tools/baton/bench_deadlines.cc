// `baton bench deadlines`: a link loaded to a chosen fraction of its
// bandwidth by decode reads with a mix of deadlines, prefill with
// size-proportional deadlines and background offload, under each policy of
// the same scheduler (baseline_fifo, strict_priority, edf, deadline_aware).
// On the simulator (virtual clock) or over UCX to a `baton serve`.

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/common/units.h"
#include "commands.h"
#include "json_output.h"
#include "ucx_options.h"
#include "workloads/deadlines.h"

namespace baton::cli {
namespace {

using nlohmann::ordered_json;
using workloads::DeadlinesWorkload;

struct DeadlinesOptions {
  DeadlinesWorkload workload;
  std::vector<std::string> policies{"baseline_fifo", "strict_priority", "edf", "deadline_aware"};
  std::string policy_file;
  double duration_ms = 1000;
  std::vector<std::string> decode_deadlines;
  std::vector<std::string> prefill_sizes;
  std::string decode_size;
  std::string background_size;
  std::string json_path;
  PeerOptions peer;
};

int fail(const Status& s) { return fail_command("bench deadlines", s); }

// The command line's lists and sizes, into the workload.
Status fill_workload(const DeadlinesOptions& o, DeadlinesWorkload& w) {
  if (Status s = check_duration_ms(o.duration_ms); !s.is_ok()) return s;
  w.duration_ns = static_cast<TimeNs>(o.duration_ms * 1e6);
  if (!o.decode_deadlines.empty()) {
    w.decode_deadlines_ns.clear();
    for (const std::string& text : o.decode_deadlines) {
      auto ns = parse_flag_duration(text);
      if (!ns) return Status::invalid_argument("--decode-deadlines: {}", ns.error().message());
      w.decode_deadlines_ns.push_back(*ns);
    }
  }
  if (!o.prefill_sizes.empty()) {
    w.prefill_bytes.clear();
    for (const std::string& text : o.prefill_sizes) {
      auto bytes = parse_size(text);
      if (!bytes) return Status::invalid_argument("--prefill-sizes: {}", bytes.error().message());
      w.prefill_bytes.push_back(*bytes);
    }
  }
  for (auto [text, field, name] : {std::tuple{&o.decode_size, &w.decode_bytes, "--decode-size"},
                                   std::tuple{&o.background_size, &w.background_bytes, "--background-size"}}) {
    if (text->empty()) continue;
    auto bytes = parse_size(*text);
    if (!bytes) return Status::invalid_argument("{}: {}", name, bytes.error().message());
    *field = *bytes;
  }
  return w.validate();
}

// Sized for a loopback socket (about 1 GB/s here) rather than a PCIe path:
// 64 KiB decode reads due 5, 20 or 50 ms later (a 4 MiB in-flight budget
// alone is 4 ms there), 0.5–2 MiB prefill, 4 MiB background, 1 s of arrivals.
void apply_ucx_defaults(const CLI::App& app, DeadlinesOptions& o) {
  if (app.count("--decode-size") == 0) o.workload.decode_bytes = 64ULL << 10;
  if (app.count("--decode-deadlines") == 0) o.workload.decode_deadlines_ns = {5'000'000, 20'000'000, 50'000'000};
  if (app.count("--prefill-sizes") == 0) o.workload.prefill_bytes = {512ULL << 10, 1ULL << 20, 2ULL << 20};
  if (app.count("--background-size") == 0) o.workload.background_bytes = 4ULL << 20;
}

ordered_json class_json(const workloads::ClassOutcome& c) {
  return {{"submitted", c.submitted},   {"completed", c.completed}, {"failed", c.failed},
          {"unfinished", c.unfinished}, {"missed", c.missed},       {"with_deadline", c.with_deadline},
          {"p50_us", c.p50_us},         {"p99_us", c.p99_us},       {"p999_us", c.p999_us},
          {"goodput_bytes", c.bytes_on_time}};
}

ordered_json workload_json(const DeadlinesWorkload& w, const DeadlinesOptions& o) {
  std::vector<double> decode_ms;
  for (TimeNs d : w.decode_deadlines_ns) decode_ms.push_back(static_cast<double>(d) / 1e6);
  return {{"transport", o.peer.transport},
          {"link", o.peer.real() ? o.peer.link() : fmt::format("{} {}->{}", w.topology_model, w.from, w.to)},
          {"decode", {{"share", w.decode_share}, {"request_bytes", w.decode_bytes}, {"deadlines_ms", decode_ms}}},
          {"prefill", {{"share", w.prefill_share}, {"request_bytes", w.prefill_bytes}, {"slack", w.prefill_slack}}},
          {"background", {{"share", 1.0 - w.decode_share - w.prefill_share}, {"request_bytes", w.background_bytes}}},
          {"duration_ms", static_cast<double>(w.duration_ns) / 1e6},
          {"seed", w.seed}};
}

int run(DeadlinesOptions o) {
  DeadlinesWorkload& w = o.workload;
  if (Status s = fill_workload(o, w); !s.is_ok()) return fail(s);
  std::vector<sched::PolicyKind> kinds;
  for (const std::string& name : o.policies) {
    auto kind = sched::parse_policy_kind(name);
    if (!kind) return fail(Status::invalid_argument("--policies: {}", kind.error().message()));
    if (std::ranges::find(kinds, *kind) != kinds.end()) {
      return fail(Status::invalid_argument("--policies: {} named twice (the JSON keeps one result a policy)", name));
    }
    kinds.push_back(*kind);
  }
  auto base = o.policy_file.empty() ? Result<sched::SchedPolicy>(sched::SchedPolicy::defaults())
                                    : sched::load_policy(o.policy_file);
  if (!base) return fail(base.error());
  auto child = resolve_peer(o.peer, w.largest_request_bytes());
  if (!child) return fail(child.error());
  auto result = o.peer.real() ? workloads::run_deadlines_ucx(w, kinds, *base, o.peer.target, o.peer.ucx)
                              : workloads::run_deadlines(w, kinds, *base);
  if (!result) return fail(result.error());
  ordered_json j{{"load", w.load},
                 {"link_gbps", result->link_gbps},
                 {"run_ms", static_cast<double>(result->run_ns) / 1e6},
                 {"workload", workload_json(w, o)},
                 {"policies", ordered_json::object()}};
  for (const auto& [kind, r] : result->policies) {
    ordered_json classes = ordered_json::object();
    for (int c = 0; c < workloads::kWorkloadClassCount; ++c) {
      classes[std::string(to_string(static_cast<workloads::WorkloadClass>(c)))] = class_json(r.classes[c]);
    }
    j["policies"][std::string(sched::to_string(kind))] = {
        {"classes", classes},
        {"on_time_fraction", r.on_time_fraction},
        {"goodput_gbps", r.goodput_gbps},
        {"signalled_local_recompute", r.signalled},
        {"slices_preempted", r.stats.slices_preempted},
        {"slices_spilled", r.stats.slices_spilled},
        {"bytes_wasted", r.stats.bytes_wasted}};
    if (o.json_path != "-") {
      const auto& d = r.classes[0];
      const auto& p = r.classes[1];
      fmt::print("{:<16} on time {:>6.2f}%  goodput {:>6.2f} GB/s  decode missed {:>5}/{:<5} p99 {:>9.1f} us  "
                 "prefill missed {:>4}/{:<4}  dropped {}\n",
                 sched::to_string(kind), 100 * r.on_time_fraction, r.goodput_gbps, d.missed, d.submitted, d.p99_us,
                 p.missed, p.submitted, r.signalled);
    }
  }
  if (*child) {
    if (Status s = (*child)->stop(); !s.is_ok()) return fail(s);
  }
  return emit_json("bench deadlines", j.dump(2), o.json_path);
}

}  // namespace

Command add_bench_deadlines(CLI::App& bench) {
  auto o = std::make_shared<DeadlinesOptions>();
  CLI::App* app = bench.add_subcommand(
      "deadlines", "Decode, prefill and background on one loaded link: FIFO, strict priority, EDF, deadline-aware");
  DeadlinesWorkload* w = &o->workload;
  app->add_option("--load", w->load, "Offered bytes as a fraction of the link's bandwidth (0.9; 1.2 overloads)");
  app->add_option("--link-gbps", w->link_gbps, "The link's bandwidth for --load (default: the path's, or measured over UCX)");
  o->peer.sim_only = {
      app->add_option("--model", w->topology_model, "sim: topology model of the link")->check(kTopologyModel),
      app->add_option("--from", w->from, "sim: the link's source node"),
      app->add_option("--to", w->to, "sim: the link's destination node")};
  app->add_option("--decode-share", w->decode_share, "Share of the offered bytes that are decode reads");
  app->add_option("--prefill-share", w->prefill_share, "Share that is prefill (background takes the rest)");
  app->add_option("--decode-size", o->decode_size, "Bytes per decode request (size)");
  app->add_option("--decode-deadlines", o->decode_deadlines, "Decode deadlines, drawn uniformly (durations)")->delimiter(',');
  app->add_option("--prefill-sizes", o->prefill_sizes, "Prefill request sizes, drawn uniformly")->delimiter(',');
  app->add_option("--prefill-slack", w->prefill_slack, "A prefill is due this many times its idle-link transfer time after arrival");
  app->add_option("--background-size", o->background_size, "Bytes per background request (size)");
  app->add_option("--duration-ms", o->duration_ms, "Time over which requests arrive");
  app->add_option("--seed", w->seed, "Seed of the arrivals")->check(kUnsigned64);
  app->add_option("--policies", o->policies, "Policies to run (baseline_fifo, strict_priority, edf, deadline_aware)")
      ->delimiter(',');
  app->add_option("--policy-file", o->policy_file, "Start every policy from this YAML instead of the defaults")
      ->check(kPolicyFile);
  app->add_option("--json", o->json_path, "Write the results as JSON to PATH ('-': stdout only)");
  add_peer_options(*app, o->peer);
  return {app, [o, app] {
            if (o->peer.real()) apply_ucx_defaults(*app, *o);
            return run(*o);
          }};
}

}  // namespace baton::cli
