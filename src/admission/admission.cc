#include "baton/admission/admission.h"

#include "baton/common/ordered_sums.h"
#include "baton/common/units.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace baton::admission {
namespace {

using sched::RequestId;
using sched::RequestState;
using sched::RequestStatus;
using sched::TransferRequest;
using transport::Codec;
using transport::CodecProfile;

struct Owner {
  RequestId id = 0;
  TransferRequest request;
  std::uint64_t seq = 0;
  TimeNs submitted_ns = 0;
  Band band = Band::kPlain;
  bool admitted = false;
  bool compressed = false;
  int slices_since_eval = 0;
  TimeNs next_eval_ns = 0;
  TimeNs expires_ns = 0;  // submit + transfer timeout
  // Where it will go, as routed at submit (or at admission, if none was
  // healthy then); none while every path of its route is down (it was path
  // 0, and its bytes counted ahead of every request there).
  std::optional<transport::PathId> path;
};

// Waiting order: FIFO by arrival, or EDF (no deadline last), ties by arrival.
using WaitKey = std::pair<TimeNs, std::uint64_t>;

}  // namespace

std::string_view to_string(Band band) {
  switch (band) {
    case Band::kPlain: return "plain";
    case Band::kCompress: return "compress";
    case Band::kLocal: return "local";
  }
  return "?";
}

struct AdmissionController::State {
  State(const sched::SchedPolicy& p, sched::Scheduler& s, transport::Transport& t, BandwidthEstimator e)
      : policy(p), a(policy.admission), scheduler(s), transport(t), estimator(std::move(e)) {}

  sched::SchedPolicy policy;
  const sched::AdmissionPolicy& a;
  sched::Scheduler& scheduler;
  transport::Transport& transport;
  BandwidthEstimator estimator;
  LocalRecompute local_recompute;
  std::shared_ptr<const Codec> codec;
  CodecProfile profile;
  MluObserver observe_mlu;

  std::unordered_map<RequestId, Owner> owners;  // waiting or admitted, not ended
  std::map<WaitKey, RequestId> waiting;
  // The bytes of waiting owners per path (their route at submit), by arrival
  // and, for those with a deadline, by (deadline, arrival): bytes_ahead's
  // sums in O(log n).
  struct WaitingSums {
    OrderedSums<std::uint64_t> by_seq;
    OrderedSums<std::pair<TimeNs, std::uint64_t>> by_deadline;
  };
  std::unordered_map<transport::PathId, WaitingSums> waiting_sums;
  std::unordered_map<RequestId, RequestStatus> ended;  // ended here, never admitted
  std::function<void(RequestId)> end_hook;
  std::set<std::pair<TimeNs, RequestId>> timers;       // re-evaluation of running owners
  std::set<std::pair<TimeNs, RequestId>> expiries;     // transfer timeouts of live owners
  std::vector<RequestId> finished;                     // from the finish hook, settled in tick()
  int admitted_owners = 0;
  std::uint64_t admitted_bytes = 0;
  std::uint64_t next_seq = 0;
  TimeNs next_drop_scan_ns = 0;
  AdmissionStats stats;
  std::uint64_t estimator_version = 0;  // the transport's paths_version at the estimator's last sync
  std::uint64_t routes_version = 0;     // the same, when the waiting owners were last routed
  std::vector<std::uint32_t> routed_incarnations;  // PathInfo::incarnation by path, then

  [[nodiscard]] WaitKey wait_key(const Owner& o) const {
    if (a.order == sched::AdmissionOrder::kEdf) {
      return {o.request.deadline_ns != 0 ? o.request.deadline_ns : std::numeric_limits<TimeNs>::max(), o.seq};
    }
    return {0, o.seq};
  }

  void wait(const Owner& o) {
    waiting[wait_key(o)] = o.id;
    add_sums(o);
  }

  void unwait(const Owner& o) {
    if (waiting.erase(wait_key(o)) != 0) remove_sums(o);
  }

  void add_sums(const Owner& o) {
    if (!o.path) return;
    WaitingSums& sums = waiting_sums[*o.path];
    sums.by_seq.set(o.seq, o.request.bytes);
    if (o.request.deadline_ns != 0) sums.by_deadline.set({o.request.deadline_ns, o.seq}, o.request.bytes);
  }

