// `baton demo`: Baton's main job end to end. A `baton serve` process holds a
// vLLM-shaped KV cache (layers × TP ranks × K/V, 16-token blocks, a
// fragmented block table); a decode-side engine pulls all of it through a
// transfer plan (encode → wire → parse → materialize → rebuild into local
// slabs) as bulk reads, while decode steps keep reading small hot ranges
// with a deadline. It runs once under FIFO and once deadline-aware, checks
// every byte that moved, and prints a summary table. Then the store: a
// `baton store` process takes the same KV from a prefill engine (allocate
// over RPC, engine writes, seal), and a decode engine fetches it back
// through the store's transfer plan with a deadline, every byte checked.
#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "baton/plan/encode.h"
#include "baton/plan/fixtures.h"
#include "baton/plan/materialize.h"
#include "baton/plan/rebuild.h"
#include "baton/plan/wire.h"
#include "baton/store/service.h"
#include "commands.h"
#include "json_output.h"
#include "serve_child.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

constexpr TimeNs kWaitNs = 120'000'000'000;

struct DemoOptions {
  std::string target;
  transport::UcxConfig ucx;
  plan::FixtureSpec kv{.blocks = 256, .layers = 8, .tp = 2, .run_blocks = 7};
  std::string decode_size = "64KiB";
  double decode_interval_ms = 2;
  double decode_deadline_ms = 5;
  std::uint64_t seed = 1;
  std::string json;
};

struct StoreResult {
  std::uint32_t blocks = 0;
  std::uint64_t bytes = 0;
  double put_ms = 0;
  double fetch_ms = 0;
  std::size_t plan_wire_bytes = 0;
  bool within_deadline = false;
};

struct RunResult {
  std::string policy;
  std::size_t plan_wire_bytes = 0;
  std::size_t ops = 0;
  std::uint64_t kv_bytes = 0;
  double kv_seconds = 0;
  Summary decode;
  std::size_t decode_count = 0;
  std::size_t decode_missed = 0;
  std::uint64_t bytes_verified = 0;
};

// The holder's tensors inside serve's one buffer, 4 KiB aligned, in the
// fixture's region order.
std::vector<std::uint64_t> region_offsets(const std::vector<plan::FixtureRegion>& regions, std::uint64_t* total) {
  std::vector<std::uint64_t> offsets;
  std::uint64_t at = 0;
  for (const plan::FixtureRegion& r : regions) {
    offsets.push_back(at);
    at += (r.bytes + 4095) / 4096 * 4096;
  }
  *total = at;
  return offsets;
}

// One row of the table: a policy with every batch through the scheduler
// (the loop-free path off, as for a peer on another host), or the defaults,
// where same-host batches skip the loop and no policy orders them.
struct Row {
  sched::PolicyKind kind;
  bool through_scheduler;
  std::string name;
};

