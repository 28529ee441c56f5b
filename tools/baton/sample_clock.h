// A clock for timing one short request at a time. A clock_gettime on a VM's
// kvm-clock costs 26 ns, half of a 4 KiB copy; ucx_perftest reads the TSC
// (ucs_get_time), at 11 ns. Where the TSC ticks at a constant rate (x86
// with constant_tsc and nonstop_tsc), samples are taken in ticks and turned
// into time by the rate measured against steady_clock over the whole run;
// elsewhere, steady_clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace baton::cli {

class SampleClock {
 public:
  SampleClock();
  [[nodiscard]] std::uint64_t now() const;
  // Bracket the samples: the rate is measured between the two.
  void start();
  void stop();
  [[nodiscard]] double to_us(std::uint64_t ticks) const { return static_cast<double>(ticks) * us_per_tick_; }
  [[nodiscard]] std::string_view name() const { return tsc_ ? "tsc" : "steady"; }
  // Microseconds from start() to stop() on steady_clock: a check of the
  // samples (their sum cannot exceed it).
  [[nodiscard]] double elapsed_us() const { return elapsed_us_; }

 private:
  bool tsc_ = false;
  std::chrono::steady_clock::time_point start_time_;
  std::uint64_t start_ticks_ = 0;
  double us_per_tick_ = 1e-3;  // steady_clock's ticks are ns
  double elapsed_us_ = 0;
};

}  // namespace baton::cli
