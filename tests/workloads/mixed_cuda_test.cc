// The mixed workload over the CUDA transport on a scripted runtime: the
// wall-clock loop drives real (host-memory) copies through the same
// scheduler, and every submitted request ends.
#include <gtest/gtest.h>

#include "transport/fake_cuda_runtime.h"
#include "workloads/mixed.h"

namespace baton::workloads {
namespace {

using transport::testing::FakeCudaRuntime;

MixedWorkload small() {
  MixedWorkload w;
  w.topology_model = "nvlink-pairs";  // gpu0 <-> gpu1 over 4 NVLinks
  w.prefill_bytes = 1 << 20;
  w.prefill_burst = 2;
  w.prefill_interval_ns = 5'000'000;
  w.decode_bytes = 64 << 10;
  w.decode_interval_ns = 1'000'000;
  w.decode_deadline_ns = 50'000'000;
  w.duration_ns = 40'000'000;
  return w;
}

std::shared_ptr<FakeCudaRuntime> fake() {
  // Peer access within each NVLink pair.
  std::vector<std::vector<bool>> peer(4, std::vector<bool>(4, false));
  peer[0][1] = peer[1][0] = peer[2][3] = peer[3][2] = true;
  auto rt = std::make_shared<FakeCudaRuntime>(4, peer);
  rt->steps_per_query = 64;
  return rt;
}

TEST(MixedCuda, EveryRequestEndsAndItsBytesAreCopied) {
  for (auto [from, to] : {std::pair{"gpu0", "gpu1"}, std::pair{"numa0", "gpu0"}}) {
    MixedWorkload w = small();
    w.from = from;
    w.to = to;
    auto rt = fake();
    auto policy = sched::SchedPolicy::defaults();
    policy.kind = sched::PolicyKind::kDeadlineAware;
    auto r = run_mixed_cuda(w, policy, rt);
    ASSERT_TRUE(r.has_value()) << r.error().message();
    ASSERT_GT(r->decode_requests.size(), 0u);
    ASSERT_GT(r->prefill_requests.size(), 0u);
    std::uint64_t expected = 0;
    for (const auto* list : {&r->decode_requests, &r->prefill_requests}) {
      for (const sched::RequestStatus& s : *list) {
        EXPECT_EQ(s.state, sched::RequestState::kCompleted) << s.status.message();
        expected += s.bytes;
      }
    }
    EXPECT_EQ(r->bytes_delivered, expected);
    EXPECT_EQ(r->decode.count, r->decode_requests.size());
    // The runtime copied at least every delivered byte (staging copies twice).
    std::uint64_t copied = 0;
    for (const auto& c : rt->copies()) copied += c.bytes;
    EXPECT_GE(copied, expected) << from << " -> " << to;
    // Everything the run allocated on the "devices" is freed.
    for (int d = 0; d < 4; ++d) EXPECT_EQ(*rt->device_memory_used(d), 0u);
    EXPECT_EQ(rt->live_streams(), 0u);
  }
}

TEST(MixedCuda, RefusesAnEndpointWithoutAPathAndANullRuntime) {
  MixedWorkload w = small();
  w.from = "gpu7";
  auto r = run_mixed_cuda(w, sched::SchedPolicy::defaults(), fake());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
  EXPECT_NE(r.error().message().find("gpu7"), std::string::npos) << r.error().message();
  EXPECT_EQ(run_mixed_cuda(small(), sched::SchedPolicy::defaults(), nullptr).error().code(),
            StatusCode::kInvalidArgument);
  // Fewer devices than the topology's GPUs.
  EXPECT_EQ(run_mixed_cuda(small(), sched::SchedPolicy::defaults(), std::make_shared<FakeCudaRuntime>(2)).error().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::workloads
