#include "baton/engine/engine.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <spdlog/spdlog.h>

#include "baton/engine/metrics.h"
#include "baton/topology/probe.h"
#include "engine/datapath.h"
#include "engine/engine_loop.h"
#include "engine/metrics_server.h"

namespace baton::engine {

struct Engine::State {
  topology::TopologyGraph graph;
  std::unique_ptr<transport::Transport> transport;
  transport::SimTransport* sim = nullptr;  // the transport, when simulated
  transport::UcxTransport* ucx = nullptr;  // the transport, when real
  std::unique_ptr<sched::Scheduler> scheduler;
  std::unique_ptr<admission::AdmissionController> admission;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<VirtualClockDriver> driver;
  std::unique_ptr<WallClockDriver> wall;  // set when the engine runs on the wall clock
  std::unique_ptr<Datapath> datapath;     // set with the UCX transport
  std::unique_ptr<MetricsServer> http;    // set when metrics_address is configured
  std::atomic<bool> closed{false};        // shutdown() was called
  std::atomic<sched::RequestId> next_id{1};
  MetricsRegistry metrics;
  // What metrics_text() last exported, so counters grow by the difference.
  admission::AdmissionStats exported_admission;
  sched::SchedStats exported_sched;
};

namespace {

// Permille buckets: 0.1 … 1.0 in tenths, then the infeasible range.
const std::vector<double> kMluPermilleBuckets{100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1500, 2000, 5000, 10000};

void declare_metrics(MetricsRegistry& m) {
  (void)m.declare_histogram("baton_admission_mlu_permille", "Feasibility ratio (MLU x 1000) at submit, per op",
                            kMluPermilleBuckets);
  (void)m.declare_counter("baton_admission_admitted_total", "Requests handed to the scheduler");
  (void)m.declare_counter("baton_admission_compressed_total", "Requests switched to compressed slices");
  (void)m.declare_counter("baton_admission_dropped_total", "Waiting requests dropped as infeasible");
  (void)m.declare_counter("baton_admission_infeasible_total", "Requests ended deadline_infeasible");
  (void)m.declare_counter("baton_admission_signalled_total", "Local-recompute signals fired");
  (void)m.declare_counter("baton_sched_slices_posted_total", "Slices posted on a transport");
  (void)m.declare_counter("baton_sched_slices_completed_total", "Slices delivered");
  (void)m.declare_counter("baton_sched_slices_spilled_total", "Slices sent on a fallback path to meet a deadline");
  (void)m.declare_counter("baton_sched_slices_preempted_total", "Slices cancelled for a more critical one");
  (void)m.declare_counter("baton_sched_slices_retried_total", "Slices that failed on the wire and were re-queued");
  (void)m.declare_counter("baton_sched_bytes_wasted_total", "Bytes sent and then thrown away (preemption, cancel)");
  (void)m.declare_counter("baton_sched_bytes_completed_total", "Payload bytes of slices delivered");
  (void)m.declare_counter("baton_sched_wire_bytes_completed_total",
                          "Bytes that carried them over the wire (fewer when compressed)");
  (void)m.declare_counter("baton_sched_starvation_promotions_total", "Slices served first by the starvation bound");
}

}  // namespace

// A caller waiting for the loop spins before it blocks: a block plus a
// wake-up costs tens of microseconds on a VM. The loop answers a call within
// microseconds; a batch takes longer, and a 4 MiB copy through shared memory
// (~90 us) blocked and woke its waiter for ~55 us more (docs/engine.md).
constexpr auto kCallerSpin = std::chrono::microseconds(30);
constexpr auto kBatchWaitSpin = std::chrono::microseconds(250);

template <typename F>
bool spin_until(F ready, std::chrono::microseconds spin = kCallerSpin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  do {
    if (ready()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

Engine::Engine(std::unique_ptr<State> state) : state_(std::move(state)) {}

EngineConfig wall_ucx_config(transport::UcxConfig ucx) {
  EngineConfig c;
  c.clock = ClockKind::kWall;
  c.transport = TransportKind::kUcx;
  c.ucx = std::move(ucx);
  return c;
}

Engine::~Engine() {
  shutdown();
  if (state_->wall) state_->wall->stop();  // the loop thread goes before what it uses
}

// Runs `f` on the loop: posted and awaited under the wall clock (the loop
// thread owns the state); directly, after the pending commands, otherwise.
template <typename F>
auto Engine::on_loop(F f) -> decltype(f()) {
  if (!state_->wall) {
    if (state_->loop->has_commands()) state_->loop->tick(now_ns());
    return f();
  }
  auto done = std::make_shared<std::promise<decltype(f())>>();
  auto result = done->get_future();
  state_->loop->post([done, f = std::move(f)](admission::AdmissionController&, TimeNs) { done->set_value(f()); });
  (void)spin_until([&] { return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  return result.get();
}

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config) {
  auto facts = !config.topology_model.empty() ? topology::load_model(config.topology_model)
               : !config.topology_file.empty() ? topology::load_nvidia_smi_topo(config.topology_file)
                                               : topology::probe_machine();
  if (!facts) return std::unexpected(facts.error());
  auto graph = topology::TopologyGraph::build(*facts);
  if (!graph) return std::unexpected(graph.error());
  if (!config.policy_file.empty()) {
    auto loaded = sched::load_policy(config.policy_file);
    if (!loaded) return std::unexpected(loaded.error());
    config.policy = std::move(*loaded);
  }
  if (Status s = config.policy.validate(); !s.is_ok()) return std::unexpected(s);
  if (config.transport == TransportKind::kUcx && config.clock != ClockKind::kWall) {
    return std::unexpected(Status::invalid_argument(
        "Engine::create: the UCX transport moves real bytes in real time; it needs ClockKind::kWall"));
  }

  auto state = std::make_unique<State>();
  state->graph = std::move(*graph);
  const sched::SchedPolicy& policy = config.policy;
  if (config.transport == TransportKind::kUcx) {
    auto ucx = transport::UcxTransport::create(config.ucx);
    if (!ucx) return std::unexpected(ucx.error());
    state->ucx = ucx->get();
    state->transport = std::move(*ucx);
  } else {
    auto sim = transport::SimTransport::from_topology(
        state->graph, [&policy](topology::PathType p) { return policy.credits_for(p).lanes; }, config.sim);
    if (!sim) return std::unexpected(sim.error());
    state->sim = sim->get();
    state->transport = std::move(*sim);
  }
  auto scheduler = sched::Scheduler::create(state->graph, policy, *state->transport);
  if (!scheduler) return std::unexpected(scheduler.error());
  state->scheduler = std::move(*scheduler);
  auto admission = admission::AdmissionController::create(policy, *state->scheduler, *state->transport);
  if (!admission) return std::unexpected(admission.error());
  state->admission = std::move(*admission);
  state->scheduler->set_finish_hook([a = state->admission.get()](sched::RequestId id) { a->on_finish(id); });
  state->loop = std::make_unique<EngineLoop>(*state->scheduler, *state->admission, *state->transport);
  declare_metrics(state->metrics);
  if (state->ucx != nullptr) {
    state->datapath = std::make_unique<Datapath>(*state->ucx, *state->scheduler, *state->admission, state->metrics,
                                                 state->next_id);
    state->admission->set_end_hook([d = state->datapath.get()](sched::RequestId id) { d->on_finish(id); });
    state->loop->set_on_turn([d = state->datapath.get()](TimeNs now_ns) { d->on_turn(now_ns); });
  }
  state->admission->set_mlu_observer([m = &state->metrics](double mlu, transport::Op op) {
    m->observe("baton_admission_mlu_permille", {{"op", op == transport::Op::kRead ? "read" : "write"}}, mlu * 1000.0);
  });
  state->driver = std::make_unique<VirtualClockDriver>(*state->loop);
  if (config.clock == ClockKind::kWall) {
    state->wall = std::make_unique<WallClockDriver>(*state->loop, *state->transport);
    if (Status s = state->wall->start(); !s.is_ok()) return std::unexpected(s);
  }
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(state)));
  if (!config.metrics_address.empty()) {
    if (config.clock != ClockKind::kWall) {
      return std::unexpected(Status::invalid_argument(
          "Engine::create: metrics_address needs ClockKind::kWall (a scrape must not drive virtual time)"));
    }
    auto http = MetricsServer::start(config.metrics_address, [e = engine.get()] { return e->metrics_text(); });
    if (!http) return std::unexpected(http.error());
    engine->state_->http = std::move(*http);
  }
  return engine;
}

Result<sched::RequestId> Engine::submit(const sched::TransferRequest& request) {
  auto ids = submit(std::span(&request, 1));
  if (!ids) return std::unexpected(ids.error());
  return ids->front();
}

Result<std::vector<sched::RequestId>> Engine::submit(std::span<const sched::TransferRequest> batch) {
  if (batch.empty()) return std::unexpected(Status::invalid_argument("submit: the batch is empty"));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const sched::TransferRequest& r = batch[i];
    if (r.bytes == 0) {
      return std::unexpected(
          Status::invalid_argument("submit: request {} of the batch ({} -> {}) has 0 bytes", i, r.from, r.to));
    }
    if (r.timeout_ns < 0) {
      return std::unexpected(Status::invalid_argument(
          "submit: request {} of the batch has timeout {} ns (expected > 0, or 0 for the policy's)", i, r.timeout_ns));
    }
    // rank() refuses unknown endpoints, a node to itself and NIC to NIC.
    if (auto route = state_->graph.rank(r.from, r.to); !route) {
      return std::unexpected(
          Status(route.error().code(), fmt::format("submit: request {} of the batch: {}", i, route.error().message())));
    }
  }
  std::vector<sched::RequestId> ids;
  for (const sched::TransferRequest& r : batch) {
    const sched::RequestId id = state_->next_id.fetch_add(1);
    ids.push_back(id);
    state_->loop->post([id, r](admission::AdmissionController& a, TimeNs now_ns) {
      // Validated above against the same topology; a refusal here is a bug
      // that status() reports as not_found rather than a lost request.
      (void)a.submit(id, r, now_ns);
    });
  }
  return ids;
}

Status Engine::cancel(sched::RequestId id) {
  if (id == 0 || id >= state_->next_id.load()) return Status::not_found("cancel: no request {}", id);
  return on_loop([this, id] { return state_->admission->cancel(id, now_ns()); });
}

Result<sched::RequestStatus> Engine::status(sched::RequestId id) {
  return on_loop([this, id] { return state_->admission->status(id); });
}

Status Engine::wait(sched::RequestId id, TimeNs timeout_ns) {
  auto ended = [](const sched::RequestStatus& s) {
    return s.state != sched::RequestState::kQueued && s.state != sched::RequestState::kRunning;
  };
  if (!state_->wall) {
    // Virtual time: run the loop until the request ends or the timeout passes.
    const TimeNs end = now_ns() + timeout_ns;
    while (true) {
      auto s = status(id);
      if (!s) return s.error();
      if (ended(*s)) return Status::ok();
      const auto next = state_->loop->next_event_ns();
      if (!next || *next > end) break;
      if (Status r = run_until(*next); !r.is_ok()) return r;
    }
    if (Status r = run_until(std::max(end, now_ns())); !r.is_ok()) return r;
    auto s = status(id);
    if (!s) return s.error();
    return ended(*s) ? Status::ok() : Status::timeout("wait: request {} still running after {} ns", id, timeout_ns);
  }
  // Wall time: ask the loop, then sleep a little; the loop does the work.
  const TimeNs end = now_ns() + timeout_ns;
  for (TimeNs pause = 10'000;; pause = std::min<TimeNs>(pause * 2, 1'000'000)) {
    auto s = status(id);
    if (!s) return s.error();
    if (ended(*s)) return Status::ok();
    if (now_ns() >= end) return Status::timeout("wait: request {} still running after {} ns", id, timeout_ns);
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(pause, end - now_ns())));
  }
}

