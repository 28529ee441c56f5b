#include "baton/transport/sim_transport.h"

#include <gtest/gtest.h>

#include "baton/topology/probe.h"

namespace baton::transport {
namespace {

// 1 GB/s is 1 byte per ns, so times below are easy to read.
PathInfo path(int lanes, double gbps, double latency_us) {
  return {"a", "b", topology::PathType::kRdma, lanes, gbps, latency_us};
}

SliceSubmit slice(SliceId id, PathId path, int lane, std::uint64_t bytes) { return {id, path, lane, bytes, {}}; }

std::unique_ptr<SimTransport> make(std::vector<PathInfo> paths, SimConfig config = {}) {
  auto t = SimTransport::create(std::move(paths), std::move(config));
  EXPECT_TRUE(t.has_value()) << t.error().to_string();
  return std::move(*t);
}

std::vector<Completion> drain(SimTransport& t, TimeNs until) {
  std::vector<Completion> out;
  t.poll(until, out);
  return out;
}

TEST(SimTransport, OneLaneServesFifoWithPipelinedLatency) {
  auto t = make({path(1, 1.0, 1.0)});
  ASSERT_TRUE(t->submit(slice(1, 0, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->submit(slice(2, 0, 0, 500), 0).is_ok());
  EXPECT_EQ(t->next_event_ns(), 1000);  // slice 1 leaves the wire
  EXPECT_TRUE(drain(*t, 1999).empty());
  auto c = drain(*t, 2000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 1u);
  EXPECT_EQ(c[0].at_ns, 2000);  // 1000 ns on the wire + 1 us latency
  EXPECT_TRUE(c[0].status.is_ok());
  c = drain(*t, 10'000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].at_ns, 2500);  // started at 1000, while slice 1 was in flight
  EXPECT_FALSE(t->next_event_ns().has_value());
  EXPECT_EQ(t->bytes_delivered(), 1500u);
}

TEST(SimTransport, LanesShareThePathBandwidth) {
  auto t = make({path(2, 2.0, 0.0)});
  ASSERT_TRUE(t->submit(slice(1, 0, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->submit(slice(2, 0, 1, 1000), 0).is_ok());
  const auto c = drain(*t, 5000);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].at_ns, 1000);  // each lane runs at 1 byte/ns, in parallel
  EXPECT_EQ(c[1].at_ns, 1000);
}

TEST(SimTransport, CancelQueuedHeadAndFinished) {
  auto t = make({path(1, 1.0, 1.0)});
  ASSERT_TRUE(t->submit(slice(1, 0, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->submit(slice(2, 0, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->submit(slice(3, 0, 0, 1000), 0).is_ok());
  // Queued: removed, nothing wasted.
  auto r = t->cancel(3, 100);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.bytes_wasted, 0u);
  // On the wire for 400 of 1000 ns: stops, 400 bytes wasted, the next starts now.
  ASSERT_TRUE(drain(*t, 400).empty());
  r = t->cancel(1, 400);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.bytes_wasted, 400u);
  auto c = drain(*t, 100'000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 2u);
  EXPECT_EQ(c[0].at_ns, 400 + 1000 + 1000);
  // All bytes sent, completion not yet polled: too late to stop.
  ASSERT_TRUE(t->submit(slice(4, 0, 0, 1000), 200'000).is_ok());
  ASSERT_TRUE(drain(*t, 201'000).empty());
  r = t->cancel(4, 201'500);
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(drain(*t, 300'000).size(), 1u);
  EXPECT_FALSE(t->cancel(99, 0).stopped);  // unknown
  EXPECT_EQ(t->bytes_wasted(), 400u);
}

TEST(SimTransport, PathDownFailsWhatIsOnItAndRefusesNewWork) {
  SimConfig config;
  config.faults = {{0, 1500, 5000}};
  auto t = make({path(1, 1.0, 1.0), path(1, 1.0, 1.0)}, config);
  ASSERT_TRUE(t->submit(slice(1, 0, 0, 1000), 0).is_ok());  // done sending at 1000, lands at 2000
  ASSERT_TRUE(t->submit(slice(2, 0, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->submit(slice(3, 1, 0, 1000), 0).is_ok());  // the other path is fine
  EXPECT_TRUE(t->path_healthy(0, 1499));
  EXPECT_FALSE(t->path_healthy(0, 1500));  // before the fault is polled, too
  auto c = drain(*t, 3000);
  ASSERT_EQ(c.size(), 3u);
  int failed = 0;
  for (const Completion& x : c) {
    if (x.path == 0) {
      EXPECT_EQ(x.status.code(), StatusCode::kUnavailable);
      EXPECT_EQ(x.at_ns, 1500);
      ++failed;
    } else {
      EXPECT_TRUE(x.status.is_ok());
    }
  }
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(t->submit(slice(4, 0, 0, 10), 3000).code(), StatusCode::kUnavailable);
  drain(*t, 5000);
  EXPECT_TRUE(t->path_healthy(0, 5000));
  EXPECT_TRUE(t->submit(slice(4, 0, 0, 10), 5000).is_ok());
  EXPECT_EQ(t->bytes_delivered(), 1000u);  // only slice 3 so far
}

TEST(SimTransport, ErrorProbabilityAndJitterAreSeeded) {
  auto run = [](SimConfig config) {
    auto t = make({path(1, 1.0, 0.0)}, config);
    for (SliceId i = 1; i <= 200; ++i) EXPECT_TRUE(t->submit(slice(i, 0, 0, 1000), 0).is_ok());
    return drain(*t, 1'000'000'000);
  };
  SimConfig always;
  always.error_probability = 1.0;
  for (const Completion& c : run(always)) EXPECT_EQ(c.status.code(), StatusCode::kUnavailable);

  SimConfig jitter;
  jitter.jitter = 0.5;
  jitter.seed = 7;
  const auto a = run(jitter);
  const auto b = run(jitter);
  ASSERT_EQ(a.size(), 200u);
  TimeNs previous = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at_ns, b[i].at_ns);  // same seed, same times
    EXPECT_GE(a[i].at_ns - previous, 1000);  // never faster than the cost model
    EXPECT_LE(a[i].at_ns - previous, 1500);
    previous = a[i].at_ns;
  }
  jitter.seed = 8;
  EXPECT_NE(run(jitter).back().at_ns, a.back().at_ns);
}

TEST(SimTransport, RecordsDeliveriesOnlyWhenAskedAndOnlyWhatLanded) {
  SimConfig config;
  config.record_deliveries = true;
  auto t = make({path(1, 1.0, 0.0), path(1, 1.0, 0.0)}, config);
  SliceSubmit a = slice(1, 0, 0, 1000);
  a.memory.remote_addr = 4096;
  ASSERT_TRUE(t->submit(a, 0).is_ok());
  ASSERT_TRUE(t->submit(slice(2, 1, 0, 1000), 0).is_ok());
  ASSERT_TRUE(t->set_path_down(1, true, 500).is_ok());  // slice 2 never lands
  (void)drain(*t, 10'000);
  ASSERT_EQ(t->deliveries().size(), 1u);
  EXPECT_EQ(t->deliveries()[0].path, 0u);
  EXPECT_EQ(t->deliveries()[0].remote_addr, 4096u);
  EXPECT_EQ(t->deliveries()[0].bytes, 1000u);
  EXPECT_EQ(t->deliveries()[0].at_ns, 1000);
  auto quiet = make({path(1, 1.0, 0.0)});
  ASSERT_TRUE(quiet->submit(slice(1, 0, 0, 10), 0).is_ok());
  (void)drain(*quiet, 100);
  EXPECT_TRUE(quiet->deliveries().empty());
}

TEST(SimTransport, RefusesBadInput) {
  auto t = make({path(2, 1.0, 0.0)});
  EXPECT_EQ(t->submit(slice(1, 5, 0, 10), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->submit(slice(1, 0, 2, 10), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->submit(slice(1, 0, -1, 10), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->submit(slice(1, 0, 0, 0), 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(t->submit(slice(1, 0, 0, 10), 0).is_ok());
  EXPECT_EQ(t->submit(slice(1, 0, 1, 10), 0).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(t->set_path_down(9, true, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(t->path_healthy(9, 0));

  EXPECT_FALSE(SimTransport::create({path(0, 1.0, 0.0)}).has_value());
  EXPECT_FALSE(SimTransport::create({path(1, 0.0, 0.0)}).has_value());
  EXPECT_FALSE(SimTransport::create({path(1, 1.0, -1.0)}).has_value());
  SimConfig bad;
  bad.jitter = 2;
  EXPECT_FALSE(SimTransport::create({path(1, 1.0, 0.0)}, bad).has_value());
  bad = {};
  bad.error_probability = -0.1;
  EXPECT_FALSE(SimTransport::create({path(1, 1.0, 0.0)}, bad).has_value());
  bad = {};
  bad.faults = {{3, 0, 0}};
  EXPECT_FALSE(SimTransport::create({path(1, 1.0, 0.0)}, bad).has_value());
  bad.faults = {{0, 100, 50}};
  EXPECT_FALSE(SimTransport::create({path(1, 1.0, 0.0)}, bad).has_value());
}

TEST(SimTransport, FromTopologyOffersBothDirectionsOfEveryLink) {
  const auto graph = topology::TopologyGraph::build(topology::load_model("nvlink-pairs").value()).value();
  auto t = SimTransport::from_topology(graph, [](topology::PathType) { return 3; }).value();
  ASSERT_EQ(t->paths().size(), 2 * graph.links().size());
  bool forward = false;
  bool backward = false;
  for (const PathInfo& p : t->paths()) {
    EXPECT_EQ(p.lanes, 3);
    forward |= p.from == "gpu0" && p.to == "gpu1" && p.type == topology::PathType::kNvlink;
    backward |= p.from == "gpu1" && p.to == "gpu0" && p.type == topology::PathType::kNvlink;
  }
  EXPECT_TRUE(forward && backward);
  EXPECT_EQ(t->paths()[0].name(), "gpu0->gpu1/nvlink");
}

}  // namespace
}  // namespace baton::transport