Result<RunResult> run_policy(const DemoOptions& o, const Row& row, const std::string& peer_address,
                             const std::vector<std::uint64_t>& offsets, std::uint64_t decode_bytes) {
  RunResult out;
  out.policy = row.name;
  engine::EngineConfig config = engine::EngineConfig{.ucx = o.ucx};
  config.policy.kind = row.kind;
  if (row.through_scheduler) config.ucx.direct_copy_max_bytes = 0;
  auto created = engine::Engine::create(config);
  if (!created) return std::unexpected(created.error());
  engine::Engine& e = **created;
  auto peer = e.connect(peer_address);
  if (!peer) return std::unexpected(peer.error());
  auto regions = e.remote_regions(*peer);
  if (!regions || regions->empty()) return std::unexpected(Status::unavailable("demo: the peer registered no memory"));
  const transport::RemoteRegion remote = regions->front();

  // The holder's side of the plan: where each block of each slot lives in
  // serve's buffer. (A real holder encodes this itself and sends the bytes.)
  std::vector<std::uint64_t> bases;
  for (std::uint64_t off : offsets) bases.push_back(remote.base + off);
  plan::PlacementTable table;
  if (Status s = plan::fill_fixture(o.kv, table, bases); !s.is_ok()) return std::unexpected(s);
  auto encoded = plan::encode_plan(table);
  if (!encoded) return std::unexpected(encoded.error());
  const std::string wire = plan::serialize_plan(*encoded);
  out.plan_wire_bytes = wire.size();

  // The requester's side: parse, materialize into reads, rebuild the slabs.
  auto plan = plan::parse_plan(wire);
  if (!plan) return std::unexpected(plan.error());
  auto ops = plan::materialize(*plan, e.topology());
  if (!ops) return std::unexpected(ops.error());
  plan::Rebuilder rebuilder;
  auto rebuilt = rebuilder.rebuild(*plan);
  if (!rebuilt) return std::unexpected(rebuilt.error());
  std::vector<engine::Region> slabs;
  for (const plan::SlabMemory& slab : rebuilt->slabs()) {
    std::fill_n(slab.data(), slab.bytes(), std::byte{0});
    auto r = e.register_memory(slab.data(), slab.bytes());
    if (!r) return std::unexpected(r.error());
    slabs.push_back(*r);
  }
  engine::Batch kv;
  for (const plan::TransferOp& op : ops->ops) {
    engine::Request r;
    r.op = engine::Op::kRead;
    r.local_region = slabs[op.slab].handle;
    r.local_offset = op.slab_offset;
    r.peer = peer->address;
    r.remote_region = remote.key;
    r.remote_offset = op.remote_address - remote.base;
    r.length = op.length;
    r.qos = sched::QosClass::kPrefillBulk;
    kv.requests.push_back(r);
    out.kv_bytes += op.length;
  }
  out.ops = kv.requests.size();
  kv.notification = "kv cache pulled";

  // Decode steps: one hot range of the cache every interval, due soon.
  const auto interval = std::chrono::duration<double, std::milli>(o.decode_interval_ms);
  const TimeNs deadline_ns = static_cast<TimeNs>(o.decode_deadline_ms * 1e6);
  const std::size_t max_steps = 4096;
  std::vector<std::byte> decode_buffer(max_steps * decode_bytes);
  auto decode_region = e.register_memory(decode_buffer.data(), decode_buffer.size());
  if (!decode_region) return std::unexpected(decode_region.error());
  std::mt19937_64 rng(o.seed);
  std::vector<std::pair<engine::BatchHandle, std::uint64_t>> steps;  // handle, remote offset

  const auto start = std::chrono::steady_clock::now();
  auto kv_handle = e.submit(kv);
  if (!kv_handle) return std::unexpected(kv_handle.error());
  std::optional<double> kv_done_s;
  for (auto next = start; steps.size() < max_steps; next += std::chrono::duration_cast<std::chrono::nanoseconds>(interval)) {
    if (!kv_done_s && e.poll(*kv_handle)->done) {
      kv_done_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (kv_done_s) break;  // decode steps ran for as long as the bulk pull
    std::this_thread::sleep_until(next);
    engine::Request r;
    r.op = engine::Op::kRead;
    r.local_region = decode_region->handle;
    r.local_offset = steps.size() * decode_bytes;
    r.peer = peer->address;
    r.remote_region = remote.key;
    r.remote_offset = rng() % (remote.length - decode_bytes + 1);
    r.length = decode_bytes;
    r.qos = sched::QosClass::kDecodeCritical;
    r.deadline_ns = e.now_ns() + deadline_ns;
    auto h = e.submit(engine::Batch{{r}, {}});
    if (!h) return std::unexpected(h.error());
    steps.emplace_back(*h, r.remote_offset);
  }
  if (Status s = e.wait(*kv_handle, kWaitNs); !s.is_ok()) return std::unexpected(s);
  if (!kv_done_s) kv_done_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.kv_seconds = *kv_done_s;
  auto kv_status = e.poll(*kv_handle);
  if (!kv_status || !kv_status->status.is_ok()) {
    return std::unexpected(kv_status ? kv_status->status : kv_status.error());
  }

  // Every byte: the slabs against the holder's pattern at each segment's
  // remote address, and each decode step against the range it read.
  for (std::uint32_t s = 0; s < table.slots(); ++s) {
    for (std::uint32_t b = 0; b < table.blocks(); ++b) {
      for (std::uint32_t g = 0; g < table.segments_per_slot(); ++g) {
        const std::uint64_t length = table.length(b, s, g);
        const std::span<const std::byte> got(rebuilt->view(b, s, g), length);
        if (auto bad = engine::pattern_mismatch(got, kServeSalt, table.address(b, s, g) - remote.base)) {
          return std::unexpected(Status::internal("demo: block {} slot {} segment {}: byte {} differs", b, s, g, *bad));
        }
        out.bytes_verified += length;
      }
    }
  }
  std::vector<double> latencies;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (Status s = e.wait(steps[i].first, kWaitNs); !s.is_ok()) return std::unexpected(s);
    auto st = e.poll(steps[i].first);
    if (!st || !st->status.is_ok()) return std::unexpected(st ? st->status : st.error());
    const sched::RequestStatus& r = st->requests.front();
    latencies.push_back(static_cast<double>(r.completed_ns - r.submitted_ns) / 1e3);
    out.decode_missed += r.deadline_missed();
    const std::span<const std::byte> got(decode_buffer.data() + i * decode_bytes, decode_bytes);
    if (auto bad = engine::pattern_mismatch(got, kServeSalt, steps[i].second)) {
      return std::unexpected(Status::internal("demo: decode step {}: byte {} differs", i, *bad));
    }
    out.bytes_verified += decode_bytes;
  }
  out.decode_count = latencies.size();
  if (auto sum = summarize(latencies)) out.decode = *sum;
  return out;
}

