#include "baton/engine/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "baton/common/log.h"
#include "baton/common/units.h"
#include "engine/core.h"
#include "engine/datapath.h"
#include "engine/metrics_server.h"

namespace baton::engine {

namespace {

// fork() copies an engine's memory into the child but none of its threads:
// there a call would wait for a loop that does not exist, and the
// destructor would join threads that are not there. Each fork is counted
// (in the child) so an engine sees it came from an ancestor.
std::atomic<std::uint64_t> forks{0};

std::uint64_t fork_count() {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, [] { forks.fetch_add(1, std::memory_order_relaxed); }); });
  return forks.load(std::memory_order_relaxed);
}

}  // namespace

struct Engine::State {
  std::uint64_t created_after_forks = fork_count();
  pid_t creator = getpid();
  std::unique_ptr<Core> core;
  std::unique_ptr<Datapath> datapath;
  std::unique_ptr<MetricsServer> http;  // set when metrics_address is configured
  std::atomic<bool> closed{false};      // shutdown() was called
  std::int64_t revoke_timeout_ms = 0;
  std::uint64_t direct_copy_max_bytes = 0;

  [[nodiscard]] bool forked() const { return forks.load(std::memory_order_relaxed) != created_after_forks; }
  // failed_precondition in a forked child, unavailable after shutdown().
  [[nodiscard]] Status usable(const char* call) const {
    if (forked()) {
      return Status::failed_precondition(
          "{}: the engine belongs to process {}, which created it before fork(); a child process creates its own "
          "engine",
          call, creator);
    }
    if (closed) return Status::unavailable("{}: the engine shut down", call);
    return Status::ok();
  }

  // Without the loop when the batch can go that way (Datapath::submit_direct).
  Result<BatchHandle> submit(const Batch& batch, transport::UcxTransport::ResolvedCopies* resolved) {
    if (direct_copy_max_bytes > 0) {
      if (auto direct = datapath->submit_direct(batch, core->now_ns(), direct_copy_max_bytes, resolved)) {
        return std::move(*direct);
      }
    }
    Datapath::Submission submission(batch);
    return core->on_loop_steps([&] { return datapath->submit_step(submission, core->now_ns()); });
  }
};

namespace {

// run()'s end: waits for the batch, takes its status and releases it.
Status finish_run(Engine& engine, Result<BatchHandle> submitted) {
  if (!submitted) return std::move(submitted.error());
  if (Status s = engine.wait(*submitted, kForeverNs); !s.is_ok()) return s;
  thread_local BatchStatus status;  // its storage reused, as poll(handle, out) allows
  Status polled = engine.poll(*submitted, status);
  if (Status s = engine.release(*submitted); !s.is_ok() && polled.is_ok()) polled = std::move(s);
  return polled.is_ok() ? status.status : polled;
}

}  // namespace

Engine::Engine(std::unique_ptr<State> state) : state_(std::move(state)) {}

Engine::~Engine() {
  if (state_->forked()) {
    (void)state_.release();  // its threads are the parent's: nothing here to stop, join or free safely
    return;
  }
  shutdown();
  // A thread still in wait() returns `unavailable` before the datapath it
  // reads goes: a batch still cancelling would never end once the loop stops.
  state_->datapath->close_waiters();
  // A call whose work spans loop turns (a huge batch's submit, poll or
  // cancel) gets its answer before the loop stops: after the shutdown each
  // ends within a few turns.
  const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (state_->core->in_steps.load() > 0 && std::chrono::steady_clock::now() < bound) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  state_->core->wall->stop();  // the loop thread goes before what it uses
}

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config) {
  const std::int64_t revoke_timeout_ms = config.ucx.revoke_timeout_ms;
  const std::uint64_t direct_copy_max_bytes = config.ucx.direct_copy_max_bytes;
  auto core = Core::create({ClockKind::kWall, true, std::move(config.ucx), std::move(config.topology_model),
                            std::move(config.topology_file), std::move(config.policy), std::move(config.policy_file),
                            {}, std::move(config.cuda), {}, config.gpu_paths});
  if (!core) return std::unexpected(core.error());
  auto state = std::make_unique<State>();
  state->core = std::move(*core);
  state->revoke_timeout_ms = revoke_timeout_ms;
  state->direct_copy_max_bytes = direct_copy_max_bytes;
  Core& c = *state->core;
  state->datapath =
      std::make_unique<Datapath>(*c.staging, *c.scheduler, *c.admission, c.metrics, c.next_id, *c.loop);
  state->datapath->set_clock([&c] { return c.now_ns(); });
  c.before_metrics = [d = state->datapath.get()] { d->before_scrape(); };  // direct batches count on submitting threads
  c.admission->set_end_hook([d = state->datapath.get()](sched::RequestId id) { d->on_finish(id); });
  c.loop->set_on_turn([d = state->datapath.get()](TimeNs now_ns) { return d->on_turn(now_ns); });
  if (Status s = c.wall->start(); !s.is_ok()) return std::unexpected(s);
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(state)));
  if (!config.metrics_address.empty()) {
    auto http = MetricsServer::start(config.metrics_address, [e = engine.get()] { return e->metrics_text(); });
    if (!http) return std::unexpected(http.error());
    engine->state_->http = std::move(*http);
  }
  return engine;
}

