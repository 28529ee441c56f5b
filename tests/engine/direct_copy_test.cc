// The engine's loop-free path: batches to a same-host peer copied on the
// submitting thread (Datapath::submit_direct over UcxTransport::copy_direct),
// between pairs of wall-clock engines in one process.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "engine/direct_copier.h"
#include "engine/metric_value.h"

namespace baton::engine {
namespace {

constexpr TimeNs kSecond = 1'000'000'000;

std::unique_ptr<Engine> make_engine(std::uint64_t direct_copy_max_bytes = 16 << 20, int copy_threads = 0) {
  EngineConfig config;
  config.ucx.direct_copy_max_bytes = direct_copy_max_bytes;
  config.ucx.copy_threads = copy_threads;
  auto e = Engine::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

// The value of a counter line `name{labels} value` in Prometheus text; 0 when absent.
double counter(const std::string& text, const std::string& series) {
  return testing::metric_value(text, series, 0.0);
}

// A holder with one registered buffer (reached with CMA) and one region it
// allocated (a memfd the initiator maps), both pattern-filled and exported;
// and an initiator with a registered buffer, connected to it.
struct Pair {
  static constexpr std::size_t kBytes = 1 << 20;
  std::vector<std::byte> held = std::vector<std::byte>(kBytes);
  std::vector<std::byte> mine = std::vector<std::byte>(kBytes);
  std::unique_ptr<Engine> holder = make_engine();
  std::unique_ptr<Engine> initiator;
  Region held_region, allocated, mine_region;
  Peer peer;

  explicit Pair(std::uint64_t direct_copy_max_bytes = 16 << 20, int copy_threads = 0)
      : initiator(make_engine(direct_copy_max_bytes, copy_threads)) {
    fill_pattern(held, 1);
    fill_pattern(mine, 2);
    held_region = *holder->register_memory(held.data(), held.size());
    allocated = *holder->allocate_memory(kBytes);
    fill_pattern(std::span(reinterpret_cast<std::byte*>(allocated.base), kBytes), 3);
    EXPECT_TRUE(holder->export_region(held_region.handle).is_ok());
    EXPECT_TRUE(holder->export_region(allocated.handle).is_ok());
    mine_region = *initiator->register_memory(mine.data(), mine.size());
    auto p = initiator->connect(holder->address());
    EXPECT_TRUE(p.has_value()) << p.error().to_string();
    if (p) peer = *p;
    EXPECT_EQ(peer.transport, "shm");
  }
  std::span<std::byte> allocated_bytes() const {
    return {reinterpret_cast<std::byte*>(allocated.base), kBytes};
  }
  // `n` reads of `block` bytes: allocated blocks n..2n-1 into ours 0..n-1.
  Batch block_reads(std::uint64_t n, std::uint64_t block) const {
    Batch b;
    for (std::uint64_t i = 0; i < n; ++i) b.requests.push_back(request(Op::kRead, i * block, allocated, (n + i) * block, block));
    return b;
  }
  // A region of ours comes and goes: the initiator publishes a new table.
  void new_table() {
    std::vector<std::byte> extra(4096);
    auto r = initiator->register_memory(extra.data(), extra.size());
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(initiator->unregister(r->handle).is_ok());
  }
  Request request(Op op, std::uint64_t local_offset, const Region& remote, std::uint64_t remote_offset,
                  std::uint64_t length) const {
    Request r;
    r.op = op;
    r.local_region = mine_region.handle;
    r.local_offset = local_offset;
    r.peer = peer.address;
    r.remote_region = remote.handle;
    r.remote_offset = remote_offset;
    r.length = length;
    return r;
  }
};

TEST(DirectCopy, SameHostBatchesEndWhenSubmitReturnsByteExact) {
  Pair p;
  std::mt19937_64 rng(5);
  for (int round = 0; round < 40; ++round) {
    const Region& remote = round % 4 < 2 ? p.held_region : p.allocated;
    std::span<std::byte> theirs = round % 4 < 2 ? std::span(p.held) : p.allocated_bytes();
    const Op op = round % 2 == 0 ? Op::kRead : Op::kWrite;
    const std::uint64_t length = 1 + rng() % (Pair::kBytes / 8);
    const std::uint64_t local_offset = rng() % (Pair::kBytes - length + 1);
    const std::uint64_t remote_offset = rng() % (Pair::kBytes - length + 1);
    std::span<std::byte> source = op == Op::kRead ? theirs.subspan(remote_offset, length)
                                                  : std::span(p.mine).subspan(local_offset, length);
    fill_pattern(source, 100 + round);
    auto h = p.initiator->submit(Batch{{p.request(op, local_offset, remote, remote_offset, length)}, {}});
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    auto st = p.initiator->poll(*h);  // no wait: it ended inside submit
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->done) << "round " << round;
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    EXPECT_EQ(st->bytes_done, length);
    ASSERT_EQ(st->requests.size(), 1u);
    EXPECT_EQ(st->requests[0].state, sched::RequestState::kCompleted);
    std::span<std::byte> sink = op == Op::kRead ? std::span(p.mine).subspan(local_offset, length)
                                                : theirs.subspan(remote_offset, length);
    EXPECT_FALSE(pattern_mismatch(sink, 100 + round).has_value()) << "round " << round;
    EXPECT_TRUE(p.initiator->wait(*h, kSecond).is_ok());
    EXPECT_EQ(p.initiator->cancel(*h).code(), StatusCode::kInvalidArgument);  // already ended
    EXPECT_TRUE(p.initiator->release(*h).is_ok());
    EXPECT_EQ(p.initiator->poll(*h).error().code(), StatusCode::kNotFound);
    EXPECT_EQ(p.initiator->wait(*h, kSecond).code(), StatusCode::kNotFound);
  }
  const std::string m = p.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 40);
  EXPECT_EQ(counter(m, "baton_engine_batches_total"), 40);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"read\",state=\"completed\"}"), 20);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"write\",state=\"completed\"}"), 20);
  EXPECT_EQ(p.initiator->stats().slices_posted, 0u);  // the scheduler never saw them
  EXPECT_EQ(counter(m, "baton_ucx_thread_copies_total"), 0);  // nor did a copy thread
  // Released batches are gone; one that is not is held until it is.
  EXPECT_EQ(counter(m, "baton_engine_batches_held"), 0);
  auto kept = p.initiator->submit(Batch{{p.request(Op::kRead, 0, p.held_region, 0, 4096)}, {}});
  ASSERT_TRUE(kept.has_value()) << kept.error().to_string();
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_batches_held"), 1);
  ASSERT_TRUE(p.initiator->release(*kept).is_ok());
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_batches_held"), 0);
}

// A batch copied within submit ends before the caller could watch the
// batch event fd: asked for afterwards, the fd is readable at once; from
// then on each direct batch makes it readable again, and nothing else does.
TEST(DirectCopy, TheBatchEventFdCountsBatchesThatEndedBeforeItWasAskedFor) {
  Pair p;
  auto readable = [](int fd) {
    pollfd f{fd, POLLIN, 0};
    return ::poll(&f, 1, 0) == 1 && (f.revents & POLLIN) != 0;
  };
  auto drain = [](int fd) {
    std::uint64_t count = 0;
    return ::read(fd, &count, sizeof count) == static_cast<ssize_t>(sizeof count) ? count : 0;
  };
  auto h = p.initiator->submit(Batch{{p.request(Op::kRead, 0, p.allocated, 0, 4096)}, {}});
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  const int fd = p.initiator->batch_event_fd();
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(readable(fd));  // the batch that ended inside submit
  EXPECT_GE(drain(fd), 1u);
  EXPECT_FALSE(readable(fd));
  EXPECT_EQ(p.initiator->batch_event_fd(), fd);  // a second ask does not write again
  EXPECT_FALSE(readable(fd));
  auto second = p.initiator->submit(Batch{{p.request(Op::kWrite, 0, p.allocated, 0, 4096)}, {}});
  ASSERT_TRUE(second.has_value()) << second.error().to_string();
  EXPECT_TRUE(readable(fd));
  EXPECT_EQ(drain(fd), 1u);
  EXPECT_TRUE(p.initiator->release(*h).is_ok());
  EXPECT_TRUE(p.initiator->release(*second).is_ok());
  EXPECT_FALSE(readable(fd));
}

