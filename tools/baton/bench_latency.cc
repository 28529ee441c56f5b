// `baton bench latency`: one request at a time against a `baton serve` peer,
// like `ucx_perftest -t ucp_get -O 1` (and ucp_put_lat): what a decode step
// waiting for one small block sees. Each sample is submit → wait → poll of a
// one-request batch, the release outside the clock (--run: one
// Engine::run, which releases too). The bytes are checked at the end, as in
// `bench throughput`. With --beside-batch, another thread keeps a batch of
// that many prefill_bulk reads running meanwhile (a connector pulling a KV
// cache of many small blocks, one request each), and the measured requests
// are what a decode step beside it waits for.
#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/engine/pattern.h"
#include "baton/sched/scheduler.h"
#include "bench_peer.h"
#include "commands.h"
#include "json_output.h"
#include "sample_clock.h"
#include "serve_child.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

constexpr std::uint64_t kWriteSalt = 1;
// The beside batches' requests cycle over this much of the buffer.
constexpr std::uint64_t kBesideBytes = 64ULL << 20;

struct LatencyOptions {
  BenchPeerOptions peer;
  std::string op = "read";
  std::string block_size = "4KiB";
  int iterations = 20'000;
  int warmup = 1'000;
  bool prepared = false;
  bool run = false;
  std::string deadline;  // duration; empty: none
  int beside_batch = 0;  // requests per beside batch; 0: none
  std::string beside_block = "4KiB";
  std::string json;
};

// Batches of `requests` prefill_bulk reads of `block` bytes, one after
// another until stopped, over [offset, offset + bytes) of the buffer.
class BesideBatches {
 public:
  BesideBatches(BenchPeer& bp, int requests, std::uint64_t block, std::uint64_t offset, std::uint64_t bytes) {
    const std::uint64_t blocks = bytes / block;
    for (int i = 0; i < requests; ++i) {
      const std::uint64_t at = offset + (static_cast<std::uint64_t>(i) % blocks) * block;
      batch_.requests.push_back(bp.request(engine::Op::kRead, at, block));
    }
    thread_ = std::thread([this, &bp] {
      engine::Engine& e = bp.engine();
      engine::BatchStatus st;
      while (!stop_.load()) {
        auto h = e.submit(batch_);
        submitted_.store(true);
        Status s = h ? e.wait(*h, 600'000'000'000) : h.error();
        if (s.is_ok()) s = e.poll(*h, st);
        if (s.is_ok()) s = st.status;
        if (h) (void)e.release(*h);
        if (!s.is_ok()) {
          failure_ = s;
          return;
        }
        batches_.fetch_add(1);
      }
    });
    // The measuring starts once the first batch is in: it has one beside it.
    while (!submitted_.load()) std::this_thread::yield();
  }
  ~BesideBatches() { (void)stop(); }
  // Waits for the batch under way (so at least one completed, or failed);
  // then the failure of one, if any.
  Status stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return failure_;
  }
  [[nodiscard]] std::uint64_t batches() const { return batches_.load(); }

 private:
  engine::Batch batch_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> submitted_{false};  // the first batch (or its refusal)
  std::atomic<std::uint64_t> batches_{0};
  Status failure_;
  std::thread thread_;
};