  void remove_sums(const Owner& o) {
    if (!o.path) return;
    const auto it = waiting_sums.find(*o.path);
    if (it == waiting_sums.end()) return;
    it->second.by_seq.erase(o.seq);
    if (o.request.deadline_ns != 0) it->second.by_deadline.erase({o.request.deadline_ns, o.seq});
    if (it->second.by_seq.size() == 0) waiting_sums.erase(it);
  }

  // A path id that went to another peer since the waiting owners were
  // routed: those routed on it were the old peer's, and must not count ahead
  // of the newcomer's requests. Route them again (the old peer's chain is
  // gone: none). O(paths + waiting), once per change of the transport's
  // paths, never per request.
  void reroute_waiting(TimeNs now_ns) {
    const std::uint64_t version = transport.paths_version();
    if (version == routes_version) return;
    routes_version = version;
    const auto& infos = transport.paths();
    std::vector<bool> taken(infos.size());
    bool any = false;
    routed_incarnations.resize(infos.size());  // a path seen first is at 0 unless taken since
    for (std::size_t i = 0; i < infos.size(); ++i) {
      if (routed_incarnations[i] == infos[i].incarnation) continue;
      routed_incarnations[i] = infos[i].incarnation;
      taken[i] = any = true;
    }
    if (!any) return;
    for (const auto& [key, id] : waiting) {
      Owner& o = owners.at(id);
      if (!o.path || *o.path >= taken.size() || !taken[*o.path]) continue;
      auto routed = scheduler.route(o.request.from, o.request.to, now_ns);
      remove_sums(o);
      o.path = routed ? std::optional(*routed) : std::nullopt;
      add_sums(o);
    }
  }

  [[nodiscard]] Band band_of(double mlu) const {
    if (mlu >= a.theta_local) return Band::kLocal;
    if (mlu >= a.theta_compress) return Band::kCompress;
    return Band::kPlain;
  }

  [[nodiscard]] std::uint64_t remaining(const Owner& o) const {
    if (!o.admitted) return o.request.bytes;
    const auto s = scheduler.status(o.id);
    return s ? o.request.bytes - s->bytes_done : 0;
  }

  // Bytes not yet posted of an owner: what still has to go on the wire.
  [[nodiscard]] std::uint64_t unsent(const Owner& o) const {
    if (!o.admitted) return o.request.bytes;
    const auto s = scheduler.status(o.id);
    return s ? s->bytes_unsent : 0;
  }

  // Bytes that go before `request` on `path`: everything on the wire (it
  // lands first whoever posted it), plus the unsent bytes the scheduler will
  // serve first — everything queued under FIFO, the earlier deadlines
  // otherwise. Counting an owner's whole remainder as well as the wire would
  // count its posted bytes twice: 4 MiB in flight is 3.4 ms on a 1.2 GB/s
  // socket, which made every deadline under ~4 ms there read infeasible.
  [[nodiscard]] std::uint64_t bytes_ahead(const TransferRequest& request, transport::PathId path,
                                          RequestId self) const {
    const sched::PathLoad& load = scheduler.load(path);
    std::uint64_t ahead = load.inflight_bytes;
    const bool fifo = policy.kind == sched::PolicyKind::kBaselineFifo;
    if (fifo) ahead += load.queued_bytes;
    // Equal deadlines go in arrival order (a batch shares one deadline: its
    // last request is behind the others, its first behind none).
    const auto me = owners.find(self);
    const std::uint64_t self_seq = me == owners.end() ? std::numeric_limits<std::uint64_t>::max() : me->second.seq;
    if (me != owners.end() && me->second.admitted) {
      // Its own posted bytes are in its remainder already.
      ahead -= std::min(ahead, remaining(me->second) - unsent(me->second));
    }
    // Waiting owners on the path that go first (their whole size), then,
    // unless FIFO counted every queued byte already, the admitted ones'
    // unsent bytes due earlier. Each a sum over a tree: O(log n).
    if (const auto w = waiting_sums.find(path); w != waiting_sums.end()) {
      ahead += fifo ? w->second.by_seq.sum_below(self_seq)
                    : w->second.by_deadline.sum_below({request.deadline_ns, self_seq});
    }
    if (!fifo) ahead += scheduler.unsent_due_before(path, request.deadline_ns, self);
    return ahead;
  }