// A released batch's record is reused for the next one (no allocation per
// batch): what a poll reports is the new batch's, never a remnant of a
// longer or different one before it, whether the batches are released in
// order or not.
TEST(DirectCopy, ReusedRecordsReportOnlyTheirOwnBatch) {
  Pair p;
  const std::vector<std::size_t> sizes = {5, 1, 3, 8, 2, 1, 6};
  std::vector<BatchHandle> held;  // some released late, out of order
  for (std::size_t round = 0; round < sizes.size() * 3; ++round) {
    const std::size_t n = sizes[round % sizes.size()];
    Batch batch;
    for (std::size_t i = 0; i < n; ++i) {
      Request r = p.request(i % 2 == 0 ? Op::kRead : Op::kWrite, i * 4096, p.allocated, i * 4096, 1024 + round + i);
      r.qos = i % 2 == 0 ? sched::QosClass::kDecodeCritical : sched::QosClass::kBackground;
      r.deadline_ns = i == 0 ? p.initiator->now_ns() + 60 * kSecond : 0;
      batch.requests.push_back(r);
    }
    auto h = p.initiator->submit(batch);
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    auto st = p.initiator->poll(*h);
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->done);
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    ASSERT_EQ(st->requests.size(), n) << "round " << round;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const sched::RequestStatus& s = st->requests[i];
      EXPECT_EQ(s.state, sched::RequestState::kCompleted);
      EXPECT_TRUE(s.status.is_ok());
      EXPECT_EQ(s.bytes, batch.requests[i].length);
      EXPECT_EQ(s.bytes_done, s.bytes);
      EXPECT_EQ(s.bytes_unsent, 0u);
      EXPECT_EQ(s.qos, batch.requests[i].qos);
      EXPECT_EQ(s.deadline_ns, batch.requests[i].deadline_ns);
      EXPECT_EQ(s.slices_spilled, 0u);
      EXPECT_EQ(s.slices_preempted, 0u);
      EXPECT_GE(s.completed_ns, s.submitted_ns);
      bytes += s.bytes;
    }
    EXPECT_EQ(st->bytes, bytes);
    EXPECT_EQ(st->bytes_done, bytes);
    if (round % 3 == 0) {
      held.push_back(*h);
    } else {
      EXPECT_TRUE(p.initiator->release(*h).is_ok());
    }
    if (held.size() == 3) {
      for (auto it = held.rbegin(); it != held.rend(); ++it) EXPECT_TRUE(p.initiator->release(*it).is_ok());
      held.clear();
    }
  }
  for (BatchHandle h : held) EXPECT_TRUE(p.initiator->release(h).is_ok());
}

// poll(handle, out) reuses `out`: whatever it held before (a longer batch,
// a failure, another batch's figures), it reports exactly what poll(handle)
// reports, for a direct batch and for one that took the loop.
TEST(DirectCopy, PollIntoAReusedStatusReportsOnlyThisBatch) {
  for (const std::uint64_t direct_max : {std::uint64_t{16} << 20, std::uint64_t{0}}) {
    SCOPED_TRACE(direct_max == 0 ? "through the loop" : "direct");
    Pair p(direct_max);
    BatchStatus out;
    out.done = false;
    out.status = Status::internal("left over");
    out.bytes = out.bytes_done = 999;
    out.requests.resize(9);
    for (auto& s : out.requests) {
      s.state = sched::RequestState::kFailed;
      s.status = Status::unavailable("left over");
      s.bytes_done = 77;
    }
    for (const std::size_t n : {std::size_t{5}, std::size_t{1}, std::size_t{3}}) {
      Batch batch;
      for (std::size_t i = 0; i < n; ++i) {
        batch.requests.push_back(p.request(i % 2 == 0 ? Op::kRead : Op::kWrite, i * 8192, p.allocated, i * 8192, 100 + i));
      }
      auto h = p.initiator->submit(batch);
      ASSERT_TRUE(h.has_value()) << h.error().to_string();
      ASSERT_TRUE(p.initiator->wait(*h, 10 * kSecond).is_ok());
      ASSERT_TRUE(p.initiator->poll(*h, out).is_ok());
      auto fresh = p.initiator->poll(*h);
      ASSERT_TRUE(fresh.has_value());
      EXPECT_TRUE(out.done);
      EXPECT_TRUE(out.status.is_ok()) << out.status.to_string();
      EXPECT_EQ(out.status, fresh->status);
      EXPECT_EQ(out.bytes, fresh->bytes);
      EXPECT_EQ(out.bytes_done, fresh->bytes_done);
      std::uint64_t bytes = 0;
      for (const Request& r : batch.requests) bytes += r.length;
      EXPECT_EQ(out.bytes_done, bytes);
      ASSERT_EQ(out.requests.size(), n);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(out.requests[i].state, sched::RequestState::kCompleted) << i;
        EXPECT_TRUE(out.requests[i].status.is_ok()) << i;
        EXPECT_EQ(out.requests[i].bytes_done, batch.requests[i].length) << i;
        EXPECT_EQ(out.requests[i].completed_ns, fresh->requests[i].completed_ns) << i;
      }
      EXPECT_TRUE(p.initiator->release(*h).is_ok());
      EXPECT_EQ(p.initiator->poll(*h, out).code(), StatusCode::kNotFound);
    }
  }
}

TEST(DirectCopy, OffTheBatchTakesTheLoop) {
  Pair off(0);
  auto h = off.initiator->submit(Batch{{off.request(Op::kRead, 0, off.held_region, 0, 4096)}, {}});
  ASSERT_TRUE(h.has_value());
  ASSERT_TRUE(off.initiator->wait(*h, 10 * kSecond).is_ok());
  EXPECT_FALSE(pattern_mismatch(std::span(off.mine).first(4096), 1).has_value());
  const std::string m = off.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 0);
  EXPECT_EQ(counter(m, "baton_engine_batches_total"), 1);
  EXPECT_GT(off.initiator->stats().slices_posted, 0u);
}

// A batch above the bound is copied on the copier's thread: byte-exact
// through the memfd and through CMA, both ways, a batch of many requests
// out of order; the scheduler never sees it, and it is
// counted as a loop-free batch. run() copies such a batch on the caller's
// thread (it waits anyway), with the same result.
TEST(DirectCopy, ABatchAboveTheBoundIsCopiedOnTheCopiersThreadByteExact) {
  Pair p(4096);
  for (int round = 0; round < 8; ++round) {
    const bool memfd = round % 4 < 2;
    const Region& remote = memfd ? p.allocated : p.held_region;
    std::span<std::byte> theirs = memfd ? p.allocated_bytes() : std::span(p.held);
    const Op op = round % 2 == 0 ? Op::kRead : Op::kWrite;
    fill_pattern(op == Op::kRead ? theirs : std::span(p.mine), 60 + round);
    Batch b;  // 128 requests of 4 KiB, reversed, then the rest as one
    constexpr std::uint64_t kBlock = 4096, kBlocks = 128;
    for (std::uint64_t i = 0; i < kBlocks; ++i) {
      const std::uint64_t at = (kBlocks - 1 - i) * kBlock;
      b.requests.push_back(p.request(op, at, remote, at, kBlock));
    }
    b.requests.push_back(p.request(op, kBlocks * kBlock, remote, kBlocks * kBlock, Pair::kBytes - kBlocks * kBlock));
    if (round >= 4) {
      ASSERT_TRUE(p.initiator->run(b).is_ok());
    } else {
      auto h = p.initiator->submit(b);
      ASSERT_TRUE(h.has_value()) << h.error().to_string();
      ASSERT_TRUE(p.initiator->wait(*h, 10 * kSecond).is_ok());
      auto st = p.initiator->poll(*h);
      ASSERT_TRUE(st.has_value());
      EXPECT_TRUE(st->done);
      EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
      EXPECT_EQ(st->bytes, Pair::kBytes);
      EXPECT_EQ(st->bytes_done, Pair::kBytes);
      ASSERT_EQ(st->requests.size(), kBlocks + 1);
      for (const auto& r : st->requests) EXPECT_EQ(r.state, sched::RequestState::kCompleted);
      EXPECT_EQ(p.initiator->cancel(*h).code(), StatusCode::kInvalidArgument);  // already ended
      EXPECT_TRUE(p.initiator->release(*h).is_ok());
      EXPECT_EQ(p.initiator->poll(*h).error().code(), StatusCode::kNotFound);
    }
    EXPECT_FALSE(pattern_mismatch(op == Op::kRead ? std::span(p.mine) : theirs, 60 + round).has_value())
        << "round " << round;
  }
  const std::string m = p.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 8);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"read\",state=\"completed\"}"), 4 * 129);
  EXPECT_EQ(counter(m, "baton_engine_bytes_total{op=\"write\"}"), 4.0 * Pair::kBytes);
  EXPECT_EQ(p.initiator->stats().slices_posted, 0u);
  EXPECT_EQ(counter(m, "baton_engine_batches_held"), 0);
}

