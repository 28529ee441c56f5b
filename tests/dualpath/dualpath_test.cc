// DualPath on the nvswitch8 model under the virtual clock: direct leg gpu0 ->
// gpu1 (NVSwitch, host staging as its fallback), store leg nic1 -> gpu1
// (GDR). "An endpoint dies" = every simulated path of that leg goes down.
// Exactly-once is checked on the simulator's delivery record: every byte of
// a handoff's destination range landed once.
#include "baton/dualpath/dualpath.h"

#include <algorithm>
#include <map>

#include <gtest/gtest.h>

namespace baton::dualpath {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;
constexpr TimeNs kUs = 1000;

std::uint64_t addr_of(int i) { return static_cast<std::uint64_t>(i + 1) << 32; }

struct Rig {
  std::unique_ptr<engine::Harness> engine;
  std::unique_ptr<DualPath> dual;

  explicit Rig(Strategy strategy, DualPathConfig config = {}) {
    engine::HarnessConfig ec;
    ec.sim.record_deliveries = true;
    auto e = engine::Harness::create(ec);
    EXPECT_TRUE(e.has_value()) << e.error().to_string();
    engine = std::move(*e);
    config.strategy = strategy;
    auto d = DualPath::create(*engine, config);
    EXPECT_TRUE(d.has_value()) << d.error().to_string();
    dual = std::move(*d);
  }

  // Every simulated path of the leg from -> to.
  void set_leg_down(const std::string& from, const std::string& to, bool down) {
    const auto& paths = engine->sim_transport().paths();
    int n = 0;
    for (transport::PathId p = 0; p < paths.size(); ++p) {
      if (paths[p].from == from && paths[p].to == to) {
        ASSERT_TRUE(engine->sim_transport().set_path_down(p, down, engine->now_ns()).is_ok());
        ++n;
      }
    }
    ASSERT_GT(n, 0) << from << "->" << to;
  }

  HandoffId submit(std::uint64_t bytes, int index = 0, TimeNs timeout_ns = 0) {
    HandoffRequest r{"gpu0", "nic1", "gpu1", bytes};
    r.remote_addr = addr_of(index);
    r.timeout_ns = timeout_ns;
    auto id = dual->submit(r);
    EXPECT_TRUE(id.has_value()) << id.error().to_string();
    return id.value_or(0);
  }

  HandoffStatus status(HandoffId id) {
    auto s = dual->status(id);
    EXPECT_TRUE(s.has_value());
    return s.value_or(HandoffStatus{});
  }

  // How many times each byte of [addr, addr + bytes) landed on gpu1: the
  // histogram {times: bytes}.
  std::map<int, std::uint64_t> landings(std::uint64_t addr, std::uint64_t bytes) {
    const auto& paths = engine->sim_transport().paths();
    std::vector<std::pair<std::uint64_t, int>> edges;  // +1 at start, -1 at end
    for (const transport::SimDelivery& d : engine->sim_transport().deliveries()) {
      if (paths[d.path].to != "gpu1" || d.remote_addr < addr || d.remote_addr >= addr + bytes) continue;
      EXPECT_LE(d.remote_addr + d.bytes, addr + bytes) << "a slice spills past its handoff";
      edges.push_back({d.remote_addr, +1});
      edges.push_back({d.remote_addr + d.bytes, -1});
    }
    edges.push_back({addr, 0});
    edges.push_back({addr + bytes, 0});
    std::ranges::sort(edges);
    std::map<int, std::uint64_t> hist;
    int depth = 0;
    for (std::size_t i = 0; i + 1 < edges.size(); ++i) {
      depth += edges[i].second;
      const std::uint64_t a = std::max(edges[i].first, addr);
      const std::uint64_t b = std::min(edges[i + 1].first, addr + bytes);
      if (b > a) hist[depth] += b - a;
    }
    return hist;
  }

