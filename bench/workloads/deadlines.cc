#include "workloads/deadlines.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "baton/engine/engine.h"
#include "baton/engine/harness.h"
#include "workloads/ucx_rig.h"

namespace baton::workloads {
namespace {

using sched::PolicyKind;
using sched::QosClass;

struct Arrival {
  TimeNs at_ns = 0;
  WorkloadClass cls = WorkloadClass::kDecode;
  std::uint64_t bytes = 0;
  TimeNs window_ns = 0;  // deadline − arrival; 0: none
};

double background_share(const DeadlinesWorkload& w) { return 1.0 - w.decode_share - w.prefill_share; }

TimeNs transfer_ns(std::uint64_t bytes, double link_gbps) {
  return static_cast<TimeNs>(std::ceil(static_cast<double>(bytes) / link_gbps));
}

// Each class arrives as a Poisson stream carrying its share of the offered
// bytes; a pure function of the seed and the link figure.
std::vector<Arrival> arrivals(const DeadlinesWorkload& w, double link_gbps) {
  std::mt19937_64 rng(w.seed);
  const double offered = w.load * link_gbps;  // bytes per ns
  std::vector<Arrival> out;
  auto stream = [&](WorkloadClass cls, double share, double mean_bytes, auto&& make) {
    if (share <= 0) return;
    std::exponential_distribution<double> gap(offered * share / mean_bytes);
    for (double t = gap(rng); t < static_cast<double>(w.duration_ns); t += gap(rng)) {
      Arrival a = make();
      a.at_ns = static_cast<TimeNs>(t);
      a.cls = cls;
      out.push_back(a);
    }
  };
  std::uniform_int_distribution<std::size_t> decode_pick(0, w.decode_deadlines_ns.size() - 1);
  std::uniform_int_distribution<std::size_t> prefill_pick(0, w.prefill_bytes.size() - 1);
  const double prefill_mean = static_cast<double>(std::reduce(w.prefill_bytes.begin(), w.prefill_bytes.end(),
                                                              std::uint64_t{0})) /
                              static_cast<double>(w.prefill_bytes.size());
  stream(WorkloadClass::kDecode, w.decode_share, static_cast<double>(w.decode_bytes), [&] {
    return Arrival{0, {}, w.decode_bytes, w.decode_deadlines_ns[decode_pick(rng)]};
  });
  stream(WorkloadClass::kPrefill, w.prefill_share, prefill_mean, [&] {
    const std::uint64_t bytes = w.prefill_bytes[prefill_pick(rng)];
    const auto window = static_cast<TimeNs>(w.prefill_slack * static_cast<double>(transfer_ns(bytes, link_gbps)));
    return Arrival{0, {}, bytes, std::max<TimeNs>(window, 1)};
  });
  stream(WorkloadClass::kBackground, background_share(w), static_cast<double>(w.background_bytes),
         [&] { return Arrival{0, {}, w.background_bytes, 0}; });
  std::ranges::stable_sort(out, {}, &Arrival::at_ns);
  return out;
}

QosClass qos_of(WorkloadClass c) {
  switch (c) {
    case WorkloadClass::kDecode: return QosClass::kDecodeCritical;
    case WorkloadClass::kPrefill: return QosClass::kPrefillBulk;
    case WorkloadClass::kBackground: return QosClass::kBackground;
  }
  return QosClass::kBackground;
}

// Per class statuses → the policy's row.
PolicyRun summarize(const std::vector<Arrival>& all, const std::vector<sched::RequestStatus>& statuses, TimeNs end_ns,
                    TimeNs run_ns) {
  PolicyRun run;
  std::vector<sched::RequestStatus> per_class[kWorkloadClassCount];
  for (std::size_t i = 0; i < all.size(); ++i) per_class[static_cast<int>(all[i].cls)].push_back(statuses[i]);
  std::uint64_t with_deadline = 0;
  std::uint64_t on_time = 0;
  std::uint64_t good_bytes = 0;
  for (int c = 0; c < kWorkloadClassCount; ++c) {
    run.classes[c] = summarize_class(per_class[c], end_ns);
    with_deadline += run.classes[c].with_deadline;
    on_time += run.classes[c].on_time;
    good_bytes += run.classes[c].bytes_on_time;
  }
  run.on_time_fraction = with_deadline == 0 ? 1.0 : static_cast<double>(on_time) / static_cast<double>(with_deadline);
  run.goodput_gbps = static_cast<double>(good_bytes) / static_cast<double>(run_ns);
  return run;
}

Result<PolicyRun> run_sim(const DeadlinesWorkload& w, const std::vector<Arrival>& all, TimeNs run_ns,
                          const sched::SchedPolicy& policy) {
  engine::HarnessConfig config;
  config.topology_model = w.topology_model;
  config.policy = policy;
  config.sim.seed = w.seed;
  auto engine = engine::Harness::create(config);
  if (!engine) return std::unexpected(engine.error());
  engine::Harness& e = **engine;
  std::uint64_t signalled = 0;
  if (policy.admission.drop_infeasible) {
    e.admission().set_local_recompute([&signalled](sched::RequestId, const sched::TransferRequest&) { ++signalled; });
  }
  std::vector<sched::RequestId> ids;
  ids.reserve(all.size());
  for (const Arrival& a : all) {
    if (Status s = e.run_until(a.at_ns); !s.is_ok()) return std::unexpected(s);
    const TimeNs deadline = a.window_ns == 0 ? 0 : a.at_ns + a.window_ns;
    auto id = e.submit({w.from, w.to, a.bytes, qos_of(a.cls), deadline, true});
    if (!id) return std::unexpected(id.error());
    ids.push_back(*id);
  }
  if (Status s = e.run_until(run_ns); !s.is_ok()) return std::unexpected(s);
  std::vector<sched::RequestStatus> statuses;
  statuses.reserve(ids.size());
  for (sched::RequestId id : ids) {
    auto s = e.status(id);
    if (!s) return std::unexpected(s.error());
    statuses.push_back(*s);
  }
  PolicyRun run = summarize(all, statuses, run_ns, run_ns);
  run.signalled = signalled;
  run.stats = e.stats();
  return run;
}

Result<PolicyRun> run_ucx(const DeadlinesWorkload& w, DeadlinesResult& result, std::vector<Arrival>& all,
                          const sched::SchedPolicy& policy, const std::string& peer_address,
                          const transport::UcxConfig& ucx) {
  const std::uint64_t largest = w.largest_request_bytes();
  std::atomic<std::uint64_t> signalled{0};
  auto rig = connect_rig(policy, peer_address, ucx, largest, [&](engine::Engine& e) {
    if (policy.admission.drop_infeasible) {
      e.admission().set_local_recompute(
          [&signalled](sched::RequestId, const sched::TransferRequest&) { signalled.fetch_add(1); });
    }
  });
  if (!rig) return std::unexpected(Status(rig.error().code(), "deadlines: " + rig.error().message()));
  engine::Engine& e = *(*rig)->engine;
  const engine::Request like = (*rig)->read(0);
  if (result.link_gbps == 0) {
    auto gbps = measure_link(**rig, std::min<std::uint64_t>(largest, 4ULL << 20));
    if (!gbps) return std::unexpected(gbps.error());
    result.link_gbps = *gbps;
  }
  if (all.empty()) {
    if (Status s = w.within_request_bound(result.link_gbps); !s.is_ok()) return std::unexpected(s);
    result.run_ns = w.run_ns(result.link_gbps);
    all = arrivals(w, result.link_gbps);
  }

  std::vector<engine::BatchHandle> handles;
  handles.reserve(all.size());
  const TimeNs start = e.now_ns();
  for (const Arrival& a : all) {
    const TimeNs due = start + a.at_ns;
    if (const TimeNs now = e.now_ns(); now < due) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
    engine::Request r = like;
    r.length = a.bytes;
    r.qos = qos_of(a.cls);
    r.deadline_ns = a.window_ns == 0 ? 0 : e.now_ns() + a.window_ns;
    auto h = e.submit(engine::Batch{{r}, {}});
    if (!h) return std::unexpected(h.error());
    handles.push_back(*h);
  }
  const TimeNs end = start + result.run_ns;
  if (const TimeNs now = e.now_ns(); now < end) std::this_thread::sleep_for(std::chrono::nanoseconds(end - now));
  // The snapshot at the end of the run is what counts; what still runs is
  // then cancelled, and waited for, since it reads into `buffer`.
  std::vector<sched::RequestStatus> statuses;
  statuses.reserve(handles.size());
  for (engine::BatchHandle h : handles) {
    auto st = e.poll(h);
    if (!st) return std::unexpected(st.error());
    statuses.push_back(st->requests.front());
  }
  for (engine::BatchHandle h : handles) {
    if (auto st = e.poll(h); st && !st->done) (void)e.cancel(h);
    (void)e.wait(h, 30'000'000'000);
    (void)e.release(h);
  }
  PolicyRun run = summarize(all, statuses, end, result.run_ns);
  run.signalled = signalled.load();
  run.stats = e.stats();
  return run;
}

}  // namespace

std::string_view to_string(WorkloadClass c) {
  switch (c) {
    case WorkloadClass::kDecode: return "decode";
    case WorkloadClass::kPrefill: return "prefill";
    case WorkloadClass::kBackground: return "background";
  }
  return "?";
}

Status DeadlinesWorkload::validate() const {
  if (!(load > 0) || !std::isfinite(load)) return Status::invalid_argument("deadlines: load {} must be > 0", load);
  if (!(link_gbps >= 0) || !std::isfinite(link_gbps)) {
    return Status::invalid_argument("deadlines: link_gbps {} must be >= 0", link_gbps);
  }
  if (!(decode_share >= 0) || !(prefill_share >= 0) || !(decode_share + prefill_share <= 1.0)) {
    return Status::invalid_argument("deadlines: shares decode {} and prefill {} must be >= 0 and add up to <= 1",
                                    decode_share, prefill_share);
  }
  if (decode_bytes == 0 || background_bytes == 0) {
    return Status::invalid_argument("deadlines: decode and background sizes must be > 0");
  }
  if (decode_deadlines_ns.empty()) return Status::invalid_argument("deadlines: no decode deadlines");
  for (TimeNs d : decode_deadlines_ns) {
    if (d <= 0) return Status::invalid_argument("deadlines: decode deadline {} ns must be > 0", d);
  }
  if (prefill_bytes.empty()) return Status::invalid_argument("deadlines: no prefill sizes");
  for (std::uint64_t b : prefill_bytes) {
    if (b == 0) return Status::invalid_argument("deadlines: a prefill size is 0");
  }
  // Above a million transfer times a deadline is no deadline, and far above
  // it overflows the nanosecond clock (1e15 missed every prefill).
  if (!(prefill_slack > 0) || !(prefill_slack <= 1e6)) {
    return Status::invalid_argument("deadlines: prefill_slack {} must be > 0 and at most 1e6", prefill_slack);
  }
  if (duration_ns <= 0) return Status::invalid_argument("deadlines: duration {} ns must be > 0", duration_ns);
  return within_request_bound(link_gbps);
}

Status DeadlinesWorkload::within_request_bound(double link) const {
  // Every request is generated up front: 1-byte requests at full load
  // would be billions, and the run would exhaust memory.
  constexpr double kMaxRequests = 2e7;
  const std::uint64_t smallest = std::min({decode_bytes, background_bytes, *std::ranges::min_element(prefill_bytes)});
  const double requests = load * link * static_cast<double>(duration_ns) / static_cast<double>(smallest);
  if (requests > kMaxRequests) {
    return Status::invalid_argument(
        "deadlines: up to {:.3g} requests ({} B at load {} of {} GB/s for {} ns; at most {:.0e}): raise the sizes "
        "or shorten the duration",
        requests, smallest, load, link, duration_ns, kMaxRequests);
  }
  return Status::ok();
}

std::uint64_t DeadlinesWorkload::largest_request_bytes() const {
  std::uint64_t largest = std::max(decode_bytes, background_bytes);
  for (std::uint64_t b : prefill_bytes) largest = std::max(largest, b);
  return largest;
}

TimeNs DeadlinesWorkload::run_ns(double link) const {
  TimeNs longest = *std::ranges::max_element(decode_deadlines_ns);
  const std::uint64_t biggest = *std::ranges::max_element(prefill_bytes);
  longest = std::max(longest, static_cast<TimeNs>(prefill_slack * static_cast<double>(transfer_ns(biggest, link))));
  return duration_ns + longest;
}

sched::SchedPolicy policy_for(PolicyKind kind, const sched::SchedPolicy& base) {
  sched::SchedPolicy p = base;
  p.kind = kind;
  if (kind == PolicyKind::kDeadlineAware) {
    p.admission.order = sched::AdmissionOrder::kEdf;
    p.admission.drop_infeasible = true;
  }
  return p;
}

Result<DeadlinesResult> run_deadlines(const DeadlinesWorkload& w, const std::vector<PolicyKind>& policies,
                                      const sched::SchedPolicy& base) {
  if (Status s = w.validate(); !s.is_ok()) return std::unexpected(s);
  DeadlinesResult result;
  // The link is checked even with link_gbps given: every request of the
  // run would fail on it, and the caller named it.
  engine::HarnessConfig config;
  config.topology_model = w.topology_model;
  config.policy = base;  // its cost_model changes the path the runs use, so the load follows it
  auto probe = engine::Harness::create(config);
  if (!probe) return std::unexpected(probe.error());
  auto route = (*probe)->topology().rank(w.from, w.to);
  if (!route) {
    return std::unexpected(Status::invalid_argument("deadlines: no link {} -> {} in topology model \"{}\": {}", w.from,
                                                    w.to, w.topology_model, route.error().message()));
  }
  result.link_gbps = w.link_gbps != 0 ? w.link_gbps : route->best().cost.bandwidth_gbps;
  if (Status s = w.within_request_bound(result.link_gbps); !s.is_ok()) return std::unexpected(s);
  result.run_ns = w.run_ns(result.link_gbps);
  const std::vector<Arrival> all = arrivals(w, result.link_gbps);
  for (PolicyKind kind : policies) {
    auto run = run_sim(w, all, result.run_ns, policy_for(kind, base));
    if (!run) return std::unexpected(run.error());
    result.policies.emplace_back(kind, std::move(*run));
  }
  return result;
}

}  // namespace baton::workloads

namespace baton::workloads {

Result<DeadlinesResult> run_deadlines_ucx(const DeadlinesWorkload& w, const std::vector<PolicyKind>& policies,
                                          const sched::SchedPolicy& base, const std::string& peer,
                                          const transport::UcxConfig& ucx) {
  if (Status s = w.validate(); !s.is_ok()) return std::unexpected(s);
  DeadlinesResult result;
  result.link_gbps = w.link_gbps;
  std::vector<Arrival> all;  // drawn once the link figure is known, then the same for every policy
  if (result.link_gbps != 0) {
    result.run_ns = w.run_ns(result.link_gbps);
    all = arrivals(w, result.link_gbps);
  }
  for (PolicyKind kind : policies) {
    auto run = run_ucx(w, result, all, policy_for(kind, base), peer, ucx);
    if (!run) return std::unexpected(run.error());
    result.policies.emplace_back(kind, std::move(*run));
  }
  return result;
}

}  // namespace baton::workloads
