// `baton bench throughput`: batches of block reads or writes against a
// `baton serve` peer for a fixed time, like Mooncake's transfer_engine_bench.
// Every thread keeps one batch in flight on its own blocks; the data is
// checked against serve's pattern at the end, so a fast wrong answer fails
// (a write bench reads back its own, then puts serve's pattern back).
#include <algorithm>
#include <map>
#include <atomic>
#include <cstring>
#include <limits>
#include <span>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "commands.h"
#include "json_output.h"
#include "bench_peer.h"
#include "serve_child.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

constexpr std::uint64_t kWriteSalt = 1;  // what a write bench leaves in serve's buffer

struct ThroughputOptions {
  std::string target;
  bool spawn = false;
  std::string op = "read";
  std::string block_size = "1MiB";
  int batch_size = 16;
  int blocks = 0;  // distinct blocks per thread; 0: one per request of the batch
  int threads = 1;
  bool prepared = false;
  std::string duration = "5s";
  transport::UcxConfig ucx;
  std::string policy_file;
  std::string json;
};

struct Plan {
  engine::Op op = engine::Op::kRead;
  std::uint64_t block = 0;
  TimeNs duration_ns = 0;
  int blocks = 0;          // distinct blocks a thread's batch cycles over
  std::uint64_t span = 0;  // bytes each side touches: threads × blocks × block
};

Result<Plan> check_options(const ThroughputOptions& o) {
  Plan p;
  if (o.op != "read" && o.op != "write") {
    return std::unexpected(Status::invalid_argument("--op \"{}\": expected read or write", o.op));
  }
  p.op = o.op == "read" ? engine::Op::kRead : engine::Op::kWrite;
  auto block = parse_size(o.block_size);
  if (!block) return std::unexpected(Status::invalid_argument("--block-size: {}", block.error().message()));
  if (*block == 0) return std::unexpected(Status::invalid_argument("--block-size must be > 0"));
  p.block = *block;
  auto duration = parse_flag_duration(o.duration);
  if (!duration) return std::unexpected(Status::invalid_argument("--duration: {}", duration.error().message()));
  if (*duration <= 0) return std::unexpected(Status::invalid_argument("--duration must be > 0"));
  p.duration_ns = *duration;
  p.blocks = o.blocks == 0 ? o.batch_size : o.blocks;
  if (p.blocks > o.batch_size) {
    return std::unexpected(Status::invalid_argument("--blocks {} exceeds --batch-size {}: a block no request touches",
                                                    p.blocks, o.batch_size));
  }
  const auto threads = static_cast<std::uint64_t>(o.threads), blocks = static_cast<std::uint64_t>(p.blocks);
  if (p.block > std::numeric_limits<std::uint64_t>::max() / threads / blocks) {
    return std::unexpected(Status::invalid_argument("--threads × --blocks × --block-size overflows"));
  }
  p.span = threads * blocks * p.block;
  return p;
}