  void expect_exactly_once(int index, std::uint64_t bytes) {
    const auto hist = landings(addr_of(index), bytes);
    EXPECT_EQ(hist, (std::map<int, std::uint64_t>{{1, bytes}})) << "handoff " << index;
  }
};

TEST(DualPath, HedgeDirectWinsAndTheStoreLegIsCancelled) {
  Rig rig(Strategy::kHedge);
  const HandoffId id = rig.submit(8 * kMiB);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  const HandoffStatus s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kCompleted);
  EXPECT_EQ(s.winner, Leg::kDirect);
  EXPECT_EQ(s.legs_cancelled, 1u);
  EXPECT_GE(s.first_store_ns, 0);  // the store leg did start
  EXPECT_EQ(s.bytes_landed, 8 * kMiB);
  EXPECT_EQ(rig.dual->stats().wins_direct, 1u);
  EXPECT_EQ(rig.dual->stats().cancelled_legs, 1u);
  // Every byte landed at least once; what the loser landed too is wasted.
  const auto hist = rig.landings(addr_of(0), 8 * kMiB);
  EXPECT_FALSE(hist.contains(0));
  std::uint64_t twice = 0;
  for (auto [times, bytes] : hist) twice += static_cast<std::uint64_t>(times - 1) * bytes;
  EXPECT_LE(twice, s.wasted_bytes);
}

TEST(DualPath, RequestHedgingStartsTheStoreOnlyAfterTheHedgeDelay) {
  {
    Rig rig(Strategy::kRequestHedging);  // derived delay: direct finishes well within it
    const HandoffId id = rig.submit(8 * kMiB);
    ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
    EXPECT_EQ(rig.status(id).winner, Leg::kDirect);
    EXPECT_EQ(rig.status(id).first_store_ns, -1);
    EXPECT_EQ(rig.status(id).legs_cancelled, 0u);
    rig.expect_exactly_once(0, 8 * kMiB);
  }
  {
    DualPathConfig c;
    c.hedge_delay_ns = 1 * kUs;  // shorter than the direct copy: both race
    Rig rig(Strategy::kRequestHedging, c);
    const HandoffId id = rig.submit(64 * kMiB);
    ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
    const HandoffStatus s = rig.status(id);
    EXPECT_EQ(s.state, HandoffState::kCompleted);
    EXPECT_EQ(s.winner, Leg::kDirect);
    EXPECT_EQ(s.first_store_ns, s.submitted_ns + 1 * kUs);
    EXPECT_EQ(s.legs_cancelled, 1u);
    EXPECT_EQ(s.bytes_direct + s.bytes_store, 64 * kMiB);
  }
}

TEST(DualPath, MidFlightFailoverSendsOnlyTheMissingBytesExactlyOnce) {
  Rig rig(Strategy::kFailoverOnly);
  const std::uint64_t bytes = 256 * kMiB;
  const HandoffId id = rig.submit(bytes);
  // Direct needs ~0.6 ms for 256 MiB on NVSwitch: kill it half way.
  ASSERT_TRUE(rig.dual->run_until(300 * kUs).is_ok());
  const std::uint64_t before = rig.status(id).bytes_landed;
  rig.set_leg_down("gpu0", "gpu1", true);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  const HandoffStatus s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.winner, Leg::kStore);
  EXPECT_EQ(s.failovers, 1u);
  EXPECT_GT(s.bytes_direct, 0u);
  EXPECT_GT(s.bytes_store, 0u);
  EXPECT_LT(s.bytes_store, bytes);  // what direct landed is not re-sent
  EXPECT_EQ(s.bytes_direct + s.bytes_store, bytes);
  EXPECT_GE(s.bytes_direct, before);
  EXPECT_EQ(s.wasted_bytes, 0u);
  rig.expect_exactly_once(0, bytes);
  EXPECT_FALSE(rig.dual->leg_healthy("gpu0", "gpu1"));
  EXPECT_EQ(rig.dual->stats().exclusions, 1u);
}

