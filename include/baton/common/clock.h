// Clocks: the engine loop's only sources of time. Layers take a Clock& (or a
// now_ns argument) instead of calling std::chrono directly, so the virtual
// clock can drive whole workloads deterministically in tests and simulation.
#pragma once

#include <cstdint>

#include "baton/common/status.h"

namespace baton {

// Nanoseconds on some clock's timeline. Signed so that differences are safe.
using TimeNs = std::int64_t;

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
