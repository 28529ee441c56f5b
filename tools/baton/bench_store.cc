// `baton bench store --spawn`: a `baton store` child holding N blocks of a
// (layers × TP [× K/V]) layout, filled over RPC and the engine by this
// process; then QueryBlocksForTransfer for all of them from K requesters
// at once (end to end over loopback, RPC included), and StoreClient::fetch
// of all of them (query → materialize → reads → rebuild → release), every
// byte checked, next to plain engine reads of the same bytes. --sessions
// adds a failure drill: requesters that abandon their locks or are cut off
// mid-call, after which the store's lock timeout must reclaim everything.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/engine/pattern.h"
#include "baton/plan/naive.h"
#include "baton/plan/wire.h"
#include "baton/store/service.h"
#include "commands.h"
#include "json_output.h"
#include "serve_child.h"

namespace baton::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct StoreBenchOptions {
  bool spawn = false;
  std::uint32_t blocks = 4500, layers = 36, tp = 8, segment_bytes = 256;
  bool kv_split = false;
  std::uint32_t requesters = 1, queries = 50, fetches = 5;
  // The failure drill: this many more sessions over the requesters, a
  // share of them abandoned (never released) and a share cut mid-call (a
  // 1 ms deadline: the store may lock blocks for a requester that never
  // hears of it); then the store's lock timeout must reclaim them all.
  std::uint32_t sessions = 0;
  double abandon = 0.2, cut = 0.1;
  std::string lock_timeout = "120s";
  std::string json;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Block b's bytes: a pattern salted by its hash.
std::uint64_t hash_of(std::uint32_t b) { return 0x5eed0000'0000ull + b; }

// What a per-block, per-slot answer would carry for the same blocks.
Result<std::size_t> naive_bytes(const plan::Plan& p) {
  auto table = plan::PlacementTable::create(p.blocks, p.slots, p.segments_per_slot);
  if (!table) return std::unexpected(table.error());
  for (const plan::Placement& pl : p.placements) {
    const auto& schema = p.schema[pl.slot * p.segments_per_slot + pl.segment];
    for (std::uint32_t i = 0; i < pl.block_count; ++i) {
      const std::uint32_t block = pl.block_start + i * pl.block_step;
      table->set(block, pl.slot, pl.segment, p.chunks[pl.chunk].base + pl.offset + i * schema.stride,
                 static_cast<std::uint32_t>(schema.bytes));
      table->set_numa(block, pl.slot, p.chunks[pl.chunk].numa);
    }
  }
  auto bytes = plan::serialize_naive(*table, p.block_hashes);
  if (!bytes) return std::unexpected(bytes.error());
  return bytes->size();
}

int run_store_bench(const StoreBenchOptions& o) {
  auto fail = [](int code, const std::string& why) {
    fmt::print(stderr, "baton bench store: {}\n", why);
    return code;
  };
  if (!o.spawn) return fail(2, "--spawn is required: the bench starts its `baton store` itself");
  const store::BlockLayout layout{o.layers * o.tp, o.kv_split ? 2u : 1u, o.segment_bytes};
  if (auto s = layout.validate(); !s.is_ok()) return fail(2, s.message());
  const std::uint64_t block_bytes = layout.block_bytes();
  if (o.blocks > (std::uint64_t{4} << 30) / block_bytes) {  // a product could wrap 64 bits
    return fail(2, fmt::format("{} blocks of {} bytes is above 4 GiB; lower --blocks or --segment-bytes", o.blocks,
                               block_bytes));
  }
  auto lock_timeout = parse_duration(o.lock_timeout);
  if (!lock_timeout || *lock_timeout <= 0 || *lock_timeout > 3'600'000'000'000) {
    return fail(2, fmt::format("--lock-timeout \"{}\": expected a positive duration of at most 1h", o.lock_timeout));
  }
  if (!(o.abandon >= 0 && o.cut >= 0 && o.abandon + o.cut <= 1)) {  // NaN fails too
    return fail(2, fmt::format("--abandon {} and --cut {}: shares in [0, 1] that add up to at most 1", o.abandon, o.cut));
  }
  auto child = ServeChild::start({"--namespace", fmt::format("kv:{}x{}x{}:{}", layout.slots, layout.segments,
                                                             layout.segment_bytes, o.blocks),
                                  "--lock-timeout", o.lock_timeout},
                                 "/proc/self/exe", "", "store");
  if (!child) return fail(1, child.error().to_string());
  // Declared before the client: fetch's slabs stay registered with it
  // until the client goes.
  auto engine = engine::Engine::create({});
  if (!engine) return fail(1, engine.error().to_string());
  auto client = store::StoreClient::connect(child->address());
  if (!client) return fail(1, client.error().to_string());
  auto hello = (*client)->hello();
  if (!hello) return fail(1, hello.error().to_string());

  // Put: allocate, write with the engine, seal — in batches of up to 64 MiB.
  const std::uint32_t per_put = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (64ull << 20) / block_bytes));
  std::vector<std::byte> staging(std::min<std::uint64_t>(per_put, o.blocks) * block_bytes);
  auto staged = (*engine)->register_memory(staging.data(), staging.size());
  if (!staged) return fail(1, staged.error().to_string());
  std::vector<std::uint64_t> hashes;
  for (std::uint32_t first = 0; first < o.blocks; first += per_put) {
    const std::uint32_t n = std::min(per_put, o.blocks - first);
    std::vector<std::uint64_t> put_hashes;
    for (std::uint32_t i = 0; i < n; ++i) {
      engine::fill_pattern(std::span(staging).subspan(i * block_bytes, block_bytes), hash_of(first + i));
      put_hashes.push_back(hash_of(first + i));
    }
    if (Status s = (*client)->put(**engine, "kv", "bench-producer", put_hashes, layout, staged->handle); !s.is_ok()) {
      return fail(1, fmt::format("put: {}", s.to_string()));
    }
    hashes.insert(hashes.end(), put_hashes.begin(), put_hashes.end());
  }
  auto peer = (*engine)->connect(hello->first);
  if (!peer) return fail(1, peer.error().to_string());