TEST(DualPath, DeadPrimaryAtSubmitGoesToTheStoreAndLaterOnesSkipDirect) {
  Rig rig(Strategy::kFailoverOnly);
  rig.set_leg_down("gpu0", "gpu1", true);
  const HandoffId a = rig.submit(4 * kMiB, 0);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  EXPECT_EQ(rig.status(a).state, HandoffState::kCompleted);
  EXPECT_EQ(rig.status(a).winner, Leg::kStore);
  EXPECT_EQ(rig.status(a).bytes_direct, 0u);
  EXPECT_EQ(rig.status(a).failovers, 1u);  // found out at submit, at the same instant
  EXPECT_EQ(rig.status(a).completed_ns - rig.status(a).submitted_ns,
            rig.status(a).completed_ns - rig.status(a).first_store_ns);
  const HandoffId b = rig.submit(4 * kMiB, 1);  // the monitor already excludes direct
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  EXPECT_EQ(rig.status(b).winner, Leg::kStore);
  EXPECT_EQ(rig.status(b).failovers, 0u);
  rig.expect_exactly_once(0, 4 * kMiB);
  rig.expect_exactly_once(1, 4 * kMiB);
}

// Factors and delays beyond int64 once multiplied: a double cast to int64
// is undefined there (x86: INT64_MIN). A huge hedge factor hedged at the
// minimum delay, and a huge backoff retried every nanosecond.
TEST(DualPath, HugeFactorsAndDelaysSaturateInsteadOfWrapping) {
  {
    DualPathConfig c;
    c.hedge_factor = 1e300;
    Rig rig(Strategy::kRequestHedging, c);
    const HandoffId id = rig.submit(64 * kMiB);
    ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
    EXPECT_EQ(rig.status(id).winner, Leg::kDirect);
    EXPECT_EQ(rig.status(id).first_store_ns, -1) << "the store leg started: the delay wrapped";
  }
  {
    DualPathConfig c;
    c.backoff_initial_ns = c.backoff_max_ns = INT64_MAX;
    Rig rig(Strategy::kFailoverOnly, c);
    rig.set_leg_down("gpu0", "gpu1", true);
    rig.set_leg_down("nic1", "gpu1", true);
    const HandoffId id = rig.submit(2 * kMiB, 0, 1000 * kUs);
    ASSERT_TRUE(rig.dual->run_until(500 * kUs).is_ok());
    EXPECT_LE(rig.status(id).retries, 1u) << "a backoff of INT64_MAX retried at once";
  }
  Rig rig(Strategy::kHedge);
  const HandoffId id = rig.submit(2 * kMiB);
  ASSERT_TRUE(rig.dual->run_until_idle(INT64_MAX).is_ok()) << "INT64_MAX is no limit, not one in the past";
  EXPECT_EQ(rig.status(id).state, HandoffState::kCompleted);
}

TEST(DualPath, BothDownBacksOffThenSucceedsWhenOneReturns) {
  Rig rig(Strategy::kFailoverOnly);
  rig.set_leg_down("gpu0", "gpu1", true);
  rig.set_leg_down("nic1", "gpu1", true);
  const HandoffId id = rig.submit(2 * kMiB);
  ASSERT_TRUE(rig.dual->run_until(500 * kUs).is_ok());
  HandoffStatus s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kBackoff);
  const std::uint32_t retries = s.retries;
  EXPECT_GE(retries, 3u);
  // Exponential: far fewer retries than 500 µs / the initial 10 µs.
  EXPECT_LT(retries, 10u);
  rig.set_leg_down("nic1", "gpu1", false);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kCompleted);
  EXPECT_EQ(s.winner, Leg::kStore);
  EXPECT_GE(s.retries, retries);
  EXPECT_EQ(rig.dual->stats().retries, s.retries);
  rig.expect_exactly_once(0, 2 * kMiB);
}

TEST(DualPath, BothDownPastTheTimeoutEndsUnavailable) {
  Rig rig(Strategy::kHedge);
  rig.set_leg_down("gpu0", "gpu1", true);
  rig.set_leg_down("nic1", "gpu1", true);
  const HandoffId id = rig.submit(2 * kMiB, 0, 300 * kUs);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  const HandoffStatus s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kUnavailable) << s.status.to_string();
  EXPECT_EQ(s.completed_ns - s.submitted_ns, 300 * kUs);
  EXPECT_GT(s.retries, 0u);
  EXPECT_EQ(rig.dual->stats().failed, 1u);
}

