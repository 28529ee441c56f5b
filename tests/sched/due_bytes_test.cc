// Scheduler::unsent_due_before: the bytes admission counts ahead of a
// request, kept per path as requests are queued, posted, re-queued and end.
#include <gtest/gtest.h>

#include <limits>

#include "baton/sched/scheduler.h"
#include "baton/topology/probe.h"

namespace baton::sched {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// Offers the topology's links as paths and records what is posted.
class RecordingTransport final : public transport::Transport {
 public:
  explicit RecordingTransport(const topology::TopologyGraph& graph) {
    for (const topology::Link& l : graph.links()) {
      paths_.push_back({l.from, l.to, l.path, 1, l.cost.bandwidth_gbps, l.cost.latency_us});
    }
  }
  const std::vector<transport::PathInfo>& paths() const override { return paths_; }
  Status submit(const transport::SliceSubmit& s, TimeNs) override {
    posted.push_back(s);
    return Status::ok();
  }
  transport::CancelResult cancel(transport::SliceId, TimeNs) override { return {}; }
  void poll(TimeNs, std::vector<transport::Completion>&) override {}
  std::optional<TimeNs> next_event_ns() const override { return std::nullopt; }
  bool path_healthy(transport::PathId, TimeNs) const override { return true; }
  std::vector<transport::SliceSubmit> posted;

 private:
  std::vector<transport::PathInfo> paths_;
};

TEST(SchedulerDueBytes, CountsUnsentBytesOfEarlierDeadlinesOnThePath) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("pcie4").value()).value();
  RecordingTransport transport(graph);
  SchedPolicy policy = SchedPolicy::defaults();
  for (PathCredits& c : policy.credits) c = {1, 1, kMiB};  // one 1 MiB slice in flight per path
  auto s = Scheduler::create(graph, policy, transport).value();
  constexpr TimeNs kLater = 4'000'000'000;
  ASSERT_TRUE(s->submit(1, {"gpu0", "gpu1", 4 * kMiB, QosClass::kHotKv, 3'000'000'000, true}, 0).is_ok());
  ASSERT_TRUE(s->submit(2, {"gpu0", "gpu1", 2 * kMiB, QosClass::kHotKv, kLater, true}, 0).is_ok());
  ASSERT_TRUE(s->submit(3, {"gpu0", "gpu1", 1 * kMiB, QosClass::kHotKv, kLater, true}, 0).is_ok());
  ASSERT_TRUE(s->submit(4, {"gpu0", "gpu1", 8 * kMiB, QosClass::kPrefillBulk, 0, true}, 0).is_ok());
  const transport::PathId path = s->route("gpu0", "gpu1", 0).value();
  const TimeNs never = std::numeric_limits<TimeNs>::max();
  EXPECT_EQ(s->unsent_due_before(path, kLater, 3), 6 * kMiB);   // 1, then 2 (same deadline, earlier)
  EXPECT_EQ(s->unsent_due_before(path, kLater, 2), 4 * kMiB);   // 1 only
  EXPECT_EQ(s->unsent_due_before(path, kLater, 99), 7 * kMiB);  // not ours: equal deadlines go first
  EXPECT_EQ(s->unsent_due_before(path, 3'000'000'000 - 1, 99), 0u);
  EXPECT_EQ(s->unsent_due_before(path, never, 99), 7 * kMiB);  // 4 has no deadline: never counted
  EXPECT_EQ(s->unsent_due_before(path + 1000, kLater, 99), 0u);  // no such path

  s->dispatch(0);  // the most urgent requests' first slices go out
  ASSERT_FALSE(transport.posted.empty());
  std::uint64_t out = 0;
  for (const transport::SliceSubmit& p : transport.posted) {
    EXPECT_EQ(p.path, path);
    out += p.bytes;
  }
  EXPECT_EQ(s->unsent_due_before(path, never, 99), 7 * kMiB - out);
  EXPECT_EQ(s->load(path).queued_bytes, 15 * kMiB - out);

  // Failed slices are unsent again; a cancelled request leaves the sums.
  for (const transport::SliceSubmit& p : transport.posted) {
    (void)s->on_completion({p.id, p.path, p.lane, p.bytes, 1, Status::unavailable("lost")}, 1);
  }
  EXPECT_EQ(s->unsent_due_before(path, never, 99), 7 * kMiB);
  ASSERT_TRUE(s->cancel(2, 2).is_ok());
  EXPECT_EQ(s->unsent_due_before(path, never, 99), 5 * kMiB);
  EXPECT_EQ(s->unsent_due_before(path, kLater, 3), 4 * kMiB);
}

}  // namespace
}  // namespace baton::sched