  double mlu(const TransferRequest& request, std::uint64_t remaining_bytes, TimeNs now_ns, RequestId self) {
    if (request.deadline_ns == 0) return 0;
    const TimeNs left = time_until(now_ns, request.deadline_ns);
    auto path = scheduler.route(request.from, request.to, now_ns);
    if (left <= 0 || !path) return kMluUnbounded;
    reroute_waiting(now_ns);
    estimator.sync(transport.paths());  // a peer may have connected since
    const double capacity = static_cast<double>(left) * estimator.estimate_gbps(*path) -
                            static_cast<double>(bytes_ahead(request, *path, self));
    if (capacity <= 0) return kMluUnbounded;
    return std::min(kMluUnbounded, static_cast<double>(remaining_bytes) / capacity);
  }

  void signal(const Owner& o) {
    if (!local_recompute) return;
    ++stats.signalled;
    local_recompute(o.id, o.request);
  }

  // Ends an owner that never reached the scheduler.
  void end_here(Owner& o, RequestState state, Status status, TimeNs now_ns) {
    RequestStatus s;
    s.state = state;
    s.status = std::move(status);
    s.qos = o.request.qos;
    s.bytes = o.request.bytes;
    s.deadline_ns = o.request.deadline_ns;
    s.submitted_ns = o.submitted_ns;
    s.completed_ns = now_ns;
    ended[o.id] = std::move(s);
    unwait(o);
    expiries.erase({o.expires_ns, o.id});
    const RequestId id = o.id;
    owners.erase(id);
    if (end_hook) end_hook(id);
  }

  void end_infeasible(Owner& o, double mlu_now, TimeNs now_ns) {
    ++stats.infeasible;
    const Owner copy = o;
    Status why = Status::deadline_infeasible(
        "request {}: MLU {:.3g} >= theta_local {} ({} bytes left, {} ns to the deadline); recompute locally", o.id,
        mlu_now, a.theta_local, remaining(o), time_until(now_ns, o.request.deadline_ns));
    if (o.admitted) {
      (void)scheduler.abandon(o.id, std::move(why), now_ns);  // the finish hook settles capacity
    } else {
      end_here(o, RequestState::kInfeasible, std::move(why), now_ns);
    }
    signal(copy);
  }

  void maybe_compress(Owner& o) {
    if (o.compressed || o.band < Band::kCompress || !codec || !o.admitted) return;
    // Codec time is charged as lane time: one byte of payload costs 1/ratio
    // bytes on the wire plus what the path could have sent while the codec
    // ran on both ends (docs/admission.md).
    if (!o.path) return;
    const double path_gbps = estimator.estimate_gbps(*o.path);
    const double ratio = 1.0 / profile.ratio +
                         path_gbps * (1.0 / profile.compress_gbps + 1.0 / profile.decompress_gbps);
    if (!(ratio < 1.0)) return;  // compression does not pay on this path
    if (scheduler.set_wire_ratio(o.id, ratio).is_ok()) {
      o.compressed = true;
      ++stats.compressed;
    }
  }

  // Re-evaluating a running request only matters when something can be
  // done about a higher band: a codec to switch to, or a callback to signal.
  [[nodiscard]] bool can_degrade() const { return codec != nullptr || static_cast<bool>(local_recompute); }

  [[nodiscard]] bool fits(const Owner& o) const {
    if (a.max_owners > 0 && admitted_owners >= a.max_owners) return false;
    if (a.max_inflight_bytes > 0 && admitted_owners > 0 &&
        (admitted_bytes > a.max_inflight_bytes || o.request.bytes > a.max_inflight_bytes - admitted_bytes)) {
      return false;
    }
    return true;
  }