Result<sched::RequestProgress> Engine::progress(sched::RequestId id) {
  if (state_->loop->has_commands()) state_->loop->tick(now_ns());
  auto p = state_->scheduler->progress(id);
  if (!p && state_->admission->status(id)) return sched::RequestProgress{};  // still waiting in admission
  return p;
}

sched::SchedStats Engine::stats() {
  return on_loop([this] { return state_->scheduler->stats(); });
}

std::string Engine::metrics_text() {
  return on_loop([this] {
    State& st = *state_;
    MetricsRegistry& m = st.metrics;
    const admission::AdmissionStats& a = st.admission->stats();
    admission::AdmissionStats& ea = st.exported_admission;
    m.add("baton_admission_admitted_total", {}, a.admitted - ea.admitted);
    m.add("baton_admission_compressed_total", {}, a.compressed - ea.compressed);
    m.add("baton_admission_dropped_total", {}, a.dropped - ea.dropped);
    m.add("baton_admission_infeasible_total", {}, a.infeasible - ea.infeasible);
    m.add("baton_admission_signalled_total", {}, a.signalled - ea.signalled);
    ea = a;
    const sched::SchedStats& s = st.scheduler->stats();
    sched::SchedStats& es = st.exported_sched;
    m.add("baton_sched_slices_posted_total", {}, s.slices_posted - es.slices_posted);
    m.add("baton_sched_slices_completed_total", {}, s.slices_completed - es.slices_completed);
    m.add("baton_sched_slices_spilled_total", {}, s.slices_spilled - es.slices_spilled);
    m.add("baton_sched_slices_preempted_total", {}, s.slices_preempted - es.slices_preempted);
    m.add("baton_sched_slices_retried_total", {}, s.slices_retried - es.slices_retried);
    m.add("baton_sched_bytes_wasted_total", {}, s.bytes_wasted - es.bytes_wasted);
    m.add("baton_sched_bytes_completed_total", {}, s.bytes_completed - es.bytes_completed);
    m.add("baton_sched_wire_bytes_completed_total", {}, s.wire_bytes_completed - es.wire_bytes_completed);
    m.add("baton_sched_starvation_promotions_total", {}, s.starvation_promotions - es.starvation_promotions);
    es = s;
    return m.text();
  });
}

