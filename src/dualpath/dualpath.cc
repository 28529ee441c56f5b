// DualPath over its legs (legs.h: the simulation harness or a real Engine).
// A handoff owns a ledger of the byte ranges that have landed at the
// destination (`landed`, in handoff offsets) and a list of runs, each
// carrying one contiguous range of the handoff on one leg. The handoff is
// complete when `landed` covers [0, bytes). A run that ends is settled only
// once nothing it posted can still land, so a byte is either landed, owned
// by a run that may still land it, or free to send: a failover sends exactly
// the free ranges, never one that landed or may still land.
#include "baton/dualpath/dualpath.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "legs.h"

namespace baton::dualpath {
namespace {

using sched::ByteRange;
using detail::RunId;
using sched::RequestState;

using Ranges = std::vector<ByteRange>;  // sorted, disjoint, merged

// A delay computed in double, as nanoseconds: beyond int64 the cast is
// undefined (x86 gives INT64_MIN, so a huge hedge factor hedged at once).
TimeNs saturated_ns(double ns) {
  if (!(ns < 9.2e18)) return INT64_MAX;  // NaN too
  return static_cast<TimeNs>(ns);
}

void add(Ranges& rs, ByteRange r) {
  if (r.length == 0) return;
  auto it = std::ranges::upper_bound(rs, r.offset, {}, &ByteRange::offset);
  if (it != rs.begin() && std::prev(it)->offset + std::prev(it)->length >= r.offset) {
    --it;
    it->length = std::max(it->offset + it->length, r.offset + r.length) - it->offset;
  } else {
    it = rs.insert(it, r);
  }
  auto next = std::next(it);
  while (next != rs.end() && next->offset <= it->offset + it->length) {
    it->length = std::max(it->offset + it->length, next->offset + next->length) - it->offset;
    next = rs.erase(next);
  }
}

// Bytes of `r` inside `rs`.
std::uint64_t overlap(const Ranges& rs, ByteRange r) {
  std::uint64_t n = 0;
  for (const ByteRange& x : rs) {
    const std::uint64_t lo = std::max(x.offset, r.offset);
    const std::uint64_t hi = std::min(x.offset + x.length, r.offset + r.length);
    if (lo < hi) n += hi - lo;
  }
  return n;
}

// The parts of `r` not in `rs`.
Ranges subtract(ByteRange r, const Ranges& rs) {
  Ranges out;
  std::uint64_t at = r.offset;
  const std::uint64_t end = r.offset + r.length;
  for (const ByteRange& x : rs) {
    if (x.offset + x.length <= at) continue;
    if (x.offset >= end) break;
    if (x.offset > at) out.push_back({at, x.offset - at});
    at = std::max(at, x.offset + x.length);
  }
  if (at < end) out.push_back({at, end - at});
  return out;
}

std::uint64_t total(const Ranges& rs) {
  std::uint64_t n = 0;
  for (const ByteRange& r : rs) n += r.length;
  return n;
}

constexpr TimeNs kNever = -1;

struct Run {
  RunId id = 0;
  Leg leg = Leg::kDirect;
  std::uint64_t base = 0;  // handoff offset of the run's byte 0
  std::uint64_t length = 0;
  bool cancelled = false;
  Ranges credited;  // run offsets already credited to the ledger
};

struct Handoff {
  HandoffId id = 0;
  HandoffRequest spec;
  HandoffStatus status;
  TimeNs end_by_ns = 0;
  Ranges landed;
  std::vector<Run> runs;  // not yet settled
  TimeNs hedge_at_ns = kNever;
  TimeNs retry_at_ns = kNever;
  int attempts = 0;
  std::optional<Leg> failed_leg;  // the leg whose run just failed: the next dispatch is a failover
  std::optional<Leg> completed_by;  // the leg whose bytes made the copy complete
  [[nodiscard]] const std::string& from(Leg leg) const {
    return leg == Leg::kDirect ? spec.direct_from : spec.store_from;
  }
};

struct LegHealth {
  bool excluded = false;
  TimeNs next_probe_ns = 0;
  std::optional<RunId> probe;  // in flight
  int successes = 0;
  HandoffId latest = 0;  // the last handoff that named this leg: what a probe imitates
  Leg leg = Leg::kDirect;
};

const char* const kCounters[][2] = {
    {"baton_dualpath_completed_total", "Handoffs completed"},
    {"baton_dualpath_failed_total", "Handoffs that ended failed (both legs down past the timeout, or cancelled)"},
    {"baton_dualpath_failovers_total", "Times a handoff's missing bytes moved to the other leg after a failure"},
    {"baton_dualpath_retries_total", "Backoff rounds while both legs were down"},
    {"baton_dualpath_cancelled_legs_total", "Legs cancelled because the other leg completed the copy"},
    {"baton_dualpath_wasted_bytes_total", "Bytes landed twice (hedge losers) or stopped on the wire"},
    {"baton_dualpath_probes_total", "Health probes sent on a soft-excluded leg"},
    {"baton_dualpath_probes_failed_total", "Health probes that failed"},
    {"baton_dualpath_exclusions_total", "Legs soft-excluded after a failure"},
    {"baton_dualpath_readmissions_total", "Legs re-admitted after probes succeeded"},
};

}  // namespace

std::string_view to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kHedge: return "hedge";
    case Strategy::kRequestHedging: return "request_hedging";
    case Strategy::kFailoverOnly: return "failover_only";
  }
  return "?";
}

