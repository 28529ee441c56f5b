// DualPath: a KV handoff served by two competing sources, direct (the
// prefill worker's GPU, e.g. gpu0 -> gpu1 over NVSwitch) and store (a KV
// store reached through a NIC, e.g. nic1 -> gpu1 over GDR). It races them
// (hedge, request_hedging) or keeps the store in reserve (failover_only),
// cancels the loser, moves the missing bytes to the other leg when a leg's
// endpoint dies mid-flight (bytes known to have landed are not re-sent), and
// retries with backoff and jitter when both legs are down. A health monitor
// soft-excludes a failed leg and re-admits it when probes succeed.
//
// Over the simulation harness it drives the virtual clock itself, one event
// at a time, so it reacts at the instant a leg fails or wins. Over a real
// Engine it runs on the wall clock: the direct leg reads from the prefill
// peer's regions, the store leg from a KV store's (`baton store`), and
// run_until waits on the engine's batch events until the next timer. Either
// way it lives on the thread that calls it; no locks. docs/dualpath.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "baton/engine/harness.h"
#include "baton/sched/policy.h"

namespace baton::dualpath {

enum class Strategy : std::uint8_t {
  kHedge,           // start both legs; the first complete copy wins
  kRequestHedging,  // direct; store too if direct has not finished within the hedge delay
  kFailoverOnly,    // direct; store only when direct is (or goes) dead
};
[[nodiscard]] std::string_view to_string(Strategy strategy);
// "hedge", "request_hedging", "failover_only"; invalid_argument otherwise.
[[nodiscard]] Result<Strategy> parse_strategy(std::string_view name);

enum class Leg : std::uint8_t { kDirect, kStore };
[[nodiscard]] std::string_view to_string(Leg leg);

struct DualPathConfig {
  Strategy strategy = Strategy::kRequestHedging;
  // request_hedging: start the store leg after `hedge_delay_ns` when > 0,
  // else after hedge_factor × the direct leg's expected time (bytes over the
  // best path's bandwidth, plus its latency), at least hedge_delay_min_ns.
  TimeNs hedge_delay_ns = 0;
  double hedge_factor = 3.0;
  TimeNs hedge_delay_min_ns = 2'000;
  // Both legs down: retry after initial × multiplier^attempt, capped at max,
  // each stretched by a uniform factor in [1 - jitter, 1 + jitter].
  TimeNs backoff_initial_ns = 10'000;
  TimeNs backoff_max_ns = 1'000'000;
  double backoff_multiplier = 2.0;
  double backoff_jitter = 0.2;
  // A handoff with neither deadline nor timeout gives up (unavailable) this
  // long after submit when no leg can carry it.
  TimeNs default_timeout_ns = 100'000'000;
  // Health: an excluded leg is probed every probe_interval_ns with a
  // probe_bytes transfer to `probe_remote_addr` (a scratch area at the
  // destination); probe_successes in a row re-admit it.
  TimeNs probe_interval_ns = 50'000;
  std::uint64_t probe_bytes = 4096;
  int probe_successes = 1;
  std::uint64_t probe_remote_addr = 0;
  std::uint64_t seed = 1;  // of the backoff jitter
  // Over an Engine: a run is sent as requests of at most this many bytes,
  // the unit a failover knows landed (a KV block, typically).
  std::uint64_t piece_bytes = 1 << 20;

