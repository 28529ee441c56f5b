// The scheduler's behaviour, run through the Harness on the simulated
// transport under the virtual clock: orderings, exact byte counts, credits.
#include "baton/sched/scheduler.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "baton/engine/harness.h"
#include "workloads/mixed.h"
#include "baton/topology/probe.h"
#include "engine/completion_order.h"
#include "sched/growing_transport.h"

namespace baton::sched {
namespace {

using engine::Harness;
using engine::HarnessConfig;
using topology::PathType;
using transport::PathId;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;

std::unique_ptr<Harness> make_engine(const std::string& model, SchedPolicy policy = SchedPolicy::defaults(),
                                    transport::SimConfig sim = {}) {
  HarnessConfig config;
  config.topology_model = model;
  config.policy = policy;
  config.sim = std::move(sim);
  auto e = Harness::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return std::move(*e);
}

PathId path_of(Harness& e, const std::string& from, const std::string& to, PathType type) {
  const auto& paths = e.sim_transport().paths();
  for (PathId i = 0; i < paths.size(); ++i) {
    if (paths[i].from == from && paths[i].to == to && paths[i].type == type) return i;
  }
  ADD_FAILURE() << "no path " << from << "->" << to;
  return 0;
}

RequestStatus status_of(Harness& e, RequestId id) {
  auto s = e.status(id);
  EXPECT_TRUE(s.has_value());
  return s.value_or(RequestStatus{});
}

TEST(Scheduler, DeadlineAwareMeetsDecodeDeadlinesThatFifoMisses) {
  workloads::MixedWorkload w;
  w.duration_ns = 60'000'000;
  SchedPolicy fifo = SchedPolicy::defaults();
  fifo.kind = PolicyKind::kBaselineFifo;
  const auto f = workloads::run_mixed(w, fifo).value();
  const auto a = workloads::run_mixed(w, SchedPolicy::defaults()).value();
  ASSERT_GT(a.decode.count, 100u);
  EXPECT_EQ(a.decode.count, f.decode.count);
  EXPECT_EQ(a.decode.miss_ratio, 0.0);
  EXPECT_GT(f.decode.miss_ratio, 0.0);
  EXPECT_LE(a.decode.p99_us, 0.7 * f.decode.p99_us);  // at least a 30% cut
  EXPECT_GE(a.prefill.throughput_gbps, 0.95 * f.prefill.throughput_gbps);
  EXPECT_EQ(a.prefill.count, f.prefill.count);
  EXPECT_EQ(f.stats.slices_preempted, 0u);  // FIFO never preempts
  EXPECT_EQ(f.stats.bytes_wasted, 0u);
}

TEST(Scheduler, SameSeedSameRunOtherSeedOtherRun) {
  workloads::MixedWorkload w;
  w.duration_ns = 20'000'000;
  const auto a = workloads::run_mixed(w, SchedPolicy::defaults()).value();
  const auto b = workloads::run_mixed(w, SchedPolicy::defaults()).value();
  EXPECT_EQ(a.decode.cdf_us, b.decode.cdf_us);
  EXPECT_EQ(a.prefill.cdf_us, b.prefill.cdf_us);
  EXPECT_EQ(a.stats.slices_posted, b.stats.slices_posted);
  EXPECT_EQ(a.stats.slices_preempted, b.stats.slices_preempted);
  w.seed = 2;
  const auto c = workloads::run_mixed(w, SchedPolicy::defaults()).value();
  EXPECT_NE(a.decode.count + a.prefill.count * 1000, c.decode.count + c.prefill.count * 1000);
}

// One slice at a time on the path, so completion order is dispatch order.
SchedPolicy one_at_a_time(PolicyKind kind) {
  SchedPolicy p = SchedPolicy::defaults();
  p.kind = kind;
  p.preemption = false;
  for (PathCredits& c : p.credits) c = {1, 1, 64 * kMiB};
  return p;
}

using baton::testing::completion_order;

TEST(Scheduler, ClassesAndLaxityOrderDispatch) {
  auto e = make_engine("pcie4", one_at_a_time(PolicyKind::kDeadlineAware));
  const TransferRequest base{"gpu0", "gpu1", 256 * kKiB, QosClass::kBackground, 0, true};
  auto with = [&](QosClass q, TimeNs deadline) {
    TransferRequest r = base;
    r.qos = q;
    r.deadline_ns = deadline;
    return e->submit(r).value();
  };
  const RequestId blocker = with(QosClass::kBackground, 0);  // takes the path first
  ASSERT_TRUE(e->run_until(1).is_ok());
  const RequestId background = with(QosClass::kBackground, 0);
  const RequestId prefill = with(QosClass::kPrefillBulk, 0);
  const RequestId hot = with(QosClass::kHotKv, 0);
  const RequestId decode_late = with(QosClass::kDecodeCritical, 900'000);
  const RequestId decode_soon = with(QosClass::kDecodeCritical, 300'000);  // submitted later, due sooner
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, {blocker, background, prefill, hot, decode_late, decode_soon}),
            (std::vector<RequestId>{blocker, decode_soon, decode_late, hot, prefill, background}));
}

TEST(Scheduler, BaselineFifoKeepsArrivalOrderAcrossClasses) {
  auto e = make_engine("pcie4", one_at_a_time(PolicyKind::kBaselineFifo));
  std::vector<RequestId> ids;
  for (QosClass q : {QosClass::kBackground, QosClass::kPrefillBulk, QosClass::kDecodeCritical, QosClass::kHotKv}) {
    ids.push_back(e->submit({"gpu0", "gpu1", 256 * kKiB, q, q == QosClass::kDecodeCritical ? 1 : 0, true}).value());
  }
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, ids), ids);
}