#define BATON_REQUIRE_OPEN(call)                                              \
  do {                                                                        \
    if (Status s = state_->usable(call); !s.is_ok()) return std::unexpected(s); \
  } while (false)

std::string Engine::address() const { return state_->core->ucx->address(); }
int Engine::batch_event_fd() const { return state_->datapath->ended_fd(); }

std::vector<std::pair<std::string, std::string>> Engine::ucx_settings() const {
  return state_->core->ucx->ucx_settings();  // fixed once created: no loop round trip
}

std::string Engine::metrics_address() const { return state_->http ? state_->http->address() : std::string{}; }

Result<Region> Engine::register_memory(void* ptr, std::size_t length, MemoryKind kind, int device) {
  BATON_REQUIRE_OPEN("register_memory");
  return state_->core->on_loop([&] { return state_->datapath->register_memory(ptr, length, kind, device); });
}

Result<Region> Engine::allocate_memory(std::size_t length, int numa_node) {
  BATON_REQUIRE_OPEN("allocate_memory");
  return state_->core->on_loop([&] { return state_->datapath->allocate_memory(length, numa_node); });
}

Status Engine::unregister(RegionHandle region) {
  if (Status s = state_->usable("unregister"); !s.is_ok()) return s;
  auto done = std::make_shared<std::promise<Status>>();
  auto revoked = done->get_future();
  const Status started = state_->core->on_loop([&] {
    return state_->datapath->unregister(region, [done](Status s) { done->set_value(std::move(s)); });
  });
  if (!started.is_ok()) return started;
  // The loop disconnects a peer that does not acknowledge within the revoke
  // timeout (the margin covers a loop turn), except one of this host that
  // copies into the memory itself and still lives: nothing fences it.
  const auto bound = std::chrono::milliseconds(state_->revoke_timeout_ms + 5'000);
  if (revoked.wait_for(bound) != std::future_status::ready) {
    (void)state_->core->on_loop([&] {
      state_->datapath->answer_unregister_later(region);
      return Status::ok();
    });
    return Status::timeout(
        "unregister: region {} not revoked within {} ms: a peer has not acknowledged — one of this host that copies "
        "into the memory itself is waited for while it lives (a stopped process?), and may still write there; keep "
        "the memory until unregister() (called again) answers ok",
        region, bound.count());
  }
  return revoked.get();
}

Status Engine::export_region(RegionHandle region, const std::vector<std::string>& peers) {
  if (Status s = state_->usable("export_region"); !s.is_ok()) return s;
  return state_->core->on_loop([&] { return state_->datapath->export_region(region, peers); });
}

Result<Region> Engine::region(RegionHandle region) const {
  BATON_REQUIRE_OPEN("region");
  return state_->core->on_loop([&] { return state_->datapath->region(region); });
}

Result<Peer> Engine::connect(std::string_view address) {
  BATON_REQUIRE_OPEN("connect");
  auto done = std::make_shared<std::promise<Result<Peer>>>();
  auto result = done->get_future();
  state_->core->loop->post([this, done, address = std::string(address)](admission::AdmissionController&, TimeNs now_ns) {
    state_->datapath->connect(address, now_ns, [done](Result<Peer> peer) { done->set_value(std::move(peer)); });
  });
  return result.get();  // bounded: the handshake times out on the loop
}

Status Engine::refresh(const Peer& peer, TimeNs timeout_ns) {
  if (Status s = state_->usable("refresh"); !s.is_ok()) return s;
  // 0 raced the loop (ok or timeout by luck): the answer is a round trip.
  if (timeout_ns <= 0) {
    return Status::invalid_argument("refresh: timeout is {} ns (expected > 0: the answer takes a round trip)",
                                    timeout_ns);
  }
  auto done = std::make_shared<std::promise<Status>>();
  auto result = done->get_future();
  state_->core->loop->post([this, done, peer](admission::AdmissionController&, TimeNs) {
    state_->datapath->refresh(peer, [done](Status s) { done->set_value(std::move(s)); });
  });
  if (result.wait_for(std::chrono::nanoseconds(std::min(timeout_ns, kForeverNs))) != std::future_status::ready) {
    return Status::timeout("refresh: peer {} did not answer within {}", peer.address, format_duration(timeout_ns));
  }
  return result.get();
}

Result<std::vector<transport::RemoteRegion>> Engine::remote_regions(const Peer& peer) {
  BATON_REQUIRE_OPEN("remote_regions");
  return state_->core->on_loop([&] { return state_->datapath->remote_regions(peer); });
}

Result<BatchHandle> Engine::submit(const Batch& batch) {
  BATON_REQUIRE_OPEN("submit");
  return state_->submit(batch, nullptr);
}

Result<BatchHandle> Engine::submit(PreparedBatch& batch) {
  BATON_REQUIRE_OPEN("submit");
  return state_->submit(batch.batch_, &batch.resolved_);
}

Status Engine::check(const Batch& batch) {
  if (Status s = state_->usable("check"); !s.is_ok()) return s;
  std::size_t next = 0;
  return state_->core->on_loop_steps([&] { return state_->datapath->check_step(batch, next); });
}

Status Engine::run(const Batch& batch) {
  if (Status s = state_->usable("run"); !s.is_ok()) return s;
  // A same-host batch is copied on the caller's thread with no record when
  // no deadline asks for its stamps (a larger one on the copier, as submit).
  if (state_->direct_copy_max_bytes > 0 &&
      std::ranges::none_of(batch.requests, [](const Request& r) { return r.deadline_ns != 0; })) {
    if (auto ran = state_->datapath->run_direct(batch, state_->direct_copy_max_bytes)) return std::move(*ran);
  }
  return finish_run(*this, state_->submit(batch, nullptr));
}

Status Engine::run(PreparedBatch& batch) {
  if (Status s = state_->usable("run"); !s.is_ok()) return s;
  if (state_->direct_copy_max_bytes > 0) {
    if (auto ran = state_->datapath->run_direct(batch.batch_, batch.resolved_)) return std::move(*ran);
  }
  return finish_run(*this, state_->submit(batch.batch_, &batch.resolved_));
}

Result<BatchStatus> Engine::poll(BatchHandle batch) {
  BatchStatus out;
  if (Status s = poll(batch, out); !s.is_ok()) return std::unexpected(std::move(s));
  return out;
}

Status Engine::poll(BatchHandle batch, BatchStatus& out) {
  if (state_->forked()) return state_->usable("poll");
  // The copier's batch is looked at first: it is published as it leaves
  // the copier, so one of the two finds it.
  if (state_->datapath->copying_status(batch.id, out)) return Status::ok();
  if (state_->datapath->ended_status(batch.id, out)) return Status::ok();
  std::size_t next = 0;
  return state_->core->on_loop_steps([&]() -> std::optional<Status> {
    // It may have ended since the last part (a direct batch with a
    // notification ends on the loop): its final status, whole.
    if (state_->datapath->ended_status(batch.id, out)) return Status::ok();
    return state_->datapath->poll_step(batch, next, out);
  });
}

Status Engine::wait(BatchHandle batch, TimeNs timeout_ns) {
  // The spin reads the count of ended batches and looks its batch up (under
  // the loop's mutex) only when that moved; it yields between looks, since
  // a waiter that spins on a busy machine takes the core the loop needs.
  if (state_->forked()) return state_->usable("wait");
  Datapath& datapath = *state_->datapath;
  using Look = Datapath::Look;
  std::uint64_t seen = datapath.ended_count();
  // Running now and unknown later means another thread released it
  // meanwhile: it ended (ok), where a handle unknown at once is not_found.
  switch (datapath.look(batch.id)) {
    case Look::kEnded: return Status::ok();
    case Look::kUnknown: return Status::not_found("wait: no batch {}", batch.id);
    case Look::kRunning: break;
  }
  if (timeout_ns <= 0) {  // a look, not a wait: no yield, no condition variable (a rank's poll of its loads)
    return Status::timeout("wait: batch {} still running after {} ns", batch.id, timeout_ns);
  }
  // Only the part that can last is counted for the destructor: a batch that
  // already ended (most small ones) pays no more than before.
  if (!datapath.enter_wait()) return Status::unavailable("wait: the engine is being destroyed");
  struct Leave {
    Datapath& d;
    ~Leave() { d.leave_wait(); }
  } leave{datapath};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::min(timeout_ns, kForeverNs));
  auto ended_now = [&] {
    const std::uint64_t count = datapath.ended_count();
    if (count == seen) return false;
    seen = count;
    return datapath.look(batch.id) != Look::kRunning;
  };
  if (spin_until(ended_now,
                 std::min(kBatchWaitSpin, std::chrono::duration_cast<std::chrono::microseconds>(
                                              std::chrono::nanoseconds(timeout_ns))),
                 /*yield=*/true)) {
    return Status::ok();
  }
  switch (datapath.wait_ended(batch.id, deadline)) {
    case Datapath::WaitEnd::kEnded: return Status::ok();
    case Datapath::WaitEnd::kClosed:
      return Status::unavailable("wait: the engine was destroyed before batch {} ended", batch.id);
    case Datapath::WaitEnd::kTimedOut: break;
  }
  return Status::timeout("wait: batch {} still running after {} ns", batch.id, timeout_ns);
}

