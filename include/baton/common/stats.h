// Small statistics used by benchmarks and the bandwidth estimator:
// percentiles over a sample set and an exponentially weighted moving average.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "baton/common/status.h"

namespace baton {

// The p-th percentile (0 <= p <= 100) of `samples`, linearly interpolated
// between the closest ranks (the "type 7" definition numpy uses by default).
// Empty samples or p outside [0, 100] → invalid_argument.
[[nodiscard]] Result<double> percentile(std::span<const double> samples,
                                        double p);

// One sort, many percentiles: the usual latency summary of a benchmark.
struct Summary {
  std::size_t count = 0;
  double min = 0;
  double mean = 0;
  double p50 = 0;
  double p95 = 0;
  double p99 = 0;
  double max = 0;
};
[[nodiscard]] Result<Summary> summarize(std::span<const double> samples);

// value ← alpha·sample + (1 − alpha)·value; the first sample (or the seed)
// sets the value. A larger alpha follows changes faster.
class Ewma {
 public:
  // alpha must be in (0, 1].
  [[nodiscard]] static Result<Ewma> create(double alpha,
                                           std::optional<double> seed = {});

  void add(double sample);
  [[nodiscard]] std::optional<double> value() const { return value_; }
  [[nodiscard]] double alpha() const { return alpha_; }

 private:
  Ewma(double alpha, std::optional<double> seed)
      : alpha_(alpha), value_(seed) {}

  double alpha_;
  std::optional<double> value_;
};

}  // namespace baton
