// UcxTransport's datapath against raw UCX (ucx_perftest; docs/results.md,
// "UCX transport"). Two UcxTransports in one process over loopback TCP, both
// progressed by the benchmark thread, each with one registered 64 MiB buffer.
// Every iteration posts one slice of the block size (a write: ucp_put_nbx +
// ucp_ep_flush_nbx; a read: ucp_get_nbx) on alternating lanes, keeping a fixed
// number in flight; the buffer is walked block by block. The data is checked
// once at the end of each run. Every wait is bounded (a few seconds).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "baton/transport/ucx_transport.h"

namespace {

using namespace baton;
using namespace baton::transport;

constexpr std::size_t kBufferBytes = std::size_t{64} << 20;
constexpr int kLanes = 2;
constexpr TimeNs kWaitLimitNs = 5'000'000'000;  // no single wait runs longer

std::uint8_t pattern_byte(std::size_t i, std::uint8_t seed) {
  return static_cast<std::uint8_t>((i * 131 + seed + (i >> 12)) & 0xff);
}

void fill(std::vector<std::uint8_t>& v, std::uint8_t seed) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = pattern_byte(i, seed);
}

// a (the initiator) connected to b (the target). The buffers are declared
// first so they outlive the transports: until a transport is gone its peer's
// RMA may still land in them.
struct Pair {
  std::vector<std::uint8_t> buf_a = std::vector<std::uint8_t>(kBufferBytes);
  std::vector<std::uint8_t> buf_b = std::vector<std::uint8_t>(kBufferBytes);
  std::unique_ptr<UcxTransport> a;
  std::unique_ptr<UcxTransport> b;
  RegionHandle region_b = 0;
  PathId path = 0;
  SteadyClock clock;
  std::vector<Completion> done_a;
  std::vector<Completion> done_b;
  SliceId next_id = 1;

  void poll_both() {
    const TimeNs now = clock.now_ns();
    a->poll(now, done_a);
    b->poll(now, done_b);
  }

  // Empty string on success, else why not.
  static std::string make(std::unique_ptr<Pair>& out) {
    auto p = std::make_unique<Pair>();
    UcxConfig config;
    config.tls = "tcp";
    config.lanes_per_peer = kLanes;
    auto a = UcxTransport::create(config);
    if (!a) return "create a: " + a.error().to_string();
    auto b = UcxTransport::create(config);
    if (!b) return "create b: " + b.error().to_string();
    p->a = std::move(*a);
    p->b = std::move(*b);
    if (auto r = p->a->register_memory(p->buf_a.data(), p->buf_a.size()); !r) {
      return "register a: " + r.error().to_string();
    }
    auto rb = p->b->register_memory(p->buf_b.data(), p->buf_b.size());
    if (!rb) return "register b: " + rb.error().to_string();
    p->region_b = *rb;
    if (Status s = p->b->export_region(*rb); !s.is_ok()) return "export b: " + s.to_string();
    auto path = p->a->connect(p->b->address(), p->clock.now_ns());
    if (!path) return "connect: " + path.error().to_string();
    p->path = *path;
    const TimeNs deadline = p->clock.now_ns() + kWaitLimitNs;
    while (p->a->path_state(p->path) == PathState::kConnecting && p->clock.now_ns() < deadline) p->poll_both();
    if (p->a->path_state(p->path) != PathState::kReady) return "handshake: " + p->a->path_status(p->path).to_string();
    out = std::move(p);
    return {};
  }
};

// One pair for the whole executable (connecting per run would add noise).
Pair* pair_or_error(std::string& error) {
  static std::unique_ptr<Pair> pair;
  static std::string make_error;
  static bool made = false;
  if (!made) {
    made = true;
    make_error = Pair::make(pair);
  }
  error = make_error;
  return pair.get();
}

void run(benchmark::State& state, Op op) {
  const auto block = static_cast<std::size_t>(state.range(0));
  const auto in_flight_max = static_cast<std::size_t>(state.range(1));
  std::string error;
  Pair* p = pair_or_error(error);
  if (p == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  // Source filled, destination cleared: a write moves a -> b, a read b -> a.
  auto& src = op == Op::kWrite ? p->buf_a : p->buf_b;
  auto& dst = op == Op::kWrite ? p->buf_b : p->buf_a;
  const auto seed = static_cast<std::uint8_t>(block >> 16);
  fill(src, seed);
  std::memset(dst.data(), 0, dst.size());
  const std::size_t slots = kBufferBytes / block;
  const std::uint64_t remote_base = reinterpret_cast<std::uint64_t>(p->buf_b.data());

  std::size_t posted = 0;
  std::size_t completed = 0;
  std::string failure;
  // Polls both sides until fewer than `limit` slices are in flight; false on
  // a failed slice or after kWaitLimitNs.
  auto wait_below = [&](std::size_t limit) {
    const TimeNs deadline = p->clock.now_ns() + kWaitLimitNs;
    while (posted - completed >= limit) {
      p->poll_both();
      for (const Completion& c : p->done_a) {
        if (!c.status.is_ok()) failure = "slice failed: " + c.status.to_string();
        ++completed;
      }
      p->done_a.clear();
      p->done_b.clear();
      if (!failure.empty()) return false;
      if (posted - completed >= limit && p->clock.now_ns() > deadline) {
        failure = "no completion within 5 s";
        return false;
      }
    }
    return true;
  };

  for (auto _ : state) {
    if (!wait_below(in_flight_max)) break;
    const std::size_t offset = (posted % slots) * block;
    const SliceSubmit s{p->next_id++, p->path, static_cast<int>(posted % kLanes), block,
                        {op, p->buf_a.data() + offset, remote_base + offset, p->region_b}};
    if (Status st = p->a->submit(s, p->clock.now_ns()); !st.is_ok()) {
      failure = "submit: " + st.to_string();
      break;
    }
    ++posted;
    // The last iteration drains, inside the measured time: the bytes counted
    // must have moved.
    if (posted == static_cast<std::size_t>(state.max_iterations) && !wait_below(1)) break;
  }
  if (!failure.empty()) {
    state.SkipWithError(failure.c_str());
    return;
  }
  const std::size_t checked = std::min(posted, slots) * block;  // after the loop: not timed
  if (std::memcmp(src.data(), dst.data(), checked) != 0) {
    state.SkipWithError("data mismatch at the destination");
    return;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(posted * block));
  state.counters["in_flight"] = static_cast<double>(in_flight_max);
  state.counters["lanes"] = kLanes;
}

void BM_UcxWrite(benchmark::State& state) { run(state, Op::kWrite); }
void BM_UcxRead(benchmark::State& state) { run(state, Op::kRead); }

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t block : {std::int64_t{64} << 10, std::int64_t{1} << 20, std::int64_t{4} << 20}) {
    b->Args({block, 8});
  }
  b->UseRealTime();
}

BENCHMARK(BM_UcxWrite)->Apply(sizes);
BENCHMARK(BM_UcxRead)->Apply(sizes);

}  // namespace
