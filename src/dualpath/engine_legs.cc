// DualPath's runs over a real Engine: a run is one batch of reads, from the
// leg's sources (the prefill peer's regions, or the store's) into the local
// region, cut into pieces of at most piece_bytes so a failover knows which
// pieces landed. A leg whose peer is down refuses at submit; that becomes a
// run failed `unavailable`, as if it had failed on the wire. Time is the
// engine's steady clock; advance() sleeps on the engine's batch events.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include <fmt/format.h>

#include "legs.h"

namespace baton::dualpath::detail {
namespace {

using sched::ByteRange;
using sched::RequestState;

constexpr TimeNs kProbeTimeoutNs = 1'000'000'000;
constexpr TimeNs kDrainTimeoutNs = 10'000'000'000;  // the destructor's wait for a cancelled run

const std::vector<Source>& sources(const HandoffRequest& h, Leg leg) {
  return leg == Leg::kDirect ? h.direct_sources : h.store_sources;
}

class EngineLegs final : public Legs {
 public:
  EngineLegs(engine::Engine& engine, std::uint64_t piece_bytes, engine::Region scratch)
      : engine_(engine), piece_bytes_(piece_bytes), scratch_(scratch), ended_fd_(engine.batch_event_fd()) {}

  ~EngineLegs() override {
    // Nothing of ours may land in the caller's memory after we are gone.
    for (auto& [id, run] : runs_) {
      if (!run.batch) continue;
      (void)engine_.cancel(*run.batch);
      (void)engine_.wait(*run.batch, kDrainTimeoutNs);
      (void)engine_.release(*run.batch);
    }
    (void)engine_.unregister(scratch_.handle);
  }

  [[nodiscard]] TimeNs now_ns() const override { return engine_.now_ns(); }
  [[nodiscard]] bool wall_clock() const override { return true; }

  [[nodiscard]] Status validate(const HandoffRequest& r) const override {
    // Where the bytes land: refused here, not by the first leg's batch (the
    // handoff would be failed before the caller had its id).
    auto local = engine_.region(r.local_region);
    if (!local) return Status(local.error().code(), fmt::format("dualpath submit: {}", local.error().message()));
    if (r.local_offset > local->length || r.bytes > local->length - r.local_offset) {
      return Status::out_of_range("dualpath submit: [{}, +{}) is outside local region {} ({} bytes)", r.local_offset,
                                  r.bytes, r.local_region, local->length);
    }
    for (Leg leg : {Leg::kDirect, Leg::kStore}) {
      const std::vector<Source>& src = sources(r, leg);
      if (src.empty()) {
        return Status::invalid_argument("dualpath submit: the {} leg has no sources", to_string(leg));
      }
      std::uint64_t covered = 0;  // stays <= r.bytes, so r.bytes - covered cannot wrap
      for (std::size_t i = 0; i < src.size(); ++i) {
        if (src[i].length == 0 || src[i].peer.empty()) {
          return Status::invalid_argument("dualpath submit: {} source {} has {}", to_string(leg), i,
                                          src[i].peer.empty() ? "no peer" : "0 bytes");
        }
        if (src[i].length > r.bytes - covered) {
          covered = r.bytes + 1;
          break;
        }
        covered += src[i].length;
      }
      if (covered != r.bytes) {
        return Status::invalid_argument(
            "dualpath submit: the {} leg's {} sources {} the handoff's {} bytes", to_string(leg), src.size(),
            covered > r.bytes ? "run past" : "do not cover", r.bytes);
      }
      for (std::size_t i = 0; i < src.size(); ++i) {
        if (Status s = inside_a_region(src[i]); !s.is_ok()) {
          return Status(s.code(), fmt::format("dualpath submit: {} source {}: {}", to_string(leg), i, s.message()));
        }
      }
    }
    return Status::ok();
  }

  [[nodiscard]] Result<RunId> start(const HandoffRequest& h, Leg leg, ByteRange range, TimeNs timeout_at_ns) override {
    Run run{.leg = leg, .started_ns = engine_.now_ns()};
    engine::Batch batch;
    const TimeNs timeout_ns = timeout_at_ns > 0 ? std::max<TimeNs>(1, timeout_at_ns - run.started_ns) : 0;
    std::uint64_t src_start = 0;  // handoff offset of the source's first byte
    for (const Source& s : sources(h, leg)) {
      const std::uint64_t lo = std::max(range.offset, src_start);
      const std::uint64_t hi = std::min(range.offset + range.length, src_start + s.length);
      for (std::uint64_t at = lo; at < hi; at += piece_bytes_) {
        const std::uint64_t n = std::min(piece_bytes_, hi - at);
        batch.requests.push_back({.op = engine::Op::kRead,
                                  .local_region = h.local_region,
                                  .local_offset = h.local_offset + at,
                                  .peer = s.peer,
                                  .remote_region = s.region,
                                  .remote_offset = s.offset + (at - src_start),
                                  .length = n,
                                  .qos = h.qos,
                                  .deadline_ns = h.deadline_ns,
                                  .timeout_ns = timeout_ns});
        run.pieces.push_back({at - range.offset, n});
      }
      src_start += s.length;
    }
    return submit(std::move(run), batch);
  }

