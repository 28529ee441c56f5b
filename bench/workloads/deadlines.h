// The deadlines workload: one link loaded to a chosen fraction of its
// bandwidth by three classes — decode reads of one class with deadlines
// drawn from a mix, prefill transfers with TTFT-style deadlines proportional
// to their size, background offload with none — where class priority alone
// cannot win: the decode requests differ only by deadline, and so do the
// prefill ones. `baton bench deadlines` runs it under each policy, on the
// simulator (virtual clock) or over UCX to a peer (wall clock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/sched/policy.h"
#include "baton/transport/ucx_transport.h"
#include "workloads/outcome.h"

namespace baton::workloads {

struct DeadlinesWorkload {
  // The link (simulator): a topology model and two of its nodes.
  std::string topology_model = "pcie4";
  std::string from = "gpu0";
  std::string to = "gpu1";
  // Offered bytes per second = load × link_gbps, split by the shares below.
  double load = 0.9;
  double link_gbps = 0;  // 0: the path's figure (simulator) or measured before the run (UCX)
  // Background is small by default so that --load above 1 overloads the
  // work that has deadlines (with a large background share, serving
  // deadlines first is enough and no policy is overloaded).
  double decode_share = 0.1;
  double prefill_share = 0.85;  // background takes the rest
  std::uint64_t decode_bytes = 256ULL << 10;
  std::vector<TimeNs> decode_deadlines_ns{1'000'000, 5'000'000, 20'000'000};  // drawn uniformly
  std::vector<std::uint64_t> prefill_bytes{1ULL << 20, 2ULL << 20, 4ULL << 20};  // layer-wise KV chunks, drawn uniformly
  // A prefill is due `prefill_slack` × its own transfer time on the idle link after it arrives.
  double prefill_slack = 4.0;
  std::uint64_t background_bytes = 16ULL << 20;
  TimeNs duration_ns = 1'000'000'000;  // arrivals stop here (a shorter run is not yet in steady state)
  std::uint64_t seed = 1;

  // invalid_argument naming the field.
  [[nodiscard]] Status validate() const;
  // invalid_argument when the run would generate more than 2e7 requests
  // on a link of `link_gbps` (validate() checks a given link_gbps).
  [[nodiscard]] Status within_request_bound(double link_gbps) const;
  // The largest request any class makes: what a peer's region must hold.
  [[nodiscard]] std::uint64_t largest_request_bytes() const;
  // Arrivals stop at duration_ns; the run ends one longest deadline later,
  // so every request with a deadline had its whole window.
  [[nodiscard]] TimeNs run_ns(double link_gbps) const;
};

enum class WorkloadClass : std::uint8_t { kDecode, kPrefill, kBackground };
inline constexpr int kWorkloadClassCount = 3;
[[nodiscard]] std::string_view to_string(WorkloadClass c);

struct PolicyRun {
  ClassOutcome classes[kWorkloadClassCount];
  double on_time_fraction = 0;  // requests with a deadline completed by it / all with a deadline
  double goodput_gbps = 0;      // bytes of requests on time (or without deadline) / run time
  std::uint64_t signalled = 0;  // ended for local recompute (deadline_aware's admission)
  sched::SchedStats stats;
};

struct DeadlinesResult {
  double link_gbps = 0;  // the figure the load was computed from
  TimeNs run_ns = 0;
  std::vector<std::pair<sched::PolicyKind, PolicyRun>> policies;
};

// The policies as the benches compare them: the three baselines as they
// are, and deadline_aware with its admission (EDF order, infeasible
// requests dropped for local recompute).
[[nodiscard]] sched::SchedPolicy policy_for(sched::PolicyKind kind, const sched::SchedPolicy& base);

[[nodiscard]] Result<DeadlinesResult> run_deadlines(const DeadlinesWorkload& workload,
                                                    const std::vector<sched::PolicyKind>& policies,
                                                    const sched::SchedPolicy& base);

// The same over UCX: reads from the largest region of `peer` (host:port),
// arrivals paced on the steady clock. The link figure, unless given, is
// measured first with bulk reads.
[[nodiscard]] Result<DeadlinesResult> run_deadlines_ucx(const DeadlinesWorkload& workload,
                                                        const std::vector<sched::PolicyKind>& policies,
                                                        const sched::SchedPolicy& base, const std::string& peer,
                                                        const transport::UcxConfig& ucx);

}  // namespace baton::workloads