Result<Strategy> parse_strategy(std::string_view name) {
  for (Strategy s : {Strategy::kHedge, Strategy::kRequestHedging, Strategy::kFailoverOnly}) {
    if (name == to_string(s)) return s;
  }
  return std::unexpected(Status::invalid_argument(
      "dualpath: strategy \"{}\" does not exist (expected hedge, request_hedging or failover_only)", name));
}

std::string_view to_string(Leg leg) { return leg == Leg::kDirect ? "direct" : "store"; }

std::string_view to_string(HandoffState state) {
  switch (state) {
    case HandoffState::kRunning: return "running";
    case HandoffState::kBackoff: return "backoff";
    case HandoffState::kCompleted: return "completed";
    case HandoffState::kFailed: return "failed";
    case HandoffState::kCancelled: return "cancelled";
  }
  return "?";
}

Status DualPathConfig::validate() const {
  auto bad = [](std::string_view field, auto value, std::string_view expected) {
    return Status::invalid_argument("dualpath config: {} is {}, expected {}", field, value, expected);
  };
  if (hedge_delay_ns < 0) return bad("hedge_delay_ns", hedge_delay_ns, ">= 0 (0: derived from the expected time)");
  if (!(hedge_factor > 0) || !std::isfinite(hedge_factor)) return bad("hedge_factor", hedge_factor, "> 0");
  if (hedge_delay_min_ns < 0) return bad("hedge_delay_min_ns", hedge_delay_min_ns, ">= 0");
  if (backoff_initial_ns <= 0) return bad("backoff_initial_ns", backoff_initial_ns, "> 0");
  if (backoff_max_ns < backoff_initial_ns) return bad("backoff_max_ns", backoff_max_ns, ">= backoff_initial_ns");
  if (!(backoff_multiplier >= 1) || !std::isfinite(backoff_multiplier)) {
    return bad("backoff_multiplier", backoff_multiplier, ">= 1");
  }
  if (!(backoff_jitter >= 0 && backoff_jitter < 1)) return bad("backoff_jitter", backoff_jitter, "in [0, 1)");
  if (default_timeout_ns <= 0) return bad("default_timeout_ns", default_timeout_ns, "> 0");
  if (probe_interval_ns <= 0) return bad("probe_interval_ns", probe_interval_ns, "> 0");
  if (probe_bytes == 0) return bad("probe_bytes", probe_bytes, "> 0");
  if (piece_bytes == 0) return bad("piece_bytes", piece_bytes, "> 0");
  if (probe_successes < 1) return bad("probe_successes", probe_successes, ">= 1");
  if (strategy != Strategy::kHedge && strategy != Strategy::kRequestHedging && strategy != Strategy::kFailoverOnly) {
    return bad("strategy", static_cast<int>(strategy), "hedge, request_hedging or failover_only");
  }
  return Status::ok();
}