  // Queries: K requesters, each its own channel, all at once.
  std::vector<std::vector<double>> per(o.requesters);
  std::vector<std::string> errors(o.requesters);
  std::string plan_wire;
  // jthreads: a thread the system will not start (std::system_error, a
  // one-line failure in main) leaves the started ones joined, not joinable
  // (std::terminate).
  std::vector<std::jthread> threads;
  for (std::uint32_t k = 0; k < o.requesters; ++k) {
    threads.emplace_back([&, k] {
      auto c = store::StoreClient::connect(child->address());
      if (!c) {
        errors[k] = c.error().to_string();
        return;
      }
      for (std::uint32_t q = 0; q < o.queries; ++q) {
        const auto t0 = Clock::now();
        auto a = (*c)->query("kv", hashes, fmt::format("requester-{}", k));
        if (!a || a->found != o.blocks) {
          errors[k] = a ? fmt::format("found {} of {}", a->found, o.blocks) : a.error().to_string();
          return;
        }
        per[k].push_back(ms_since(t0));
        if (k == 0 && q == 0) plan_wire = a->plan;
        if (auto s = (*c)->release(a->session); !s.is_ok()) {
          errors[k] = s.to_string();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) return fail(1, fmt::format("query: {}", e));
  }
  std::vector<double> query_ms;
  for (const auto& v : per) query_ms.insert(query_ms.end(), v.begin(), v.end());
  auto plan = plan::parse_plan(plan_wire);
  if (!plan) return fail(1, plan.error().to_string());
  auto naive = naive_bytes(*plan);
  if (!naive) return fail(1, naive.error().to_string());

  // Fetches, every byte checked; and plain reads of the same chunks.
  std::vector<double> fetch_gbps, raw_gbps;
  bool verified = true;
  std::vector<std::byte> plain(o.blocks * block_bytes + plan->chunks.size() * 64);
  auto plain_region = (*engine)->register_memory(plain.data(), plain.size());
  if (!plain_region) return fail(1, plain_region.error().to_string());
  auto regions = (*engine)->remote_regions(*peer);
  if (!regions) return fail(1, regions.error().to_string());
  engine::Batch raw;
  std::uint64_t at = 0;
  for (const plan::Chunk& c : plan->chunks) {
    auto in = store::locate(*regions, c.base, c.length);
    if (!in) return fail(1, in.error().to_string());
    raw.requests.push_back({.op = engine::Op::kRead, .local_region = plain_region->handle, .local_offset = at,
                            .peer = peer->address, .remote_region = in->region, .remote_offset = in->offset,
                            .length = c.length});
    at += c.length;
  }
  for (std::uint32_t f = 0; f < o.fetches; ++f) {
    const auto t0 = Clock::now();
    auto fetched = (*client)->fetch(**engine, "kv", hashes, "fetcher");
    const double ms = ms_since(t0);
    if (!fetched) return fail(1, fmt::format("fetch: {}", fetched.error().to_string()));
    fetch_gbps.push_back(static_cast<double>(fetched->bytes) / ms / 1e6);
    for (std::uint32_t b = 0; b < o.blocks && verified; ++b) {
      for (std::uint32_t s = 0; s < layout.slots && verified; ++s) {
        for (std::uint32_t g = 0; g < layout.segments; ++g) {
          const std::span<const std::byte> view(fetched->blocks->view(b, s, g), layout.segment_bytes);
          if (engine::pattern_mismatch(view, hash_of(b), (std::uint64_t{s} * layout.segments + g) *
                                                             layout.segment_bytes)) {
            verified = false;
            fmt::print(stderr, "fetch {}: block {} slot {} segment {} differs\n", f, b, s, g);
            break;
          }
        }
      }
    }
    const auto r0 = Clock::now();
    auto h = (*engine)->submit(raw);
    Status s = h ? (*engine)->wait(*h, 600'000'000'000) : h.error();
    if (h) (void)(*engine)->release(*h);
    if (!s.is_ok()) return fail(1, fmt::format("plain reads: {}", s.to_string()));
    raw_gbps.push_back(static_cast<double>(o.blocks * block_bytes) / ms_since(r0) / 1e6);
  }
  // The failure drill, then a wait past the lock timeout and two
  // collector beats: nothing may stay locked.
  std::atomic<std::uint64_t> abandoned = 0, cut = 0, released = 0;
  if (o.sessions > 0) {
    threads.clear();
    for (std::uint32_t k = 0; k < o.requesters; ++k) {
      threads.emplace_back([&, k] {
        auto c = store::StoreClient::connect(child->address());
        auto short_lived = store::StoreClient::connect(child->address(), 1'000'000);  // 1 ms per call
        if (!c || !short_lived) return;
        std::mt19937_64 rng(k + 1);
        std::uniform_real_distribution<double> coin(0, 1);
        for (std::uint32_t i = k; i < o.sessions; i += o.requesters) {
          const double roll = coin(rng);
          if (roll < o.cut) {
            (void)(*short_lived)->query("kv", hashes, fmt::format("cut-{}", k));  // may or may not have locked
            ++cut;
            continue;
          }
          auto a = (*c)->query("kv", hashes, fmt::format("requester-{}", k));
          if (!a) continue;
          if (roll < o.cut + o.abandon) {
            ++abandoned;  // dies holding the lock
          } else if ((*c)->release(a->session).is_ok()) {
            ++released;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  if (abandoned + cut > 0) {
    // Until every lock is gone, at most past the lock timeout and two collector beats.
    const auto limit = std::chrono::nanoseconds(*lock_timeout) + std::chrono::milliseconds(2500);
    fmt::print(stderr, "bench store: waiting up to {:.1f} s for the locks of {} abandoned and {} cut sessions to expire\n",
               std::chrono::duration<double>(limit).count(), abandoned.load(), cut.load());
    for (const auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
      auto now = (*client)->stats();
      if (now && now->sessions == 0 && now->locked_blocks == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  auto stats = (*client)->stats();
  if (!stats) return fail(1, stats.error().to_string());
  auto q = summarize(query_ms);
  const double fetch_p50 = percentile(fetch_gbps, 50).value_or(0);
  const double raw_p50 = percentile(raw_gbps, 50).value_or(0);
  nlohmann::json j{{"blocks", o.blocks},
                   {"layers", o.layers},
                   {"tp", o.tp},
                   {"kv_split", o.kv_split},
                   {"segment_bytes", o.segment_bytes},
                   {"requesters", o.requesters},
                   {"queries", query_ms.size()},
                   {"query_ms_p50", q ? q->p50 : 0.0},
                   {"query_ms_p99", q ? q->p99 : 0.0},
                   {"fetch_gbps", fetch_p50},
                   {"raw_gbps", raw_p50},
                   {"fetch_over_raw", raw_p50 > 0 ? fetch_p50 / raw_p50 : 0.0},
                   {"plan_bytes", plan_wire.size()},
                   {"naive_response_bytes", *naive},
                   {"verified", verified},
                   {"sessions_leaked", stats->sessions},
                   {"locked_blocks_after", stats->locked_blocks},
                   {"pages_leaked", o.blocks - stats->blocks - stats->free_pages - stats->unsealed},
                   {"drill_sessions", o.sessions},
                   {"drill_released", released.load()},
                   {"drill_abandoned", abandoned.load()},
                   {"drill_cut", cut.load()},
                   {"expired_locks", stats->expired_locks}};
  fmt::print("{} blocks ({} bytes each): query p50 {:.2f} ms p99 {:.2f} ms over {} requesters; plan {} bytes vs "
             "naive {}; fetch {:.2f} GB/s vs plain reads {:.2f} GB/s; {}; {} sessions leaked\n",
             o.blocks, block_bytes, j["query_ms_p50"].get<double>(), j["query_ms_p99"].get<double>(), o.requesters,
             plan_wire.size(), *naive, fetch_p50, raw_p50, verified ? "verified" : "DATA CHECK FAILED",
             stats->sessions);
  client->reset();
  (*engine)->shutdown();
  if (Status s = child->stop(); !s.is_ok()) return fail(1, s.to_string());
  const int written = emit_json("bench store", j.dump(2), o.json);
  return verified && stats->sessions == 0 && stats->locked_blocks == 0 ? written : 1;
}

}  // namespace

Command add_bench_store(CLI::App& bench) {
  auto o = std::make_shared<StoreBenchOptions>();
  CLI::App* app = bench.add_subcommand("store", "QueryBlocksForTransfer and fetch against a spawned `baton store`");
  app->add_flag("--spawn", o->spawn, "Start the `baton store` child (required)");
  app->add_option("--blocks", o->blocks, "Blocks held and asked for")->check(CLI::Range(1, 1 << 22));
  app->add_option("--layers", o->layers, "Layers per block")->check(CLI::Range(1, 4096));
  app->add_option("--tp", o->tp, "TP ranks per block (slots = layers × tp)")->check(CLI::Range(1, 1024));
  app->add_flag("--kv-split", o->kv_split, "K and V as two segments per slot");
  app->add_option("--segment-bytes", o->segment_bytes, "Bytes per segment")->check(CLI::Range(1, 1 << 30));
  app->add_option("--requesters", o->requesters, "Concurrent requesters querying")->check(CLI::Range(1, 1024));
  app->add_option("--queries", o->queries, "Queries per requester")->check(CLI::Range(1, 1'000'000));
  app->add_option("--fetches", o->fetches, "Fetches of every block, each checked")->check(CLI::Range(1, 1000));
  app->add_option("--sessions", o->sessions, "Failure drill: this many more sessions (0: none)")
      ->check(CLI::Range(0, 10'000'000));
  app->add_option("--abandon", o->abandon, "Share of drill sessions never released");
  app->add_option("--cut", o->cut, "Share of drill queries cut by a 1 ms deadline");
  app->add_option("--lock-timeout", o->lock_timeout, "The store's lock timeout (duration)")
      ->check(kPositiveDuration);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o] { return run_store_bench(*o); }};
}

}  // namespace baton::cli
