// Two UcxTransport instances in one process on loopback, both progressed by
// the test thread, over TCP and over shared memory. Every wait has a
// deadline of a few seconds and fails the test instead of hanging.
#include "baton/transport/ucx_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <thread>

#include "baton/transport/codec.h"
#include "transport/ucx/wire.h"

namespace baton::transport {
namespace {

using namespace std::chrono_literals;

struct Flavor {
  std::string name;
  std::string tls;
  bool peer_failure_detection = true;
  topology::PathType expected = topology::PathType::kTcp;
  bool tcp_slices_as_messages = true;
  bool same_host_copy = false;
  std::vector<std::string> nics;  // rails (UcxConfig::nics)
  int copy_threads = 0;           // UcxConfig::copy_threads
  int progress_threads = 0;       // UcxConfig::progress_threads
};

// Test names and ctest entries show the flavour, not its bytes.
void PrintTo(const Flavor& flavor, std::ostream* os) { *os << flavor.name; }

// UCX 1.13 selects sysv/posix shared memory only without peer-failure
// handling (they report dead peers by "ep_check" alone), so the shm flavour
// runs with it off.
const Flavor kTcp{"tcp", "tcp", true, topology::PathType::kTcp, true, false, {}};
const Flavor kShm{"shm", "sm,tcp", false, topology::PathType::kShm, true, false, {}};
// TCP with UCX's software RMA instead of Baton's messages.
const Flavor kTcpRma{"tcp_rma", "tcp", true, topology::PathType::kTcp, false, false, {}};
// The default: a peer of this host gets Baton's own copy (same_host.h).
const Flavor kDirect{"direct", "", true, topology::PathType::kShm, true, true, {}};
// The same, its copies on two datapath threads.
const Flavor kDirectThreads{"direct_threads", "", true, topology::PathType::kShm, true, true, {}, 2};
// Two rails (a UCP context and worker each) on loopback: lane 0 on the first,
// lane 1 on the second, every region mapped on both; with Baton's messages
// and with UCX's RMA (each rail's rkeys).
const Flavor kRails{"tcp_rails", "tcp", true, topology::PathType::kTcp, true, false, {"lo", "lo"}};
const Flavor kRmaRails{"tcp_rma_rails", "tcp", true, topology::PathType::kTcp, false, false, {"lo", "lo"}};
// The same paths with a progress thread per rail: UCX's TCP, its shared
// memory, and two rails progressing at once.
const Flavor kTcpThreads{"tcp_progress_threads", "tcp", true, topology::PathType::kTcp, true, false, {}, 0, 1};
const Flavor kShmThreads{"shm_progress_threads", "sm,tcp", false, topology::PathType::kShm, true, false, {}, 0, 1};
const Flavor kRailsThreads{"tcp_rails_progress_threads", "tcp", true, topology::PathType::kTcp, true, false, {"lo", "lo"},
                           0, 1};
const Flavor kRmaRailsThreads{
    "tcp_rma_rails_progress_threads", "tcp", true, topology::PathType::kTcp, false, false, {"lo", "lo"}, 0, 1};

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + seed + (i >> 12)) & 0xff);
  return v;
}

SliceSubmit slice(SliceId id, PathId path, int lane, Op op, void* local, std::uint64_t remote_addr,
                  std::uint32_t remote_key, std::uint64_t bytes) {
  return {id, path, lane, bytes, {op, local, remote_addr, remote_key}};
}

std::uint64_t addr(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

class UcxTransportTest : public ::testing::TestWithParam<Flavor> {
 protected:
  UcxConfig config(std::int64_t handshake_timeout_ms = 5000) const {
    UcxConfig c;
    c.lanes_per_peer = 2;
    c.tls = GetParam().tls;
    c.peer_failure_detection = GetParam().peer_failure_detection;
    c.handshake_timeout_ms = handshake_timeout_ms;
    c.tcp_slices_as_messages = GetParam().tcp_slices_as_messages;
    c.same_host_copy = GetParam().same_host_copy;
    c.nics = GetParam().nics;
    c.copy_threads = GetParam().copy_threads;
    c.progress_threads = GetParam().progress_threads;
    return c;
  }

  std::unique_ptr<UcxTransport> make(std::int64_t handshake_timeout_ms = 5000) {
    auto t = UcxTransport::create(config(handshake_timeout_ms));
    EXPECT_TRUE(t.has_value()) << t.error().to_string();
    return t ? std::move(*t) : nullptr;
  }

  void SetUp() override {
    a_ = make();
    b_ = make();
    ASSERT_TRUE(a_ && b_);
  }

  // Both sides close cleanly while both are polled (a flushing close needs
  // the peer); best effort: a peer that never existed cannot answer.
  void TearDown() override {
    if (a_) a_->shutdown();
    if (b_) b_->shutdown();
    wait_until([&] { return (!a_ || a_->shutdown_complete()) && (!b_ || b_->shutdown_complete()); }, 2s);
  }

  // Memory registered in a test outlives both transports (fixture members
  // are destroyed after them): until a transport is gone UCX may still carry
  // out a peer's RMA into it, and software RMA (over shared memory here)
  // writes wherever the initiator says.
  std::vector<std::uint8_t>& buffer(std::size_t n, std::uint8_t fill = 0) { return buffers_.emplace_back(n, fill); }
  std::vector<std::uint8_t>& buffer(std::vector<std::uint8_t> v) { return buffers_.emplace_back(std::move(v)); }

  TimeNs now() const { return clock_.now_ns(); }

  // What a holder does: registers on b_ and exports to every peer.
  Result<RegionHandle> expose(void* p, std::size_t n) {
    auto r = b_->register_memory(p, n);
    if (!r) return r;
    if (Status s = b_->export_region(*r); !s.is_ok()) return std::unexpected(s);
    return r;
  }

  void poll_both() {
    if (a_) a_->poll(now(), done_a_);
    if (b_) b_->poll(now(), done_b_);
  }

  // Polls both sides until `done` holds; false after `limit`.
  bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 5s) {
    const TimeNs deadline = now() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
    while (!done()) {
      if (now() > deadline) return false;
      poll_both();
    }
    return true;
  }

  // Connects a_ to b_ and waits for the handshake; skips when UCX did not
  // pick the flavour's transport here.
  PathId connect_ready() {
    auto path = a_->connect(b_->address(), now());
    EXPECT_TRUE(path.has_value()) << path.error().to_string();
    if (!path) return 0;
    EXPECT_TRUE(wait_until([&] { return a_->path_state(*path) != PathState::kConnecting; }))
        << a_->path_status(*path).to_string();
    EXPECT_EQ(a_->path_state(*path), PathState::kReady) << a_->path_status(*path).to_string();
    return *path;
  }

  // What a write-then-read-back test needs: a zeroed region of `bytes` the
  // holder exposed, a ready path to it, and this side's registered source
  // (a pattern) and read-back buffers. Failures are recorded: the caller
  // checks HasFailure(), then skips unless the path has its flavour's transport.
  struct RoundTrip {
    std::vector<std::uint8_t>* remote = nullptr;
    RegionHandle remote_region = 0;
    PathId path = 0;
    std::vector<std::uint8_t> source;
    std::vector<std::uint8_t>* local = nullptr;
    std::vector<std::uint8_t>* back = nullptr;
  };
  RoundTrip round_trip(std::size_t bytes, std::uint8_t seed) {
    RoundTrip rt;
    rt.remote = &buffer(bytes, 0);
    auto region = expose(rt.remote->data(), bytes);
    EXPECT_TRUE(region.has_value()) << region.error().to_string();
    if (!region) return rt;
    rt.remote_region = *region;
    rt.path = connect_ready();
    rt.source = pattern(bytes, seed);
    rt.local = &buffer(rt.source);
    rt.back = &buffer(bytes, 0);
    EXPECT_TRUE(a_->register_memory(rt.local->data(), bytes).has_value());
    EXPECT_TRUE(a_->register_memory(rt.back->data(), bytes).has_value());
    return rt;
  }

  void reach_holders_through_one_slot(bool same_address);

  bool wait_slices(std::size_t count, std::chrono::milliseconds limit = 5s) {
    return wait_until([&] { return done_a_.size() >= count; }, limit);
  }

  SteadyClock clock_;
  std::deque<std::vector<std::uint8_t>> buffers_;  // before the transports: destroyed after them
  std::unique_ptr<UcxTransport> a_;
  std::unique_ptr<UcxTransport> b_;
  std::vector<Completion> done_a_;
  std::vector<Completion> done_b_;
};

#define SKIP_UNLESS_FLAVOR_TRANSPORT(path)                                                                 \
  do {                                                                                                     \
    if (a_->paths()[path].type != GetParam().expected) {                                                   \
      GTEST_SKIP() << "UCX chose " << topology::to_string(a_->paths()[path].type) << " instead of "        \
                   << topology::to_string(GetParam().expected) << " for tls \"" << GetParam().tls << "\""; \
    }                                                                                                      \
  } while (0)

TEST_P(UcxTransportTest, HandshakeLearnsThePeersRegionsAndTransport) {
  auto& remote = buffer(64 * 1024);
  auto region = expose(remote.data(), remote.size());
  ASSERT_TRUE(region.has_value()) << region.error().to_string();

  auto path = a_->connect(b_->address(), now());
  ASSERT_TRUE(path.has_value()) << path.error().to_string();
  EXPECT_EQ(a_->path_state(*path), PathState::kConnecting);
  EXPECT_EQ(a_->path_status(*path).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(a_->next_event_ns().has_value());  // the handshake deadline
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*path) == PathState::kReady; }))
      << a_->path_status(*path).to_string();
  SKIP_UNLESS_FLAVOR_TRANSPORT(*path);

  ASSERT_EQ(a_->paths().size(), 1u);
  const PathInfo& info = a_->paths()[*path];
  EXPECT_EQ(info.from, a_->address());
  EXPECT_EQ(info.to, b_->address());
  EXPECT_EQ(info.lanes, 2);
  EXPECT_GT(info.bandwidth_gbps, 0);
  EXPECT_TRUE(a_->path_healthy(*path, now()));
  EXPECT_FALSE(a_->next_event_ns().has_value());

  auto regions = a_->remote_regions(*path);
  ASSERT_TRUE(regions.has_value());
  ASSERT_EQ(regions->size(), 1u);
  EXPECT_EQ((*regions)[0].key, *region);
  EXPECT_EQ((*regions)[0].base, addr(remote.data()));
  EXPECT_EQ((*regions)[0].length, remote.size());
  auto found = a_->find_remote_region(*path, addr(remote.data()) + 100, 1000);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->key, *region);
  EXPECT_EQ(a_->find_remote_region(*path, addr(remote.data()) + 100, remote.size()).error().code(),
            StatusCode::kOutOfRange);

  // A second connect to the same live peer is the same path.
  auto again = a_->connect(b_->address(), now());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, *path);
  EXPECT_EQ(a_->paths().size(), 1u);
}

TEST_P(UcxTransportTest, WritesAndReadsOnSeveralLanesAreByteExact) {
  constexpr std::size_t kBytes = 1 << 20;
  const RoundTrip rt = round_trip(kBytes, 7);
  ASSERT_FALSE(HasFailure());
  SKIP_UNLESS_FLAVOR_TRANSPORT(rt.path);
  const auto& [remote_buffer, remote_region, path, source, local_buffer, back_buffer] = rt;
  auto &remote = *remote_buffer, &local = *local_buffer, &back = *back_buffer;

  // Writes: 8 slices of 128 KiB, alternating lanes.
  constexpr std::size_t kSlice = kBytes / 8;
  for (SliceId i = 0; i < 8; ++i) {
    ASSERT_TRUE(a_->submit(slice(i, path, static_cast<int>(i % 2), Op::kWrite, local.data() + i * kSlice,
                                 addr(remote.data()) + i * kSlice, remote_region, kSlice),
                           now())
                    .is_ok());
  }
  EXPECT_EQ(a_->cancel(3, now()).stopped, false);  // posted: UCX cannot recall it
  ASSERT_TRUE(wait_slices(8)) << done_a_.size() << " of 8 writes completed";
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(remote, source);

  // Reads back with uneven slices (not multiples of anything) on both lanes.
  done_a_.clear();
  const std::vector<std::size_t> sizes{1, 4095, 65537, 300'000, 7, kBytes - 1 - 4095 - 65537 - 300'000 - 7};
  std::size_t offset = 0;
  for (SliceId i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(a_->submit(slice(100 + i, path, static_cast<int>(i % 2), Op::kRead, back.data() + offset,
                                 addr(remote.data()) + offset, remote_region, sizes[i]),
                           now())
                    .is_ok());
    offset += sizes[i];
  }
  ASSERT_EQ(offset, kBytes);
  ASSERT_TRUE(wait_slices(sizes.size()));
  std::uint64_t bytes = 0;
  for (const Completion& c : done_a_) {
    EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(c.path, path);
    bytes += c.bytes;
  }
  EXPECT_EQ(bytes, kBytes);
  EXPECT_EQ(back, source);
  EXPECT_EQ(a_->slices_in_flight(), 0u);
}