TEST(DualPath, TrafficReturnsToDirectOnceProbesSucceed) {
  DualPathConfig c;
  c.probe_successes = 2;
  Rig rig(Strategy::kFailoverOnly, c);
  rig.set_leg_down("gpu0", "gpu1", true);
  const HandoffId a = rig.submit(4 * kMiB, 0);
  ASSERT_TRUE(rig.dual->run_until(1000 * kUs).is_ok());
  EXPECT_EQ(rig.status(a).winner, Leg::kStore);
  EXPECT_FALSE(rig.dual->leg_healthy("gpu0", "gpu1"));
  EXPECT_GT(rig.dual->stats().probes_failed, 0u);
  rig.set_leg_down("gpu0", "gpu1", false);
  const TimeNs restored = rig.engine->now_ns();
  // Two probe intervals, plus the probes' own time.
  ASSERT_TRUE(rig.dual->run_until(restored + 2 * c.probe_interval_ns + 20 * kUs).is_ok());
  EXPECT_TRUE(rig.dual->leg_healthy("gpu0", "gpu1"));
  EXPECT_EQ(rig.dual->stats().readmissions, 1u);
  const HandoffId b = rig.submit(4 * kMiB, 1);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  EXPECT_EQ(rig.status(b).winner, Leg::kDirect);
  EXPECT_EQ(rig.status(b).bytes_store, 0u);
}

class DualPathEveryStrategy : public ::testing::TestWithParam<Strategy> {};

TEST_P(DualPathEveryStrategy, NoHandoffLostNoneCompletedTwiceThroughAFault) {
  Rig rig(GetParam());
  constexpr int kHandoffs = 60;
  const std::uint64_t bytes = 16 * kMiB;
  std::vector<HandoffId> ids;
  for (int i = 0; i < kHandoffs; ++i) {
    ASSERT_TRUE(rig.dual->run_until(static_cast<TimeNs>(i) * 50 * kUs).is_ok());
    if (i == 20) rig.set_leg_down("gpu0", "gpu1", true);
    if (i == 40) rig.set_leg_down("gpu0", "gpu1", false);
    ids.push_back(rig.submit(bytes, i));
  }
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  EXPECT_EQ(rig.dual->stats().completed, static_cast<std::uint64_t>(kHandoffs));
  EXPECT_EQ(rig.dual->stats().wins_direct + rig.dual->stats().wins_store, static_cast<std::uint64_t>(kHandoffs));
  EXPECT_GT(rig.dual->stats().wins_store, 0u);
  EXPECT_GT(rig.dual->stats().wins_direct, 0u);
  for (int i = 0; i < kHandoffs; ++i) {
    const HandoffStatus s = rig.status(ids[i]);
    ASSERT_EQ(s.state, HandoffState::kCompleted) << i << " " << s.status.to_string();
    EXPECT_EQ(s.bytes_direct + s.bytes_store, bytes) << i;  // credited once each
    const auto hist = rig.landings(addr_of(i), bytes);
    EXPECT_FALSE(hist.contains(0)) << "handoff " << i << " has bytes that never landed";
    if (GetParam() == Strategy::kFailoverOnly) rig.expect_exactly_once(i, bytes);
  }
  // Handoffs submitted after the restore are back on direct.
  EXPECT_EQ(rig.status(ids.back()).winner, Leg::kDirect);
}