  std::optional<std::uint64_t> cancel(RunId id) override {
    const auto it = runs_.find(id);
    if (it == runs_.end() || !it->second.batch || !engine_.cancel(*it->second.batch).is_ok()) return std::nullopt;
    return 0;  // what lands before the cancel takes shows up as delivered
  }

  [[nodiscard]] RunView view(RunId id) override {
    RunView v;
    const auto it = runs_.find(id);
    if (it == runs_.end()) {
      v.state = RequestState::kFailed;
      v.status = Status::internal("dualpath: run {} is unknown", id);
      v.settled = true;
      return v;
    }
    Run& run = it->second;
    if (!run.batch) {
      v.state = RequestState::kFailed;
      v.status = run.refused;
      v.settled = true;
      return v;
    }
    auto st = engine_.poll(*run.batch);
    if (!st) {
      v.state = RequestState::kFailed;
      v.status = st.error();
      v.settled = true;
      return v;
    }
    const sched::RequestStatus* first_bad = nullptr;
    for (std::size_t i = 0; i < st->requests.size(); ++i) {
      const sched::RequestStatus& r = st->requests[i];
      if (r.state == RequestState::kCompleted) {
        v.delivered.push_back(run.pieces[i]);
        if (v.first_delivered_ns < 0 || r.completed_ns < v.first_delivered_ns) v.first_delivered_ns = r.completed_ns;
        v.last_delivered_ns = std::max(v.last_delivered_ns, r.completed_ns);
      } else if (!first_bad && r.state != RequestState::kQueued && r.state != RequestState::kRunning &&
                 r.state != RequestState::kCancelling) {
        first_bad = &r;
      }
    }
    v.settled = st->done;
    if (!st->done) return v;
    if (first_bad) {
      v.state = first_bad->state;
      v.status = first_bad->status;
    } else {
      v.state = RequestState::kCompleted;
      if (run.leg == Leg::kDirect && !run.timed && v.last_delivered_ns > run.started_ns) {
        run.timed = true;  // request_hedging's estimate of the direct leg
        std::uint64_t bytes = 0;
        for (const ByteRange& p : run.pieces) bytes += p.length;
        const double gbps = static_cast<double>(bytes) / static_cast<double>(v.last_delivered_ns - run.started_ns);
        direct_gbps_ = direct_gbps_ > 0 ? 0.8 * direct_gbps_ + 0.2 * gbps : gbps;
      }
    }
    return v;
  }

  void forget(RunId id) override {
    const auto it = runs_.find(id);
    if (it == runs_.end()) return;
    if (it->second.batch) (void)engine_.release(*it->second.batch);
    runs_.erase(it);
  }

  [[nodiscard]] Result<RunId> probe(const HandoffRequest& h, Leg leg, const DualPathConfig& config) override {
    const std::vector<Source>& src = sources(h, leg);
    if (src.empty()) return std::unexpected(Status::invalid_argument("dualpath probe: no {} source", to_string(leg)));
    const std::uint64_t n = std::min({config.probe_bytes, src[0].length, scratch_.length});
    engine::Batch batch;
    batch.requests.push_back({.op = engine::Op::kRead,
                              .local_region = scratch_.handle,
                              .peer = src[0].peer,
                              .remote_region = src[0].region,
                              .remote_offset = src[0].offset,
                              .length = n,
                              .qos = sched::QosClass::kDecodeCritical,
                              .timeout_ns = kProbeTimeoutNs});
    Run run{.leg = leg, .started_ns = engine_.now_ns(), .pieces = {{0, n}}, .timed = true, .probe = true};
    return submit(std::move(run), batch);
  }

  [[nodiscard]] double expected_direct_ns(const HandoffRequest& h) const override {
    // Until a direct run has been timed: 1 GB/s, below any same-host copy.
    return static_cast<double>(h.bytes) / (direct_gbps_ > 0 ? direct_gbps_ : 1.0);
  }

  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override { return std::nullopt; }