// Batches that take the loop copy on datapath threads when there are some
// (UcxConfig::copy_threads): byte-exact both ways, with batches of several
// requests split into slices over both lanes, and the scheduler counting
// them as any other.
TEST(DirectCopy, LoopBatchesCopyOnDatapathThreadsByteExact) {
  Pair p(0, 2);
  for (int round = 0; round < 6; ++round) {
    const Op op = round % 2 == 0 ? Op::kRead : Op::kWrite;
    std::span<std::byte> theirs = p.allocated_bytes();
    std::span<std::byte> source = op == Op::kRead ? theirs : std::span<std::byte>(p.mine);
    fill_pattern(source, 40 + round);
    Batch batch;
    for (std::uint64_t i = 0; i < 4; ++i) {
      batch.requests.push_back(p.request(op, i * (Pair::kBytes / 4), p.allocated, i * (Pair::kBytes / 4), Pair::kBytes / 4));
    }
    auto h = p.initiator->submit(batch);
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    ASSERT_TRUE(p.initiator->wait(*h, 10 * kSecond).is_ok());
    auto st = p.initiator->poll(*h);
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    EXPECT_EQ(st->bytes_done, Pair::kBytes);
    std::span<std::byte> sink = op == Op::kRead ? std::span<std::byte>(p.mine) : theirs;
    EXPECT_FALSE(pattern_mismatch(sink, 40 + round).has_value()) << "round " << round;
    EXPECT_TRUE(p.initiator->release(*h).is_ok());
  }
  const std::uint64_t slices = p.initiator->stats().slices_posted;
  EXPECT_GE(slices, 24u);  // all through the loop: a slice or more per request
  // Every one of them 32 KiB or more: each copied on a thread, and counted.
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_ucx_thread_copies_total"), static_cast<double>(slices));
  // A second scrape adds nothing again.
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_ucx_thread_copies_total"), static_cast<double>(slices));
}

// An initiator whose copier is held in the middle of a batch, without
// timing: batch A writes 12 MiB (12 requests of 1 MiB, three chunks; or,
// with `one_request`, one request of 12 MiB, three parts) from a buffer
// whose first page only a userfaultfd supplies, so the copier's thread
// stops in A's first chunk until supply(). Whatever is submitted meanwhile
// above the bound queues behind A.
struct HeldCopier {
  bool one_request = false;
  TimeNs a_timeout_ns = 0;
  static constexpr std::size_t kPage = 4096, kMiB = 1 << 20, kBytes = 12 * kMiB;
  static constexpr std::uint64_t kMine = 8, kTheirs = 7;  // pattern salts
  std::unique_ptr<Engine> holder = make_engine();
  std::unique_ptr<Engine> initiator = make_engine(4096);
  int uffd = -1;
  std::byte* mine = nullptr;
  Region local, theirs;
  Peer peer;
  Result<BatchHandle> a = std::unexpected(Status::internal("not submitted"));

  // Empty when set up, else why the test is skipped.
  std::string set_up() {
    // Non-blocking: a copy that never reached the page (its request timed
    // out first on a loaded machine) skips the test instead of hanging it.
    uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (uffd < 0) return std::string("no userfaultfd here: ") + std::strerror(errno);
    uffdio_api api{UFFD_API, 0, {}};
    if (::ioctl(uffd, UFFDIO_API, &api) != 0) return "UFFDIO_API refused";
    void* m = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return "mmap failed";
    mine = static_cast<std::byte*>(m);
    uffdio_register watch{{reinterpret_cast<unsigned long>(mine), kPage}, UFFDIO_REGISTER_MODE_MISSING, 0};
    if (::ioctl(uffd, UFFDIO_REGISTER, &watch) != 0) return "UFFDIO_REGISTER refused";
    fill_pattern(std::span(mine + kPage, kBytes - kPage), kMine, kPage);  // all but the held page
    local = *initiator->register_memory(mine, kBytes);
    theirs = *holder->allocate_memory(kBytes);
    fill_pattern(theirs_bytes(), kTheirs);
    EXPECT_TRUE(holder->export_region(theirs.handle).is_ok());
    auto p = initiator->connect(holder->address());
    if (!p) return p.error().to_string();
    peer = *p;
    Batch batch;
    for (std::uint64_t i = 0; i < (one_request ? 1 : 12); ++i) {
      batch.requests.push_back(write(i * kMiB, one_request ? kBytes : kMiB));
      batch.requests.back().timeout_ns = a_timeout_ns;
    }
    a = initiator->submit(batch);
    if (!a) return a.error().to_string();
    pollfd fault{uffd, POLLIN, 0};
    if (::poll(&fault, 1, 10'000) != 1) return "the copy never reached the held page";
    uffd_msg message{};
    if (::read(uffd, &message, sizeof message) != static_cast<ssize_t>(sizeof message)) return "no fault message";
    return {};
  }
  Request write(std::uint64_t offset, std::uint64_t length) const {
    return {.op = Op::kWrite, .local_region = local.handle, .local_offset = offset, .peer = peer.address,
            .remote_region = theirs.handle, .remote_offset = offset, .length = length};
  }
  std::span<std::byte> theirs_bytes() const { return {reinterpret_cast<std::byte*>(theirs.base), kBytes}; }
  // Lets the held copy go on.
  void supply() {
    static std::byte page[kPage];
    fill_pattern(page, kMine);
    uffdio_copy copy{reinterpret_cast<unsigned long>(mine), reinterpret_cast<unsigned long>(page), kPage, 0, 0};
    EXPECT_EQ(::ioctl(uffd, UFFDIO_COPY, &copy), 0);
  }
  ~HeldCopier() {
    if (uffd >= 0) ::close(uffd);  // a copy still held would fault (SIGBUS is not ours to test): supplied before
    initiator.reset();
    holder.reset();
    if (mine != nullptr) ::munmap(mine, kBytes);
  }
};

// While the copier copies, a batch it holds is running (poll says which of
// its requests are in the chunk under way and which wait), cannot be
// released, and keeps its local region registered; a cancel ends the
// requests no chunk took yet, whose bytes stay where they were, and a
// request that waited past its timeout ends timed out, uncopied.
TEST(DirectCopy, TheCopiersBatchesCanBeWatchedCancelledAndTimedOut) {
  HeldCopier h;
  if (std::string why = h.set_up(); !why.empty()) {
    if (h.a) h.supply();
    GTEST_SKIP() << why;
  }
  auto b = h.initiator->submit(Batch{{h.write(5 * HeldCopier::kMiB, 4096), h.write(5 * HeldCopier::kMiB + 8192, 4096)}, {}});
  Request late = h.write(11 * HeldCopier::kMiB, 8192);
  late.timeout_ns = 1'000'000;  // 1 ms: it waits longer behind A
  auto c = h.initiator->submit(Batch{{late}, {}});
  ASSERT_TRUE(b.has_value() && c.has_value());

  auto a_now = h.initiator->poll(*h.a);
  ASSERT_TRUE(a_now.has_value());
  EXPECT_FALSE(a_now->done);
  EXPECT_EQ(a_now->bytes, HeldCopier::kBytes);
  EXPECT_EQ(a_now->bytes_done, 0u);
  ASSERT_EQ(a_now->requests.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a_now->requests[i].state, i < 4 ? sched::RequestState::kRunning : sched::RequestState::kQueued) << i;
  }
  auto b_now = h.initiator->poll(*b);
  ASSERT_TRUE(b_now.has_value());
  EXPECT_FALSE(b_now->done);
  for (const auto& r : b_now->requests) EXPECT_EQ(r.state, sched::RequestState::kQueued);
  EXPECT_EQ(h.initiator->wait(*b, 0).code(), StatusCode::kTimeout);
  EXPECT_EQ(h.initiator->release(*h.a).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.initiator->unregister(h.local.handle).code(), StatusCode::kFailedPrecondition);

  EXPECT_TRUE(h.initiator->cancel(*b).is_ok());
  EXPECT_TRUE(h.initiator->cancel(*h.a).is_ok());  // its chunks 2 and 3 are not taken yet
  EXPECT_EQ(h.initiator->cancel(*b).code(), StatusCode::kInvalidArgument);  // already stopping, as on the loop
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past c's timeout
  h.supply();
  for (BatchHandle handle : {*h.a, *b, *c}) ASSERT_TRUE(h.initiator->wait(handle, 10 * kSecond).is_ok());

  auto a_end = h.initiator->poll(*h.a);
  ASSERT_TRUE(a_end.has_value());
  EXPECT_TRUE(a_end->done);
  EXPECT_EQ(a_end->status.code(), StatusCode::kCancelled) << a_end->status.to_string();
  EXPECT_EQ(a_end->bytes_done, 4 * HeldCopier::kMiB);
  for (std::size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a_end->requests[i].state, i < 4 ? sched::RequestState::kCompleted : sched::RequestState::kCancelled) << i;
  }
  auto b_end = h.initiator->poll(*b);
  ASSERT_TRUE(b_end.has_value());
  EXPECT_EQ(b_end->status.code(), StatusCode::kCancelled);
  EXPECT_EQ(b_end->bytes_done, 0u);
  auto c_end = h.initiator->poll(*c);
  ASSERT_TRUE(c_end.has_value());
  EXPECT_EQ(c_end->status.code(), StatusCode::kTimeout) << c_end->status.to_string();
  ASSERT_EQ(c_end->requests.size(), 1u);
  EXPECT_EQ(c_end->requests[0].state, sched::RequestState::kTimedOut);
  EXPECT_EQ(c_end->status.message(), "request 0 of the batch: not done 1 ms after submit (transfer timeout)");
  EXPECT_EQ(b_end->requests[1].status.message(), "request 1 of the batch cancelled");  // as the loop says it
  // What was copied landed; nothing else moved.
  const std::span<std::byte> theirs = h.theirs_bytes();
  EXPECT_FALSE(pattern_mismatch(theirs.first(4 * HeldCopier::kMiB), HeldCopier::kMine).has_value());
  EXPECT_FALSE(pattern_mismatch(theirs.subspan(4 * HeldCopier::kMiB), HeldCopier::kTheirs, 4 * HeldCopier::kMiB).has_value());

