#include "baton/admission/bandwidth_estimator.h"

namespace baton::admission {

Result<BandwidthEstimator> BandwidthEstimator::create(const std::vector<transport::PathInfo>& paths, double alpha) {
  std::vector<PathEstimate> estimates;
  for (const transport::PathInfo& p : paths) {
    auto ewma = Ewma::create(alpha, p.bandwidth_gbps);
    if (!ewma) return std::unexpected(Status::invalid_argument("BandwidthEstimator: {}", ewma.error().message()));
    estimates.push_back({*ewma, -1, 0});
  }
  return BandwidthEstimator(std::move(estimates));
}

void BandwidthEstimator::on_completion(transport::PathId path, std::uint64_t bytes, TimeNs now_ns,
                                       bool path_still_busy) {
  if (path >= paths_.size()) return;
  PathEstimate& e = paths_[path];
  if (e.window_start_ns < 0) {
    // The first completion of a busy stretch opens the window; its own bytes
    // were sent before the window started, so they are not counted.
    if (path_still_busy) {
      e.window_start_ns = now_ns;
      e.window_bytes = 0;
    }
    return;
  }
  e.window_bytes += bytes;
  const TimeNs elapsed = now_ns - e.window_start_ns;
  if (elapsed >= kMinWindowNs) {
    e.ewma.add(static_cast<double>(e.window_bytes) / static_cast<double>(elapsed));
    e.window_start_ns = now_ns;
    e.window_bytes = 0;
  }
  if (!path_still_busy) e.window_start_ns = -1;  // idle time is not the path's fault
}

double BandwidthEstimator::estimate_gbps(transport::PathId path) const {
  return path < paths_.size() ? paths_[path].ewma.value().value_or(0.0) : 0.0;
}

}  // namespace baton::admission