// Prefill puts every block into a spawned `baton store`; decode fetches
// them all through the plan with a deadline; every byte is checked.
Result<StoreResult> run_store(const DemoOptions& o, TimeNs deadline_ns) {
  const std::uint32_t heads = o.kv.mla ? 1 : std::max(1u, o.kv.kv_heads / o.kv.tp);
  const store::BlockLayout layout{o.kv.layers * o.kv.tp, o.kv.mla ? 1u : 2u,
                                  o.kv.block_tokens * heads * o.kv.head_dim * o.kv.dtype_bytes};
  const std::uint64_t block_bytes = layout.block_bytes();
  auto child = ServeChild::start({"--namespace", fmt::format("demo:{}x{}x{}:{}", layout.slots, layout.segments,
                                                             layout.segment_bytes, o.kv.blocks)},
                                 "/proc/self/exe", "", "store");
  if (!child) return std::unexpected(child.error());
  // The engines outlive the client (it keeps the fetch's slabs registered).
  auto prefill = engine::Engine::create({});
  auto decode = engine::Engine::create({});
  if (!prefill || !decode) return std::unexpected(prefill ? decode.error() : prefill.error());
  auto client = store::StoreClient::connect(child->address());
  if (!client) return std::unexpected(client.error());

  StoreResult out;
  out.blocks = o.kv.blocks;
  out.bytes = block_bytes * o.kv.blocks;
  std::vector<std::byte> kv(out.bytes);
  std::vector<std::uint64_t> hashes;
  for (std::uint32_t b = 0; b < o.kv.blocks; ++b) {
    hashes.push_back(0xd3e0000000ull + b);
    engine::fill_pattern(std::span(kv).subspan(b * block_bytes, block_bytes), hashes.back());
  }
  auto mine = (*prefill)->register_memory(kv.data(), kv.size());
  if (!mine) return std::unexpected(mine.error());
  const auto put0 = std::chrono::steady_clock::now();
  if (Status s = (*client)->put(**prefill, "demo", "demo-prefill", hashes, layout, mine->handle); !s.is_ok()) {
    return std::unexpected(s);
  }
  out.put_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - put0).count();

  store::FetchOptions fetch;
  fetch.deadline_ns = deadline_ns;
  const auto fetch0 = std::chrono::steady_clock::now();
  auto fetched = (*client)->fetch(**decode, "demo", hashes, "demo-decode", fetch);
  out.fetch_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - fetch0).count();
  if (!fetched) return std::unexpected(fetched.error());
  if (fetched->found != o.kv.blocks) {
    return std::unexpected(Status::internal("demo: the store found {} of {} blocks", fetched->found, o.kv.blocks));
  }
  out.within_deadline = out.fetch_ms * 1e6 <= static_cast<double>(deadline_ns);
  out.plan_wire_bytes = fetched->plan_wire_bytes;
  for (std::uint32_t b = 0; b < o.kv.blocks; ++b) {
    for (std::uint32_t sl = 0; sl < layout.slots; ++sl) {
      for (std::uint32_t g = 0; g < layout.segments; ++g) {
        const std::span<const std::byte> view(fetched->blocks->view(b, sl, g), layout.segment_bytes);
        const std::uint64_t at = (std::uint64_t{sl} * layout.segments + g) * layout.segment_bytes;
        if (auto bad = engine::pattern_mismatch(view, hashes[b], at)) {
          return std::unexpected(
              Status::internal("demo: store block {} slot {} segment {}: byte {} differs", b, sl, g, *bad));
        }
      }
    }
  }
  fetched = std::unexpected(Status::cancelled("checked"));  // its slabs go back before the engines go
  client->reset();
  (*prefill)->shutdown();
  (*decode)->shutdown();
  if (Status s = child->stop(); !s.is_ok()) return std::unexpected(s);
  return out;
}

