// `baton bench dualpath`: PD handoffs raced over direct (gpu0 -> gpu1) and
// store (nic1 -> gpu1, GDR) versus direct only and store only.
// `baton bench fault`: the direct leg dies mid-run and comes back.
// By default both run on the nvswitch8 model under the virtual clock; with
// --transport ucx --spawn over real processes (bench_dualpath_ucx.cc).
// docs/dualpath.md.
#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/dualpath/dualpath.h"
#include "bench_dualpath.h"
#include "commands.h"
#include "json_output.h"

namespace baton::cli {
namespace {

using nlohmann::ordered_json;

constexpr const char* kDirectFrom = "gpu0";
constexpr const char* kStoreFrom = "nic1";
constexpr const char* kTo = "gpu1";

}  // namespace

int fail_bench(std::string_view mode, const Status& s) { return fail_command(fmt::format("bench {}", mode), s); }

int write_bench_json(std::string_view mode, const ordered_json& j, const std::string& path) {
  if (Status s = write_json_output(j.dump(2), path); !s.is_ok()) return fail_bench(mode, s);
  return 0;
}

void print_latencies(const ordered_json& latency_us) {
  for (const auto& [mode, l] : latency_us.items()) {
    if (l["p50"].is_null()) continue;
    fmt::print("  {:<12} p50 {:>8.1f} us  p95 {:>8.1f} us  p99 {:>8.1f} us\n", mode, l["p50"].get<double>(),
               l["p95"].get<double>(), l["p99"].get<double>());
  }
}

ordered_json race_json(int requests, dualpath::Strategy strategy, const dualpath::DualPathStats& stats,
                       const std::vector<double>& racing_us, const std::vector<double>& direct_only_us,
                       const std::vector<double>& store_only_us) {
  ordered_json j;
  j["requests"] = requests;
  j["strategy"] = std::string(dualpath::to_string(strategy));
  j["wins"] = {{"direct", stats.wins_direct}, {"store", stats.wins_store}};
  j["cancelled_legs"] = stats.cancelled_legs;
  j["latency_us"] = {{"racing", summary_json(racing_us)},
                     {"direct_only", summary_json(direct_only_us)},
                     {"store_only", summary_json(store_only_us)}};
  j["wasted_bytes"] = stats.wasted_bytes;
  j["completed"] = {
      {"racing", racing_us.size()}, {"direct_only", direct_only_us.size()}, {"store_only", store_only_us.size()}};
  return j;
}

ordered_json us_or_null(std::optional<TimeNs> t_ns) {
  return t_ns ? ordered_json(static_cast<double>(*t_ns) / 1e3) : ordered_json(nullptr);
}

std::string at_or_never(const ordered_json& us, std::string_view when, std::string_view never) {
  return us.is_null() ? std::string(never) : fmt::format("{} {} us", when, us.dump());
}

namespace {

int fail(std::string_view mode, const Status& s) { return fail_bench(mode, s); }


// Poisson arrivals: `requests` handoffs with mean gap duration / requests.
std::vector<TimeNs> arrivals(int requests, TimeNs duration_ns, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(static_cast<double>(requests) / static_cast<double>(duration_ns));
  std::vector<TimeNs> out;
  double t = 0;
  for (int i = 0; i < requests; ++i) {
    t += gap(rng);
    out.push_back(static_cast<TimeNs>(t));
  }
  return out;
}

}  // namespace

Result<Workload> workload(const DualPathBenchOptions& o) {
  if (Status s = check_peer(o.peer); !s.is_ok()) return std::unexpected(s);
  constexpr std::int64_t kMostRequests = 1'000'000;  // every arrival and its record are held at once
  if (o.requests < 1 || o.requests > kMostRequests) {
    return std::unexpected(Status::invalid_argument("--requests {}: expected 1..{}", o.requests, kMostRequests));
  }
  if (Status s = check_duration_ms(o.duration_ms); !s.is_ok()) return std::unexpected(s);
  auto bytes = parse_size(o.handoff_size);
  if (!bytes) return std::unexpected(bytes.error());
  if (*bytes == 0) return std::unexpected(Status::invalid_argument("--handoff-size must be > 0"));
  return Workload{arrivals(o.requests, static_cast<TimeNs>(o.duration_ms * 1e6), o.seed), *bytes};
}

namespace {

ordered_json workload_json(const DualPathBenchOptions& o, const Workload& w) {
  return {{"topology", "nvswitch8"},
          {"direct", fmt::format("{}->{}", kDirectFrom, kTo)},
          {"store", fmt::format("{}->{}", kStoreFrom, kTo)},
          {"handoff_bytes", w.bytes},
          {"duration_ms", o.duration_ms},
          {"arrivals", "poisson"},
          {"seed", o.seed}};
}

}  // namespace

ordered_json summary_json(std::vector<double> latencies_us) {
  auto s = summarize(latencies_us);
  if (!s) return {{"p50", nullptr}, {"p95", nullptr}, {"p99", nullptr}};
  return {{"p50", s->p50}, {"p95", s->p95}, {"p99", s->p99}};
}

namespace {

// One leg alone, through the plain engine: the baselines.
Result<std::vector<double>> run_single_leg(const Workload& w, const std::string& from) {
  auto engine = engine::Harness::create({});
  if (!engine) return std::unexpected(engine.error());
  std::vector<sched::RequestId> ids;
  for (std::size_t i = 0; i < w.at_ns.size(); ++i) {
    if (Status s = (*engine)->run_until(w.at_ns[i]); !s.is_ok()) return std::unexpected(s);
    sched::TransferRequest r;
    r.from = from;
    r.to = kTo;
    r.bytes = w.bytes;
    r.qos = sched::QosClass::kHotKv;
    r.remote_addr = static_cast<std::uint64_t>(i + 1) << 32;
    auto id = (*engine)->submit(r);
    if (!id) return std::unexpected(id.error());
    ids.push_back(*id);
  }
  if (Status s = (*engine)->run_until_idle(); !s.is_ok()) return std::unexpected(s);
  std::vector<double> lat;
  for (sched::RequestId id : ids) {
    auto st = (*engine)->status(id);
    if (st && st->state == sched::RequestState::kCompleted) {
      lat.push_back(static_cast<double>(st->completed_ns - st->submitted_ns) / 1e3);
    }
  }
  return lat;
}

dualpath::HandoffRequest handoff(const Workload& w, std::size_t i) {
  dualpath::HandoffRequest r{kDirectFrom, kStoreFrom, kTo, w.bytes};
  r.remote_addr = static_cast<std::uint64_t>(i + 1) << 32;
  return r;
}

// An engine and a DualPath racing on it; the engine must outlive the race.
struct Race {
  std::unique_ptr<engine::Harness> engine;
  std::unique_ptr<dualpath::DualPath> dual;
  dualpath::Strategy strategy;
};

Result<Race> make_race(const DualPathBenchOptions& o, std::string_view default_strategy) {
  auto strategy = dualpath::parse_strategy(o.strategy.empty() ? default_strategy : o.strategy);
  if (!strategy) return std::unexpected(strategy.error());
  auto engine = engine::Harness::create({});
  if (!engine) return std::unexpected(engine.error());
  dualpath::DualPathConfig config;
  config.strategy = *strategy;
  config.seed = o.seed;
  auto dual = dualpath::DualPath::create(**engine, config);
  if (!dual) return std::unexpected(dual.error());
  return Race{std::move(*engine), std::move(*dual), *strategy};
}

int run_dualpath_bench(const DualPathBenchOptions& o) {
  constexpr std::string_view kMode = "dualpath";
  auto w = workload(o);
  if (!w) return fail(kMode, w.error());
  if (o.peer.real()) return run_dualpath_ucx(o, *w);
  auto race = make_race(o, "hedge");
  if (!race) return fail(kMode, race.error());
  auto& dual = race->dual;
  std::vector<dualpath::HandoffId> ids;
  for (std::size_t i = 0; i < w->at_ns.size(); ++i) {
    if (Status s = dual->run_until(w->at_ns[i]); !s.is_ok()) return fail(kMode, s);
    auto id = dual->submit(handoff(*w, i));
    if (!id) return fail(kMode, id.error());
    ids.push_back(*id);
  }
  if (Status s = dual->run_until_idle(); !s.is_ok()) return fail(kMode, s);
  std::vector<double> raced;
  for (dualpath::HandoffId id : ids) {
    auto st = dual->status(id);
    if (st && st->state == dualpath::HandoffState::kCompleted) {
      raced.push_back(static_cast<double>(st->completed_ns - st->submitted_ns) / 1e3);
    }
  }
  auto direct = run_single_leg(*w, kDirectFrom);
  if (!direct) return fail(kMode, direct.error());
  auto store = run_single_leg(*w, kStoreFrom);
  if (!store) return fail(kMode, store.error());

  const dualpath::DualPathStats& s = dual->stats();
  ordered_json j = race_json(o.requests, race->strategy, s, raced, *direct, *store);
  j["workload"] = workload_json(o, *w);
  if (o.json_path != "-") {
    fmt::print("{} handoffs of {} ({}), {}: direct won {}, store won {}, {} store legs cancelled, {} wasted\n",
               o.requests, format_size(w->bytes), kMode, dualpath::to_string(race->strategy), s.wins_direct, s.wins_store,
               s.cancelled_legs, format_size(s.wasted_bytes));
    print_latencies(j["latency_us"]);
  }
  return write_bench_json(kMode, j, o.json_path);
}

int run_fault_bench(const DualPathBenchOptions& o) {
  constexpr std::string_view kMode = "fault";
  auto w = workload(o);
  if (!w) return fail(kMode, w.error());
  if (!(o.kill_at_ms >= 0) || !(o.restore_at_ms > o.kill_at_ms) || !(o.restore_at_ms <= 3.6e6)) {
    return fail(kMode, Status::invalid_argument(
                           "--kill-at-ms {} and --restore-at-ms {}: expected 0 <= kill < restore <= 3.6e6 (an hour)",
                           o.kill_at_ms, o.restore_at_ms));
  }
  if (o.peer.real()) return run_fault_ucx(o, *w);
  const auto kill_ns = static_cast<TimeNs>(o.kill_at_ms * 1e6);
  const auto restore_ns = static_cast<TimeNs>(o.restore_at_ms * 1e6);

  auto race = make_race(o, "failover_only");
  if (!race) return fail(kMode, race.error());
  auto& engine = race->engine;
  auto& dual = race->dual;
  // "The direct endpoint dies": every path from gpu0 to gpu1 (NVSwitch and
  // its host-staging fallback) goes down, so the leg is dead, not degraded.
  std::vector<transport::PathId> direct_paths;
  const auto& paths = engine->sim_transport().paths();
  for (transport::PathId p = 0; p < paths.size(); ++p) {
    if (paths[p].from == kDirectFrom && paths[p].to == kTo) direct_paths.push_back(p);
  }
  auto set_direct = [&](bool down) {
    for (transport::PathId p : direct_paths) {
      if (Status s = engine->sim_transport().set_path_down(p, down, engine->now_ns()); !s.is_ok()) return s;
    }
    return Status::ok();
  };

  std::vector<dualpath::HandoffId> ids;
  bool killed = false;
  bool restored = false;
  for (std::size_t i = 0; i <= w->at_ns.size(); ++i) {
    const TimeNs next = i < w->at_ns.size() ? w->at_ns[i] : std::numeric_limits<TimeNs>::max();
    for (auto [when, down, done] : {std::tuple{kill_ns, true, &killed}, std::tuple{restore_ns, false, &restored}}) {
      if (!*done && when <= next) {
        if (Status s = dual->run_until(when); !s.is_ok()) return fail(kMode, s);
        if (Status s = set_direct(down); !s.is_ok()) return fail(kMode, s);
        *done = true;
      }
    }
    if (i == w->at_ns.size()) break;
    if (Status s = dual->run_until(next); !s.is_ok()) return fail(kMode, s);
    auto id = dual->submit(handoff(*w, i));
    if (!id) return fail(kMode, id.error());
    ids.push_back(*id);
  }
  if (Status s = dual->run_until_idle(); !s.is_ok()) return fail(kMode, s);

  ordered_json timeline = ordered_json::array();
  std::uint64_t completed = 0;
  std::optional<TimeNs> recovery_ns;
  std::optional<TimeNs> returned_ns;
  std::optional<TimeNs> first_affected_submit_ns;  // of the handoff that set recovery_us
  int affected = 0;
  int in_flight_at_fault = 0;
  for (dualpath::HandoffId id : ids) {
    auto st = dual->status(id);
    if (!st) return fail(kMode, st.error());
    const bool ok = st->state == dualpath::HandoffState::kCompleted;
    completed += ok;
    // Affected: its direct leg failed under it, or it arrived while direct was dead.
    const bool hit = st->failovers > 0 || (st->submitted_ns >= kill_ns && st->submitted_ns < restore_ns);
    affected += hit;
    in_flight_at_fault += st->failovers > 0 && st->submitted_ns < kill_ns;
    if (ok && hit && st->winner == dualpath::Leg::kStore && st->completed_ns >= kill_ns &&
        (!recovery_ns || st->completed_ns - kill_ns < *recovery_ns)) {
      recovery_ns = st->completed_ns - kill_ns;
      first_affected_submit_ns = st->submitted_ns;
    }
    if (ok && st->winner == dualpath::Leg::kDirect && st->submitted_ns >= restore_ns) {
      returned_ns = std::min(returned_ns.value_or(st->completed_ns), st->completed_ns);
    }
    timeline.push_back({{"id", id},
                        {"start_us", static_cast<double>(st->submitted_ns) / 1e3},
                        {"end_us", static_cast<double>(st->completed_ns) / 1e3},
                        {"leg", std::string(dualpath::to_string(st->winner))},
                        {"status", std::string(dualpath::to_string(st->state))},
                        {"failovers", st->failovers}});
  }
  const dualpath::DualPathStats& s = dual->stats();
  ordered_json j;
  j["requests"] = o.requests;
  j["completed"] = completed;
  j["dropped"] = static_cast<std::uint64_t>(o.requests) - completed;
  j["recovery_us"] = us_or_null(recovery_ns);
  j["returned_to_direct_at_us"] = us_or_null(returned_ns);
  j["kill_at_us"] = static_cast<double>(kill_ns) / 1e3;
  j["restore_at_us"] = static_cast<double>(restore_ns) / 1e3;
  j["strategy"] = std::string(dualpath::to_string(race->strategy));
  j["affected"] = affected;
  j["in_flight_at_fault"] = in_flight_at_fault;
  // recovery_us = (this - kill_at_us, the wait for an affected handoff to
  // exist at all when none was in flight) + its transfer on the store leg.
  j["first_affected_submitted_us"] = us_or_null(first_affected_submit_ns);
  j["failovers"] = s.failovers;
  j["retries"] = s.retries;
  j["probes"] = s.probes;
  j["wasted_bytes"] = s.wasted_bytes;
  j["workload"] = workload_json(o, *w);
  j["timeline"] = timeline;
  if (o.json_path != "-") {
    fmt::print("{} handoffs of {}, direct dead {:.4g} -> {:.4g} ms ({}): {} completed, {} dropped, {} affected\n", o.requests,
               format_size(w->bytes), o.kill_at_ms, o.restore_at_ms, dualpath::to_string(race->strategy), completed,
               o.requests - static_cast<int>(completed), affected);
    fmt::print("  {}; {}; {} failovers, {} probes\n",
               at_or_never(j["recovery_us"], "recovery", "no recovery after the fault"),
               at_or_never(j["returned_to_direct_at_us"], "back on direct at", "never back on direct"), s.failovers,
               s.probes);
  }
  return write_bench_json(kMode, j, o.json_path);
}

void add_common(CLI::App* app, DualPathBenchOptions& o, std::string_view default_strategy) {
  app->add_option("--requests", o.requests, "Handoffs to run");
  app->add_option("--strategy", o.strategy,
                  fmt::format("hedge, request_hedging or failover_only (default {})", default_strategy));
  app->add_option("--duration-ms", o.duration_ms,
                  "Time over which handoffs arrive (Poisson): virtual, or real with --transport ucx (default 40; "
                  "1000 with ucx)");
  app->add_option("--handoff-size", o.handoff_size, "Bytes per handoff (e.g. 1MiB)");
  const CLI::Option* block = app->add_option("--block-size", o.block_size,
                                             "ucx: bytes per KV block, the store's unit and what a failover knows landed");
  const CLI::Option* memory =
      app->add_option("--prefill-memory", o.prefill_memory,
                      "ucx: the prefill peer's KV: caller (its own buffer, registered, as a framework's tensors; "
                      "reached with CMA) or engine (allocated by its engine; mapped by this one)");
  app->add_option("--seed", o.seed, "Seed of the arrivals and the backoff jitter")->check(kUnsigned64);
  app->add_option("--json", o.json_path, "Write the results as JSON to PATH ('-': stdout only)");
  add_peer_options(*app, o.peer);
  // Only the real run has blocks and a prefill process: the simulator took
  // them without a look, malformed or not.
  o.peer.ucx_options.insert(o.peer.ucx_options.end(), {block, memory});
}

// With --transport ucx the run takes real time: a longer default. The fault
// falls a third into the run and ends two thirds in, unless given.
void fill_defaults(CLI::App* app, DualPathBenchOptions& o) {
  auto given = [app](const char* name) {
    const CLI::Option* opt = app->get_option_no_throw(name);
    return opt != nullptr && opt->count() > 0;
  };
  if (o.peer.real() && !given("--duration-ms")) o.duration_ms = 1000;
  if (!given("--kill-at-ms")) o.kill_at_ms = o.duration_ms / 3;
  if (!given("--restore-at-ms")) o.restore_at_ms = o.duration_ms * 2 / 3;
}

}  // namespace

Command add_bench_dualpath(CLI::App& bench) {
  auto o = std::make_shared<DualPathBenchOptions>();
  CLI::App* app = bench.add_subcommand("dualpath", "PD handoffs raced over direct and store vs either leg alone");
  add_common(app, *o, "hedge");
  return {app, [app, o] {
            fill_defaults(app, *o);
            return run_dualpath_bench(*o);
          }};
}

Command add_bench_fault(CLI::App& bench) {
  auto o = std::make_shared<DualPathBenchOptions>();
  CLI::App* app = bench.add_subcommand("fault", "Kill the direct leg mid-run and restore it: failover and return");
  add_common(app, *o, "failover_only");
  app->add_option("--kill-at-ms", o->kill_at_ms, "When every direct path goes down (default a third of the duration)")
      ->default_str("duration/3");
  app->add_option("--restore-at-ms", o->restore_at_ms,
                  "When they come back (ucx: a restarted prefill peer takes the handoffs from then on; default two "
                  "thirds of the duration)")
      ->default_str("2*duration/3");
  return {app, [app, o] {
            fill_defaults(app, *o);
            return run_fault_bench(*o);
          }};
}

}  // namespace baton::cli