INSTANTIATE_TEST_SUITE_P(Strategies, DualPathEveryStrategy,
                         ::testing::Values(Strategy::kHedge, Strategy::kRequestHedging, Strategy::kFailoverOnly),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(DualPath, CancelEndsTheHandoffAndItsLegs) {
  Rig rig(Strategy::kHedge);
  const HandoffId id = rig.submit(256 * kMiB);
  ASSERT_TRUE(rig.dual->run_until(50 * kUs).is_ok());
  ASSERT_TRUE(rig.dual->cancel(id).is_ok());
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  const HandoffStatus s = rig.status(id);
  EXPECT_EQ(s.state, HandoffState::kCancelled);
  EXPECT_EQ(s.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(s.legs_cancelled, 0u);  // a caller's cancel is not a lost race
  EXPECT_EQ(rig.dual->cancel(id).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.engine->scheduler().queued_requests(), 0u);
}

TEST(DualPath, CountersReachTheEnginesMetrics) {
  Rig rig(Strategy::kFailoverOnly);
  rig.set_leg_down("gpu0", "gpu1", true);
  (void)rig.submit(1 * kMiB);
  ASSERT_TRUE(rig.dual->run_until_idle().is_ok());
  const std::string text = rig.engine->metrics_text();
  for (const char* line : {"baton_dualpath_failovers_total 1", "baton_dualpath_exclusions_total 1",
                           "baton_dualpath_completed_total 1", "baton_dualpath_wins_total{leg=\"store\"} 1"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  // Declared even before they count anything.
  for (const char* family : {"retries", "cancelled_legs", "wasted_bytes", "probes", "readmissions"}) {
    EXPECT_NE(text.find(fmt::format("# TYPE baton_dualpath_{}_total counter", family)), std::string::npos) << family;
  }
}

TEST(DualPath, BadInputsGetAClearStatus) {
  EXPECT_EQ(parse_strategy("fastest").error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parse_strategy("fastest").error().message().find("fastest"), std::string::npos);
  EXPECT_EQ(parse_strategy("request_hedging").value(), Strategy::kRequestHedging);

  auto engine = engine::Harness::create({});
  ASSERT_TRUE(engine.has_value());
  auto bad_config = [&](auto mutate) {
    DualPathConfig c;
    mutate(c);
    auto d = DualPath::create(**engine, c);
    return d.has_value() ? StatusCode::kOk : d.error().code();
  };
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.hedge_delay_ns = -1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.hedge_factor = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.backoff_initial_ns = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.backoff_max_ns = 1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.backoff_multiplier = 0.5; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.backoff_jitter = 1.0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.probe_interval_ns = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.probe_bytes = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.probe_successes = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.default_timeout_ns = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_config([](DualPathConfig& c) { c.strategy = static_cast<Strategy>(7); }), StatusCode::kInvalidArgument);

  Rig rig(Strategy::kHedge);
  auto submit = [&](HandoffRequest r) {
    auto id = rig.dual->submit(r);
    return id.has_value() ? StatusCode::kOk : id.error().code();
  };
  EXPECT_EQ(submit({"gpu0", "nic1", "gpu1", 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit({"gpu9", "nic1", "gpu1", 1}), StatusCode::kNotFound);
  EXPECT_EQ(submit({"gpu0", "nic42", "gpu1", 1}), StatusCode::kNotFound);
  EXPECT_EQ(submit({"gpu0", "nic1", "gpu77", 1}), StatusCode::kNotFound);
  EXPECT_EQ(submit({"gpu1", "nic1", "gpu1", 1}), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit({"nic1", "nic1", "gpu1", 1}), StatusCode::kInvalidArgument);
  HandoffRequest negative{"gpu0", "nic1", "gpu1", 1};
  negative.timeout_ns = -5;
  EXPECT_EQ(submit(negative), StatusCode::kInvalidArgument);
  HandoffRequest unknown_class{"gpu0", "nic1", "gpu1", 1};
  unknown_class.qos = static_cast<sched::QosClass>(9);  // the scheduler indexes its class table with it
  EXPECT_EQ(submit(unknown_class), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.dual->run_until_idle(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.dual->status(99).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(rig.dual->cancel(99).code(), StatusCode::kNotFound);
  ASSERT_TRUE(rig.dual->run_until(10 * kUs).is_ok());
  EXPECT_EQ(rig.dual->run_until(5 * kUs).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(rig.dual->stats().submitted, 0u);
}

}  // namespace
}  // namespace baton::dualpath
