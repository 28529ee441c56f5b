// The seed workload of Baton's scheduling claims: a bulk prefill stream and a
// small, deadline-bound decode stream contending for one hot link, run on the
// Engine under the virtual clock. `baton bench mixed` and `ablation`, and the
// scheduler's acceptance tests, all run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/sched/policy.h"
#include "baton/sched/scheduler.h"
#include "baton/transport/cuda_runtime.h"
#include "baton/transport/ucx_transport.h"

namespace baton::workloads {

struct MixedWorkload {
  std::string topology_model = "nvswitch8";
  std::string from = "gpu0";  // the hot link
  std::string to = "gpu1";
  // Prefill: bursts of `prefill_burst` requests of `prefill_bytes` (one long
  // prompt's KV, layer by layer), bursts arriving with exponential gaps.
  std::uint64_t prefill_bytes = 32ULL << 20;
  int prefill_burst = 64;
  static constexpr std::uint64_t kMostArrivals = 2'000'000;  // validate(): requests of both streams together
  TimeNs prefill_interval_ns = 10'000'000;  // mean gap between bursts (≈ 48% of the link)
  // Decode: one request of `decode_bytes` every `decode_interval_ns` on
  // average (exponential gaps), each due `decode_deadline_ns` after it arrives.
  std::uint64_t decode_bytes = 256ULL << 10;
  TimeNs decode_interval_ns = 100'000;
  TimeNs decode_deadline_ns = 2'000'000;
  TimeNs duration_ns = 100'000'000;  // arrivals stop here; the run drains after
  std::uint64_t seed = 1;

  // invalid_argument naming the field for zero sizes, counts or intervals.
  [[nodiscard]] Status validate() const;
};

struct ClassResult {
  std::uint64_t count = 0;  // completed requests
  double p50_us = 0;
  double p95_us = 0;
  double p99_us = 0;
  double miss_ratio = 0;       // requests with a deadline that ended after it
  double throughput_gbps = 0;  // bytes completed / (last completion − first arrival)
  std::vector<double> cdf_us;  // latency at percentiles 0, 1, …, 100 (101 points)
};

struct MixedResult {
  ClassResult decode;
  ClassResult prefill;
  // Every submitted request's final status, per class, and when the run
  // ended: for a summary over all of them (bench/workloads/outcome.h).
  std::vector<sched::RequestStatus> decode_requests;
  std::vector<sched::RequestStatus> prefill_requests;
  TimeNs end_ns = 0;
  sched::SchedStats stats;
  std::uint64_t bytes_delivered = 0;  // by the transport
  // run_mixed_ucx: the batches submitted, and of them those copied without
  // the loop (same-host, the loop idle: docs/engine.md) — which no policy
  // ordered. The other runs leave both 0.
  std::uint64_t batches = 0;
  std::uint64_t direct_batches = 0;
};

[[nodiscard]] Result<MixedResult> run_mixed(const MixedWorkload& workload, const sched::SchedPolicy& policy);

// The same workload in real time: a wall-clock engine with `ucx` settings
// reads every request from the largest region of `peer` (host:port, e.g. a
// `baton serve`) (decode: critical, with its deadline;
// prefill: bulk), arrivals paced on the steady clock. `from`, `to` and the
// topology are unused; bytes_delivered counts completed requests' bytes.
// unavailable when the peer cannot be reached; out_of_range when its region
// is smaller than one prefill plus one decode request.
[[nodiscard]] Result<MixedResult> run_mixed_ucx(const MixedWorkload& workload, const sched::SchedPolicy& policy,
                                                const std::string& peer, const transport::UcxConfig& ucx);

// The same workload over real copies: a wall-clock Harness over the CUDA
// transport on `runtime` (cuda_runtime(), or a scripted one in tests),
// writing from `from` to `to` (topology nodes: "gpu0", or "numa0" for host
// memory) on the topology `topology_model` names ("" for this machine's
// probe). Each side holds one prefill plus one decode request of device
// memory (pinned host memory for a NUMA node); arrivals are paced on the
// steady clock. bytes_delivered counts completed requests' bytes.
// not_found for an endpoint the transport has no path from or to.
[[nodiscard]] Result<MixedResult> run_mixed_cuda(const MixedWorkload& workload, const sched::SchedPolicy& policy,
                                                 std::shared_ptr<transport::CudaRuntime> runtime);

}  // namespace baton::workloads
