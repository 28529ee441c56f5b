// `baton bench mlu-sweep`: MLU and SLO attainment versus deadline under FIFO,
// FIFO + drop, EDF and EDF + drop + degrade (docs/admission.md), on the
// simulator or over UCX to a `baton serve`.
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "workloads/mlu_sweep.h"
#include "baton/common/units.h"
#include "commands.h"
#include "json_output.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

struct MluSweepOptions {
  std::vector<double> deadlines_us{30, 60, 100, 200, 500, 2000, 5'000'000};
  std::uint64_t seed = 1;
  double duration_ms = 50;
  std::string json_path;
  PeerOptions peer;
  std::string request_size;
  double load = 0.87;
};

// Over a loopback socket (about 1 GB/s here) rather than a 24 GB/s PCIe
// path: 256 KiB reads in batches of 8, the streams offering 87% of the
// measured link, deadlines from 1 ms up, 1 s of arrivals per run.
void apply_ucx_defaults(const CLI::App& app, MluSweepOptions& o) {
  if (app.count("--deadlines-us") == 0) o.deadlines_us = {1000, 2000, 4000, 8000, 20000, 100000, 5'000'000};
  if (app.count("--duration-ms") == 0) o.duration_ms = 1000;
  if (app.count("--request-size") == 0) o.request_size = "256KiB";
}

