// `baton bench matrix`: the measured bandwidth of every path between the
// listed GPUs and host memory over the CUDA transport, next to the cost
// model's figure, as a table, JSON (scripts/plot draws the heatmap) and,
// with --update-model, a policy fragment (`cost_model:`) with the measured
// figures for a policy file to include.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/units.h"
#include "commands.h"
#include "json_output.h"
#include "workloads/cuda_matrix.h"

namespace baton::cli {
namespace {

struct MatrixCommandOptions {
  std::vector<int> gpus;
  std::string block_size = "64MiB";
  int repeat = 10;
  std::string topology_model;
  std::string json;
  std::string update_model;
};

int fail(int code, const std::string& why) {
  fmt::print(stderr, "baton bench matrix: {}\n", why);
  return code;
}

// One entry per (path type, proximity): the best measured figure, per link
// for NVLink paths (the cost model scales those by the link count).
std::string policy_fragment(const std::vector<workloads::MatrixCell>& cells, std::uint64_t block_bytes) {
  struct Best {
    double gbps = 0;
    double latency_us = 0;
  };
  std::map<std::pair<topology::PathType, topology::Proximity>, Best> best;
  for (const workloads::MatrixCell& c : cells) {
    if (!c.type) continue;
    const bool per_link = *c.type == topology::PathType::kNvlink || *c.type == topology::PathType::kNvswitch;
    const double gbps = per_link && c.nvlinks > 0 ? c.measured_gbps / c.nvlinks : c.measured_gbps;
    Best& b = best[{*c.type, c.proximity}];
    if (gbps > b.gbps) b = {gbps, c.model_latency_us};
  }
  const std::time_t now = std::time(nullptr);
  char date[32] = {};
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::string out = fmt::format(
      "# Measured by `baton bench matrix` on {} ({} blocks): GB/s per path type and\n"
      "# proximity (per link for nvlink/nvswitch); latencies are the model's.\n"
      "# Add to a policy file (EngineConfig::policy_file / --policy-file).\n"
      "cost_model:\n",
      date, format_size(block_bytes));
  std::optional<topology::PathType> last;
  for (const auto& [key, b] : best) {
    if (last != key.first) out += fmt::format("  {}:\n", topology::to_string(key.first));
    last = key.first;
    out += fmt::format("    {}: {{bandwidth_gbps: {:.2f}, latency_us: {:g}}}\n", topology::to_string(key.second), b.gbps,
                       b.latency_us);
  }
  return out;
}

int run_matrix(const MatrixCommandOptions& o) {
  auto block = parse_size(o.block_size);
  if (!block) return fail(2, fmt::format("--block-size: {}", block.error().message()));
  // The flags first: a mistake is said as such on a machine without a GPU too.
  workloads::MatrixOptions m{o.gpus, *block, o.repeat, o.topology_model};
  if (Status s = m.validate(); !s.is_ok()) return fail(2, s.message());
  if (!o.update_model.empty()) {
    if (Status s = check_output_file("--update-model", o.update_model); !s.is_ok()) return fail(2, s.message());
  }
  auto runtime = transport::cuda_runtime();
  if (!runtime) return fail(1, runtime.error().message());
  auto cells = workloads::measure_matrix(*runtime, m);
  if (!cells) return fail(1, cells.error().message());

  nlohmann::ordered_json paths = nlohmann::ordered_json::array();
  if (o.json != "-") {
    fmt::print("{:<8} {:<8} {:<8} {:<13} {:>10} {:>10} {:>7}\n", "from", "to", "kind", "path", "GB/s", "model", "ratio");
  }
  for (const workloads::MatrixCell& c : *cells) {
    nlohmann::ordered_json j{{"from", c.from},
                             {"to", c.to},
                             {"kind", c.kind},
                             {"path", c.type ? std::string(topology::to_string(*c.type)) : "copy"},
                             {"proximity", std::string(topology::to_string(c.proximity))},
                             {"measured_gbps", c.measured_gbps}};
    j["model_gbps"] = c.model_gbps ? nlohmann::ordered_json(*c.model_gbps) : nlohmann::ordered_json(nullptr);
    j["ratio"] = c.model_gbps && *c.model_gbps > 0 ? nlohmann::ordered_json(c.measured_gbps / *c.model_gbps)
                                                    : nlohmann::ordered_json(nullptr);
    if (c.kind == "d2d") j["read_write_gbps"] = 2 * c.measured_gbps;  // how CUDA's bandwidthTest counts a D2D copy
    if (o.json != "-") {
      fmt::print("{:<8} {:<8} {:<8} {:<13} {:>10.2f} {:>10} {:>7}\n", c.from, c.to, c.kind, j["path"].get<std::string>(),
                 c.measured_gbps, c.model_gbps ? fmt::format("{:.2f}", *c.model_gbps) : "-",
                 c.model_gbps ? fmt::format("{:.2f}", c.measured_gbps / *c.model_gbps) : "-");
    }
    paths.push_back(std::move(j));
  }
  nlohmann::ordered_json result{
      {"bench", "matrix"}, {"gpus", o.gpus}, {"block_bytes", *block}, {"repeat", o.repeat}, {"paths", paths}};
  if (!o.update_model.empty()) {
    std::ofstream file(o.update_model);
    file << policy_fragment(*cells, *block);
    if (!file.flush()) return fail(1, fmt::format("--update-model: cannot write {}", o.update_model));
  }
  return emit_json("bench matrix", result.dump(2), o.json);
}

}  // namespace

Command add_bench_matrix(CLI::App& bench) {
  auto o = std::make_shared<MatrixCommandOptions>();
  CLI::App* app = bench.add_subcommand(
      "matrix", "Measured GB/s of every path between GPUs and host memory (CUDA), next to the cost model's");
  app->add_option("--gpus", o->gpus, "GPUs as `baton topo` numbers them: 0,1")->required()->delimiter(',');
  app->add_option("--block-size", o->block_size, "Bytes per timed copy (size)");
  app->add_option("--repeat", o->repeat, "Timed blocks per path")->check(CLI::Range(1, 100000));
  app->add_option("--topology-model", o->topology_model, "A synthetic topology instead of this machine's probe")->check(kTopologyModel);
  app->add_option("--json", o->json, "Write the results as JSON to PATH ('-': stdout only)");
  app->add_option("--update-model", o->update_model,
                  "Write a policy fragment (cost_model:) with the measured figures to FILE");
  return {app, [o] { return run_matrix(*o); }};
}

}  // namespace baton::cli