Status Engine::cancel(BatchHandle batch) {
  if (Status s = state_->usable("cancel"); !s.is_ok()) return s;
  // A batch that ended on the loop-free path has no record on the loop.
  auto ended = [&] { return state_->datapath->look(batch.id) == Datapath::Look::kEnded; };
  if (ended()) return Status::invalid_argument("cancel: batch {} already ended", batch.id);
  if (auto copying = state_->datapath->cancel_copying(batch.id)) return std::move(*copying);
  Datapath::Cancellation cancellation{.id = batch.id};
  return state_->core->on_loop_steps([&]() -> std::optional<Status> {
    if (cancellation.next == 0 && ended()) return Status::invalid_argument("cancel: batch {} already ended", batch.id);
    return state_->datapath->cancel_step(cancellation, state_->core->now_ns());
  });
}

Status Engine::release(BatchHandle batch) {
  if (state_->forked()) return state_->usable("release");
  const Datapath::Taken taken = state_->datapath->take_ended_if_clean(batch.id);
  if (taken == Datapath::Taken::kDirect) return Status::ok();  // the loop never held it
  if (taken == Datapath::Taken::kLoop) {
    // Ended with nothing on the wire: the loop cannot refuse, so it need
    // not be waited for. Later calls on the handle queue behind this one.
    state_->core->loop->post([this, batch](admission::AdmissionController&, TimeNs) {
      (void)state_->datapath->release(batch);
    });
    return Status::ok();
  }
  return state_->core->on_loop([&] {
    // A direct batch with a notification ends on the loop, maybe just now.
    if (state_->datapath->take_ended_if_clean(batch.id) == Datapath::Taken::kDirect) return Status::ok();
    return state_->datapath->release(batch);
  });
}