  EXPECT_EQ(h.initiator->cancel(*h.a).code(), StatusCode::kInvalidArgument);  // ended
  const std::string m = h.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 3);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"write\",state=\"completed\"}"), 4);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"write\",state=\"cancelled\"}"), 8 + 2);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"write\",state=\"timeout\"}"), 1);
  EXPECT_EQ(counter(m, "baton_engine_bytes_total{op=\"write\"}"), 4.0 * HeldCopier::kMiB);
  for (BatchHandle handle : {*h.a, *b, *c}) EXPECT_TRUE(h.initiator->release(handle).is_ok());
  EXPECT_TRUE(h.initiator->unregister(h.local.handle).is_ok());  // nothing names it any more
}

// A request larger than a chunk is copied a chunk-sized part at a time, so
// a cancel or its timeout stops it between two parts, as the loop stops a
// request between two slices: what landed stays counted, the rest stays
// where it was. Unheld, the same request is copied whole, byte-exact.
TEST(DirectCopy, ARequestLargerThanAChunkStopsBetweenItsParts) {
  constexpr std::uint64_t kPart = DirectCopier::kChunkBytes;
  static_assert(HeldCopier::kBytes == 3 * kPart);
  for (const bool timed_out : {false, true}) {
    SCOPED_TRACE(timed_out ? "timeout" : "cancel");
    HeldCopier h;
    h.one_request = true;
    // Long enough that the copier's first part starts (and is held) before
    // it, on a loaded machine too; else set_up skips.
    h.a_timeout_ns = timed_out ? 200'000'000 : 0;
    if (std::string why = h.set_up(); !why.empty()) {
      if (h.a) h.supply();
      GTEST_SKIP() << why;
    }
    auto now = h.initiator->poll(*h.a);
    ASSERT_TRUE(now.has_value());
    ASSERT_EQ(now->requests.size(), 1u);
    EXPECT_EQ(now->requests[0].state, sched::RequestState::kRunning);
    EXPECT_EQ(now->bytes_done, 0u);
    if (timed_out) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past its timeout, in its first part
    } else {
      EXPECT_TRUE(h.initiator->cancel(*h.a).is_ok()) << "its parts 2 and 3 are not taken yet";
      now = h.initiator->poll(*h.a);
      ASSERT_TRUE(now.has_value());
      EXPECT_EQ(now->requests[0].state, sched::RequestState::kCancelling);
      EXPECT_EQ(now->requests[0].bytes_unsent, 2 * kPart);  // the parts not taken
      const Status again = h.initiator->cancel(*h.a);
      EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(again.message().find("already stopping"), std::string::npos) << again.message();
    }
    h.supply();
    ASSERT_TRUE(h.initiator->wait(*h.a, 10 * kSecond).is_ok());
    auto end = h.initiator->poll(*h.a);
    ASSERT_TRUE(end.has_value());
    EXPECT_TRUE(end->done);
    const sched::RequestStatus& r = end->requests.at(0);
    EXPECT_EQ(end->status.code(), timed_out ? StatusCode::kTimeout : StatusCode::kCancelled) << end->status.to_string();
    EXPECT_EQ(r.state, timed_out ? sched::RequestState::kTimedOut : sched::RequestState::kCancelled);
    EXPECT_EQ(r.status.message(), timed_out ? "request 0 of the batch: not done 200 ms after submit (transfer timeout)"
                                            : "request 0 of the batch cancelled");
    EXPECT_EQ(r.bytes_done, kPart);
    EXPECT_EQ(r.bytes_unsent, 2 * kPart);
    EXPECT_EQ(end->bytes_done, kPart);
    const std::span<std::byte> theirs = h.theirs_bytes();
    EXPECT_FALSE(pattern_mismatch(theirs.first(kPart), HeldCopier::kMine).has_value());
    EXPECT_FALSE(pattern_mismatch(theirs.subspan(kPart), HeldCopier::kTheirs, kPart).has_value());
    const std::string m = h.initiator->metrics_text();
    EXPECT_EQ(counter(m, timed_out ? "baton_engine_requests_total{op=\"write\",state=\"timeout\"}"
                                   : "baton_engine_requests_total{op=\"write\",state=\"cancelled\"}"),
              1);
    EXPECT_EQ(counter(m, "baton_engine_bytes_total{op=\"write\"}"), 0);  // delivered: completed requests, as on the loop
    EXPECT_TRUE(h.initiator->release(*h.a).is_ok());

    // The page is there now: the same request, whole.
    auto whole = h.initiator->submit(Batch{{h.write(0, HeldCopier::kBytes)}, {}});
    ASSERT_TRUE(whole.has_value());
    ASSERT_TRUE(h.initiator->wait(*whole, 10 * kSecond).is_ok());
    auto st = h.initiator->poll(*whole);
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    EXPECT_EQ(st->requests.at(0).bytes_done, HeldCopier::kBytes);
    EXPECT_FALSE(pattern_mismatch(theirs, HeldCopier::kMine).has_value());
    EXPECT_TRUE(h.initiator->release(*whole).is_ok());
  }
}