struct DualPath::State {
  State(std::unique_ptr<detail::Legs> l, DualPathConfig c)
      : legs_(std::move(l)), engine(*legs_), config(std::move(c)), rng(config.seed) {
    for (const auto& [name, help] : kCounters) (void)engine.metrics().declare_counter(name, help);
    (void)engine.metrics().declare_counter("baton_dualpath_wins_total", "Handoffs completed, by the leg that won");
  }

  std::unique_ptr<detail::Legs> legs_;
  detail::Legs& engine;
  DualPathConfig config;
  std::mt19937_64 rng;
  std::map<HandoffId, Handoff> handoffs;
  std::vector<HandoffId> active;  // not ended, or ended with runs still draining
  std::map<std::string, LegHealth> legs;  // "from|to"
  HandoffId next_id = 1;
  DualPathStats stats;

  static std::string leg_key(const std::string& from, const std::string& to) { return from + "|" + to; }

  void count(const char* name, std::uint64_t delta = 1) {
    if (delta != 0) engine.metrics().add(name, {}, delta);
  }

  [[nodiscard]] bool healthy(const Handoff& h, Leg leg) const {
    const auto it = legs.find(leg_key(h.from(leg), h.spec.to));
    return it == legs.end() || !it->second.excluded;
  }

  void exclude(const Handoff& h, Leg leg, TimeNs now_ns) {
    LegHealth& l = legs[leg_key(h.from(leg), h.spec.to)];
    if (l.excluded) return;
    l.excluded = true;
    l.successes = 0;
    l.next_probe_ns = time_after(now_ns, config.probe_interval_ns);
    ++stats.exclusions;
    count("baton_dualpath_exclusions_total");
  }

  // Credits what a run has delivered so far to the ledger, once per byte:
  // bytes another run landed first are duplicates, hence wasted.
  void credit(Handoff& h, Run& run, const detail::RunView& v, TimeNs now_ns) {
    for (const ByteRange& d : v.delivered) {
      for (const ByteRange& fresh : subtract(d, run.credited)) {
        add(run.credited, fresh);
        const ByteRange at{run.base + fresh.offset, fresh.length};
        const std::uint64_t dup = overlap(h.landed, at);
        add(h.landed, at);
        h.status.wasted_bytes += dup;
        stats.wasted_bytes += dup;
        count("baton_dualpath_wasted_bytes_total", dup);
        (run.leg == Leg::kDirect ? h.status.bytes_direct : h.status.bytes_store) += fresh.length - dup;
        if (run.leg == Leg::kStore && h.status.first_store_byte_ns < 0 && fresh.length > dup) {
          h.status.first_store_byte_ns = v.first_delivered_ns >= 0 ? v.first_delivered_ns : now_ns;
        }
        if (!h.completed_by && covered(h)) h.completed_by = run.leg;
      }
    }
    h.status.bytes_landed = total(h.landed);
  }

  [[nodiscard]] bool covered(const Handoff& h) const {
    return h.landed.size() == 1 && h.landed[0].offset == 0 && h.landed[0].length == h.spec.bytes;
  }

  Status start_run(Handoff& h, Leg leg, ByteRange range, TimeNs now_ns) {
    // The caller's timeout bounds each run; default_timeout_ns only bounds
    // the wait while no leg can carry the handoff.
    const TimeNs timeout_at_ns = h.spec.timeout_ns > 0 ? time_after(h.status.submitted_ns, h.spec.timeout_ns) : 0;
    auto id = engine.start(h.spec, leg, range, timeout_at_ns);
    if (!id) return id.error();
    h.runs.push_back({*id, leg, range.offset, range.length, false, {}});
    if (leg == Leg::kStore && h.status.first_store_ns < 0) h.status.first_store_ns = now_ns;
    return Status::ok();
  }

