#include "baton/engine/engine.h"

#include <atomic>

#include "baton/topology/probe.h"
#include "engine/engine_loop.h"

namespace baton::engine {

struct Engine::State {
  topology::TopologyGraph graph;
  std::unique_ptr<transport::SimTransport> transport;
  std::unique_ptr<sched::Scheduler> scheduler;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<VirtualClockDriver> driver;
  std::atomic<sched::RequestId> next_id{1};
};

Engine::Engine(std::unique_ptr<State> state) : state_(std::move(state)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config) {
  auto facts = !config.topology_model.empty() ? topology::load_model(config.topology_model)
               : !config.topology_file.empty() ? topology::load_nvidia_smi_topo(config.topology_file)
                                               : topology::probe_machine();
  if (!facts) return std::unexpected(facts.error());
  auto graph = topology::TopologyGraph::build(*facts);
  if (!graph) return std::unexpected(graph.error());
  if (Status s = config.policy.validate(); !s.is_ok()) return std::unexpected(s);

  auto state = std::make_unique<State>();
  state->graph = std::move(*graph);
  const sched::SchedPolicy& policy = config.policy;
  auto transport = transport::SimTransport::from_topology(
      state->graph, [&policy](topology::PathType p) { return policy.credits_for(p).lanes; }, config.sim);
  if (!transport) return std::unexpected(transport.error());
  state->transport = std::move(*transport);
  auto scheduler = sched::Scheduler::create(state->graph, policy, *state->transport);
  if (!scheduler) return std::unexpected(scheduler.error());
  state->scheduler = std::move(*scheduler);
  state->loop = std::make_unique<EngineLoop>(*state->scheduler, *state->transport);
  state->driver = std::make_unique<VirtualClockDriver>(*state->loop);
  return std::unique_ptr<Engine>(new Engine(std::move(state)));
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
    state_->loop->post([id, r](sched::Scheduler& s, TimeNs now_ns) {
      // Validated above against the same topology; a refusal here is a bug
      // that status() reports as not_found rather than a lost request.
      (void)s.submit(id, r, now_ns);
    });
  }
  return ids;
}

Status Engine::cancel(sched::RequestId id) {
  if (id == 0 || id >= state_->next_id.load()) return Status::not_found("cancel: no request {}", id);
  state_->loop->tick(now_ns());  // the request may still be a command
  return state_->scheduler->cancel(id, now_ns());
}

Result<sched::RequestStatus> Engine::status(sched::RequestId id) {
  if (state_->loop->has_commands()) state_->loop->tick(now_ns());
  return state_->scheduler->status(id);
}

const sched::SchedStats& Engine::stats() const { return state_->scheduler->stats(); }

Status Engine::run_until(TimeNs t_ns) { return state_->driver->run_until(t_ns); }

Status Engine::run_until_idle(TimeNs limit_ns) {
  return state_->driver->run_until_idle(limit_ns, [this] { return state_->scheduler->queued_requests() == 0; });
}

TimeNs Engine::now_ns() const { return state_->driver->clock().now_ns(); }
const topology::TopologyGraph& Engine::topology() const { return state_->graph; }
transport::SimTransport& Engine::sim_transport() { return *state_->transport; }
const sched::Scheduler& Engine::scheduler() const { return *state_->scheduler; }

}  // namespace baton::engine
