#include "baton/common/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace baton {
namespace {

// Type-7 interpolation on already sorted samples.
double sorted_percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (rank - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Status check_samples(std::span<const double> samples, const char* call) {
  if (samples.empty()) {
    return Status::invalid_argument("{}: no samples", call);
  }
  for (double s : samples) {
    if (std::isnan(s)) return Status::invalid_argument("{}: a sample is NaN", call);
  }
  return Status::ok();
}

}  // namespace

Result<double> percentile(std::span<const double> samples, double p) {
  if (auto s = check_samples(samples, "percentile"); !s.is_ok()) {
    return std::unexpected(s);
  }
  if (!(p >= 0.0 && p <= 100.0)) {
    return std::unexpected(
        Status::invalid_argument("percentile: p = {} is outside [0, 100]", p));
  }
  std::vector<double> sorted(samples.begin(), samples.end());
  std::ranges::sort(sorted);
  return sorted_percentile(sorted, p);
}

Result<Summary> summarize(std::span<const double> samples) {
  if (auto s = check_samples(samples, "summarize"); !s.is_ok()) {
    return std::unexpected(s);
  }
  std::vector<double> sorted(samples.begin(), samples.end());
  std::ranges::sort(sorted);
  Summary out;
  out.count = sorted.size();
  out.min = sorted.front();
  out.max = sorted.back();
  out.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) /
             static_cast<double>(sorted.size());
  out.p50 = sorted_percentile(sorted, 50);
  out.p95 = sorted_percentile(sorted, 95);
  out.p99 = sorted_percentile(sorted, 99);
  return out;
}

Result<Ewma> Ewma::create(double alpha, std::optional<double> seed) {
  if (!(alpha > 0.0 && alpha <= 1.0)) {
    return std::unexpected(
        Status::invalid_argument("Ewma: alpha = {} is outside (0, 1]", alpha));
  }
  if (seed && !std::isfinite(*seed)) {
    return std::unexpected(Status::invalid_argument("Ewma: seed {} is not finite", *seed));
  }
  return Ewma(alpha, seed);
}

void Ewma::add(double sample) {
  if (!std::isfinite(sample)) return;  // one bad measurement must not poison the average
  value_ = value_ ? alpha_ * sample + (1.0 - alpha_) * *value_ : sample;
}

}  // namespace baton
