// `baton bench dualpath|fault --transport ucx --spawn`: DualPath on the wall
// clock across processes. A `baton serve` is the prefill peer (the direct
// leg); a `baton store` holds the same bytes as KV blocks, put there over
// its RPC and the engine, and located with one QueryBlocksForTransfer whose
// session lock pins them for the run (the store leg). This process's engine
// races the legs into its own memory, one handoff per Poisson arrival, and
// checks every byte of every handoff. `fault` SIGKILLs the prefill peer
// right after a submit (so handoffs are in flight) and, at the restore time,
// points the direct leg at a second `baton serve` started at the outset with
// the same bytes: the prefill worker back under the same name.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "baton/common/units.h"
#include "baton/dualpath/dualpath.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "baton/plan/wire.h"
#include "baton/store/service.h"
#include "bench_dualpath.h"
#include "serve_child.h"

namespace baton::cli {
namespace {

using nlohmann::ordered_json;

constexpr std::uint64_t kMaxSlots = 16;               // distinct source ranges; handoffs cycle over them
constexpr std::uint64_t kMaxLocalBytes = 2ull << 30;  // every handoff lands in its own range here
constexpr TimeNs kIdleLimitNs = 60'000'000'000;
constexpr const char* kNamespace = "kv";
constexpr std::size_t kKillBurst = 16;
constexpr TimeNs kKillDelayNs = 1'000'000;

std::uint64_t block_hash(std::uint64_t b) { return 0xd0a1'0000'0000ull + b; }

// The direct leg's source: a `baton serve` and its buffer.
struct Prefill {
  engine::Peer peer;
  transport::RegionHandle region = 0;
};

// Everything one run stands on. The children are declared first so that
// they outlive the engine (it may still read them while it shuts down).
struct Rig {
  std::optional<ServeChild> prefill_child;
  std::optional<ServeChild> restarted_child;
  std::optional<ServeChild> store_child;
  std::vector<std::byte> local;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<store::StoreClient> client;
  std::uint64_t session = 0;
  engine::Region local_region;
  Prefill prefill;
  std::optional<Prefill> restarted;
  std::uint64_t handoff_bytes = 0;
  std::uint64_t slots = 0;
  std::vector<std::vector<dualpath::Source>> store_sources;  // per slot

  ~Rig() {
    if (client && session != 0) (void)client->release(session);
  }

  [[nodiscard]] std::uint64_t slot_of(std::size_t i) const { return i % slots; }

  [[nodiscard]] dualpath::HandoffRequest handoff(std::size_t i, const Prefill& direct) const {
    dualpath::HandoffRequest r;
    r.direct_from = "prefill";
    r.store_from = "store";
    r.bytes = handoff_bytes;
    r.qos = sched::QosClass::kHotKv;
    r.direct_sources = {{direct.peer.address, direct.region, slot_of(i) * handoff_bytes, handoff_bytes}};
    r.store_sources = store_sources[slot_of(i)];
    r.local_region = local_region.handle;
    r.local_offset = i * handoff_bytes;
    return r;
  }