  // Sends `ranges` on `leg`, one run per contiguous range.
  void start_runs(Handoff& h, Leg leg, const Ranges& ranges, TimeNs now_ns) {
    if (h.failed_leg && *h.failed_leg != leg && !ranges.empty()) {
      if (h.status.failovers == 0) h.status.first_failover_ns = now_ns;
      ++h.status.failovers;
      ++stats.failovers;
      count("baton_dualpath_failovers_total");
    }
    h.failed_leg.reset();
    for (const ByteRange& r : ranges) {
      // Validated at submit; a refusal now is a bug, reported on the handoff.
      if (Status s = start_run(h, leg, r, now_ns); !s.is_ok()) {
        end(h, HandoffState::kFailed, std::move(s), now_ns);
        return;
      }
    }
  }

  // Bytes neither landed nor owned by a run that may still land them.
  [[nodiscard]] Ranges free_ranges(const Handoff& h) const {
    Ranges owned = h.landed;
    for (const Run& r : h.runs) add(owned, {r.base, r.length});
    return subtract({0, h.spec.bytes}, owned);
  }

  // `lost_race`: the other leg completed the copy (counted as cancelled
  // legs); otherwise the caller cancelled or the handoff failed.
  void cancel_runs(Handoff& h, bool lost_race) {
    for (Run& r : h.runs) {
      if (r.cancelled) continue;
      r.cancelled = true;
      if (const auto cancelled = engine.cancel(r.id)) {
        const std::uint64_t wasted = *cancelled;
        if (lost_race) {
          ++h.status.legs_cancelled;
          ++stats.cancelled_legs;
          count("baton_dualpath_cancelled_legs_total");
        }
        h.status.wasted_bytes += wasted;
        stats.wasted_bytes += wasted;
        count("baton_dualpath_wasted_bytes_total", wasted);
      }
    }
  }

  void end(Handoff& h, HandoffState state, Status status, TimeNs now_ns) {
    if (h.status.ended()) return;
    cancel_runs(h, state == HandoffState::kCompleted);
    h.status.state = state;
    h.status.status = std::move(status);
    h.status.completed_ns = now_ns;
    h.hedge_at_ns = h.retry_at_ns = kNever;
    if (state == HandoffState::kCompleted) {
      h.status.winner = h.completed_by.value_or(Leg::kDirect);
      ++stats.completed;
      count("baton_dualpath_completed_total");
      ++(h.status.winner == Leg::kDirect ? stats.wins_direct : stats.wins_store);
      engine.metrics().add("baton_dualpath_wins_total", {{"leg", std::string(to_string(h.status.winner))}});
    } else if (state == HandoffState::kFailed) {
      ++stats.failed;
      count("baton_dualpath_failed_total");
    }
  }

  [[nodiscard]] TimeNs backoff_ns(int attempt) {
    double d = static_cast<double>(config.backoff_initial_ns) * std::pow(config.backoff_multiplier, attempt);
    d = std::min(d, static_cast<double>(config.backoff_max_ns));
    if (config.backoff_jitter > 0) {
      d *= std::uniform_real_distribution<double>(1 - config.backoff_jitter, 1 + config.backoff_jitter)(rng);
    }
    return std::max<TimeNs>(1, saturated_ns(d));
  }

  void enter_backoff(Handoff& h, TimeNs now_ns) {
    h.status.state = HandoffState::kBackoff;
    h.retry_at_ns = std::min(time_after(now_ns, backoff_ns(h.attempts)), h.end_by_ns);
  }

  // The legs to try, most preferred first. A retry in backoff tries an
  // excluded leg too (its own probe), alternating which goes first.
  [[nodiscard]] std::vector<Leg> leg_order(const Handoff& h, bool retrying) const {
    std::vector<Leg> order;
    for (Leg leg : {Leg::kDirect, Leg::kStore}) {
      if (healthy(h, leg)) order.push_back(leg);
    }
    if (order.empty() && retrying) order.push_back(h.attempts % 2 == 1 ? Leg::kStore : Leg::kDirect);
    return order;
  }

