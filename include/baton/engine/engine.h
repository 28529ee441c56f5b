// The Engine facade: what an inference server holds. It owns the topology,
// the transport, the scheduler and the loop that drives them. Today the loop
// runs under the VirtualClockDriver with the simulated transport (tests,
// simulation, benchmarks); the wall-clock driver and real transports plug
// into the same loop.
//
// Threads: submit posts commands to the loop and returns at once. Under the
// wall clock (EngineConfig::clock) a loop thread owns the state, and cancel,
// status, wait and metrics_text post to it and wait for the answer, so any
// thread may call them. Under the virtual clock the loop runs when the
// caller advances it (run_until / run_until_idle), from one thread. The
// accessors below metrics_text (stats, sim_transport, scheduler, admission,
// progress, next_event_ns) read loop state directly: virtual clock, or before
// traffic, only.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/admission/admission.h"
#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/metrics.h"
#include "baton/sched/policy.h"
#include "baton/sched/scheduler.h"
#include "baton/topology/graph.h"
#include "baton/transport/sim_transport.h"

namespace baton::engine {

enum class ClockKind : std::uint8_t {
  kVirtual,  // the caller drives time (run_until): tests, simulation, benchmarks
  kWall,     // a loop thread runs against the steady clock and sleeps when idle
};

struct EngineConfig {
  ClockKind clock = ClockKind::kVirtual;
  // Where the topology comes from: a synthetic model name, else a saved
  // `nvidia-smi topo -m` file, else this machine's probe.
  std::string topology_model = "nvswitch8";
  std::string topology_file;
  sched::SchedPolicy policy = sched::SchedPolicy::defaults();
  transport::SimConfig sim;
};

class Engine {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Engine>> create(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; the loop picks the request up at its next tick.
  // invalid_argument (zero bytes, same endpoints) or not_found (unknown
  // endpoint) at once, never later.
  [[nodiscard]] Result<sched::RequestId> submit(const sched::TransferRequest& request);
  // All or nothing: one bad request refuses the whole batch.
  [[nodiscard]] Result<std::vector<sched::RequestId>> submit(std::span<const sched::TransferRequest> batch);
  // not_found for an id never handed out; the loop answers invalid_argument
  // for a request that already ended (see status()).
  [[nodiscard]] Status cancel(sched::RequestId id);

  // Until the request ends (ok) or `timeout_ns` passes (timeout): virtual
  // time under the virtual clock (it runs the loop), real time under the
  // wall clock. not_found for an unknown id.
  [[nodiscard]] Status wait(sched::RequestId id, TimeNs timeout_ns);

  // Prometheus text of the engine's metrics: admission (MLU histogram per
  // op, admitted / compressed / dropped / infeasible / signalled) and the
  // scheduler's counters. Call from the driving thread.
  [[nodiscard]] std::string metrics_text();

  [[nodiscard]] Result<sched::RequestStatus> status(sched::RequestId id);
  // Which byte ranges of a request landed and which are still posted
  // (Scheduler::progress); empty while admission still holds it. For a layer
  // that moves the missing rest of a transfer elsewhere (dualpath).
  [[nodiscard]] Result<sched::RequestProgress> progress(sched::RequestId id);
  [[nodiscard]] const sched::SchedStats& stats() const;

  // Virtual clock: advance to `t_ns`, running everything due on the way.
  // out_of_range when `t_ns` is in the past.
  [[nodiscard]] Status run_until(TimeNs t_ns);
  // Until nothing is queued, posted or scheduled; timeout if that takes
  // longer than `limit_ns` of virtual time (a stuck workload, not a hang).
  [[nodiscard]] Status run_until_idle(TimeNs limit_ns = 3'600'000'000'000);
  [[nodiscard]] TimeNs now_ns() const;
  // Wall clock: how many times the loop thread has turned (a measure of
  // idle spinning); 0 under the virtual clock.
  [[nodiscard]] std::uint64_t loop_turns() const;
  // The next instant the loop has work without new input (now when commands
  // wait); nullopt when idle. Lets a layer on top (dualpath) interleave its
  // own timers with the engine's events, one instant at a time.
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const;

  [[nodiscard]] const topology::TopologyGraph& topology() const;
  [[nodiscard]] transport::SimTransport& sim_transport();
  [[nodiscard]] const sched::Scheduler& scheduler() const;
  // Admission: register the local-recompute callback and a codec here.
  // Callbacks run on the loop: they must not call back into the Engine and
  // wait (under the wall clock that would wait on the loop itself).
  [[nodiscard]] admission::AdmissionController& admission();
  // The registry metrics_text() exports, for layers on top that add their
  // own counters (dualpath).
  [[nodiscard]] MetricsRegistry& metrics();

 private:
  struct State;
  explicit Engine(std::unique_ptr<State> state);
  template <typename F>
  auto on_loop(F f) -> decltype(f());
  std::unique_ptr<State> state_;
};

}  // namespace baton::engine