// UCX's TCP cuts a message longer than its segment into fragments and
// reassembles them in memory it lends to the handler (held without a copy
// until the slice was acted on); one within a segment comes from UCX's
// receive buffer and is copied. Both arrive whole, in both directions.
TEST_P(UcxTransportTest, SlicesLongerAndShorterThanATcpSegmentArriveWhole) {
  for (const std::uint64_t segment : {std::uint64_t{8} << 10, std::uint64_t{512} << 10}) {
    SCOPED_TRACE(segment);
    UcxConfig c = config();
    c.tcp_segment_bytes = segment;
    auto holder = UcxTransport::create(c);
    auto initiator = UcxTransport::create(c);
    ASSERT_TRUE(holder && initiator);
    b_ = std::move(*holder);
    a_ = std::move(*initiator);
    done_a_.clear();
    constexpr std::size_t kBytes = 3 << 20;
    const RoundTrip rt = round_trip(kBytes, static_cast<std::uint8_t>(segment >> 10));
    ASSERT_FALSE(HasFailure());
    SKIP_UNLESS_FLAVOR_TRANSPORT(rt.path);
    const auto& [remote_buffer, remote_region, path, source, local_buffer, back_buffer] = rt;
    auto &remote = *remote_buffer, &local = *local_buffer, &back = *back_buffer;
    // 1 MiB, then 8 KiB + 1, then the rest: longer than either segment,
    // about one small segment, and longer than a large one.
    const std::vector<std::size_t> sizes{1 << 20, (8 << 10) + 1, kBytes - (1 << 20) - (8 << 10) - 1};
    for (const Op op : {Op::kWrite, Op::kRead}) {
      std::size_t offset = 0;
      for (SliceId i = 0; i < sizes.size(); ++i) {
        void* mine = op == Op::kWrite ? local.data() + offset : back.data() + offset;
        ASSERT_TRUE(a_->submit(slice(i + (op == Op::kRead ? 10 : 0), path, static_cast<int>(i % 2), op, mine,
                                     addr(remote.data()) + offset, remote_region, sizes[i]),
                               now())
                        .is_ok());
        offset += sizes[i];
      }
      ASSERT_TRUE(wait_slices(op == Op::kWrite ? 3 : 6, 10s)) << done_a_.size();
    }
    for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(remote, source);
    EXPECT_EQ(back, source);
    a_->shutdown();
    b_->shutdown();
    wait_until([&] { return a_->shutdown_complete() && b_->shutdown_complete(); }, 2s);
  }
}

// Engines with different rail counts pair lane i of the initiator's rail
// i mod 3 with the holder's rail i mod (its rails): every lane carries
// writes and reads, byte-exact (under RMA, each lane unpacks the rkey of the
// holder's rail it reaches).
TEST_P(UcxTransportTest, PeersWithDifferentRailCountsPairTheirLanes) {
  UcxConfig three = config();
  three.nics = {"lo", "lo", "lo"};
  three.lanes_per_peer = 5;
  auto initiator = UcxTransport::create(three);
  ASSERT_TRUE(initiator.has_value()) << initiator.error().to_string();
  a_ = std::move(*initiator);
  constexpr std::size_t kSlice = 100'003;
  auto& remote = buffer(5 * kSlice, 0);
  auto remote_region = expose(remote.data(), remote.size());  // the welcome carries its rkeys
  ASSERT_TRUE(remote_region.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(a_->paths()[path].lanes, 5);
  auto& source = buffer(pattern(remote.size(), 11));
  auto& back = buffer(remote.size(), 0);
  ASSERT_TRUE(a_->register_memory(source.data(), source.size()).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), back.size()).has_value());
  for (int lane = 0; lane < 5; ++lane) {
    const std::size_t at = static_cast<std::size_t>(lane) * kSlice;
    ASSERT_TRUE(a_->submit(slice(1 + lane, path, lane, Op::kWrite, source.data() + at, addr(remote.data()) + at,
                                 *remote_region, kSlice),
                           now())
                    .is_ok());
  }
  ASSERT_TRUE(wait_slices(5));
  for (int lane = 0; lane < 5; ++lane) {
    const std::size_t at = static_cast<std::size_t>(lane) * kSlice;
    ASSERT_TRUE(a_->submit(slice(10 + lane, path, (lane + 2) % 5, Op::kRead, back.data() + at,
                                 addr(remote.data()) + at, *remote_region, kSlice),
                           now())
                    .is_ok());
  }
  ASSERT_TRUE(wait_slices(10));
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(remote, source);
  EXPECT_EQ(back, source);
}

// RMA writes submitted between two polls share one flush per lane (a write
// completes when a flush after it did); Baton's messages and the same-host
// copy need none.
TEST_P(UcxTransportTest, AnRmaWriteBurstTakesOneFlushPerLane) {
  constexpr std::size_t kSlice = 65'536;
  auto& remote = buffer(16 * kSlice, 0);
  auto remote_region = expose(remote.data(), remote.size());
  ASSERT_TRUE(remote_region.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& source = buffer(pattern(remote.size(), 5));
  ASSERT_TRUE(a_->register_memory(source.data(), source.size()).has_value());
  const bool rma = !GetParam().tcp_slices_as_messages || a_->paths()[path].type != topology::PathType::kTcp;
  const bool direct = GetParam().same_host_copy;
  for (int burst = 0; burst < 2; ++burst) {
    const std::uint64_t before = a_->flushes_posted();
    for (int i = 0; i < 8; ++i) {
      const std::size_t at = static_cast<std::size_t>(burst * 8 + i) * kSlice;
      ASSERT_TRUE(a_->submit(slice(1 + burst * 8 + i, path, i % 2, Op::kWrite, source.data() + at,
                                   addr(remote.data()) + at, *remote_region, kSlice),
                             now())
                      .is_ok());
    }
    ASSERT_TRUE(wait_slices(8 * (burst + 1)));
    EXPECT_EQ(a_->flushes_posted() - before, rma && !direct ? 2u : 0u) << "burst " << burst;
  }
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(remote, source);
}

// A progress thread per rail progresses its worker on its own: UCX's
// software RMA over TCP, which the holder's worker serves, completes while
// the holder's loop never polls. Without the threads the same writes and
// reads wait for that loop (they are checked not to finish in 300 ms), so
// the test tells the two apart.
TEST_P(UcxTransportTest, AHoldersProgressThreadServesRmaWithoutItsLoop) {
  EXPECT_EQ(a_->progress_threads(),
            GetParam().progress_threads == 1 ? static_cast<int>(std::max<std::size_t>(1, GetParam().nics.size())) : 0);
  EXPECT_EQ(a_->pinned_progress_threads(), 0);  // loopback is near every CPU
  if (GetParam().tcp_slices_as_messages || GetParam().same_host_copy || GetParam().expected != topology::PathType::kTcp) {
    GTEST_SKIP() << "only UCX's software RMA over TCP needs the holder's worker (Baton's messages need its loop, "
                    "shared memory neither)";
  }
  constexpr std::size_t kBytes = 256 << 10;
  RoundTrip rt = round_trip(kBytes, 9);
  ASSERT_FALSE(HasFailure());
  SKIP_UNLESS_FLAVOR_TRANSPORT(rt.path);
  ASSERT_TRUE(a_->submit(slice(1, rt.path, 0, Op::kWrite, rt.local->data(), addr(rt.remote->data()), rt.remote_region,
                               kBytes / 2),
                         now())
                  .is_ok());
  ASSERT_TRUE(a_->submit(slice(2, rt.path, 1, Op::kWrite, rt.local->data() + kBytes / 2,
                               addr(rt.remote->data()) + kBytes / 2, rt.remote_region, kBytes / 2),
                         now())
                  .is_ok());
  auto only_a = [&](std::size_t count, std::chrono::milliseconds limit) {
    const TimeNs deadline = now() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
    while (done_a_.size() < count && now() < deadline) a_->poll(now(), done_a_);
    return done_a_.size() >= count;
  };
  if (GetParam().progress_threads == 0) {
    EXPECT_FALSE(only_a(2, 300ms)) << "the writes finished without the holder's progress";
    return;  // TearDown polls both, and they finish then
  }
  ASSERT_TRUE(only_a(2, 5s));
  ASSERT_TRUE(a_->submit(slice(3, rt.path, 1, Op::kRead, rt.back->data(), addr(rt.remote->data()), rt.remote_region,
                               kBytes),
                         now())
                  .is_ok());
  ASSERT_TRUE(only_a(3, 5s));
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(*rt.remote, rt.source);
  EXPECT_EQ(*rt.back, rt.source);
}

// Small raw writes and the asks of raw reads of any size, sent as Baton's
// messages (TCP), travel in one bundle per lane per burst: writes and
// reads mixed, of sizes around the bundling bound (16 KiB), byte-exact;
// the holder answers small ones in a bundle and larger reads alone. A
// burst of writes larger than a bundle holds, or of more asks than its
// entries, goes as more than one. Other flavours send none.
TEST_P(UcxTransportTest, SmallMessageSlicesOfABurstTravelAsOneBundlePerLane) {
  const std::vector<std::size_t> sizes = {1, 4096, 16384, 16385, 333, 8192, 16383, 2, 4096, 100'000};
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n;
  auto& remote = buffer(pattern(2 * total, 3));
  auto remote_region = expose(remote.data(), remote.size());
  ASSERT_TRUE(remote_region.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  const std::vector<std::uint8_t> expected_remote = [&] {
    std::vector<std::uint8_t> v = remote;
    const auto src = pattern(total, 9);
    std::copy(src.begin(), src.end(), v.begin());  // the writes land in the first half
    return v;
  }();
  auto& source = buffer(pattern(total, 9));
  auto& back = buffer(total, 0);
  ASSERT_TRUE(a_->register_memory(source.data(), source.size()).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), back.size()).has_value());
  const bool bundles = GetParam().tcp_slices_as_messages && !GetParam().same_host_copy &&
                       a_->paths()[path].type == topology::PathType::kTcp;
  // Writes into the first half, reads of the second half, alternating lanes.
  const std::uint64_t before = a_->bundles_sent();
  std::size_t at = 0;
  SliceId id = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int lane = static_cast<int>(i % 2);
    ASSERT_TRUE(a_->submit(slice(id++, path, lane, Op::kWrite, source.data() + at, addr(remote.data()) + at,
                                 *remote_region, sizes[i]),
                           now())
                    .is_ok());
    ASSERT_TRUE(a_->submit(slice(id++, path, lane, Op::kRead, back.data() + at, addr(remote.data()) + total + at,
                                 *remote_region, sizes[i]),
                           now())
                    .is_ok());
    at += sizes[i];
  }
  ASSERT_TRUE(wait_slices(2 * sizes.size()));
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(remote, expected_remote);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), remote.begin() + static_cast<std::ptrdiff_t>(total)));
  // Every read's ask and 8 of the 10 writes bundle (16 385 and 100 000 do
  // not): one bundle per lane (lane 0's writes 37 197 bytes, lane 1's
  // 12 290: a bundle goes at 64 KiB).
  EXPECT_EQ(a_->bundles_sent() - before, bundles ? 2u : 0u);

  // A burst of `count` slices of `size` bytes on one lane, each at the same
  // offset of both sides; every one ends ok. Returns the bundles it took.
  auto burst = [&](int lane, Op op, std::uint8_t* local, std::size_t count, std::size_t size) {
    done_a_.clear();
    const std::uint64_t start = a_->bundles_sent();
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_TRUE(a_->submit(slice(id++, path, lane, op, local + i * size, addr(remote.data()) + i * size,
                                   *remote_region, size),
                             now())
                      .is_ok());
    }
    EXPECT_TRUE(wait_slices(count));
    for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    return a_->bundles_sent() - start;
  };

  // A burst of writes of more than a bundle holds (64 KiB of payload) on one lane.
  constexpr std::size_t kSmall = 4096;
  const std::size_t count = std::min<std::size_t>(total / kSmall, 40);  // 160 KiB: three bundles
  EXPECT_EQ(burst(0, Op::kWrite, source.data(), count, kSmall), bundles ? 3u : 0u);
  EXPECT_EQ(remote, expected_remote);

  // A burst of more asks than a bundle's entries (256) on one lane: two.
  constexpr std::size_t kTiny = 512;
  constexpr std::size_t kAsks = 300;
  ASSERT_LE(kAsks * kTiny, total);
  std::ranges::fill(back, 0);
  EXPECT_EQ(burst(1, Op::kRead, back.data(), kAsks, kTiny), bundles ? 2u : 0u);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(kAsks * kTiny), remote.begin()));
}