// --- Real memory and peers ------------------------------------------------------

namespace {

Status no_datapath(std::string_view call) {
  return Status::failed_precondition(
      "{}: this engine simulates its transport (EngineConfig::transport = kSim); real memory needs kUcx", call);
}

}  // namespace

#define BATON_REQUIRE_DATAPATH(call)                                                           \
  do {                                                                                         \
    if (!state_->datapath) return std::unexpected(no_datapath(call));                          \
    if (state_->closed) return std::unexpected(Status::unavailable("{}: the engine shut down", call)); \
  } while (false)

std::string Engine::address() const { return state_->ucx != nullptr ? state_->ucx->address() : std::string{}; }
std::string Engine::metrics_address() const { return state_->http ? state_->http->address() : std::string{}; }

Result<Region> Engine::register_memory(void* ptr, std::size_t length, MemoryKind kind, int device) {
  BATON_REQUIRE_DATAPATH("register_memory");
  return on_loop([&] { return state_->datapath->register_memory(ptr, length, kind, device); });
}

Result<Region> Engine::allocate_memory(std::size_t length, int numa_node) {
  BATON_REQUIRE_DATAPATH("allocate_memory");
  return on_loop([&] { return state_->datapath->allocate_memory(length, numa_node); });
}

Status Engine::unregister(RegionHandle region) {
  if (!state_->datapath) return no_datapath("unregister");
  return on_loop([&] { return state_->datapath->unregister(region); });
}

