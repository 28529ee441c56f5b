// The admission benchmark: 1 MiB transfers in batches of 8 from two
// submitting streams contend for one PCIe path, swept over deadlines. Per
// deadline it reports the MLU at submit and, under FIFO, EDF and EDF + drop +
// degrade, the SLO attainment and the share of requests signalled for local
// recompute. `baton bench mlu-sweep` and the admission tests run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"

namespace baton::workloads {

struct MluSweepConfig {
  std::vector<TimeNs> deadlines_ns{30'000, 60'000, 100'000, 200'000, 500'000, 2'000'000, 5'000'000'000};
  std::string topology_model = "pcie4";
  std::string from = "gpu0";
  std::string to = "gpu1";
  std::uint64_t request_bytes = 1ULL << 20;
  int batch = 8;
  int streams = 2;
  TimeNs mean_batch_interval_ns = 800'000;  // per stream (exponential gaps): ~87% of the path
  TimeNs duration_ns = 50'000'000;
  int max_owners = 16;  // admission capacity, the same under every policy
  std::uint64_t seed = 1;

  [[nodiscard]] Status validate() const;
};

struct PolicyOutcome {
  double attainment = 0;  // all bytes arrived by the deadline / all requests
  double signalled = 0;   // ended deadline_infeasible with the local-recompute signal / all
};

struct MluSweepRow {
  TimeNs deadline_ns = 0;
  std::uint64_t count = 0;
  double mean_mlu = 0;       // at submit, each value capped at kMeanMluCap
  double feasible_rate = 0;  // MLU < 1 at submit
  PolicyOutcome fifo;
  PolicyOutcome edf;
  PolicyOutcome edf_drop;
};

// An MLU above this counts as this in the mean: one unbounded value (no
// bandwidth left before the deadline) must not swamp the row.
inline constexpr double kMeanMluCap = 10.0;

struct MluSweepResult {
  std::vector<MluSweepRow> rows;
  // The lz4 codec as measured on fp16 KV-like data on this machine, offered
  // to EDF + drop + degrade (used only where it pays).
  double codec_ratio = 1.0;
  double codec_compress_gbps = 0;
  double codec_decompress_gbps = 0;
};

[[nodiscard]] Result<MluSweepResult> run_mlu_sweep(const MluSweepConfig& config);

}  // namespace baton::workloads