// With copy threads, same-host copies of 32 KiB and more run on them, each
// lane's in order (a read after a write of the same bytes on one lane sees
// the write); shorter ones stay on the loop. Without, none does.
TEST_P(UcxTransportTest, LargeSameHostCopiesRunOnDatapathThreadsInLaneOrder) {
  constexpr std::size_t kSlice = 64 << 10;
  constexpr std::size_t kBytes = 8 * kSlice;
  // Memory the holder allocated: a same-host peer maps it (CMA copies stay
  // on their own thread).
  auto allocated = b_->allocate_memory(kBytes);
  ASSERT_TRUE(allocated.has_value()) << allocated.error().to_string();
  ASSERT_TRUE(b_->export_region(allocated->handle).is_ok());
  const std::span<std::uint8_t> remote(static_cast<std::uint8_t*>(allocated->address), kBytes);
  std::ranges::fill(remote, 0);
  const std::optional<RegionHandle> remote_region = allocated->handle;
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(a_->copy_threads(), GetParam().copy_threads);
  auto& source = buffer(pattern(kBytes, 2));
  auto& back = buffer(kBytes, 0);
  ASSERT_TRUE(a_->register_memory(source.data(), source.size()).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), back.size()).has_value());
  SliceId id = 1;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < 8; ++i) {
      const int lane = static_cast<int>(i % 2);
      const std::size_t at = i * kSlice;
      ASSERT_TRUE(a_->submit(slice(id++, path, lane, Op::kWrite, source.data() + at, addr(remote.data()) + at,
                                   *remote_region, kSlice),
                             now())
                      .is_ok());
      ASSERT_TRUE(a_->submit(slice(id++, path, lane, Op::kRead, back.data() + at, addr(remote.data()) + at,
                                   *remote_region, kSlice),
                             now())
                      .is_ok());
    }
    ASSERT_TRUE(wait_slices(16 * (round + 1)));
    EXPECT_TRUE(std::ranges::equal(remote, source)) << "round " << round;
    EXPECT_EQ(back, source) << "round " << round;  // each read followed its lane's write
    std::ranges::fill(back, 0);
  }
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  const bool threads = GetParam().copy_threads > 0 && a_->paths()[path].type == topology::PathType::kShm &&
                       GetParam().same_host_copy;
  EXPECT_EQ(a_->thread_copies(), threads ? 48u : 0u);
  // A short copy stays on the loop.
  ASSERT_TRUE(a_->submit(slice(id++, path, 0, Op::kRead, back.data(), addr(remote.data()), *remote_region, 4096),
                         now())
                  .is_ok());
  ASSERT_TRUE(wait_slices(49));
  EXPECT_EQ(a_->thread_copies(), threads ? 48u : 0u);
}

TEST_P(UcxTransportTest, RegionRegisteredAfterConnectIsUsableAfterRefresh) {
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& late = buffer(8192, 0);
  auto late_region = expose(late.data(), late.size());
  ASSERT_TRUE(late_region.has_value());
  auto& source = buffer(pattern(late.size(), 3));
  ASSERT_TRUE(a_->register_memory(source.data(), source.size()).has_value());

  const auto write = slice(1, path, 1, Op::kWrite, source.data(), addr(late.data()), *late_region, late.size());
  const Status unknown = a_->submit(write, now());
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound) << unknown.to_string();
  EXPECT_NE(unknown.message().find("remote_key"), std::string::npos) << unknown.message();

  ASSERT_TRUE(a_->refresh_regions(path).is_ok());
  EXPECT_TRUE(a_->refresh_pending(path));
  ASSERT_TRUE(wait_until([&] { return !a_->refresh_pending(path); }));
  ASSERT_TRUE(a_->find_remote_region(path, addr(late.data()), late.size()).has_value());
  ASSERT_TRUE(a_->submit(write, now()).is_ok());
  ASSERT_TRUE(wait_slices(1));
  EXPECT_TRUE(done_a_[0].status.is_ok()) << done_a_[0].status.to_string();
  EXPECT_EQ(late, source);
}