Result<Peer> Engine::connect(std::string_view address) {
  BATON_REQUIRE_DATAPATH("connect");
  auto done = std::make_shared<std::promise<Result<Peer>>>();
  auto result = done->get_future();
  state_->loop->post([this, done, address = std::string(address)](admission::AdmissionController&, TimeNs now_ns) {
    state_->datapath->connect(address, now_ns, [done](Result<Peer> peer) { done->set_value(std::move(peer)); });
  });
  return result.get();  // bounded: the handshake times out on the loop
}

Status Engine::refresh(const Peer& peer, TimeNs timeout_ns) {
  if (!state_->datapath) return no_datapath("refresh");
  if (state_->closed) return Status::unavailable("refresh: the engine shut down");
  auto done = std::make_shared<std::promise<Status>>();
  auto result = done->get_future();
  state_->loop->post([this, done, peer](admission::AdmissionController&, TimeNs) {
    state_->datapath->refresh(peer, [done](Status s) { done->set_value(std::move(s)); });
  });
  if (result.wait_for(std::chrono::nanoseconds(timeout_ns)) != std::future_status::ready) {
    return Status::timeout("refresh: peer {} did not answer within {} ns", peer.address, timeout_ns);
  }
  return result.get();
}

Result<std::vector<transport::RemoteRegion>> Engine::remote_regions(const Peer& peer) {
  BATON_REQUIRE_DATAPATH("remote_regions");
  return on_loop([&] { return state_->datapath->remote_regions(peer); });
}