  // Bytes of handoff i that differ from what the prefill peer holds there.
  [[nodiscard]] std::uint64_t wrong_bytes(std::size_t i) const {
    const auto got = std::span(local).subspan(i * handoff_bytes, handoff_bytes);
    const std::uint64_t first = slot_of(i) * handoff_bytes;
    if (!engine::pattern_mismatch(got, kServeSalt, first)) return 0;
    std::uint64_t n = 0;
    for (std::uint64_t k = 0; k < got.size(); ++k) n += got[k] != engine::pattern_byte(kServeSalt, first + k);
    return n;
  }
};

Result<Prefill> connect_prefill(engine::Engine& e, const ServeChild& child) {
  auto peer = e.connect(child.address());
  if (!peer) return std::unexpected(peer.error());
  if (Status s = e.refresh(*peer); !s.is_ok()) return std::unexpected(s);
  auto regions = e.remote_regions(*peer);
  if (!regions || regions->empty()) {
    return std::unexpected(regions ? Status::unavailable("the prefill peer {} exported no region", child.address())
                                   : regions.error());
  }
  const auto largest = std::ranges::max_element(*regions, {}, &transport::RemoteRegion::length);
  return Prefill{*peer, largest->key};
}

// The store leg's sources of every slot: block b's address from the plan's
// placements, located in the store's regions; neighbours merged.
Result<std::vector<std::vector<dualpath::Source>>> store_sources(Rig& rig, const std::string& store_address,
                                                                 const std::string& plan_wire,
                                                                 std::uint64_t block_bytes) {
  auto plan = plan::parse_plan(plan_wire);
  if (!plan) return std::unexpected(plan.error());
  std::vector<std::uint64_t> address(plan->blocks);
  for (const plan::Placement& p : plan->placements) {
    const plan::SegmentSchema& seg = plan->segment(p.slot, p.segment);
    for (std::uint32_t k = 0; k < p.block_count; ++k) {
      address[p.block_start + k * p.block_step] = plan->chunks[p.chunk].base + p.offset + k * seg.stride;
    }
  }
  auto peer = rig.engine->connect(store_address);
  if (!peer) return std::unexpected(peer.error());
  if (Status s = rig.engine->refresh(*peer); !s.is_ok()) return std::unexpected(s);
  auto regions = rig.engine->remote_regions(*peer);
  if (!regions) return std::unexpected(regions.error());
  const std::uint64_t per_slot = rig.handoff_bytes / block_bytes;
  std::vector<std::vector<dualpath::Source>> out(rig.slots);
  for (std::uint64_t b = 0; b < plan->blocks; ++b) {
    auto at = store::locate(*regions, address[b], block_bytes);
    if (!at) return std::unexpected(at.error());
    auto& sources = out[b / per_slot];
    if (!sources.empty() && sources.back().region == at->region &&
        sources.back().offset + sources.back().length == at->offset) {
      sources.back().length += block_bytes;
    } else {
      sources.push_back({peer->address, at->region, at->offset, block_bytes});
    }
  }
  return out;
}

Result<std::unique_ptr<Rig>> make_rig(const DualPathBenchOptions& o, const Workload& w, bool restartable) {
  if (!o.peer.spawn || !o.peer.target.empty()) {
    return std::unexpected(Status::invalid_argument(
        "--transport ucx needs --spawn (and no --target): the bench starts, kills and restarts its own peers"));
  }
  auto block = parse_size(o.block_size);
  if (!block) return std::unexpected(block.error());
  if (*block == 0 || w.bytes % *block != 0 || *block > (1u << 30)) {
    return std::unexpected(Status::invalid_argument(
        "--block-size {} must divide --handoff-size {} (and be at most 1 GiB)", o.block_size, o.handoff_size));
  }
  if (w.bytes > kMaxLocalBytes / static_cast<std::uint64_t>(o.requests)) {
    return std::unexpected(Status::invalid_argument(
        "{} handoffs of {} need {} here, above {}: lower --requests or --handoff-size", o.requests,
        format_size(w.bytes), format_size(w.bytes * static_cast<std::uint64_t>(o.requests)),
        format_size(kMaxLocalBytes)));
  }
  auto rig = std::make_unique<Rig>();
  rig->handoff_bytes = w.bytes;
  rig->slots = std::min<std::uint64_t>(kMaxSlots, static_cast<std::uint64_t>(o.requests));
  const std::uint64_t source_bytes = rig->slots * w.bytes;
  const std::uint64_t blocks = source_bytes / *block;
  if (blocks > std::numeric_limits<std::uint32_t>::max()) {
    return std::unexpected(Status::invalid_argument("{} blocks: raise --block-size", blocks));
  }

  if (o.prefill_memory != "caller" && o.prefill_memory != "engine") {
    return std::unexpected(
        Status::invalid_argument("--prefill-memory \"{}\": expected caller or engine", o.prefill_memory));
  }
  std::vector<std::string> serve = serve_args(source_bytes, o.peer.ucx);
  serve.insert(serve.end(), {"--memory", o.prefill_memory});
  auto prefill = ServeChild::start(serve);
  if (!prefill) return std::unexpected(prefill.error());
  rig->prefill_child.emplace(std::move(*prefill));
  if (restartable) {
    auto again = ServeChild::start(serve);
    if (!again) return std::unexpected(again.error());
    rig->restarted_child.emplace(std::move(*again));
  }
  auto store = ServeChild::start(
      {"--namespace", fmt::format("{}:1x1x{}:{}", kNamespace, *block, blocks), "--lock-timeout", "600s"},
      "/proc/self/exe", "", "store");
  if (!store) return std::unexpected(store.error());
  rig->store_child.emplace(std::move(*store));

  // The legs run on the loop (not copied inside submit) so that handoffs
  // are in flight, racing and killable, as they are between hosts.
  transport::UcxConfig ucx = o.peer.ucx;
  ucx.direct_copy_max_bytes = 0;
  auto e = engine::Engine::create({.ucx = ucx});
  if (!e) return std::unexpected(e.error());
  rig->engine = std::move(*e);
  rig->local.resize(w.bytes * static_cast<std::uint64_t>(o.requests));
  auto local = rig->engine->register_memory(rig->local.data(), rig->local.size());
  if (!local) return std::unexpected(local.error());
  rig->local_region = *local;
  auto p = connect_prefill(*rig->engine, *rig->prefill_child);
  if (!p) return std::unexpected(p.error());
  rig->prefill = *p;
  if (restartable) {
    auto r = connect_prefill(*rig->engine, *rig->restarted_child);
    if (!r) return std::unexpected(r.error());
    rig->restarted = *r;
  }

  // The prefill worker's bytes, put into the store as blocks.
  auto client = store::StoreClient::connect(rig->store_child->address());
  if (!client) return std::unexpected(client.error());
  rig->client = std::move(*client);
  std::vector<std::uint64_t> hashes(blocks);
  for (std::uint64_t b = 0; b < blocks; ++b) hashes[b] = block_hash(b);
  {
    std::vector<std::byte> staging(source_bytes);
    engine::fill_pattern(staging, kServeSalt);
    auto staged = rig->engine->register_memory(staging.data(), staging.size());
    if (!staged) return std::unexpected(staged.error());
    const store::BlockLayout layout{1, 1, static_cast<std::uint32_t>(*block)};
    Status put = rig->client->put(*rig->engine, kNamespace, "bench-prefill", hashes, layout, staged->handle);
    if (Status s = rig->engine->unregister(staged->handle); put.is_ok()) put = s;
    if (!put.is_ok()) return std::unexpected(put);
  }
  auto answer = rig->client->query(kNamespace, hashes, "bench-decode");
  if (!answer) return std::unexpected(answer.error());
  rig->session = answer->session;
  if (answer->found != blocks) {
    return std::unexpected(Status::internal("the store found {} of the {} blocks just put", answer->found, blocks));
  }
  auto hello = rig->client->hello();
  if (!hello) return std::unexpected(hello.error());
  auto sources = store_sources(*rig, hello->first, answer->plan, *block);
  if (!sources) return std::unexpected(sources.error());
  rig->store_sources = std::move(*sources);
  return rig;
}

dualpath::DualPathConfig wall_config(const DualPathBenchOptions& o, dualpath::Strategy strategy, std::uint64_t block) {
  dualpath::DualPathConfig c;
  c.strategy = strategy;
  c.seed = o.seed;
  c.piece_bytes = block;
  // Real time: a probe every 2 ms, backoff from 200 µs to 20 ms, and a
  // handoff that no leg can carry gives up after 5 s.
  c.probe_interval_ns = 2'000'000;
  c.backoff_initial_ns = 200'000;
  c.backoff_max_ns = 20'000'000;
  c.hedge_delay_min_ns = 50'000;
  c.default_timeout_ns = 5'000'000'000;
  return c;
}

ordered_json workload_json(const DualPathBenchOptions& o, const Workload& w, const Rig& rig) {
  return {{"transport", "ucx"},
          {"direct", fmt::format("baton serve {} (prefill)", rig.prefill.peer.address)},
          {"store", fmt::format("baton store {} ({} blocks of {})", rig.store_child->address(),
                                rig.slots * rig.handoff_bytes / parse_size(o.block_size).value_or(1), o.block_size)},
          {"link", rig.prefill.peer.transport},
          {"prefill_memory", o.prefill_memory},
          {"handoff_bytes", w.bytes},
          {"duration_ms", o.duration_ms},
          {"arrivals", "poisson"},
          {"seed", o.seed}};
}

// What every handoff ended with, checked byte by byte.
struct Outcome {
  std::vector<dualpath::HandoffStatus> status;  // per handoff, in submit order
  std::uint64_t completed = 0;
  std::uint64_t lost_bytes = 0;  // not landed, or landed wrong
  bool verified = true;          // every handoff completed, every byte right
};

Result<Outcome> outcome(const Rig& rig, const dualpath::DualPath& dual, const std::vector<dualpath::HandoffId>& ids) {
  Outcome out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto st = dual.status(ids[i]);
    if (!st) return std::unexpected(st.error());
    const bool ok = st->state == dualpath::HandoffState::kCompleted;
    out.completed += ok;
    const std::uint64_t wrong = ok ? rig.wrong_bytes(i) : st->bytes - st->bytes_landed;
    out.lost_bytes += wrong;
    out.verified = out.verified && ok && wrong == 0;
    out.status.push_back(*st);
  }
  return out;
}

// After the JSON: a handoff that did not complete, or a byte that landed
// wrong, fails the run (exit 1), as a failed data check does everywhere.
int verdict(std::string_view mode, const Outcome& out) {
  if (out.verified) return 0;
  fmt::print(stderr, "baton bench {}: FAILED: {} of {} handoffs completed; {} not landed or landed wrong\n", mode,
             out.completed, out.status.size(), format_size(out.lost_bytes));
  return 1;
}

// The same arrivals as plain engine batches from one leg (pieces of the
// same size), each handoff's latency from its submit to its last piece.
Result<std::vector<double>> run_single_leg(Rig& rig, const Workload& w, std::uint64_t block, bool direct) {
  std::vector<std::pair<engine::BatchHandle, TimeNs>> sent;
  const TimeNs t0 = rig.engine->now_ns();
  for (std::size_t i = 0; i < w.at_ns.size(); ++i) {
    while (rig.engine->now_ns() < t0 + w.at_ns[i]) std::this_thread::yield();
    dualpath::HandoffRequest h = rig.handoff(i, rig.prefill);
    engine::Batch batch;
    std::uint64_t at = 0;
    for (const dualpath::Source& s : direct ? h.direct_sources : h.store_sources) {
      for (std::uint64_t k = 0; k < s.length; k += block) {
        batch.requests.push_back({.op = engine::Op::kRead, .local_region = h.local_region,
                                  .local_offset = h.local_offset + at + k, .peer = s.peer, .remote_region = s.region,
                                  .remote_offset = s.offset + k, .length = std::min(block, s.length - k),
                                  .qos = h.qos});
      }
      at += s.length;
    }
    const TimeNs submitted = rig.engine->now_ns();
    auto handle = rig.engine->submit(batch);
    if (!handle) return std::unexpected(handle.error());
    sent.emplace_back(*handle, submitted);
  }
  std::vector<double> latencies_us;
  for (auto [handle, submitted] : sent) {
    if (Status s = rig.engine->wait(handle, kIdleLimitNs); !s.is_ok()) return std::unexpected(s);
    auto st = rig.engine->poll(handle);
    if (!st) return std::unexpected(st.error());
    (void)rig.engine->release(handle);
    if (!st->status.is_ok()) continue;  // a miss: not in the latencies, and the count shows it
    TimeNs last = submitted;
    for (const sched::RequestStatus& r : st->requests) last = std::max(last, r.completed_ns);
    latencies_us.push_back(static_cast<double>(last - submitted) / 1e3);
  }
  return latencies_us;
}


}  // namespace