  // Sends what is free on the best leg; backs off when no leg can take it.
  void place_free(Handoff& h, TimeNs now_ns, bool retrying) {
    const Ranges free = free_ranges(h);
    if (free.empty()) {
      h.failed_leg.reset();  // the other leg's run already owns every byte
      return;
    }
    const std::vector<Leg> order = leg_order(h, retrying);
    if (order.empty()) {
      if (h.runs.empty() || std::ranges::all_of(h.runs, [](const Run& r) { return r.cancelled; })) {
        enter_backoff(h, now_ns);
      }
      return;
    }
    h.status.state = HandoffState::kRunning;
    start_runs(h, order.front(), free, now_ns);
  }

  void start(Handoff& h, TimeNs now_ns) {
    const bool direct_ok = healthy(h, Leg::kDirect);
    const bool store_ok = healthy(h, Leg::kStore);
    if (config.strategy == Strategy::kHedge && direct_ok && store_ok) {
      start_runs(h, Leg::kDirect, {{0, h.spec.bytes}}, now_ns);
      if (!h.status.ended()) start_runs(h, Leg::kStore, {{0, h.spec.bytes}}, now_ns);
      return;
    }
    if (!direct_ok && !store_ok) {
      h.retry_at_ns = now_ns;  // try at once: the monitor may be out of date
      h.status.state = HandoffState::kBackoff;
      return;
    }
    place_free(h, now_ns, false);
    if (config.strategy == Strategy::kRequestHedging && direct_ok && !h.status.ended()) {
      h.hedge_at_ns = time_after(now_ns, hedge_delay_ns(h));
    }
  }

  [[nodiscard]] TimeNs hedge_delay_ns(const Handoff& h) const {
    if (config.hedge_delay_ns > 0) return config.hedge_delay_ns;
    const double expected_ns = engine.expected_direct_ns(h.spec);
    return std::max(config.hedge_delay_min_ns, saturated_ns(config.hedge_factor * expected_ns));
  }

  // A handoff's runs that ended and can land nothing more (the others are
  // running, or cancelling with slices a cancel could not stop), the first
  // to finish first: when two legs ended since the last step, the earlier won.
  [[nodiscard]] std::vector<std::pair<RunId, detail::RunView>> settled_runs(const Handoff& h) {
    std::vector<std::pair<RunId, detail::RunView>> settled;
    for (const Run& run : h.runs) {
      detail::RunView v = engine.view(run.id);
      if (v.ended() && v.settled) settled.emplace_back(run.id, std::move(v));
    }
    std::ranges::stable_sort(settled, {}, [](const auto& s) {
      return s.second.last_delivered_ns < 0 ? std::numeric_limits<TimeNs>::max() : s.second.last_delivered_ns;
    });
    return settled;
  }