  void admit(Owner& o, TimeNs now_ns) {
    unwait(o);
    if (Status s = scheduler.submit(o.id, o.request, now_ns); !s.is_ok()) {
      end_here(o, RequestState::kFailed, std::move(s), now_ns);
      return;
    }
    o.admitted = true;
    if (!o.path) {  // none at submit: the scheduler has routed it now
      if (auto routed = scheduler.route(o.request.from, o.request.to, now_ns)) o.path = *routed;
    }
    ++admitted_owners;
    admitted_bytes += o.request.bytes;
    ++stats.admitted;
    maybe_compress(o);
    if (o.request.deadline_ns != 0 && can_degrade()) {
      o.next_eval_ns = time_after(now_ns, a.reevaluate_interval_ns);
      timers.insert({o.next_eval_ns, o.id});
    }
  }

  // Admits every waiting owner that fits, in order. An owner that does not
  // fit keeps its place but does not block smaller ones behind it — unless it
  // has waited past the starvation bound: then it reserves the capacity and
  // nothing passes it.
  void admit_waiting(TimeNs now_ns) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      Owner& o = owners.at(it->second);
      ++it;  // admit() erases o's entry
      if (fits(o)) {
        admit(o, now_ns);
        continue;
      }
      if (a.max_owners > 0 && admitted_owners >= a.max_owners) break;  // nothing else fits either
      if (time_until(o.submitted_ns, now_ns) >= policy.starvation_bound_ns) break;
    }
  }

  void drop_infeasible_waiting(TimeNs now_ns) {
    if (!a.drop_infeasible || waiting.empty() || now_ns < next_drop_scan_ns) return;
    next_drop_scan_ns = time_after(now_ns, a.reevaluate_interval_ns);
    std::vector<RequestId> ids;
    for (const auto& [key, id] : waiting) ids.push_back(id);
    for (RequestId id : ids) {
      Owner& o = owners.at(id);
      if (o.request.deadline_ns == 0) continue;
      const double m = mlu(o.request, o.request.bytes, now_ns, id);
      if (m >= a.theta_local) {
        ++stats.dropped;
        end_infeasible(o, m, now_ns);
      }
    }
  }

  // Owners past their transfer timeout end `timeout`: one still waiting at
  // once, an admitted one through the scheduler (kCancelling until what it
  // posted is settled).
  void expire(TimeNs now_ns) {
    while (!expiries.empty() && expiries.begin()->first <= now_ns) {
      const auto [at, id] = *expiries.begin();
      expiries.erase(expiries.begin());
      const auto it = owners.find(id);
      if (it == owners.end()) continue;
      Owner& o = it->second;
      Status why = Status::timeout("request {}: not done {} after submit (transfer timeout)", id,
                                   format_duration(at - o.submitted_ns));
      if (o.admitted) {
        (void)scheduler.abandon(id, std::move(why), now_ns);  // refused only when already stopping
      } else {
        end_here(o, RequestState::kTimedOut, std::move(why), now_ns);
      }
    }
  }

  void reevaluate(Owner& o, TimeNs now_ns) {
    ++stats.reevaluations;
    o.slices_since_eval = 0;
    const double m = mlu(o.request, remaining(o), now_ns, o.id);
    const Band band = band_of(m);
    // Bands only rise. Compression is reconsidered while in its band: the
    // path's estimate may have fallen to what makes it pay (a new peer's
    // path starts from the cost model's figure).
    if (band <= o.band) {
      if (o.band == Band::kCompress) maybe_compress(o);
      return;
    }
    o.band = band;
    ++stats.promotions;
    if (band == Band::kLocal && local_recompute) {
      end_infeasible(o, m, now_ns);
      return;
    }
    maybe_compress(o);
  }

  void settle_finished() {
    for (RequestId id : finished) {
      const auto it = owners.find(id);
      if (it == owners.end() || !it->second.admitted) continue;
      --admitted_owners;
      admitted_bytes -= it->second.request.bytes;
      timers.erase({it->second.next_eval_ns, id});
      expiries.erase({it->second.expires_ns, id});
      owners.erase(it);
    }
    finished.clear();
  }
};

AdmissionController::AdmissionController(std::unique_ptr<State> state) : state_(std::move(state)) {}
AdmissionController::~AdmissionController() = default;