int run_dualpath_ucx(const DualPathBenchOptions& o, const Workload& w) {
  constexpr std::string_view kMode = "dualpath";
  auto strategy = dualpath::parse_strategy(o.strategy.empty() ? "hedge" : o.strategy);
  if (!strategy) return fail_bench(kMode, strategy.error());
  auto rig = make_rig(o, w, false);
  if (!rig) return fail_bench(kMode, rig.error());
  const std::uint64_t block = parse_size(o.block_size).value_or(w.bytes);
  std::vector<dualpath::HandoffId> ids;
  std::optional<Outcome> out;
  dualpath::DualPathStats stats;
  {
    auto dual = dualpath::DualPath::create(*(*rig)->engine, wall_config(o, *strategy, block));
    if (!dual) return fail_bench(kMode, dual.error());
    const TimeNs t0 = (*rig)->engine->now_ns();
    for (std::size_t i = 0; i < w.at_ns.size(); ++i) {
      if (Status s = (*dual)->run_until(t0 + w.at_ns[i]); !s.is_ok()) return fail_bench(kMode, s);
      auto id = (*dual)->submit((*rig)->handoff(i, (*rig)->prefill));
      if (!id) return fail_bench(kMode, id.error());
      ids.push_back(*id);
    }
    if (Status s = (*dual)->run_until_idle(kIdleLimitNs); !s.is_ok()) return fail_bench(kMode, s);
    auto o2 = outcome(**rig, **dual, ids);
    if (!o2) return fail_bench(kMode, o2.error());
    out = std::move(*o2);
    stats = (*dual)->stats();
  }
  std::vector<double> raced;
  for (const dualpath::HandoffStatus& st : out->status) {
    if (st.state == dualpath::HandoffState::kCompleted) {
      raced.push_back(static_cast<double>(st.completed_ns - st.submitted_ns) / 1e3);
    }
  }
  auto direct = run_single_leg(**rig, w, block, true);
  if (!direct) return fail_bench(kMode, direct.error());
  auto store = run_single_leg(**rig, w, block, false);
  if (!store) return fail_bench(kMode, store.error());

  ordered_json j = race_json(o.requests, *strategy, stats, raced, *direct, *store);
  j["verified"] = out->verified;
  j["lost_bytes"] = out->lost_bytes;
  j["workload"] = workload_json(o, w, **rig);
  if (o.json_path != "-") {
    fmt::print("{} handoffs of {} over real processes ({}): direct won {}, store won {}, {} legs cancelled, {} "
               "wasted; verified {}, {} lost\n",
               o.requests, format_size(w.bytes), dualpath::to_string(*strategy), stats.wins_direct, stats.wins_store,
               stats.cancelled_legs, format_size(stats.wasted_bytes), out->verified, format_size(out->lost_bytes));
    print_latencies(j["latency_us"]);
  }
  if (int rc = write_bench_json(kMode, j, o.json_path); rc != 0) return rc;
  return verdict(kMode, *out);
}

