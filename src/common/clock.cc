#include "baton/common/clock.h"

#include <chrono>

namespace baton {

TimeNs SteadyClock::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status VirtualClock::advance_to(TimeNs t_ns) {
  if (t_ns < now_ns_) {
    return Status::out_of_range(
        "VirtualClock::advance_to: {} ns is before now ({} ns); time never goes back",
        t_ns, now_ns_);
  }
  now_ns_ = t_ns;
  return Status::ok();
}

Status VirtualClock::advance_by(TimeNs delta_ns) {
  if (delta_ns < 0) {
    return Status::invalid_argument(
        "VirtualClock::advance_by: delta {} ns is negative", delta_ns);
  }
  now_ns_ += delta_ns;
  return Status::ok();
}

}  // namespace baton