int run_latency(const LatencyOptions& o) {
  auto fail = [](int code, const std::string& why) {
    fmt::print(stderr, "baton bench latency: {}\n", why);
    return code;
  };
  if (o.op != "read" && o.op != "write") return fail(2, fmt::format("--op \"{}\": expected read or write", o.op));
  const engine::Op op = o.op == "read" ? engine::Op::kRead : engine::Op::kWrite;
  auto block = parse_size(o.block_size);
  if (!block) return fail(2, fmt::format("--block-size: {}", block.error().message()));
  if (*block == 0 || *block > (std::uint64_t{1} << 30)) return fail(2, "--block-size must be in (0, 1 GiB]");
  TimeNs deadline_ns = 0;
  if (!o.deadline.empty()) {
    auto d = parse_flag_duration(o.deadline);
    if (!d) return fail(2, fmt::format("--deadline: {}", d.error().message()));
    if (*d <= 0) return fail(2, "--deadline must be above 0");
    if (o.prepared) return fail(2, "--deadline needs a new request each time: not with --prepared");
    deadline_ns = *d;
  }
  std::uint64_t beside_block = 0;
  if (o.beside_batch > 0) {
    auto b = parse_size(o.beside_block);
    if (!b) return fail(2, fmt::format("--beside-block: {}", b.error().message()));
    if (*b == 0 || *b > kBesideBytes) return fail(2, fmt::format("--beside-block must be in (0, {}]", format_size(kBesideBytes)));
    beside_block = *b;
  }
  const std::uint64_t beside_bytes = beside_block == 0 ? 0 : kBesideBytes / beside_block * beside_block;

  auto opened = BenchPeer::open(o.peer, *block + beside_bytes);
  if (!opened) return fail(exit_code(opened.error()), opened.error().to_string());
  BenchPeer& bp = *opened;
  std::span<std::byte> buffer = bp.buffer().subspan(0, *block);  // the measured block
  if (op == engine::Op::kWrite) {
    engine::fill_pattern(buffer, kWriteSalt);
  } else {
    std::ranges::fill(buffer, std::byte{0});
  }
  engine::Batch batch{{bp.request(op, 0, *block)}, {}};
  // Beside bulk batches, a decode step's block (alone, the class changes nothing).
  if (o.beside_batch > 0) batch.requests[0].qos = sched::QosClass::kDecodeCritical;
  engine::PreparedBatch prepared(o.prepared ? batch : engine::Batch{});
  std::optional<BesideBatches> beside;
  if (o.beside_batch > 0) beside.emplace(bp, o.beside_batch, beside_block, *block, beside_bytes);
  std::uint64_t misses = 0;

  SampleClock clock;
  std::vector<std::uint64_t> ticks;
  ticks.reserve(static_cast<std::size_t>(o.iterations));
  engine::BatchStatus st;  // reused, as a connector's poll loop would
  for (int i = 0; i < o.warmup + o.iterations; ++i) {
    if (i == o.warmup) clock.start();
    if (deadline_ns > 0) batch.requests[0].deadline_ns = bp.engine().now_ns() + deadline_ns;
    const std::uint64_t t0 = clock.now();
    Status s;
    if (o.run) {
      s = o.prepared ? bp.engine().run(prepared) : bp.engine().run(batch);
    } else {
      auto h = o.prepared ? bp.engine().submit(prepared) : bp.engine().submit(batch);
      s = h ? bp.engine().wait(*h, 60'000'000'000) : h.error();
      if (s.is_ok()) {
        s = bp.engine().poll(*h, st);
        if (s.is_ok()) s = st.status;
      }
      const std::uint64_t t1 = clock.now();
      if (h) (void)bp.engine().release(*h);  // outside the sample, as documented above
      if (!s.is_ok()) return fail(1, fmt::format("request {} failed: {}", i, s.to_string()));
      if (i >= o.warmup) {
        ticks.push_back(t1 - t0);
        misses += deadline_ns > 0 && st.requests[0].deadline_missed() ? 1 : 0;
      }
      continue;
    }
    const std::uint64_t t1 = clock.now();
    if (!s.is_ok()) return fail(1, fmt::format("request {} failed: {}", i, s.to_string()));
    if (i >= o.warmup) {
      ticks.push_back(t1 - t0);
      misses += deadline_ns > 0 && bp.engine().now_ns() > batch.requests[0].deadline_ns ? 1 : 0;
    }
  }
  clock.stop();
  if (beside) {
    if (Status s = beside->stop(); !s.is_ok()) return fail(1, fmt::format("a beside batch failed: {}", s.to_string()));
  }
  const std::uint64_t beside_batches = beside ? beside->batches() : 0;
  std::vector<double> us;
  us.reserve(ticks.size());
  for (const std::uint64_t t : ticks) us.push_back(clock.to_us(t));

  std::uint64_t salt = kServeSalt;
  if (op == engine::Op::kWrite) {
    std::ranges::fill(buffer, std::byte{0});
    if (Status s = bp.run({{bp.request(engine::Op::kRead, 0, *block)}, {}}); !s.is_ok()) {
      return fail(1, fmt::format("reading back for the check failed: {}", s.to_string()));
    }
    salt = kWriteSalt;
  }
  if (auto bad = engine::pattern_mismatch(buffer, salt); bad) {
    return fail(1, fmt::format("data check FAILED at byte {} of {}", *bad, buffer.size()));
  }
  const std::string transport = bp.peer().transport;
  // What to run ucx_perftest with to compare like with like (scripts/bench-vs-perftest).
  const auto chosen = bp.engine().ucx_settings();
  const std::map<std::string, std::string> ucx_settings(chosen.begin(), chosen.end());  // a JSON object
  if (Status s = bp.close(); !s.is_ok()) return fail(1, s.message());

  auto p999 = percentile(us, 99.9);
  auto summary = summarize(us);
  if (!summary || !p999) return fail(1, "no samples");
  fmt::print("op {} block {} over {} (tls {}): {} requests one at a time, data verified\n", o.op, *block, transport,
             o.peer.ucx.tls.empty() ? "default" : o.peer.ucx.tls, us.size());
  fmt::print("latency us: p50 {:.2f}, p99 {:.2f}, p99.9 {:.2f}, mean {:.2f}, min {:.2f}, max {:.2f}\n", summary->p50,
             summary->p99, *p999, summary->mean, summary->min, summary->max);
  if (deadline_ns > 0) fmt::print("deadline {}: {} of {} missed\n", o.deadline, misses, us.size());
  if (beside) {
    fmt::print("beside: batches of {} reads of {} B, {} completed (the last after the measuring)\n", o.beside_batch,
               beside_block, beside_batches);
  }
  nlohmann::json j{{"op", o.op},
                   {"block_size", *block},
                   {"requests", us.size()},
                   {"warmup", o.warmup},
                   {"prepared", o.prepared},
                   {"run", o.run},
                   {"clock", clock.name()},
                   {"elapsed_us", clock.elapsed_us()},
                   {"p50_us", summary->p50},
                   {"p99_us", summary->p99},
                   {"p999_us", *p999},
                   {"mean_us", summary->mean},
                   {"min_us", summary->min},
                   {"max_us", summary->max},
                   {"deadline_us", static_cast<double>(deadline_ns) / 1e3},
                   {"deadline_misses", misses},
                   {"beside_batch", o.beside_batch},
                   {"beside_block", beside_block},
                   {"beside_batches", beside_batches},
                   {"transport", transport},
                   {"ucx_tls", o.peer.ucx.tls},
                   {"same_host_copy", o.peer.ucx.same_host_copy},
                   {"progress_threads", transport::runs_progress_threads(o.peer.ucx) ? 1 : 0},  // in effect, -1 resolved
                   {"ucx_settings", ucx_settings},
                   {"verified", true}};
  return emit_json("bench latency", j.dump(2), o.json);
}

}  // namespace