TEST(Scheduler, DeadlinePressureAloneMeetsTheDecodeDeadlinesClassPriorityMet) {
  // The deadline term on its own (class priority weighed 0) must protect the
  // decode stream as class priority does: a request with a deadline outranks
  // bulk without one as soon as its laxity is inside the horizon.
  workloads::MixedWorkload w;
  w.duration_ns = 60'000'000;
  SchedPolicy deadline_only = SchedPolicy::defaults();
  deadline_only.w_priority = 0;
  SchedPolicy fifo = SchedPolicy::defaults();
  fifo.kind = PolicyKind::kBaselineFifo;
  const auto d = workloads::run_mixed(w, deadline_only).value();
  const auto f = workloads::run_mixed(w, fifo).value();
  ASSERT_GT(d.decode.count, 100u);
  EXPECT_EQ(d.decode.count, f.decode.count);
  EXPECT_GT(f.decode.miss_ratio, 0.1);
  EXPECT_EQ(d.decode.miss_ratio, 0.0);
  EXPECT_EQ(d.prefill.count, f.prefill.count);
}

// Submits `base` with a class and a deadline on `e`.
struct Submitter {
  Harness& e;
  TransferRequest base;
  RequestId operator()(QosClass q, TimeNs deadline, std::uint64_t bytes = 0) {
    TransferRequest r = base;
    r.qos = q;
    r.deadline_ns = deadline;
    if (bytes != 0) r.bytes = bytes;
    return e.submit(r).value();
  }
};

TEST(Scheduler, WithoutClassPriorityPressedDeadlinesGoLeastLaxityFirstAheadOfTheRest) {
  SchedPolicy p = one_at_a_time(PolicyKind::kDeadlineAware);
  p.w_priority = 0;
  auto e = make_engine("pcie4", p);
  Submitter with{*e, {"gpu0", "gpu1", 256 * kKiB, QosClass::kBackground, 0, true}};
  const RequestId blocker = with(QosClass::kBackground, 0);
  ASSERT_TRUE(e->run_until(1).is_ok());
  const RequestId bulk = with(QosClass::kPrefillBulk, 0);
  const RequestId far = with(QosClass::kDecodeCritical, 1'000'000'000);  // laxity far beyond the 10 ms horizon
  const RequestId late = with(QosClass::kBackground, 900'000);
  const RequestId soon = with(QosClass::kBackground, 300'000);  // submitted last, least laxity
  ASSERT_TRUE(e->run_until_idle().is_ok());
  // A deadline whose laxity is outside the horizon exerts no pressure: it
  // waits as work without a deadline of its class does (here: after `bulk`,
  // which arrived first).
  EXPECT_EQ(completion_order(*e, {blocker, bulk, far, late, soon}),
            (std::vector<RequestId>{blocker, soon, late, bulk, far}));
  for (RequestId id : {soon, late, far}) EXPECT_FALSE(status_of(*e, id).deadline_missed());
}

TEST(Scheduler, DeadlinesSeparateRequestsWithinOneClass) {
  // Default weights: equal class terms cancel, so deadlines decide.
  auto e = make_engine("pcie4", one_at_a_time(PolicyKind::kDeadlineAware));
  Submitter with{*e, {"gpu0", "gpu1", 256 * kKiB, QosClass::kPrefillBulk, 0, true}};
  const RequestId blocker = with(QosClass::kPrefillBulk, 0);
  ASSERT_TRUE(e->run_until(1).is_ok());
  const RequestId none = with(QosClass::kPrefillBulk, 0);
  const RequestId d3 = with(QosClass::kPrefillBulk, 3'000'000);
  const RequestId d2 = with(QosClass::kPrefillBulk, 2'000'000);
  const RequestId d1 = with(QosClass::kPrefillBulk, 1'000'000);
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, {blocker, none, d3, d2, d1}),
            (std::vector<RequestId>{blocker, d1, d2, d3, none}));
}

TEST(Scheduler, PressureStartsWhenLaxityEntersTheHorizon) {
  // A 64 MiB bulk request holds a PCIe path (~2.8 ms). A small request due
  // at 3 ms waits while its laxity is beyond the horizon and overtakes the
  // bulk once it is inside: with a 1 ms horizon around 2 ms, with 10 ms at once.
  auto finish_of_due = [](TimeNs horizon_ns) {
    SchedPolicy p = one_at_a_time(PolicyKind::kDeadlineAware);
    p.w_priority = 0;
    p.deadline_horizon_ns = horizon_ns;
    auto e = make_engine("pcie4", p);
    Submitter with{*e, {"gpu0", "gpu1", 256 * kKiB, QosClass::kPrefillBulk, 0, true}};
    const RequestId bulk = with(QosClass::kPrefillBulk, 0, 64 * kMiB);
    const RequestId due = with(QosClass::kPrefillBulk, 3'000'000);
    EXPECT_TRUE(e->run_until_idle().is_ok());
    const RequestStatus b = status_of(*e, bulk);
    const RequestStatus d = status_of(*e, due);
    EXPECT_LT(d.completed_ns, b.completed_ns);
    EXPECT_FALSE(d.deadline_missed());
    return d.completed_ns;
  };
  const TimeNs narrow = finish_of_due(1'000'000);
  const TimeNs wide = finish_of_due(10'000'000);
  EXPECT_LT(wide, 100'000);  // served at once (virtual time)
  EXPECT_GE(narrow, 3'000'000 - 1'000'000);  // not before its laxity reached 1 ms
}

TEST(Scheduler, StrictPriorityOrdersByClassAndArrivalAlone) {
  auto e = make_engine("pcie4", one_at_a_time(PolicyKind::kStrictPriority));
  Submitter with{*e, {"gpu0", "gpu1", 256 * kKiB, QosClass::kBackground, 0, true}};
  const RequestId blocker = with(QosClass::kBackground, 0);
  ASSERT_TRUE(e->run_until(1).is_ok());
  const RequestId background = with(QosClass::kBackground, 200'000);
  const RequestId prefill = with(QosClass::kPrefillBulk, 0);
  const RequestId decode_late = with(QosClass::kDecodeCritical, 900'000);
  const RequestId decode_soon = with(QosClass::kDecodeCritical, 300'000);
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, {blocker, background, prefill, decode_late, decode_soon}),
            (std::vector<RequestId>{blocker, decode_late, decode_soon, prefill, background}));
}

TEST(Scheduler, EdfOrdersByDeadlineAloneAndServesTheRestLastInArrivalOrder) {
  auto e = make_engine("pcie4", one_at_a_time(PolicyKind::kEdf));
  Submitter with{*e, {"gpu0", "gpu1", 256 * kKiB, QosClass::kBackground, 0, true}};
  const RequestId blocker = with(QosClass::kBackground, 0);
  ASSERT_TRUE(e->run_until(1).is_ok());
  const RequestId decode_none = with(QosClass::kDecodeCritical, 0);
  const RequestId background = with(QosClass::kBackground, 900'000);
  const RequestId prefill_none = with(QosClass::kPrefillBulk, 0);
  const RequestId decode = with(QosClass::kDecodeCritical, 1'200'000);
  const RequestId bulk_soon = with(QosClass::kPrefillBulk, 300'000);
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, {blocker, decode_none, background, prefill_none, decode, bulk_soon}),
            (std::vector<RequestId>{blocker, bulk_soon, background, decode, decode_none, prefill_none}));
}

TEST(Scheduler, ARequestPastItsTimeoutEndsTimeoutAndFreesItsPlace) {
  SchedPolicy p = SchedPolicy::defaults();
  p.transfer_timeout_ns = 1'000'000;
  p.admission.max_owners = 1;  // the third request waits in admission
  auto e = make_engine("pcie4", p);
  const RequestId big = e->submit({"gpu0", "gpu1", 64 * kMiB, QosClass::kPrefillBulk, 0, true}).value();  // ~2.8 ms
  TransferRequest patient{"gpu0", "gpu1", 64 * kMiB, QosClass::kPrefillBulk, 0, true};
  patient.timeout_ns = 20'000'000;  // its own timeout, longer than the policy's
  const RequestId own = e->submit(patient).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const RequestStatus b = status_of(*e, big);
  EXPECT_EQ(b.state, RequestState::kTimedOut);
  EXPECT_EQ(b.status.code(), StatusCode::kTimeout);
  EXPECT_GT(b.bytes_done, 0u);
  EXPECT_LT(b.bytes_done, 64 * kMiB);
  EXPECT_EQ(b.completed_ns, 1'000'000);  // the simulator stops its slices at once
  // Waiting for the admission slot past the policy's 1 ms did not end it.
  EXPECT_EQ(status_of(*e, own).state, RequestState::kCompleted);
  // One waiting in admission times out there, without a byte sent.
  const RequestId holder = e->submit(patient).value();
  const RequestId waiting = e->submit({"gpu0", "gpu1", kMiB, QosClass::kPrefillBulk, 0, true}).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, holder).state, RequestState::kCompleted);
  EXPECT_EQ(status_of(*e, waiting).state, RequestState::kTimedOut);
  EXPECT_EQ(status_of(*e, waiting).bytes_done, 0u);
  EXPECT_EQ(e->cancel(waiting).code(), StatusCode::kInvalidArgument);  // ended
  TransferRequest negative{"gpu0", "gpu1", kMiB};
  negative.timeout_ns = -5;
  const auto refused = e->submit(negative);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("timeout -5 ns"), std::string::npos) << refused.error().message();
  EXPECT_EQ(e->scheduler().queued_requests(), 0u);
  EXPECT_EQ(e->scheduler().load(path_of(*e, "gpu0", "gpu1", PathType::kPcieP2p)).inflight_bytes, 0u);
}

