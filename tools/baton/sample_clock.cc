#include "sample_clock.h"

#include <fstream>
#include <sstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace baton::cli {
namespace {

// Whether /proc/cpuinfo's flags promise a TSC at a constant rate that keeps
// ticking in idle states.
bool constant_tsc() {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!line.starts_with("flags")) continue;
    std::istringstream flags(line.substr(line.find(':') + 1));
    bool constant = false, nonstop = false;
    for (std::string flag; flags >> flag;) {
      constant = constant || flag == "constant_tsc";
      nonstop = nonstop || flag == "nonstop_tsc";
    }
    return constant && nonstop;
  }
#endif
  return false;
}

}  // namespace

SampleClock::SampleClock() : tsc_(constant_tsc()) {}

std::uint64_t SampleClock::now() const {
#if defined(__x86_64__)
  if (tsc_) return __rdtsc();
#endif
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

void SampleClock::start() {
  start_time_ = std::chrono::steady_clock::now();
  start_ticks_ = now();
}

void SampleClock::stop() {
  const std::uint64_t ticks = now() - start_ticks_;
  elapsed_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_time_).count();
  if (tsc_ && ticks > 0) us_per_tick_ = elapsed_us_ / static_cast<double>(ticks);
}

}  // namespace baton::cli
