#include "baton/engine/harness.h"

#include <thread>

#include <fmt/format.h>

#include "engine/core.h"

namespace baton::engine {

struct Harness::State {
  std::unique_ptr<Core> core;
};

Harness::Harness(std::unique_ptr<State> state) : state_(std::move(state)) {}
Harness::~Harness() = default;

Result<std::unique_ptr<Harness>> Harness::create(HarnessConfig config) {
  auto core = Core::create({config.clock, false, {}, std::move(config.topology_model), std::move(config.topology_file),
                            std::move(config.policy), std::move(config.policy_file), std::move(config.sim),
                            std::move(config.cuda), config.cuda_config});
  if (!core) return std::unexpected(core.error());
  if ((*core)->wall) {
    if (Status s = (*core)->wall->start(); !s.is_ok()) return std::unexpected(s);
  }
  auto state = std::make_unique<State>();
  state->core = std::move(*core);
  return std::unique_ptr<Harness>(new Harness(std::move(state)));
}

Result<sched::RequestId> Harness::submit(const sched::TransferRequest& request) {
  auto ids = submit(std::span(&request, 1));
  if (!ids) return std::unexpected(ids.error());
  return ids->front();
}

namespace {
constexpr std::uint64_t kMaxSimulatedBytes = std::uint64_t{1} << 40;
}  // namespace

Result<std::vector<sched::RequestId>> Harness::submit(std::span<const sched::TransferRequest> batch) {
  Core& c = *state_->core;
  if (batch.empty()) return std::unexpected(Status::invalid_argument("submit: the batch is empty"));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const sched::TransferRequest& r = batch[i];
    if (r.bytes == 0) {
      return std::unexpected(
          Status::invalid_argument("submit: request {} of the batch ({} -> {}) has 0 bytes", i, r.from, r.to));
    }
    // The simulator's clock is in nanoseconds: a PiB request's transfer time
    // overflowed it into negative latencies and impossible rates (admission
    // refuses above 2^48 bytes, later, where a bench saw a request vanish).
    if (r.bytes > kMaxSimulatedBytes) {
      return std::unexpected(Status::invalid_argument(
          "submit: request {} of the batch has {} bytes (the simulator takes at most 1 TiB a request)", i, r.bytes));
    }
    if (r.timeout_ns < 0) {
      return std::unexpected(Status::invalid_argument(
          "submit: request {} of the batch has timeout {} ns (expected > 0, or 0 for the policy's)", i, r.timeout_ns));
    }
    if (static_cast<int>(r.qos) >= sched::kQosClassCount) {  // the scheduler indexes its class table with it
      return std::unexpected(Status::invalid_argument("submit: request {} of the batch has qos class {} (expected 0..{})",
                                                      i, static_cast<int>(r.qos), sched::kQosClassCount - 1));
    }
    if (r.op != transport::Op::kRead && r.op != transport::Op::kWrite) {
      return std::unexpected(
          Status::invalid_argument("submit: request {} of the batch has op {}", i, static_cast<int>(r.op)));
    }
    // rank() refuses unknown endpoints, a node to itself and NIC to NIC.
    if (auto route = c.graph.rank(r.from, r.to); !route) {
      return std::unexpected(
          Status(route.error().code(), fmt::format("submit: request {} of the batch: {}", i, route.error().message())));
    }
  }
  std::vector<sched::RequestId> ids;
  for (const sched::TransferRequest& r : batch) {
    const sched::RequestId id = c.next_id.fetch_add(1);
    ids.push_back(id);
    c.loop->post([id, r](admission::AdmissionController& a, TimeNs now_ns) {
      // Validated above against the same topology; a refusal here is a bug
      // that status() reports as not_found rather than a lost request.
      (void)a.submit(id, r, now_ns);
    });
  }
  return ids;
}

Status Harness::cancel(sched::RequestId id) {
  Core& c = *state_->core;
  if (id == 0 || id >= c.next_id.load()) return Status::not_found("cancel: no request {}", id);
  return c.on_loop([&c, id] { return c.admission->cancel(id, c.now_ns()); });
}

Result<sched::RequestStatus> Harness::status(sched::RequestId id) {
  Core& c = *state_->core;
  return c.on_loop([&c, id] { return c.admission->status(id); });
}

Status Harness::wait(sched::RequestId id, TimeNs timeout_ns) {
  Core& c = *state_->core;
  auto ended = [](const sched::RequestStatus& s) {
    return s.state != sched::RequestState::kQueued && s.state != sched::RequestState::kRunning &&
           s.state != sched::RequestState::kCancelling;
  };
  const TimeNs end = time_after(now_ns(), timeout_ns);
  if (!c.wall) {
    // Virtual time: run the loop until the request ends or the timeout passes.
    while (true) {
      auto s = status(id);
      if (!s) return s.error();
      if (ended(*s)) return Status::ok();
      const auto next = c.loop->next_event_ns();
      if (!next || *next > end) break;
      if (Status r = run_until(*next); !r.is_ok()) return r;
    }
    if (Status r = run_until(std::max(end, now_ns())); !r.is_ok()) return r;
    auto s = status(id);
    if (!s) return s.error();
    return ended(*s) ? Status::ok() : Status::timeout("wait: request {} still running after {} ns", id, timeout_ns);
  }
  // Wall time: ask the loop, then sleep a little; the loop does the work.
  for (TimeNs pause = 10'000;; pause = std::min<TimeNs>(pause * 2, 1'000'000)) {
    auto s = status(id);
    if (!s) return s.error();
    if (ended(*s)) return Status::ok();
    if (now_ns() >= end) return Status::timeout("wait: request {} still running after {} ns", id, timeout_ns);
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(pause, end - now_ns())));
  }
}

Result<sched::RequestProgress> Harness::progress(sched::RequestId id) {
  Core& c = *state_->core;
  if (c.loop->has_commands()) c.loop->tick(now_ns());
  auto p = c.scheduler->progress(id);
  if (!p && c.admission->status(id)) return sched::RequestProgress{};  // still waiting in admission
  return p;
}

sched::SchedStats Harness::stats() { return state_->core->stats(); }
std::string Harness::metrics_text() { return state_->core->metrics_text(); }

Status Harness::run_until(TimeNs t_ns) {
  Core& c = *state_->core;
  if (c.wall) return Status::invalid_argument("run_until: a wall-clock harness runs by itself; use wait()");
  return c.driver->run_until(t_ns);
}

Status Harness::run_until_idle(TimeNs limit_ns) {
  Core& c = *state_->core;
  if (c.wall) return Status::invalid_argument("run_until_idle: a wall-clock harness runs by itself; use wait()");
  return c.driver->run_until_idle(
      limit_ns, [&c] { return c.scheduler->queued_requests() == 0 && c.admission->waiting() == 0; });
}

TimeNs Harness::now_ns() const { return state_->core->now_ns(); }
std::uint64_t Harness::loop_turns() const { return state_->core->loop_turns(); }
std::optional<TimeNs> Harness::next_event_ns() const {
  const Core& c = *state_->core;
  if (c.loop->has_commands()) return now_ns();
  return c.loop->next_event_ns();
}
const topology::TopologyGraph& Harness::topology() const { return state_->core->graph; }
transport::SimTransport& Harness::sim_transport() { return *state_->core->sim; }
transport::CudaTransport* Harness::cuda_transport() { return state_->core->cuda; }
const sched::Scheduler& Harness::scheduler() const { return *state_->core->scheduler; }
admission::AdmissionController& Harness::admission() { return *state_->core->admission; }
MetricsRegistry& Harness::metrics() { return state_->core->metrics; }

}  // namespace baton::engine