Result<std::unique_ptr<AdmissionController>> AdmissionController::create(const sched::SchedPolicy& policy,
                                                                         sched::Scheduler& scheduler,
                                                                         transport::Transport& transport) {
  if (Status s = policy.validate(); !s.is_ok()) return std::unexpected(s);
  auto estimator = BandwidthEstimator::create(transport.paths(), policy.admission.estimator_alpha);
  if (!estimator) return std::unexpected(estimator.error());
  return std::unique_ptr<AdmissionController>(
      new AdmissionController(std::make_unique<State>(policy, scheduler, transport, std::move(*estimator))));
}

void AdmissionController::set_local_recompute(LocalRecompute callback) {
  state_->local_recompute = std::move(callback);
}

Status AdmissionController::set_codec(std::shared_ptr<const Codec> codec, CodecProfile profile) {
  if (codec == nullptr) return Status::invalid_argument("set_codec: no codec (null)");
  if (!state_->transport.carries_compressed_slices()) {
    return Status::failed_precondition(
        "set_codec: {}: this engine's transport cannot carry compressed slices, so the compress band would shorten "
        "transfers; no codec registered",
        codec->name());
  }
  // A rate may be +inf (measure() says so when there was nothing to undo).
  if (!(profile.ratio >= 1) || !std::isfinite(profile.ratio) || !(profile.compress_gbps > 0) ||
      !(profile.decompress_gbps > 0)) {
    return Status::invalid_argument(
        "set_codec: profile ratio {} (expected >= 1), compress {} GB/s and decompress {} GB/s (expected > 0)",
        profile.ratio, profile.compress_gbps, profile.decompress_gbps);
  }
  if (Status s = state_->transport.set_codec(codec); !s.is_ok()) return s;
  state_->codec = std::move(codec);
  state_->profile = profile;
  return Status::ok();
}

void AdmissionController::set_mlu_observer(MluObserver observer) { state_->observe_mlu = std::move(observer); }

Status AdmissionController::submit(RequestId id, const TransferRequest& request, TimeNs now_ns) {
  State& st = *state_;
  // Refused here, not only when the scheduler takes it: a waiting owner is
  // counted (bytes, class) before it is admitted.
  if (Status s = sched::check_request(id, request); !s.is_ok()) return s;
  if (st.owners.contains(id) || st.ended.contains(id) || st.scheduler.has(id)) {
    return Status::already_exists("submit: request {} exists already", id);
  }
  auto path = st.scheduler.route(request.from, request.to, now_ns);
  if (!path && path.error().code() != StatusCode::kUnavailable) return path.error();
  Owner& o = st.owners[id];
  o.id = id;
  o.request = request;
  o.seq = st.next_seq++;
  o.submitted_ns = now_ns;
  if (path) o.path = *path;
  o.expires_ns = time_after(now_ns, request.timeout_ns != 0 ? request.timeout_ns : st.policy.transfer_timeout_ns);
  st.expiries.insert({o.expires_ns, id});
  if (request.deadline_ns != 0) {
    const double m = st.mlu(request, request.bytes, now_ns, id);
    if (st.observe_mlu) st.observe_mlu(m, request.op);
    o.band = st.band_of(m);
    if (o.band == Band::kLocal && st.local_recompute) {
      st.end_infeasible(o, m, now_ns);
      return Status::ok();  // the status says deadline_infeasible; the callback has fired
    }
  }
  st.wait(o);
  st.admit_waiting(now_ns);
  return Status::ok();
}

Status AdmissionController::cancel(RequestId id, TimeNs now_ns) {
  State& st = *state_;
  if (const auto e = st.ended.find(id); e != st.ended.end()) {
    return Status::invalid_argument("cancel: request {} already ended ({})", id, to_string(e->second.state));
  }
  const auto it = st.owners.find(id);
  if (it != st.owners.end() && !it->second.admitted) {
    st.end_here(it->second, RequestState::kCancelled, Status::cancelled("request {} cancelled", id), now_ns);
    return Status::ok();
  }
  return st.scheduler.cancel(id, now_ns);
}

