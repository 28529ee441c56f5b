// Clocks: the engine loop's only sources of time. Layers take a Clock& (or a
// now_ns argument) instead of calling std::chrono directly, so the virtual
// clock can drive whole workloads deterministically in tests and simulation.
#pragma once

#include <cstdint>

#include "baton/common/status.h"

namespace baton {

// Nanoseconds on some clock's timeline. Signed so that differences are safe.
using TimeNs = std::int64_t;

// `span` after `now`, saturating at the timeline's end: a timeout written
// as INT64_MAX ("never") must not wrap into the past and end at once.
[[nodiscard]] constexpr TimeNs time_after(TimeNs now, TimeNs span) {
  TimeNs at = 0;
  if (__builtin_add_overflow(now, span, &at)) return span > 0 ? INT64_MAX : INT64_MIN;
  return at;
}

// `at - now`, saturating: a caller's deadline far in the past (INT64_MIN)
// is very late, not far ahead after a wrap.
[[nodiscard]] constexpr TimeNs time_until(TimeNs now, TimeNs at) {
  TimeNs span = 0;
  if (__builtin_sub_overflow(at, now, &span)) return at > now ? INT64_MAX : INT64_MIN;
  return span;
}

// What a wait on std::chrono clocks is cut to (about 100 years): their own
// arithmetic (now + timeout) overflows for INT64_MAX.
inline constexpr TimeNs kForeverNs = TimeNs{100} * 365 * 24 * 3600 * 1'000'000'000;

class Clock {
 public:
  virtual ~Clock() = default;
  [[nodiscard]] virtual TimeNs now_ns() const = 0;
};

// Monotonic wall time (std::chrono::steady_clock), for real transports.
class SteadyClock final : public Clock {
 public:
  [[nodiscard]] TimeNs now_ns() const override;
};

// Time that moves only when told to. Starts at `start_ns`; never goes back.
// Not thread-safe: it belongs to the loop that drives it.
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(TimeNs start_ns = 0) : now_ns_(start_ns) {}

  [[nodiscard]] TimeNs now_ns() const override { return now_ns_; }

  // Moves to `t_ns`; refuses to move backwards (out_of_range).
  Status advance_to(TimeNs t_ns);
  // Moves forward by `delta_ns` >= 0 (invalid_argument when negative).
  Status advance_by(TimeNs delta_ns);

 private:
  TimeNs now_ns_;
};

}  // namespace baton
