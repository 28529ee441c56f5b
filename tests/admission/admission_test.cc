// Admission through the Harness on the simulated transport: exact MLU, bands,
// the local-recompute signal, compression only when it pays, queue order and
// limits, and deadline 0 leaving the scheduler exactly as it was.
#include "baton/admission/admission.h"

#include <algorithm>

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "baton/engine/engine.h"
#include "baton/engine/harness.h"
#include "engine/completion_order.h"
#include "sched/growing_transport.h"
#include "baton/topology/probe.h"
#include "baton/transport/sim_transport.h"

namespace baton::admission {
namespace {

using transport::Codec;
using transport::CodecProfile;
using transport::make_lz4_codec;

using engine::Harness;
using sched::QosClass;
using sched::RequestId;
using sched::RequestState;
using sched::SchedPolicy;
using sched::TransferRequest;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr double kPcieGbps = 24.0;  // pcie4 gpu0->gpu1: PCIe P2P under one switch (cost model)

std::unique_ptr<Harness> make_engine(SchedPolicy policy = SchedPolicy::defaults(), const std::string& model = "pcie4") {
  engine::HarnessConfig config;
  config.topology_model = model;
  config.policy = policy;
  auto e = Harness::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return std::move(*e);
}

TransferRequest req(std::uint64_t bytes, TimeNs deadline, QosClass qos = QosClass::kHotKv) {
  return {"gpu0", "gpu1", bytes, qos, deadline, true};
}

sched::RequestStatus status_of(Harness& e, RequestId id) { return e.status(id).value(); }

TEST(Admission, MluIsExactOnConstructedCases) {
  auto e = make_engine();
  AdmissionController& a = e->admission();
  // Idle path: 1 MiB with 100 us left at 24 GB/s.
  EXPECT_DOUBLE_EQ(a.mlu(req(kMiB, 100'000), kMiB, 0), 1048576.0 / (100'000 * kPcieGbps));
  EXPECT_DOUBLE_EQ(a.mlu(req(kMiB, 0), kMiB, 0), 0.0);  // no deadline
  EXPECT_EQ(a.mlu(req(kMiB, 100), kMiB, 100), kMluUnbounded);  // no time left
  EXPECT_EQ(a.band_of(0.29), Band::kPlain);
  EXPECT_EQ(a.band_of(0.3), Band::kCompress);
  EXPECT_EQ(a.band_of(1.49), Band::kCompress);
  EXPECT_EQ(a.band_of(1.5), Band::kLocal);

  // Under FIFO everything posted or queued goes first.
  SchedPolicy fifo = SchedPolicy::defaults();
  fifo.kind = sched::PolicyKind::kBaselineFifo;
  auto f = make_engine(fifo);
  ASSERT_TRUE(f->submit(req(2 * kMiB, 0, QosClass::kPrefillBulk)).has_value());
  ASSERT_TRUE(f->run_until(0).is_ok());
  EXPECT_DOUBLE_EQ(f->admission().mlu(req(kMiB, 200'000), kMiB, 0),
                   1048576.0 / (200'000 * kPcieGbps - 2 * 1048576.0));
}

TEST(Admission, InfeasibleEndsWithStatusAndSignalNeverSilently) {
  auto e = make_engine();
  std::vector<RequestId> signalled;
  e->admission().set_local_recompute([&](RequestId id, const TransferRequest& r) {
    EXPECT_EQ(r.bytes, 8 * kMiB);
    signalled.push_back(id);
  });
  // 8 MiB in 100 us at 24 GB/s: MLU 3.5.
  const RequestId doomed = e->submit(req(8 * kMiB, 100'000)).value();
  const RequestId fine = e->submit(req(kMiB, 1'000'000)).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const auto s = status_of(*e, doomed);
  EXPECT_EQ(s.state, RequestState::kInfeasible);
  EXPECT_EQ(s.status.code(), StatusCode::kDeadlineInfeasible);
  EXPECT_NE(s.status.message().find("MLU"), std::string::npos);
  EXPECT_EQ(s.bytes_done, 0u);
  EXPECT_EQ(signalled, std::vector<RequestId>{doomed});
  EXPECT_EQ(status_of(*e, fine).state, RequestState::kCompleted);
  EXPECT_EQ(e->admission().stats().infeasible, 1u);
  EXPECT_EQ(e->sim_transport().bytes_delivered(), kMiB);  // nothing of the doomed one moved
  EXPECT_EQ(e->cancel(doomed).code(), StatusCode::kInvalidArgument);

  // No callback registered: the local band degrades to best effort.
  auto b = make_engine();
  const RequestId late = b->submit(req(8 * kMiB, 100'000)).value();
  ASSERT_TRUE(b->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*b, late).state, RequestState::kCompleted);
  EXPECT_TRUE(status_of(*b, late).deadline_missed());
  EXPECT_EQ(b->admission().stats().infeasible, 0u);
}

TEST(Admission, CompressesOnlyWhenItPays) {
  auto run = [](CodecProfile profile) {
    auto e = make_engine();
    EXPECT_TRUE(e->admission().set_codec(std::shared_ptr<const Codec>(make_lz4_codec()), profile).is_ok());
    // MLU ~0.87: the compress band.
    const RequestId id = e->submit(req(4 * kMiB, 200'000)).value();
    EXPECT_TRUE(e->run_until_idle().is_ok());
    EXPECT_EQ(status_of(*e, id).state, RequestState::kCompleted);
    EXPECT_EQ(status_of(*e, id).bytes_done, 4 * kMiB);  // payload bytes all delivered
    EXPECT_EQ(e->sim_transport().bytes_delivered(), 4 * kMiB);
    return std::pair(e->admission().stats().compressed, e->sim_transport().wire_bytes_delivered());
  };
  // A codec far faster than the path, 4:1: the wire carries ~30% of the bytes.
  const auto [fast_compressed, fast_wire] = run({4.0, 1000.0, 1000.0});
  EXPECT_EQ(fast_compressed, 1u);
  EXPECT_LT(fast_wire, 4 * kMiB / 3);
  // A realistic single-core codec at 2 GB/s on a 24 GB/s path loses: raw bytes.
  const auto [slow_compressed, slow_wire] = run({4.0, 2.0, 4.0});
  EXPECT_EQ(slow_compressed, 0u);
  EXPECT_EQ(slow_wire, 4 * kMiB);
}

// A codec UCX cannot name on the wire (only lz4 and zstd travel).
class Rot13 : public Codec {
 public:
  std::string_view name() const override { return "rot13"; }
  Result<bool> compress(std::span<const std::byte>, std::vector<std::byte>& out) const override {
    out.clear();
    return false;
  }
  Status decompress(std::span<const std::byte>, std::span<std::byte>) const override { return Status::ok(); }
};

TEST(Admission, BadCodecsAreRefusedWithAClearStatus) {
  auto sim = make_engine();
  const std::shared_ptr<const Codec> lz4(make_lz4_codec());
  EXPECT_EQ(sim->admission().set_codec(nullptr, {2.0, 1.0, 1.0}).code(), StatusCode::kInvalidArgument);
  for (CodecProfile bad : {CodecProfile{0.5, 1, 1}, CodecProfile{2, 0, 1}, CodecProfile{2, 1, -1},
                           CodecProfile{std::nan(""), 1, 1}}) {
    const Status s = sim->admission().set_codec(lz4, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("set_codec: profile"), std::string::npos) << s.message();
  }
  // UCX carries lz4 and zstd slices, and refuses a codec it cannot name.
  auto real = engine::Engine::create(engine::EngineConfig{});
  ASSERT_TRUE(real.has_value()) << real.error().to_string();
  EXPECT_TRUE((*real)->admission().set_codec(lz4, {4.0, 1000.0, 1000.0}).is_ok());
  const Status s = (*real)->admission().set_codec(std::make_shared<Rot13>(), {4.0, 1000.0, 1000.0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rot13"), std::string::npos) << s.message();
}

TEST(Admission, ARunningRequestsOwnPostedBytesAreNotCountedTwice) {
  // 8 MiB alone on a 24 GB/s path (~350 µs) due in 380 µs: feasible all the
  // way. Its posted slices (up to 1 MiB) are both in its remainder and on the wire;
  // counting them twice read it as MLU > 1.5 near the end and
  // dropped a transfer that was going to make it.
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.reevaluate_slices = 1;
  auto e = make_engine(p);
  int signalled = 0;
  e->admission().set_local_recompute([&](RequestId, const TransferRequest&) { ++signalled; });
  const RequestId id = e->submit(req(8 * kMiB, 380'000)).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, id).state, RequestState::kCompleted);
  EXPECT_FALSE(status_of(*e, id).deadline_missed());
  EXPECT_EQ(signalled, 0);
  EXPECT_GT(e->admission().stats().reevaluations, 10u);
}

TEST(Admission, ReevaluationPromotesMidTransfer) {
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.reevaluate_slices = 2;
  auto e = make_engine(p);
  std::vector<RequestId> signalled;
  e->admission().set_local_recompute([&](RequestId id, const TransferRequest&) { signalled.push_back(id); });
  // 16 MiB due in 3 ms: MLU 0.23 at submit, plain.
  const RequestId bulk = e->submit(req(16 * kMiB, 3'000'000, QosClass::kPrefillBulk)).value();
  ASSERT_TRUE(e->run_until(100'000).is_ok());
  EXPECT_EQ(status_of(*e, bulk).state, RequestState::kRunning);
  // Critical traffic takes the path: the bulk transfer stalls and its MLU climbs.
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(e->submit(req(kMiB, 0, QosClass::kDecodeCritical)).has_value());
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const auto s = status_of(*e, bulk);
  EXPECT_EQ(s.state, RequestState::kInfeasible);
  EXPECT_GT(s.bytes_done, 0u);
  EXPECT_LT(s.bytes_done, 16 * kMiB);
  EXPECT_EQ(signalled, std::vector<RequestId>{bulk});
  EXPECT_GE(e->admission().stats().promotions, 1u);
  EXPECT_GE(e->admission().stats().reevaluations, 1u);
}

using baton::testing::completion_order;

TEST(Admission, EdfOrdersWaitingOwnersFifoKeepsArrival) {
  for (auto order : {sched::AdmissionOrder::kFifo, sched::AdmissionOrder::kEdf}) {
    SchedPolicy p = SchedPolicy::defaults();
    p.admission.max_owners = 1;
    p.admission.order = order;
    auto e = make_engine(p);
    const RequestId blocker = e->submit(req(kMiB, 0)).value();
    const RequestId late = e->submit(req(kMiB, 90'000'000)).value();
    const RequestId soon = e->submit(req(kMiB, 30'000'000)).value();
    const RequestId none = e->submit(req(kMiB, 0)).value();
    const RequestId middle = e->submit(req(kMiB, 60'000'000)).value();
    ASSERT_TRUE(e->run_until_idle().is_ok());
    const auto order_seen = completion_order(*e, {blocker, late, soon, none, middle});
    if (order == sched::AdmissionOrder::kEdf) {
      EXPECT_EQ(order_seen, (std::vector<RequestId>{blocker, soon, middle, late, none}));
    } else {
      EXPECT_EQ(order_seen, (std::vector<RequestId>{blocker, late, soon, none, middle}));
    }
  }
}

TEST(Admission, CapacityLimitsAndNoHeadOfLineBlocking) {
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.max_inflight_bytes = 4 * kMiB;
  auto e = make_engine(p);
  const RequestId a = e->submit(req(3 * kMiB, 0)).value();
  const RequestId big = e->submit(req(3 * kMiB, 0)).value();    // does not fit beside a
  const RequestId small = e->submit(req(1 * kMiB, 0)).value();  // does: must not wait behind big
  ASSERT_TRUE(e->run_until(1'000).is_ok());
  EXPECT_EQ(status_of(*e, a).state, RequestState::kRunning);
  EXPECT_EQ(e->admission().waiting(), 1u);  // only big waits for capacity
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(completion_order(*e, {a, big, small}), (std::vector<RequestId>{a, small, big}));

  SchedPolicy q = SchedPolicy::defaults();
  q.admission.max_owners = 2;
  auto f = make_engine(q);
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(f->submit(req(kMiB, 0)).value());
  ASSERT_TRUE(f->run_until(1'000).is_ok());
  EXPECT_EQ(f->admission().waiting(), 4u);  // two admitted, four wait
  // A waiting owner can be cancelled; it never reaches the transport.
  ASSERT_TRUE(f->cancel(ids[5]).is_ok());
  EXPECT_EQ(status_of(*f, ids[5]).state, RequestState::kCancelled);
  ASSERT_TRUE(f->run_until_idle().is_ok());
  EXPECT_EQ(f->sim_transport().bytes_delivered(), 5 * kMiB);
}

TEST(Admission, DropInfeasibleWaitingOwners) {
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.max_owners = 1;
  p.admission.drop_infeasible = true;
  auto e = make_engine(p);
  const RequestId blocker = e->submit(req(16 * kMiB, 0)).value();  // ~700 us on the path
  // Feasible alone (MLU 0.44) but not once it has waited behind the blocker.
  const RequestId waits = e->submit(req(kMiB, 100'000)).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, blocker).state, RequestState::kCompleted);
  EXPECT_EQ(status_of(*e, waits).state, RequestState::kInfeasible);  // said so, not silently dropped
  EXPECT_EQ(e->admission().stats().dropped, 1u);
  EXPECT_EQ(e->sim_transport().bytes_delivered(), 16 * kMiB);
}

// An owner whose every path is down when it arrives waits on no path: it
// was recorded on path 0, and its bytes counted ahead of every request
// there, inflating their MLU.
TEST(Admission, AnOwnerWithoutARouteWaitsOnNoPath) {
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.max_owners = 1;
  auto e = make_engine(p);
  const auto& paths = e->sim_transport().paths();
  ASSERT_FALSE(paths.empty());
  const std::string from = paths[0].from;
  const std::string to = paths[0].to;
  // Capacity held by a request without a deadline on path 0's pair: nothing
  // of it is due before the probe's deadline.
  ASSERT_TRUE(e->submit({from, to, 64 * kMiB, QosClass::kPrefillBulk, 0, true}).has_value());
  ASSERT_TRUE(e->run_until(0).is_ok());  // its first slices posted: the path's credits are full
  const TransferRequest probe{from, to, kMiB, QosClass::kHotKv, 10'000'000, true};
  const double before = e->admission().mlu(probe, kMiB, 0);
  // Another pair, every path of it down.
  std::string other_from;
  std::string other_to;
  for (const auto& info : paths) {
    if (info.from != from && info.from != to && info.to != from && info.to != to) {
      other_from = info.from;
      other_to = info.to;
      break;
    }
  }
  ASSERT_FALSE(other_from.empty());
  for (transport::PathId id = 0; id < paths.size(); ++id) {
    if (paths[id].from == other_from && paths[id].to == other_to) {
      ASSERT_NE(id, 0u);
      ASSERT_TRUE(e->sim_transport().set_path_down(id, true, 0).is_ok());
    }
  }
  const RequestId unrouted =
      e->submit({other_from, other_to, 32 * kMiB, QosClass::kHotKv, 5'000'000, true}).value();
  EXPECT_EQ(status_of(*e, unrouted).state, RequestState::kQueued);  // waiting for capacity
  EXPECT_DOUBLE_EQ(e->admission().mlu(probe, kMiB, 0), before);
}

// Deadline 0 must leave the scheduler exactly as it was without admission:
// the same run, driven by hand on a bare scheduler, gives the same times.
TEST(Admission, DeadlineZeroIsExactlyTheBareScheduler) {
  std::vector<TransferRequest> work;
  for (int i = 0; i < 40; ++i) {
    work.push_back({"gpu0", i % 3 == 0 ? "gpu2" : "gpu1", (1 + static_cast<std::uint64_t>(i % 5)) * 700 * kKiB,
                    static_cast<QosClass>(i % 4), 0, true});
  }
  auto e = make_engine();
  std::vector<RequestId> ids;
  for (std::size_t i = 0; i < work.size(); ++i) {
    ASSERT_TRUE(e->run_until(static_cast<TimeNs>(i) * 20'000).is_ok());
    ids.push_back(e->submit(work[i]).value());
  }
  ASSERT_TRUE(e->run_until_idle().is_ok());

  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  const SchedPolicy policy = SchedPolicy::defaults();
  auto transport =
      transport::SimTransport::from_topology(graph, [&](topology::PathType t) { return policy.credits_for(t).lanes; })
          .value();
  auto bare = sched::Scheduler::create(graph, policy, *transport).value();
  TimeNs now = 0;
  std::vector<transport::Completion> done;
  auto advance = [&](TimeNs until) {
    while (true) {
      done.clear();
      transport->poll(now, done);
      for (const auto& c : done) bare->on_completion(c, now);
      bare->dispatch(now);
      const auto next = transport->next_event_ns();
      if (!next || *next > until) break;
      now = *next;
    }
    now = std::max(now, until);
  };
  for (std::size_t i = 0; i < work.size(); ++i) {
    advance(static_cast<TimeNs>(i) * 20'000);
    ASSERT_TRUE(bare->submit(1000 + i, work[i], now).is_ok());
  }
  advance(std::numeric_limits<TimeNs>::max() / 2);
  for (std::size_t i = 0; i < work.size(); ++i) {
    EXPECT_EQ(status_of(*e, ids[i]).completed_ns, bare->status(1000 + i)->completed_ns) << i;
  }
}

}  // namespace
}  // namespace baton::admission

namespace baton::admission {
namespace {

TEST(Admission, MetricsTextCountsWhatHappened) {
  auto e = make_engine();
  e->admission().set_local_recompute([](RequestId, const TransferRequest&) {});
  ASSERT_TRUE(e->submit(req(8 * kMiB, 100'000)).has_value());   // infeasible
  ASSERT_TRUE(e->submit(req(kMiB, 1'000'000)).has_value());      // fine
  ASSERT_TRUE(e->submit(req(kMiB, 0)).has_value());              // no deadline: no MLU
  ASSERT_TRUE(e->run_until_idle().is_ok());
  const std::string text = e->metrics_text();
  EXPECT_NE(text.find("baton_admission_infeasible_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("baton_admission_signalled_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("baton_admission_admitted_total 2\n"), std::string::npos);
  EXPECT_NE(text.find("baton_admission_mlu_permille_count{op=\"write\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE baton_admission_mlu_permille histogram"), std::string::npos);
  // Exporting twice does not double the counters.
  EXPECT_NE(e->metrics_text().find("baton_admission_admitted_total 2\n"), std::string::npos);
}

// What a request itself gets wrong is refused at admission's submit, not
// later when the scheduler takes it: a waiting owner is counted first.
TEST(Admission, RefusesBadRequestsAtSubmitAsTheSchedulerDoes) {
  auto e = make_engine();
  auto refused = [&](TransferRequest r, std::string_view why) {
    const Status a = e->admission().submit(900, r, e->now_ns());
    EXPECT_EQ(a.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(a.message().find(why), std::string::npos) << a.message();
  };
  TransferRequest r = req(kMiB, 0);
  r.qos = static_cast<QosClass>(200);  // indexed the class table past its end
  refused(r, "qos class 200");
  r = req(kMiB, 0);
  r.op = static_cast<transport::Op>(9);
  refused(r, "op 9");
  r = req(kMiB, 0);
  r.timeout_ns = -5;  // the bare scheduler took it
  refused(r, "timeout -5 ns");
  refused(req(TransferRequest::kMaxBytes + 1, 0), "expected 1 .. 2^48");  // two of 2^63 summed to 0 queued
  refused(req(0, 0), "has 0 bytes");
  // The harness refuses a request above 1 TiB as it is submitted: its
  // simulated transfer time overflowed the clock.
  const auto huge = e->submit(req(std::uint64_t{1} << 41, 0));
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.error().message().find("at most 1 TiB"), std::string::npos) << huge.error().to_string();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(e->admission().stats().admitted, 0u);
  EXPECT_EQ(e->sim_transport().bytes_delivered(), 0u);
}

// Times at the ends of the clock: a deadline of INT64_MIN is long past (its
// distance wrapped to "far ahead", and it was admitted), and a
// reevaluation interval of INT64_MAX is never (the timer wrapped into the
// past and the loop re-ran it forever).
TEST(Admission, TimesAtTheEndsOfTheClockSaturate) {
  {
    auto e = make_engine();
    ASSERT_TRUE(e->run_until(1'000'000).is_ok());
    EXPECT_EQ(e->admission().mlu(req(kMiB, std::numeric_limits<TimeNs>::min()), kMiB, 1'000'000), kMluUnbounded);
    std::vector<RequestId> signalled;
    e->admission().set_local_recompute([&](RequestId id, const TransferRequest&) { signalled.push_back(id); });
    const RequestId id = e->submit(req(kMiB, std::numeric_limits<TimeNs>::min())).value();
    ASSERT_TRUE(e->run_until_idle().is_ok());
    EXPECT_EQ(status_of(*e, id).state, RequestState::kInfeasible);
    EXPECT_EQ(signalled, std::vector<RequestId>{id});
    EXPECT_EQ(e->sim_transport().bytes_delivered(), 0u);
  }
  SchedPolicy p = SchedPolicy::defaults();
  p.admission.reevaluate_interval_ns = std::numeric_limits<TimeNs>::max();
  p.admission.max_owners = 1;
  p.admission.drop_infeasible = true;  // its scan is timed by the same interval
  auto e = make_engine(p);
  e->admission().set_local_recompute([](RequestId, const TransferRequest&) {});
  const RequestId first = e->submit(req(4 * kMiB, 3'000'000)).value();
  const RequestId second = e->submit(req(kMiB, 3'000'000)).value();
  ASSERT_TRUE(e->run_until_idle().is_ok());
  EXPECT_EQ(status_of(*e, first).state, RequestState::kCompleted);
  EXPECT_EQ(status_of(*e, second).state, RequestState::kCompleted);
  EXPECT_EQ(e->sim_transport().bytes_delivered(), 5 * kMiB);
}

// A path's id taken by a new path (another peer): what was measured on the
// old one no longer holds, so the estimate starts again from the seed.
TEST(BandwidthEstimator, APathsNewIncarnationStartsFromItsSeed) {
  std::vector<transport::PathInfo> paths{{"a", "b", topology::PathType::kTcp, 2, 3.0, 30.0}};
  auto e = BandwidthEstimator::create(paths, 0.5).value();
  constexpr TimeNs kWindow = BandwidthEstimator::kMinWindowNs;
  e.on_completion(0, 1000, 0, true);              // opens the window
  e.on_completion(0, 10 * kWindow, kWindow, true);  // 10 bytes per ns
  ASSERT_TRUE(e.measured(0));
  EXPECT_DOUBLE_EQ(e.estimate_gbps(0), 10.0);
  e.sync(paths);  // the same path: it keeps what it measured
  EXPECT_DOUBLE_EQ(e.estimate_gbps(0), 10.0);
  paths[0] = {"a", "c", topology::PathType::kTcp, 2, 3.0, 30.0, 1};
  e.sync(paths);
  EXPECT_FALSE(e.measured(0));
  EXPECT_DOUBLE_EQ(e.estimate_gbps(0), 3.0);
}

// A scheduler and admission over one TCP path between two peers, with room
// for one admitted owner: a second request waits.
struct OneOwnerRig {
  topology::TopologyGraph graph =
      topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  sched::GrowingTransport transport;
  std::unique_ptr<sched::Scheduler> s;
  std::unique_ptr<AdmissionController> a;

  OneOwnerRig() {
    transport.add({"127.0.0.1:5000", "127.0.0.1:6000", topology::PathType::kTcp, 2, 3.0, 30.0});
    SchedPolicy p = SchedPolicy::defaults();
    p.admission.max_owners = 1;
    s = sched::Scheduler::create(graph, p, transport).value();
    a = AdmissionController::create(p, *s, transport).value();
    s->set_finish_hook([this](RequestId id) { a->on_finish(id); });
  }
};

// A path's id taken by another peer: owners of the old peer still waiting
// for capacity no longer count ahead of the newcomer's deadline requests
// (they fail unavailable once admitted); the newcomer's own waiting owners do.
TEST(Admission, OwnersOfAPeerWhosePathIdWasTakenDoNotCountAheadOfTheNewcomer) {
  OneOwnerRig rig;
  sched::GrowingTransport& transport = rig.transport;
  AdmissionController* a = rig.a.get();
  const TransferRequest to_old{"127.0.0.1:5000", "127.0.0.1:6000", kMiB, QosClass::kHotKv, 0, true};
  TransferRequest old_waiting = to_old;
  old_waiting.bytes = 8 * kMiB;
  old_waiting.deadline_ns = 10'000'000;
  ASSERT_TRUE(a->submit(1, to_old, 0).is_ok());        // admitted: takes the one owner slot
  ASSERT_TRUE(a->submit(2, old_waiting, 0).is_ok());  // waits
  ASSERT_EQ(a->waiting(), 1u);
  constexpr double kLeftBytes = 20'000'000 * 3.0;  // 20 ms at the path's 3 GB/s
  TransferRequest probe = to_old;
  probe.deadline_ns = 20'000'000;
  EXPECT_DOUBLE_EQ(a->mlu(probe, kMiB, 0), kMiB / (kLeftBytes - 8 * kMiB));  // request 2 goes first

  transport.set_healthy(0, false);
  transport.reincarnate(0, {"127.0.0.1:5000", "127.0.0.1:7000", topology::PathType::kTcp, 2, 3.0, 30.0});
  transport.set_healthy(0, true);
  probe.to = "127.0.0.1:7000";
  EXPECT_DOUBLE_EQ(a->mlu(probe, kMiB, 0), kMiB / kLeftBytes);
  TransferRequest new_waiting = old_waiting;
  new_waiting.to = probe.to;
  new_waiting.bytes = 2 * kMiB;
  ASSERT_TRUE(a->submit(3, new_waiting, 0).is_ok());
  ASSERT_EQ(a->waiting(), 2u);
  EXPECT_DOUBLE_EQ(a->mlu(probe, kMiB, 0), kMiB / (kLeftBytes - 2 * kMiB));

  a->tick(0);  // request 1 failed with its path: 2 is admitted and fails, then 3
  EXPECT_EQ(a->status(1)->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(a->status(2)->state, RequestState::kFailed);
  EXPECT_EQ(a->status(2)->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(a->waiting(), 0u);
  EXPECT_EQ(a->status(3)->state, RequestState::kQueued);
}

// An id is refused while any layer holds it: waiting here, admitted, held
// by the scheduler alone, or ended; once forgotten it may be used again.
TEST(Admission, ASubmitOfAnIdStillHeldIsRefusedWhereverItIs) {
  OneOwnerRig rig;
  sched::Scheduler* s = rig.s.get();
  AdmissionController* a = rig.a.get();
  const TransferRequest r{"127.0.0.1:5000", "127.0.0.1:6000", kMiB, QosClass::kHotKv, 0, true};
  ASSERT_TRUE(a->submit(1, r, 0).is_ok());  // admitted
  ASSERT_TRUE(a->submit(2, r, 0).is_ok());  // waits for the one owner slot
  ASSERT_EQ(a->waiting(), 1u);
  EXPECT_TRUE(s->has(1));
  EXPECT_FALSE(s->has(2));
  for (RequestId id : {1, 2}) {
    const Status again = a->submit(id, r, 0);
    EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << id;
    EXPECT_NE(again.message().find("exists already"), std::string::npos) << again.message();
  }
  // An id only the scheduler holds (a caller that used it directly).
  ASSERT_TRUE(s->submit(7, r, 0).is_ok());
  EXPECT_EQ(a->submit(7, r, 0).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(a->cancel(2, 0).is_ok());  // ended here, never admitted
  EXPECT_EQ(a->submit(2, r, 0).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(a->forget(2).is_ok());
  EXPECT_TRUE(a->submit(2, r, 0).is_ok());
  EXPECT_FALSE(s->has(99));
}

}  // namespace
}  // namespace baton::admission