int run_fault_ucx(const DualPathBenchOptions& o, const Workload& w) {
  constexpr std::string_view kMode = "fault";
  auto strategy = dualpath::parse_strategy(o.strategy.empty() ? "failover_only" : o.strategy);
  if (!strategy) return fail_bench(kMode, strategy.error());
  auto made = make_rig(o, w, true);
  if (!made) return fail_bench(kMode, made.error());
  Rig& rig = **made;
  const std::uint64_t block = parse_size(o.block_size).value_or(w.bytes);
  auto dual = dualpath::DualPath::create(*rig.engine, wall_config(o, *strategy, block));
  if (!dual) return fail_bench(kMode, dual.error());

  const TimeNs t0 = rig.engine->now_ns();
  const TimeNs kill_ns = t0 + static_cast<TimeNs>(o.kill_at_ms * 1e6);
  const TimeNs restore_ns = t0 + static_cast<TimeNs>(o.restore_at_ms * 1e6);
  const Prefill* direct = &rig.prefill;
  std::vector<dualpath::HandoffId> ids;
  // At the kill time the next kKillBurst arrivals are submitted at once, and
  // another thread SIGKILLs the peer kKillDelayNs into that burst: handoffs
  // are in flight on the direct leg when it dies.
  std::atomic<TimeNs> killed_ns{0};
  std::thread killer;
  for (std::size_t i = 0; i < w.at_ns.size(); ++i) {
    const TimeNs at = t0 + w.at_ns[i];
    const bool kill_now = !killer.joinable() && at >= kill_ns;
    if (Status s = (*dual)->run_until(kill_now ? kill_ns : at); !s.is_ok()) return fail_bench(kMode, s);
    // Restored once asked for and once the kill was sent: a restore asked
    // for within the burst's delay came before the kill it undoes.
    if (killer.joinable() && killed_ns.load() != 0 && rig.engine->now_ns() >= restore_ns) direct = &*rig.restarted;
    if (kill_now) {
      killer = std::thread([&rig, &killed_ns] {
        std::this_thread::sleep_for(std::chrono::nanoseconds(kKillDelayNs));
        killed_ns = rig.engine->now_ns();
        rig.prefill_child->kill();
      });
    }
    const std::size_t burst = kill_now ? std::min(kKillBurst, w.at_ns.size() - i) : 1;
    for (std::size_t k = 0; k < burst; ++k, ++i) {
      auto id = (*dual)->submit(rig.handoff(i, *direct));
      if (!id) return fail_bench(kMode, id.error());
      ids.push_back(*id);
    }
    --i;
  }
  if (killer.joinable()) {
    killer.join();
  } else {  // no arrival at or after the kill time: the peer still dies at that time
    if (Status s = (*dual)->run_until(kill_ns); !s.is_ok()) return fail_bench(kMode, s);
    killed_ns = rig.engine->now_ns();
    rig.prefill_child->kill();
  }
  if (Status s = (*dual)->run_until_idle(kIdleLimitNs); !s.is_ok()) return fail_bench(kMode, s);
  auto out = outcome(rig, **dual, ids);
  if (!out) return fail_bench(kMode, out.error());

  const TimeNs kill = killed_ns.load();  // when it was sent, not when it was asked for
  const TimeNs restored = std::max(restore_ns, kill);  // likewise: never before the kill
  ordered_json timeline = ordered_json::array();
  std::optional<TimeNs> recovery_ns, returned_ns, first_affected_submit_ns, detected_ns;
  int affected = 0;
  int in_flight_at_fault = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const dualpath::HandoffStatus& st = out->status[i];
    const bool ok = st.state == dualpath::HandoffState::kCompleted;
    const bool hit = st.failovers > 0 || (st.submitted_ns >= kill && st.submitted_ns < restored);
    affected += hit;
    in_flight_at_fault += st.submitted_ns <= kill && (!st.ended() || st.completed_ns > kill);
    // Recovery: from the kill to the first byte the store leg delivered for
    // a handoff the fault hit.
    if (hit && st.first_store_byte_ns >= kill && (!recovery_ns || st.first_store_byte_ns - kill < *recovery_ns)) {
      recovery_ns = st.first_store_byte_ns - kill;
      first_affected_submit_ns = st.submitted_ns - t0;
    }
    if (st.first_failover_ns >= kill) {
      detected_ns = std::min(detected_ns.value_or(st.first_failover_ns - kill), st.first_failover_ns - kill);
    }
    if (ok && st.winner == dualpath::Leg::kDirect && st.submitted_ns >= restored) {
      returned_ns = std::min(returned_ns.value_or(st.completed_ns - t0), st.completed_ns - t0);
    }
    timeline.push_back({{"id", ids[i]},
                        {"start_us", static_cast<double>(st.submitted_ns - t0) / 1e3},
                        {"end_us", static_cast<double>(st.completed_ns - t0) / 1e3},
                        {"leg", std::string(dualpath::to_string(st.winner))},
                        {"status", std::string(dualpath::to_string(st.state))},
                        {"failovers", st.failovers},
                        {"bytes_direct", st.bytes_direct},
                        {"bytes_store", st.bytes_store}});
  }
  const dualpath::DualPathStats& s = (*dual)->stats();
  ordered_json j;
  j["requests"] = o.requests;
  j["completed"] = out->completed;
  j["dropped"] = static_cast<std::uint64_t>(o.requests) - out->completed;
  j["recovery_us"] = us_or_null(recovery_ns);
  j["returned_to_direct_at_us"] = us_or_null(returned_ns);
  j["kill_at_us"] = static_cast<double>(kill - t0) / 1e3;
  j["restore_at_us"] = static_cast<double>(restored - t0) / 1e3;
  j["strategy"] = std::string(dualpath::to_string(*strategy));
  j["affected"] = affected;
  j["in_flight_at_fault"] = in_flight_at_fault;
  j["first_affected_submitted_us"] = us_or_null(first_affected_submit_ns);
  // From the kill to the first failover: when this engine learnt of the death
  // (or later, when no handoff was there to fail over).
  j["first_failover_us"] = us_or_null(detected_ns);
  j["failovers"] = s.failovers;
  j["retries"] = s.retries;
  j["probes"] = s.probes;
  j["wasted_bytes"] = s.wasted_bytes;
  j["verified"] = out->verified;
  j["lost_bytes"] = out->lost_bytes;
  j["workload"] = workload_json(o, w, rig);
  j["timeline"] = timeline;
  if (o.json_path != "-") {
    fmt::print("{} handoffs of {}, prefill SIGKILLed at {:.1f} ms, restarted peer from {:.1f} ms ({}): {} completed, "
               "{} dropped, verified {}, {} lost\n",
               o.requests, format_size(w.bytes), static_cast<double>(kill - t0) / 1e6, o.restore_at_ms,
               dualpath::to_string(*strategy), out->completed, o.requests - static_cast<int>(out->completed),
               out->verified, format_size(out->lost_bytes));
    fmt::print("  {} in flight at the kill, {} affected; {}; {}; {} failovers, {} probes\n", in_flight_at_fault,
               affected, at_or_never(j["recovery_us"], "recovery (kill -> first store byte)", "no recovery after the kill"),
               at_or_never(j["returned_to_direct_at_us"], "back on direct at", "never back on direct"), s.failovers,
               s.probes);
  }
  if (int rc = write_bench_json(kMode, j, o.json_path); rc != 0) return rc;
  return verdict(kMode, *out);
}

}  // namespace baton::cli