  // invalid_argument naming the field and the value.
  [[nodiscard]] Status validate() const;
};

// Over an Engine: `length` bytes of a handoff at `region` + `offset` of
// `peer` (its Peer::address; the region one it exported to us).
struct Source {
  std::string peer;
  transport::RegionHandle region = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

struct HandoffRequest {
  // Simulation: topology endpoints. Engine: the legs' names, which health
  // tracking goes by (a restarted prefill worker keeps its name, not its
  // address); empty = the address of the leg's first source.
  std::string direct_from;  // "gpu0": the prefill GPU
  std::string store_from;   // "nic1": where the store's bytes enter the node
  std::string to;           // "gpu1": the decode GPU (Engine: unused)
  std::uint64_t bytes = 0;
  sched::QosClass qos = sched::QosClass::kHotKv;
  TimeNs deadline_ns = 0;  // absolute; 0 = none
  TimeNs timeout_ns = 0;   // from submit; 0 = DualPathConfig::default_timeout_ns (or the deadline)
  std::uint64_t remote_addr = 0;  // simulation: where byte 0 lands at `to`
  // Engine: where each leg finds the bytes, in handoff order, the pieces of
  // each leg covering [0, bytes) exactly; and where they land here.
  std::vector<Source> direct_sources{};
  std::vector<Source> store_sources{};
  transport::RegionHandle local_region = 0;
  std::uint64_t local_offset = 0;
};

using HandoffId = std::uint64_t;

enum class HandoffState : std::uint8_t { kRunning, kBackoff, kCompleted, kFailed, kCancelled };
[[nodiscard]] std::string_view to_string(HandoffState state);

struct HandoffStatus {
  HandoffState state = HandoffState::kRunning;
  Status status;
  Leg winner = Leg::kDirect;  // the leg whose bytes completed the copy (when completed)
  std::uint64_t bytes = 0;
  std::uint64_t bytes_landed = 0;  // counted once each
  std::uint64_t bytes_direct = 0;  // of bytes_landed, per leg
  std::uint64_t bytes_store = 0;
  TimeNs submitted_ns = 0;
  TimeNs completed_ns = 0;      // when it ended
  TimeNs first_store_ns = -1;   // when a store leg first started (-1: never)
  // When the store leg's first bytes counted here landed (-1: never). Over an
  // Engine, when its first piece completed; in the simulator, when the run
  // that carried them was settled (a later bound).
  TimeNs first_store_byte_ns = -1;
  std::uint32_t failovers = 0;  // times its missing bytes moved to the other leg
  TimeNs first_failover_ns = -1;  // when they first did (-1: never)
  std::uint32_t retries = 0;    // backoff rounds
  std::uint32_t legs_cancelled = 0;
  std::uint64_t wasted_bytes = 0;  // landed twice (hedge loser) or stopped on the wire
  [[nodiscard]] bool ended() const {
    return state == HandoffState::kCompleted || state == HandoffState::kFailed || state == HandoffState::kCancelled;
  }
};

struct DualPathStats {
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t wins_direct = 0;
  std::uint64_t wins_store = 0;
  std::uint64_t failovers = 0;
  std::uint64_t retries = 0;
  std::uint64_t cancelled_legs = 0;
  std::uint64_t wasted_bytes = 0;
  std::uint64_t probes = 0;
  std::uint64_t probes_failed = 0;
  std::uint64_t exclusions = 0;   // a leg soft-excluded after a failure
  std::uint64_t readmissions = 0; // a leg re-admitted after probes
};

class DualPath {
 public:
  // The engine must outlive it. Declares its counters in engine.metrics()
  // (baton_dualpath_*_total), so Harness::metrics_text() exports them.
  // invalid_argument for an invalid config.
  [[nodiscard]] static Result<std::unique_ptr<DualPath>> create(engine::Harness& engine, DualPathConfig config);
  // Over a real engine, on the wall clock: it waits on the engine's
  // batch_event_fd(), which it then owns (another reader would take its
  // wake-ups). Counters in engine.metrics(). The destructor cancels what
  // still runs and waits until none of it can land.
  [[nodiscard]] static Result<std::unique_ptr<DualPath>> create(engine::Engine& engine, DualPathConfig config);
  ~DualPath();
  DualPath(const DualPath&) = delete;
  DualPath& operator=(const DualPath&) = delete;

  // invalid_argument (zero bytes, a source equal to the destination, the two
  // sources equal, a negative timeout, an unknown qos class; over an Engine,
  // sources that do not cover the handoff exactly); not_found for an unknown
  // endpoint or, over an Engine, local region; out_of_range for a local
  // range outside that region; the engine's refusal of either leg (a leg that is down is not
  // refused: it fails over), at once. A region revoked after DualPath first
  // saw it is refused by the engine when its run starts: the handoff then
  // ends failed with that status. Legs start at the current instant,
  // when the caller next runs the clock.
  [[nodiscard]] Result<HandoffId> submit(const HandoffRequest& request);
  // Cancels every leg. not_found for an unknown id; invalid_argument once ended.
  [[nodiscard]] Status cancel(HandoffId id);
  [[nodiscard]] Result<HandoffStatus> status(HandoffId id) const;

  // Advance the harness's virtual clock to `t_ns`, reacting to every leg's end
  // at the instant it happens. out_of_range for a time in the past. Over an
  // Engine: react to runs until the engine's clock reaches `t_ns` (a time
  // already past handles what is due and returns).
  [[nodiscard]] Status run_until(TimeNs t_ns);
  // Until every handoff has ended (probes of a dead leg do not keep it
  // busy); timeout after `limit_ns` of virtual (or, over an Engine, real) time
  // (INT64_MAX: no limit; a negative one is invalid_argument).
  [[nodiscard]] Status run_until_idle(TimeNs limit_ns = 3'600'000'000'000);

  // Whether routing may use the leg from `from` to `to` (false while it is
  // soft-excluded and being probed). Unknown legs are healthy.
  [[nodiscard]] bool leg_healthy(const std::string& from, const std::string& to) const;
  [[nodiscard]] const DualPathStats& stats() const;
  [[nodiscard]] const DualPathConfig& config() const;

 private:
  struct State;
  explicit DualPath(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::dualpath