// baton_engine_deadlines_missed_total counts, per QoS class, the requests
// that ended after their deadline or without completing, on every path:
// the loop's (a deadline 1 ns away: it completes late, or is ended
// infeasible under a policy that drops such requests), the copier's (a
// request queued behind a held batch past its deadline, stamped when its
// own chunk ended), and none for requests in time or without a deadline.
TEST(DirectCopy, MissedDeadlinesAreCountedPerQosOnEveryPath) {
  Pair loop(/*direct_copy_max_bytes=*/0);
  Request late = loop.request(Op::kRead, 0, loop.allocated, 0, 512 << 10);
  late.qos = sched::QosClass::kDecodeCritical;
  late.deadline_ns = loop.initiator->now_ns() + 1;
  Request in_time = loop.request(Op::kRead, 512 << 10, loop.allocated, 512 << 10, 4096);
  in_time.deadline_ns = loop.initiator->now_ns() + 60 * kSecond;
  for (const Request& r : {late, in_time, loop.request(Op::kRead, 768 << 10, loop.allocated, 768 << 10, 4096)}) {
    auto h = loop.initiator->submit(Batch{{r}, {}});
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    ASSERT_TRUE(loop.initiator->wait(*h, 10 * kSecond).is_ok());
    (void)loop.initiator->release(*h);
  }
  std::string m = loop.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_deadlines_missed_total{qos=\"decode_critical\"}"), 1);
  EXPECT_EQ(counter(m, "baton_engine_deadlines_missed_total{qos=\"prefill_bulk\"}"), 0);

  HeldCopier h;
  if (std::string why = h.set_up(); !why.empty()) {
    if (h.a) h.supply();
    GTEST_SKIP() << why;
  }
  // Behind A's 12 MiB, 20 ms is feasible at 1 ns a byte: it queues on the
  // copier, and A is held past it.
  Request queued = h.write(11 * HeldCopier::kMiB, 8192);
  queued.qos = sched::QosClass::kHotKv;
  queued.deadline_ns = h.initiator->now_ns() + 20'000'000;
  auto b = h.initiator->submit(Batch{{queued}, {}});
  ASSERT_TRUE(b.has_value());
  auto queued_now = h.initiator->poll(*b);
  ASSERT_TRUE(queued_now.has_value());
  EXPECT_EQ(queued_now->requests.at(0).state, sched::RequestState::kQueued) << "not on the copier";
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  h.supply();
  for (BatchHandle handle : {*h.a, *b}) ASSERT_TRUE(h.initiator->wait(handle, 10 * kSecond).is_ok());
  auto end = h.initiator->poll(*b);
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->status.is_ok()) << "late, not failed";
  EXPECT_TRUE(end->requests.at(0).deadline_missed());
  m = h.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_deadlines_missed_total{qos=\"hot_kv\"}"), 1);
  EXPECT_EQ(counter(m, "baton_engine_deadlines_missed_total{qos=\"prefill_bulk\"}"), 0);  // A has no deadline
  for (BatchHandle handle : {*h.a, *b}) EXPECT_TRUE(h.initiator->release(handle).is_ok());
}

// A batch the copier holds when the engine shuts down: shutdown returns
// only once the chunk under way ended (it copies from the caller's memory),
// and the chunks it had not taken end cancelled; so does a batch queued
// behind it.
TEST(DirectCopy, AShutdownWaitsForTheCopiersChunkAndCancelsTheRest) {
  HeldCopier h;
  if (std::string why = h.set_up(); !why.empty()) {
    if (h.a) h.supply();
    GTEST_SKIP() << why;
  }
  auto b = h.initiator->submit(Batch{{h.write(6 * HeldCopier::kMiB, 8192)}, {}});
  ASSERT_TRUE(b.has_value());
  std::atomic<bool> shut{false};
  std::thread shutdown([&] {
    h.initiator->shutdown();
    shut = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(shut.load()) << "shutdown returned while a copy from the caller's memory was under way";
  h.supply();
  shutdown.join();
  for (BatchHandle handle : {*h.a, *b}) {
    ASSERT_TRUE(h.initiator->wait(handle, 10 * kSecond).is_ok());
    auto st = h.initiator->poll(handle);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->status.code(), StatusCode::kCancelled) << st->status.to_string();
  }
  auto a_end = h.initiator->poll(*h.a);
  ASSERT_TRUE(a_end.has_value());
  EXPECT_EQ(a_end->bytes_done, 4 * HeldCopier::kMiB);
  EXPECT_FALSE(pattern_mismatch(h.theirs_bytes().subspan(4 * HeldCopier::kMiB), HeldCopier::kTheirs,
                                4 * HeldCopier::kMiB).has_value());
  EXPECT_EQ(h.initiator->submit(Batch{{h.write(0, 8192)}, {}}).error().code(), StatusCode::kUnavailable);
}

// `bound`: direct_copy_max_bytes; 1 sends every batch the copier's way,
// whose check on the submitting thread must refuse as the loop does.
void bad_requests_refused(std::uint64_t bound) {
  Pair p(bound);
  const std::vector<std::byte> before(p.held.begin(), p.held.end());
  const Request good = p.request(Op::kWrite, 0, p.held_region, 0, 4096);
  auto refused = [&](Request bad) {
    auto h = p.initiator->submit(Batch{{good, bad}, {}});
    return h ? Status::ok() : h.error();
  };
  Request r = p.request(Op::kRead, 0, p.held_region, Pair::kBytes - 10, 11);
  EXPECT_EQ(refused(r).code(), StatusCode::kOutOfRange);
  r = p.request(Op::kRead, Pair::kBytes - 10, p.held_region, 0, 11);
  EXPECT_EQ(refused(r).code(), StatusCode::kOutOfRange);
  r = p.request(Op::kRead, 0, p.held_region, 0, 0);
  EXPECT_EQ(refused(r).code(), StatusCode::kInvalidArgument);
  r.length = 8;
  r.remote_region = 999;
  EXPECT_EQ(refused(r).code(), StatusCode::kNotFound);
  r = p.request(Op::kRead, 0, p.held_region, 0, 8);
  r.local_region = 999;
  EXPECT_EQ(refused(r).code(), StatusCode::kNotFound);
  r = p.request(Op::kRead, 0, p.held_region, 0, 8);
  r.peer = "127.0.0.1:1";
  EXPECT_EQ(refused(r).code(), StatusCode::kNotFound);
  r = p.request(Op::kRead, 0, p.held_region, 0, 8);
  r.op = static_cast<Op>(7);
  EXPECT_EQ(refused(r).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.held, before);  // the good write of each refused batch did not happen
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_batches_total"), 0);
}

TEST(DirectCopy, ABadRequestGetsTheLoopsErrorAndNothingIsCopied) { bad_requests_refused(16 << 20); }

TEST(DirectCopy, ABadRequestInABatchForTheCopierGetsTheLoopsErrorToo) { bad_requests_refused(1); }

TEST(DirectCopy, ANotificationFollowsTheBytes) {
  Pair p;
  fill_pattern(std::span(p.mine).first(4096), 77);
  auto h = p.initiator->submit(Batch{{p.request(Op::kWrite, 0, p.allocated, 0, 4096)}, "layer 3 landed"});
  ASSERT_TRUE(h.has_value());
  std::vector<transport::Notification> got;
  for (int i = 0; i < 500 && got.empty(); ++i) {
    got = p.holder->take_notifications();
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "layer 3 landed");
  EXPECT_FALSE(pattern_mismatch(p.allocated_bytes().first(4096), 77).has_value());
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_notifications_sent_total"), 1);
}

// A direct batch with a notification ends on the loop once the notification
// is sent: poll and release right after submit see it running or ended,
// never unknown.
TEST(DirectCopy, ABatchWaitingForItsNotificationIsNeverUnknown) {
  Pair p;
  for (int i = 0; i < 50; ++i) {
    auto h = p.initiator->submit(Batch{{p.request(Op::kWrite, 0, p.allocated, 0, 4096)}, "n"});
    ASSERT_TRUE(h.has_value());
    auto st = p.initiator->poll(*h);
    ASSERT_TRUE(st.has_value()) << st.error().to_string();
    Status released = p.initiator->release(*h);
    if (!released.is_ok()) {
      EXPECT_EQ(released.code(), StatusCode::kInvalidArgument) << released.to_string();  // still running
      ASSERT_TRUE(p.initiator->wait(*h, 10 * kSecond).is_ok());
      EXPECT_TRUE(p.initiator->release(*h).is_ok());
    }
    EXPECT_EQ(p.initiator->poll(*h).error().code(), StatusCode::kNotFound);
  }
}

// Copies from several threads while the holder revokes the region they
// copy from: unregister returns only once no copy can still touch it, and
// every batch ends (completed before, not_found after); nothing crashes.
// A prepared batch, resolved once, must see the revocation as well: its
// addresses are dropped with the table they were found in.
// Engine::run ends a batch with no record at all, prepared (resolved once)
// or not (resolved each run). kCopier: batches above the bound, on the copier's thread; one queued
// before the revocation and copied after it ends `unavailable`.
enum class Submission { kBatch, kPrepared, kRun, kRunPlain, kCopier };

void revoke_while_copying(Submission how) {
  Pair p(how == Submission::kCopier ? 4096 : 16 << 20);
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t offset = static_cast<std::uint64_t>(t) * (64 << 10);
      const Batch b{{p.request(t % 2 == 0 ? Op::kRead : Op::kWrite, offset, p.allocated, offset, 64 << 10)}, {}};
      PreparedBatch pb(b);
      while (!stop) {
        if (how == Submission::kRun || how == Submission::kRunPlain) {
          const Status s = how == Submission::kRun ? p.initiator->run(pb) : p.initiator->run(b);
          (s.is_ok() ? completed : s.code() == StatusCode::kNotFound ? refused : other)++;
          continue;
        }
        auto h = how == Submission::kPrepared ? p.initiator->submit(pb) : p.initiator->submit(b);
        if (!h) {
          (h.error().code() == StatusCode::kNotFound ? refused : other)++;
          continue;
        }
        if (!p.initiator->wait(*h, 10 * kSecond).is_ok()) {
          ++other;
          continue;
        }
        auto st = p.initiator->poll(*h);
        const bool gone = how == Submission::kCopier && st && st->status.code() == StatusCode::kUnavailable;
        (st && st->status.is_ok() ? completed : gone ? refused : other)++;
        (void)p.initiator->release(*h);
      }
    });
  }
  // Bounded: a copier that stopped making progress fails the test, not the suite's clock.
  auto until = [](const std::function<bool()>& done) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
    return done();
  };
  const bool copied = until([&] { return completed >= 200; });
  EXPECT_TRUE(copied);
  EXPECT_TRUE(p.holder->unregister(p.allocated.handle).is_ok());
  const int at_unregister = refused.load();
  const bool refusing = until([&] { return refused >= at_unregister + 50; });
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_TRUE(refusing);
  EXPECT_GE(completed.load(), 200);
  EXPECT_EQ(other.load(), 0);
}