TEST(Scheduler, NothingStarvesUnderSustainedCriticalLoad) {
  // Critical requests arrive faster than the PCIe path drains them (26 vs
  // 24 GB/s) for 200 ms; a background request queued at the start must still
  // finish long before the stream ends, thanks to the starvation bound.
  auto run = [](TimeNs bound) {
    SchedPolicy p = SchedPolicy::defaults();
    p.starvation_bound_ns = bound;
    auto e = make_engine("pcie4", p);
    RequestId background = 0;
    for (TimeNs t = 0; t < 200'000'000; t += 40'000) {
      EXPECT_TRUE(e->run_until(t).is_ok());
      EXPECT_TRUE(e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kDecodeCritical, t + 2'000'000, false}).has_value());
      if (t == 400'000) background = e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kBackground, 0, true}).value();
    }
    EXPECT_TRUE(e->run_until_idle().is_ok());
    return std::pair(status_of(*e, background), e->stats());
  };
  const auto [bounded, stats] = run(50'000'000);
  ASSERT_EQ(bounded.state, RequestState::kCompleted);
  EXPECT_LT(bounded.completed_ns - bounded.submitted_ns, 60'000'000);
  EXPECT_GT(stats.starvation_promotions, 0u);
  // The bound is what saves it: without one it waits for the whole stream.
  const auto [unbounded, stats2] = run(3'600'000'000'000);
  EXPECT_GT(unbounded.completed_ns, 200'000'000);
  EXPECT_EQ(stats2.starvation_promotions, 0u);
}

TEST(Scheduler, AnOverdueBacklogTakesEveryOtherSliceNotTheLink) {
  // 2 GiB of non-preemptible bulk queued at once drains for ~90 ms on PCIe;
  // at 60 ms all of it is overdue. A critical read arriving then must not
  // wait for the backlog: overdue work gets every other slice only.
  SchedPolicy p = SchedPolicy::defaults();
  auto e = make_engine("pcie4", p);
  for (int i = 0; i < 2048; ++i) {
    ASSERT_TRUE(e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kPrefillBulk, 0, false}).has_value());
  }
  ASSERT_TRUE(e->run_until(60'000'000).is_ok());
  const RequestId critical =
      e->submit({"gpu0", "gpu1", 256 * 1024, QosClass::kDecodeCritical, 62'000'000, false}).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const RequestStatus s = status_of(*e, critical);
  ASSERT_EQ(s.state, RequestState::kCompleted);
  EXPECT_FALSE(s.deadline_missed()) << "waited " << (s.completed_ns - s.submitted_ns) << " ns";
  EXPECT_GT(e->stats().starvation_promotions, 0u);
}

