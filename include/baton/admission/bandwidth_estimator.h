// Per-path bandwidth as the transport actually delivers it: an EWMA of the
// rate measured over busy stretches of the path, seeded from the cost model
// so the first decision has a sane figure. Lives on the engine loop.
#pragma once

#include <vector>

#include "baton/common/clock.h"
#include "baton/common/stats.h"
#include "baton/transport/transport.h"

namespace baton::admission {

class BandwidthEstimator {
 public:
  // One estimate per transport path, seeded with its cost-model bandwidth.
  // invalid_argument for alpha outside (0, 1].
  [[nodiscard]] static Result<BandwidthEstimator> create(const std::vector<transport::PathInfo>& paths,
                                                         double alpha);

  // A slice of `bytes` completed on `path` at `now_ns`; `path_still_busy`:
  // other slices are still in flight there. A sample is the bytes completed
  // over a busy stretch of at least kMinWindowNs, so simultaneous completions
  // on parallel lanes do not read as infinite bandwidth.
  void on_completion(transport::PathId path, std::uint64_t bytes, TimeNs now_ns, bool path_still_busy);

  // Takes on the paths a transport added since (a UCX peer connects after
  // the engine was made), each seeded with its cost-model figure, and
  // re-seeds a path not yet measured when its figure changed (UCX said which
  // transport it chose). A measured path keeps what it measured, unless
  // its id went to a new path (PathInfo::incarnation): that starts afresh.
  void sync(const std::vector<transport::PathInfo>& paths);

  // Bytes per ns (= GB/s).
  [[nodiscard]] double estimate_gbps(transport::PathId path) const;
  // Whether a sample has been taken on `path` (else the estimate is the seed).
  [[nodiscard]] bool measured(transport::PathId path) const;

  static constexpr TimeNs kMinWindowNs = 20'000;

 private:
  struct PathEstimate {
    Ewma ewma;
    double seed_gbps = 0;
    bool measured = false;
    TimeNs window_start_ns = -1;  // -1: no busy stretch open
    std::uint64_t window_bytes = 0;
    std::uint32_t incarnation = 0;  // the path's PathInfo::incarnation
  };
  BandwidthEstimator(std::vector<PathEstimate> paths, double alpha) : paths_(std::move(paths)), alpha_(alpha) {}
  std::vector<PathEstimate> paths_;
  double alpha_ = 1;
};

}  // namespace baton::admission