TEST(DirectCopy, ARevocationWaitsForCopiesUnderWayAndLaterOnesFail) { revoke_while_copying(Submission::kBatch); }

TEST(DirectCopy, ARevocationEndsAPreparedBatchsCopiesToo) { revoke_while_copying(Submission::kPrepared); }

TEST(DirectCopy, ARevocationEndsRunsOfAPreparedBatchToo) { revoke_while_copying(Submission::kRun); }

TEST(DirectCopy, ARevocationEndsRunsOfAPlainBatchToo) { revoke_while_copying(Submission::kRunPlain); }

TEST(DirectCopy, ARevocationEndsTheCopiersBatchesToo) { revoke_while_copying(Submission::kCopier); }

// A prepared batch submitted again and again moves the bytes of each
// submission, stays right while regions come and go around it (each change
// publishes a new table: it is resolved again), and ends as submit(batch())
// would when it cannot go directly.
TEST(DirectCopy, APreparedBatchMovesEachSubmissionsBytes) {
  Pair p;
  constexpr std::uint64_t kBlock = 4096;
  const Batch b = p.block_reads(8, kBlock);
  PreparedBatch prepared(b);
  EXPECT_EQ(prepared.batch().requests.size(), 8u);
  for (int round = 0; round < 30; ++round) {
    fill_pattern(p.allocated_bytes().subspan(8 * kBlock, 8 * kBlock), 500 + round);
    if (round % 10 == 5) p.new_table();
    auto h = p.initiator->submit(prepared);
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    auto st = p.initiator->poll(*h);
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->done);
    EXPECT_TRUE(st->status.is_ok()) << st->status.to_string();
    ASSERT_EQ(st->requests.size(), 8u);
    EXPECT_EQ(st->bytes_done, 8 * kBlock);
    for (const sched::RequestStatus& r : st->requests) {
      EXPECT_EQ(r.state, sched::RequestState::kCompleted);
      EXPECT_EQ(r.bytes_done, kBlock);
      EXPECT_LE(r.submitted_ns, r.completed_ns);
    }
    EXPECT_FALSE(pattern_mismatch(std::span(p.mine).first(8 * kBlock), 500 + round).has_value()) << "round " << round;
    EXPECT_TRUE(p.initiator->release(*h).is_ok());
  }
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_direct_batches_total"), 30);

  // Our region leaves: the prepared batch gets submit's not_found, as a
  // new batch would, and copies nothing.
  std::ranges::fill(p.mine, std::byte{0});
  ASSERT_TRUE(p.initiator->unregister(p.mine_region.handle).is_ok());
  auto gone = p.initiator->submit(prepared);
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code(), StatusCode::kNotFound) << gone.error().to_string();
  EXPECT_EQ(gone.error().code(), p.initiator->submit(b).error().code());
  EXPECT_TRUE(std::ranges::all_of(p.mine, [](std::byte x) { return x == std::byte{0}; }));
}

// One PreparedBatch made for engine A, submitted to A and to B in turn
// (both reading the same holder): B does not know A's region (handles are
// unique in the process) and never copies with A's resolution, whose table
// generation B's may reach; A's submissions keep landing.
TEST(DirectCopy, APreparedBatchSubmittedToAnotherEngineIsNotFoundThere) {
  Pair a;
  std::vector<std::byte> theirs_too(Pair::kBytes);
  auto b = make_engine();
  auto b_region = b->register_memory(theirs_too.data(), theirs_too.size());
  ASSERT_TRUE(b_region.has_value());
  // Region handles are unique in the process: B's region is not A's.
  ASSERT_NE(b_region->handle, a.mine_region.handle);
  auto b_peer = b->connect(a.holder->address());
  ASSERT_TRUE(b_peer.has_value());
  ASSERT_EQ(b_peer->address, a.peer.address);
  PreparedBatch prepared(Batch{{a.request(Op::kRead, 0, a.allocated, 0, 4096)}, {}});
  // Each engine's table changes one at a time (a region registered: a new
  // table), so that at some round their generations would meet, were they
  // per engine: B never copies with what A resolved.
  std::vector<std::vector<std::byte>> spare(40, std::vector<std::byte>(64));
  const std::vector<std::byte> untouched(theirs_too.begin(), theirs_too.end());
  for (int round = 0; round < 80; ++round) {
    fill_pattern(a.allocated_bytes().first(4096), 300 + round);
    Engine& bumped = round < 40 ? *b : *a.initiator;
    if (round % 2 == 0) {
      ASSERT_TRUE(bumped.register_memory(spare[round / 2].data(), 64).has_value());
    }
    if (round % 2 == 0) {
      auto h = a.initiator->submit(prepared);
      ASSERT_TRUE(h.has_value()) << h.error().to_string();
      ASSERT_TRUE(a.initiator->wait(*h, 10 * kSecond).is_ok());
      EXPECT_TRUE(a.initiator->release(*h).is_ok());
      EXPECT_FALSE(pattern_mismatch(std::span(a.mine).first(4096), 300 + round).has_value()) << "round " << round;
    } else {
      auto h = b->submit(prepared);
      ASSERT_FALSE(h.has_value()) << "round " << round;
      EXPECT_EQ(h.error().code(), StatusCode::kNotFound) << h.error().to_string();
    }
  }
  EXPECT_EQ(theirs_too, untouched);
}