Command add_bench_latency(CLI::App& bench) {
  auto o = std::make_shared<LatencyOptions>();
  CLI::App* app = bench.add_subcommand("latency", "One request at a time against a `baton serve` peer: p50/p99/p99.9");
  app->add_option("--target", o->peer.target, "A running `baton serve` (host:port)")->check(kHostPort);
  app->add_flag("--spawn", o->peer.spawn, "Start a `baton serve` child on 127.0.0.1 and use it");
  app->add_option("--op", o->op, "read or write");
  app->add_option("--block-size", o->block_size, "Bytes per request (size)");
  app->add_option("--iterations", o->iterations, "Requests measured")->check(CLI::Range(1, 10'000'000));
  app->add_option("--warmup", o->warmup, "Requests run before the clock starts")->check(CLI::Range(0, 10'000'000));
  app->add_flag("--prepared", o->prepared, "Submit the request as an engine::PreparedBatch (resolved once)");
  app->add_flag("--run", o->run, "Each sample is one Engine::run() (submit, wait and release in one call)");
  app->add_option("--deadline", o->deadline,
                  "Each request's deadline after its submit (duration); misses are counted (not with --prepared)");
  app->add_option("--beside-batch", o->beside_batch,
                  "Meanwhile, another thread runs batches of this many prefill_bulk reads, one after another "
                  "(a connector's pull of many small blocks); the measured requests are then decode_critical")
      ->check(CLI::Range(0, 10'000'000));
  app->add_option("--beside-block", o->beside_block, "Bytes per beside read (size, at most 64 MiB)");
  add_ucx_options(*app, o->peer.ucx);
  app->add_option("--policy-file", o->peer.policy_file, "Scheduling policy YAML (configs/sched_policy.yaml)")
      ->check(kPolicyFile);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o] { return run_latency(*o); }};
}

}  // namespace baton::cli
