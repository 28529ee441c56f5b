// DualPath over real engines on the wall clock, in one process: a prefill
// engine and a store engine hold the same pattern bytes, a decode engine
// races them into its own buffer. "A peer dies" = its engine shuts down
// (the decode side sees its connection close, as after a SIGKILL; the
// bench and tools/bench_dualpath_test.cc SIGKILL real processes).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "baton/dualpath/dualpath.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"

namespace baton::dualpath {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;
constexpr TimeNs kMs = 1'000'000;
constexpr std::uint64_t kSalt = 5;

// `tls` named: the bytes cross UCX's TCP (slow enough on loopback to kill a
// peer mid-handoff); empty: the same-host copy.
engine::EngineConfig config(const std::string& tls) {
  transport::UcxConfig ucx;
  ucx.tls = tls;
  ucx.same_host_copy = tls.empty();
  return engine::EngineConfig{.ucx = std::move(ucx)};
}

// An engine with one exported region: a buffer of ours, registered (the
// buffer outlives the engine), or with `mapped` memory the engine allocates
// (a peer of this host maps it and copies with memcpy; ours takes CMA).
struct Side {
  std::vector<std::byte> buffer;
  std::unique_ptr<engine::Engine> engine;
  engine::Region region;

  Side(std::size_t bytes, bool fill, const std::string& tls = "", bool mapped = false)
      : buffer(mapped ? 0 : bytes) {
    if (fill) engine::fill_pattern(buffer, kSalt);
    auto e = engine::Engine::create(config(tls));
    EXPECT_TRUE(e.has_value()) << e.error().to_string();
    if (!e) return;
    engine = std::move(*e);
    auto r = mapped ? engine->allocate_memory(bytes) : engine->register_memory(buffer.data(), buffer.size());
    if (r && mapped && fill) engine::fill_pattern({reinterpret_cast<std::byte*>(r->base), bytes}, kSalt);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    if (r) region = *r;
    if (fill) {
      EXPECT_TRUE(engine->export_region(region.handle).is_ok());
    }
  }
};

struct Rig {
  Side decode;
  Side prefill;
  Side store;
  std::unique_ptr<DualPath> dual;

  Rig(Strategy strategy, std::size_t bytes, const std::string& tls = "", bool prefill_mapped = false)
      : decode(bytes, false, tls), prefill(bytes, true, tls, prefill_mapped), store(bytes, true, tls) {
    DualPathConfig c;
    connect(prefill);
    connect(store);
    c.strategy = strategy;
    c.probe_interval_ns = 1 * kMs;
    c.backoff_initial_ns = 100'000;
    c.backoff_max_ns = 5 * kMs;
    auto d = DualPath::create(*decode.engine, c);
    EXPECT_TRUE(d.has_value()) << d.error().to_string();
    if (d) dual = std::move(*d);
  }

  void connect(const Side& peer) {
    auto p = decode.engine->connect(peer.engine->address());
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    ASSERT_TRUE(decode.engine->refresh(*p).is_ok());
  }

  // [offset, +bytes) of the buffers, from each leg, landing at the same offset here.
  HandoffRequest handoff(std::uint64_t offset, std::uint64_t bytes, const Side* direct = nullptr) const {
    if (direct == nullptr) direct = &prefill;
    HandoffRequest r;
    r.direct_from = "prefill";
    r.store_from = "store";
    r.bytes = bytes;
    r.direct_sources = {{direct->engine->address(), direct->region.handle, offset, bytes}};
    r.store_sources = {{store.engine->address(), store.region.handle, offset, bytes}};
    r.local_region = decode.region.handle;
    r.local_offset = offset;
    return r;
  }

