// What a scheduling bench reports per class: counts and latency percentiles
// over every submitted request, so a policy cannot look good by leaving work
// unfinished or by dropping it. Shared by the mixed and deadlines workloads.
#pragma once

#include <cstdint>
#include <span>

#include "baton/common/clock.h"
#include "baton/sched/scheduler.h"

namespace baton::workloads {

struct ClassOutcome {
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;       // ended without its bytes: failed, cancelled or deadline_infeasible (dropped)
  std::uint64_t unfinished = 0;   // still queued or running when the run ended
  std::uint64_t with_deadline = 0;
  std::uint64_t missed = 0;       // with a deadline, and not completed by it (unfinished and dropped included)
  std::uint64_t on_time = 0;      // with a deadline, completed by it
  std::uint64_t bytes_completed = 0;
  std::uint64_t bytes_on_time = 0;  // of completed requests that met their deadline or had none
  // Latency from submit to completion; a request that did not complete
  // counts with its latency taken at the end of the run.
  double p50_us = 0;
  double p99_us = 0;
  double p999_us = 0;
};

// `end_ns`: when the run stopped (on the requests' clock).
[[nodiscard]] ClassOutcome summarize_class(std::span<const sched::RequestStatus> requests, TimeNs end_ns);

}  // namespace baton::workloads