TEST_P(UcxTransportTest, RegionUnregisteredByThePeerBecomesUnusable) {
  auto& remote = buffer(4096);
  auto region = expose(remote.data(), remote.size());
  ASSERT_TRUE(region.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(a_->remote_regions(path)->size(), 1u);
  ASSERT_TRUE(b_->unregister(*region).is_ok());
  // The peer pushes the removal; a refresh would learn it too.
  ASSERT_TRUE(wait_until([&] { return a_->remote_regions(path)->empty(); }));
  auto& local = buffer(4096);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  EXPECT_EQ(a_->submit(slice(1, path, 0, Op::kWrite, local.data(), addr(remote.data()), *region, 4096), now()).code(),
            StatusCode::kNotFound);
}

// A staged region's access as a test drives it: each copy runs with memcpy
// when asked whether it ended (as a GPU's DMA ends later) and is counted;
// copies can be made to fail, or held (they "run" until the test lets them
// end).
class TestAccess final : public UcxTransport::StagedAccess {
 public:
  std::uint64_t copies = 0, copied = 0;
  bool failing = false;
  bool holding = false;
  struct Copy {
    std::vector<std::byte> bytes;  // a write's, or a read's once copied
    void* dst = nullptr;           // a write's destination
    const void* src = nullptr;     // a read's source
  };
  std::map<std::uint64_t, Copy> running;  // started, not released

  bool refusing = false;  // start_write / start_read fail

  Result<std::uint64_t> start_write(void* dst, const void* src, std::size_t n) override {
    if (refusing) return std::unexpected(Status::unavailable("no staging buffer"));
    const auto* from = static_cast<const std::byte*>(src);
    running.emplace(next_, Copy{{from, from + n}, dst, nullptr});
    return next_++;
  }
  Result<std::uint64_t> start_read(const void* src, std::size_t n) override {
    if (refusing) return std::unexpected(Status::unavailable("no staging buffer"));
    running.emplace(next_, Copy{std::vector<std::byte>(n), nullptr, src});
    return next_++;
  }
  std::optional<Result<std::span<const std::byte>>> done(std::uint64_t ticket) override {
    if (holding) return std::nullopt;
    if (failing) return std::unexpected(Status::unavailable("the device is gone"));
    Copy& c = running.at(ticket);
    ++copies;
    copied += c.bytes.size();
    if (c.dst != nullptr) {
      std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
      return std::span<const std::byte>();
    }
    std::memcpy(c.bytes.data(), c.src, c.bytes.size());
    return std::span<const std::byte>(c.bytes);
  }
  void release(std::uint64_t ticket) override { running.erase(ticket); }

 private:
  std::uint64_t next_ = 1;
};

// Memory UCX cannot map (GPU memory in the engine) is registered staged:
// peers reach it by messages only, whatever the path (even a same-host
// peer, whose copy could not reach a GPU), and the holder answers each
// slice through its access, which this test counts (and can make fail).
TEST_P(UcxTransportTest, StagedRegionsAreServedThroughTheHoldersAccessOnEveryPath) {
  constexpr std::size_t kBytes = 1 << 20;
  auto& remote = buffer(kBytes, 0);
  auto access = std::make_shared<TestAccess>();
  auto region = b_->register_staged(remote.data(), kBytes, MemoryKind::kVram, access);
  ASSERT_TRUE(region.has_value()) << region.error().to_string();
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  EXPECT_EQ(b_->packed_rkey(*region).error().code(), StatusCode::kFailedPrecondition);
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  SKIP_UNLESS_FLAVOR_TRANSPORT(path);
  auto known = a_->remote_region(path, *region);
  ASSERT_TRUE(known.has_value()) << known.error().to_string();
  EXPECT_TRUE(known->staged);
  const auto source = pattern(kBytes, 5);
  auto& local = buffer(source);
  auto& back = buffer(kBytes, 0);
  ASSERT_TRUE(a_->register_memory(local.data(), kBytes).has_value());
  auto back_region = a_->register_memory(back.data(), kBytes);
  ASSERT_TRUE(back_region.has_value());

  // Uneven slices on both lanes: bundled small ones and large ones alike.
  const std::vector<std::size_t> sizes{1, 4095, 65537, 300'000, 7, kBytes - 1 - 4095 - 65537 - 300'000 - 7};
  SliceId id = 1;
  for (Op op : {Op::kWrite, Op::kRead}) {
    done_a_.clear();
    access->copies = access->copied = 0;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::uint8_t* here = (op == Op::kWrite ? local.data() : back.data()) + offset;
      ASSERT_TRUE(a_->submit(slice(id++, path, static_cast<int>(i % 2), op, here, addr(remote.data()) + offset,
                                   *region, sizes[i]),
                             now())
                      .is_ok());
      offset += sizes[i];
    }
    ASSERT_TRUE(wait_slices(sizes.size())) << done_a_.size() << " of " << sizes.size();
    for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(access->copies, sizes.size()) << "one holder copy per slice";
    EXPECT_EQ(access->copied, kBytes);
  }
  EXPECT_EQ(remote, source);
  EXPECT_EQ(back, source);
  EXPECT_TRUE(access->running.empty()) << "every read released";
  // Nothing is left for the submitting thread to copy itself.
  std::vector<Status> result(1);
  const UcxTransport::DirectCopy direct{b_->address(), Op::kRead, *back_region, 0, *region, 0, 64};
  EXPECT_FALSE(a_->copy_direct(std::span(&direct, 1), result).is_ok());

  // The holder's copies fail: each slice fails with the reason, nothing lands.
  access->failing = true;
  done_a_.clear();
  std::fill(local.begin(), local.end(), 0xab);
  ASSERT_TRUE(a_->submit(slice(id++, path, 0, Op::kWrite, local.data(), addr(remote.data()), *region, 200'000), now())
                  .is_ok());
  ASSERT_TRUE(a_->submit(slice(id++, path, 1, Op::kRead, back.data(), addr(remote.data()), *region, 100), now()).is_ok());
  ASSERT_TRUE(a_->submit(slice(id++, path, 1, Op::kRead, back.data(), addr(remote.data()), *region, 100'000), now())
                  .is_ok());
  ASSERT_TRUE(wait_slices(3));
  for (const Completion& c : done_a_) {
    EXPECT_EQ(c.status.code(), StatusCode::kUnavailable);
    EXPECT_NE(c.status.message().find("the device is gone"), std::string::npos) << c.status.message();
  }
  EXPECT_EQ(remote, source);
  EXPECT_TRUE(access->running.empty());
  access->failing = false;

  // Compressed both ways: a write of zeros shrinks, a read asks for it.
  ASSERT_TRUE(a_->set_codec(std::shared_ptr<const Codec>(make_lz4_codec())).is_ok());
  done_a_.clear();
  std::fill(local.begin(), local.end(), 0);
  SliceSubmit zeros = slice(id++, path, 0, Op::kWrite, local.data(), addr(remote.data()), *region, 256 << 10);
  zeros.wire_bytes = 4096;
  ASSERT_TRUE(a_->submit(zeros, now()).is_ok());
  ASSERT_TRUE(wait_slices(1));
  EXPECT_TRUE(done_a_[0].status.is_ok()) << done_a_[0].status.to_string();
  EXPECT_LT(done_a_[0].wire_bytes, std::uint64_t{256} << 10) << "it went compressed";
  EXPECT_TRUE(std::all_of(remote.begin(), remote.begin() + (256 << 10), [](std::uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(remote.begin() + (256 << 10), remote.end(), source.begin() + (256 << 10)));
  std::fill(back.begin(), back.end(), 0xcd);
  SliceSubmit read = slice(id++, path, 1, Op::kRead, back.data(), addr(remote.data()), *region, 256 << 10);
  read.wire_bytes = 4096;
  ASSERT_TRUE(a_->submit(read, now()).is_ok());
  ASSERT_TRUE(wait_slices(2));
  EXPECT_TRUE(done_a_[1].status.is_ok()) << done_a_[1].status.to_string();
  EXPECT_LT(done_a_[1].wire_bytes, std::uint64_t{256} << 10) << "it came back compressed";
  EXPECT_TRUE(std::all_of(back.begin(), back.begin() + (256 << 10), [](std::uint8_t b) { return b == 0; }));

  // Unregistered: peers are told, and the region is gone for them.
  ASSERT_TRUE(b_->unregister(*region).is_ok());
  ASSERT_TRUE(wait_until([&] { return !b_->unregister_pending(*region); }));
  ASSERT_TRUE(wait_until([&] { return a_->remote_regions(path)->empty(); }));
}

// A write or read of a staged region is answered once its copy ended (a
// write's bytes are in place when the initiator learns it); meanwhile the
// holder serves everything else, wants an early poll instead of sleeping,
// and keeps the region until the copy is over even when it is unregistered.
TEST_P(UcxTransportTest, AStagedCopyIsAnsweredWhenItEndedAndHoldsNothingElseUp) {
  const auto held = pattern(64 << 10, 9);
  auto& staged = buffer(held);
  auto access = std::make_shared<TestAccess>();
  auto region = b_->register_staged(staged.data(), staged.size(), MemoryKind::kVram, access);
  ASSERT_TRUE(region.has_value());
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  auto& plain = buffer(64 << 10, 0);
  auto plain_region = expose(plain.data(), plain.size());
  ASSERT_TRUE(plain_region.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  SKIP_UNLESS_FLAVOR_TRANSPORT(path);
  auto& local = buffer(pattern(64 << 10, 3));
  auto& back = buffer(64 << 10, 0);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), back.size()).has_value());

  // A write: unanswered while its copy runs, and nothing landed yet.
  access->holding = true;
  ASSERT_TRUE(a_->submit(slice(1, path, 0, Op::kWrite, local.data(), addr(staged.data()), *region, 4096), now())
                  .is_ok());
  ASSERT_TRUE(wait_until([&] { return !access->running.empty(); }));
  EXPECT_FALSE(b_->arm()) << "a copy runs: no sleeping on the fd";
  ASSERT_TRUE(b_->next_event_ns().has_value());
  EXPECT_LE(*b_->next_event_ns(), now() + 1'000'000) << "the next poll comes soon";
  EXPECT_FALSE(wait_slices(1, 50ms)) << "a staged write is acknowledged only once its copy ended";
  EXPECT_EQ(staged, held);
  access->holding = false;
  ASSERT_TRUE(wait_slices(1));
  EXPECT_TRUE(done_a_[0].status.is_ok()) << done_a_[0].status.to_string();
  EXPECT_TRUE(std::equal(local.begin(), local.begin() + 4096, staged.begin()));
  EXPECT_TRUE(std::equal(held.begin() + 4096, held.end(), staged.begin() + 4096));
  done_a_.clear();

  // A read: a write to host memory on the same lane goes through meanwhile.
  access->holding = true;
  ASSERT_TRUE(a_->submit(slice(2, path, 0, Op::kRead, back.data(), addr(staged.data()), *region, back.size()), now())
                  .is_ok());
  ASSERT_TRUE(wait_until([&] { return !access->running.empty(); }));
  EXPECT_FALSE(b_->arm());
  ASSERT_TRUE(a_->submit(slice(3, path, 0, Op::kWrite, local.data(), addr(plain.data()), *plain_region, local.size()),
                         now())
                  .is_ok());
  ASSERT_TRUE(wait_slices(1));
  EXPECT_EQ(done_a_[0].id, 3u);
  EXPECT_EQ(plain, local);
  // Unregistered while its copy runs: the region stays until it ended.
  ASSERT_TRUE(b_->unregister(*region).is_ok());
  EXPECT_FALSE(wait_until([&] { return !b_->unregister_pending(*region); }, 100ms));
  access->holding = false;
  ASSERT_TRUE(wait_slices(2));
  EXPECT_TRUE(done_a_[1].status.is_ok()) << done_a_[1].status.to_string();
  EXPECT_EQ(back, staged);
  ASSERT_TRUE(wait_until([&] { return !b_->unregister_pending(*region); }));
  EXPECT_TRUE(access->running.empty());
}

// At most 64 staged copies run at once, writes and reads together: more
// wait their turn (a write with its bytes) instead of failing; and a holder
// that shuts down waits for the copies under way, which may still use its
// memory.
TEST_P(UcxTransportTest, StagedCopiesBeyond64WaitTheirTurnAndShutdownWaitsForThem) {
  auto& staged = buffer(pattern(8192, 2));
  const auto before = staged;
  auto access = std::make_shared<TestAccess>();
  auto region = b_->register_staged(staged.data(), staged.size(), MemoryKind::kVram, access);
  ASSERT_TRUE(region.has_value());
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  SKIP_UNLESS_FLAVOR_TRANSPORT(path);
  auto& local = buffer(pattern(80 * 64, 4));
  auto& back = buffer(80 * 64, 0);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), back.size()).has_value());
  // 80 copies: even ones write 64 bytes of `local` into the first 4 KiB,
  // odd ones read 64 bytes of the second 4 KiB, which no write touches.
  auto submit_all = [&](SliceId first) {
    for (SliceId i = 0; i < 80; ++i) {
      const bool write = i % 2 == 0;
      std::uint8_t* here = (write ? local.data() : back.data()) + i * 64;
      const std::uint64_t there = addr(staged.data()) + (write ? i * 32 : 4096 + i * 32);
      ASSERT_TRUE(a_->submit(slice(first + i, path, static_cast<int>(i % 2), write ? Op::kWrite : Op::kRead, here,
                                   there, *region, 64),
                             now())
                      .is_ok());
    }
  };
  access->holding = true;
  submit_all(1);
  ASSERT_TRUE(wait_until([&] { return access->running.size() == 64; }));
  EXPECT_FALSE(wait_slices(1, 100ms)) << "nothing is answered, nothing refused, while the copies are held";
  EXPECT_EQ(access->running.size(), 64u) << "the other 16 wait";
  access->holding = false;
  ASSERT_TRUE(wait_slices(80));
  for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(access->copies, 80u);
  EXPECT_TRUE(access->running.empty());
  // Even i lands at i * 32 (every 64 bytes: no overlap), odd i reads from 4096 + i * 32.
  for (SliceId i = 0; i < 80; i += 2) {
    EXPECT_TRUE(std::equal(local.begin() + i * 64, local.begin() + i * 64 + 64, staged.begin() + i * 32))
        << "write " << i;
  }
  for (SliceId i = 1; i < 80; i += 2) {
    EXPECT_TRUE(std::equal(back.begin() + i * 64, back.begin() + i * 64 + 64, before.begin() + 4096 + i * 32))
        << "read " << i;
  }

  // Waiting copies whose start fails when their turn comes are refused
  // with the reason; the 64 running ones end well.
  done_a_.clear();
  access->holding = true;
  submit_all(100);
  ASSERT_TRUE(wait_until([&] { return access->running.size() == 64; }));
  access->refusing = true;
  access->holding = false;
  ASSERT_TRUE(wait_slices(80));
  std::size_t ok = 0;
  for (const Completion& c : done_a_) {
    if (c.status.is_ok()) {
      ++ok;
    } else {
      EXPECT_NE(c.status.message().find("no staging buffer"), std::string::npos) << c.status.message();
    }
  }
  EXPECT_EQ(ok, 64u);
  access->refusing = false;

  // At most 1024 wait: beyond, a slice is refused (and would be sent again).
  done_a_.clear();
  access->holding = true;
  constexpr SliceId kAsks = 64 + 1024 + 1;
  for (SliceId i = 0; i < kAsks; ++i) {
    ASSERT_TRUE(a_->submit(slice(1000 + i, path, 0, Op::kRead, back.data(), addr(staged.data()), *region, 64), now())
                    .is_ok());
  }
  ASSERT_TRUE(wait_slices(1));
  EXPECT_EQ(done_a_[0].status.code(), StatusCode::kUnavailable);
  EXPECT_NE(done_a_[0].status.message().find("1024 wait"), std::string::npos) << done_a_[0].status.message();
  access->holding = false;
  ASSERT_TRUE(wait_slices(kAsks));
  EXPECT_EQ(std::count_if(done_a_.begin(), done_a_.end(), [](const Completion& c) { return c.status.is_ok(); }),
            static_cast<std::ptrdiff_t>(kAsks - 1));

  done_a_.clear();
  access->holding = true;
  submit_all(5000);
  ASSERT_TRUE(wait_until([&] { return access->running.size() == 64; }));
  b_->shutdown();
  EXPECT_FALSE(wait_until([&] { return b_->shutdown_complete(); }, 100ms)) << "64 copies still run";
  access->holding = false;
  EXPECT_TRUE(wait_until([&] { return b_->shutdown_complete(); }));
  EXPECT_TRUE(access->running.empty());
}

// What register_staged refuses, and a staged region as a local side.
TEST_P(UcxTransportTest, StagedRegionsRefuseBadInputAndAreNoLocalSide) {
  auto& memory = buffer(8192);
  auto access = std::make_shared<TestAccess>();
  auto code = [&](void* at, std::size_t n, std::shared_ptr<TestAccess> with) {
    auto r = a_->register_staged(at, n, MemoryKind::kVram, std::move(with));
    return r ? StatusCode::kOk : r.error().code();
  };
  EXPECT_EQ(code(nullptr, 10, access), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(memory.data(), 0, access), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(memory.data(), 4096, nullptr), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->register_staged(memory.data(), 4096, static_cast<MemoryKind>(9), access).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(reinterpret_cast<void*>(~std::uintptr_t{0} - 10), 4096, access), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->register_memory(memory.data(), 4096).has_value());
  EXPECT_EQ(code(memory.data() + 4000, 200, access), StatusCode::kInvalidArgument) << "overlap";
  auto staged = a_->register_staged(memory.data() + 4096, 4096, MemoryKind::kVram, access);
  ASSERT_TRUE(staged.has_value()) << staged.error().to_string();
  EXPECT_FALSE(a_->register_memory(memory.data() + 5000, 100).has_value()) << "overlap with a staged region";

  auto& remote = buffer(4096);
  auto rr = expose(remote.data(), remote.size());
  ASSERT_TRUE(rr.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  const Status local = a_->submit(slice(1, path, 0, Op::kWrite, memory.data() + 4096, addr(remote.data()), *rr, 64), now());
  EXPECT_EQ(local.code(), StatusCode::kFailedPrecondition) << local.to_string();
  EXPECT_NE(local.message().find("staged"), std::string::npos) << local.message();
  EXPECT_EQ(a_->slices_in_flight(), 0u);
  EXPECT_TRUE(a_->unregister(*staged).is_ok());
}

TEST_P(UcxTransportTest, EveryBadSliceIsRefusedBeforePosting) {
  auto& remote = buffer(4096);
  auto rr = expose(remote.data(), remote.size());
  ASSERT_TRUE(rr.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& local = buffer(4096);
  auto& unregistered = buffer(4096);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  const std::uint64_t r = addr(remote.data());
  auto expect = [&](const SliceSubmit& s, StatusCode code, std::string_view names) {
    const Status st = a_->submit(s, now());
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(names), std::string::npos) << st.message() << " should name " << names;
  };
  expect(slice(1, 9, 0, Op::kWrite, local.data(), r, *rr, 64), StatusCode::kInvalidArgument, "path 9");
  expect(slice(1, path, 2, Op::kWrite, local.data(), r, *rr, 64), StatusCode::kInvalidArgument, "lane 2");
  expect(slice(1, path, -1, Op::kWrite, local.data(), r, *rr, 64), StatusCode::kInvalidArgument, "lane -1");
  expect(slice(1, path, 0, Op::kWrite, local.data(), r, *rr, 0), StatusCode::kInvalidArgument, "0 bytes");
  expect(slice(1, path, 0, Op::kWrite, unregistered.data(), r, *rr, 64), StatusCode::kOutOfRange, "local range");
  expect(slice(1, path, 0, Op::kWrite, nullptr, r, *rr, 64), StatusCode::kOutOfRange, "local range");
  expect(slice(1, path, 0, Op::kRead, local.data() + 4000, r, *rr, 97), StatusCode::kOutOfRange, "+97");
  expect(slice(1, path, 0, Op::kWrite, local.data(), r + 4000, *rr, 97), StatusCode::kOutOfRange, "remote range");
  expect(slice(1, path, 0, Op::kRead, local.data(), r - 1, *rr, 16), StatusCode::kOutOfRange, "remote range");
  expect(slice(1, path, 0, Op::kWrite, local.data(), r, *rr + 77, 64), StatusCode::kNotFound, "remote_key");
  expect(slice(1, path, 0, Op::kWrite, local.data(), r, 0, 64), StatusCode::kNotFound, "remote_key 0");
  EXPECT_EQ(a_->slices_in_flight(), 0u);
  EXPECT_EQ(remote, std::vector<std::uint8_t>(4096, 0));  // nothing reached the peer

  // A slice id in flight cannot be reused until its completion is handed out.
  ASSERT_TRUE(a_->submit(slice(5, path, 0, Op::kWrite, local.data(), r, *rr, 64), now()).is_ok());
  expect(slice(5, path, 1, Op::kWrite, local.data(), r, *rr, 64), StatusCode::kAlreadyExists, "slice 5");
  ASSERT_TRUE(wait_slices(1));
  EXPECT_TRUE(a_->submit(slice(5, path, 1, Op::kWrite, local.data(), r, *rr, 64), now()).is_ok());
  ASSERT_TRUE(wait_slices(2));

  EXPECT_EQ(a_->cancel(12345, now()).stopped, false);  // unknown
  EXPECT_EQ(a_->path_status(9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->path_state(9), PathState::kFailed);
  EXPECT_EQ(a_->refresh_regions(9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->remote_regions(9).error().code(), StatusCode::kInvalidArgument);
}

TEST_P(UcxTransportTest, BadRegistrationsAndUnregistrationsAreRefused) {
  auto& memory = buffer(8192);
  EXPECT_EQ(a_->register_memory(nullptr, 10).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->register_memory(memory.data(), 0).error().code(), StatusCode::kInvalidArgument);
  // Memory this process does not have: refused here, not at the first copy.
  const long page = sysconf(_SC_PAGESIZE);
  auto* three = static_cast<std::byte*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(three, MAP_FAILED);
  ASSERT_EQ(munmap(three + page, page), 0);  // a hole in the middle
  for (const auto& [at, bytes] : {std::pair{three, 3 * page}, std::pair{three + page, page}, std::pair{three + page - 1, 2L}}) {
    const auto refused = a_->register_memory(at, static_cast<std::size_t>(bytes));
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("not all mapped"), std::string::npos) << refused.error().message();
  }
  auto mapped_page = a_->register_memory(three + 2 * page, static_cast<std::size_t>(page));  // mapped: fine
  ASSERT_TRUE(mapped_page.has_value()) << mapped_page.error().to_string();
  EXPECT_TRUE(a_->unregister(*mapped_page).is_ok());
  // Mapped but not writable (or not readable): a peer's write into it, or a
  // read landing in it, would fault the engine's copying thread. Refused.
  for (const int prot : {PROT_READ, PROT_NONE, PROT_WRITE}) {
    ASSERT_EQ(mprotect(three + 2 * page, static_cast<std::size_t>(page), prot), 0);
    const auto refused = a_->register_memory(three + 2 * page, static_cast<std::size_t>(page));
    ASSERT_FALSE(refused.has_value()) << prot;
    EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("must be readable and writable"), std::string::npos)
        << refused.error().message();
  }
  munmap(three, page);
  munmap(three + 2 * page, page);
  auto first = a_->register_memory(memory.data(), 4096);
  ASSERT_TRUE(first.has_value());
  auto overlap = a_->register_memory(memory.data() + 4000, 4096);
  ASSERT_FALSE(overlap.has_value());
  EXPECT_EQ(overlap.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.error().message().find("overlaps region"), std::string::npos);
  EXPECT_FALSE(a_->register_memory(memory.data() + 100, 10).has_value());  // inside
  auto second = a_->register_memory(memory.data() + 4096, 4096);           // adjacent is fine
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(*first, *second);
  auto rkey = a_->packed_rkey(*first);
  ASSERT_TRUE(rkey.has_value());
  EXPECT_FALSE(rkey->empty());

  EXPECT_TRUE(a_->unregister(*second).is_ok());
  const Status twice = a_->unregister(*second);
  EXPECT_EQ(twice.code(), StatusCode::kNotFound) << twice.to_string();
  EXPECT_EQ(a_->unregister(999).code(), StatusCode::kNotFound);
  EXPECT_EQ(a_->packed_rkey(*second).error().code(), StatusCode::kNotFound);
}

TEST_P(UcxTransportTest, AllocationNotificationsAndLookupsRefuseBadInput) {
  EXPECT_EQ(a_->allocate_memory(0).error().code(), StatusCode::kInvalidArgument);
  const auto huge = a_->allocate_memory(std::size_t{1} << 50);  // 1 PiB: more than any machine here
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.error().message().find("free in /dev/shm"), std::string::npos) << huge.error().message();
  auto allocated = b_->allocate_memory(64 << 10);
  ASSERT_TRUE(allocated.has_value()) << allocated.error().to_string();
  ASSERT_NE(allocated->address, nullptr);
  ASSERT_TRUE(b_->export_region(allocated->handle).is_ok());
  EXPECT_EQ(a_->notify(7, "hi").code(), StatusCode::kInvalidArgument);           // no such path
  EXPECT_EQ(a_->remote_region(7, 1).error().code(), StatusCode::kInvalidArgument);
  const PathId path = connect_ready();
  EXPECT_EQ(a_->remote_region(path, allocated->handle)->length, 64u << 10);
  EXPECT_EQ(a_->remote_region(path, 999).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(a_->notify(path, std::string(kMaxNotificationBytes + 1, 'x')).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->notify(path, "first").is_ok());
  ASSERT_TRUE(a_->notify(path, "second").is_ok());
  std::vector<Notification> got;
  EXPECT_TRUE(wait_until([&] {
    for (Notification& n : b_->take_notifications()) got.push_back(std::move(n));
    return got.size() >= 2;
  }));
  EXPECT_EQ(got, (std::vector<Notification>{{a_->address(), "first"}, {a_->address(), "second"}}));
  EXPECT_TRUE(b_->unregister(allocated->handle).is_ok());
}

// A receiver that never takes its notifications keeps the newest 65536,
// counts the rest as dropped, and says how many wait: an owner who forgot
// take_notifications() sees it in the metrics, not in its memory.
// A peer that floods loses its own oldest, not another peer's: c's ten,
// sent before a_'s flood, are all still there after it.
TEST_P(UcxTransportTest, UntakenNotificationsAreBoundedAndCounted) {
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto c = make();
  ASSERT_TRUE(c);
  std::vector<Completion> done_c;
  auto poll_c = [&] { c->poll(now(), done_c); };
  auto c_path = c->connect(b_->address(), now());
  ASSERT_TRUE(c_path.has_value());
  ASSERT_TRUE(wait_until([&] {
    poll_c();
    return c->path_state(*c_path) != PathState::kConnecting;
  }));
  constexpr std::size_t kOthers = 10;
  for (std::size_t i = 0; i < kOthers; ++i) ASSERT_TRUE(c->notify(*c_path, fmt::format("c#{}", i)).is_ok());
  ASSERT_TRUE(wait_until([&] {
    poll_c();
    return b_->notification_counts().received == kOthers;
  }));

  constexpr std::size_t kExtra = 10;
  constexpr std::size_t kSent = ucx::kMaxPendingNotifications + kExtra;
  for (std::size_t i = 0; i < kSent; ++i) {
    ASSERT_TRUE(a_->notify(path, fmt::format("#{}", i)).is_ok()) << i;
    if (i % 1024 == 0) poll_both();  // the sender's queue drains as the receiver reads
  }
  ASSERT_TRUE(wait_until([&] { return b_->notification_counts().received == kSent + kOthers; }, 30s))
      << b_->notification_counts().received;
  NotificationCounts counts = b_->notification_counts();
  EXPECT_EQ(counts.dropped, kExtra + kOthers);
  EXPECT_EQ(counts.untaken, ucx::kMaxPendingNotifications);
  const std::vector<Notification> got = b_->take_notifications();
  ASSERT_EQ(got.size(), ucx::kMaxPendingNotifications);
  for (std::size_t i = 0; i < kOthers; ++i) EXPECT_EQ(got[i].message, fmt::format("c#{}", i));
  EXPECT_EQ(got[kOthers].message, fmt::format("#{}", kExtra + kOthers));  // a_'s oldest went
  EXPECT_EQ(got.back().message, fmt::format("#{}", kSent - 1));
  counts = b_->notification_counts();
  EXPECT_EQ(counts.untaken, 0u);
  EXPECT_EQ(counts.received, kSent + kOthers);
  EXPECT_EQ(counts.dropped, kExtra + kOthers);
  EXPECT_EQ(a_->notification_counts().received, 0u);
  c->shutdown();
  (void)wait_until([&] {
    poll_c();
    return c->shutdown_complete();
  }, 2s);
}

// Counted, 65 536 notifications of 4 KiB held 270 MiB in an engine that
// never took them: at most 16 MiB wait, the oldest dropped, the newest kept.
TEST_P(UcxTransportTest, UntakenNotificationsAreBoundedInBytes) {
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  constexpr std::size_t kSent = 6000;  // 24 MiB of text
  const std::string text(kMaxNotificationBytes - 8, 'n');
  for (std::size_t i = 0; i < kSent; ++i) {
    ASSERT_TRUE(a_->notify(path, fmt::format("{:08}", i) + text).is_ok()) << i;
    if (i % 256 == 0) poll_both();
  }
  ASSERT_TRUE(wait_until([&] { return b_->notification_counts().received == kSent; }, 30s))
      << b_->notification_counts().received;
  const NotificationCounts counts = b_->notification_counts();
  const std::vector<Notification> got = b_->take_notifications();
  ASSERT_FALSE(got.empty());
  const std::size_t each = got.front().message.size() + got.front().from.size();
  EXPECT_EQ(got.size(), ucx::kMaxPendingNotificationBytes / each);
  EXPECT_EQ(counts.untaken, got.size());
  EXPECT_EQ(counts.dropped, kSent - got.size());
  EXPECT_EQ(got.front().message.substr(0, 8), fmt::format("{:08}", kSent - got.size()));  // the oldest went
  EXPECT_EQ(got.back().message.substr(0, 8), fmt::format("{:08}", kSent - 1));
}

TEST_P(UcxTransportTest, UnregisterIsRefusedWhileSlicesAreInFlight) {
  auto& remote = buffer(1 << 20);
  auto rr = expose(remote.data(), remote.size());
  ASSERT_TRUE(rr.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& local = buffer(1 << 20, 0x5a);
  auto lr = a_->register_memory(local.data(), local.size());
  ASSERT_TRUE(lr.has_value());
  ASSERT_TRUE(a_->submit(slice(1, path, 0, Op::kWrite, local.data(), addr(remote.data()), *rr, local.size()), now())
                  .is_ok());
  // In flight until a poll hands its completion out.
  const Status busy = a_->unregister(*lr);
  EXPECT_EQ(busy.code(), StatusCode::kInvalidArgument) << busy.to_string();
  EXPECT_NE(busy.message().find("in flight"), std::string::npos) << busy.message();
  ASSERT_TRUE(wait_slices(1));
  EXPECT_TRUE(done_a_[0].status.is_ok());
  EXPECT_TRUE(a_->unregister(*lr).is_ok());
  EXPECT_EQ(a_->unregister(*lr).code(), StatusCode::kNotFound);
}

TEST_P(UcxTransportTest, BadAddressesAreRefused) {
  for (const char* bad : {"nohost:xx", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ""}) {
    auto r = a_->connect(bad, now());
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << r.error().to_string();
  }
  EXPECT_TRUE(a_->paths().empty());
  UcxConfig bad = config();
  bad.lanes_per_peer = 0;
  EXPECT_EQ(UcxTransport::create(bad).error().code(), StatusCode::kInvalidArgument);
  bad = config();
  bad.listen_address = "localhost";
  EXPECT_EQ(UcxTransport::create(bad).error().code(), StatusCode::kInvalidArgument);
  // A setting out of range: invalid_argument naming the setting and value.
  auto expect_refused = [](const UcxConfig& c, const std::string& says) {
    const auto made = UcxTransport::create(c);
    ASSERT_FALSE(made.has_value()) << says;
    EXPECT_EQ(made.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(made.error().message().find(says), std::string::npos) << made.error().message();
  };
  for (const std::uint64_t segment : {std::uint64_t{100}, std::uint64_t{1} << 30}) {
    bad = config();
    bad.tcp_segment_bytes = segment;
    expect_refused(bad, "tcp_segment_bytes is " + std::to_string(segment));
  }
  for (const std::uint64_t buffer : {std::uint64_t{4096}, std::uint64_t{2} << 30}) {
    bad = config();
    bad.tcp_receive_buffer_bytes = buffer;
    expect_refused(bad, "tcp_receive_buffer_bytes is " + std::to_string(buffer));
  }
  for (const int threads : {-2, 65}) {
    bad = config();
    bad.copy_threads = threads;
    expect_refused(bad, "copy_threads is " + std::to_string(threads));
  }
  for (const int threads : {-2, 2}) {
    bad = config();
    bad.progress_threads = threads;
    expect_refused(bad, "progress_threads is " + std::to_string(threads));
  }
  for (const int lanes : {65, 1 << 30}) {  // a peer's handshake refuses more than 64
    bad = config();
    bad.lanes_per_peer = lanes;
    expect_refused(bad, "lanes_per_peer is " + std::to_string(lanes));
  }
  bad = config();
  bad.stall_timeout_ms = -1;
  expect_refused(bad, "stall_timeout_ms is -1");
  // Above a year a timeout in ns added to the clock could wrap and fire at
  // once (INT64_MAX ms did: a handshake "timed out" after 3 ms).
  for (auto field : {&UcxConfig::stall_timeout_ms, &UcxConfig::handshake_timeout_ms, &UcxConfig::revoke_timeout_ms}) {
    for (std::int64_t ms : {kMaxTimeoutMs + 1, std::numeric_limits<std::int64_t>::max()}) {
      bad = config();
      bad.*field = ms;
      expect_refused(bad, fmt::format("is {} (expected", ms));
    }
  }
  for (const char* tls : {",", "tcp,", ",tcp", "tcp,,self"}) {
    bad = config();
    bad.tls = tls;
    expect_refused(bad, "has an empty transport name");
  }
  bad = config();
  bad.tls = "bogus";  // UCX warns and has no transport left: the caller's setting, not the machine
  expect_refused(bad, "tls \"bogus\" leaves UCX no transport");
  // NICs: each must be a device of this machine, and each needs a lane.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad_nics = {
      {{"no-such-nic0"}, "no such network interface"},
      {{"mlx-none_9:1"}, "no such RDMA device"},
      {{""}, "is not a device name"},
      {{"lo,lo"}, "is not a device name"},
      {{std::string("lo\0junk", 7)}, "NIC \"lo\\x00junk\" is not a device name"},  // not read as "lo"
      {{"lo", "lo", "lo"}, "3 NICs"},  // lanes_per_peer is 2
      {std::vector<std::string>(9, "lo"), "at most 8"},
  };
  for (const auto& [nics, why] : bad_nics) {
    bad = config();
    bad.nics = nics;
    const auto made = UcxTransport::create(bad);
    ASSERT_FALSE(made.has_value()) << why;
    EXPECT_EQ(made.error().code(), StatusCode::kInvalidArgument) << made.error().to_string();
    EXPECT_NE(made.error().message().find(why), std::string::npos) << made.error().message();
  }
}

TEST_P(UcxTransportTest, ConnectToAClosedPortFailsUnavailable) {
  // A port nobody listens on: bind one, note it, close it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  ::close(fd);
  const std::string closed = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));

  a_ = make(/*handshake_timeout_ms=*/2000);
  auto path = a_->connect(closed, now());
  ASSERT_TRUE(path.has_value()) << path.error().to_string();
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*path) == PathState::kFailed; }, 5s));
  EXPECT_EQ(a_->path_status(*path).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(a_->path_healthy(*path, now()));
  auto& local = buffer(64);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  EXPECT_EQ(a_->submit(slice(1, *path, 0, Op::kWrite, local.data(), 0x1000, 1, 64), now()).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(a_->refresh_regions(*path).code(), StatusCode::kUnavailable);
  // Retrying the dead peer takes the same path again: a path a try grew
  // memory and every loop turn's walk (27 MB and 2.4x slower connects over
  // 20 000 tries).
  const std::size_t paths = a_->paths().size();
  for (int i = 0; i < 20; ++i) {
    auto again = a_->connect(closed, now());
    ASSERT_TRUE(again.has_value()) << again.error().to_string();
    EXPECT_EQ(*again, *path);
    ASSERT_TRUE(wait_until([&] { return a_->path_state(*again) == PathState::kFailed; }, 5s));
    EXPECT_EQ(a_->path_status(*again).code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(a_->paths().size(), paths);
}

TEST_P(UcxTransportTest, HandshakeThatDoesNotFinishInTimeFails) {
  auto path = a_->connect(b_->address(), now());
  ASSERT_TRUE(path.has_value());
  const TimeNs deadline = *a_->next_event_ns();
  std::vector<Completion> out;
  a_->poll(deadline, out);  // b_ never polled: nobody answered
  EXPECT_EQ(a_->path_state(*path), PathState::kFailed);
  const Status st = a_->path_status(*path);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("did not finish within 5000 ms"), std::string::npos) << st.message();
  // Its handshake bound no lane: connecting again starts that path afresh
  // rather than adding one.
  const std::size_t paths = a_->paths().size();
  auto again = a_->connect(b_->address(), now());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, *path);
  EXPECT_EQ(a_->paths().size(), paths);
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*again) == PathState::kReady; }));
}