int run_demo(const DemoOptions& o) {
  auto decode_bytes = parse_size(o.decode_size);
  if (!decode_bytes || *decode_bytes == 0) {
    fmt::print(stderr, "baton demo: --decode-size: {}\n", decode_bytes ? "must be > 0" : decode_bytes.error().message());
    return 2;
  }
  // inf and 1e300 would overflow the nanoseconds.
  if (!(o.decode_interval_ms > 0 && o.decode_interval_ms <= 60000) ||
      !(o.decode_deadline_ms > 0 && o.decode_deadline_ms <= 60000)) {
    fmt::print(stderr, "baton demo: --decode-interval-ms and --decode-deadline-ms must be > 0 and at most 60000\n");
    return 2;
  }
  auto regions = plan::fixture_regions(o.kv);
  if (!regions) {
    fmt::print(stderr, "baton demo: {}\n", regions.error().message());
    return 2;
  }
  std::uint64_t total = 0;
  const auto offsets = region_offsets(*regions, &total);
  if (total < *decode_bytes) {
    fmt::print(stderr, "baton demo: the KV cache ({} B) is smaller than one decode read\n", total);
    return 2;
  }
  std::optional<ServeChild> child;
  std::string target = o.target;
  if (target.empty()) {
    auto started = ServeChild::start(serve_args(total, o.ucx));
    if (!started) {
      fmt::print(stderr, "baton demo: {}\n", started.error().message());
      return 1;
    }
    child.emplace(std::move(*started));
    target = child->address();
  }
  fmt::print("KV cache on {}: {} layers x {} TP ranks x K/V, {} blocks of {} tokens ({}), decode reads of {} every "
             "{} ms due in {} ms\n",
             target, o.kv.layers, o.kv.tp, o.kv.blocks, o.kv.block_tokens, format_size(total), format_size(*decode_bytes),
             o.decode_interval_ms, o.decode_deadline_ms);
  std::vector<Row> rows{{sched::PolicyKind::kBaselineFifo, true, "baseline_fifo"},
                        {sched::PolicyKind::kDeadlineAware, true, "deadline_aware"}};
  const bool loop_free = o.ucx.same_host_copy && o.ucx.direct_copy_max_bytes > 0;
  if (loop_free) rows.push_back({sched::PolicyKind::kDeadlineAware, false, "loop_free"});
  std::vector<RunResult> results;
  for (const Row& row : rows) {
    auto r = run_policy(o, row, target, offsets, *decode_bytes);
    if (!r) {
      fmt::print(stderr, "baton demo: {}: {}\n", row.name, r.error().to_string());
      return 1;
    }
    results.push_back(*r);
  }
  if (child) {
    if (Status s = child->stop(); !s.is_ok()) {
      fmt::print(stderr, "baton demo: {}\n", s.message());
      return 1;
    }
  }
  fmt::print("\n{:<15} {:>10} {:>6} {:>9} {:>9} {:>7} {:>13} {:>13} {:>7} {:>10}\n", "policy", "KV bytes", "ops",
             "KV GB/s", "plan B", "steps", "decode p50", "decode p99", "missed", "verified");
  nlohmann::json j{{"kv", {{"layers", o.kv.layers}, {"tp", o.kv.tp}, {"blocks", o.kv.blocks},
                           {"block_tokens", o.kv.block_tokens}, {"bytes", total}}},
                   {"policies", nlohmann::json::object()}};
  bool no_race = false, no_race_loop_free = false;
  for (const RunResult& r : results) {
    // No decode step, no percentile: "n/a" and null, not a 0 that reads as instant.
    const bool steps = r.decode_count > 0;
    (r.policy == "loop_free" ? no_race_loop_free : no_race) |= !steps;
    auto us = [steps](double v) { return steps ? fmt::format("{:.1f} us", v) : std::string("n/a"); };
    fmt::print("{:<15} {:>10} {:>6} {:>9.3f} {:>9} {:>7} {:>13} {:>13} {:>7} {:>10}\n", r.policy,
               format_size(r.kv_bytes), r.ops, static_cast<double>(r.kv_bytes) / r.kv_seconds / 1e9, r.plan_wire_bytes,
               r.decode_count, us(r.decode.p50), us(r.decode.p99), r.decode_missed, format_size(r.bytes_verified));
    j["policies"][r.policy] = {{"kv_bytes", r.kv_bytes},
                               {"ops", r.ops},
                               {"kv_gbps", static_cast<double>(r.kv_bytes) / r.kv_seconds / 1e9},
                               {"plan_wire_bytes", r.plan_wire_bytes},
                               {"decode_steps", r.decode_count},
                               {"decode_p50_us", steps ? nlohmann::json(r.decode.p50) : nlohmann::json()},
                               {"decode_p99_us", steps ? nlohmann::json(r.decode.p99) : nlohmann::json()},
                               {"decode_missed", r.decode_missed},
                               {"bytes_verified", r.bytes_verified}};
  }
  fmt::print("baseline_fifo, deadline_aware: every batch through the scheduler (as to a peer on another host); "
             "loop_free: the defaults on one host: batches copied without the loop, which no policy orders\n");
  if (no_race) {
    fmt::print("no decode step raced the pull: it ended before the first step; more --blocks make them race\n");
  }
  if (no_race_loop_free && total <= o.ucx.direct_copy_max_bytes) {
    fmt::print("loop_free: no decode step raced the pull: a pull of at most --direct-copy-max ({}) is copied inside "
               "submit, before the first step\n",
               format_size(o.ucx.direct_copy_max_bytes));
  } else if (no_race_loop_free) {
    fmt::print("loop_free: no decode step raced the pull: it ended before the first step\n");
  }
  fmt::print("every byte checked against the holder's pattern: ok\n");

  // The store: prefill → `baton store` → decode, through the plan.
  constexpr TimeNs kStoreDeadlineNs = 2'000'000'000;
  auto st = run_store(o, kStoreDeadlineNs);
  if (!st) {
    fmt::print(stderr, "baton demo: store: {}\n", st.error().to_string());
    return 1;
  }
  fmt::print("\nstore: prefill put {} blocks ({}) into a `baton store` in {:.1f} ms; decode fetched them through a "
             "{}-byte plan in {:.1f} ms ({} its {:.0f} ms deadline); every byte checked: ok\n",
             st->blocks, format_size(st->bytes), st->put_ms, st->plan_wire_bytes, st->fetch_ms,
             st->within_deadline ? "within" : "PAST", kStoreDeadlineNs / 1e6);
  j["store"] = {{"blocks", st->blocks},       {"bytes", st->bytes},
                {"put_ms", st->put_ms},       {"fetch_ms", st->fetch_ms},
                {"plan_wire_bytes", st->plan_wire_bytes}, {"deadline_ms", kStoreDeadlineNs / 1e6},
                {"within_deadline", st->within_deadline}, {"verified", true}};
  return emit_json("demo", j.dump(2), o.json);
}

}  // namespace