TEST(Scheduler, AgingStopsAtTheStarvationBoundSoAnOldBacklogDoesNotOutrankCriticalWork) {
  // 12 GiB of non-preemptible bulk queued at once drains for ~0.5 s on PCIe.
  // Aging without a cap (0.05 a µs waited) lifted every bulk request above
  // a fresh decode read (class 10 000 + pressure) once it had waited ~0.3 s,
  // so the read waited for its deadline to pass before it was served: the
  // starvation bound's every other slice went to the backlog, and so did
  // every other one.
  SchedPolicy p = SchedPolicy::defaults();
  auto e = make_engine("pcie4", p);
  for (int i = 0; i < 12 * 1024; ++i) {
    ASSERT_TRUE(e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kPrefillBulk, 0, false}).has_value());
  }
  ASSERT_TRUE(e->run_until(400'000'000).is_ok());
  const RequestId critical =
      e->submit({"gpu0", "gpu1", 256 * 1024, QosClass::kDecodeCritical, 400'000'000 + 2'000'000, false}).value();
  ASSERT_TRUE(e->run_until(420'000'000).is_ok());
  const RequestStatus s = status_of(*e, critical);
  ASSERT_EQ(s.state, RequestState::kCompleted);
  EXPECT_FALSE(s.deadline_missed()) << "waited " << (s.completed_ns - s.submitted_ns) << " ns";
  // The backlog still drains: the bound gives it every other slice.
  EXPECT_GT(e->stats().starvation_promotions, 0u);
  ASSERT_TRUE(e->run_until_idle().is_ok());
}

TEST(Scheduler, PreemptionRescuesATightDeadlineAndTheVictimCompletes) {
  auto run = [](bool preemption) {
    SchedPolicy p = SchedPolicy::defaults();
    p.preemption = preemption;
    p.slice_bytes[static_cast<int>(PathType::kPcieP2p)] = 4 * kMiB;  // 175 us on the wire
    p.credits[static_cast<int>(PathType::kPcieP2p)] = {1, 1, 4 * kMiB};
    auto e = make_engine("pcie4", p);
    const RequestId bulk = e->submit({"gpu0", "gpu1", 16 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
    EXPECT_TRUE(e->run_until(50'000).is_ok());
    // 10 us: PCIe after a preemption makes it (~6 us); host staging (~16 us)
    // and waiting for the bulk slice (~175 us) do not.
    const RequestId decode =
        e->submit({"gpu0", "gpu1", 64 * kKiB, QosClass::kDecodeCritical, 50'000 + 10'000, false}).value();
    EXPECT_TRUE(e->run_until_idle().is_ok());
    return std::tuple(status_of(*e, decode), status_of(*e, bulk), e->stats(), e->sim_transport().bytes_delivered());
  };
  const auto [decode, bulk, stats, delivered] = run(true);
  EXPECT_EQ(decode.state, RequestState::kCompleted);
  EXPECT_FALSE(decode.deadline_missed());
  EXPECT_EQ(bulk.state, RequestState::kCompleted);
  EXPECT_EQ(bulk.bytes_done, 16 * kMiB);
  EXPECT_GE(bulk.slices_preempted, 1u);
  EXPECT_GT(stats.bytes_wasted, 0u);  // the victim was on the wire
  EXPECT_EQ(delivered, 16 * kMiB + 64 * kKiB);  // re-sent, never lost or doubled

  const auto [late, bulk2, stats2, delivered2] = run(false);
  EXPECT_TRUE(late.deadline_missed());
  EXPECT_EQ(stats2.slices_preempted, 0u);
  EXPECT_EQ(delivered2, 16 * kMiB + 64 * kKiB);
}

// A critical slice that preempts small slices takes as many as it needs to
// fit the path's byte budget: it took one 4 KiB victim for a 1 MiB slice,
// and round after round put 256 MiB in flight against a 1 MiB budget.
TEST(Scheduler, PreemptionKeepsThePathsByteBudget) {
  SchedPolicy p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kPcieP2p)] = {1, 256, kMiB};
  p.slice_bytes[static_cast<int>(PathType::kPcieP2p)] = kMiB;
  auto e = make_engine("pcie4", p);
  std::vector<RequestId> small;
  for (int i = 0; i < 256; ++i) {
    small.push_back(e->submit({"gpu0", "gpu1", 4 * kKiB, QosClass::kBackground, 0, true}).value());
  }
  ASSERT_TRUE(e->run_until(0).is_ok());
  const PathId pcie = path_of(*e, "gpu0", "gpu1", PathType::kPcieP2p);
  EXPECT_EQ(e->scheduler().load(pcie).inflight_slices, 256);  // every slot taken, 1 MiB in flight
  const RequestId decode = e->submit({"gpu0", "gpu1", 4 * kMiB, QosClass::kDecodeCritical, 0, false}).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const PathLoad& load = e->scheduler().load(pcie);
  EXPECT_LE(load.max_inflight_bytes, kMiB);
  EXPECT_LE(load.max_inflight_slices, 256);
  EXPECT_GE(e->stats().slices_preempted, 1u);
  EXPECT_EQ(status_of(*e, decode).state, RequestState::kCompleted);
  for (RequestId id : small) EXPECT_EQ(status_of(*e, id).state, RequestState::kCompleted) << id;
  EXPECT_EQ(e->sim_transport().bytes_delivered(), 4 * kMiB + 256 * 4 * kKiB);  // re-sent, never doubled
}

// A measured cost far above any real link (1e5 GB/s at a tenth of a second)
// asked for a billion slices a lane; lanes x slices wrapped int and the path
// posted nothing.
TEST(Scheduler, AnExtremeCostOverrideStillMovesBytes) {
  SchedPolicy p = SchedPolicy::defaults();
  p.slice_bytes[static_cast<int>(PathType::kPcieP2p)] = 4 * kKiB;
  p.cost_model.push_back({PathType::kPcieP2p, topology::Proximity::kPix, 1e5, 1e5});
  p.cost_model.push_back({PathType::kPcieP2p, topology::Proximity::kPxb, 1e5, 1e5});
  p.cost_model.push_back({PathType::kPcieP2p, topology::Proximity::kPhb, 1e5, 1e5});
  auto e = make_engine("pcie4", p);
  const RequestId id = e->submit({"gpu0", "gpu1", kMiB, QosClass::kPrefillBulk, 0, true}).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, id).state, RequestState::kCompleted);
  EXPECT_EQ(e->sim_transport().bytes_delivered(), kMiB);
}