  // One handoff at `now`: settle runs that ended, complete, fail over, fire timers.
  void step(Handoff& h, TimeNs now_ns) {
    bool any_ended = false;
    // Settling one may cancel the others (the copy is complete): again
    // until none is left to settle.
    for (auto settled = settled_runs(h); !settled.empty(); settled = settled_runs(h)) {
      for (const auto& [id, v] : settled) {
        const auto at = std::ranges::find(h.runs, id, &Run::id);
        Run& run = *at;
        const RequestState state = v.state;
        engine.forget(run.id);
        any_ended = true;
        if (!h.status.ended()) credit(h, run, v, now_ns);
        if (h.status.ended()) {
          // Landed after the handoff completed: all duplicates.
          for (const ByteRange& d : v.delivered) {
            const std::uint64_t late = total(subtract(d, run.credited));
            h.status.wasted_bytes += late;
            stats.wasted_bytes += late;
            count("baton_dualpath_wasted_bytes_total", late);
          }
        }
        const Leg leg = run.leg;
        const bool was_cancelled = run.cancelled;
        h.runs.erase(at);
        if (h.status.ended()) continue;
        if (covered(h)) {
          end(h, HandoffState::kCompleted, Status::ok(), now_ns);
          continue;
        }
        if (state == RequestState::kFailed && !was_cancelled) {
          if (v.status.code() == StatusCode::kUnavailable) {
            exclude(h, leg, now_ns);
            h.failed_leg = leg;
          } else {
            end(h, HandoffState::kFailed, v.status, now_ns);
          }
        } else if (state == RequestState::kInfeasible || (state == RequestState::kTimedOut && !was_cancelled)) {
          // Runs carry the handoff's deadline and what is left of its timeout.
          end(h, HandoffState::kFailed, v.status, now_ns);
        }
      }
    }
    if (h.status.ended()) return;
    if (any_ended) {
      // Another run may have landed the rest already (request_hedging: the
      // store run took the tail while direct still sends it).
      for (Run& r : h.runs) {
        credit(h, r, engine.view(r.id), now_ns);
      }
      if (covered(h)) {
        end(h, HandoffState::kCompleted, Status::ok(), now_ns);
        return;
      }
      if (h.status.state == HandoffState::kRunning) place_free(h, now_ns, false);
    }
    if (h.hedge_at_ns != kNever && now_ns >= h.hedge_at_ns) {
      h.hedge_at_ns = kNever;
      const bool store_running = std::ranges::any_of(h.runs, [](const Run& r) { return r.leg == Leg::kStore; });
      if (!store_running && healthy(h, Leg::kStore) && h.status.state == HandoffState::kRunning) {
        // Race the bytes not yet known landed; what direct already delivered is not re-sent.
        for (Run& r : h.runs) {
          credit(h, r, engine.view(r.id), now_ns);
        }
        start_runs(h, Leg::kStore, subtract({0, h.spec.bytes}, h.landed), now_ns);
      }
    }
    if (h.status.state == HandoffState::kBackoff && h.retry_at_ns != kNever && now_ns >= h.retry_at_ns) {
      if (now_ns >= h.end_by_ns) {
        end(h, HandoffState::kFailed,
            Status::unavailable("dualpath: handoff {} ({} bytes to {}): neither {} nor {} could carry it before its "
                                "timeout ({} retries)",
                                h.id, h.spec.bytes, h.spec.to, h.spec.direct_from, h.spec.store_from,
                                h.status.retries),
            now_ns);
        return;
      }
      h.retry_at_ns = kNever;
      ++h.attempts;
      ++h.status.retries;
      ++stats.retries;
      count("baton_dualpath_retries_total");
      place_free(h, now_ns, true);
    }
  }

  void step_probes(TimeNs now_ns) {
    for (auto& [key, l] : legs) {
      if (!l.excluded) continue;
      if (l.probe) {
        const detail::RunView v = engine.view(*l.probe);
        if (!v.ended() || !v.settled) continue;
        engine.forget(*l.probe);
        const bool ok = v.state == RequestState::kCompleted;
        l.probe.reset();
        l.next_probe_ns = time_after(now_ns, config.probe_interval_ns);
        if (!ok) {
          l.successes = 0;
          ++stats.probes_failed;
          count("baton_dualpath_probes_failed_total");
          continue;
        }
        if (++l.successes >= config.probe_successes) {
          l.excluded = false;
          ++stats.readmissions;
          count("baton_dualpath_readmissions_total");
          wake(now_ns);
          continue;
        }
      }
      if (now_ns < l.next_probe_ns) continue;
      if (auto id = engine.probe(handoffs.at(l.latest).spec, l.leg, config)) {
        l.probe = *id;
        ++stats.probes;
        count("baton_dualpath_probes_total");
      } else {
        l.next_probe_ns = time_after(now_ns, config.probe_interval_ns);
      }
    }
  }

  // A leg came back: handoffs waiting in backoff retry now.
  void wake(TimeNs now_ns) {
    for (HandoffId id : active) {
      Handoff& h = handoffs.at(id);
      if (h.status.state == HandoffState::kBackoff) h.retry_at_ns = now_ns;
    }
  }

  void step_all(TimeNs now_ns) {
    step_probes(now_ns);
    // Settling one handoff never touches another, but readmission may wake
    // any, so walk a snapshot.
    const std::vector<HandoffId> snapshot = active;
    for (HandoffId id : snapshot) step(handoffs.at(id), now_ns);
    std::erase_if(active, [&](HandoffId id) {
      const Handoff& h = handoffs.at(id);
      return h.status.ended() && h.runs.empty();
    });
  }

