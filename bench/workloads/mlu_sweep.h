// The admission benchmark: transfers in batches from two submitting streams
// contend for one path, swept over deadlines. Per deadline it reports the
// MLU at submit and, under FIFO, FIFO + drop, EDF and EDF + drop + degrade,
// the SLO attainment and the share of requests signalled for local
// recompute, so each part's gain shows on its own. On the simulator (a PCIe
// path, virtual clock) or over UCX to a peer (wall clock). `baton bench
// mlu-sweep` and the admission tests run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/transport/ucx_transport.h"

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
  // When > 0, the interval is derived from the link instead: the streams
  // together offer `load` × link_gbps (UCX: the link is measured first).
  double load = 0;
  double link_gbps = 0;  // UCX: 0 measures it
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
  double mean_mlu = 0;        // at submit, each value capped at kMeanMluCap
  double feasible_rate = 0;   // MLU < 1 at submit
  double unbounded_rate = 0;  // MLU "unbounded": no bandwidth known, or none left before the deadline
  PolicyOutcome fifo;
  PolicyOutcome fifo_drop;
  PolicyOutcome edf;
  PolicyOutcome edf_drop;
};

// An MLU above this counts as this in the mean: one unbounded value (no
// bandwidth left before the deadline) must not swamp the row.
inline constexpr double kMeanMluCap = 10.0;

struct MluSweepResult {
  std::vector<MluSweepRow> rows;
  double link_gbps = 0;                 // UCX: as measured (or given)
  TimeNs mean_batch_interval_ns = 0;    // per stream, as run
  // The lz4 codec as measured on fp16 KV-like data on this machine, offered
  // to the drop variants on both transports (used only where it pays).
  double codec_ratio = 1.0;
  double codec_compress_gbps = 0;
  double codec_decompress_gbps = 0;
};

[[nodiscard]] Result<MluSweepResult> run_mlu_sweep(const MluSweepConfig& config);

// Over UCX: reads from the largest region of `peer` (host:port).
[[nodiscard]] Result<MluSweepResult> run_mlu_sweep_ucx(const MluSweepConfig& config, const std::string& peer,
                                                       const transport::UcxConfig& ucx);

}  // namespace baton::workloads
