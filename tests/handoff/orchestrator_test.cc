// The handoff orchestrator: tickets carried over real engines in one process
// (a tp=2 producer replica into consumer replicas of other layouts, every
// byte checked against the KV pattern), and its failure semantics over fake
// ranks that record their load orders and complete only when the test says.
#include "baton/handoff/orchestrator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "baton/engine/engine.h"
#include "baton/engine/metrics.h"
#include "baton/handoff/kv_pattern.h"
#include "baton/handoff/rank.h"
#include "transport/fake_cuda_runtime.h"

namespace baton {
// gtest prints a StatusCode by name (internal linkage: this file's only).
[[maybe_unused]] static void PrintTo(StatusCode code, std::ostream* os) { *os << to_string(code); }
}  // namespace baton

namespace baton::handoff {
namespace {

using transport::testing::FakeCudaRuntime;

constexpr TimeNs kMs = 1'000'000;
constexpr TimeNs kSecond = 1'000 * kMs;

// Polls `done` until it holds or `limit` passed: every wait is bounded.
template <typename F>
bool eventually(F&& done, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// reserved, in_use, retained (gtest prints a tuple).
using Counts = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;
Counts counts(const Orchestrator& o, std::string_view consumer = "decode") {
  auto c = o.pages(consumer);
  EXPECT_TRUE(c.has_value());
  return c ? Counts{c->reserved, c->in_use, c->retained} : Counts{};
}

// ---------------------------------------------------------------------------
// Real engines.

// A small vLLM-like layout: 4 layers, 4 kv heads of 64 bytes, 16-token pages.
KvLayout vllm(std::uint32_t tp, std::uint32_t sp = 1, KvOrder order = KvOrder::kHnd, std::uint32_t cfg = 1) {
  return KvLayout{.layers = 4, .kv_heads = 4, .head_bytes = 64, .page_tokens = 16, .order = order, .tp = tp,
                  .sp = sp, .cfg = cfg};
}

std::unique_ptr<engine::Engine> make_engine(std::shared_ptr<transport::CudaRuntime> cuda = nullptr) {
  engine::EngineConfig config;
  config.cuda = std::move(cuda);
  auto e = engine::Engine::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

// Where a replica's pages live: memory each worker's engine allocates, or
// memory the caller registered (create_over) — host memory, or the GPU
// memory of a scripted CUDA runtime per rank (host memory it tracks, so the
// bytes land only if every staging copy on both sides ran).
enum class Pages : std::uint8_t { kEngine, kCallerHost, kCallerGpu };

// One engine and one worker per rank of a layout.
template <typename Worker>
struct Replica {
  static constexpr std::uint32_t kPool = 32;
  KvLayout layout;
  std::vector<std::shared_ptr<FakeCudaRuntime>> gpus;  // per rank, kCallerGpu only
  std::vector<std::vector<std::byte>> host;             // per rank, kCallerHost only
  std::vector<void*> vram;                              // per rank, kCallerGpu only
  std::vector<std::unique_ptr<engine::Engine>> engines;
  std::vector<std::unique_ptr<Worker>> workers;

  explicit Replica(const KvLayout& l, Pages where = Pages::kEngine) : layout(l) {
    const std::uint64_t bytes = l.page_bytes() * kPool;
    for (std::uint32_t r = 0; r < l.ranks(); ++r) {
      if (where == Pages::kCallerGpu) gpus.push_back(std::make_shared<FakeCudaRuntime>(1));
      engines.push_back(make_engine(where == Pages::kCallerGpu ? gpus.back() : nullptr));
      if (engines.back() == nullptr) return;
      engine::Engine& e = *engines.back();
      Result<engine::Region> region = engine::Region{};
      if (where == Pages::kCallerHost) {
        host.emplace_back(bytes + 4096);  // more than the pool: it takes the first pages
        region = e.register_memory(host.back().data(), host.back().size());
      } else if (where == Pages::kCallerGpu) {
        vram.push_back(*gpus.back()->alloc_device(0, bytes));
        region = e.register_memory(vram.back(), bytes, engine::MemoryKind::kVram, 0);
      }
      EXPECT_TRUE(region.has_value()) << region.error().to_string();
      if (!region) return;
      auto w = where == Pages::kEngine ? Worker::create(e, l.page_bytes(), kPool)
                                       : Worker::create_over(e, region->handle, l.page_bytes(), kPool);
      EXPECT_TRUE(w.has_value()) << w.error().to_string();
      if (w) workers.push_back(std::move(*w));
    }
  }
  // Workers go before their engines, engines (and their CUDA streams)
  // before the memory they copy.
  ~Replica() {
    workers.clear();
    engines.clear();
    for (std::size_t r = 0; r < vram.size(); ++r) gpus[r]->free_device(vram[r]);
  }
  template <typename Rank>
  std::vector<Rank*> ranks() const {
    std::vector<Rank*> out;
    for (const auto& w : workers) out.push_back(w.get());
    return out;
  }
  std::vector<std::span<std::byte>> spans(std::uint32_t rank, const std::vector<std::uint32_t>& pages) const {
    std::vector<std::span<std::byte>> out;
    for (std::uint32_t p : pages) out.push_back(workers[rank]->page(p));
    return out;
  }
  std::vector<std::uint32_t> free_pages() const {
    std::vector<std::uint32_t> out;
    for (const auto& w : workers) out.push_back(w->pool().free_pages());
    return out;
  }
  // Bytes the ranks' CUDA copies moved.
  std::uint64_t gpu_copied() const {
    std::uint64_t n = 0;
    for (const auto& g : gpus) {
      for (const auto& c : g->copies()) n += c.bytes;
    }
    return n;
  }
};

using Producers = Replica<ProducerWorker>;
using Consumers = Replica<ConsumerWorker>;

// What generation writes: the pattern of `salt` into every source page of
// every row. Answers the bytes written.
Result<std::uint64_t> fill(const Producers& p, const Ticket& t, std::uint64_t salt) {
  std::uint64_t bytes = 0;
  for (std::uint32_t w = 0; w < t.sources.size(); ++w) {
    for (std::uint32_t r = 0; r < t.sources[w].size(); ++r) {
      auto spans = p.spans(r, t.sources[w][r].pages);
      if (auto s = fill_kv(RankPages{t.producer_layout, r, t.tokens, w, spans}, salt); !s.is_ok()) {
        return std::unexpected(s);
      }
      for (auto s : spans) bytes += s.size();
    }
  }
  return bytes;
}

// Checks every destination page of every row and rank; answers the bytes
// checked.
Result<std::uint64_t> check(const Consumers& c, const Ticket& t, std::uint64_t salt) {
  std::uint64_t bytes = 0;
  for (std::uint32_t w = 0; w < t.destination.size(); ++w) {
    for (std::uint32_t r = 0; r < t.destination[w].size(); ++r) {
      auto spans = c.spans(r, t.destination[w][r]);
      if (auto s = check_kv(RankPages{t.consumer_layout, r, t.tokens, w, spans}, salt); !s.is_ok()) {
        return std::unexpected(s);
      }
      for (auto s : spans) bytes += s.size();
    }
  }
  return bytes;
}

// A request's whole KV, every page of every row (padding included): what
// each side must have written and checked.
std::uint64_t kv_bytes(const KvLayout& l, std::uint32_t tokens) {
  return std::uint64_t{l.cfg} * l.pages_for(tokens) * l.layers * 2 * l.kv_heads * l.page_tokens * l.head_bytes;
}

// Pages a layout's rank holds over a set of requests (every row).
std::uint32_t rank_pages(const KvLayout& l, std::uint32_t rank, const std::vector<std::uint32_t>& tokens) {
  std::uint32_t n = 0;
  for (std::uint32_t t : tokens) n += l.cfg * l.rank_pages(rank, l.pages_for(t));
  return n;
}

struct RealCase {
  const char* name;
  KvLayout producer;
  KvLayout consumer;
  // 16 tokens is one page: with sp = 2 the first sp group holds none of it.
  std::vector<std::uint32_t> tokens;
  Pages producer_pages = Pages::kEngine;
  Pages consumer_pages = Pages::kEngine;
};

void PrintTo(const RealCase& c, std::ostream* os) { *os << c.name; }

class RealHandoff : public ::testing::TestWithParam<RealCase> {};

TEST_P(RealHandoff, EveryByteArrivesAndEveryPageComesBack) {
  const RealCase& c = GetParam();
  engine::MetricsRegistry metrics;
  Orchestrator o(HandoffConfig{.transfer_timeout_ns = 10 * kSecond, .metrics = &metrics});
  Producers prod(c.producer, c.producer_pages);
  Consumers cons(c.consumer, c.consumer_pages);
  ASSERT_EQ(prod.workers.size(), c.producer.ranks());
  ASSERT_EQ(cons.workers.size(), c.consumer.ranks());
  ASSERT_TRUE(o.add_producer("prefill", c.producer, prod.ranks<ProducerRank>()).is_ok());
  ASSERT_TRUE(o.add_consumer("decode", c.consumer, cons.ranks<ConsumerRank>()).is_ok());
  const std::uint64_t n = c.tokens.size();
  const std::uint32_t kPool = Producers::kPool;
  const std::uint64_t loads_per_ticket = std::uint64_t{c.consumer.cfg} * c.consumer.ranks();
  std::uint64_t all_dest = 0;
  for (std::uint32_t r = 0; r < c.consumer.ranks(); ++r) all_dest += rank_pages(c.consumer, r, c.tokens);
  auto gauge = [&](const char* owner) {
    return metrics.counter("baton_handoff_pages", {{"consumer", "decode"}, {"owner", owner}});
  };

  // Two rounds over the same pools: pages finished in the first are reused
  // (with another salt) by the second.
  for (std::uint64_t round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<TicketId> ids;
    for (std::size_t i = 0; i < n; ++i) {
      auto id = o.create_ticket({"req-" + std::to_string(round) + "-" + std::to_string(i), "decode", c.tokens[i]});
      ASSERT_TRUE(id.has_value()) << id.error().to_string();
      ids.push_back(*id);
    }
    EXPECT_EQ(o.tickets_in(TicketState::kCreated), n);
    auto salt = [&](std::size_t i) { return 0x5eed0000 + round * 100 + i; };

    for (TicketId id : ids) ASSERT_TRUE(o.bind(id, "prefill").is_ok());
    EXPECT_EQ(o.tickets_in(TicketState::kCreated), 0u);
    EXPECT_EQ(o.tickets_in(TicketState::kBound), n);
    for (std::uint32_t r = 0; r < c.producer.ranks(); ++r) {
      EXPECT_EQ(prod.workers[r]->pool().free_pages(), kPool - rank_pages(c.producer, r, c.tokens)) << "rank " << r;
    }
    EXPECT_EQ(cons.free_pages(), std::vector<std::uint32_t>(c.consumer.ranks(), kPool))
        << "destination pages are taken only at start";

    for (std::size_t i = 0; i < n; ++i) {
      auto t = o.ticket(ids[i]);
      ASSERT_TRUE(t.has_value());
      auto bytes = fill(prod, *t, salt(i));
      ASSERT_TRUE(bytes.has_value()) << bytes.error().to_string();
      EXPECT_EQ(*bytes, kv_bytes(c.producer, c.tokens[i]));
      ASSERT_TRUE(o.generated(ids[i]).is_ok());
    }
    EXPECT_EQ(o.tickets_in(TicketState::kGenerated), n);
    for (TicketId id : ids) {
      auto t = o.ticket(id);
      ASSERT_TRUE(t.has_value());
      for (const auto& row : t->sources) {
        for (std::uint32_t r = 0; r < row.size(); ++r) EXPECT_EQ(row[r].address, prod.engines[r]->address());
      }
    }

    for (TicketId id : ids) ASSERT_TRUE(o.start(id).is_ok());
    // Completions are taken only by receive()/progress(): until then every
    // destination page counts as reserved, whatever the engines did.
    EXPECT_EQ(o.tickets_in(TicketState::kLoading), n);
    auto pc = o.pages("decode");
    ASSERT_TRUE(pc.has_value());
    EXPECT_EQ(pc->reserved, all_dest);
    EXPECT_EQ(pc->in_use, 0u);
    EXPECT_EQ(pc->retained, 0u);
    EXPECT_EQ(gauge("reserved"), all_dest);
    for (std::uint32_t r = 0; r < c.consumer.ranks(); ++r) {
      EXPECT_EQ(cons.workers[r]->pool().free_pages(), kPool - rank_pages(c.consumer, r, c.tokens)) << "rank " << r;
    }
    EXPECT_EQ(o.ticket(ids[0])->loads_pending, loads_per_ticket);

    for (TicketId id : ids) {
      auto s = o.receive(id, 5 * kSecond);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    EXPECT_EQ(o.tickets_in(TicketState::kCompleted), n);
    EXPECT_EQ(o.tickets_in(TicketState::kLoading), 0u);
    pc = o.pages("decode");
    EXPECT_EQ(pc->reserved, 0u);
    EXPECT_EQ(pc->in_use, all_dest);
    EXPECT_EQ(gauge("in_use"), all_dest);
    EXPECT_EQ(prod.free_pages(), std::vector<std::uint32_t>(c.producer.ranks(), kPool))
        << "a completed ticket's source pages go back";

    std::uint64_t in_use = all_dest;
    for (std::size_t i = 0; i < n; ++i) {
      auto t = o.ticket(ids[i]);
      ASSERT_TRUE(t.has_value());
      EXPECT_EQ(t->loads_pending, 0u);
      auto bytes = check(cons, *t, salt(i));
      ASSERT_TRUE(bytes.has_value()) << "request " << i << ": " << bytes.error().to_string();
      EXPECT_EQ(*bytes, kv_bytes(c.consumer, c.tokens[i])) << "every byte of request " << i << " was checked";
      std::uint64_t mine = 0;
      for (const auto& row : t->destination) {
        for (const auto& pages : row) mine += pages.size();
      }
      ASSERT_TRUE(o.finish(ids[i]).is_ok());
      in_use -= mine;
      EXPECT_EQ(o.pages("decode")->in_use, in_use);
    }
    EXPECT_EQ(o.tickets_in(TicketState::kReleased), n);
    EXPECT_EQ(counts(o), Counts(0, 0, 0));
    EXPECT_EQ(cons.free_pages(), std::vector<std::uint32_t>(c.consumer.ranks(), kPool));
    EXPECT_EQ(prod.free_pages(), std::vector<std::uint32_t>(c.producer.ranks(), kPool));
    EXPECT_EQ(gauge("reserved") + gauge("in_use") + gauge("retained"), 0u);
    EXPECT_EQ(metrics.counter("baton_handoff_tickets", {{"state", "released"}}), n);
    EXPECT_EQ(metrics.counter("baton_handoff_tickets", {{"state", "completed"}}), 0u);
    EXPECT_EQ(metrics.counter("baton_handoff_tickets_ended_total", {{"state", "completed"}}), (round + 1) * n)
        << "the counter keeps what the gauge forgets";

    std::uint64_t observed = 0;
    for (std::uint32_t r = 0; r < c.consumer.ranks(); ++r) {
      observed += metrics.histogram_count("baton_handoff_rank_load_seconds",
                                          {{"consumer", "decode"}, {"rank", std::to_string(r)}});
    }
    EXPECT_EQ(observed, (round + 1) * n * loads_per_ticket) << "one observation per row and rank";

    o.forget_released();
    EXPECT_EQ(o.tickets_in(TicketState::kReleased), 0u);
    EXPECT_EQ(metrics.counter("baton_handoff_tickets", {{"state", "released"}}), 0u) << "the gauge follows";
    EXPECT_EQ(o.ticket(ids[0]).error().code(), StatusCode::kNotFound);
  }
  const std::string text = metrics.text();
  EXPECT_TRUE(contains(text, "# TYPE baton_handoff_pages gauge")) << text;
  EXPECT_TRUE(contains(text, "# TYPE baton_handoff_tickets gauge")) << text;
  EXPECT_TRUE(contains(text, "# TYPE baton_handoff_rank_load_seconds histogram")) << text;
  EXPECT_TRUE(o.shutdown().is_ok());

  // In GPU memory every byte went through one CUDA copy on each GPU side:
  // the producer's into the message it answered, the consumer's out of its
  // bounce buffer.
  std::uint64_t moved = 0;
  for (std::uint32_t t : c.tokens) moved += 2 * kv_bytes(c.consumer, t);
  EXPECT_EQ(prod.gpu_copied(), c.producer_pages == Pages::kCallerGpu ? moved : 0);
  EXPECT_EQ(cons.gpu_copied(), c.consumer_pages == Pages::kCallerGpu ? moved : 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RealHandoff,
    ::testing::Values(
        RealCase{"tp2_to_tp2", vllm(2), vllm(2), {100, 37, 16}},
        RealCase{"tp2_to_tp1_heads_merged", vllm(2), vllm(1), {100, 37, 16}},
        RealCase{"tp2_to_tp1_sp2_token_split", vllm(2), vllm(1, 2), {100, 37, 16}},
        RealCase{"cfg2_tp2_to_tp2", vllm(2, 1, KvOrder::kHnd, 2), vllm(2, 1, KvOrder::kHnd, 2), {100, 37, 16}},
        RealCase{"cfg2_tp2_to_tp1_sp2", vllm(2, 1, KvOrder::kHnd, 2), vllm(1, 2, KvOrder::kHnd, 2), {100, 16}},
        RealCase{"nhd_tp2_to_hnd_tp1", vllm(2, 1, KvOrder::kNhd), vllm(1), {100, 37}},
        RealCase{"hnd_tp2_to_nhd_tp2", vllm(2), vllm(2, 1, KvOrder::kNhd), {100, 37}},
        // Pages in the caller's memory (create_over): a framework's KV cache.
        RealCase{"caller_host_tp2_to_tp1_sp2", vllm(2), vllm(1, 2), {100, 37, 16}, Pages::kCallerHost,
                 Pages::kCallerHost},
        RealCase{"gpu_tp2_to_gpu_tp2", vllm(2), vllm(2), {100, 37, 16}, Pages::kCallerGpu, Pages::kCallerGpu},
        RealCase{"gpu_cfg2_tp2_to_host_tp1_sp2", vllm(2, 1, KvOrder::kHnd, 2), vllm(1, 2, KvOrder::kHnd, 2),
                 {100, 16}, Pages::kCallerGpu, Pages::kEngine},
        RealCase{"host_tp1_to_gpu_tp2", vllm(1), vllm(2), {100, 37}, Pages::kEngine, Pages::kCallerGpu}),
    [](const ::testing::TestParamInfo<RealCase>& info) { return std::string(info.param.name); });

// Workers over the caller's memory take only what fits, and leave the
// region registered when they go; workers over their own memory take it
// with them.
// A producer rank whose engine is gone: its address takes TCP connections
// and never speaks (the kernel accepts, nobody reads), so a consumer
// worker's connect to it waits the whole handshake timeout.
class SilentProducer final : public ProducerRank {
 public:
  SilentProducer(std::string address, std::uint64_t page_bytes)
      : address_(std::move(address)), pool_(page_bytes, 32) {}
  std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  std::string address() const override { return address_; }
  engine::RegionHandle region() const override { return 1; }
  Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override { return pool_.allocate(pages); }
  Status free(std::span<const std::uint32_t> pages) override { return pool_.free(pages); }
  std::uint32_t free_pages() const { return pool_.free_pages(); }

 private:
  std::string address_;
  PagePool pool_;
};

// A listening socket on 127.0.0.1 that never accepts; closed with the object.
struct SilentListener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::string address;
  SilentListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  // Resets the connections it never accepted: a connect waiting on it ends.
  void close() {
    if (fd >= 0) ::close(std::exchange(fd, -1));
  }
  ~SilentListener() { close(); }
};

bool ready(std::future<Status>& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

// Real engines: a consumer worker connecting to a producer that is gone
// (until the handshake timeout, or here until the listener closes) holds
// up its own start() and nothing else.
TEST(RealHandoffDispatch, AConnectToAProducerThatIsGoneHoldsUpOnlyItsOwnStart) {
  SilentListener silent;
  ASSERT_FALSE(silent.address.empty()) << "no listening socket";
  const KvLayout layout = vllm(1);
  Producers prefill(layout);
  Consumers decode(layout);
  engine::EngineConfig config;
  config.ucx.handshake_timeout_ms = 60'000;  // the test ends the connect itself, below
  auto stranded_engine = engine::Engine::create(config);
  ASSERT_TRUE(stranded_engine.has_value()) << stranded_engine.error().to_string();
  auto stranded = ConsumerWorker::create(**stranded_engine, layout.page_bytes(), 32);
  ASSERT_TRUE(stranded.has_value()) << stranded.error().to_string();
  SilentProducer gone(silent.address, layout.page_bytes());

  Orchestrator o;
  ASSERT_TRUE(o.add_producer("prefill", layout, prefill.ranks<ProducerRank>()).is_ok());
  ASSERT_TRUE(o.add_producer("gone", layout, {&gone}).is_ok());
  ASSERT_TRUE(o.add_consumer("decode", layout, decode.ranks<ConsumerRank>()).is_ok());
  ASSERT_TRUE(o.add_consumer("stranded", layout, {stranded->get()}).is_ok());

  auto x = o.create_ticket({"x", "stranded", 64});
  ASSERT_TRUE(x.has_value());
  ASSERT_TRUE(o.bind(*x, "gone").is_ok());
  ASSERT_TRUE(o.generated(*x).is_ok());
  auto started = std::async(std::launch::async, [&o, id = *x] { return o.start(id); });
  ASSERT_TRUE(eventually([&] { return o.ticket(*x)->state == TicketState::kLoading; }));

  // The live pair's ticket, from creation to its checked bytes, meanwhile.
  auto y = o.create_ticket({"y", "decode", 64});
  ASSERT_TRUE(y.has_value());
  ASSERT_TRUE(o.bind(*y, "prefill").is_ok());
  auto written = fill(prefill, *o.ticket(*y), 7);
  ASSERT_TRUE(written.has_value()) << written.error().to_string();
  ASSERT_TRUE(o.generated(*y).is_ok());
  ASSERT_TRUE(o.start(*y).is_ok());
  auto s = o.receive(*y, 10 * kSecond);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  auto checked = check(decode, *o.ticket(*y), 7);
  ASSERT_TRUE(checked.has_value()) << checked.error().to_string();
  EXPECT_EQ(*checked, *written);
  EXPECT_TRUE(o.finish(*y).is_ok());
  EXPECT_EQ(o.receive(*x, 20 * kMs).code(), StatusCode::kTimeout);
  EXPECT_FALSE(ready(started)) << "the live ticket and the stranded one's timeout waited for the connect";

  silent.close();
  ASSERT_EQ(started.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  s = started.get();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  // The failed connect is the load's completion: the retained pages return.
  ASSERT_TRUE(eventually(
      [&] {
        o.progress();
        return o.ticket(*x)->state == TicketState::kReleased;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(o.ticket(*x)->status.code(), StatusCode::kTimeout);
  EXPECT_EQ(counts(o, "stranded"), Counts(0, 0, 0));
  EXPECT_EQ((*stranded)->pool().free_pages(), 32u);
  EXPECT_EQ(gone.free_pages(), 32u);
  EXPECT_EQ(decode.free_pages(), std::vector<std::uint32_t>(1, Consumers::kPool));
}

TEST(WorkerMemory, CreateOverTheCallersRegionChecksItAndLeavesItRegistered) {
  auto e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<std::byte> memory(10 * 4096 + 100);
  auto region = e->register_memory(memory.data(), memory.size());
  ASSERT_TRUE(region.has_value());
  auto code = [](const auto& w) { return w ? StatusCode::kOk : w.error().code(); };
  EXPECT_EQ(code(ConsumerWorker::create_over(*e, region->handle, 4096, 11)), StatusCode::kInvalidArgument)
      << "11 pages in 10.02 pages' bytes";
  EXPECT_EQ(code(ProducerWorker::create_over(*e, region->handle, 4096, 11)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ConsumerWorker::create_over(*e, region->handle, 4096, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ProducerWorker::create_over(*e, region->handle, 0, 10)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ConsumerWorker::create_over(*e, region->handle, std::uint64_t{1} << 62, 8)),
            StatusCode::kInvalidArgument)
      << "a pool whose size overflows";
  EXPECT_EQ(code(ProducerWorker::create(*e, std::uint64_t{1} << 62, 8)), StatusCode::kInvalidArgument);
  // 100 Mi one-byte pages: 100 MiB of memory, but ~5 GB of bookkeeping
  // (bad_alloc, an abort, before the bound).
  EXPECT_EQ(code(ConsumerWorker::create(*e, 1, 100u << 20)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ProducerWorker::create(*e, 1, PagePool::kMaxPages + 1)), StatusCode::kInvalidArgument);
  auto unknown = ProducerWorker::create_over(*e, region->handle + 1000, 4096, 1);
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(unknown.error().message(), "ProducerWorker::create_over")) << unknown.error().message();
  EXPECT_EQ(code(ProducerWorker::create_over(*e, region->handle, 4096, 10, {""})), StatusCode::kInvalidArgument)
      << "an empty peer name";

  {
    auto producer = ProducerWorker::create_over(*e, region->handle, 4096, 10);
    ASSERT_TRUE(producer.has_value()) << producer.error().to_string();
    EXPECT_EQ((*producer)->region(), region->handle);
    EXPECT_EQ((*producer)->page(9).data(), memory.data() + 9 * 4096);
    EXPECT_TRUE((*producer)->page(10).empty());
    auto consumer = ConsumerWorker::create_over(*e, region->handle, 4096, 10);
    ASSERT_TRUE(consumer.has_value()) << consumer.error().to_string();
    EXPECT_EQ((*consumer)->pool_pages(), 10u);
  }
  EXPECT_TRUE(e->region(region->handle).has_value()) << "the caller's region outlives its workers";
  EXPECT_TRUE(e->unregister(region->handle).is_ok());

  engine::RegionHandle owned = 0;
  {
    auto producer = ProducerWorker::create(*e, 4096, 4);
    ASSERT_TRUE(producer.has_value());
    owned = (*producer)->region();
    EXPECT_TRUE(e->region(owned).has_value());
  }
  EXPECT_EQ(e->region(owned).error().code(), StatusCode::kNotFound) << "a worker's own memory goes with it";
}

// The real worker refuses orders that do not fit its layouts or pool before
// it starts anything.
TEST(ConsumerWorkerLoad, RefusesOrdersThatDoNotFitAndStartsNothing) {
  auto e = make_engine();
  ASSERT_NE(e, nullptr);
  const KvLayout l = vllm(2);
  EXPECT_EQ(ConsumerWorker::create(*e, 0, 16).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ConsumerWorker::create(*e, l.page_bytes(), 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ProducerWorker::create(*e, 0, 16).error().code(), StatusCode::kInvalidArgument);
  auto w = ConsumerWorker::create(*e, l.page_bytes(), 16);
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  ConsumerWorker& worker = **w;
  auto mine = worker.allocate(7);  // 100 tokens: 7 pages on each tp rank
  ASSERT_TRUE(mine.has_value());
  std::vector<std::uint32_t> seven = {0, 1, 2, 3, 4, 5, 6};
  const LoadOrder good{.ticket = 1, .row = 0, .tokens = 100, .producer = l, .consumer = l, .rank = 0,
                       .sources = {SourcePages{"127.0.0.1:1", 7, seven}, SourcePages{"127.0.0.1:1", 8, seven}},
                       .pages = *mine, .timeout_ns = kSecond};
  // Same layouts: one run per page, and neighbouring pages merge.
  auto batch = worker.batch_for(good);
  ASSERT_TRUE(batch.has_value()) << batch.error().to_string();
  ASSERT_EQ(batch->requests.size(), 1u);
  EXPECT_EQ(batch->requests[0].length, 7 * l.page_bytes());

  auto code = [&](auto edit) {
    LoadOrder o = good;
    edit(o);
    return worker.load(o).code();
  };
  EXPECT_EQ(code([](LoadOrder& o) { o.rank = 2; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.row = 1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.sources.pop_back(); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.sources[1].pages.pop_back(); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.pages.pop_back(); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.consumer = vllm(1); }), StatusCode::kInvalidArgument)
      << "a tp=1 page is twice the pool's";
  EXPECT_EQ(code([](LoadOrder& o) { o.producer.layers = 3; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](LoadOrder& o) { o.pages.back() = 16; }), StatusCode::kOutOfRange);
  EXPECT_EQ(code([](LoadOrder& o) { o.pages.back() = 9; }), StatusCode::kFailedPrecondition) << "not allocated";
  EXPECT_TRUE(worker.take_completions().empty()) << "a refused order started nothing";
  EXPECT_EQ(worker.pool().free_pages(), 9u);
  // Checked before a plan is made: a refused order leaves none behind (each
  // refused order of a new layout pair cached a plan, 130 MB apiece).
  {
    auto fresh = ConsumerWorker::create(*e, l.page_bytes(), 16);
    ASSERT_TRUE(fresh.has_value());
    LoadOrder refused = good;
    refused.sources.clear();
    EXPECT_EQ((*fresh)->load(refused).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*fresh)->plans().size(), 0u);
  }
  // More engine requests than a load may take: refused before any is made.
  {
    // 1-byte heads, HND to NHD: 32 x 2 x 64 x 128 cells, 524 225 pieces a page
    // (where one K|V block ends the next begins: 63 merge), 9 pages.
    const KvLayout fine{.layers = 32, .kv_heads = 64, .head_bytes = 1, .page_tokens = 128, .order = KvOrder::kHnd};
    KvLayout fine_nhd = fine;
    fine_nhd.order = KvOrder::kNhd;
    auto big = ConsumerWorker::create(*e, fine.page_bytes(), 16, PageTable::kCaller);
    ASSERT_TRUE(big.has_value());
    std::vector<std::uint32_t> nine = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    const LoadOrder many{.ticket = 2, .row = 0, .tokens = 9 * 128, .producer = fine, .consumer = fine_nhd, .rank = 0,
                         .sources = {SourcePages{"127.0.0.1:1", 7, nine}}, .pages = nine, .timeout_ns = kSecond};
    const auto refused = (*big)->batch_for(many);
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message().find("would be 4718025 engine requests (at most 4194304)"), std::string::npos)
        << refused.error().message();
  }

  // With sp = 2 a one-page request leaves sp group 0 nothing to load: its
  // order completes at once, ok, without reaching the producer.
  LoadOrder none = good;
  none.tokens = 16;
  none.consumer = vllm(2, 2);
  none.sources = {SourcePages{"127.0.0.1:1", 7, {0}}, SourcePages{"127.0.0.1:1", 8, {0}}};
  none.pages.clear();
  ASSERT_TRUE(worker.load(none).is_ok());
  auto done = worker.take_completions();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.is_ok()) << done[0].status.to_string();
  EXPECT_EQ(done[0].ticket, 1u);
}

// ---------------------------------------------------------------------------
// Fake ranks.

// 1 layer, 2 kv heads of 4 bytes, 4-token pages: 8 tokens are 2 pages per
// rank and row.
KvLayout tiny(std::uint32_t tp = 2, std::uint32_t cfg = 1) {
  return KvLayout{.layers = 1, .kv_heads = 2, .head_bytes = 4, .page_tokens = 4, .tp = tp, .cfg = cfg};
}
constexpr std::uint32_t kTokens = 8;
constexpr std::uint32_t kConsumerPool = 16;
constexpr std::uint32_t kProducerPool = 32;

class FakeProducer final : public ProducerRank {
 public:
  FakeProducer(std::uint32_t index, std::uint64_t page_bytes) : index_(index), pool_(page_bytes, kProducerPool) {}
  std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  std::string address() const override { return "fake-producer-" + std::to_string(index_); }
  engine::RegionHandle region() const override { return 100 + index_; }
  Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override {
    std::lock_guard lock(mutex_);
    if (allocate_error_) return std::unexpected(*allocate_error_);
    if (allocate_answer_) return *allocate_answer_;  // bypasses the pool
    return pool_.allocate(pages);
  }
  Status free(std::span<const std::uint32_t> pages) override {
    std::lock_guard lock(mutex_);
    ++free_calls_;
    return pool_.free(pages);
  }

  void fail_allocate(std::optional<Status> s) {
    std::lock_guard lock(mutex_);
    allocate_error_ = std::move(s);
  }
  void answer_allocate(std::optional<std::vector<std::uint32_t>> pages) {
    std::lock_guard lock(mutex_);
    allocate_answer_ = std::move(pages);
  }
  int free_calls() const {
    std::lock_guard lock(mutex_);
    return free_calls_;
  }
  std::uint32_t free_pages() const { return pool_.free_pages(); }

 private:
  const std::uint32_t index_;
  PagePool pool_;
  mutable std::mutex mutex_;
  std::optional<Status> allocate_error_;
  std::optional<std::vector<std::uint32_t>> allocate_answer_;
  int free_calls_ = 0;
};

// Records every order; completes one only when the test says (complete()),
// or reports anything the test wants (report()).
class FakeConsumer final : public ConsumerRank {
 public:
  explicit FakeConsumer(std::uint64_t page_bytes) : pool_(page_bytes, kConsumerPool) {}
  std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  std::uint32_t pool_pages() const override { return pool_.pages(); }
  Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override {
    std::lock_guard lock(mutex_);
    if (allocate_error_) return std::unexpected(*allocate_error_);
    if (allocate_answer_) return *allocate_answer_;  // bypasses the pool
    return pool_.allocate(pages);
  }
  Status free(std::span<const std::uint32_t> pages) override {
    std::lock_guard lock(mutex_);
    ++free_calls_;
    if (free_error_) return *free_error_;
    return pool_.free(pages);
  }
  Status load(const LoadOrder& order) override {
    std::unique_lock lock(mutex_);
    ++loads_inside_;
    gate_.wait(lock, [&] { return !holding_; });  // a rank slow to take its load
    --loads_inside_;
    if (load_throws_) throw std::runtime_error("std::bad_alloc, say");
    if (load_error_) return *load_error_;
    orders_.push_back(order);
    return Status::ok();
  }
  std::vector<LoadCompletion> take_completions() override {
    std::lock_guard lock(mutex_);
    ++take_calls_;
    return std::exchange(ready_, {});
  }

  // The completion of the load of (ticket, row), for the next take.
  void complete(TicketId ticket, std::uint32_t row, Status status = {}) {
    std::lock_guard lock(mutex_);
    for (const LoadOrder& o : orders_) {
      if (o.ticket == ticket && o.row == row) {
        ready_.push_back({ticket, row, o.rank, std::move(status)});
        return;
      }
    }
    ADD_FAILURE() << "no load of ticket " << ticket << " row " << row << " was given";
  }
  // Every row of the ticket given.
  void complete_all(TicketId ticket, Status status = {}) {
    std::vector<std::uint32_t> rows;
    {
      std::lock_guard lock(mutex_);
      for (const LoadOrder& o : orders_) {
        if (o.ticket == ticket) rows.push_back(o.row);
      }
    }
    for (std::uint32_t row : rows) complete(ticket, row, status);
  }
  void report(LoadCompletion c) {
    std::lock_guard lock(mutex_);
    ready_.push_back(std::move(c));
  }

  void fail_allocate(std::optional<Status> s) {
    std::lock_guard lock(mutex_);
    allocate_error_ = std::move(s);
  }
  void answer_allocate(std::optional<std::vector<std::uint32_t>> pages) {
    std::lock_guard lock(mutex_);
    allocate_answer_ = std::move(pages);
  }
  void fail_free(std::optional<Status> s) {
    std::lock_guard lock(mutex_);
    free_error_ = std::move(s);
  }
  void fail_load(std::optional<Status> s) {
    std::lock_guard lock(mutex_);
    load_error_ = std::move(s);
  }
  void throw_on_load() {
    std::lock_guard lock(mutex_);
    load_throws_ = true;
  }
  // While held, load() waits inside (as an RPC to a frozen worker would).
  void hold_loads(bool on) {
    {
      std::lock_guard lock(mutex_);
      holding_ = on;
    }
    gate_.notify_all();
  }
  int loads_inside() const {
    std::lock_guard lock(mutex_);
    return loads_inside_;
  }
  std::vector<LoadOrder> orders() const {
    std::lock_guard lock(mutex_);
    return orders_;
  }
  std::size_t order_count() const { return orders().size(); }
  int take_calls() const {
    std::lock_guard lock(mutex_);
    return take_calls_;
  }
  int free_calls() const {
    std::lock_guard lock(mutex_);
    return free_calls_;
  }
  std::uint32_t free_pages() const { return pool_.free_pages(); }

 private:
  PagePool pool_;
  mutable std::mutex mutex_;
  std::vector<LoadOrder> orders_;
  std::vector<LoadCompletion> ready_;
  std::optional<Status> allocate_error_, free_error_, load_error_;
  std::optional<std::vector<std::uint32_t>> allocate_answer_;
  int take_calls_ = 0;
  int free_calls_ = 0;
  std::condition_variable gate_;
  bool holding_ = false;
  bool load_throws_ = false;
  int loads_inside_ = 0;
};

// A producer replica "prefill" and a consumer replica "decode" of fake ranks
// over one layout, registered with an orchestrator.
struct Fakes {
  KvLayout layout;
  std::vector<std::unique_ptr<FakeProducer>> producers;
  std::vector<std::unique_ptr<FakeConsumer>> consumers;

  explicit Fakes(KvLayout l) : layout(l) {
    for (std::uint32_t r = 0; r < l.ranks(); ++r) {
      producers.push_back(std::make_unique<FakeProducer>(r, l.page_bytes()));
      consumers.push_back(std::make_unique<FakeConsumer>(l.page_bytes()));
    }
  }
  std::vector<ProducerRank*> producer_ranks() const {
    std::vector<ProducerRank*> out;
    for (const auto& p : producers) out.push_back(p.get());
    return out;
  }
  std::vector<ConsumerRank*> consumer_ranks() const {
    std::vector<ConsumerRank*> out;
    for (const auto& c : consumers) out.push_back(c.get());
    return out;
  }
  Status add_to(Orchestrator& o, const std::string& consumer = "decode") const {
    if (auto s = o.add_producer("prefill", layout, producer_ranks()); !s.is_ok()) return s;
    return o.add_consumer(consumer, layout, consumer_ranks());
  }
  FakeConsumer& rank(std::uint32_t r) { return *consumers[r]; }
  void complete_all(TicketId id, Status s = {}) {
    for (auto& c : consumers) c->complete_all(id, s);
  }
  std::vector<std::uint32_t> consumer_free() const {
    std::vector<std::uint32_t> out;
    for (const auto& c : consumers) out.push_back(c->free_pages());
    return out;
  }
  std::vector<std::uint32_t> producer_free() const {
    std::vector<std::uint32_t> out;
    for (const auto& p : producers) out.push_back(p->free_pages());
    return out;
  }
  std::vector<std::uint32_t> full_consumers() const {
    return std::vector<std::uint32_t>(consumers.size(), kConsumerPool);
  }
  std::vector<std::uint32_t> full_producers() const {
    return std::vector<std::uint32_t>(producers.size(), kProducerPool);
  }
  std::size_t orders() const {
    std::size_t n = 0;
    for (const auto& c : consumers) n += c->order_count();
    return n;
  }
  int consumer_frees() const {
    int n = 0;
    for (const auto& c : consumers) n += c->free_calls();
    return n;
  }
};

// A ticket created, bound and generated (ready to start).
TicketId generated_ticket(Orchestrator& o, const std::string& request, const std::string& consumer = "decode",
                          std::uint32_t tokens = kTokens) {
  auto id = o.create_ticket({request, consumer, tokens});
  EXPECT_TRUE(id.has_value()) << id.error().to_string();
  if (!id) return 0;
  auto b = o.bind(*id, "prefill");
  EXPECT_TRUE(b.is_ok()) << b.to_string();
  auto g = o.generated(*id);
  EXPECT_TRUE(g.is_ok()) << g.to_string();
  return *id;
}

TicketState state(const Orchestrator& o, TicketId id) {
  auto t = o.ticket(id);
  EXPECT_TRUE(t.has_value());
  return t ? t->state : TicketState::kReleased;
}

// 1. All or none across consumer ranks, and nothing dispatched before it is
// all.
TEST(HandoffFailure, AnAllocateFailureOnOneRankIsRolledBackOnTheOthersBeforeAnyLoad) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  f.rank(1).fail_allocate(Status::resource_exhausted("rank 1 is full"));
  auto s = o.start(id);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "rank 1 is full")) << s.message();
  EXPECT_EQ(f.orders(), 0u) << "nothing dispatched";
  EXPECT_EQ(f.consumer_free(), f.full_consumers()) << "rank 0's pages were rolled back";
  EXPECT_EQ(f.rank(0).free_calls(), 1);
  EXPECT_EQ(state(o, id), TicketState::kGenerated);
  EXPECT_EQ(o.tickets_in(TicketState::kGenerated), 1u);
  EXPECT_EQ(counts(o), Counts(0, 0, 0));
  EXPECT_TRUE(o.consumer_status("decode").is_ok()) << "a full rank does not stop the replica";

  // Room again: the same ticket starts and completes.
  f.rank(1).fail_allocate(std::nullopt);
  ASSERT_TRUE(o.start(id).is_ok());
  EXPECT_EQ(f.orders(), 2u);
  EXPECT_EQ(o.pages("decode")->reserved, 4u);
  f.complete_all(id);
  ASSERT_TRUE(o.receive(id, kSecond).is_ok());
  ASSERT_TRUE(o.finish(id).is_ok());
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

// The same all-or-none on the producer side: the ticket stays created.
TEST(HandoffFailure, AProducerRankWithTooFewPagesLeavesTheTicketCreated) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  auto id = o.create_ticket({"r", "decode", kTokens});
  ASSERT_TRUE(id.has_value());
  f.producers[1]->fail_allocate(Status::resource_exhausted("no room"));
  EXPECT_EQ(o.bind(*id, "prefill").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.producer_free(), f.full_producers()) << "rank 0's source pages were rolled back";
  EXPECT_EQ(state(o, *id), TicketState::kCreated);
  f.producers[1]->fail_allocate(std::nullopt);
  EXPECT_TRUE(o.bind(*id, "prefill").is_ok());
  EXPECT_EQ(f.producer_free(), std::vector<std::uint32_t>(2, kProducerPool - 2));
}

// A producer rank that names a page twice is not trusted with a ticket:
// the bind is rolled back and the producer marked failed.
TEST(HandoffFailure, AProducerRankAnsweringAPageTwiceFailsTheProducer) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  auto id = o.create_ticket({"r", "decode", kTokens});
  ASSERT_TRUE(id.has_value());
  f.producers[1]->answer_allocate(std::vector<std::uint32_t>{3, 3});
  EXPECT_EQ(o.bind(*id, "prefill").code(), StatusCode::kInternal);
  EXPECT_EQ(f.producer_free(), f.full_producers()) << "rank 0's source pages were rolled back";
  EXPECT_EQ(state(o, *id), TicketState::kCreated);
  auto again = o.bind(*id, "prefill");
  EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again.to_string();
  EXPECT_TRUE(contains(again.message(), "some twice")) << again.message();
}

// 2. A receive that gives up ends the ticket for the caller only: the pages
// stay out of the pools until the loads that may still write them settle.
TEST(HandoffFailure, AReceiveTimeoutRetainsThePagesUntilTheLateCompletionsArrive) {
  Fakes f(tiny());
  Orchestrator o(HandoffConfig{.transfer_timeout_ns = 20 * kMs});
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  f.rank(0).complete(id, 0);  // one rank in time, the other late

  auto s = o.receive(id);  // the configured timeout
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  auto t = o.ticket(id);
  EXPECT_EQ(t->state, TicketState::kTimedOut);
  EXPECT_EQ(t->status.code(), StatusCode::kTimeout);
  EXPECT_EQ(t->loads_pending, 1u);
  EXPECT_EQ(counts(o), Counts(0, 0, 4));
  EXPECT_EQ(f.consumer_free(), std::vector<std::uint32_t>(2, kConsumerPool - 2)) << "retained, not freed";
  EXPECT_EQ(f.consumer_frees(), 0);
  EXPECT_EQ(f.producer_free(), std::vector<std::uint32_t>(2, kProducerPool - 2)) << "a late load still reads them";
  EXPECT_EQ(o.receive(id).code(), StatusCode::kTimeout) << "an ended ticket answers why";
  EXPECT_EQ(o.tickets_in(TicketState::kTimedOut), 1u);

  const int polls = f.rank(1).take_calls();
  o.progress();
  EXPECT_EQ(f.rank(1).take_calls(), polls + 1) << "a retained ticket's completions are still owed";
  EXPECT_EQ(state(o, id), TicketState::kTimedOut);

  f.rank(1).complete(id, 0);
  o.progress();
  t = o.ticket(id);
  EXPECT_EQ(t->state, TicketState::kReleased);
  EXPECT_EQ(t->status.code(), StatusCode::kTimeout) << "it still says why it ended";
  EXPECT_EQ(counts(o), Counts(0, 0, 0));
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(o.tickets_in(TicketState::kTimedOut), 0u);
  EXPECT_EQ(o.tickets_in(TicketState::kReleased), 1u);
}

TEST(HandoffFailure, ProgressPollsTheRanksOnlyWhileLoadsAreOwed) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  auto polls = [&] { return f.rank(0).take_calls() + f.rank(1).take_calls(); };
  o.progress();
  EXPECT_EQ(polls(), 0) << "no ticket";
  const TicketId id = generated_ticket(o, "r");
  o.progress();
  EXPECT_EQ(polls(), 0) << "a generated ticket owes no completion";
  ASSERT_TRUE(o.start(id).is_ok());
  o.progress();
  EXPECT_EQ(polls(), 2) << "one take per rank while loads are pending";
  f.complete_all(id);
  o.progress();
  EXPECT_EQ(polls(), 4);
  EXPECT_EQ(state(o, id), TicketState::kCompleted);
  o.progress();
  o.progress();
  EXPECT_EQ(polls(), 4) << "a completed ticket owes nothing";
  ASSERT_TRUE(o.finish(id).is_ok());
  o.progress();
  EXPECT_EQ(polls(), 4);
}

// 3. Cancel does not interrupt loads: the pages stay retained until every
// row on every rank settled.
TEST(HandoffFailure, CancelOfALoadingTicketRetainsItsPagesUntilEveryRowOnEveryRankCompleted) {
  Fakes f(tiny(2, /*cfg=*/2));
  engine::MetricsRegistry metrics;
  Orchestrator o(HandoffConfig{.metrics = &metrics});
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  ASSERT_EQ(f.orders(), 4u) << "2 rows × 2 ranks";
  EXPECT_EQ(o.pages("decode")->reserved, 8u);

  auto s = o.cancel(id);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(state(o, id), TicketState::kCancelled);
  EXPECT_EQ(o.receive(id).code(), StatusCode::kCancelled);
  EXPECT_EQ(o.cancel(id).code(), StatusCode::kInvalidArgument) << "it ended already";
  EXPECT_EQ(metrics.counter("baton_handoff_pages", {{"consumer", "decode"}, {"owner", "retained"}}), 8u);

  const std::pair<std::uint32_t, std::uint32_t> order[] = {{1, 1}, {0, 0}, {0, 1}, {1, 0}};  // (rank, row)
  for (std::size_t i = 0; i < 4; ++i) {
    f.rank(order[i].first).complete(id, order[i].second);
    o.progress();
    auto t = o.ticket(id);
    if (i < 3) {
      EXPECT_EQ(t->state, TicketState::kCancelled) << i;
      EXPECT_EQ(t->loads_pending, 3 - i);
      EXPECT_EQ(counts(o), Counts(0, 0, 8)) << i;
      EXPECT_EQ(f.consumer_free(), std::vector<std::uint32_t>(2, kConsumerPool - 4)) << i;
      EXPECT_EQ(f.producer_free(), std::vector<std::uint32_t>(2, kProducerPool - 4)) << i;
      EXPECT_EQ(f.consumer_frees(), 0);
    } else {
      EXPECT_EQ(t->state, TicketState::kReleased);
      EXPECT_EQ(t->status.code(), StatusCode::kCancelled);
    }
  }
  EXPECT_EQ(counts(o), Counts(0, 0, 0));
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(o.tickets_in(TicketState::kCancelled), 0u);
  EXPECT_EQ(metrics.counter("baton_handoff_tickets", {{"state", "released"}}), 1u);
  EXPECT_EQ(metrics.counter("baton_handoff_pages", {{"consumer", "decode"}, {"owner", "retained"}}), 0u);
  EXPECT_EQ(metrics.counter("baton_handoff_tickets_ended_total", {{"state", "cancelled"}}), 1u);
}

// Cancel before loading returns the source pages at once.
TEST(HandoffFailure, CancelBeforeStartReturnsTheSourcePagesAtOnce) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  EXPECT_EQ(f.producer_free(), std::vector<std::uint32_t>(2, kProducerPool - 2));
  ASSERT_TRUE(o.cancel(id).is_ok());
  EXPECT_EQ(state(o, id), TicketState::kReleased) << "nothing in flight, nothing to retain";
  EXPECT_EQ(o.ticket(id)->status.code(), StatusCode::kCancelled);
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(o.start(id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.orders(), 0u);
}

// A load that fails ends the ticket failed with its error; the other ranks'
// loads keep the pages retained until they settle.
TEST(HandoffFailure, AFailedLoadFailsTheTicketAndItsPagesWaitForTheOtherLoads) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId a = generated_ticket(o, "a");
  ASSERT_TRUE(o.start(a).is_ok());
  f.rank(1).complete(a, 0, Status::unavailable("producer unreachable"));
  auto s = o.receive(a, kSecond);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "producer unreachable")) << s.message();
  EXPECT_EQ(state(o, a), TicketState::kFailed);
  EXPECT_EQ(counts(o), Counts(0, 0, 4));
  f.rank(0).complete(a, 0);
  o.progress();
  EXPECT_EQ(state(o, a), TicketState::kReleased);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());

  // A rank refusing the order at dispatch (nothing started there) is the
  // same failure, reported by start's ticket rather than start itself; the
  // ranks after it are not given theirs, so nothing is in flight and every
  // page returns at once.
  const TicketId b = generated_ticket(o, "b");
  const std::size_t orders_before = f.orders();
  f.rank(0).fail_load(Status::invalid_argument("bad order"));
  ASSERT_TRUE(o.start(b).is_ok());
  EXPECT_EQ(f.orders(), orders_before) << "rank 0 refused (not recorded); rank 1 was not dispatched";
  EXPECT_EQ(o.ticket(b)->loads_pending, 0u);
  EXPECT_EQ(state(o, b), TicketState::kReleased);
  EXPECT_EQ(o.ticket(b)->status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.receive(b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

// 4. A rank that never completes pins only its ticket's pages.
TEST(HandoffFailure, AStuckRankHoldsOnlyItsTicketsPagesAndOthersUseTheRest) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId stuck = generated_ticket(o, "stuck");
  ASSERT_TRUE(o.start(stuck).is_ok());
  f.rank(1).complete(stuck, 0);  // rank 0 never will

  const TicketId fine = generated_ticket(o, "fine");
  ASSERT_TRUE(o.start(fine).is_ok());
  f.complete_all(fine);
  ASSERT_TRUE(o.receive(fine, kSecond).is_ok());
  EXPECT_EQ(counts(o), Counts(4, 4, 0));
  ASSERT_TRUE(o.finish(fine).is_ok());
  EXPECT_EQ(counts(o), Counts(4, 0, 0));
  EXPECT_EQ(state(o, stuck), TicketState::kLoading);

  EXPECT_EQ(o.receive(stuck, 10 * kMs).code(), StatusCode::kTimeout);
  EXPECT_EQ(counts(o), Counts(0, 0, 4));

  // The rest of each 16-page pool: 7 more tickets of 2 pages a rank.
  std::vector<TicketId> more;
  for (int i = 0; i < 7; ++i) {
    more.push_back(generated_ticket(o, "more-" + std::to_string(i)));
    ASSERT_TRUE(o.start(more.back()).is_ok()) << i;
  }
  EXPECT_EQ(f.consumer_free(), std::vector<std::uint32_t>(2, 0u));
  const std::size_t orders = f.orders();
  const TicketId over = generated_ticket(o, "over");
  EXPECT_EQ(o.start(over).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(f.orders(), orders) << "nothing dispatched";
  EXPECT_EQ(state(o, over), TicketState::kGenerated);
  EXPECT_EQ(counts(o), Counts(28, 0, 4));
  EXPECT_TRUE(o.consumer_status("decode").is_ok());

  // The stuck load settles at last: everything comes back.
  f.rank(0).complete(stuck, 0);
  for (TicketId id : more) f.complete_all(id);
  o.progress();
  EXPECT_EQ(state(o, stuck), TicketState::kReleased);
  ASSERT_TRUE(o.start(over).is_ok()) << "room again";
  f.complete_all(over);
  for (TicketId id : more) ASSERT_TRUE(o.finish(id).is_ok());
  ASSERT_TRUE(o.receive(over, kSecond).is_ok());
  ASSERT_TRUE(o.finish(over).is_ok());
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(counts(o), Counts(0, 0, 0));
}

// 5. A rank that answers pages we cannot account for stops its replica.
struct BadAnswer {
  const char* name;
  std::vector<std::uint32_t> pages;  // rank 1's answer to allocate(2)
};

void PrintTo(const BadAnswer& a, std::ostream* os) { *os << a.name; }

class BadPages : public ::testing::TestWithParam<BadAnswer> {};

// Everything after the stop on that replica answers failed_precondition,
// with the reason.
void expect_stopped(Orchestrator& o, TicketId ticket, std::string_view reason) {
  auto why = o.consumer_status("decode");
  EXPECT_FALSE(why.is_ok());
  EXPECT_TRUE(contains(why.message(), reason)) << why.to_string();
  auto created = o.create_ticket({"later", "decode", kTokens});
  ASSERT_FALSE(created.has_value());
  EXPECT_EQ(created.error().code(), StatusCode::kFailedPrecondition);
  for (Status s : {o.start(ticket), o.receive(ticket, 10 * kMs), o.cancel(ticket), o.finish(ticket),
                   o.bind(ticket, "prefill"), o.generated(ticket)}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_TRUE(contains(s.message(), reason)) << s.to_string();
  }
  auto down = o.shutdown();
  EXPECT_EQ(down.code(), why.code()) << down.to_string();
  EXPECT_TRUE(contains(down.message(), why.message())) << down.to_string();
}

TEST_P(BadPages, StopTheReplicaAndFreeNothing) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  const TicketId other = generated_ticket(o, "other");
  f.rank(1).answer_allocate(GetParam().pages);
  auto s = o.start(id);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_EQ(o.consumer_status("decode").code(), StatusCode::kInternal);
  EXPECT_EQ(f.orders(), 0u);
  EXPECT_EQ(f.consumer_frees(), 0) << "no page is freed on a replica we cannot account for";
  EXPECT_EQ(f.rank(0).free_pages(), kConsumerPool - 2) << "rank 0's pages are left as they are";
  // Nothing was dispatched: the tickets fail and their producer's pages
  // come back (the producer is not the one that answered wrongly).
  EXPECT_EQ(state(o, id), TicketState::kReleased);
  EXPECT_EQ(state(o, other), TicketState::kReleased);
  EXPECT_EQ(f.producer_free(), f.full_producers());
  expect_stopped(o, other, "rank 1 answered");
  expect_stopped(o, id, "rank 1 answered");
  o.progress();
  EXPECT_EQ(f.rank(0).take_calls() + f.rank(1).take_calls(), 0);
  EXPECT_EQ(f.consumer_frees(), 0);
}

INSTANTIATE_TEST_SUITE_P(Answers, BadPages,
                         ::testing::Values(BadAnswer{"beyond_the_pool", {3, kConsumerPool}},
                                           BadAnswer{"duplicate", {3, 3}}, BadAnswer{"too_few", {3}},
                                           BadAnswer{"too_many", {3, 4, 5}}),
                         [](const ::testing::TestParamInfo<BadAnswer>& info) { return std::string(info.param.name); });

TEST(HandoffFailure, AFailedConsumerRankStopsItsReplicaOnly) {
  Fakes f(tiny()), g(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  ASSERT_TRUE(o.add_consumer("other", g.layout, g.consumer_ranks()).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  EXPECT_EQ(o.consumer_rank_failed("decode", 2, Status::unavailable("x")).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(o.consumer_rank_failed("nope", 0, Status::unavailable("x")).code(), StatusCode::kNotFound);
  ASSERT_TRUE(o.consumer_rank_failed("decode", 1, Status::unavailable("worker 1 died")).is_ok());
  EXPECT_EQ(o.consumer_status("decode").code(), StatusCode::kUnavailable);

  // Its completions are no longer taken: a remote may still write the pages.
  f.complete_all(id);
  const int polls = f.rank(0).take_calls() + f.rank(1).take_calls();
  o.progress();
  EXPECT_EQ(f.rank(0).take_calls() + f.rank(1).take_calls(), polls);
  EXPECT_EQ(state(o, id), TicketState::kLoading);
  EXPECT_EQ(o.pages("decode")->reserved, 4u);
  EXPECT_EQ(f.consumer_frees(), 0);
  expect_stopped(o, id, "worker 1 died");

  // The other replica goes on.
  const TicketId fine = generated_ticket(o, "fine", "other");
  ASSERT_TRUE(o.start(fine).is_ok());
  g.complete_all(fine);
  ASSERT_TRUE(o.receive(fine, kSecond).is_ok());
  ASSERT_TRUE(o.finish(fine).is_ok());
  EXPECT_EQ(g.consumer_free(), g.full_consumers());
  EXPECT_TRUE(o.consumer_status("other").is_ok());
}

// A consumer that stops with tickets not yet started (no destination
// page, no write in flight) fails them and returns their producers' source
// pages: they stayed held, every call on them was refused, and a healthy
// producer ran out of pages for the replicas that went on.
TEST(HandoffFailure, AStoppedConsumersTicketsNotYetStartedReturnTheirSourcePages) {
  Fakes f(tiny()), g(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  ASSERT_TRUE(o.add_consumer("other", g.layout, g.consumer_ranks()).is_ok());
  const TicketId bound = *o.create_ticket({"bound", "decode", kTokens});
  ASSERT_TRUE(o.bind(bound, "prefill").is_ok());
  const TicketId ready = generated_ticket(o, "ready");
  const TicketId created = *o.create_ticket({"created", "decode", kTokens});
  const TicketId loading = generated_ticket(o, "loading");
  ASSERT_TRUE(o.start(loading).is_ok());
  ASSERT_NE(f.producer_free(), f.full_producers());

  ASSERT_TRUE(o.consumer_rank_failed("decode", 0, Status::unavailable("worker 0 died")).is_ok());
  for (TicketId id : {bound, ready, created}) {
    auto t = o.ticket(id);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->state, TicketState::kReleased) << id;
    EXPECT_EQ(t->status.code(), StatusCode::kUnavailable) << id;
    EXPECT_NE(t->status.message().find("stopped before the load"), std::string::npos) << t->status.to_string();
  }
  // The loading ticket keeps what a remote may still touch, sources too.
  EXPECT_EQ(state(o, loading), TicketState::kLoading);
  EXPECT_EQ(o.pages("decode")->reserved, 4u);
  const auto held = f.producer_free();
  EXPECT_EQ(o.cancel(bound).code(), StatusCode::kFailedPrecondition);  // a stopped replica's ticket, as before

  // The producer serves the replica that goes on with what came back.
  const TicketId fine = generated_ticket(o, "fine", "other");
  ASSERT_TRUE(o.start(fine).is_ok());
  g.complete_all(fine);
  ASSERT_TRUE(o.receive(fine, kSecond).is_ok());
  ASSERT_TRUE(o.finish(fine).is_ok());
  EXPECT_EQ(f.producer_free(), held);
  EXPECT_EQ(o.tickets_in(TicketState::kReleased), 4u);
}

// Ticket ids start at a random point per orchestrator: a completion that a
// predecessor's load reports after a restart over the same ranks names no
// ticket of the new one (it stops the replica, as any unaccounted load
// does). From 1, the new ticket 1 took it and read ok before its own bytes.
TEST(HandoffFailure, ARestartedOrchestratorDoesNotTakeItsPredecessorsCompletions) {
  Fakes f(tiny());
  TicketId first = 0;
  {
    Orchestrator before;
    ASSERT_TRUE(f.add_to(before).is_ok());
    first = generated_ticket(before, "r");
    ASSERT_TRUE(before.start(first).is_ok());
  }
  Orchestrator after;
  ASSERT_TRUE(f.add_to(after).is_ok());
  const TicketId id = generated_ticket(after, "r");
  ASSERT_NE(id, first);
  EXPECT_GT(id, TicketId{1} << 32);
  EXPECT_LT(id, TicketId{1} << 52);  // exact as a JSON number anywhere
  ASSERT_TRUE(after.start(id).is_ok());
  f.complete_all(first);  // the predecessor's load lands now
  EXPECT_NE(after.receive(id, kSecond / 10).code(), StatusCode::kOk);
  EXPECT_NE(state(after, id), TicketState::kCompleted);
}

struct BogusCompletion {
  const char* name;
  // Given the started ticket: what rank 0 reports (twice for "twice").
  LoadCompletion (*make)(TicketId);
  int times;
};

void PrintTo(const BogusCompletion& b, std::ostream* os) { *os << b.name; }

class NeverGiven : public ::testing::TestWithParam<BogusCompletion> {};

TEST_P(NeverGiven, ACompletionForALoadNeverGivenStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  for (int i = 0; i < GetParam().times; ++i) f.rank(0).report(GetParam().make(id));
  o.progress();
  auto why = o.consumer_status("decode");
  EXPECT_EQ(why.code(), StatusCode::kInternal) << why.to_string();
  EXPECT_EQ(f.consumer_frees(), 0);
  EXPECT_EQ(f.consumer_free(), std::vector<std::uint32_t>(2, kConsumerPool - 2));
  EXPECT_EQ(state(o, id), TicketState::kLoading);
  expect_stopped(o, id, "was not given");
}

INSTANTIATE_TEST_SUITE_P(
    Completions, NeverGiven,
    ::testing::Values(
        BogusCompletion{"unknown_ticket", [](TicketId id) { return LoadCompletion{id + 100, 0, 0, {}}; }, 1},
        BogusCompletion{"unknown_row", [](TicketId id) { return LoadCompletion{id, 1, 0, {}}; }, 1},
        BogusCompletion{"another_ranks", [](TicketId id) { return LoadCompletion{id, 0, 1, {}}; }, 1},
        BogusCompletion{"twice", [](TicketId id) { return LoadCompletion{id, 0, 0, {}}; }, 2}),
    [](const ::testing::TestParamInfo<BogusCompletion>& info) { return std::string(info.param.name); });

TEST(HandoffFailure, ARollbackWhoseFreeFailsStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  f.rank(1).fail_allocate(Status::resource_exhausted("full"));
  f.rank(0).fail_free(Status::internal("free refused"));
  auto s = o.start(id);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_EQ(f.orders(), 0u);
  EXPECT_EQ(f.rank(0).free_pages(), kConsumerPool - 2) << "the refused pages stay out";
  expect_stopped(o, id, "free refused");
}

TEST(HandoffFailure, AFinishWhoseFreeFailsStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  f.complete_all(id);
  ASSERT_TRUE(o.receive(id, kSecond).is_ok());
  f.rank(1).fail_free(Status::internal("free refused"));
  EXPECT_EQ(o.finish(id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(o.consumer_status("decode").code(), StatusCode::kInternal);
  EXPECT_EQ(state(o, id), TicketState::kCompleted);
  expect_stopped(o, id, "free refused");
}

// 6. cancel() while receive() blocks is queued, not a second waiter.
struct ReceiveInFlight {
  std::future<Status> done;
  // Starts receive() on another thread and returns once it is polling.
  ReceiveInFlight(Orchestrator& o, FakeConsumer& rank, TicketId id, TimeNs timeout) {
    const int before = rank.take_calls();
    done = std::async(std::launch::async, [&o, id, timeout] { return o.receive(id, timeout); });
    EXPECT_TRUE(eventually([&] { return rank.take_calls() > before; })) << "receive never polled";
  }
  bool returned() { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  Status get() {
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "receive did not return";
      return Status::internal("receive did not return");
    }
    return done.get();
  }
};

TEST(HandoffCancelDuringReceive, WhenTheLoadCompletesReceiveAnswersCancelledAndThePagesGoBack) {
  Fakes f(tiny());
  engine::MetricsRegistry metrics;
  Orchestrator o(HandoffConfig{.metrics = &metrics});
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  ReceiveInFlight rx(o, f.rank(0), id, 5 * kSecond);
  EXPECT_EQ(o.receive(id, 10 * kMs).code(), StatusCode::kFailedPrecondition) << "one receive at a time";

  auto s = o.cancel(id);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_FALSE(rx.returned()) << "cancel did not interrupt the receive";
  EXPECT_EQ(state(o, id), TicketState::kLoading) << "queued until the receive returns";
  EXPECT_EQ(f.orders(), 2u);
  EXPECT_EQ(f.consumer_frees(), 0);

  f.complete_all(id);
  s = rx.get();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.to_string();
  auto t = o.ticket(id);
  EXPECT_EQ(t->state, TicketState::kReleased);
  EXPECT_EQ(t->status.code(), StatusCode::kCancelled);
  EXPECT_EQ(counts(o), Counts(0, 0, 0));
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(o.tickets_in(TicketState::kReleased), 1u);
  EXPECT_EQ(o.tickets_in(TicketState::kCancelled), 0u);
  EXPECT_EQ(o.tickets_in(TicketState::kCompleted), 0u);
  // One ticket, counted once: as it ended for the loads, completed (it was
  // counted cancelled as well).
  EXPECT_EQ(metrics.counter("baton_handoff_tickets_ended_total", {{"state", "completed"}}), 1u);
  EXPECT_EQ(metrics.counter("baton_handoff_tickets_ended_total", {{"state", "cancelled"}}), 0u);
}

TEST(HandoffCancelDuringReceive, WhenTheReceiveTimesOutTheTicketStaysTimedOut) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  ReceiveInFlight rx(o, f.rank(0), id, 300 * kMs);
  auto s = o.cancel(id);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  s = rx.get();
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_EQ(state(o, id), TicketState::kTimedOut);
  EXPECT_EQ(counts(o), Counts(0, 0, 4));
  EXPECT_EQ(f.consumer_frees(), 0);
  EXPECT_EQ(o.cancel(id).code(), StatusCode::kInvalidArgument) << "it ended already";

  f.complete_all(id);
  o.progress();
  EXPECT_EQ(state(o, id), TicketState::kReleased);
  EXPECT_EQ(o.ticket(id)->status.code(), StatusCode::kTimeout);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

TEST(HandoffCancelDuringReceive, ASecondCancelWhileOneIsQueuedIsRefused) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  ASSERT_TRUE(o.start(id).is_ok());
  ReceiveInFlight rx(o, f.rank(0), id, 5 * kSecond);
  EXPECT_TRUE(o.cancel(id).is_ok());
  auto again = o.cancel(id);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.to_string();
  EXPECT_NE(again.message().find("queued already"), std::string::npos) << again.to_string();
  f.complete_all(id);
  EXPECT_EQ(rx.get().code(), StatusCode::kCancelled);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
}

// start() gives the loads without the orchestrator's mutex: a rank slow to
// take one (an RPC to a frozen worker, a connect to a producer that is gone)
// delays only that start().
// start(ticket) on a thread while `rank` holds its loads, until one is
// inside it. The rank lets go when the object goes (an ASSERT included),
// before the start is waited for, so a failing test fails and never hangs.
class HeldStart {
 public:
  HeldStart(Orchestrator& o, FakeConsumer& rank, TicketId ticket) : rank_(rank) {
    rank_.hold_loads(true);
    started_ = std::async(std::launch::async, [&o, ticket] { return o.start(ticket); });
    inside_ = eventually([&] { return rank_.loads_inside() == 1; });
  }
  ~HeldStart() { rank_.hold_loads(false); }
  [[nodiscard]] bool inside() const { return inside_; }
  [[nodiscard]] bool returned() { return ready(started_); }
  // Lets the load go; start()'s answer (internal if it did not return).
  Status release() {
    rank_.hold_loads(false);
    if (!eventually([&] { return returned(); })) return Status::internal("start() did not return");
    return started_.get();
  }

 private:
  FakeConsumer& rank_;
  std::future<Status> started_;
  bool inside_ = false;
};

TEST(HandoffDispatch, ARankSlowToTakeItsLoadDelaysOnlyItsOwnStart) {
  Fakes f(tiny());
  Fakes slow(tiny());  // its consumer ranks, as replica "slow"
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  ASSERT_TRUE(o.add_consumer("slow", slow.layout, slow.consumer_ranks()).is_ok());
  const TicketId stuck = generated_ticket(o, "stuck", "slow");
  HeldStart held(o, slow.rank(0), stuck);
  ASSERT_TRUE(held.inside());

  // Another replica's ticket goes from start to finish meanwhile, and the
  // stuck ticket, loading for every other call, times out in its own time
  // with its pages retained (on a thread: were they to wait for the load,
  // the test lets it go after 5 s and fails, rather than hang).
  auto meanwhile = std::async(std::launch::async, [&] {
    const TicketId other = generated_ticket(o, "other");
    EXPECT_TRUE(o.start(other).is_ok());
    f.complete_all(other);
    auto s = o.receive(other, 5 * kSecond);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(o.finish(other).is_ok());
    EXPECT_EQ(state(o, stuck), TicketState::kLoading);
    EXPECT_EQ(counts(o, "slow"), Counts(4, 0, 0));
    EXPECT_EQ(o.receive(stuck, 20 * kMs).code(), StatusCode::kTimeout);
    EXPECT_EQ(counts(o, "slow"), Counts(0, 0, 4));
  });
  EXPECT_EQ(meanwhile.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "the other calls waited for the slow rank's load";
  EXPECT_FALSE(held.returned());

  const Status s = held.release();
  meanwhile.get();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(slow.rank(0).order_count(), 1u);
  EXPECT_EQ(slow.rank(1).order_count(), 0u) << "the ticket had ended: its last row is not given";
  EXPECT_EQ(counts(o, "slow"), Counts(0, 0, 4)) << "retained until the load given completes";
  slow.rank(0).complete_all(stuck);
  o.progress();
  EXPECT_EQ(state(o, stuck), TicketState::kReleased);
  EXPECT_EQ(o.ticket(stuck)->status.code(), StatusCode::kTimeout);
  EXPECT_EQ(slow.consumer_free(), slow.full_consumers());
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

TEST(HandoffDispatch, ATicketReleasedWhileItsStartIsInsideALoadIsForgottenOnlyAfter) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  HeldStart held(o, f.rank(1), id);
  ASSERT_TRUE(held.inside());
  // Both rows end (rank 1's reported as its worker would, once it took the
  // order) and the caller is done with the pages, all before load() returns.
  f.rank(0).complete_all(id);
  f.rank(1).report({id, 0, 1, {}});
  EXPECT_TRUE(o.receive(id, 5 * kSecond).is_ok());
  EXPECT_TRUE(o.finish(id).is_ok());
  o.forget_released();
  EXPECT_TRUE(o.ticket(id).has_value()) << "start() still holds it";
  EXPECT_TRUE(held.release().is_ok());
  o.forget_released();
  EXPECT_EQ(o.ticket(id).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_TRUE(o.consumer_status("decode").is_ok());
}

TEST(HandoffDispatch, ALoadRefusedAfterItsRankReportedItStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  HeldStart held(o, f.rank(1), id);
  ASSERT_TRUE(held.inside());
  f.rank(1).report({id, 0, 1, {}});
  o.progress();
  f.rank(1).fail_load(Status::unavailable("worker gone"));
  EXPECT_TRUE(held.release().is_ok()) << "a refusal is the ticket's, told by receive()";
  const Status stopped = o.consumer_status("decode");
  EXPECT_EQ(stopped.code(), StatusCode::kInternal) << stopped.to_string();
  EXPECT_TRUE(contains(stopped.message(), "reported, then refused the load of ticket")) << stopped.to_string();
  EXPECT_EQ(o.receive(id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(counts(o), Counts(4, 0, 0)) << "a stopped replica's pages are left as they are";
  EXPECT_EQ(f.consumer_frees(), 0);
}

TEST(HandoffDispatch, ACancelDuringDispatchGivesNoMoreRowsAndRetainsUntilTheGivenOneEnds) {
  Fakes f(tiny(2, /*cfg=*/2));  // rows × ranks: (0,0) (0,1) (1,0) (1,1), given in that order
  engine::MetricsRegistry metrics;
  Orchestrator o(HandoffConfig{.metrics = &metrics});
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  HeldStart held(o, f.rank(0), id);
  ASSERT_TRUE(held.inside());
  EXPECT_TRUE(o.cancel(id).is_ok());
  EXPECT_EQ(state(o, id), TicketState::kCancelled);
  EXPECT_EQ(counts(o), Counts(0, 0, 8));
  EXPECT_TRUE(held.release().is_ok());
  EXPECT_EQ(f.rank(0).order_count(), 1u) << "the load being given when the cancel came";
  EXPECT_EQ(f.rank(1).order_count(), 0u);
  EXPECT_EQ(o.ticket(id)->loads_pending, 1u);
  EXPECT_EQ(counts(o), Counts(0, 0, 8)) << "retained while the given load runs";
  const engine::Labels rank0{{"consumer", "decode"}, {"rank", "0"}};
  const engine::Labels rank1{{"consumer", "decode"}, {"rank", "1"}};
  EXPECT_EQ(metrics.histogram_count("baton_handoff_rank_load_seconds", rank1), 0u) << "never given: no latency";
  f.rank(0).complete_all(id);
  o.progress();
  EXPECT_EQ(state(o, id), TicketState::kReleased);
  EXPECT_EQ(metrics.histogram_count("baton_handoff_rank_load_seconds", rank0), 1u);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

TEST(HandoffDispatch, AReplicaStoppedDuringDispatchIsGivenNoMoreLoads) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  HeldStart held(o, f.rank(0), id);
  ASSERT_TRUE(held.inside());
  EXPECT_TRUE(o.consumer_rank_failed("decode", 1, Status::unavailable("its host went down")).is_ok());
  EXPECT_TRUE(held.release().is_ok());
  EXPECT_EQ(f.rank(1).order_count(), 0u);
  EXPECT_EQ(o.receive(id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(counts(o), Counts(4, 0, 0)) << "a stopped replica's pages are left as they are";
  EXPECT_EQ(f.consumer_frees(), 0);
}

TEST(HandoffDispatch, AReportOfALoadNotYetGivenStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  const TicketId id = generated_ticket(o, "r");
  HeldStart held(o, f.rank(0), id);
  ASSERT_TRUE(held.inside());
  f.rank(1).report({id, 0, 1, {}});  // rank 1 has not been given its load
  o.progress();
  const Status stopped = o.consumer_status("decode");
  EXPECT_EQ(stopped.code(), StatusCode::kInternal) << stopped.to_string();
  EXPECT_TRUE(contains(stopped.message(), "not given")) << stopped.to_string();
  EXPECT_TRUE(held.release().is_ok());
  EXPECT_EQ(f.rank(1).order_count(), 0u);
  EXPECT_EQ(counts(o), Counts(4, 0, 0));
  EXPECT_EQ(f.consumer_frees(), 0);
}

TEST(HandoffDispatch, ALoadThatThrowsStopsTheReplica) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  f.rank(1).throw_on_load();
  const TicketId id = generated_ticket(o, "r");
  EXPECT_TRUE(o.start(id).is_ok());
  const Status stopped = o.consumer_status("decode");
  EXPECT_EQ(stopped.code(), StatusCode::kInternal) << stopped.to_string();
  EXPECT_TRUE(contains(stopped.message(), "threw on the load")) << stopped.to_string();
  EXPECT_EQ(counts(o), Counts(4, 0, 0)) << "whether it started is unknown: its pages stay";
  EXPECT_EQ(f.consumer_frees(), 0);
  o.forget_released();
  EXPECT_TRUE(o.ticket(id).has_value());
}

// A caller that never calls progress() still gets back the pages that
// timed-out tickets retained: start() takes the late completions first.
TEST(HandoffFailure, StartTakesLateCompletionsBeforeAllocating) {
  Fakes f(tiny());
  Orchestrator o(HandoffConfig{.transfer_timeout_ns = 1});
  ASSERT_TRUE(f.add_to(o).is_ok());
  // 8 tokens are 2 pages a rank: 8 tickets fill each rank's 16 pages.
  std::vector<TicketId> first;
  for (int i = 0; i < 8; ++i) {
    first.push_back(generated_ticket(o, "r" + std::to_string(i)));
    ASSERT_TRUE(o.start(first.back()).is_ok());
    EXPECT_EQ(o.receive(first.back()).code(), StatusCode::kTimeout);
  }
  EXPECT_EQ(counts(o), Counts(0, 0, 32)) << "every page retained behind its load";
  const TicketId full = generated_ticket(o, "full");
  EXPECT_EQ(o.start(full).code(), StatusCode::kResourceExhausted) << "nothing came back yet";
  ASSERT_TRUE(o.cancel(full).is_ok());
  for (TicketId id : first) f.complete_all(id);  // the late completions arrive; nobody polls
  const TicketId next = generated_ticket(o, "next");
  auto s = o.start(next);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(counts(o), Counts(4, 0, 0));
  for (TicketId id : first) EXPECT_EQ(state(o, id), TicketState::kReleased);
}

TEST(HandoffBadInput, AnInvalidConfigIsSaidByTheCallsThatSetUp) {
  for (const HandoffConfig& config : {HandoffConfig{.transfer_timeout_ns = 0}, HandoffConfig{.transfer_timeout_ns = -1},
                                      HandoffConfig{.load_timeout_ns = -1}}) {
    EXPECT_EQ(config.validate().code(), StatusCode::kInvalidArgument);
    Fakes f(tiny());
    Orchestrator o(config);
    auto s = f.add_to(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("handoff config"), std::string::npos) << s.to_string();
    EXPECT_EQ(o.add_consumer("decode", tiny(), f.consumer_ranks()).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(o.create_ticket({"r", "decode", kTokens}).error().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(HandoffConfig{}.validate().is_ok());
}

// 7. Bad input.
TEST(HandoffBadInput, UnknownNamesAndShapesAreRefused) {
  Fakes f(tiny());
  Orchestrator o;
  auto ranks = f.consumer_ranks();
  EXPECT_EQ(o.add_consumer("c", tiny(), {ranks[0]}).code(), StatusCode::kInvalidArgument) << "a missing rank";
  EXPECT_EQ(o.add_consumer("c", tiny(), {ranks[0], nullptr}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.add_consumer("c", tiny(3), ranks).code(), StatusCode::kInvalidArgument) << "tp 3 of 2 heads";
  EXPECT_EQ(o.add_producer("p", tiny(), {f.producer_ranks()[0]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.add_producer("p", tiny(), {nullptr, nullptr}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.add_consumer("", tiny(), ranks).code(), StatusCode::kInvalidArgument) << "an empty name";
  EXPECT_EQ(o.add_consumer("c", tiny(), {ranks[0], ranks[0]}).code(), StatusCode::kInvalidArgument)
      << "one rank given twice";
  // Ranks whose pages are not the layout's: a tp 1 page is twice a tp 2
  // one, so a consumer would read each head at the wrong offset.
  auto wrong = o.add_producer("p", tiny(1), {f.producer_ranks()[0]});
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("rank 0's pages are 32 bytes, the layout's 64"), std::string::npos) << wrong.to_string();
  EXPECT_EQ(o.add_consumer("c", tiny(1), {ranks[0]}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.add_to(o).is_ok());
  EXPECT_EQ(o.add_consumer("decode", tiny(), ranks).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(o.add_producer("prefill", tiny(), f.producer_ranks()).code(), StatusCode::kAlreadyExists);
  // A rank of one replica given to another: its completions and pages would be taken for either.
  const Status shared = o.add_consumer("decode-2", tiny(), ranks);
  EXPECT_EQ(shared.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shared.message().find("a rank of replica decode"), std::string::npos) << shared.to_string();
  EXPECT_EQ(o.add_producer("prefill-2", tiny(), f.producer_ranks()).code(), StatusCode::kInvalidArgument);
  // Other KV: 2 layers where the consumer has 1.
  KvLayout deeper = tiny();
  deeper.layers = 2;
  Fakes d(deeper);
  ASSERT_TRUE(o.add_producer("deeper", deeper, d.producer_ranks()).is_ok());

  EXPECT_EQ(o.create_ticket({"r", "nope", kTokens}).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(o.create_ticket({"r", "decode", 0}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.create_ticket({"", "decode", kTokens}).error().code(), StatusCode::kInvalidArgument);
  // More pages than a rank's pool holds can never start: refused at once.
  auto huge = o.create_ticket({"r", "decode", (kConsumerPool + 1) * tiny().page_tokens});
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.error().message().find("whose pool holds 16"), std::string::npos) << huge.error().to_string();
  // cfg × pages in 32 bits wrapped to none: 2**30 pages a row, 4 rows.
  Fakes rows(tiny(2, 4));
  ASSERT_TRUE(o.add_consumer("rows", tiny(2, 4), rows.consumer_ranks()).is_ok());
  EXPECT_EQ(o.create_ticket({"r", "rows", 0xFFFFFFFFu}).error().code(), StatusCode::kInvalidArgument);
  auto id = o.create_ticket({"r", "decode", kTokens});
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(o.bind(*id, "nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(o.bind(*id, "deeper").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.producer_free(), f.full_producers()) << "a refused bind allocates nothing";
  EXPECT_EQ(state(o, *id), TicketState::kCreated);

  const TicketId unknown = 9999;
  EXPECT_EQ(o.bind(unknown, "prefill").code(), StatusCode::kNotFound);
  EXPECT_EQ(o.generated(unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(o.start(unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(o.receive(unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(o.cancel(unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(o.finish(unknown).code(), StatusCode::kNotFound);
  EXPECT_EQ(o.ticket(unknown).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(o.pages("nope").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(o.consumer_status("nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(o.producer_failed("nope", Status::unavailable("x")).code(), StatusCode::kNotFound);
  EXPECT_EQ(f.orders(), 0u);
}

TEST(HandoffBadInput, CallsOutOfOrderAreRefusedAndChangeNothing) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  auto id = o.create_ticket({"r", "decode", kTokens});
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(o.receive(*id).code(), StatusCode::kFailedPrecondition) << "created";
  EXPECT_EQ(o.generated(*id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(o.start(*id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(o.finish(*id).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(o.bind(*id, "prefill").is_ok());
  EXPECT_EQ(o.bind(*id, "prefill").code(), StatusCode::kFailedPrecondition) << "bound twice";
  EXPECT_EQ(o.receive(*id).code(), StatusCode::kFailedPrecondition) << "bound";
  EXPECT_EQ(o.start(*id).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(o.generated(*id).is_ok());
  EXPECT_EQ(o.receive(*id).code(), StatusCode::kFailedPrecondition) << "generated";
  EXPECT_EQ(o.receive(*id, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.orders(), 0u);
  EXPECT_EQ(f.consumer_free(), f.full_consumers());

  ASSERT_TRUE(o.start(*id).is_ok());
  EXPECT_EQ(o.start(*id).code(), StatusCode::kFailedPrecondition) << "started twice";
  EXPECT_EQ(o.finish(*id).code(), StatusCode::kFailedPrecondition) << "loading";
  EXPECT_EQ(f.orders(), 2u);
  f.complete_all(*id);
  ASSERT_TRUE(o.receive(*id, kSecond).is_ok());
  EXPECT_TRUE(o.receive(*id, kSecond).is_ok()) << "a completed ticket answers ok again";
  EXPECT_EQ(o.cancel(*id).code(), StatusCode::kInvalidArgument) << "completed: finish it";
  ASSERT_TRUE(o.finish(*id).is_ok());
  EXPECT_EQ(o.finish(*id).code(), StatusCode::kFailedPrecondition) << "finished twice";
  EXPECT_EQ(o.cancel(*id).code(), StatusCode::kInvalidArgument) << "released";
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_EQ(f.producer_free(), f.full_producers());
}

TEST(HandoffBadInput, AFailedProducerFailsItsBoundTicketsAndRefusesLaterBinds) {
  Fakes f(tiny());
  Orchestrator o;
  ASSERT_TRUE(f.add_to(o).is_ok());
  auto bound = o.create_ticket({"bound", "decode", kTokens});
  ASSERT_TRUE(bound.has_value());
  ASSERT_TRUE(o.bind(*bound, "prefill").is_ok());
  const TicketId generated = generated_ticket(o, "generated");
  const TicketId loading = generated_ticket(o, "loading");
  ASSERT_TRUE(o.start(loading).is_ok());
  auto later = o.create_ticket({"later", "decode", kTokens});
  ASSERT_TRUE(later.has_value());

  ASSERT_TRUE(o.producer_failed("prefill", Status::unavailable("node lost")).is_ok());
  for (TicketId id : {*bound, generated}) {
    auto t = o.ticket(id);
    EXPECT_EQ(t->status.code(), StatusCode::kUnavailable) << t->status.to_string();
    EXPECT_TRUE(contains(t->status.message(), "node lost")) << t->status.to_string();
    // Nothing was in flight: failed and released at once.
    EXPECT_EQ(t->state, TicketState::kReleased);
    EXPECT_EQ(o.receive(id).code(), StatusCode::kUnavailable);
  }
  auto s = o.bind(*later, "prefill");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_EQ(state(o, *later), TicketState::kCreated);

  // A ticket loading already goes on. The failed replica's ranks that still
  // answer (here: all of them) take their source pages back; a dead one
  // would refuse, and its pages died with it.
  EXPECT_EQ(state(o, loading), TicketState::kLoading);
  f.complete_all(loading);
  ASSERT_TRUE(o.receive(loading, kSecond).is_ok());
  ASSERT_TRUE(o.finish(loading).is_ok());
  EXPECT_EQ(f.producer_free(), f.full_producers());
  EXPECT_EQ(f.consumer_free(), f.full_consumers());
  EXPECT_TRUE(o.shutdown().is_ok()) << "a producer's death does not stop a consumer";
}

}  // namespace
}  // namespace baton::handoff
