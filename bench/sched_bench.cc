// Dispatch cost per slice with 1k, 10k and 100k requests queued on one path,
// and admission's cost per request (its feasibility check counts the bytes
// due before the newcomer) with as many live. Each iteration completes the
// slice in flight, dispatches the most urgent queued request (one slice
// each) and queues a new one, so the queue stays at its size. The transport
// is a stub that only records submissions: what is measured is the
// scheduler's (and admission's) own work.
#include <random>

#include <benchmark/benchmark.h>

#include "baton/admission/admission.h"
#include "baton/sched/scheduler.h"
#include "baton/topology/probe.h"

namespace {

using namespace baton;

class RecordingTransport final : public transport::Transport {
 public:
  explicit RecordingTransport(std::vector<transport::PathInfo> paths) : paths_(std::move(paths)) {}
  const std::vector<transport::PathInfo>& paths() const override { return paths_; }
  Status submit(const transport::SliceSubmit& s, TimeNs) override {
    last_ = s;
    return Status::ok();
  }
  transport::CancelResult cancel(transport::SliceId, TimeNs) override { return {}; }
  void poll(TimeNs, std::vector<transport::Completion>&) override {}
  std::optional<TimeNs> next_event_ns() const override { return std::nullopt; }
  bool path_healthy(transport::PathId, TimeNs) const override { return true; }
  const transport::SliceSubmit& last() const { return last_; }

 private:
  std::vector<transport::PathInfo> paths_;
  transport::SliceSubmit last_;
};

// The pcie4 model's links as paths both ways, one slice of credit on each.
struct Rig {
  topology::TopologyGraph graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  RecordingTransport transport{paths_of(graph)};
  sched::SchedPolicy policy = one_slice_each();
  std::unique_ptr<sched::Scheduler> scheduler = sched::Scheduler::create(graph, policy, transport).value();

  static std::vector<transport::PathInfo> paths_of(const topology::TopologyGraph& g) {
    std::vector<transport::PathInfo> paths;
    for (const topology::Link& l : g.links()) {
      paths.push_back({l.from, l.to, l.path, 1, l.cost.bandwidth_gbps, l.cost.latency_us});
      paths.push_back({l.to, l.from, l.path, 1, l.cost.bandwidth_gbps, l.cost.latency_us});
    }
    return paths;
  }
  static sched::SchedPolicy one_slice_each() {
    sched::SchedPolicy policy = sched::SchedPolicy::defaults();
    for (sched::PathCredits& c : policy.credits) c = {1, 1, 1 << 20};
    return policy;
  }
};

void BM_DispatchPerSlice(benchmark::State& state) {
  const auto queued = static_cast<int>(state.range(0));
  Rig rig;
  RecordingTransport& transport = rig.transport;
  sched::Scheduler* scheduler = rig.scheduler.get();

  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int> qos(0, sched::kQosClassCount - 1);
  std::uniform_int_distribution<TimeNs> deadline(0, 10'000'000);
  sched::RequestId next = 1;
  std::vector<sched::RequestId> finished;
  scheduler->set_finish_hook([&finished](sched::RequestId id) { finished.push_back(id); });
  TimeNs now = 0;
  auto add = [&] {
    const auto q = static_cast<sched::QosClass>(qos(rng));
    const TimeNs d = q == sched::QosClass::kDecodeCritical || q == sched::QosClass::kHotKv ? now + deadline(rng) : 0;
    (void)scheduler->submit(next++, {"gpu0", "gpu1", 64 << 10, q, d, true}, now);
  };
  for (int i = 0; i < queued; ++i) add();
  scheduler->dispatch(now);
  for (auto _ : state) {
    now += 1000;
    const transport::SliceSubmit done = transport.last();
    scheduler->on_completion({done.id, done.path, done.lane, done.bytes, now, Status::ok()}, now);
    for (sched::RequestId id : finished) (void)scheduler->forget(id);  // as an engine does once the owner saw the end
    finished.clear();
    add();
    scheduler->dispatch(now);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["queued"] = static_cast<double>(scheduler->queued_requests());
}
BENCHMARK(BM_DispatchPerSlice)->Arg(1'000)->Arg(10'000)->Arg(100'000);

// The same loop through admission: every new request's MLU is computed
// against the requests live on its path (all with deadlines).
void BM_AdmitPerRequest(benchmark::State& state) {
  const auto live = static_cast<int>(state.range(0));
  Rig rig;
  RecordingTransport& transport = rig.transport;
  sched::Scheduler* scheduler = rig.scheduler.get();
  auto admission = admission::AdmissionController::create(rig.policy, *scheduler, transport).value();
  std::vector<sched::RequestId> finished;
  scheduler->set_finish_hook([&](sched::RequestId id) {
    admission->on_finish(id);
    finished.push_back(id);
  });
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<TimeNs> deadline(1'000'000, 1'000'000'000);
  sched::RequestId next = 1;
  TimeNs now = 0;
  auto add = [&] {
    (void)admission->submit(next++, {"gpu0", "gpu1", 64 << 10, sched::QosClass::kHotKv, now + deadline(rng), true},
                            now);
  };
  for (int i = 0; i < live; ++i) add();
  scheduler->dispatch(now);
  for (auto _ : state) {
    now += 1000;
    const transport::SliceSubmit done = transport.last();
    const sched::RequestId owner = scheduler->on_completion({done.id, done.path, done.lane, done.bytes, now,
                                                             Status::ok()}, now);
    admission->on_completion({done.id, done.path, done.lane, done.bytes, now, Status::ok()}, owner, now);
    admission->tick(now);
    for (sched::RequestId id : finished) (void)admission->forget(id);
    finished.clear();
    add();
    scheduler->dispatch(now);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["queued"] = static_cast<double>(scheduler->queued_requests());
}
BENCHMARK(BM_AdmitPerRequest)->Arg(1'000)->Arg(10'000)->Arg(100'000);

}  // namespace