TEST_P(UcxTransportTest, APeerThatGoesAwayFailsItsSlicesUnavailable) {
  if (!GetParam().peer_failure_detection) {
    GTEST_SKIP() << "flavour " << GetParam().name
                 << " runs without peer-failure detection (UCX 1.13 offers shared memory only then)";
  }
  constexpr std::size_t kBytes = 8 << 20;
  auto& remote = buffer(kBytes);
  auto rr = expose(remote.data(), remote.size());
  ASSERT_TRUE(rr.has_value());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& local = buffer(pattern(kBytes, 1));
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  constexpr std::size_t kSlice = 256 * 1024;
  constexpr std::size_t kCount = kBytes / kSlice;
  for (SliceId i = 0; i < kCount; ++i) {
    ASSERT_TRUE(a_->submit(slice(i, path, static_cast<int>(i % 2), i % 3 == 0 ? Op::kRead : Op::kWrite,
                                 local.data() + i * kSlice, addr(remote.data()) + i * kSlice, *rr, kSlice),
                           now())
                    .is_ok());
  }
  a_->poll(now(), done_a_);
  b_.reset();  // the peer goes away while the slices are in flight
  ASSERT_TRUE(wait_slices(kCount)) << done_a_.size() << " of " << kCount << " slices ended";
  std::size_t unavailable = 0;
  for (const Completion& c : done_a_) {
    EXPECT_TRUE(c.status.is_ok() || c.status.code() == StatusCode::kUnavailable) << c.status.to_string();
    if (c.status.code() == StatusCode::kUnavailable) ++unavailable;
  }
  // A same-host copy is done at submit: none was in flight to fail
  // (tests/serve kills a real process under traffic). A holder with progress
  // threads may have served every slice before it went.
  if (GetParam().same_host_copy) {
    EXPECT_EQ(unavailable, 0u);
  } else if (GetParam().progress_threads == 0) {
    EXPECT_GT(unavailable, 0u);
  }
  EXPECT_EQ(a_->slices_in_flight(), 0u);
  EXPECT_TRUE(wait_until([&] { return a_->path_state(path) == PathState::kFailed; }));
  EXPECT_EQ(a_->path_status(path).code(), StatusCode::kUnavailable);
  EXPECT_EQ(a_->submit(slice(999, path, 0, Op::kWrite, local.data(), addr(remote.data()), *rr, 64), now()).code(),
            StatusCode::kUnavailable);
}