// What submit refuses, a prepared batch is refused too, with the same code,
// every time (a refusal leaves nothing resolved that a later submit skips).
TEST(DirectCopy, APreparedBadBatchGetsSubmitsErrorEveryTime) {
  Pair p;
  const std::vector<std::byte> before(p.held.begin(), p.held.end());
  const Request good = p.request(Op::kWrite, 0, p.held_region, 0, 4096);
  Request outside = p.request(Op::kRead, 0, p.held_region, Pair::kBytes - 10, 11);
  Request empty = p.request(Op::kRead, 0, p.held_region, 0, 0);
  Request unknown = p.request(Op::kRead, 0, p.held_region, 0, 8);
  unknown.remote_region = 999;
  Request late = p.request(Op::kRead, 0, p.held_region, 0, 8);
  late.deadline_ns = 1;  // long past: admission's to judge, not the direct path's
  for (const auto& [bad, code] : {std::pair{outside, StatusCode::kOutOfRange}, std::pair{empty, StatusCode::kInvalidArgument},
                                  std::pair{unknown, StatusCode::kNotFound}}) {
    PreparedBatch prepared(Batch{{good, bad}, {}});
    for (int i = 0; i < 3; ++i) {
      auto h = p.initiator->submit(prepared);
      ASSERT_FALSE(h.has_value());
      EXPECT_EQ(h.error().code(), code) << h.error().to_string();
    }
  }
  EXPECT_EQ(p.held, before);
  // A deadline is checked against the clock on every submit, never skipped.
  PreparedBatch with_deadline(Batch{{late}, {}});
  for (int i = 0; i < 3; ++i) {
    auto h = p.initiator->submit(with_deadline);
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    ASSERT_TRUE(p.initiator->wait(*h, 10 * kSecond).is_ok());
    auto st = p.initiator->poll(*h);
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(st->requests[0].deadline_missed()) << "submission " << i;
    EXPECT_TRUE(p.initiator->release(*h).is_ok());
  }
  // Each went through admission and the scheduler, none the direct way.
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_direct_batches_total"), 0);
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_batches_total"), 3);
  EXPECT_GE(p.initiator->stats().slices_posted, 3u);
}

TEST(DirectCopy, ThreadsCopyingAtOnceEachGetTheirOwnBytes) {
  Pair p;
  constexpr int kThreads = 4;
  constexpr std::uint64_t kSlot = Pair::kBytes / kThreads;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t at = static_cast<std::uint64_t>(t) * kSlot;
      for (int i = 0; i < 200; ++i) {
        const std::uint64_t salt = 1000 + static_cast<std::uint64_t>(t) * 1000 + static_cast<std::uint64_t>(i);
        fill_pattern(std::span(p.mine).subspan(at, kSlot), salt);
        auto h = p.initiator->submit(Batch{{p.request(Op::kWrite, at, p.allocated, at, kSlot)}, {}});
        if (!h || !p.initiator->wait(*h, 10 * kSecond).is_ok()) {
          ++failures;
          continue;
        }
        (void)p.initiator->release(*h);
        if (pattern_mismatch(p.allocated_bytes().subspan(at, kSlot), salt)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(counter(p.initiator->metrics_text(), "baton_engine_direct_batches_total"), kThreads * 200);
}

// run(): submit, wait and release in one call. A prepared same-host batch
// runs with no record left behind (nothing held, nothing for the
// scheduler), moves each run's bytes while tables change around it, and
// is counted like any batch; the other ways end as submit() and poll()
// would have said.
TEST(DirectCopy, RunMovesEachRunsBytesAndLeavesNoRecord) {
  Pair p;
  constexpr std::uint64_t kBlock = 4096;
  const Batch b = p.block_reads(4, kBlock);
  PreparedBatch prepared(b);
  for (int round = 0; round < 30; ++round) {
    fill_pattern(p.allocated_bytes().subspan(4 * kBlock, 4 * kBlock), 700 + round);
    if (round % 10 == 5) p.new_table();  // the prepared batch is resolved again
    const Status s = round % 3 == 2 ? p.initiator->run(b) : p.initiator->run(prepared);
    ASSERT_TRUE(s.is_ok()) << "round " << round << ": " << s.to_string();
    EXPECT_FALSE(pattern_mismatch(std::span(p.mine).first(4 * kBlock), 700 + round).has_value()) << "round " << round;
  }
  std::string m = p.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 30);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"read\",state=\"completed\"}"), 120);
  EXPECT_EQ(counter(m, "baton_engine_bytes_total{op=\"read\"}"), 120 * kBlock);
  EXPECT_EQ(counter(m, "baton_engine_batches_held"), 0);
  EXPECT_EQ(p.initiator->stats().slices_posted, 0u);

  // A write, then through the loop (a batch above the direct limit's
  // engine): the same bytes, the scheduler's way.
  fill_pattern(std::span(p.mine).first(kBlock), 800);
  ASSERT_TRUE(p.initiator->run(Batch{{p.request(Op::kWrite, 0, p.allocated, 9 * kBlock, kBlock)}, {}}).is_ok());
  EXPECT_FALSE(pattern_mismatch(p.allocated_bytes().subspan(9 * kBlock, kBlock), 800).has_value());
  Pair loop(/*direct_copy_max_bytes=*/0);
  fill_pattern(loop.allocated_bytes().first(kBlock), 801);
  PreparedBatch through_loop(Batch{{loop.request(Op::kRead, 0, loop.allocated, 0, kBlock)}, {}});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loop.initiator->run(through_loop).is_ok());
  EXPECT_FALSE(pattern_mismatch(std::span(loop.mine).first(kBlock), 801).has_value());
  m = loop.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), 0);
  EXPECT_EQ(counter(m, "baton_engine_batches_total"), 3);
  EXPECT_EQ(counter(m, "baton_engine_batches_held"), 0);  // released there too
}