Result<BatchHandle> Engine::submit(const Batch& batch) {
  BATON_REQUIRE_DATAPATH("submit");
  return on_loop([&] { return state_->datapath->submit(batch, now_ns()); });
}

Result<BatchStatus> Engine::poll(BatchHandle batch) {
  if (!state_->datapath) return std::unexpected(no_datapath("poll"));
  if (auto ended = state_->datapath->ended_status(batch.id)) return std::move(*ended);
  return on_loop([&] { return state_->datapath->poll(batch); });
}

Status Engine::wait(BatchHandle batch, TimeNs timeout_ns) {
  if (!state_->datapath) return no_datapath("wait");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  auto ended_now = [&] { return state_->datapath->wait_ended(batch.id, {}); };
  if (spin_until(ended_now, std::min(kBatchWaitSpin, std::chrono::duration_cast<std::chrono::microseconds>(
                                                           std::chrono::nanoseconds(timeout_ns))))) {
    return Status::ok();
  }
  if (!state_->datapath->known(batch.id)) return Status::not_found("wait: no batch {}", batch.id);
  if (state_->datapath->wait_ended(batch.id, deadline)) return Status::ok();
  return Status::timeout("wait: batch {} still running after {} ns", batch.id, timeout_ns);
}

Status Engine::cancel(BatchHandle batch) {
  if (!state_->datapath) return no_datapath("cancel");
  return on_loop([&] { return state_->datapath->cancel(batch, now_ns()); });
}

Status Engine::release(BatchHandle batch) {
  if (!state_->datapath) return no_datapath("release");
  if (state_->datapath->take_ended_if_clean(batch.id)) {
    // Ended with nothing on the wire: the loop cannot refuse, so it need
    // not be waited for. Later calls on the handle queue behind this one.
    state_->loop->post([this, batch](admission::AdmissionController&, TimeNs) {
      (void)state_->datapath->release(batch);
    });
    return Status::ok();
  }
  return on_loop([&] { return state_->datapath->release(batch); });
}

std::vector<transport::Notification> Engine::take_notifications() {
  if (!state_->datapath) return {};
  return on_loop([this] { return state_->ucx->take_notifications(); });
}

void Engine::shutdown() {
  if (state_->closed.exchange(true)) return;
  state_->http.reset();  // no more scrapes; each posts to the loop
  if (!state_->datapath) return;
  on_loop([this] {
    state_->datapath->shutdown(now_ns());
    return 0;
  });
  // Endpoint closes finish on the loop; a forced close needs no peer, a
  // flushing one may wait on a silent peer, so the wait is bounded.
  for (int i = 0; i < 400; ++i) {
    if (on_loop([this] { return state_->ucx->shutdown_complete(); })) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  spdlog::warn("Engine::shutdown: endpoint closes did not finish within 2 s");
}

#undef BATON_REQUIRE_DATAPATH

Status Engine::run_until(TimeNs t_ns) {
  if (state_->wall) return Status::invalid_argument("run_until: a wall-clock engine runs by itself; use wait()");
  return state_->driver->run_until(t_ns);
}

Status Engine::run_until_idle(TimeNs limit_ns) {
  if (state_->wall) return Status::invalid_argument("run_until_idle: a wall-clock engine runs by itself; use wait()");
  return state_->driver->run_until_idle(
      limit_ns, [this] { return state_->scheduler->queued_requests() == 0 && state_->admission->waiting() == 0; });
}

TimeNs Engine::now_ns() const {
  return state_->wall ? state_->wall->now_ns() : state_->driver->clock().now_ns();
}
std::uint64_t Engine::loop_turns() const { return state_->wall ? state_->wall->turns() : 0; }
std::optional<TimeNs> Engine::next_event_ns() const {
  if (state_->loop->has_commands()) return now_ns();
  return state_->loop->next_event_ns();
}
MetricsRegistry& Engine::metrics() { return state_->metrics; }
const topology::TopologyGraph& Engine::topology() const { return state_->graph; }
transport::SimTransport& Engine::sim_transport() {
  if (state_->sim == nullptr) {
    spdlog::critical("Engine::sim_transport() on an engine with a real transport");
    std::abort();
  }
  return *state_->sim;
}
const sched::Scheduler& Engine::scheduler() const { return *state_->scheduler; }
admission::AdmissionController& Engine::admission() { return *state_->admission; }

}  // namespace baton::engine