Result<RequestStatus> AdmissionController::status(RequestId id) const {
  const State& st = *state_;
  if (const auto e = st.ended.find(id); e != st.ended.end()) return e->second;
  if (const auto it = st.owners.find(id); it != st.owners.end() && !it->second.admitted) {
    RequestStatus s;
    s.qos = it->second.request.qos;
    s.bytes = it->second.request.bytes;
    s.deadline_ns = it->second.request.deadline_ns;
    s.submitted_ns = it->second.submitted_ns;
    return s;
  }
  return st.scheduler.status(id);
}

void AdmissionController::on_completion(const transport::Completion& c, RequestId request, TimeNs now_ns) {
  State& st = *state_;
  if (c.status.is_ok()) {
    // A new peer, UCX chose its transport, or the path's id went to another
    // peer (the last two move paths_version). paths() is not free: not per slice.
    if (const std::uint64_t version = st.transport.paths_version();
        !st.estimator.measured(c.path) || version != st.estimator_version) {
      st.estimator.sync(st.transport.paths());
      st.estimator_version = version;
    }
    st.estimator.on_completion(c.path, c.wire_bytes != 0 ? c.wire_bytes : c.bytes, c.at_ns, st.scheduler.load(c.path).inflight_slices > 0);
  }
  const auto it = st.owners.find(request);
  if (it == st.owners.end() || !it->second.admitted || it->second.request.deadline_ns == 0 || !st.can_degrade()) {
    return;
  }
  if (++it->second.slices_since_eval >= st.a.reevaluate_slices) {
    const auto s = st.scheduler.status(request);
    if (s && (s->state == RequestState::kQueued || s->state == RequestState::kRunning)) st.reevaluate(it->second, now_ns);
  }
}

void AdmissionController::on_finish(RequestId id) {
  state_->finished.push_back(id);
  if (state_->end_hook) state_->end_hook(id);
}

void AdmissionController::set_end_hook(std::function<void(RequestId)> hook) { state_->end_hook = std::move(hook); }

Status AdmissionController::forget(RequestId id) {
  State& st = *state_;
  if (st.ended.erase(id) > 0) return Status::ok();
  if (st.owners.contains(id)) return Status::invalid_argument("forget: request {} is still live", id);
  return st.scheduler.forget(id);
}

void AdmissionController::tick(TimeNs now_ns) {
  State& st = *state_;
  st.settle_finished();
  while (!st.timers.empty() && st.timers.begin()->first <= now_ns) {
    const RequestId id = st.timers.begin()->second;
    st.timers.erase(st.timers.begin());
    const auto it = st.owners.find(id);
    if (it == st.owners.end()) continue;
    Owner& o = it->second;
    const auto s = st.scheduler.status(id);
    if (!s || (s->state != RequestState::kQueued && s->state != RequestState::kRunning)) continue;
    st.reevaluate(o, now_ns);
    if (st.owners.contains(id)) {
      o.next_eval_ns = time_after(now_ns, st.a.reevaluate_interval_ns);
      st.timers.insert({o.next_eval_ns, id});
    }
  }
  st.settle_finished();
  st.expire(now_ns);
  st.settle_finished();
  st.drop_infeasible_waiting(now_ns);
  st.admit_waiting(now_ns);
}

std::optional<TimeNs> AdmissionController::next_timer_ns() const {
  const State& st = *state_;
  std::optional<TimeNs> t;
  if (!st.timers.empty()) t = st.timers.begin()->first;
  if (!st.expiries.empty()) t = t ? std::min(*t, st.expiries.begin()->first) : st.expiries.begin()->first;
  if (st.a.drop_infeasible && !st.waiting.empty()) {
    t = t ? std::min(*t, st.next_drop_scan_ns) : st.next_drop_scan_ns;
  }
  return t;
}

double AdmissionController::mlu(const TransferRequest& request, std::uint64_t remaining_bytes, TimeNs now_ns,
                                RequestId self) {
  return state_->mlu(request, remaining_bytes, now_ns, self);
}

Band AdmissionController::band_of(double mlu) const { return state_->band_of(mlu); }
const AdmissionStats& AdmissionController::stats() const { return state_->stats; }
std::size_t AdmissionController::waiting() const { return state_->waiting.size(); }
double AdmissionController::estimate_gbps(transport::PathId path) const { return state_->estimator.estimate_gbps(path); }

}  // namespace baton::admission
