#include "baton/admission/bandwidth_estimator.h"

namespace baton::admission {

Result<BandwidthEstimator> BandwidthEstimator::create(const std::vector<transport::PathInfo>& paths, double alpha) {
  auto probe = Ewma::create(alpha);
  if (!probe) return std::unexpected(Status::invalid_argument("BandwidthEstimator: {}", probe.error().message()));
  BandwidthEstimator estimator({}, alpha);
  estimator.sync(paths);
  return estimator;
}

void BandwidthEstimator::sync(const std::vector<transport::PathInfo>& paths) {
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const double seed = paths[i].bandwidth_gbps;
    if (i < paths_.size() && paths_[i].incarnation == paths[i].incarnation &&
        (paths_[i].measured || paths_[i].seed_gbps == seed)) {
      continue;
    }
    // alpha was checked in create(), so this cannot fail.
    PathEstimate fresh{*Ewma::create(alpha_, seed), seed, false, -1, 0, paths[i].incarnation};
    if (i < paths_.size()) {
      paths_[i] = fresh;
    } else {
      paths_.push_back(fresh);
    }
  }
}

bool BandwidthEstimator::measured(transport::PathId path) const {
  return path < paths_.size() && paths_[path].measured;
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
    // The cost model's figure stands in only until the path is measured: the
    // first sample replaces it (blending from 3 GB/s down to a real 0.12
    // took dozens of slices on a 1 Gbit/s link).
    if (!e.measured) e.ewma = *Ewma::create(alpha_);
    e.ewma.add(static_cast<double>(e.window_bytes) / static_cast<double>(elapsed));
    e.measured = true;
    e.window_start_ns = now_ns;
    e.window_bytes = 0;
  }
  if (!path_still_busy) e.window_start_ns = -1;  // idle time is not the path's fault
}

double BandwidthEstimator::estimate_gbps(transport::PathId path) const {
  return path < paths_.size() ? paths_[path].ewma.value().value_or(0.0) : 0.0;
}

}  // namespace baton::admission
