// `baton bench mlu-sweep`: MLU and SLO attainment versus deadline under FIFO,
// EDF and EDF + drop + degrade (docs/admission.md).
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "workloads/mlu_sweep.h"
#include "commands.h"
#include "json_output.h"

namespace baton::cli {
namespace {

struct MluSweepOptions {
  std::vector<double> deadlines_us{30, 60, 100, 200, 500, 2000, 5'000'000};
  std::uint64_t seed = 1;
  double duration_ms = 50;
  std::string json_path;
};

int run_mlu_sweep_bench(const MluSweepOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "baton bench mlu-sweep: {}\n", s.message());
    return 1;
  };
  workloads::MluSweepConfig c;
  c.seed = o.seed;
  if (!(o.duration_ms > 0)) return fail(Status::invalid_argument("--duration-ms {} must be > 0", o.duration_ms));
  c.duration_ns = static_cast<TimeNs>(o.duration_ms * 1e6);
  c.deadlines_ns.clear();
  for (double us : o.deadlines_us) {
    if (!(us > 0)) return fail(Status::invalid_argument("--deadlines-us: {} must be > 0", us));
    c.deadlines_ns.push_back(static_cast<TimeNs>(us * 1e3));
  }
  auto result = workloads::run_mlu_sweep(c);
  if (!result) return fail(result.error());

  nlohmann::ordered_json j;
  j["workload"] = {{"topology", c.topology_model},
                   {"path", fmt::format("{}->{}", c.from, c.to)},
                   {"request_bytes", c.request_bytes},
                   {"batch", c.batch},
                   {"streams", c.streams},
                   {"mean_batch_interval_us", static_cast<double>(c.mean_batch_interval_ns) / 1e3},
                   {"max_owners", c.max_owners},
                   {"duration_ms", o.duration_ms},
                   {"seed", c.seed}};
  j["codec"] = {{"name", "lz4"},
                {"ratio", result->codec_ratio},
                {"compress_gbps", result->codec_compress_gbps},
                {"decompress_gbps", result->codec_decompress_gbps}};
  j["rows"] = nlohmann::ordered_json::array();
  if (o.json_path != "-") {
    fmt::print("{:>11} {:>6} {:>9} {:>9}   attainment fifo / edf / edf+drop   signalled edf+drop\n", "deadline_us",
               "count", "mean_mlu", "feasible");
  }
  for (const workloads::MluSweepRow& r : result->rows) {
    const double deadline_us = static_cast<double>(r.deadline_ns) / 1e3;
    j["rows"].push_back({{"deadline_us", deadline_us},
                         {"count", r.count},
                         {"mean_mlu", r.mean_mlu},
                         {"feasible_rate", r.feasible_rate},
                         {"attainment", {{"fifo", r.fifo.attainment}, {"edf", r.edf.attainment}, {"edf_drop", r.edf_drop.attainment}}},
                         {"signalled", {{"fifo", r.fifo.signalled}, {"edf", r.edf.signalled}, {"edf_drop", r.edf_drop.signalled}}}});
    if (o.json_path != "-") {
      fmt::print("{:>11.0f} {:>6} {:>9.3f} {:>8.1f}%   {:>6.1f}% / {:>5.1f}% / {:>5.1f}%   {:>17.1f}%\n", deadline_us,
                 r.count, r.mean_mlu, 100 * r.feasible_rate, 100 * r.fifo.attainment, 100 * r.edf.attainment,
                 100 * r.edf_drop.attainment, 100 * r.edf_drop.signalled);
    }
  }
  if (o.json_path != "-") {
    fmt::print("lz4 on fp16 KV-like data: ratio {:.3f}, compress {:.2f} GB/s{}\n", result->codec_ratio,
               result->codec_compress_gbps,
               std::isfinite(result->codec_decompress_gbps)
                   ? fmt::format(", decompress {:.2f} GB/s", result->codec_decompress_gbps)
                   : std::string(" (it never shrank the data, so nothing to decompress)"));
  }
  if (Status s = write_json_output(j.dump(2), o.json_path); !s.is_ok()) return fail(s);
  return 0;
}

}  // namespace

Command add_bench_mlu_sweep(CLI::App& bench) {
  auto o = std::make_shared<MluSweepOptions>();
  CLI::App* app = bench.add_subcommand("mlu-sweep", "MLU and SLO attainment vs deadline: FIFO, EDF, EDF + drop + degrade");
  app->add_option("--deadlines-us", o->deadlines_us, "Deadlines to sweep (us)")->delimiter(',');
  app->add_option("--seed", o->seed, "Seed of the arrivals");
  app->add_option("--duration-ms", o->duration_ms, "Virtual time over which batches arrive");
  app->add_option("--json", o->json_path, "Write the results as JSON to PATH ('-': stdout only)");
  return {app, [o] { return run_mlu_sweep_bench(*o); }};
}

}  // namespace baton::cli
