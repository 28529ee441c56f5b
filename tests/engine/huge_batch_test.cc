// Batches of tens of thousands of requests (a KV cache of many small blocks,
// one request each) over a real engine pair on 127.0.0.1 (TCP): the loop
// admits, cancels and ends them a part a turn (Datapath::kRequestsPerTurn),
// so other callers' requests run in between, and every request is counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "baton/engine/engine.h"
#include <fmt/format.h>

#include "baton/engine/pattern.h"
#include "engine/datapath.h"
#include "engine/metric_value.h"
#include "engine/run_batch.h"

namespace baton::engine {
namespace {

constexpr TimeNs kSecond = 1'000'000'000;
constexpr std::uint64_t kTargetSalt = 7;
constexpr std::uint64_t kLocalSalt = 11;
// 48 000 requests of 256 B: 94 parts of admission, yet a short run.
constexpr std::size_t kRequests = 48'000;
constexpr std::uint64_t kBlock = 256;
constexpr std::size_t kBytes = kRequests * kBlock;
// The same bytes as 192 000 requests of 64 B, for the test of the end:
// 375 parts, an end of ~35 ms here against a read's 0.2-0.6 ms beside it.
// At 94 parts (~8 ms) a loaded CI run saw none of those reads in the end.
constexpr std::uint64_t kSmallBlock = 64;
constexpr std::size_t kSmallRequests = kBytes / kSmallBlock;

std::unique_ptr<Engine> tcp_engine() {
  EngineConfig config;
  config.ucx.tls = "tcp";
  config.ucx.same_host_copy = false;
  auto e = Engine::create(std::move(config));
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

// A holder with one exported, pattern-filled buffer, and an initiator
// connected to it with a buffer of its own (also patterned, to see what
// was written).
struct Pair {
  std::vector<std::byte> remote_bytes = std::vector<std::byte>(kBytes);
  std::vector<std::byte> local_bytes = std::vector<std::byte>(kBytes);
  std::unique_ptr<Engine> holder = tcp_engine();
  std::unique_ptr<Engine> initiator = tcp_engine();
  Region remote, local;
  Peer peer;

  Pair() {
    fill_pattern(remote_bytes, kTargetSalt);
    fill_pattern(local_bytes, kLocalSalt);
    remote = holder->register_memory(remote_bytes.data(), remote_bytes.size()).value();
    EXPECT_TRUE(holder->export_region(remote.handle).is_ok());
    local = initiator->register_memory(local_bytes.data(), local_bytes.size()).value();
    peer = initiator->connect(holder->address()).value();
  }

  // Request i reads the i-th `block` of the holder into the same place
  // here (wrapping around the buffers).
  [[nodiscard]] Batch reads(std::size_t n, std::uint64_t block = kBlock) const {
    Batch b;
    b.requests.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t offset = i * block % kBytes;
      b.requests.push_back(Request{.op = Op::kRead,
                                   .local_region = local.handle,
                                   .local_offset = offset,
                                   .peer = peer.address,
                                   .remote_region = remote.handle,
                                   .remote_offset = offset,
                                   .length = block,
                                   .qos = sched::QosClass::kPrefillBulk});
    }
    return b;
  }

  [[nodiscard]] double requests_metric(const char* state) {
    return testing::metric_value(initiator->metrics_text(),
                                 fmt::format("baton_engine_requests_total{{op=\"read\",state=\"{}\"}}", state), 0.0);
  }
};

// Another caller of the same engine: a decode step's 4 KiB reads, one at a
// time, into a buffer of their own, each with its start and end on the
// engine's clock.
class DecodeReads {
 public:
  explicit DecodeReads(Pair& pair) : engine_(*pair.initiator), buffer_(4096) {
    const Region urgent = engine_.register_memory(buffer_.data(), buffer_.size()).value();
    one_.requests.push_back(Request{.op = Op::kRead,
                                    .local_region = urgent.handle,
                                    .peer = pair.peer.address,
                                    .remote_region = pair.remote.handle,
                                    .length = 4096,
                                    .qos = sched::QosClass::kDecodeCritical});
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const TimeNs start = engine_.now_ns();
        if (!engine_.run(one_).is_ok()) failures_.fetch_add(1);
        spans_.push_back({start, engine_.now_ns()});
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // under way
  }
  ~DecodeReads() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // After stop(): the reads that began after `from` and ended by `to`.
  [[nodiscard]] int within(TimeNs from, TimeNs to) const {
    return static_cast<int>(std::ranges::count_if(spans_, [&](const Span& s) { return s.start > from && s.end <= to; }));
  }
  [[nodiscard]] std::size_t count() const { return spans_.size(); }
  [[nodiscard]] int failures() const { return failures_.load(); }