  [[nodiscard]] std::optional<TimeNs> next_timer_ns() const {
    std::optional<TimeNs> t;
    auto take = [&](TimeNs v) {
      if (v != kNever) t = t ? std::min(*t, v) : v;
    };
    for (HandoffId id : active) {
      const Handoff& h = handoffs.at(id);
      take(h.hedge_at_ns);
      take(h.retry_at_ns);
    }
    for (const auto& [key, l] : legs) {
      if (l.excluded && !l.probe) take(l.next_probe_ns);
    }
    return t;
  }

  [[nodiscard]] std::optional<TimeNs> next_instant() const {
    const auto e = engine.next_event_ns();
    const auto m = next_timer_ns();
    if (e && m) return std::min(*e, *m);
    return e ? e : m;
  }

  // Every handoff ended, and every leg request too: a cancelled leg whose
  // slices are still on the transport is cancelling until they settle.
  [[nodiscard]] bool idle() const {
    return std::ranges::all_of(active, [&](HandoffId id) { return handoffs.at(id).status.ended(); }) &&
           !engine.busy();
  }
};

DualPath::DualPath(std::unique_ptr<State> state) : state_(std::move(state)) {}
DualPath::~DualPath() = default;

Result<std::unique_ptr<DualPath>> DualPath::create(engine::Harness& engine, DualPathConfig config) {
  if (Status s = config.validate(); !s.is_ok()) return std::unexpected(s);
  return std::unique_ptr<DualPath>(new DualPath(std::make_unique<State>(detail::sim_legs(engine), std::move(config))));
}

Result<std::unique_ptr<DualPath>> DualPath::create(engine::Engine& engine, DualPathConfig config) {
  if (Status s = config.validate(); !s.is_ok()) return std::unexpected(s);
  auto legs = detail::engine_legs(engine, config);
  if (!legs) return std::unexpected(legs.error());
  return std::unique_ptr<DualPath>(new DualPath(std::make_unique<State>(std::move(*legs), std::move(config))));
}

Result<HandoffId> DualPath::submit(const HandoffRequest& request) {
  State& st = *state_;
  HandoffRequest r = request;
  // Over an Engine, a leg is named after its first source's peer unless the caller names it.
  if (r.direct_from.empty() && !r.direct_sources.empty()) r.direct_from = r.direct_sources.front().peer;
  if (r.store_from.empty() && !r.store_sources.empty()) r.store_from = r.store_sources.front().peer;
  if (r.bytes == 0) {
    return std::unexpected(Status::invalid_argument("dualpath submit: handoff to {} has 0 bytes", r.to));
  }
  if (r.direct_from == r.store_from) {
    return std::unexpected(Status::invalid_argument(
        "dualpath submit: direct and store sources are both \"{}\"; expected two different endpoints", r.direct_from));
  }
  if (r.timeout_ns < 0 || r.deadline_ns < 0) {
    return std::unexpected(Status::invalid_argument(
        "dualpath submit: timeout {} ns and deadline {} ns must be >= 0", r.timeout_ns, r.deadline_ns));
  }
  if (static_cast<int>(r.qos) >= sched::kQosClassCount) {
    return std::unexpected(Status::invalid_argument("dualpath submit: unknown qos class {} (expected 0..{})",
                                                    static_cast<int>(r.qos), sched::kQosClassCount - 1));
  }
  if (Status s = st.engine.validate(r); !s.is_ok()) return std::unexpected(s);
  const TimeNs now = st.engine.now_ns();
  Handoff h;
  h.id = st.next_id++;
  h.spec = std::move(r);
  h.status.bytes = h.spec.bytes;
  h.status.submitted_ns = now;
  h.end_by_ns = time_after(now, h.spec.timeout_ns > 0 ? h.spec.timeout_ns : st.config.default_timeout_ns);
  if (h.spec.deadline_ns != 0) {
    h.end_by_ns = h.spec.timeout_ns > 0 ? std::min(h.end_by_ns, h.spec.deadline_ns) : h.spec.deadline_ns;
  }
  const HandoffId id = h.id;
  Handoff& placed = st.handoffs.emplace(id, std::move(h)).first->second;
  st.active.push_back(id);
  ++st.stats.submitted;
  for (Leg leg : {Leg::kDirect, Leg::kStore}) {
    LegHealth& l = st.legs[State::leg_key(placed.from(leg), placed.spec.to)];
    l.latest = id;
    l.leg = leg;
  }
  st.start(placed, now);
  return id;
}