// The ceiling of a same-host copy, from the same run: one thread memcpy'ing
// the bench's working set (its own buffer, block by block, in order) into
// a second buffer of the same size, for up to a second.
double memcpy_reference(std::span<const std::byte> working_set, std::uint64_t block, TimeNs duration_ns) {
  std::vector<std::byte> into(working_set.size());
  std::memcpy(into.data(), working_set.data(), into.size());  // both touched before the clock starts
  const auto budget = std::chrono::nanoseconds(std::min<TimeNs>(duration_ns, 1'000'000'000));
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t copied = 0;
  std::chrono::steady_clock::duration took{};
  do {
    for (std::uint64_t off = 0; off < into.size(); off += block) {
      const std::uint64_t n = std::min<std::uint64_t>(block, into.size() - off);
      std::memcpy(into.data() + off, working_set.data() + off, n);
      copied += n;
    }
    took = std::chrono::steady_clock::now() - start;
  } while (took < budget);
  return static_cast<double>(copied) / std::chrono::duration<double>(took).count() / 1e9;
}

// The batches the loop-free path copied (the engine's counter: within
// submit, or on the copier's thread above --direct-copy-max): a same-host
// batch submitted while the loop holds requests, or with the path off,
// takes the loop instead, several times slower for small requests
// (docs/results.md), and the figures should say which ran.
std::uint64_t direct_batches(engine::Engine& e) {
  (void)e.metrics_text();  // a scrape adds the copying threads' counts to the registry
  return e.metrics().counter("baton_engine_direct_batches_total");
}

int run_throughput(const ThroughputOptions& o) {
  auto plan = check_options(o);
  if (!plan) {
    fmt::print(stderr, "baton bench throughput: {}\n", plan.error().message());
    return 2;
  }
  auto opened = BenchPeer::open({o.target, o.spawn, o.ucx, o.policy_file, plan->span}, plan->span);
  if (!opened) {
    fmt::print(stderr, "baton bench throughput: {}\n", opened.error().to_string());
    return exit_code(opened.error());
  }
  BenchPeer& bp = *opened;
  std::span<std::byte> buffer = bp.buffer();
  if (plan->op == engine::Op::kWrite) {
    engine::fill_pattern(buffer, kWriteSalt);
  } else {
    std::ranges::fill(buffer, std::byte{0});
  }

  // Each thread owns blocks [t·blocks, (t+1)·blocks) at the same offsets on
  // both sides, and keeps one batch over them in flight: request i on its
  // block i mod blocks (--blocks 1: every request on one block, as
  // ucx_perftest's window of operations on its one buffer).
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bytes{0};
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(o.threads));
  std::vector<Status> errors(static_cast<std::size_t>(o.threads));
  const auto started = std::chrono::steady_clock::now();
  // A thread the system will not start (std::system_error, a one-line
  // failure in main) leaves the started ones stopped and joined (the guard
  // goes first), not joinable (std::terminate).
  std::vector<std::jthread> workers;
  struct StopFirst {
    std::atomic<bool>& stop;
    ~StopFirst() { stop = true; }
  } stop_first{stop};
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&, t] {
      engine::Batch batch;
      for (int i = 0; i < o.batch_size; ++i) {
        const std::uint64_t offset = (static_cast<std::uint64_t>(t) * plan->blocks + i % plan->blocks) * plan->block;
        batch.requests.push_back(bp.request(plan->op, offset, plan->block));
      }
      engine::PreparedBatch prepared(o.prepared ? batch : engine::Batch{});
      const std::uint64_t batch_bytes = static_cast<std::uint64_t>(o.batch_size) * plan->block;
      engine::Engine& e = bp.engine();
      engine::BatchStatus st;  // reused, as a connector's poll loop would
      // At least one batch each, however short the duration: the check
      // below reads every block, and a block never moved is no corruption.
      do {
        auto h = o.prepared ? e.submit(prepared) : e.submit(batch);
        Status s = h ? e.wait(*h, 60'000'000'000) : h.error();
        if (s.is_ok()) s = e.poll(*h, st);
        if (h) (void)e.release(*h);
        if (s.is_ok()) s = st.status;
        if (!s.is_ok()) {
          errors[static_cast<std::size_t>(t)] = s;
          stop = true;
          return;
        }
        // A batch's latency from the engine's own stamps (its submit to its
        // last request's end): two more clock reads per batch here would
        // cost a 4 KiB batch 5% of its rate on this VM's kvm-clock.
        TimeNs first = st.requests.front().submitted_ns, last = 0;
        for (const sched::RequestStatus& r : st.requests) {
          first = std::min(first, r.submitted_ns);
          last = std::max(last, r.completed_ns);
        }
        latencies[static_cast<std::size_t>(t)].push_back(static_cast<double>(last - first) / 1e3);
        bytes.fetch_add(batch_bytes, std::memory_order_relaxed);
      } while (!stop.load(std::memory_order_relaxed));
    });
  }
  // Until the duration ends, or sooner when a batch failed (a dead peer).
  const auto until = started + std::chrono::nanoseconds(plan->duration_ns);
  while (!stop.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(10), until - std::chrono::steady_clock::now()));
  }
  stop = true;
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::uint64_t direct = direct_batches(bp.engine());  // before the check's batches below
  for (const Status& s : errors) {
    if (!s.is_ok()) {
      fmt::print(stderr, "baton bench throughput: a batch failed: {}\n", s.to_string());
      return 1;
    }
  }

  // Verify: a read bench holds serve's pattern; a write bench reads back
  // what it wrote into a cleared buffer.
  std::uint64_t salt = kServeSalt;
  if (plan->op == engine::Op::kWrite) {
    std::ranges::fill(buffer, std::byte{0});
    if (Status s = bp.run({{bp.request(engine::Op::kRead, 0, plan->span)}, {}}); !s.is_ok()) {
      fmt::print(stderr, "baton bench throughput: reading back for the check failed: {}\n", s.to_string());
      return 1;
    }
    salt = kWriteSalt;
  }
  if (auto bad = engine::pattern_mismatch(buffer, salt); bad) {
    fmt::print(stderr, "baton bench throughput: data check FAILED at byte {} of {}\n", *bad, buffer.size());
    return 1;
  }
  if (plan->op == engine::Op::kWrite) {
    // serve's buffer left as serve filled it: a read bench after this one
    // checks against serve's pattern, and reported our bytes as corruption.
    engine::fill_pattern(buffer, kServeSalt);
    if (Status s = bp.run({{bp.request(engine::Op::kWrite, 0, plan->span)}, {}}); !s.is_ok()) {
      fmt::print(stderr, "baton bench throughput: restoring serve's pattern failed: {}\n", s.to_string());
      return 1;
    }
  }
  const std::string transport = bp.peer().transport;
  // What to run ucx_perftest with to compare like with like (scripts/bench-vs-perftest).
  const auto chosen = bp.engine().ucx_settings();
  const std::map<std::string, std::string> ucx_settings(chosen.begin(), chosen.end());  // a JSON object
  if (Status s = bp.close(); !s.is_ok()) {
    fmt::print(stderr, "baton bench throughput: {}\n", s.message());
    return 1;
  }

  const double memcpy_gbps = memcpy_reference(buffer, plan->block, plan->duration_ns);
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  const auto summary = summarize(all);
  const double p50 = summary ? summary->p50 : 0.0;
  const double p99 = summary ? summary->p99 : 0.0;
  const double gbps = static_cast<double>(bytes.load()) / seconds / 1e9;
  const double requests_per_s = static_cast<double>(bytes.load() / plan->block) / seconds;
  fmt::print("op {} block {} batch {} on {} block(s){} threads {} over {} (tls {}): {} bytes in {:.2f} s, data verified\n",
             o.op, plan->block, o.batch_size, plan->blocks, o.prepared ? " (prepared)" : "", o.threads, transport, o.ucx.tls.empty() ? "default" : o.ucx.tls,
             bytes.load(), seconds);
  fmt::print("batch latency p50 {:.1f} us, p99 {:.1f} us; {} of {} batches copied without the loop{}\n", p50,
             p99, direct, all.size(), direct < all.size() && transport == "shm" ? " (the rest through the loop)" : "");
  fmt::print("throughput {:.3f} GB/s, {:.0f} requests/s; memcpy of the same working set {:.3f} GB/s ({:.2f}x)\n", gbps,
             requests_per_s, memcpy_gbps, memcpy_gbps > 0 ? gbps / memcpy_gbps : 0.0);
  nlohmann::json j{{"op", o.op},
                   {"block_size", plan->block},
                   {"batch_size", o.batch_size},
                   {"blocks", plan->blocks},
                   {"threads", o.threads},
                   {"prepared", o.prepared},
                   {"duration_s", seconds},
                   {"bytes", bytes.load()},
                   {"throughput_gbps", gbps},
                   {"requests_per_s", requests_per_s},
                   {"memcpy_gbps", memcpy_gbps},
                   {"transport", transport},
                   {"p50_us", p50},
                   {"p99_us", p99},
                   {"batches", all.size()},
                   {"direct_batches", direct},
                   {"ucx_tls", o.ucx.tls},
                   {"peer_failure_detection", o.ucx.peer_failure_detection},
                   {"same_host_copy", o.ucx.same_host_copy},
                   {"progress_threads", transport::runs_progress_threads(o.ucx) ? 1 : 0},  // in effect, -1 resolved
                   {"ucx_settings", ucx_settings},
                   {"verified", true}};
  return emit_json("bench throughput", j.dump(2), o.json);
}

}  // namespace

