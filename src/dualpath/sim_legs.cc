// DualPath's runs over the simulation harness: each run is one
// TransferRequest between topology endpoints, its bytes landing at the
// handoff's remote_addr + offset; the virtual clock moves when asked.
#include <fmt/format.h>

#include "legs.h"

namespace baton::dualpath::detail {
namespace {

class SimLegs final : public Legs {
 public:
  explicit SimLegs(engine::Harness& harness) : harness_(harness) {}

  [[nodiscard]] TimeNs now_ns() const override { return harness_.now_ns(); }
  [[nodiscard]] bool wall_clock() const override { return false; }

  [[nodiscard]] Status validate(const HandoffRequest& r) const override {
    for (const std::string* from : {&r.direct_from, &r.store_from}) {
      if (*from == r.to) {
        return Status::invalid_argument("dualpath submit: source and destination are both \"{}\"", r.to);
      }
      if (auto route = harness_.topology().rank(*from, r.to); !route) {
        return Status(route.error().code(), fmt::format("dualpath submit: {} leg: {}",
                                                        from == &r.direct_from ? "direct" : "store",
                                                        route.error().message()));
      }
    }
    return Status::ok();
  }

  [[nodiscard]] Result<RunId> start(const HandoffRequest& h, Leg leg, sched::ByteRange range,
                                    TimeNs /*timeout_at_ns*/) override {
    sched::TransferRequest r;
    r.from = leg == Leg::kDirect ? h.direct_from : h.store_from;
    r.to = h.to;
    r.bytes = range.length;
    r.qos = h.qos;
    r.deadline_ns = h.deadline_ns;
    r.remote_addr = h.remote_addr + range.offset;
    return harness_.submit(r);
  }

  std::optional<std::uint64_t> cancel(RunId run) override {
    const std::uint64_t before = harness_.stats().bytes_wasted;
    if (!harness_.cancel(run).is_ok()) return std::nullopt;
    return harness_.stats().bytes_wasted - before;
  }

  [[nodiscard]] RunView view(RunId run) override {
    RunView v;
    auto st = harness_.status(run);
    if (!st) {
      v.state = sched::RequestState::kFailed;
      v.status = st.error();
      v.settled = true;
      return v;
    }
    v.state = st->state;
    v.status = st->status;
    auto progress = harness_.progress(run);
    if (progress) v.delivered = progress->delivered;
    v.settled = v.ended() && (!progress || progress->posted.empty());
    return v;
  }

  void forget(RunId /*run*/) override {}

  [[nodiscard]] Result<RunId> probe(const HandoffRequest& h, Leg leg, const DualPathConfig& config) override {
    sched::TransferRequest probe;
    probe.from = leg == Leg::kDirect ? h.direct_from : h.store_from;
    probe.to = h.to;
    probe.bytes = config.probe_bytes;
    probe.qos = sched::QosClass::kDecodeCritical;
    probe.remote_addr = config.probe_remote_addr;
    return harness_.submit(probe);
  }

  [[nodiscard]] double expected_direct_ns(const HandoffRequest& h) const override {
    auto route = harness_.topology().rank(h.direct_from, h.to);
    if (!route) return 0;
    const auto& cost = route->best().cost;
    return static_cast<double>(h.bytes) / cost.bandwidth_gbps + cost.latency_us * 1000.0;
  }

  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override { return harness_.next_event_ns(); }
  [[nodiscard]] Status advance(TimeNs t_ns) override { return harness_.run_until(t_ns); }
  [[nodiscard]] bool busy() const override { return harness_.scheduler().queued_requests() != 0; }
  [[nodiscard]] engine::MetricsRegistry& metrics() override { return harness_.metrics(); }

 private:
  engine::Harness& harness_;
};

}  // namespace

std::unique_ptr<Legs> sim_legs(engine::Harness& harness) { return std::make_unique<SimLegs>(harness); }

}  // namespace baton::dualpath::detail
