// What the Engine (real memory) and the Harness (simulation) share: the
// topology, a transport, the scheduler and admission in front of it, the
// loop with its driver, and the metrics. Each facade owns one Core and
// exposes the calls that make sense for it. Private to engine/.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "baton/admission/admission.h"
#include "baton/engine/harness.h"
#include "baton/engine/metrics.h"
#include "baton/sched/scheduler.h"
#include "baton/topology/graph.h"
#include "baton/transport/cuda_transport.h"
#include "baton/transport/sim_transport.h"
#include "baton/transport/ucx_transport.h"
#include "engine/engine_loop.h"
#include "engine/vram_staging.h"

namespace baton::engine {

struct CoreConfig {
  ClockKind clock = ClockKind::kVirtual;
  bool real = false;  // UCX (needs the wall clock), else the simulated transport
  transport::UcxConfig ucx;
  std::string topology_model;
  std::string topology_file;
  sched::SchedPolicy policy;
  std::string policy_file;
  transport::SimConfig sim;
  // Not `real`: the CUDA transport over this runtime, instead of the
  // simulator, when set. `real`: the runtime VRAM regions are staged with
  // (null: cuda_runtime(), asked at the first VRAM registration).
  std::shared_ptr<transport::CudaRuntime> cuda;
  transport::CudaConfig cuda_config;
  // `real`: this host's GPU paths too, for requests between the engine's
  // own regions (EngineConfig::gpu_paths).
  bool gpu_paths = false;
};

// A caller waiting for the loop spins before it blocks: a block plus a
// wake-up costs tens of microseconds on a VM. The loop answers a call within
// microseconds; a batch takes longer, and a 4 MiB copy through shared memory
// (~90 us) blocked and woke its waiter for ~55 us more (docs/engine.md).
inline constexpr auto kCallerSpin = std::chrono::microseconds(30);
inline constexpr auto kBatchWaitSpin = std::chrono::microseconds(250);

// `yield`: between looks, give the core to another runnable thread (the
// loop, or a peer process, on a machine with fewer cores than busy threads).
template <typename F>
bool spin_until(F ready, std::chrono::microseconds spin = kCallerSpin, bool yield = false) {
  const auto until = std::chrono::steady_clock::now() + spin;
  do {
    if (ready()) return true;
    if (yield) std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

struct Core {
  // Loads the topology and the policy, builds the transport, scheduler,
  // admission and loop, and starts the wall-clock driver when asked.
  [[nodiscard]] static Result<std::unique_ptr<Core>> create(CoreConfig config);
  ~Core();

  // Runs `f` on the loop: posted and awaited under the wall clock (the loop
  // thread owns the state); directly, after the pending commands, otherwise.
  template <typename F>
  auto on_loop(F f) -> decltype(f()) {
    return on_loop_steps([f = std::move(f)]() mutable { return std::optional<decltype(f())>(f()); });
  }

  // Runs `step` on the loop, once a turn, until it returns a value (a
  // std::optional): work too long for one turn (a huge batch's admission)
  // leaves the loop's other work the turns in between.
  template <typename F>
  auto on_loop_steps(F step) -> typename decltype(step())::value_type {
    using Value = typename decltype(step())::value_type;
    if (!wall) {
      while (true) {
        if (loop->has_commands()) loop->tick(now_ns());
        if (auto value = step()) return std::move(*value);
        loop->tick(now_ns());
      }
    }
    // Not a promise: its set_value and a waiter's zero-timeout checks are
    // futex syscalls each, a third of a small request's round trip (perf).
    // The waiter spins on a plain atomic and sleeps on it only after that.
    struct Reply {
      std::optional<Value> value;
      std::atomic<int> ready{0};
    };
    struct Step {  // posts itself again until done
      std::shared_ptr<Reply> reply;
      F step;
      EngineLoop* loop;
      std::atomic<int>* in_steps;
      void operator()(admission::AdmissionController&, TimeNs) {
        if (auto value = step()) {
          reply->value.emplace(std::move(*value));
          in_steps->fetch_sub(1);
          reply->ready.store(1, std::memory_order_release);
          reply->ready.notify_one();
        } else {
          loop->post(*this);
        }
      }
    };
    auto reply = std::make_shared<Reply>();
    in_steps.fetch_add(1);
    loop->post(Step{reply, std::move(step), loop.get(), &in_steps});
    if (!spin_until([&] { return reply->ready.load(std::memory_order_acquire) != 0; })) {
      reply->ready.wait(0, std::memory_order_acquire);
    }
    return std::move(*reply->value);
  }

  [[nodiscard]] std::string metrics_text();
  [[nodiscard]] sched::SchedStats stats();
  [[nodiscard]] TimeNs now_ns() const;
  [[nodiscard]] std::uint64_t loop_turns() const;

  topology::TopologyGraph graph;
  std::unique_ptr<transport::Transport> transport;
  transport::SimTransport* sim = nullptr;  // the transport, when simulated
  transport::UcxTransport* ucx = nullptr;  // the transport, when real
  transport::CudaTransport* cuda = nullptr;  // the transport, when CUDA
  VramStaging* staging = nullptr;            // the transport over `ucx`, when real
  std::unique_ptr<sched::Scheduler> scheduler;
  std::unique_ptr<admission::AdmissionController> admission;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<VirtualClockDriver> driver;
  std::unique_ptr<WallClockDriver> wall;  // set when the loop runs on the wall clock
  // Calls of on_loop_steps not yet answered: the loop must not stop under
  // them (their callers would wait for good). Each ends in a few turns once
  // the engine shut down.
  std::atomic<int> in_steps{0};
  std::atomic<sched::RequestId> next_id{1};
  MetricsRegistry metrics;
  // What metrics_text() last exported, so counters grow by the difference.
  // Runs on the loop at the start of every metrics_text(): a facade adds
  // what it counted off the loop (the engine's loop-free batches).
  std::function<void()> before_metrics;
  admission::AdmissionStats exported_admission;
  sched::SchedStats exported_sched;
  struct UcxCounts {  // the transport's counters, as last added to the metrics
    std::uint64_t flushes = 0;
    std::uint64_t bundles = 0;
    std::uint64_t thread_copies = 0;
    std::uint64_t notifications_received = 0;
    std::uint64_t notifications_dropped = 0;
  };
  UcxCounts exported_ucx;
};

}  // namespace baton::engine
