// What DualPath drives, private to the layer: runs (one contiguous range of
// a handoff sent on one leg) and the clock they run on. Two backends:
// SimLegs (the simulation harness, virtual clock: sim_legs.cc) and
// EngineLegs (a real Engine and its peers, wall clock: engine_legs.cc). The
// ledger, the strategies, failover, backoff and health live once, in
// dualpath.cc, over this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/dualpath/dualpath.h"
#include "baton/engine/metrics.h"
#include "baton/sched/scheduler.h"

namespace baton::dualpath::detail {

using RunId = std::uint64_t;

// A run as it stands. `delivered` is in run offsets (0 = the run's first
// byte). `settled`: nothing the run posted can still land, so what is not
// delivered never will be.
struct RunView {
  sched::RequestState state = sched::RequestState::kRunning;
  Status status;
  std::vector<sched::ByteRange> delivered;
  TimeNs first_delivered_ns = -1;  // when the first delivered piece landed; -1: not known
  TimeNs last_delivered_ns = -1;   // when the last one did
  bool settled = false;
  [[nodiscard]] bool ended() const {
    return state != sched::RequestState::kQueued && state != sched::RequestState::kRunning;
  }
};

class Legs {
 public:
  virtual ~Legs() = default;

  [[nodiscard]] virtual TimeNs now_ns() const = 0;
  // Under the wall clock time passes by itself: run_until accepts the past,
  // and advance() waits instead of moving a virtual clock.
  [[nodiscard]] virtual bool wall_clock() const = 0;
  // The backend's part of submit's validation (endpoints, sources).
  [[nodiscard]] virtual Status validate(const HandoffRequest& request) const = 0;
  // Sends handoff bytes [range.offset, +range.length) on `leg`; the run
  // times out at `timeout_at_ns` (0: the backend's own default). A leg that is down is not an error here: the run
  // comes back already failed `unavailable`, as if it had failed on the wire.
  [[nodiscard]] virtual Result<RunId> start(const HandoffRequest& request, Leg leg, sched::ByteRange range,
                                            TimeNs timeout_at_ns) = 0;
  // Stops a run: the bytes known wasted by stopping it (more may land later
  // and show up as delivered); nullopt when it had already ended.
  virtual std::optional<std::uint64_t> cancel(RunId run) = 0;
  [[nodiscard]] virtual RunView view(RunId run) = 0;
  // Drops a settled run's bookkeeping.
  virtual void forget(RunId run) = 0;
  // A small transfer on `leg` of `request`'s kind, to see whether the leg
  // carries bytes again.
  [[nodiscard]] virtual Result<RunId> probe(const HandoffRequest& request, Leg leg, const DualPathConfig& config) = 0;
  // How long the direct leg should take for `request` (request_hedging's delay).
  [[nodiscard]] virtual double expected_direct_ns(const HandoffRequest& request) const = 0;
  // Virtual clock: the next instant the backend has work (nullopt: none).
  [[nodiscard]] virtual std::optional<TimeNs> next_event_ns() const = 0;
  // Moves time to `t_ns` (virtual), or waits until then or until a run may
  // have changed (wall).
  [[nodiscard]] virtual Status advance(TimeNs t_ns) = 0;
  // Work still queued beneath the runs (the simulator's scheduler).
  [[nodiscard]] virtual bool busy() const = 0;
  [[nodiscard]] virtual engine::MetricsRegistry& metrics() = 0;
};

[[nodiscard]] std::unique_ptr<Legs> sim_legs(engine::Harness& harness);
[[nodiscard]] Result<std::unique_ptr<Legs>> engine_legs(engine::Engine& engine, const DualPathConfig& config);

}  // namespace baton::dualpath::detail
