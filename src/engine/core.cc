#include "engine/core.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>

#include "baton/common/log.h"
#include "baton/topology/probe.h"
#include "engine/nic_choice.h"

namespace baton::engine {
namespace {

// Permille buckets: 0.1 … 1.0 in tenths, then the infeasible range.
const std::vector<double> kMluPermilleBuckets{100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1500, 2000, 5000, 10000};

void declare_metrics(MetricsRegistry& m, bool ucx) {
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
  if (!ucx) return;
  (void)m.declare_counter("baton_ucx_flushes_posted_total", "Endpoint flushes for RMA writes (one per lane per burst)");
  (void)m.declare_counter("baton_ucx_bundles_sent_total", "Bundles of small TCP slices sent (one message each)");
  (void)m.declare_counter("baton_ucx_thread_copies_total", "Same-host copies done on datapath threads");
  (void)m.declare_counter("baton_ucx_notifications_received_total", "Notifications peers sent us");
  (void)m.declare_counter("baton_ucx_notifications_dropped_total",
                          "Notifications dropped, the oldest, because 65536 waited untaken");
  (void)m.declare_gauge("baton_ucx_notifications_untaken", "Notifications received and not yet taken");
  (void)m.declare_gauge("baton_ucx_paths", "Paths to peers, by state (a failed one's slot goes to a later connect)");
  (void)m.declare_gauge("baton_ucx_paths_reusable",
                        "Failed paths a connect can take now (the rest still close endpoints or hold a GPU copy)");
}

}  // namespace

Result<std::unique_ptr<Core>> Core::create(CoreConfig config) {
  // A file replaces the model, as a policy file replaces the policy (the
  // harness has a model by default, which a file given beside it overrode
  // silently the other way round).
  auto facts = !config.topology_file.empty()    ? topology::load_nvidia_smi_topo(config.topology_file)
               : !config.topology_model.empty() ? topology::load_model(config.topology_model)
                                                : topology::probe_machine();
  if (!facts) return std::unexpected(facts.error());
  if (!config.policy_file.empty()) {
    auto loaded = sched::load_policy(config.policy_file);
    if (!loaded) return std::unexpected(loaded.error());
    config.policy = std::move(*loaded);
  }
  if (Status s = config.policy.validate(); !s.is_ok()) return std::unexpected(s);
  topology::CostModel costs;
  for (const sched::SchedPolicy::CostOverride& o : config.policy.cost_model) {
    if (Status s = costs.set(o.path, o.proximity, o.bandwidth_gbps, o.latency_us); !s.is_ok()) {
      return std::unexpected(s);
    }
  }
  auto graph = topology::TopologyGraph::build(*facts, costs);
  if (!graph) return std::unexpected(graph.error());

  auto core = std::make_unique<Core>();
  core->graph = std::move(*graph);
  const sched::SchedPolicy& policy = config.policy;
  if (config.real) {
    if (config.ucx.nics == std::vector<std::string>{"auto"}) {
      // The rails from this machine's topology, NUMA-local to the thread
      // that creates the engine; one NIC or none: UCX's own choice.
      config.ucx.nics = rail_nics(*facts, current_numa_node());
      if (config.ucx.nics.size() < 2) config.ucx.nics.clear();
      config.ucx.lanes_per_peer = std::max<int>(config.ucx.lanes_per_peer, static_cast<int>(config.ucx.nics.size()));
      baton::logger().info("engine: NICs from the topology: {}",
                           config.ucx.nics.empty() ? "fewer than two, UCX chooses"
                                                   : fmt::format("{}", fmt::join(config.ucx.nics, ",")));
    }
    // A TCP slice crosses as one UCX segment, whatever the policy's slice
    // size (the descriptor and headers fit in the headroom). A value out of
    // UcxConfig's range is left for create() to refuse, not raised into it.
    if (config.ucx.tcp_segment_bytes >= transport::kMinTcpSegmentBytes &&
        config.ucx.tcp_segment_bytes <= transport::kMaxTcpSegmentBytes) {
      constexpr std::uint64_t kHeadroom = 4 << 10;
      config.ucx.tcp_segment_bytes =
          std::max(config.ucx.tcp_segment_bytes, std::min(policy.slice_for(topology::PathType::kTcp) + kHeadroom,
                                                          transport::kMaxTcpSegmentBytes));
    }
    auto ucx = transport::UcxTransport::create(config.ucx);
    if (!ucx) return std::unexpected(ucx.error());
    // The GPUs of this host carry requests between this engine's own
    // regions (the CUDA transport over the topology's GPU paths), when asked.
    std::unique_ptr<transport::CudaTransport> local;
    if (config.gpu_paths) {
      if (core->graph.nodes_of(topology::NodeKind::kGpu).empty()) {
        return std::unexpected(Status::failed_precondition("gpu_paths: the topology ({}) has no GPU",
                                                           facts->source.empty() ? "probe" : facts->source));
      }
      if (!config.cuda) {
        auto found = transport::cuda_runtime();
        if (!found) return std::unexpected(Status(found.error().code(), "gpu_paths: " + found.error().message()));
        config.cuda = *found;
      }
      auto made = transport::CudaTransport::create(core->graph, config.cuda, config.cuda_config);
      if (!made) return std::unexpected(Status(made.error().code(), "gpu_paths: " + made.error().message()));
      local = std::move(*made);
    }
    // VRAM slices are staged through host memory (UCX here cannot reach GPUs).
    auto staging = std::make_unique<VramStaging>(std::move(*ucx), std::move(config.cuda));
    staging->set_local(std::move(local));
    core->ucx = &staging->ucx();
    core->staging = staging.get();
    core->transport = std::move(staging);
  } else if (config.cuda) {
    auto cuda = transport::CudaTransport::create(core->graph, std::move(config.cuda), config.cuda_config);
    if (!cuda) return std::unexpected(cuda.error());
    core->cuda = cuda->get();
    core->transport = std::move(*cuda);
  } else {
    auto sim = transport::SimTransport::from_topology(
        core->graph, [&policy](topology::PathType p) { return policy.credits_for(p).lanes; }, config.sim);
    if (!sim) return std::unexpected(sim.error());
    core->sim = sim->get();
    core->transport = std::move(*sim);
  }
  auto scheduler = sched::Scheduler::create(core->graph, policy, *core->transport);
  if (!scheduler) return std::unexpected(scheduler.error());
  core->scheduler = std::move(*scheduler);
  auto admission = admission::AdmissionController::create(policy, *core->scheduler, *core->transport);
  if (!admission) return std::unexpected(admission.error());
  core->admission = std::move(*admission);
  core->scheduler->set_finish_hook([a = core->admission.get()](sched::RequestId id) { a->on_finish(id); });
  core->loop = std::make_unique<EngineLoop>(*core->scheduler, *core->admission, *core->transport);
  declare_metrics(core->metrics, core->ucx != nullptr);
  core->admission->set_mlu_observer([m = &core->metrics](double mlu, transport::Op op) {
    m->observe("baton_admission_mlu_permille", {{"op", op == transport::Op::kRead ? "read" : "write"}}, mlu * 1000.0);
  });
  core->driver = std::make_unique<VirtualClockDriver>(*core->loop);
  if (config.clock == ClockKind::kWall) {
    core->wall = std::make_unique<WallClockDriver>(*core->loop, *core->transport);
  }
  return core;
}

Core::~Core() {
  if (wall) wall->stop();  // the loop thread goes before what it uses
}

std::string Core::metrics_text() {
  return on_loop([this] {
    if (before_metrics) before_metrics();
    MetricsRegistry& m = metrics;
    const admission::AdmissionStats& a = admission->stats();
    admission::AdmissionStats& ea = exported_admission;
    m.add("baton_admission_admitted_total", {}, a.admitted - ea.admitted);
    m.add("baton_admission_compressed_total", {}, a.compressed - ea.compressed);
    m.add("baton_admission_dropped_total", {}, a.dropped - ea.dropped);
    m.add("baton_admission_infeasible_total", {}, a.infeasible - ea.infeasible);
    m.add("baton_admission_signalled_total", {}, a.signalled - ea.signalled);
    ea = a;
    const sched::SchedStats& s = scheduler->stats();
    sched::SchedStats& es = exported_sched;
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
    if (ucx) {
      const transport::NotificationCounts notes = ucx->notification_counts();
      const UcxCounts now{ucx->flushes_posted(), ucx->bundles_sent(), ucx->thread_copies(), notes.received,
                          notes.dropped};
      m.add("baton_ucx_flushes_posted_total", {}, static_cast<double>(now.flushes - exported_ucx.flushes));
      m.add("baton_ucx_bundles_sent_total", {}, static_cast<double>(now.bundles - exported_ucx.bundles));
      m.add("baton_ucx_thread_copies_total", {}, static_cast<double>(now.thread_copies - exported_ucx.thread_copies));
      m.add("baton_ucx_notifications_received_total", {},
            static_cast<double>(now.notifications_received - exported_ucx.notifications_received));
      m.add("baton_ucx_notifications_dropped_total", {},
            static_cast<double>(now.notifications_dropped - exported_ucx.notifications_dropped));
      m.set("baton_ucx_notifications_untaken", {}, static_cast<double>(notes.untaken));
      constexpr std::array<const char*, 3> kStates{"connecting", "ready", "failed"};  // by PathState
      std::array<std::size_t, kStates.size()> paths{};
      std::size_t reusable = 0;
      for (transport::PathId id = 0; id < ucx->paths().size(); ++id) {
        ++paths.at(static_cast<std::size_t>(ucx->path_state(id)));
        reusable += ucx->path_reusable(id) ? 1 : 0;
      }
      for (std::size_t i = 0; i < kStates.size(); ++i) {
        m.set("baton_ucx_paths", {{"state", kStates[i]}}, static_cast<double>(paths[i]));
      }
      m.set("baton_ucx_paths_reusable", {}, static_cast<double>(reusable));
      exported_ucx = now;
    }
    return m.text();
  });
}

sched::SchedStats Core::stats() {
  return on_loop([this] { return scheduler->stats(); });
}

TimeNs Core::now_ns() const { return wall ? wall->now_ns() : driver->clock().now_ns(); }
std::uint64_t Core::loop_turns() const { return wall ? wall->turns() : 0; }

}  // namespace baton::engine