std::vector<transport::Notification> Engine::take_notifications() {
  if (state_->forked()) return {};
  return state_->core->on_loop([this] { return state_->core->ucx->take_notifications(); });
}

void Engine::shutdown() {
  if (state_->closed.exchange(true) || state_->forked()) return;
  state_->http.reset();  // no more scrapes; each posts to the loop
  state_->core->on_loop([this] {
    state_->datapath->shutdown(state_->core->now_ns());
    return 0;
  });
  // Endpoint closes and GPU copies finish on the loop; a forced close needs
  // no peer, a flushing one may wait on a silent peer, and a same-host peer
  // that writes our memory itself is given the revoke timeout to say it
  // stopped: the wait is bounded by those.
  const auto bound = std::chrono::steady_clock::now() + std::chrono::milliseconds(state_->revoke_timeout_ms + 2'000);
  while (std::chrono::steady_clock::now() < bound) {
    if (state_->core->on_loop([this] { return state_->datapath->shutdown_complete(); })) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  baton::logger().warn("Engine::shutdown: endpoint closes, GPU copies or same-host peers did not finish within {} ms",
                       state_->revoke_timeout_ms + 2'000);
}

#undef BATON_REQUIRE_OPEN


// Both ask the loop: nothing in a forked child.
std::string Engine::metrics_text() { return state_->forked() ? std::string{} : state_->core->metrics_text(); }
sched::SchedStats Engine::stats() { return state_->forked() ? sched::SchedStats{} : state_->core->stats(); }
TimeNs Engine::now_ns() const { return state_->core->now_ns(); }
std::uint64_t Engine::loop_turns() const { return state_->core->loop_turns(); }
const topology::TopologyGraph& Engine::topology() const { return state_->core->graph; }
admission::AdmissionController& Engine::admission() { return *state_->core->admission; }
MetricsRegistry& Engine::metrics() { return state_->core->metrics; }

}  // namespace baton::engine