  [[nodiscard]] Status advance(TimeNs t_ns) override {
    // A run refused at submit has ended already, and no batch event will
    // say so: sleeping until the timer would hold a failover for it
    // (found under load: the retry slept out run_until_idle's 20 s).
    if (std::ranges::any_of(runs_, [](const auto& r) { return !r.second.batch; })) return Status::ok();
    const int fd = ended_fd_;
    const TimeNs wait_ns = t_ns - engine_.now_ns();
    if (fd < 0) {
      // No eventfd: poll the runs every 50 µs at most.
      if (wait_ns > 0) ::usleep(static_cast<useconds_t>(std::min<TimeNs>(wait_ns, 50'000) / 1000 + 1));
      return Status::ok();
    }
    pollfd p{fd, POLLIN, 0};
    const timespec ts{static_cast<time_t>(std::max<TimeNs>(wait_ns, 0) / 1'000'000'000),
                      static_cast<long>(std::max<TimeNs>(wait_ns, 0) % 1'000'000'000)};
    if (::ppoll(&p, 1, &ts, nullptr) < 0 && errno != EINTR) {
      return Status::internal("dualpath: waiting on the engine's batch events failed (errno {})", errno);
    }
    if (p.revents & POLLIN) {
      std::uint64_t n = 0;
      (void)!::read(fd, &n, sizeof n);  // reset it; the runs are polled next
    }
    return Status::ok();
  }

  // A run of an ended handoff (a cancelled loser) may still land bytes in
  // the caller's memory until it settles; probes do not count.
  [[nodiscard]] bool busy() const override {
    return std::ranges::any_of(runs_, [](const auto& r) { return !r.second.probe; });
  }
  [[nodiscard]] engine::MetricsRegistry& metrics() override { return engine_.metrics(); }

 private:
  struct Run {
    Leg leg = Leg::kDirect;
    TimeNs started_ns = 0;
    std::vector<ByteRange> pieces{};  // run offsets of the batch's requests
    bool timed = false;               // counted in direct_gbps_ (or a probe)
    bool probe = false;
    std::optional<engine::BatchHandle> batch{};  // none: refused at submit
    Status refused{};
  };

  // A source in a region its peer exported to us. A peer that is down
  // passes: its leg fails over when it runs. The regions are asked of the
  // engine (a loop round trip) only for a region not seen before; one
  // revoked since is refused when its run starts, ending the handoff.
  [[nodiscard]] Status inside_a_region(const Source& s) const {
    const transport::RemoteRegion* region = known_region(s);
    if (region == nullptr) {
      auto regions = engine_.remote_regions(engine::Peer{s.peer, ""});
      if (!regions) return regions.error().code() == StatusCode::kUnavailable ? Status::ok() : regions.error();
      known_regions_[s.peer] = std::move(*regions);
      region = known_region(s);
    }
    if (region == nullptr) return Status::not_found("{} exported no region {} to us", s.peer, s.region);
    if (s.offset > region->length || s.length > region->length - s.offset) {
      return Status::out_of_range("[{}, +{}) is outside region {} of {} ({} bytes)", s.offset, s.length, s.region,
                                  s.peer, region->length);
    }
    return Status::ok();
  }

  [[nodiscard]] const transport::RemoteRegion* known_region(const Source& s) const {
    const auto peer = known_regions_.find(s.peer);
    if (peer == known_regions_.end()) return nullptr;
    const auto it = std::ranges::find(peer->second, s.region, &transport::RemoteRegion::key);
    return it == peer->second.end() ? nullptr : &*it;
  }

  Result<RunId> submit(Run run, const engine::Batch& batch) {
    auto handle = engine_.submit(batch);
    if (handle) {
      run.batch = *handle;
    } else if (handle.error().code() == StatusCode::kUnavailable) {
      run.refused = handle.error();  // the leg is down: a failed run, not a refused handoff
    } else {
      return std::unexpected(handle.error());
    }
    const RunId id = next_id_++;
    runs_.emplace(id, std::move(run));
    return id;
  }

  engine::Engine& engine_;
  std::uint64_t piece_bytes_;
  engine::Region scratch_;  // where probes land
  // Asked for before any run: the engine writes it only once someone has,
  // so a batch that ended between a look at the runs and the first ask
  // would leave advance() asleep until its timer (found under load: 20 s).
  const int ended_fd_;
  std::map<RunId, Run> runs_;
  mutable std::map<std::string, std::vector<transport::RemoteRegion>> known_regions_;  // by peer
  RunId next_id_ = 1;
  double direct_gbps_ = 0;  // bytes per ns of completed direct runs (EWMA)
};

}  // namespace

Result<std::unique_ptr<Legs>> engine_legs(engine::Engine& engine, const DualPathConfig& config) {
  auto scratch = engine.allocate_memory(std::max<std::uint64_t>(config.probe_bytes, 1));
  if (!scratch) return std::unexpected(scratch.error());
  return std::make_unique<EngineLegs>(engine, config.piece_bytes, *scratch);
}

}  // namespace baton::dualpath::detail
