// The simulation harness: the same loop, scheduler and admission as the
// Engine, driving TransferRequests between topology nodes over the simulated
// transport (lanes with bandwidth, latency, jitter and faults). For tests,
// simulations and the benchmarks' figures; a connector moving real memory
// uses the Engine (engine.h).
//
// Threads: under the virtual clock (the default) the loop runs when the
// caller advances it (run_until / run_until_idle), from one thread. Under
// ClockKind::kWall a loop thread runs the simulation in real time; every
// call then posts to it and waits (submit only posts), so any thread may call
// them, and run_until is refused. The accessors sim_transport, scheduler,
// admission, progress and next_event_ns read loop state directly: virtual
// clock, or before traffic, only.
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
#include "baton/transport/cuda_transport.h"
#include "baton/transport/sim_transport.h"

namespace baton::engine {

enum class ClockKind : std::uint8_t {
  kVirtual,  // the caller drives time (run_until): tests, simulation, benchmarks
  kWall,     // a loop thread runs against the steady clock and sleeps when idle
};

struct HarnessConfig {
  ClockKind clock = ClockKind::kVirtual;
  // Where the topology comes from: a saved `nvidia-smi topo -m` file (when
  // set it replaces the model; its errors come back from create()), else a
  // synthetic model name, else (both empty) this machine's probe.
  std::string topology_model = "nvswitch8";
  std::string topology_file;
  sched::SchedPolicy policy = sched::SchedPolicy::defaults();
  // A YAML policy file (configs/sched_policy.yaml); when set it replaces
  // `policy`. Its errors (with line numbers) come back from create().
  std::string policy_file;
  transport::SimConfig sim;
  // Real copies instead of the simulator: the CUDA transport over this
  // runtime (cuda_runtime()), on the topology's GPUs and host memory (leave
  // topology_model empty for this machine's probe). Requests then name
  // memory registered with cuda_transport() before traffic.
  std::shared_ptr<transport::CudaRuntime> cuda;
  transport::CudaConfig cuda_config;
};

class Harness {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Harness>> create(HarnessConfig config);
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // Validates and queues; the loop picks the request up at its next tick.
  // invalid_argument (zero bytes, same endpoints, a negative timeout) or
  // not_found (unknown endpoint) at once, never later.
  [[nodiscard]] Result<sched::RequestId> submit(const sched::TransferRequest& request);
  // All or nothing: one bad request refuses the whole batch.
  [[nodiscard]] Result<std::vector<sched::RequestId>> submit(std::span<const sched::TransferRequest> batch);
  // not_found for an id never handed out; the loop answers invalid_argument
  // for a request that already ended or is stopping (see status()).
  [[nodiscard]] Status cancel(sched::RequestId id);
  // Until the request ends (ok) or `timeout_ns` passes (timeout): virtual
  // time under the virtual clock (it runs the loop), real time under the
  // wall clock. not_found for an unknown id.
  [[nodiscard]] Status wait(sched::RequestId id, TimeNs timeout_ns);
  [[nodiscard]] Result<sched::RequestStatus> status(sched::RequestId id);
  // Which byte ranges of a request landed and which are still posted
  // (Scheduler::progress); empty while admission still holds it. For a layer
  // that moves the missing rest of a transfer elsewhere (dualpath).
  [[nodiscard]] Result<sched::RequestProgress> progress(sched::RequestId id);
  // The scheduler's counters (a copy, taken on the loop).
  [[nodiscard]] sched::SchedStats stats();
  // Prometheus text of admission's and the scheduler's counters.
  [[nodiscard]] std::string metrics_text();

  // Virtual clock: advance to `t_ns`, running everything due on the way.
  // out_of_range when `t_ns` is in the past.
  [[nodiscard]] Status run_until(TimeNs t_ns);
  // Until nothing is queued, posted or scheduled; timeout if that takes
  // longer than `limit_ns` of virtual time (a stuck workload, not a hang).
  [[nodiscard]] Status run_until_idle(TimeNs limit_ns = 3'600'000'000'000);
  [[nodiscard]] TimeNs now_ns() const;
  // Wall clock: how many times the loop thread has turned; 0 otherwise.
  [[nodiscard]] std::uint64_t loop_turns() const;
  // The next instant the loop has work without new input (now when commands
  // wait); nullopt when idle. Lets a layer on top (dualpath) interleave its
  // own timers with the harness's events, one instant at a time.
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const;

  [[nodiscard]] const topology::TopologyGraph& topology() const;
  // The simulated transport; only when HarnessConfig::cuda is unset.
  [[nodiscard]] transport::SimTransport& sim_transport();
  // The CUDA transport when HarnessConfig::cuda is set, else null.
  [[nodiscard]] transport::CudaTransport* cuda_transport();
  [[nodiscard]] const sched::Scheduler& scheduler() const;
  // Register the local-recompute callback and a codec here. Callbacks run
  // on the loop: they must not call back into the harness and wait.
  [[nodiscard]] admission::AdmissionController& admission();
  // The registry metrics_text() exports, for layers on top (dualpath).
  [[nodiscard]] MetricsRegistry& metrics();

 private:
  struct State;
  explicit Harness(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::engine