TEST(Scheduler, CreditsAreNeverExceeded) {
  auto e = make_engine("nvswitch8");
  // The mixed shapes, driven by hand to look at the loads afterwards.
  for (TimeNs t = 0; t < 30'000'000; t += 100'000) {
    ASSERT_TRUE(e->run_until(t).is_ok());
    if (t % 10'000'000 == 0) {
      for (int i = 0; i < 16; ++i) ASSERT_TRUE(e->submit({"gpu0", "gpu1", 32 * kMiB, QosClass::kPrefillBulk, 0, true}));
    }
    ASSERT_TRUE(e->submit({"gpu0", "gpu1", 256 * kKiB, QosClass::kDecodeCritical, t + 2'000'000, false}));
  }
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const SchedPolicy& p = e->scheduler().policy();
  const auto& paths = e->sim_transport().paths();
  std::uint64_t completed = 0;
  for (PathId i = 0; i < paths.size(); ++i) {
    const PathLoad& load = e->scheduler().load(i);
    const PathCredits& c = p.credits_for(paths[i].type);
    EXPECT_LE(load.max_inflight_slices, c.lanes * c.slices_per_lane) << paths[i].name();
    EXPECT_LE(load.max_inflight_bytes, c.inflight_bytes) << paths[i].name();
    EXPECT_EQ(load.inflight_slices, 0);
    completed += load.bytes_completed;
  }
  const PathLoad& hot = e->scheduler().load(path_of(*e, "gpu0", "gpu1", PathType::kNvswitch));
  const PathCredits& hot_credits = p.credits_for(PathType::kNvswitch);
  EXPECT_EQ(hot.max_inflight_slices, hot_credits.lanes * hot_credits.slices_per_lane);  // the limit was reached
  EXPECT_EQ(completed, 3u * 16 * 32 * kMiB + 300u * 256 * kKiB);
}

