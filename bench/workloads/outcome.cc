#include "workloads/outcome.h"

#include <algorithm>
#include <vector>

#include "baton/common/stats.h"

namespace baton::workloads {

ClassOutcome summarize_class(std::span<const sched::RequestStatus> requests, TimeNs end_ns) {
  ClassOutcome o;
  std::vector<double> latencies_us;
  latencies_us.reserve(requests.size());
  for (const sched::RequestStatus& s : requests) {
    ++o.submitted;
    const bool completed = s.state == sched::RequestState::kCompleted;
    const bool live = s.state == sched::RequestState::kQueued || s.state == sched::RequestState::kRunning;
    o.completed += completed;
    o.unfinished += live;
    o.failed += !completed && !live;
    const bool on_time = completed && (s.deadline_ns == 0 || s.completed_ns <= s.deadline_ns);
    if (s.deadline_ns != 0) {
      ++o.with_deadline;
      o.on_time += on_time;
      o.missed += !on_time;
    }
    if (completed) o.bytes_completed += s.bytes;
    if (on_time) o.bytes_on_time += s.bytes;
    const TimeNs at = completed ? s.completed_ns : std::max(end_ns, s.submitted_ns);
    latencies_us.push_back(static_cast<double>(at - s.submitted_ns) / 1000.0);
  }
  if (!latencies_us.empty()) {
    o.p50_us = *percentile(latencies_us, 50);
    o.p99_us = *percentile(latencies_us, 99);
    o.p999_us = *percentile(latencies_us, 99.9);
  }
  return o;
}

}  // namespace baton::workloads