  HandoffStatus finish(HandoffId id) {
    EXPECT_TRUE(dual->run_until_idle(20'000 * kMs).is_ok());
    auto st = dual->status(id);
    EXPECT_TRUE(st.has_value());
    return st.value_or(HandoffStatus{});
  }

  [[nodiscard]] bool landed(std::uint64_t offset, std::uint64_t bytes) const {
    return !engine::pattern_mismatch(std::span(decode.buffer).subspan(offset, bytes), kSalt, offset).has_value();
  }
};

TEST(EngineDualPath, HedgeDeliversEveryByteOnceAndCancelsTheLoser) {
  // Direct reads a mapping (memcpy on the loop), the store a caller's
  // buffer (CMA, on the copier's thread, slower): direct wins the race.
  // Above the engine's loop-free limit (16 MiB), so both legs run at once.
  constexpr std::uint64_t kBytes = 64 * kMiB;
  Rig rig(Strategy::kHedge, kBytes, "", true);
  ASSERT_TRUE(rig.dual);
  auto id = rig.dual->submit(rig.handoff(0, kBytes));
  ASSERT_TRUE(id.has_value()) << id.error().to_string();
  const HandoffStatus st = rig.finish(*id);
  ASSERT_EQ(st.state, HandoffState::kCompleted) << st.status.to_string();
  EXPECT_EQ(st.bytes_landed, kBytes);
  EXPECT_EQ(st.bytes_direct + st.bytes_store, kBytes);
  EXPECT_TRUE(rig.landed(0, kBytes));
  const DualPathStats& s = rig.dual->stats();
  EXPECT_EQ(st.winner, Leg::kDirect);
  EXPECT_EQ(s.wins_direct, 1u);
  EXPECT_EQ(st.legs_cancelled, 1u) << "the store leg was still running";
  EXPECT_EQ(s.cancelled_legs, 1u);
  EXPECT_LT(st.wasted_bytes, kBytes) << "the loser stopped before moving everything";
  EXPECT_EQ(s.failovers, 0u);
}

TEST(EngineDualPath, ADirectPeerThatDiesMidHandoffLeavesOnlyItsMissingPiecesToTheStore) {
  constexpr std::uint64_t kBytes = 64 * kMiB;
  Rig rig(Strategy::kFailoverOnly, kBytes, "tcp");
  ASSERT_TRUE(rig.dual);
  auto id = rig.dual->submit(rig.handoff(0, kBytes));
  ASSERT_TRUE(id.has_value()) << id.error().to_string();
  // Some of it landed, by far not all (64 MiB over loopback TCP): kill the source.
  const auto t0 = std::chrono::steady_clock::now();
  while (rig.decode.engine->stats().bytes_completed < 4 * kMiB &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  rig.prefill.engine->shutdown();
  const HandoffStatus st = rig.finish(*id);
  ASSERT_EQ(st.state, HandoffState::kCompleted)
      << st.status.to_string() << "; landed " << st.bytes_landed << ", failovers " << st.failovers << " (first at "
      << st.first_failover_ns << " ns, submitted at " << st.submitted_ns << " ns)";
  EXPECT_EQ(st.winner, Leg::kStore);
  EXPECT_EQ(st.failovers, 1u);
  EXPECT_GE(st.bytes_direct, 1 * kMiB) << "pieces that landed before the death are not sent again";
  EXPECT_GT(st.bytes_store, 0u);
  EXPECT_EQ(st.bytes_direct + st.bytes_store, kBytes) << "every byte counted once";
  EXPECT_EQ(st.wasted_bytes, 0u);
  EXPECT_TRUE(rig.landed(0, kBytes));
  EXPECT_EQ(rig.dual->stats().exclusions, 1u);
  EXPECT_FALSE(rig.dual->leg_healthy("prefill", ""));
}

TEST(EngineDualPath, AfterTheDirectLegDiesTheStoreServesAndARestartedPrefillWinsAgain) {
  constexpr std::uint64_t kBytes = 4 * kMiB;
  Rig rig(Strategy::kFailoverOnly, 3 * kBytes);
  ASSERT_TRUE(rig.dual);
  rig.prefill.engine->shutdown();
  auto a = rig.dual->submit(rig.handoff(0, kBytes));
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  HandoffStatus st = rig.finish(*a);
  ASSERT_EQ(st.state, HandoffState::kCompleted) << st.status.to_string();
  EXPECT_EQ(st.winner, Leg::kStore);
  EXPECT_EQ(st.bytes_store, kBytes);
  EXPECT_TRUE(rig.landed(0, kBytes));

  // The prefill worker comes back at a new address, under the same name.
  Side restarted(3 * kBytes, true);
  rig.connect(restarted);
  auto b = rig.dual->submit(rig.handoff(kBytes, kBytes, &restarted));
  ASSERT_TRUE(b.has_value());
  st = rig.finish(*b);
  ASSERT_EQ(st.state, HandoffState::kCompleted);
  EXPECT_EQ(st.winner, Leg::kStore) << "the leg is still excluded until a probe succeeds";
  ASSERT_TRUE(rig.dual->run_until(rig.decode.engine->now_ns() + 20 * kMs).is_ok());
  EXPECT_TRUE(rig.dual->leg_healthy("prefill", ""));
  EXPECT_EQ(rig.dual->stats().readmissions, 1u);

  auto c = rig.dual->submit(rig.handoff(2 * kBytes, kBytes, &restarted));
  ASSERT_TRUE(c.has_value());
  st = rig.finish(*c);
  ASSERT_EQ(st.state, HandoffState::kCompleted);
  EXPECT_EQ(st.winner, Leg::kDirect);
  EXPECT_EQ(st.bytes_direct, kBytes);
  EXPECT_TRUE(rig.landed(0, 3 * kBytes));
}

TEST(EngineDualPath, BothLegsDownBackOffThenFailUnavailableAtTheTimeout) {
  constexpr std::uint64_t kBytes = 1 * kMiB;
  Rig rig(Strategy::kHedge, kBytes);
  ASSERT_TRUE(rig.dual);
  rig.prefill.engine->shutdown();
  rig.store.engine->shutdown();
  HandoffRequest r = rig.handoff(0, kBytes);
  // Room for several rounds of backoff (at most 1 ms each) even where each
  // failed attempt is slow: under TSan on a loaded 2-core VM 50 ms once
  // held a single retry.
  r.timeout_ns = 200 * kMs;
  auto id = rig.dual->submit(r);
  ASSERT_TRUE(id.has_value()) << id.error().to_string();
  const HandoffStatus st = rig.finish(*id);
  EXPECT_EQ(st.state, HandoffState::kFailed);
  EXPECT_EQ(st.status.code(), StatusCode::kUnavailable) << st.status.to_string();
  EXPECT_GT(st.retries, 2u);
  EXPECT_EQ(st.bytes_landed, 0u);
}

TEST(EngineDualPath, AHandoffPastItsTimeoutEndsTimedOut) {
  constexpr std::uint64_t kBytes = 64 * kMiB;  // ~60 ms over loopback TCP
  Rig rig(Strategy::kFailoverOnly, kBytes, "tcp");
  ASSERT_TRUE(rig.dual);
  HandoffRequest r = rig.handoff(0, kBytes);
  r.timeout_ns = 2 * kMs;
  auto id = rig.dual->submit(r);
  ASSERT_TRUE(id.has_value());
  const HandoffStatus st = rig.finish(*id);
  EXPECT_EQ(st.state, HandoffState::kFailed);
  EXPECT_EQ(st.status.code(), StatusCode::kTimeout) << st.status.to_string();
  EXPECT_LT(st.bytes_landed, kBytes);
}

// INT64_MAX is no limit: it wrapped into the past, and the handoff was
// given up at once with nothing landed.
TEST(EngineDualPath, RunUntilIdleWithoutALimitWaitsForTheHandoff) {
  constexpr std::uint64_t kBytes = 8 * kMiB;
  Rig rig(Strategy::kHedge, kBytes);
  ASSERT_TRUE(rig.dual);
  auto id = rig.dual->submit(rig.handoff(0, kBytes));
  ASSERT_TRUE(id.has_value()) << id.error().to_string();
  ASSERT_TRUE(rig.dual->run_until_idle(INT64_MAX).is_ok());
  auto s = rig.dual->status(*id);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->state, HandoffState::kCompleted) << s->status.to_string();
  EXPECT_EQ(s->bytes_landed, kBytes);
}

TEST(EngineDualPath, ACancelEndsItAndRunUntilIdleWaitsForTheLegsToSettle) {
  constexpr std::uint64_t kBytes = 32 * kMiB;
  Rig rig(Strategy::kHedge, kBytes, "tcp");
  ASSERT_TRUE(rig.dual);
  auto id = rig.dual->submit(rig.handoff(0, kBytes));
  ASSERT_TRUE(id.has_value());
  ASSERT_TRUE(rig.dual->cancel(*id).is_ok());
  EXPECT_EQ(rig.dual->cancel(*id).code(), StatusCode::kInvalidArgument);
  const HandoffStatus st = rig.finish(*id);
  EXPECT_EQ(st.state, HandoffState::kCancelled);
  EXPECT_EQ(st.status.code(), StatusCode::kCancelled);
}

TEST(EngineDualPath, SourcesThatDoNotDescribeTheHandoffAreRefusedAtSubmit) {
  constexpr std::uint64_t kBytes = 1 * kMiB;
  Rig rig(Strategy::kHedge, kBytes);
  ASSERT_TRUE(rig.dual);
  auto refused = [&](HandoffRequest r) {
    auto id = rig.dual->submit(r);
    EXPECT_FALSE(id.has_value());
    return id ? StatusCode::kOk : id.error().code();
  };
  HandoffRequest r = rig.handoff(0, kBytes);
  r.store_sources.clear();
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "no store source";
  r = rig.handoff(0, kBytes);
  r.direct_sources[0].length = kBytes / 2;
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "half the handoff";
  r = rig.handoff(0, kBytes);
  r.direct_sources.push_back(r.direct_sources[0]);
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "twice the handoff";
  r = rig.handoff(0, kBytes);
  r.direct_sources = {{r.direct_sources[0].peer, r.direct_sources[0].region, 0, 0},
                      {r.direct_sources[0].peer, r.direct_sources[0].region, 0, kBytes}};
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "an empty source";
  r = rig.handoff(0, kBytes);
  r.direct_sources[0].peer.clear();
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "a source without a peer";
  r = rig.handoff(0, kBytes);
  r.direct_sources[0].region += 1000;
  EXPECT_EQ(refused(r), StatusCode::kNotFound) << "a region the peer never exported";
  r = rig.handoff(0, kBytes);
  r.direct_sources[0].offset = 1;
  EXPECT_EQ(refused(r), StatusCode::kOutOfRange) << "one byte past the region";
  r = rig.handoff(0, kBytes);
  r.direct_sources[0].peer = "127.0.0.1:1";
  EXPECT_EQ(refused(r), StatusCode::kNotFound) << "a peer never connected";
  r = rig.handoff(0, kBytes);
  r.direct_from = r.store_from = "";
  r.store_sources = r.direct_sources;
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "both legs on one peer";
  // Where the bytes land, and how: refused at submit, not a handoff failed
  // before its caller had its id.
  r = rig.handoff(0, kBytes);
  r.local_region += 1000;
  EXPECT_EQ(refused(r), StatusCode::kNotFound) << "no such local region";
  r = rig.handoff(0, kBytes);
  r.local_offset = UINT64_MAX - 10;
  EXPECT_EQ(refused(r), StatusCode::kOutOfRange) << "past the local region";
  r = rig.handoff(0, kBytes);
  r.qos = static_cast<sched::QosClass>(9);
  EXPECT_EQ(refused(r), StatusCode::kInvalidArgument) << "no such qos class";
  EXPECT_EQ(rig.dual->stats().submitted, 0u);

  DualPathConfig bad;
  bad.piece_bytes = 0;
  EXPECT_EQ(DualPath::create(*rig.decode.engine, bad).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::dualpath