// A failed path's slot goes to the next connect once nothing of it is
// left at UCX. Each restart of a holder had added a path for good (about
// 2 KB, walked by every loop turn), 2 MB over 1000 restarts; so did each
// holder that came back on another address (a rescheduled pod), until
// the slot was taken whatever its address. Three incarnations, each
// written and read back through its own lanes and regions.
void UcxTransportTest::reach_holders_through_one_slot(bool same_address) {
  constexpr std::size_t kBytes = 256 * 1024;
  auto& local = buffer(pattern(kBytes, 7));
  auto& back = buffer(kBytes);
  ASSERT_TRUE(a_->register_memory(local.data(), kBytes).has_value());
  ASSERT_TRUE(a_->register_memory(back.data(), kBytes).has_value());
  const std::string address = b_->address();
  std::optional<PathId> first;
  SliceId next = 1;
  for (std::uint32_t incarnation = 0; incarnation < 3; ++incarnation) {
    auto& remote = buffer(kBytes);
    auto region = expose(remote.data(), kBytes);
    ASSERT_TRUE(region.has_value()) << region.error().to_string();
    const PathId path = connect_ready();
    ASSERT_FALSE(HasFailure());
    if (!first) first = path;
    EXPECT_EQ(path, *first) << "incarnation " << incarnation;
    ASSERT_EQ(a_->paths().size(), 1u);
    EXPECT_EQ(a_->paths()[path].incarnation, incarnation);
    EXPECT_EQ(a_->paths()[path].to, b_->address());
    // Written, then read back through the new incarnation: its lanes, its regions.
    done_a_.clear();
    ASSERT_TRUE(a_->submit(slice(next++, path, 0, Op::kWrite, local.data(), addr(remote.data()), *region, kBytes),
                           now())
                    .is_ok());
    ASSERT_TRUE(wait_slices(1));
    ASSERT_TRUE(a_->submit(slice(next++, path, 1, Op::kRead, back.data(), addr(remote.data()), *region, kBytes), now())
                    .is_ok());
    ASSERT_TRUE(wait_slices(2));
    for (const Completion& c : done_a_) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(remote, pattern(kBytes, 7));
    EXPECT_EQ(back, pattern(kBytes, 7));
    std::ranges::fill(back, 0);
    // Gone, then back: on the same address once the kernel lets the port
    // go, or on a new port.
    b_.reset();
    ASSERT_TRUE(wait_until([&] { return a_->path_state(path) == PathState::kFailed; }))
        << "incarnation " << incarnation;
    // Its endpoints' closes finish on later polls; then its slot is free.
    ASSERT_TRUE(wait_until([&] { return a_->path_reusable(path); })) << "incarnation " << incarnation;
    UcxConfig again = config();
    if (same_address) again.listen_address = address;
    for (int i = 0; i < 50 && !b_; ++i) {
      if (auto made = UcxTransport::create(again)) {
        b_ = std::move(*made);
      } else {
        std::this_thread::sleep_for(100ms);
      }
    }
    ASSERT_TRUE(b_) << address << " stayed taken";
    EXPECT_EQ(b_->address() == address, same_address) << b_->address();
  }
}

