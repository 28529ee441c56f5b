#include "workloads/mixed.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "baton/common/stats.h"
#include "baton/engine/engine.h"
#include "baton/engine/harness.h"
#include "workloads/ucx_rig.h"

namespace baton::workloads {

using engine::Batch;
using engine::BatchHandle;
using engine::Engine;
using engine::Harness;
using engine::HarnessConfig;
using engine::Request;
using transport::CudaRuntime;

namespace {

struct Arrival {
  TimeNs at_ns;
  bool decode;
};

// Arrivals of both streams, merged in time order; a pure function of the seed.
std::vector<Arrival> arrivals(const MixedWorkload& w) {
  std::mt19937_64 rng(w.seed);
  std::exponential_distribution<double> prefill_gap(1.0 / static_cast<double>(w.prefill_interval_ns));
  std::exponential_distribution<double> decode_gap(1.0 / static_cast<double>(w.decode_interval_ns));
  std::vector<Arrival> out;
  for (double t = 0; t < static_cast<double>(w.duration_ns); t += prefill_gap(rng)) {
    for (int i = 0; i < w.prefill_burst; ++i) out.push_back({static_cast<TimeNs>(t), false});
  }
  for (double t = decode_gap(rng); t < static_cast<double>(w.duration_ns); t += decode_gap(rng)) {
    out.push_back({static_cast<TimeNs>(t), true});
  }
  std::ranges::stable_sort(out, {}, &Arrival::at_ns);
  return out;
}

ClassResult summarize_class(const std::vector<sched::RequestStatus>& done) {
  ClassResult r;
  std::vector<double> latencies;
  std::uint64_t bytes = 0;
  std::uint64_t missed = 0;
  std::uint64_t with_deadline = 0;
  TimeNs first = 0;
  TimeNs last = 0;
  for (const sched::RequestStatus& s : done) {
    if (s.deadline_ns != 0) {
      ++with_deadline;
      missed += s.deadline_missed();
    }
    if (s.state != sched::RequestState::kCompleted) continue;
    latencies.push_back(static_cast<double>(s.completed_ns - s.submitted_ns) / 1000.0);
    bytes += s.bytes;
    first = latencies.size() == 1 ? s.submitted_ns : std::min(first, s.submitted_ns);
    last = std::max(last, s.completed_ns);
  }
  r.count = latencies.size();
  if (auto sum = summarize(latencies)) {
    r.p50_us = sum->p50;
    r.p95_us = sum->p95;
    r.p99_us = sum->p99;
    for (int p = 0; p <= 100; ++p) r.cdf_us.push_back(*percentile(latencies, p));
  }
  r.miss_ratio = with_deadline == 0 ? 0 : static_cast<double>(missed) / static_cast<double>(with_deadline);
  r.throughput_gbps = last > first ? static_cast<double>(bytes) / static_cast<double>(last - first) : 0;
  return r;
}

}  // namespace

Status MixedWorkload::validate() const {
  if (prefill_bytes == 0 || decode_bytes == 0) return Status::invalid_argument("mixed workload: request sizes must be > 0");
  if (prefill_burst < 1) return Status::invalid_argument("mixed workload: prefill_burst {} must be >= 1", prefill_burst);
  if (prefill_interval_ns <= 0 || decode_interval_ns <= 0) {
    return Status::invalid_argument("mixed workload: arrival intervals must be > 0");
  }
  if (decode_deadline_ns <= 0) return Status::invalid_argument("mixed workload: decode deadline must be > 0");
  if (duration_ns <= 0) return Status::invalid_argument("mixed workload: duration {} ns must be > 0", duration_ns);
  // Every arrival is generated up front: bounded, so that a huge burst, a
  // tiny interval or an hour-long duration is refused, not run out of memory.
  const double duration = static_cast<double>(duration_ns);
  const double expected = duration / static_cast<double>(prefill_interval_ns) * prefill_burst +
                          duration / static_cast<double>(decode_interval_ns);
  if (expected > static_cast<double>(kMostArrivals)) {
    return Status::invalid_argument(
        "mixed workload: about {:.0f} requests would arrive (at most {}): shorten the duration, lengthen the "
        "intervals or shrink the prefill burst",
        expected, kMostArrivals);
  }
  return Status::ok();
}

Result<MixedResult> run_mixed(const MixedWorkload& w, const sched::SchedPolicy& policy) {
  if (Status s = w.validate(); !s.is_ok()) return std::unexpected(s);
  HarnessConfig config;
  config.topology_model = w.topology_model;
  config.policy = policy;
  config.sim.seed = w.seed;
  auto engine = Harness::create(config);
  if (!engine) return std::unexpected(engine.error());
  Harness& e = **engine;

  std::vector<sched::RequestId> decode_ids;
  std::vector<sched::RequestId> prefill_ids;
  for (const Arrival& a : arrivals(w)) {
    if (Status s = e.run_until(a.at_ns); !s.is_ok()) return std::unexpected(s);
    sched::TransferRequest r{w.from, w.to, w.prefill_bytes, sched::QosClass::kPrefillBulk, 0, true};
    if (a.decode) {
      r = {w.from, w.to, w.decode_bytes, sched::QosClass::kDecodeCritical, a.at_ns + w.decode_deadline_ns, false};
    }
    auto id = e.submit(r);
    if (!id) return std::unexpected(id.error());
    (a.decode ? decode_ids : prefill_ids).push_back(*id);
  }
  if (Status s = e.run_until_idle(); !s.is_ok()) return std::unexpected(s);

  auto collect = [&e](const std::vector<sched::RequestId>& ids) {
    std::vector<sched::RequestStatus> out;
    for (sched::RequestId id : ids) out.push_back(*e.status(id));
    return out;
  };
  MixedResult result;
  result.decode_requests = collect(decode_ids);
  result.prefill_requests = collect(prefill_ids);
  result.decode = summarize_class(result.decode_requests);
  result.prefill = summarize_class(result.prefill_requests);
  result.end_ns = e.now_ns();
  result.stats = e.stats();
  result.bytes_delivered = e.sim_transport().bytes_delivered();
  return result;
}

Result<MixedResult> run_mixed_cuda(const MixedWorkload& w, const sched::SchedPolicy& policy,
                                   std::shared_ptr<transport::CudaRuntime> runtime) {
  if (Status s = w.validate(); !s.is_ok()) return std::unexpected(s);
  if (!runtime) return std::unexpected(Status::invalid_argument("mixed: no CUDA runtime (null)"));
  HarnessConfig config;
  config.clock = engine::ClockKind::kWall;
  config.topology_model = w.topology_model;
  config.policy = policy;
  config.cuda = runtime;
  // Memory on each side, released after the harness (whose transport
  // waits for its streams) is gone.
  struct Side {
    void* data = nullptr;
    bool device = false;
    transport::RegionHandle region = 0;
  };
  Side sides[2];
  CudaRuntime& rt = *runtime;
  auto release = [&] {
    for (Side& s : sides) {
      if (s.data == nullptr) continue;
      if (s.device) {
        rt.free_device(s.data);
      } else {
        rt.free_pinned(s.data);
      }
    }
  };
  MixedResult result;
  Status failed = [&]() -> Status {
    auto made = Harness::create(config);
    if (!made) return made.error();
    Harness& h = **made;
    transport::CudaTransport& cuda = *h.cuda_transport();
    const std::uint64_t bytes = w.prefill_bytes + w.decode_bytes;
    for (int i = 0; i < 2; ++i) {
      const std::string& node = i == 0 ? w.from : w.to;
      if (std::ranges::none_of(cuda.paths(), [&](const transport::PathInfo& p) { return p.from == node || p.to == node; })) {
        return Status::not_found("mixed: the CUDA transport has no path from or to \"{}\"", node);
      }
      auto device = cuda.device_of(node);
      auto data = device ? rt.alloc_device(*device, bytes) : rt.alloc_pinned(bytes);
      if (!data) return data.error();
      sides[i] = {*data, device.has_value(), 0};
      auto region = cuda.register_memory(*data, bytes, device ? transport::MemoryKind::kVram : transport::MemoryKind::kDram,
                                         device.value_or(-1));
      if (!region) return region.error();
      sides[i].region = *region;
    }
    auto* src = static_cast<std::byte*>(sides[0].data);
    const auto dst = reinterpret_cast<std::uint64_t>(sides[1].data);

    std::vector<std::pair<sched::RequestId, bool>> ids;
    const auto all = arrivals(w);
    const TimeNs start = h.now_ns();
    for (const Arrival& a : all) {
      const TimeNs due = start + a.at_ns;
      if (const TimeNs now = h.now_ns(); now < due) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
      sched::TransferRequest r{w.from, w.to, w.prefill_bytes, sched::QosClass::kPrefillBulk, 0, true};
      if (a.decode) {
        r = {w.from, w.to, w.decode_bytes, sched::QosClass::kDecodeCritical, h.now_ns() + w.decode_deadline_ns, false};
      }
      r.op = transport::Op::kWrite;
      r.local = a.decode ? src + w.prefill_bytes : src;
      r.remote_key = sides[1].region;
      r.remote_addr = a.decode ? dst + w.prefill_bytes : dst;
      auto id = h.submit(r);
      if (!id) return id.error();
      ids.emplace_back(*id, a.decode);
    }
    for (const auto& [id, decode] : ids) {
      if (Status s = h.wait(id, 600'000'000'000); !s.is_ok()) return s;
      auto st = h.status(id);
      if (!st) return st.error();
      if (st->state == sched::RequestState::kCompleted) result.bytes_delivered += st->bytes;
      (decode ? result.decode_requests : result.prefill_requests).push_back(*st);
    }
    result.end_ns = h.now_ns();
    result.stats = h.stats();
    return Status::ok();
  }();
  release();
  if (!failed.is_ok()) return std::unexpected(Status(failed.code(), "mixed over CUDA: " + failed.message()));
  result.decode = summarize_class(result.decode_requests);
  result.prefill = summarize_class(result.prefill_requests);
  return result;
}

Result<MixedResult> run_mixed_ucx(const MixedWorkload& w, const sched::SchedPolicy& policy, const std::string& peer_address,
                                  const transport::UcxConfig& ucx) {
  if (Status s = w.validate(); !s.is_ok()) return std::unexpected(s);
  auto rig = connect_rig(policy, peer_address, ucx, w.prefill_bytes + w.decode_bytes);
  if (!rig) return std::unexpected(Status(rig.error().code(), "mixed: " + rig.error().message()));
  Engine& e = *(*rig)->engine;
  auto make = [&](bool decode) {
    Request r = decode ? (*rig)->read(w.decode_bytes, w.prefill_bytes, w.prefill_bytes) : (*rig)->read(w.prefill_bytes);
    r.qos = decode ? sched::QosClass::kDecodeCritical : sched::QosClass::kPrefillBulk;
    return r;
  };

  // Arrivals at their instants on the engine's clock; a burst goes as one batch.
  std::vector<std::pair<BatchHandle, bool>> batches;
  const auto all = arrivals(w);
  const TimeNs start = e.now_ns();
  for (std::size_t i = 0; i < all.size();) {
    const TimeNs due = start + all[i].at_ns;
    if (const TimeNs now = e.now_ns(); now < due) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
    Batch batch;
    const bool decode = all[i].decode;
    for (; i < all.size() && all[i].decode == decode && start + all[i].at_ns <= due; ++i) {
      Request r = make(decode);
      if (decode) r.deadline_ns = e.now_ns() + w.decode_deadline_ns;
      batch.requests.push_back(std::move(r));
    }
    auto h = e.submit(batch);
    if (!h) return std::unexpected(h.error());
    batches.emplace_back(*h, decode);
  }
  std::vector<sched::RequestStatus> decode_done;
  std::vector<sched::RequestStatus> prefill_done;
  MixedResult result;
  for (const auto& [h, decode] : batches) {
    if (Status s = e.wait(h, 600'000'000'000); !s.is_ok()) return std::unexpected(s);
    auto st = e.poll(h);
    if (!st) return std::unexpected(st.error());
    for (sched::RequestStatus& r : st->requests) {
      if (r.state == sched::RequestState::kCompleted) result.bytes_delivered += r.bytes;
      (decode ? decode_done : prefill_done).push_back(std::move(r));
    }
    (void)e.release(h);
  }
  result.decode = summarize_class(decode_done);
  result.prefill = summarize_class(prefill_done);
  result.decode_requests = std::move(decode_done);
  result.prefill_requests = std::move(prefill_done);
  result.end_ns = e.now_ns();
  result.stats = e.stats();
  result.batches = batches.size();
  (void)e.metrics_text();  // a scrape adds the copying threads' counts to the registry
  result.direct_batches = e.metrics().counter("baton_engine_direct_batches_total");
  return result;
}

}  // namespace baton::workloads