Status DualPath::cancel(HandoffId id) {
  State& st = *state_;
  const auto it = st.handoffs.find(id);
  if (it == st.handoffs.end()) return Status::not_found("dualpath cancel: no handoff {}", id);
  Handoff& h = it->second;
  if (h.status.ended()) {
    return Status::invalid_argument("dualpath cancel: handoff {} already ended ({})", id, to_string(h.status.state));
  }
  st.end(h, HandoffState::kCancelled, Status::cancelled("handoff {} cancelled", id), st.engine.now_ns());
  return Status::ok();
}

Result<HandoffStatus> DualPath::status(HandoffId id) const {
  const auto it = state_->handoffs.find(id);
  if (it == state_->handoffs.end()) return std::unexpected(Status::not_found("dualpath status: no handoff {}", id));
  return it->second.status;
}

Status DualPath::run_until(TimeNs t_ns) {
  State& st = *state_;
  if (st.engine.wall_clock()) {
    // Real time: react to runs as they end and to timers as they fall due.
    while (true) {
      const TimeNs now = st.engine.now_ns();
      st.step_all(now);
      if (now >= t_ns) return Status::ok();
      const auto timer = st.next_timer_ns();
      if (Status s = st.engine.advance(timer ? std::min(*timer, t_ns) : t_ns); !s.is_ok()) return s;
    }
  }
  if (t_ns < st.engine.now_ns()) {
    return Status::out_of_range("dualpath run_until: {} ns is before now ({} ns)", t_ns, st.engine.now_ns());
  }
  int spins = 0;
  while (true) {
    const TimeNs now = st.engine.now_ns();
    st.step_all(now);
    const auto next = st.next_instant();
    const bool due = next && *next <= t_ns;
    const TimeNs target = due ? std::max(*next, now) : t_ns;
    if (target == now && !(due && *next <= now)) break;
    spins = target == now ? spins + 1 : 0;
    if (spins > 10'000) return Status::internal("dualpath run_until: no progress at {} ns", now);
    if (Status s = st.engine.advance(target); !s.is_ok()) return s;
  }
  return Status::ok();
}

Status DualPath::run_until_idle(TimeNs limit_ns) {
  State& st = *state_;
  if (limit_ns < 0) return Status::invalid_argument("dualpath run_until_idle: a limit of {} ns", limit_ns);
  const TimeNs end = time_after(st.engine.now_ns(), limit_ns);  // INT64_MAX: no limit
  if (st.engine.wall_clock()) {
    while (true) {
      const TimeNs now = st.engine.now_ns();
      st.step_all(now);
      if (st.idle()) return Status::ok();
      if (now >= end) return Status::timeout("dualpath run_until_idle: still busy after {} ns", limit_ns);
      const auto timer = st.next_timer_ns();
      if (Status s = st.engine.advance(timer ? std::min(*timer, end) : end); !s.is_ok()) return s;
    }
  }
  if (Status s = run_until(st.engine.now_ns()); !s.is_ok()) return s;
  while (!st.idle()) {
    const auto next = st.next_instant();
    if (!next) return Status::internal("dualpath run_until_idle: handoffs are open but nothing will ever happen");
    if (*next > end) return Status::timeout("dualpath run_until_idle: still busy after {} ns of virtual time", limit_ns);
    if (Status s = run_until(std::max(*next, st.engine.now_ns())); !s.is_ok()) return s;
  }
  return Status::ok();
}

bool DualPath::leg_healthy(const std::string& from, const std::string& to) const {
  const auto it = state_->legs.find(State::leg_key(from, to));
  return it == state_->legs.end() || !it->second.excluded;
}

const DualPathStats& DualPath::stats() const { return state_->stats; }
const DualPathConfig& DualPath::config() const { return state_->config; }

}  // namespace baton::dualpath