TEST_P(UcxTransportTest, APeerBackOnItsAddressTakesItsFailedPathAgain) { reach_holders_through_one_slot(true); }

TEST_P(UcxTransportTest, APeerOnAnotherAddressTakesAFailedPathsSlot) { reach_holders_through_one_slot(false); }

// A live path keeps its slot: a connect to another address takes the
// failed one (once no slice of it is held outside UCX), and a connect to
// its own address returns it.
TEST_P(UcxTransportTest, AConnectTakesAFailedSlotNeverALiveOne) {
  const PathId live = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto gone = UcxTransport::create(config());
  ASSERT_TRUE(gone.has_value()) << gone.error().to_string();
  auto dead = a_->connect((*gone)->address(), now());
  ASSERT_TRUE(dead.has_value()) << dead.error().to_string();
  ASSERT_NE(*dead, live);
  std::vector<Completion> ignored;
  ASSERT_TRUE(wait_until([&] {
    (*gone)->poll(now(), ignored);
    return a_->path_state(*dead) != PathState::kConnecting;
  }));
  ASSERT_EQ(a_->path_state(*dead), PathState::kReady) << a_->path_status(*dead).to_string();
  gone->reset();
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*dead) == PathState::kFailed; }));
  EXPECT_FALSE(a_->path_reusable(live));
  EXPECT_TRUE(a_->path_in_this_process(live));  // b_ is a transport of this test process
  EXPECT_FALSE(a_->path_in_this_process(99));
  // Its endpoints' closes finish on later polls; until then it is not free.
  ASSERT_TRUE(wait_until([&] { return a_->path_reusable(*dead); }));
  // Nor while its caller holds a slice of it (a GPU copy before UCX).
  a_->hold_path(*dead);
  EXPECT_FALSE(a_->path_reusable(*dead));
  auto held = UcxTransport::create(config());
  ASSERT_TRUE(held.has_value()) << held.error().to_string();
  auto beside = a_->connect((*held)->address(), now());
  ASSERT_TRUE(beside.has_value()) << beside.error().to_string();
  EXPECT_EQ(*beside, 2u);
  a_->release_path(*dead);
  EXPECT_TRUE(a_->path_reusable(*dead));
  EXPECT_FALSE(a_->path_reusable(99));
  auto third = UcxTransport::create(config());
  ASSERT_TRUE(third.has_value()) << third.error().to_string();
  auto taken = a_->connect((*third)->address(), now());
  ASSERT_TRUE(taken.has_value()) << taken.error().to_string();
  EXPECT_EQ(*taken, *dead);
  EXPECT_EQ(a_->paths().size(), 3u);
  EXPECT_EQ(a_->paths()[*taken].incarnation, 1u);
  EXPECT_EQ(a_->paths()[*taken].to, (*third)->address());
  ASSERT_TRUE(wait_until([&] {
    (*third)->poll(now(), ignored);
    return a_->path_state(*taken) != PathState::kConnecting;
  }));
  EXPECT_EQ(a_->path_state(*taken), PathState::kReady) << a_->path_status(*taken).to_string();
  EXPECT_EQ(a_->path_state(live), PathState::kReady);
  auto again = a_->connect(b_->address(), now());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, live);
}

// A same-host copy is the initiator's alone: the holder, never polled after
// the handshake, still serves reads and writes, through its memfd for
// memory it allocated and through CMA for memory it registered.
TEST_P(UcxTransportTest, SameHostCopiesNeedNoCpuOfThePeer) {
  if (!GetParam().same_host_copy) GTEST_SKIP() << "flavour " << GetParam().name << " copies through UCX";
  constexpr std::size_t kBytes = 1 << 20;
  auto& registered = buffer(pattern(kBytes, 3));
  auto reg = expose(registered.data(), registered.size());
  ASSERT_TRUE(reg.has_value());
  auto allocated = b_->allocate_memory(kBytes);
  ASSERT_TRUE(allocated.has_value()) << allocated.error().to_string();
  std::memcpy(allocated->address, pattern(kBytes, 4).data(), kBytes);
  ASSERT_TRUE(b_->export_region(allocated->handle).is_ok());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(a_->paths()[path].type, topology::PathType::kShm);

  auto& local = buffer(2 * kBytes);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  const std::uint64_t alloc_addr = addr(allocated->address);
  ASSERT_TRUE(a_->submit(slice(1, path, 0, Op::kRead, local.data(), addr(registered.data()), *reg, kBytes), now())
                  .is_ok());
  ASSERT_TRUE(a_->submit(slice(2, path, 1, Op::kRead, local.data() + kBytes, alloc_addr, allocated->handle, kBytes),
                         now())
                  .is_ok());
  // b_ is not polled from here on. A CMA copy completes on the copier's
  // thread: a_'s next polls hand it out.
  std::vector<Completion> out;
  auto poll_a = [&] {
    out.clear();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (out.size() < 2 && std::chrono::steady_clock::now() < deadline) a_->poll(now(), out);
  };
  poll_a();
  ASSERT_EQ(out.size(), 2u);
  for (const Completion& c : out) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 3).data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(local.data() + kBytes, pattern(kBytes, 4).data(), kBytes), 0);

  const auto fresh = pattern(kBytes, 9);
  std::memcpy(local.data(), fresh.data(), kBytes);
  std::memcpy(local.data() + kBytes, fresh.data(), kBytes);
  ASSERT_TRUE(a_->submit(slice(3, path, 0, Op::kWrite, local.data(), addr(registered.data()), *reg, kBytes), now())
                  .is_ok());
  ASSERT_TRUE(
      a_->submit(slice(4, path, 1, Op::kWrite, local.data() + kBytes, alloc_addr, allocated->handle, kBytes), now())
          .is_ok());
  poll_a();
  ASSERT_EQ(out.size(), 2u);
  for (const Completion& c : out) EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(std::memcmp(registered.data(), fresh.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(allocated->address, fresh.data(), kBytes), 0);
  EXPECT_EQ(a_->slices_in_flight(), 0u);
}

// copy_direct: a same-host path copies on the calling thread, all or
// nothing; every other flavour refuses with nothing copied.
TEST_P(UcxTransportTest, CopyDirectIsAllOrNothingAndOnlyForSameHostPeers) {
  constexpr std::size_t kBytes = 64 << 10;
  auto& registered = buffer(pattern(kBytes, 3));
  auto reg = expose(registered.data(), registered.size());
  ASSERT_TRUE(reg.has_value());
  auto allocated = b_->allocate_memory(kBytes);
  ASSERT_TRUE(allocated.has_value());
  std::memcpy(allocated->address, pattern(kBytes, 4).data(), kBytes);
  ASSERT_TRUE(b_->export_region(allocated->handle).is_ok());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& local = buffer(2 * kBytes);
  auto mine = a_->register_memory(local.data(), local.size());
  ASSERT_TRUE(mine.has_value());
  std::vector<Completion> out;
  a_->poll(now(), out);  // publishes the ready path to copy_direct's table
  const std::string peer = a_->paths()[path].to;
  using Copy = UcxTransport::DirectCopy;
  const std::vector<Copy> reads{{peer, Op::kRead, *mine, 0, *reg, 0, kBytes},
                                {peer, Op::kRead, *mine, kBytes, allocated->handle, 0, kBytes}};
  std::vector<Status> results(2, Status::internal("untouched"));
  if (!GetParam().same_host_copy) {
    EXPECT_EQ(a_->copy_direct(reads, results).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(results[0].code(), StatusCode::kInternal);
    return;
  }
  ASSERT_TRUE(a_->copy_direct(reads, results).is_ok());
  for (const Status& r : results) EXPECT_TRUE(r.is_ok()) << r.to_string();
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 3).data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(local.data() + kBytes, pattern(kBytes, 4).data(), kBytes), 0);
  EXPECT_EQ(a_->slices_in_flight(), 0u);

  // One bad copy refuses the lot: the good write before it does not happen.
  const auto fresh = pattern(kBytes, 9);
  std::memcpy(local.data(), fresh.data(), kBytes);
  const Copy write{peer, Op::kWrite, *mine, 0, *reg, 0, kBytes};
  const std::vector<std::vector<Copy>> bad{
      {write, {peer, Op::kRead, *mine, 0, *reg, 1, kBytes}},                   // past the remote region
      {write, {peer, Op::kRead, *mine, 2 * kBytes, *reg, 0, 1}},               // past the local region
      {write, {peer, Op::kRead, *mine, 0, *reg, 0, 0}},                        // zero bytes
      {write, {peer, Op::kRead, *mine + 100, 0, *reg, 0, 8}},                  // unknown local region
      {write, {peer, Op::kRead, *mine, 0, 999, 0, 8}},                         // unknown remote region
      {write, {"127.0.0.1:1", Op::kRead, *mine, 0, *reg, 0, 8}},               // not a peer
      {write, {peer, static_cast<Op>(9), *mine, 0, *reg, 0, 8}}};              // unknown op
  for (const auto& copies : bad) {
    EXPECT_EQ(a_->copy_direct(copies, results).code(), StatusCode::kFailedPrecondition);
  }
  // A name of the peer's length that differs in any one character is
  // another peer (names are compared a word at a time).
  for (std::size_t i = 0; i < peer.size(); ++i) {
    std::string other = peer;
    other[i] = other[i] == '9' ? '8' : '9';
    const std::vector<Copy> copies{write, {other, Op::kRead, *mine, 0, *reg, 0, 8}};
    EXPECT_EQ(a_->copy_direct(copies, results).code(), StatusCode::kFailedPrecondition) << other;
  }
  EXPECT_EQ(std::memcmp(registered.data(), pattern(kBytes, 3).data(), kBytes), 0);
  EXPECT_EQ(a_->copy_direct(reads, std::span(results).first(1)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->copy_direct(std::span(&write, 1), std::span(results).first(1)).is_ok());
  EXPECT_EQ(std::memcmp(registered.data(), fresh.data(), kBytes), 0);
}