int run_mlu_sweep_bench(const MluSweepOptions& o) {
  auto fail = [](const Status& s) {
    return fail_command("bench mlu-sweep", s);
  };
  workloads::MluSweepConfig c;
  c.seed = o.seed;
  if (Status s = check_duration_ms(o.duration_ms); !s.is_ok()) return fail(s);
  c.duration_ns = static_cast<TimeNs>(o.duration_ms * 1e6);
  c.deadlines_ns.clear();
  for (double us : o.deadlines_us) {
    if (!(us > 0 && us <= 3.6e9)) return fail(Status::invalid_argument("--deadlines-us: {} must be > 0 and at most 3.6e9 (an hour)", us));
    c.deadlines_ns.push_back(static_cast<TimeNs>(us * 1e3));
  }
  if (!o.request_size.empty()) {
    auto bytes = parse_size(o.request_size);
    if (!bytes) return fail(Status::invalid_argument("--request-size: {}", bytes.error().message()));
    c.request_bytes = *bytes;
  }
  PeerOptions peer = o.peer;
  if (peer.real()) {
    if (!(o.load > 0 && o.load <= 10)) {  // the streams' batches grow with it
      return fail(Status::invalid_argument("--load {} must be > 0 and at most 10", o.load));
    }
    c.load = o.load;
    // The sweep loads a network link to its MLU; a same-host copy has no
    // link to load (arrivals at its ~30 GB/s outrun admission's per-request
    // work), so the peer is reached over UCX's transports.
    peer.ucx.same_host_copy = false;
  }
  auto child = resolve_peer(peer, c.request_bytes * static_cast<std::uint64_t>(c.batch));
  if (!child) return fail(child.error());
  auto result = peer.real() ? workloads::run_mlu_sweep_ucx(c, peer.target, peer.ucx) : workloads::run_mlu_sweep(c);
  if (!result) return fail(result.error());

  nlohmann::ordered_json j;
  j["workload"] = {{"transport", peer.transport},
                   {"topology", peer.real() ? std::string("loopback") : c.topology_model},
                   {"path", peer.real() ? peer.link() : fmt::format("{}->{}", c.from, c.to)},
                   {"request_bytes", c.request_bytes},
                   {"batch", c.batch},
                   {"streams", c.streams},
                   {"mean_batch_interval_us", static_cast<double>(result->mean_batch_interval_ns) / 1e3},
                   {"max_owners", c.max_owners},
                   {"duration_ms", o.duration_ms},
                   {"seed", c.seed}};
  if (peer.real()) {
    j["workload"]["load"] = c.load;
    j["workload"]["link_gbps"] = result->link_gbps;
  }
  j["codec"] = {{"name", "lz4"},
                {"ratio", result->codec_ratio},
                {"compress_gbps", result->codec_compress_gbps},
                {"decompress_gbps", result->codec_decompress_gbps}};
  j["rows"] = nlohmann::ordered_json::array();
  if (o.json_path != "-") {
    fmt::print("{:>11} {:>6} {:>9} {:>9}   attainment fifo / fifo+drop / edf / edf+drop   signalled edf+drop\n",
               "deadline_us", "count", "mean_mlu", "feasible");
  }
  for (const workloads::MluSweepRow& r : result->rows) {
    const double deadline_us = static_cast<double>(r.deadline_ns) / 1e3;
    j["rows"].push_back({{"deadline_us", deadline_us},
                         {"count", r.count},
                         {"mean_mlu", r.mean_mlu},
                         {"feasible_rate", r.feasible_rate},
                         {"unbounded_rate", r.unbounded_rate},
                         {"attainment", {{"fifo", r.fifo.attainment}, {"fifo_drop", r.fifo_drop.attainment},
                                         {"edf", r.edf.attainment}, {"edf_drop", r.edf_drop.attainment}}},
                         {"signalled", {{"fifo", r.fifo.signalled}, {"fifo_drop", r.fifo_drop.signalled},
                                        {"edf", r.edf.signalled}, {"edf_drop", r.edf_drop.signalled}}}});
    if (o.json_path != "-") {
      fmt::print("{:>11.0f} {:>6} {:>9.3f} {:>8.1f}%   {:>6.1f}% / {:>5.1f}% / {:>5.1f}% / {:>5.1f}%   {:>17.1f}%\n",
                 deadline_us, r.count, r.mean_mlu, 100 * r.feasible_rate, 100 * r.fifo.attainment,
                 100 * r.fifo_drop.attainment, 100 * r.edf.attainment, 100 * r.edf_drop.attainment,
                 100 * r.edf_drop.signalled);
    }
  }
  if (o.json_path != "-") {
    fmt::print("lz4 on fp16 KV-like data: ratio {:.3f}, compress {:.2f} GB/s{}\n", result->codec_ratio,
               result->codec_compress_gbps,
               std::isfinite(result->codec_decompress_gbps)
                   ? fmt::format(", decompress {:.2f} GB/s", result->codec_decompress_gbps)
                   : std::string(" (it never shrank the data, so nothing to decompress)"));
  }
  if (*child) {
    if (Status s = (*child)->stop(); !s.is_ok()) return fail(s);
  }
  if (Status s = write_json_output(j.dump(2), o.json_path); !s.is_ok()) return fail(s);
  return 0;
}

}  // namespace

Command add_bench_mlu_sweep(CLI::App& bench) {
  auto o = std::make_shared<MluSweepOptions>();
  CLI::App* app = bench.add_subcommand("mlu-sweep",
                                       "MLU and SLO attainment vs deadline: FIFO, FIFO + drop, EDF, EDF + drop + degrade");
  app->add_option("--deadlines-us", o->deadlines_us, "Deadlines to sweep (us)")->delimiter(',');
  app->add_option("--seed", o->seed, "Seed of the arrivals")->check(kUnsigned64);
  app->add_option("--duration-ms", o->duration_ms, "Virtual time over which batches arrive");
  app->add_option("--json", o->json_path, "Write the results as JSON to PATH ('-': stdout only)");
  app->add_option("--request-size", o->request_size, "Bytes per request (size; 1MiB on sim, 256KiB over UCX)");
  // The simulator's streams are fixed; a load it ignored would read as measured.
  o->peer.ucx_only = {app->add_option("--load", o->load, "ucx: the streams offer this fraction of the measured link")};
  add_peer_options(*app, o->peer);
  return {app, [o, app] {
            if (o->peer.real()) apply_ucx_defaults(*app, *o);
            return run_mlu_sweep_bench(*o);
          }};
}

}  // namespace baton::cli