Command add_bench_throughput(CLI::App& bench) {
  auto o = std::make_shared<ThroughputOptions>();
  CLI::App* app = bench.add_subcommand("throughput", "Batches of block reads/writes against a `baton serve` peer over UCX");
  app->add_option("--target", o->target, "A running `baton serve` (host:port)")->check(kHostPort);
  app->add_flag("--spawn", o->spawn, "Start a `baton serve` child on 127.0.0.1 and use it");
  app->add_option("--op", o->op, "read or write");
  app->add_option("--block-size", o->block_size, "Bytes per request (size)");
  app->add_option("--batch-size", o->batch_size, "Requests per batch")->check(CLI::Range(1, 1 << 16));
  app->add_option("--blocks", o->blocks,
                  "Distinct blocks per thread, request i on block i mod N (default: one per request; 1: every request "
                  "on one block, ucx_perftest's working set)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--threads", o->threads, "Submitting threads, one batch in flight each")->check(CLI::Range(1, 256));
  app->add_flag("--prepared", o->prepared,
                "Submit each thread's batch as an engine::PreparedBatch (resolved once, as perftest and NIXL's "
                "prepared transfers do) instead of a new Batch each time");
  app->add_option("--duration", o->duration, "How long to run (duration: 5s, 500ms …)")
      ->check(kPositiveDuration);
  add_ucx_options(*app, o->ucx);
  app->add_option("--policy-file", o->policy_file, "Scheduling policy YAML (configs/sched_policy.yaml)")
      ->check(kPolicyFile);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o] { return run_throughput(*o); }};
}

}  // namespace baton::cli