// copy_direct with ResolvedCopies: resolved once per published table, then
// copied without the copies; a new table (a region of ours came) makes the
// same call resolve again, and one that finds no copies to resolve refuses
// rather than copying what an older table allowed.
TEST_P(UcxTransportTest, ResolvedCopiesAreResolvedAgainForEachNewTable) {
  if (!GetParam().same_host_copy) GTEST_SKIP() << "no direct copies in this flavour";
  constexpr std::size_t kBytes = 64 << 10;
  auto allocated = b_->allocate_memory(kBytes);
  ASSERT_TRUE(allocated.has_value());
  ASSERT_TRUE(b_->export_region(allocated->handle).is_ok());
  const PathId path = connect_ready();
  ASSERT_FALSE(HasFailure());
  auto& local = buffer(kBytes);
  auto mine = a_->register_memory(local.data(), local.size());
  ASSERT_TRUE(mine.has_value());
  std::vector<Completion> out;
  a_->poll(now(), out);
  const std::uint64_t first = a_->direct_generation();
  ASSERT_NE(first, 0u);
  const std::vector<UcxTransport::DirectCopy> reads{{a_->paths()[path].to, Op::kRead, *mine, 0, allocated->handle, 0, kBytes}};
  std::vector<Status> results(1, Status::internal("untouched"));
  UcxTransport::ResolvedCopies resolved;
  std::memcpy(allocated->address, pattern(kBytes, 5).data(), kBytes);
  ASSERT_TRUE(a_->copy_direct(reads, resolved, results).is_ok());
  EXPECT_TRUE(results[0].is_ok());
  EXPECT_EQ(resolved.generation, first);
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 5).data(), kBytes), 0);
  // The same table: no copies needed.
  std::memcpy(allocated->address, pattern(kBytes, 6).data(), kBytes);
  ASSERT_TRUE(a_->copy_direct({}, resolved, results).is_ok());
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 6).data(), kBytes), 0);
  // A new table: without copies it refuses and copies nothing ...
  auto& other = buffer(4096);
  ASSERT_TRUE(a_->register_memory(other.data(), other.size()).has_value());
  a_->poll(now(), out);
  EXPECT_GT(a_->direct_generation(), first);
  std::memcpy(allocated->address, pattern(kBytes, 7).data(), kBytes);
  EXPECT_EQ(a_->copy_direct({}, resolved, results).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 6).data(), kBytes), 0);
  // ... and with them it resolves against the new one and copies.
  ASSERT_TRUE(a_->copy_direct(reads, resolved, results).is_ok());
  EXPECT_EQ(resolved.generation, a_->direct_generation());
  EXPECT_EQ(std::memcmp(local.data(), pattern(kBytes, 7).data(), kBytes), 0);
  // Our region gone: the next table has no such region, and the resolution refuses.
  ASSERT_TRUE(a_->unregister(*mine).is_ok());
  a_->poll(now(), out);
  EXPECT_EQ(a_->copy_direct(reads, resolved, results).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a_->copy_direct({}, resolved, results).code(), StatusCode::kFailedPrecondition);
}

// Returns whether `fd` became readable within `limit`, while `progress_other`
// runs (the peer's side of the work) in between short waits.
bool readable_within(int fd, const std::function<void()>& progress_other, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1) > 0) return true;
    progress_other();
  }
  return false;
}

TEST_P(UcxTransportTest, EventFdWakesAnArmedIdleTransport) {
  ASSERT_GE(a_->event_fd(), 0);
  auto& remote = buffer(1 << 20);
  auto rr = expose(remote.data(), remote.size());
  ASSERT_TRUE(rr.has_value());

  // The handshake answer wakes the initiator.
  auto path = a_->connect(b_->address(), now());
  ASSERT_TRUE(path.has_value());
  std::vector<Completion> none;
  const TimeNs limit = now() + 5'000'000'000;
  while (!a_->arm()) {
    ASSERT_LT(now(), limit) << "never armed";
    a_->poll(now(), none);
  }
  EXPECT_TRUE(readable_within(a_->event_fd(), [&] { b_->poll(now(), done_b_); }, 5s));
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*path) == PathState::kReady; }));
  SKIP_UNLESS_FLAVOR_TRANSPORT(*path);

  // Idle: a loop that sleeps on the fd whenever arm() lets it barely runs
  // (a busy-polling one would go round thousands of times in 200 ms). Both
  // sides settle first: the other lanes' wire-up may still be under way.
  wait_until([] { return false; }, 100ms);
  int rounds = 0;
  const TimeNs idle_end = now() + 200'000'000;
  while (now() < idle_end) {
    ++rounds;
    if (a_->arm()) {
      pollfd p{a_->event_fd(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::max<TimeNs>(1, (idle_end - now()) / 1'000'000)));
    }
    a_->poll(now(), done_a_);
  }
  EXPECT_LT(rounds, 20) << "an idle transport kept its loop busy";
  EXPECT_TRUE(done_a_.empty());

  // A completion wakes it too, when it is not already done at submit (shared
  // memory RMA usually is: then arm() refuses until it is handed out).
  auto& local = buffer(1 << 20, 0x33);
  ASSERT_TRUE(a_->register_memory(local.data(), local.size()).has_value());
  ASSERT_TRUE(a_->submit(slice(1, *path, 1, Op::kWrite, local.data(), addr(remote.data()), *rr, local.size()), now())
                  .is_ok());
  // Software RMA over shared memory keeps the worker busy (arm refuses)
  // until the peer has served it, so the peer is polled too until then.
  bool armed = false;
  while (done_a_.empty() && !(armed = a_->arm())) {
    ASSERT_LT(now(), limit + 5'000'000'000) << "never armed nor completed";
    poll_both();
  }
  if (armed) {
    EXPECT_TRUE(readable_within(a_->event_fd(), [&] { b_->poll(now(), done_b_); }, 5s));
    ASSERT_TRUE(wait_slices(1));
  }
  ASSERT_EQ(done_a_.size(), 1u);
  EXPECT_TRUE(done_a_[0].status.is_ok());
  EXPECT_EQ(remote, local);
}

// The kernel's cap on a receive buffer a process sets (net.core.rmem_max);
// 0 if unreadable.
std::uint64_t receive_buffer_max() {
  std::uint64_t bytes = 0;
  if (FILE* f = std::fopen("/proc/sys/net/core/rmem_max", "re")) {
    if (std::fscanf(f, "%lu", &bytes) != 1) bytes = 0;
    std::fclose(f);
  }
  return bytes;
}

// This process's TCP sockets whose receive buffer is `bytes` as the kernel
// reports it (twice what was set).
int sockets_receiving_into(std::uint64_t bytes) {
  int found = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0, rcv = 0;
    socklen_t len = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    len = sizeof rcv;
    if (::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len) != 0) continue;
    if (static_cast<std::uint64_t>(rcv) == 2 * bytes) ++found;
  }
  return found;
}

// UCX's TCP sockets get a fixed receive buffer where the kernel allows it
// (tcp_receive_buffer_bytes), the transport lists what it set, and a size
// above the kernel's cap, or one the environment sets, is left alone.
TEST_P(UcxTransportTest, TcpSocketsGetTheReceiveBufferItListsWhereTheKernelAllowsIt) {
  if (GetParam().name != std::string("tcp")) GTEST_SKIP() << "one TCP flavour is enough";
  const std::uint64_t cap = receive_buffer_max();
  const std::uint64_t bytes = std::min<std::uint64_t>(cap / 4096 * 4096, 768 << 10);
  if (bytes < kMinTcpReceiveBufferBytes) GTEST_SKIP() << "net.core.rmem_max allows " << cap << " bytes";
  for (const char* name : {"UCX_TCP_RCVBUF", "UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}) {
    if (std::getenv(name) != nullptr) GTEST_SKIP() << "the environment sets " << name;
  }
  auto listed = [](const UcxTransport& t) {
    return std::map<std::string, std::string>(t.ucx_settings().begin(), t.ucx_settings().end());
  };
  UcxConfig c = config();
  c.tcp_receive_buffer_bytes = bytes;
  for (auto* side : {&a_, &b_}) {
    (*side)->shutdown();
    auto made = UcxTransport::create(c);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    *side = std::move(*made);
  }
  const auto settings = listed(*a_);
  EXPECT_EQ(settings.at("UCX_TCP_RCVBUF"), std::to_string(bytes));
  EXPECT_FALSE(settings.contains("UCX_TCP_SNDBUF"));  // left to the kernel (the header says why)
  EXPECT_EQ(settings.at("UCX_TCP_TX_SEG_SIZE"), std::to_string(c.tcp_segment_bytes));
  const int before = sockets_receiving_into(bytes);
  connect_ready();
  ASSERT_FALSE(HasFailure());
  // Each lane's endpoint on both sides (one process here) is a UCX socket.
  EXPECT_GE(sockets_receiving_into(bytes) - before, 2 * c.lanes_per_peer);

  // Above the kernel's cap: the autotuning stays, the segment is still set.
  if (cap < kMaxTcpReceiveBufferBytes) {
    c.tcp_receive_buffer_bytes = cap + 4096;
    auto above = UcxTransport::create(c);
    ASSERT_TRUE(above.has_value()) << above.error().to_string();
    EXPECT_FALSE(listed(**above).contains("UCX_TCP_RCVBUF"));
    EXPECT_TRUE(listed(**above).contains("UCX_TCP_RX_SEG_SIZE"));
  }
  // 0: the autotuning; and with no TCP among the transports nothing is set.
  c.tcp_receive_buffer_bytes = 0;
  auto autotuned = UcxTransport::create(c);
  ASSERT_TRUE(autotuned.has_value());
  EXPECT_FALSE(listed(**autotuned).contains("UCX_TCP_RCVBUF"));
  c.tcp_receive_buffer_bytes = bytes;
  c.tls = "sm";
  c.peer_failure_detection = false;
  c.same_host_copy = false;
  auto no_tcp = UcxTransport::create(c);
  ASSERT_TRUE(no_tcp.has_value()) << no_tcp.error().to_string();
  EXPECT_TRUE((*no_tcp)->ucx_settings().empty());
  // A negated list opens TCP unless it names it ("^rc" ran over TCP with
  // nothing set, at a tenth of the speed).
  for (const auto& [tls, tcp] : {std::pair<std::string, bool>{"^rc,ud", true}, {"^ud:aux,tcp", false}, {"sm,tcp:aux", true}}) {
    SCOPED_TRACE(tls);
    c.tls = tls;
    auto made = UcxTransport::create(c);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    EXPECT_EQ(listed(**made).contains("UCX_TCP_RX_SEG_SIZE"), tcp);
    EXPECT_EQ(listed(**made).contains("UCX_TCP_RCVBUF"), tcp);
  }
}

// One TCP segment set in the environment leaves the other to UCX too: UCX
// refuses a receive segment below the send one, and a user's
// UCX_TCP_RX_SEG_SIZE=64k failed every engine (ucp_worker_create).
TEST_P(UcxTransportTest, OneTcpSegmentFromTheEnvironmentLeavesBothToIt) {
  if (GetParam().name != std::string("tcp")) GTEST_SKIP() << "one TCP flavour is enough";
  for (const char* name : {"UCX_TCP_RX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE"}) {
    if (std::getenv(name) != nullptr) GTEST_SKIP() << "the environment sets " << name;
  }
  for (const char* name : {"UCX_TCP_RX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(::setenv(name, "64k", 1), 0);
    auto made = UcxTransport::create(config());
    ::unsetenv(name);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    for (const auto& [listed, value] : (*made)->ucx_settings()) EXPECT_FALSE(listed.ends_with("_SEG_SIZE")) << listed;
  }
}

INSTANTIATE_TEST_SUITE_P(Flavors, UcxTransportTest, ::testing::Values(kTcp, kShm, kTcpRma, kDirect, kDirectThreads, kRails, kRmaRails,
                                                                    kTcpThreads, kShmThreads, kRailsThreads, kRmaRailsThreads),
                         [](const ::testing::TestParamInfo<Flavor>& info) { return info.param.name; });

}  // namespace
}  // namespace baton::transport

namespace baton::transport {
namespace {

std::string contents(FILE* f) {
  std::string text;
  std::rewind(f);
  char chunk[4096];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) text.append(chunk, n);
  return text;
}

// UCX prints its log on stdout, where a program using Baton writes its own
// output: from the first transport on, UCX's lines go to stderr.
TEST(UcxLog, ItsWarningsGoToStderrNotStdout) {
  std::fflush(stdout);
  std::fflush(stderr);
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  ASSERT_TRUE(out != nullptr && err != nullptr);
  const int saved_out = ::dup(STDOUT_FILENO), saved_err = ::dup(STDERR_FILENO);
  ::dup2(::fileno(out), STDOUT_FILENO);
  ::dup2(::fileno(err), STDERR_FILENO);
  UcxConfig c;
  c.tls = "tcp,no_such_transport";  // UCX warns about the second and goes on with the first
  auto made = UcxTransport::create(c);
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, STDOUT_FILENO);
  ::dup2(saved_err, STDERR_FILENO);
  ::close(saved_out);
  ::close(saved_err);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  const std::string said_out = contents(out), said_err = contents(err);
  std::fclose(out);
  std::fclose(err);
  EXPECT_EQ(said_out.find("no_such_transport"), std::string::npos) << said_out;
  EXPECT_NE(said_err.find("UCX WARN"), std::string::npos) << said_err;
  EXPECT_NE(said_err.find("'no_such_transport' is not available"), std::string::npos) << said_err;
}

}  // namespace
}  // namespace baton::transport