 private:
  struct Span {
    TimeNs start, end;
  };
  Engine& engine_;
  std::vector<std::byte> buffer_;
  Batch one_;
  std::vector<Span> spans_;
  std::atomic<bool> stop_{false};
  std::atomic<int> failures_{0};
  std::thread thread_;
};

TEST(UcxEngineHugeBatch, IsAdmittedAndEndedAPartATurnWhileAnotherCallersReadsComplete) {
  Pair pair;
  Engine& e = *pair.initiator;
  const double completed_before = pair.requests_metric("completed");
  const Batch batch = pair.reads(kSmallRequests, kSmallBlock);
  DecodeReads other(pair);
  const TimeNs submit_start = e.now_ns();
  auto h = e.submit(batch);
  const TimeNs submit_end = e.now_ns();
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  ASSERT_TRUE(e.wait(*h, 120 * kSecond).is_ok());
  const TimeNs waited = e.now_ns();
  other.stop();
  EXPECT_EQ(other.failures(), 0);

  auto st = e.poll(*h);
  ASSERT_TRUE(st.has_value());
  ASSERT_EQ(st->requests.size(), kSmallRequests);
  EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
  TimeNs last_completed = 0;
  for (std::size_t i = 0; i < kSmallRequests; ++i) {
    ASSERT_EQ(st->requests[i].state, sched::RequestState::kCompleted) << "request " << i;
    last_completed = std::max(last_completed, st->requests[i].completed_ns);
  }
  EXPECT_EQ(st->bytes_done, kBytes);
  EXPECT_FALSE(pattern_mismatch(pair.local_bytes, kTargetSalt, 0));
  // Reads that began after the submit did and ended before it returned,
  // and reads that began after the batch's last request completed and
  // ended before its waiter woke: none could while one turn admitted, or
  // ended, the whole batch.
  EXPECT_GE(other.within(submit_start, submit_end), 2) << other.count() << " reads in all";
  EXPECT_GE(other.within(last_completed, waited), 2) << other.count() << " reads in all";

  ASSERT_TRUE(e.release(*h).is_ok());
  // Every request counted once, the batch's and the other caller's.
  EXPECT_EQ(pair.requests_metric("completed") - completed_before, static_cast<double>(kSmallRequests + other.count()));
  // The released batch's requests are forgotten a part a turn; its regions
  // are free once it ended.
  EXPECT_TRUE(e.unregister(pair.local.handle).is_ok());
}

TEST(UcxEngineHugeBatch, IsPolledAndCancelledAPartATurnAndCountsEveryRequestOnce) {
  Pair pair;
  const double before = pair.requests_metric("completed") + pair.requests_metric("cancelled");
  auto h = pair.initiator->submit(pair.reads(kRequests));
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  DecodeReads other(pair);
  // A poll of the running batch: every request, in order.
  const TimeNs poll_start = pair.initiator->now_ns();
  auto running = pair.initiator->poll(*h);
  const TimeNs poll_end = pair.initiator->now_ns();
  ASSERT_TRUE(running.has_value()) << running.error().to_string();
  ASSERT_FALSE(running->done) << "the batch ended before it was polled";
  ASSERT_EQ(running->requests.size(), kRequests);
  EXPECT_EQ(running->bytes, kBytes);
  const TimeNs cancel_start = pair.initiator->now_ns();
  ASSERT_TRUE(pair.initiator->cancel(*h).is_ok());
  const TimeNs cancel_end = pair.initiator->now_ns();
  ASSERT_TRUE(pair.initiator->wait(*h, 120 * kSecond).is_ok());
  other.stop();
  EXPECT_EQ(other.failures(), 0);
  // Reads that began after the poll (the cancel) and ended before it returned.
  EXPECT_GE(other.within(poll_start, poll_end), 2) << other.count() << " reads in all";
  EXPECT_GE(other.within(cancel_start, cancel_end), 2) << other.count() << " reads in all";
  EXPECT_EQ(pair.initiator->cancel(*h).code(), StatusCode::kInvalidArgument);
  auto st = pair.initiator->poll(*h);
  ASSERT_TRUE(st.has_value());
  ASSERT_TRUE(st->done);
  ASSERT_EQ(st->requests.size(), kRequests);
  std::size_t completed = 0, cancelled = 0;
  for (std::size_t i = 0; i < kRequests; ++i) {
    const sched::RequestStatus& r = st->requests[i];
    completed += r.state == sched::RequestState::kCompleted;
    cancelled += r.state == sched::RequestState::kCancelled;
    if (r.state == sched::RequestState::kCompleted) {
      ASSERT_FALSE(pattern_mismatch(std::span(pair.local_bytes).subspan(i * kBlock, kBlock), kTargetSalt, i * kBlock))
          << "request " << i;
    }
  }
  EXPECT_EQ(completed + cancelled, kRequests);
  EXPECT_GT(cancelled, kRequests / 2) << "the cancel came after most requests had completed";
  EXPECT_EQ(st->status.code(), StatusCode::kCancelled);
  const Status released = testing::release_when_landed(*pair.initiator, *h);
  ASSERT_TRUE(released.is_ok()) << released.to_string();
  EXPECT_EQ(pair.requests_metric("completed") + pair.requests_metric("cancelled") - before,
            static_cast<double>(kRequests + other.count()));
  EXPECT_TRUE(pair.initiator->unregister(pair.local.handle).is_ok());
}

TEST(UcxEngineHugeBatch, ABadLastRequestRefusesTheWholeBatchBeforeAnyIsAdmitted) {
  Pair pair;
  Batch batch = pair.reads(kRequests);
  batch.requests.back().remote_offset = kBytes;  // past the holder's region
  const std::string expected = fmt::format("request {} of the batch", kRequests - 1);
  const Status checked = pair.initiator->check(batch);
  EXPECT_EQ(checked.code(), StatusCode::kOutOfRange) << checked.to_string();
  EXPECT_NE(checked.message().find(expected), std::string::npos) << checked.message();
  const std::string metrics_before = pair.initiator->metrics_text();
  auto h = pair.initiator->submit(batch);
  ASSERT_FALSE(h.has_value());
  EXPECT_EQ(h.error().code(), StatusCode::kOutOfRange);
  EXPECT_NE(h.error().message().find(expected), std::string::npos) << h.error().message();
  // Nothing was admitted: no batch, no slice, no byte moved.
  const std::string metrics_after = pair.initiator->metrics_text();
  EXPECT_EQ(testing::metric_value(metrics_after, "baton_engine_batches_total", 0.0),
            testing::metric_value(metrics_before, "baton_engine_batches_total", 0.0));
  EXPECT_EQ(pair.initiator->stats().slices_posted, 0u);
  EXPECT_FALSE(pattern_mismatch(pair.local_bytes, kLocalSalt, 0));
  EXPECT_TRUE(pair.initiator->unregister(pair.local.handle).is_ok());
}

TEST(UcxEngineHugeBatch, AShutdownDuringItsSubmitStillEndsEveryRequest) {
  Pair pair;
  const Batch batch = pair.reads(kRequests);
  std::atomic<bool> submitting{false};
  std::thread closer([&] {
    while (!submitting.load()) std::this_thread::yield();
    const std::uint64_t turns = pair.initiator->loop_turns();
    while (pair.initiator->loop_turns() < turns + 20) std::this_thread::yield();  // some parts in
    pair.initiator->shutdown();
  });
  submitting = true;
  auto h = pair.initiator->submit(batch);
  closer.join();
  if (!h.has_value()) {  // the shutdown came before any request was admitted
    EXPECT_EQ(h.error().code(), StatusCode::kUnavailable) << h.error().to_string();
    return;
  }
  ASSERT_TRUE(pair.initiator->wait(*h, 120 * kSecond).is_ok());
  auto st = pair.initiator->poll(*h);
  ASSERT_TRUE(st.has_value());
  ASSERT_TRUE(st->done);
  ASSERT_EQ(st->requests.size(), kRequests);
  std::size_t ended = 0;
  for (const sched::RequestStatus& r : st->requests) {
    ended += r.state == sched::RequestState::kCompleted || r.state == sched::RequestState::kCancelled ||
             r.state == sched::RequestState::kFailed;
  }
  EXPECT_EQ(ended, kRequests);
  EXPECT_FALSE(st->status.is_ok());
  // Each counted once in the metrics, those never admitted too.
  EXPECT_EQ(pair.requests_metric("completed") + pair.requests_metric("cancelled") + pair.requests_metric("failed"),
            static_cast<double>(kRequests));
}

// A region unregistered between the checks of a huge batch and the
// admission of its requests: those on it end failed (not_found), with their
// place in the batch; those before it go on. Where the unregister lands
// decides which of three things happens; each is checked exactly.
TEST(UcxEngineHugeBatch, ARegionUnregisteredWhileItIsAdmittedFailsOnlyTheRequestsOnIt) {
  Pair pair;
  Engine& e = *pair.initiator;
  // The first half reads into the pair's region, the second into another.
  constexpr std::size_t kHalf = kRequests / 2;  // 24 000: inside a part of 512
  std::vector<std::byte> second(kHalf * kBlock);
  const Region other = e.register_memory(second.data(), second.size()).value();
  Batch batch = pair.reads(kRequests);
  batch.notification = "all landed";
  for (std::size_t i = kHalf; i < kRequests; ++i) {
    batch.requests[i].local_region = other.handle;
    batch.requests[i].local_offset = (i - kHalf) * kBlock;
  }
  const double failed_before = pair.requests_metric("failed");
  std::atomic<bool> submitting{false};
  Status unregistered;
  std::thread closer([&] {
    while (!submitting.load()) std::this_thread::yield();
    const std::uint64_t turns = e.loop_turns();
    while (e.loop_turns() < turns + 25) std::this_thread::yield();  // the checks are 12 turns
    unregistered = e.unregister(other.handle);
  });
  submitting = true;
  auto h = e.submit(batch);
  closer.join();
  const std::string on_it = fmt::format("request {} of the batch", kHalf);
  if (!h.has_value()) {  // during the checks: refused whole
    EXPECT_EQ(h.error().code(), StatusCode::kNotFound) << h.error().to_string();
    EXPECT_NE(h.error().message().find(on_it), std::string::npos) << h.error().message();
    EXPECT_TRUE(unregistered.is_ok());
    return;
  }
  ASSERT_TRUE(e.wait(*h, 120 * kSecond).is_ok());
  auto st = e.poll(*h);
  ASSERT_TRUE(st.has_value());
  ASSERT_EQ(st->requests.size(), kRequests);
  if (!unregistered.is_ok()) {  // after its requests were in: refused, and all complete
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    return;
  }
  for (std::size_t i = 0; i < kRequests; ++i) {
    if (i < kHalf) {
      ASSERT_EQ(st->requests[i].state, sched::RequestState::kCompleted) << "request " << i;
    } else {
      ASSERT_EQ(st->requests[i].state, sched::RequestState::kFailed) << "request " << i;
      ASSERT_EQ(st->requests[i].status.code(), StatusCode::kNotFound) << st->requests[i].status.to_string();
      ASSERT_EQ(st->requests[i].bytes_done, 0u);
    }
  }
  EXPECT_EQ(st->status.code(), StatusCode::kNotFound);
  EXPECT_NE(st->status.message().find(on_it), std::string::npos) << st->status.message();
  EXPECT_EQ(st->bytes_done, kHalf * kBlock);
  EXPECT_EQ(pair.requests_metric("failed") - failed_before, static_cast<double>(kHalf));
  ASSERT_TRUE(e.release(*h).is_ok());
  // Not every request landed: no notification.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(pair.holder->take_notifications().empty());
}

// The engine destroyed while another thread's cancel of a huge batch is
// under way, a part a turn: the cancel is answered before the loop stops
// (it waited for good when the loop stopped under it).
TEST(UcxEngineHugeBatch, DestroyingTheEngineAnswersACancelUnderWay) {
  Pair pair;
  // 200 000 requests of 16 B: a cancel of ~400 turns, and a shutdown that
  // finds little on the wire, so it is over before the cancel.
  auto h = pair.initiator->submit(pair.reads(200'000, 16));
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  std::atomic<bool> cancelling{false}, answered{false};
  Engine* engine = pair.initiator.get();  // the pointer is reset below, the engine outlives the call
  std::thread canceller([&] {
    cancelling = true;
    (void)engine->cancel(*h);
    answered = true;
  });
  while (!cancelling.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  pair.initiator.reset();
  for (int i = 0; i < 3000 && !answered.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!answered.load()) {
    canceller.detach();  // blocked for good: the process ends it
    FAIL() << "the cancel was never answered";
  }
  canceller.join();
}

}  // namespace
}  // namespace baton::engine