TEST(DirectCopy, RunAnswersWhatSubmitWouldHaveRefused) {
  Pair p;
  const std::vector<std::byte> before(p.held.begin(), p.held.end());
  Request outside = p.request(Op::kWrite, 0, p.held_region, Pair::kBytes - 10, 11);
  Request unknown = p.request(Op::kWrite, 0, p.held_region, 0, 8);
  unknown.remote_region = 999;
  for (const auto& [bad, code] : {std::pair{outside, StatusCode::kOutOfRange}, std::pair{unknown, StatusCode::kNotFound}}) {
    PreparedBatch prepared(Batch{{p.request(Op::kWrite, 0, p.held_region, 0, 4096), bad}, {}});
    for (int i = 0; i < 3; ++i) EXPECT_EQ(p.initiator->run(prepared).code(), code);
    EXPECT_EQ(p.initiator->run(prepared.batch()).code(), code);
  }
  EXPECT_EQ(p.initiator->run(Batch{}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.held, before);  // all or nothing
  // Our region leaves after runs resolved it: not_found, nothing copied.
  PreparedBatch read(Batch{{p.request(Op::kRead, 0, p.held_region, 0, 4096)}, {}});
  ASSERT_TRUE(p.initiator->run(read).is_ok());
  std::ranges::fill(p.mine, std::byte{0});
  ASSERT_TRUE(p.initiator->unregister(p.mine_region.handle).is_ok());
  EXPECT_EQ(p.initiator->run(read).code(), StatusCode::kNotFound);
  EXPECT_TRUE(std::ranges::all_of(p.mine, [](std::byte x) { return x == std::byte{0}; }));
  p.initiator->shutdown();
  EXPECT_EQ(p.initiator->run(read).code(), StatusCode::kUnavailable);
  EXPECT_EQ(p.initiator->run(read.batch()).code(), StatusCode::kUnavailable);
}

// Threads that run at once and then exit are each counted exactly.
TEST(DirectCopy, RunsFromManyThreadsAreEachCounted) {
  Pair p;
  constexpr int kThreads = 4, kRuns = 300;
  constexpr std::uint64_t kSlot = Pair::kBytes / kThreads;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t at = static_cast<std::uint64_t>(t) * kSlot;
      PreparedBatch write(Batch{{p.request(Op::kWrite, at, p.allocated, at, 4096)}, {}});
      for (int i = 0; i < kRuns; ++i) {
        const std::uint64_t salt = 5000 + static_cast<std::uint64_t>(t) * 1000 + static_cast<std::uint64_t>(i);
        fill_pattern(std::span(p.mine).subspan(at, 4096), salt);
        if (!p.initiator->run(write).is_ok() || pattern_mismatch(p.allocated_bytes().subspan(at, 4096), salt)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const std::string m = p.initiator->metrics_text();
  EXPECT_EQ(counter(m, "baton_engine_direct_batches_total"), kThreads * kRuns);
  EXPECT_EQ(counter(m, "baton_engine_requests_total{op=\"write\",state=\"completed\"}"), kThreads * kRuns);
  EXPECT_EQ(counter(m, "baton_engine_bytes_total{op=\"write\"}"), kThreads * kRuns * 4096.0);
}

// What a holder in another process sees when its initiator shuts down while
// one of its copies into the holder's memory still runs (held here by a
// userfaultfd page of the initiator's source, a stand-in for any slow copy,
// supplied 300 ms later). The holder takes the initiator's going as leave to
// unmap and reuse the memory, so the initiator must not go before its
// copies ended: the holder's unregister returned at once, and the copy then
// wrote 4096 bytes into the memory it had reused. The copy runs on the
// caller's thread (run), on the loop's CMA thread, or on the copier's.
enum class Copier { kCaller, kLoop, kCopier };

void shutdown_under_a_held_copy(Copier where) {
  constexpr std::size_t kPage = 4096, kBytes = 16 * kPage;
  auto put = [](int fd, const std::string& s) {
    const auto n = static_cast<std::uint32_t>(s.size());
    return ::write(fd, &n, 4) == 4 && ::write(fd, s.data(), n) == static_cast<ssize_t>(n);
  };
  auto get = [](int fd) {
    std::uint32_t n = 0;
    if (::read(fd, &n, 4) != 4 || n > 4096) return std::string();
    std::string s(n, '\0');
    for (std::size_t got = 0; got < n;) {
      const ssize_t k = ::read(fd, s.data() + got, n - got);
      if (k <= 0) return std::string();
      got += static_cast<std::size_t>(k);
    }
    return s;
  };
  // The holder, our child, confirms our same-host copies by reading our
  // memory, which Yama's ptrace_scope 1 or more refuses a child.
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  if (int scope = 0; yama >> scope && scope >= 1) GTEST_SKIP() << "Yama ptrace_scope " << scope;
  const int uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC));
  if (uffd < 0) GTEST_SKIP() << "no userfaultfd here: " << std::strerror(errno);
  const struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_uffd{uffd};
  uffdio_api api{UFFD_API, 0, {}};
  ASSERT_EQ(::ioctl(uffd, UFFDIO_API, &api), 0);
  int to_holder[2], from_holder[2];
  ASSERT_EQ(::pipe(to_holder), 0);
  ASSERT_EQ(::pipe(from_holder), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the holder
    ::alarm(30);
    auto holder = make_engine();
    auto* held = static_cast<unsigned char*>(
        ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    std::memset(held, 0, kBytes);
    auto region = holder->register_memory(held, kBytes);
    if (!region || !holder->export_region(region->handle).is_ok()) ::_exit(2);
    if (!put(from_holder[1], holder->address() + " " + std::to_string(region->handle))) ::_exit(2);
    if (get(to_holder[0]) != "unregister" || !holder->unregister(region->handle).is_ok()) ::_exit(2);
    std::memset(held, 0x55, kBytes);  // reused: the caller may, once unregister returned
    if (!put(from_holder[1], "reused") || get(to_holder[0]) != "check") ::_exit(2);
    const auto late = std::count(held, held + kBytes, 0xAA);
    std::fprintf(stderr, "holder: %td bytes written into its memory after unregister returned\n", late);
    ::_exit(late == 0 ? 0 : 1);
  }
  const std::string hello = get(from_holder[0]);
  ASSERT_NE(hello.find(' '), std::string::npos);
  auto initiator = make_engine(where == Copier::kCaller ? 16 << 20 : where == Copier::kLoop ? 0 : 4096);
  auto* mine = static_cast<unsigned char*>(
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  std::memset(mine, 0xAA, kBytes - kPage);  // the last page is supplied by the fault handler below
  uffdio_register watch{{reinterpret_cast<unsigned long>(mine + kBytes - kPage), kPage}, UFFDIO_REGISTER_MODE_MISSING, 0};
  ASSERT_EQ(::ioctl(uffd, UFFDIO_REGISTER, &watch), 0);
  auto local = initiator->register_memory(mine, kBytes);
  ASSERT_TRUE(local.has_value());
  auto peer = initiator->connect(hello.substr(0, hello.find(' ')));
  ASSERT_TRUE(peer.has_value()) << peer.error().to_string();
  ASSERT_EQ(peer->transport, "shm");
  Request write{.op = Op::kWrite, .local_region = local->handle, .peer = peer->address,
                .remote_region = static_cast<RegionHandle>(std::stoul(hello.substr(hello.find(' ') + 1))),
                .length = kBytes};
  Status copied;
  std::thread copier([&] {
    if (where != Copier::kCopier) {
      copied = initiator->run(Batch{{write}, {}});
      return;
    }
    auto h = initiator->submit(Batch{{write}, {}});
    copied = h ? initiator->wait(*h, 10 * kSecond) : h.error();
  });
  pollfd fault{uffd, POLLIN, 0};
  ASSERT_EQ(::poll(&fault, 1, 10'000), 1) << "the copy never reached the held page";
  uffd_msg message{};
  ASSERT_EQ(::read(uffd, &message, sizeof message), static_cast<ssize_t>(sizeof message));
  std::thread supply([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    static unsigned char page[kPage];
    std::memset(page, 0xAA, kPage);
    uffdio_copy copy{reinterpret_cast<unsigned long>(mine + kBytes - kPage), reinterpret_cast<unsigned long>(page),
                     kPage, 0, 0};
    (void)::ioctl(uffd, UFFDIO_COPY, &copy);
  });
  initiator->shutdown();
  EXPECT_TRUE(put(to_holder[1], "unregister"));
  EXPECT_EQ(get(from_holder[0]), "reused");
  supply.join();
  copier.join();
  EXPECT_TRUE(put(to_holder[1], "check"));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the holder hung (SIGALRM) or crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the initiator's copy landed in memory the holder had reused (see stderr)";
  for (int fd : {to_holder[0], to_holder[1], from_holder[0], from_holder[1]}) ::close(fd);
  initiator.reset();
  ::munmap(mine, kBytes);
  (void)copied;  // ok or cancelled: either way its bytes left before the holder was told
}

TEST(DirectCopy, AnInitiatorThatShutsDownLeavesItsSameHostHolderOnlyOnceItsCopiesEnded) {
  shutdown_under_a_held_copy(Copier::kCaller);
}

TEST(DirectCopy, TheLoopsCmaCopiesAreWaitedForToo) { shutdown_under_a_held_copy(Copier::kLoop); }

TEST(DirectCopy, TheCopiersCmaCopiesAreWaitedForToo) { shutdown_under_a_held_copy(Copier::kCopier); }

}  // namespace
}  // namespace baton::engine