Command add_demo_command(CLI::App& parent) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* app = parent.add_subcommand(
      "demo", "Pull a vLLM-shaped KV cache from a `baton serve` peer with decode reads racing it: FIFO vs deadline-aware "
      "through the scheduler, and the same-host defaults");
  app->add_option("--target", o->target, "A running `baton serve` (host:port); default: spawn one on 127.0.0.1")->check(kHostPort);
  add_ucx_options(*app, o->ucx);
  app->add_option("--layers", o->kv.layers, "Model layers")->check(CLI::Range(1, 1024));
  app->add_option("--tp", o->kv.tp, "Tensor-parallel ranks of the holder")->check(CLI::Range(1, 64));
  app->add_option("--blocks", o->kv.blocks, "KV blocks to pull")->check(CLI::Range(1, 1 << 20));
  app->add_option("--block-tokens", o->kv.block_tokens, "Tokens per block")->check(CLI::Range(1, 4096));
  app->add_option("--run-blocks", o->kv.run_blocks, "A free block after every N (0: a contiguous block table)");
  app->add_option("--decode-size", o->decode_size, "Bytes per decode read (size)");
  app->add_option("--decode-interval-ms", o->decode_interval_ms, "Gap between decode reads");
  app->add_option("--decode-deadline-ms", o->decode_deadline_ms, "Decode deadline after submit");
  app->add_option("--seed", o->seed, "Seed of the decode reads' offsets")->check(kUnsigned64);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o] { return run_demo(*o); }};
}

}  // namespace baton::cli
