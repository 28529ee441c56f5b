// The Harness on the wall clock: a loop thread runs the same scheduler and
// admission code against real time, any thread may call in, and an idle
// engine sleeps instead of spinning.
#include <thread>

#include <gtest/gtest.h>

#include "baton/engine/harness.h"

namespace baton::engine {
namespace {

using sched::QosClass;
using sched::RequestState;

constexpr std::uint64_t kMiB = 1 << 20;
constexpr TimeNs kSeconds = 1'000'000'000;

std::unique_ptr<Harness> wall_engine() {
  HarnessConfig config;
  config.clock = ClockKind::kWall;
  auto e = Harness::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return std::move(*e);
}

TEST(WallClockEngine, MovesRequestsSubmittedFromSeveralThreads) {
  auto e = wall_engine();
  std::vector<sched::RequestId> ids[2];
  std::thread submitters[2];
  for (int t = 0; t < 2; ++t) {
    submitters[t] = std::thread([&e, &ids, t] {
      for (int i = 0; i < 10; ++i) {
        auto id = e->submit({"gpu0", t == 0 ? "gpu1" : "gpu2", kMiB, QosClass::kHotKv, 0, true});
        ASSERT_TRUE(id.has_value());
        ids[t].push_back(*id);
      }
    });
  }
  for (auto& s : submitters) s.join();
  for (const auto& list : ids) {
    for (sched::RequestId id : list) {
      ASSERT_TRUE(e->wait(id, 10 * kSeconds).is_ok()) << id;
      const auto s = e->status(id).value();
      EXPECT_EQ(s.state, RequestState::kCompleted);
      EXPECT_EQ(s.bytes_done, kMiB);
      EXPECT_GE(s.completed_ns, s.submitted_ns);
    }
  }
  EXPECT_NE(e->metrics_text().find("baton_sched_slices_completed_total 40\n"), std::string::npos)
      << e->metrics_text();  // 20 MiB in 512 KiB slices
}

TEST(WallClockEngine, AnIdleEngineSleeps) {
  auto e = wall_engine();
  const auto id = e->submit({"gpu0", "gpu1", kMiB, QosClass::kHotKv, 0, true}).value();
  ASSERT_TRUE(e->wait(id, 10 * kSeconds).is_ok());
  // The loop stays awake (turning) for kStayAwakeNs after its last work;
  // count from after that window.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::uint64_t before = e->loop_turns();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Nothing to do for 300 ms: the loop wakes at most every 100 ms (its idle
  // bound), not thousands of times.
  EXPECT_LE(e->loop_turns() - before, 8u);
}

TEST(WallClockEngine, CancelFromAnotherThreadAndBadCalls) {
  auto e = wall_engine();
  // 1 TiB over NVSwitch takes seconds of real time: long enough to cancel midway.
  const auto big = e->submit({"gpu0", "gpu1", 1ULL << 40, QosClass::kPrefillBulk, 0, true}).value();
  std::thread canceller([&e, big] { EXPECT_TRUE(e->cancel(big).is_ok()); });
  canceller.join();
  ASSERT_TRUE(e->wait(big, 10 * kSeconds).is_ok());
  EXPECT_EQ(e->status(big)->state, RequestState::kCancelled);
  EXPECT_EQ(e->cancel(big).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->wait(999, kSeconds).code(), StatusCode::kNotFound);
  EXPECT_EQ(e->run_until(1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->run_until_idle().code(), StatusCode::kInvalidArgument);
}

TEST(VirtualClockEngine, WaitRunsVirtualTimeAndTimesOut) {
  auto e = Harness::create({}).value();
  const auto small = e->submit({"gpu0", "gpu1", kMiB, QosClass::kHotKv, 0, true}).value();
  ASSERT_TRUE(e->wait(small, kSeconds).is_ok());
  EXPECT_EQ(e->status(small)->state, RequestState::kCompleted);
  // 1 TiB at 450 GB/s needs seconds of virtual time: 1 ms is not enough.
  const auto huge = e->submit({"gpu0", "gpu1", 1ULL << 40, QosClass::kHotKv, 0, true}).value();
  const TimeNs before = e->now_ns();
  EXPECT_EQ(e->wait(huge, 1'000'000).code(), StatusCode::kTimeout);
  EXPECT_EQ(e->now_ns() - before, 1'000'000);
  EXPECT_EQ(e->loop_turns(), 0u);
}

}  // namespace
}  // namespace baton::engine