TEST(Scheduler, DeadPathIsSkippedAndAFaultMidFlightLosesNothing) {
  // Dead before submit: the request never touches NVLink.
  {
    auto e = make_engine("nvlink-pairs");
    const PathId nvlink = path_of(*e, "gpu0", "gpu1", PathType::kNvlink);
    const PathId p2p = path_of(*e, "gpu0", "gpu1", PathType::kPcieP2p);
    ASSERT_TRUE(e->sim_transport().set_path_down(nvlink, true, 0).is_ok());
    const RequestId id = e->submit({"gpu0", "gpu1", 8 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
    ASSERT_TRUE(e->run_until_idle().is_ok());
    EXPECT_EQ(status_of(*e, id).state, RequestState::kCompleted);
    EXPECT_EQ(e->scheduler().load(nvlink).bytes_completed, 0u);
    EXPECT_EQ(e->scheduler().load(p2p).bytes_completed, 8 * kMiB);
  }
  // Dies mid-flight: what was on it is re-sent on the fallback, exactly once.
  {
    transport::SimConfig sim;
    auto probe = make_engine("nvlink-pairs");
    const PathId nvlink = path_of(*probe, "gpu0", "gpu1", PathType::kNvlink);
    sim.faults = {{nvlink, 100'000, 0}};
    auto e = make_engine("nvlink-pairs", SchedPolicy::defaults(), sim);
    const RequestId id = e->submit({"gpu0", "gpu1", 64 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
    ASSERT_TRUE(e->run_until_idle().is_ok());
    const RequestStatus s = status_of(*e, id);
    EXPECT_EQ(s.state, RequestState::kCompleted);
    EXPECT_EQ(s.bytes_done, 64 * kMiB);
    const std::uint64_t on_nvlink = e->scheduler().load(nvlink).bytes_completed;
    EXPECT_GT(on_nvlink, 0u);
    EXPECT_LT(on_nvlink, 64 * kMiB);
    EXPECT_EQ(e->sim_transport().bytes_delivered(), 64 * kMiB);
    EXPECT_GT(e->stats().slices_retried, 0u);
  }
  // Every path down: the request fails with unavailable instead of hanging.
  {
    auto e = make_engine("nvlink-pairs");
    for (PathId i = 0; i < e->sim_transport().paths().size(); ++i) {
      ASSERT_TRUE(e->sim_transport().set_path_down(i, true, 0).is_ok());
    }
    const RequestId id = e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
    ASSERT_TRUE(e->run_until_idle().is_ok());
    EXPECT_EQ(status_of(*e, id).state, RequestState::kFailed);
    EXPECT_EQ(status_of(*e, id).status.code(), StatusCode::kUnavailable);
  }
}

TEST(Scheduler, ProgressReportsDeliveredAndPostedRangesAtTheRequestsAddress) {
  transport::SimConfig sim;
  sim.record_deliveries = true;
  auto e = make_engine("nvswitch8", SchedPolicy::defaults(), sim);
  TransferRequest r{"gpu0", "gpu1", 8 * kMiB};
  r.remote_addr = 1ULL << 40;
  const RequestId id = e->submit(r).value();
  ASSERT_TRUE(e->run_until(1'000).is_ok());  // part way: some slices landed, some posted
  auto mid = e->progress(id);
  ASSERT_TRUE(mid.has_value());
  EXPECT_FALSE(mid->posted.empty());
  ASSERT_TRUE(e->run_until_idle().is_ok());
  auto done = e->progress(id);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->delivered, (std::vector<ByteRange>{{0, 8 * kMiB}}));
  EXPECT_TRUE(done->posted.empty());
  // Every slice carried the request's address plus its offset.
  std::uint64_t bytes = 0;
  for (const transport::SimDelivery& d : e->sim_transport().deliveries()) {
    EXPECT_GE(d.remote_addr, r.remote_addr);
    EXPECT_LE(d.remote_addr + d.bytes, r.remote_addr + 8 * kMiB);
    bytes += d.bytes;
  }
  EXPECT_EQ(bytes, 8 * kMiB);
  EXPECT_EQ(e->progress(9999).error().code(), StatusCode::kNotFound);
}

// Slices of a failed request that land anyway are still reported delivered.
TEST(Scheduler, ProgressOfAFailedRequestNamesWhatLandedBeforeTheFault) {
  auto e = make_engine("nvswitch8");
  const RequestId id = e->submit({"gpu0", "gpu1", 64 * kMiB}).value();
  ASSERT_TRUE(e->run_until(50'000).is_ok());
  const auto& paths = e->sim_transport().paths();
  for (PathId p = 0; p < paths.size(); ++p) {
    if (paths[p].from == "gpu0" && paths[p].to == "gpu1") {
      ASSERT_TRUE(e->sim_transport().set_path_down(p, true, e->now_ns()).is_ok());
    }
  }
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const RequestStatus s = status_of(*e, id);
  EXPECT_EQ(s.state, RequestState::kFailed);
  const auto p = e->progress(id).value();
  EXPECT_TRUE(p.posted.empty());
  std::uint64_t delivered = 0;
  for (const ByteRange& r : p.delivered) delivered += r.length;
  EXPECT_EQ(delivered, s.bytes_done);
  EXPECT_GT(delivered, 0u);
  EXPECT_LT(delivered, 64 * kMiB);
}

TEST(Scheduler, SpillsToTheFallbackOnlyWhenWaitingWouldMissTheDeadline) {
  auto run = [](TimeNs relative_deadline) {
    auto e = make_engine("nvlink-pairs");
    // Fill NVLink's credits with bulk work, then ask for a hot_kv transfer
    // (a class that may not preempt) with a deadline.
    EXPECT_TRUE(e->submit({"gpu0", "gpu1", 256 * kMiB, QosClass::kPrefillBulk, 0, true}).has_value());
    EXPECT_TRUE(e->run_until(10'000).is_ok());
    const RequestId hot =
        e->submit({"gpu0", "gpu1", 64 * kKiB, QosClass::kHotKv, 10'000 + relative_deadline, true}).value();
    EXPECT_TRUE(e->run_until_idle().is_ok());
    return status_of(*e, hot);
  };
  const RequestStatus tight = run(30'000);  // NVLink backlog: ~80 us; PCIe alone: ~6 us
  EXPECT_GE(tight.slices_spilled, 1u);
  EXPECT_FALSE(tight.deadline_missed());
  const RequestStatus loose = run(10'000'000);
  EXPECT_EQ(loose.slices_spilled, 0u);
  EXPECT_FALSE(loose.deadline_missed());
  const RequestStatus hopeless = run(1'000);  // nothing meets 1 us: no pointless spill
  EXPECT_EQ(hopeless.slices_spilled, 0u);
  EXPECT_TRUE(hopeless.deadline_missed());
}

TEST(Scheduler, CancelStopsARequestAndReturnsItsCredits) {
  auto e = make_engine("pcie4");
  const RequestId big = e->submit({"gpu0", "gpu1", 512 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
  ASSERT_TRUE(e->run_until(100'000).is_ok());
  ASSERT_TRUE(e->cancel(big).is_ok());
  const RequestStatus s = status_of(*e, big);
  EXPECT_EQ(s.state, RequestState::kCancelled);
  EXPECT_EQ(s.status.code(), StatusCode::kCancelled);
  EXPECT_LT(s.bytes_done, 512 * kMiB);
  EXPECT_EQ(e->cancel(big).code(), StatusCode::kInvalidArgument);  // twice
  EXPECT_EQ(e->cancel(999).code(), StatusCode::kNotFound);
  const RequestId next = e->submit({"gpu0", "gpu1", 1 * kMiB, QosClass::kPrefillBulk, 0, true}).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, next).state, RequestState::kCompleted);
  const PathId p2p = path_of(*e, "gpu0", "gpu1", PathType::kPcieP2p);
  EXPECT_EQ(e->scheduler().load(p2p).inflight_slices, 0);
}

TEST(Scheduler, EngineRefusesBadRequests) {
  auto e = make_engine("nvswitch8");
  EXPECT_EQ(e->submit({"gpu0", "gpu1", 0, QosClass::kHotKv, 0, true}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->submit({"gpu0", "gpu0", 1, QosClass::kHotKv, 0, true}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->submit({"gpu0", "gpu9", 1, QosClass::kHotKv, 0, true}).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(e->submit({"nic0", "nic1", 1, QosClass::kHotKv, 0, true}).error().code(), StatusCode::kInvalidArgument);
  // The scheduler indexes its class table with the class: one past it read beyond.
  EXPECT_EQ(e->submit({"gpu0", "gpu1", 1, static_cast<QosClass>(kQosClassCount), 0, true}).error().code(),
            StatusCode::kInvalidArgument);
  TransferRequest bad_op{"gpu0", "gpu1", 1, QosClass::kHotKv, 0, true};
  bad_op.op = static_cast<transport::Op>(7);
  EXPECT_EQ(e->submit(bad_op).error().code(), StatusCode::kInvalidArgument);
  const std::vector<TransferRequest> batch{{"gpu0", "gpu1", 1, QosClass::kHotKv, 0, true},
                                           {"gpu0", "nowhere", 1, QosClass::kHotKv, 0, true}};
  const auto r = e->submit(batch);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("request 1"), std::string::npos);
  EXPECT_EQ(e->submit(std::span<const TransferRequest>{}).error().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(e->stats().slices_posted, 0u);  // the good half of the batch was not sent either
  EXPECT_EQ(e->run_until(e->now_ns() - 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(e->status(12345).error().code(), StatusCode::kNotFound);

  HarnessConfig bad;
  bad.topology_model = "dgx9000";
  EXPECT_EQ(Harness::create(bad).error().code(), StatusCode::kNotFound);
  bad = {};
  bad.policy.w_aging = -1;
  EXPECT_EQ(Harness::create(bad).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::sched

namespace baton::sched {
namespace {

void drain(Scheduler& s, GrowingTransport& t, TimeNs now) {
  for (int round = 0; round < 1000; ++round) {
    s.dispatch(now);
    std::vector<transport::Completion> done;
    t.poll(now, done);
    if (done.empty()) return;
    for (const auto& c : done) s.on_completion(c, now);
  }
}

// posted_slices counts what progress() lists as posted: while slices are on
// the wire, once they fail and are sent again, and once they land.
TEST(Scheduler, PostedSlicesCountsWhatProgressListsAsPosted) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  ASSERT_TRUE(s->submit(1, {"127.0.0.1:5000", "127.0.0.1:6000", 8 * kMiB, QosClass::kHotKv, 0, true}, 0).is_ok());
  EXPECT_EQ(s->posted_slices(1), 0u);  // queued
  transport.hold(true);
  s->dispatch(0);
  ASSERT_GT(transport.held(), 0u);
  EXPECT_EQ(s->posted_slices(1), transport.held());
  EXPECT_EQ(s->posted_slices(1), s->progress(1)->posted.size());
  transport.fail_held();  // each failed slice is re-queued: none posted
  std::vector<transport::Completion> failed;
  transport.poll(0, failed);
  for (const auto& c : failed) (void)s->on_completion(c, 0);
  EXPECT_EQ(s->posted_slices(1), 0u);
  EXPECT_TRUE(s->progress(1)->posted.empty());
  transport.hold(false);
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(1)->state, RequestState::kCompleted);
  EXPECT_EQ(s->posted_slices(1), 0u);
  EXPECT_EQ(s->posted_slices(99), 0u);  // not held
}

TEST(Scheduler, RoutesPeersOnTransportPathsThatAppearWhileRunning) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  const TransferRequest to_peer{"127.0.0.1:5000", "127.0.0.1:6000", 1 * kMiB, QosClass::kHotKv, 0, true};
  // No path to the peer yet: refused at once, not queued forever.
  EXPECT_EQ(s->submit(1, to_peer, 0).code(), StatusCode::kNotFound);

  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  ASSERT_TRUE(s->submit(2, to_peer, 0).is_ok());
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(2)->state, RequestState::kCompleted);
  EXPECT_EQ(s->load(0).bytes_completed, 1 * kMiB);

  // A faster path to the same peer connects: new work takes it first.
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kShm, 2, 12.0, 1.0});
  ASSERT_TRUE(s->submit(3, to_peer, 0).is_ok());
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(3)->state, RequestState::kCompleted);
  EXPECT_EQ(s->load(1).bytes_completed, 1 * kMiB);
  EXPECT_EQ(s->route("127.0.0.1:5000", "127.0.0.1:6000", 0).value(), 1u);
  // Topology endpoints are not confused with peers.
  EXPECT_EQ(s->submit(4, {"gpu0", "nic9", 1, QosClass::kHotKv, 0, true}, 0).code(), StatusCode::kNotFound);
}

// A failed path's id given to a path to another peer: what was still
// queued on it for the old peer fails (it would have gone to the newcomer),
// the old peer's chain is gone, and the newcomer's requests take the path.
TEST(Scheduler, APathIdTakenByAnotherPeerCarriesNothingQueuedForTheOldOne) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  const TransferRequest to_old{"127.0.0.1:5000", "127.0.0.1:6000", 1 * kMiB, QosClass::kHotKv, 0, true};
  const TransferRequest to_new{"127.0.0.1:5000", "127.0.0.1:7000", 1 * kMiB, QosClass::kHotKv, 0, true};
  ASSERT_TRUE(s->submit(1, to_old, 0).is_ok());  // queued: no dispatch yet
  EXPECT_EQ(s->submit(2, to_new, 0).code(), StatusCode::kNotFound);
  transport.set_healthy(0, false);
  transport.reincarnate(0, {"127.0.0.1:5000", "127.0.0.1:7000", PathType::kTcp, 2, 3.0, 30.0});
  transport.set_healthy(0, true);  // the newcomer is up before the scheduler looked again
  ASSERT_TRUE(s->submit(3, to_new, 0).is_ok());
  EXPECT_EQ(s->status(1)->state, RequestState::kFailed);
  EXPECT_EQ(s->status(1)->status.code(), StatusCode::kUnavailable);
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(3)->state, RequestState::kCompleted);
  EXPECT_EQ(s->load(0).bytes_completed, 1 * kMiB);  // request 3's alone
  EXPECT_EQ(s->route("127.0.0.1:5000", "127.0.0.1:7000", 0).value(), 0u);
  // The old peer's chain is empty now: unavailable, as for any gone peer.
  EXPECT_EQ(s->route("127.0.0.1:5000", "127.0.0.1:6000", 0).error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(s->submit(4, to_old, 0).code(), StatusCode::kUnavailable);
}

// One path id taken by peer after peer: the chains of the peers gone stay
// (they answer unavailable) for the last 1024 of them, then go.
TEST(Scheduler, ChainsOfPeersGoneAreForgottenBeyondTheLast1024) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  auto peer = [](int i) { return fmt::format("127.0.0.1:{}", 10000 + i); };
  transport.add({"127.0.0.1:5000", peer(0), PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  constexpr int kPeers = 1100;
  for (int i = 0; i < kPeers; ++i) {
    if (i > 0) transport.reincarnate(0, {"127.0.0.1:5000", peer(i), PathType::kTcp, 2, 3.0, 30.0});
    ASSERT_EQ(s->route("127.0.0.1:5000", peer(i), 0).value(), 0u) << i;
  }
  EXPECT_EQ(s->route("127.0.0.1:5000", peer(0), 0).error().code(), StatusCode::kNotFound);
  // Peers 0 .. kPeers-2 went (the last one holds the path): the oldest of them forgotten.
  EXPECT_EQ(s->route("127.0.0.1:5000", peer(kPeers - 2 - 1024), 0).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->route("127.0.0.1:5000", peer(kPeers - 1 - 1024), 0).error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(s->route("127.0.0.1:5000", peer(kPeers - 2), 0).error().code(), StatusCode::kUnavailable);
}

// The same with a request of the old peer still on the wire when its path's
// id goes to the newcomer (a slice a GPU copy held back): it keeps its
// chain, and when its slices fail it fails too, never re-sent on the id.
TEST(Scheduler, ARequestInFlightWhenItsPathIdIsTakenFailsAndIsNotResent) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  const TransferRequest to_old{"127.0.0.1:5000", "127.0.0.1:6000", 4 * kMiB, QosClass::kHotKv, 0, true};
  const TransferRequest to_new{"127.0.0.1:5000", "127.0.0.1:7000", 1 * kMiB, QosClass::kHotKv, 0, true};
  transport.hold(true);
  ASSERT_TRUE(s->submit(1, to_old, 0).is_ok());
  s->dispatch(0);
  const std::size_t posted = transport.held();
  ASSERT_GT(posted, 0u);
  transport.set_healthy(0, false);
  transport.reincarnate(0, {"127.0.0.1:5000", "127.0.0.1:7000", PathType::kTcp, 2, 3.0, 30.0});
  transport.set_healthy(0, true);
  transport.hold(false);
  ASSERT_TRUE(s->submit(2, to_new, 0).is_ok());
  transport.fail_held();
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(1)->state, RequestState::kFailed);
  EXPECT_EQ(s->status(1)->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s->status(1)->bytes_done, 0u);
  EXPECT_EQ(s->status(2)->state, RequestState::kCompleted);
  EXPECT_EQ(s->load(0).bytes_completed, 1 * kMiB);  // request 2's alone: nothing of 1 was sent again
  EXPECT_EQ(s->load(0).inflight_slices, 0);
}

// The bare scheduler's own entry points: it took a qos class past its table
// (read beyond it), an unknown op, a negative timeout, sizes whose sum
// wrapped its queued-byte count; load() of an unknown path threw; and a
// request abandoned with an ok reason ended failed with status ok.
TEST(Scheduler, ABareSchedulerRefusesBadRequestsItself) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  const TransferRequest good{"127.0.0.1:5000", "127.0.0.1:6000", kMiB, QosClass::kHotKv, 0, true};
  auto refused = [&](TransferRequest r, std::string_view why) {
    const Status st = s->submit(7, r, 0);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  TransferRequest r = good;
  r.qos = static_cast<QosClass>(200);
  refused(r, "qos class 200");
  r = good;
  r.op = static_cast<transport::Op>(9);
  refused(r, "op 9");
  r = good;
  r.timeout_ns = -5;
  refused(r, "timeout -5 ns");
  r = good;
  r.bytes = std::uint64_t{1} << 63;
  refused(r, "expected 1 .. 2^48");
  EXPECT_EQ(s->load(0).queued_bytes, 0u);
  EXPECT_EQ(s->load(999'999).inflight_slices, 0);  // an unknown path has no load
  ASSERT_TRUE(s->submit(8, good, 0).is_ok());
  EXPECT_EQ(s->abandon(8, Status::ok(), 0).code(), StatusCode::kInvalidArgument);
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(8)->state, RequestState::kCompleted);
  EXPECT_EQ(s->status(7).error().code(), StatusCode::kNotFound);  // nothing of the refused ones stayed
}

TEST(Scheduler, AWireRatioIsRefusedWhereTheTransportCannotCarryCompressedSlices) {
  // Its slices would arrive short and the request would still end ok.
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  GrowingTransport transport;  // carries_compressed_slices() is false
  transport.add({"127.0.0.1:5000", "127.0.0.1:6000", PathType::kTcp, 2, 3.0, 30.0});
  auto s = Scheduler::create(graph, SchedPolicy::defaults(), transport).value();
  ASSERT_TRUE(s->submit(1, {"127.0.0.1:5000", "127.0.0.1:6000", 1 * kMiB, QosClass::kHotKv, 0, true}, 0).is_ok());
  const Status refused = s->set_wire_ratio(1, 0.5);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("carries no compressed slices"), std::string::npos) << refused.message();
  EXPECT_TRUE(s->set_wire_ratio(1, 1.0).is_ok());  // uncompressed is always fine
  EXPECT_EQ(s->set_wire_ratio(1, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(transport.set_codec(nullptr).code(), StatusCode::kFailedPrecondition);
  drain(*s, transport, 0);
  EXPECT_EQ(s->status(1)->state, RequestState::kCompleted);
  EXPECT_EQ(s->stats().wire_bytes_completed, 1 * kMiB);
}

}  // namespace
}  // namespace baton::sched
