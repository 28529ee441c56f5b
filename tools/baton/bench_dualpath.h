// `baton bench dualpath` / `fault`: what the simulated runs (bench_dualpath.cc)
// and the runs over real processes (bench_dualpath_ucx.cc) share — the
// options, the Poisson arrivals and the latency summary of the JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/dualpath/dualpath.h"
#include "ucx_options.h"

namespace baton::cli {

struct DualPathBenchOptions {
  int requests = 200;
  std::string strategy;  // default differs per mode
  double duration_ms = 40;
  std::string handoff_size = "1MiB";
  std::uint64_t seed = 1;
  double kill_at_ms = 0;     // unless given: a third of duration_ms
  double restore_at_ms = 0;  // unless given: two thirds
  std::string json_path;
  // --transport ucx --spawn: real processes.
  PeerOptions peer;
  std::string block_size = "256KiB";  // a KV block: the store's unit and DualPath's piece
  std::string prefill_memory = "caller";  // `baton serve --memory` of the prefill peer
};

struct Workload {
  std::vector<TimeNs> at_ns;  // arrivals, from the start of the run
  std::uint64_t bytes = 0;
};

[[nodiscard]] Result<Workload> workload(const DualPathBenchOptions& o);
// {"p50", "p95", "p99"} of the latencies, nulls when there are none.
[[nodiscard]] nlohmann::ordered_json summary_json(std::vector<double> latencies_us);
int fail_bench(std::string_view mode, const Status& s);
// Writes the JSON to `path` ("-": stdout only): 0, or 1 saying why not.
int write_bench_json(std::string_view mode, const nlohmann::ordered_json& j, const std::string& path);
// One line per mode of j["latency_us"] that has figures.
void print_latencies(const nlohmann::ordered_json& latency_us);
// The contract both `bench dualpath` runs keep: requests, strategy, wins,
// cancelled_legs, latency_us and completed per mode, wasted_bytes.
[[nodiscard]] nlohmann::ordered_json race_json(int requests, dualpath::Strategy strategy,
                                               const dualpath::DualPathStats& stats,
                                               const std::vector<double>& racing_us,
                                               const std::vector<double>& direct_only_us,
                                               const std::vector<double>& store_only_us);
// Microseconds, or null.
[[nodiscard]] nlohmann::ordered_json us_or_null(std::optional<TimeNs> t_ns);
// For people: "`when` N us" for us_or_null's number, `never` for its null
// (it never happened in the run, said in words).
[[nodiscard]] std::string at_or_never(const nlohmann::ordered_json& us, std::string_view when,
                                      std::string_view never);

// The runs over real processes: a `baton serve` as the prefill peer (and a
// second one standing in for its restart), a `baton store` holding the same
// blocks, and this process's engine racing them with DualPath.
int run_dualpath_ucx(const DualPathBenchOptions& o, const Workload& w);
int run_fault_ucx(const DualPathBenchOptions& o, const Workload& w);

}  // namespace baton::cli
