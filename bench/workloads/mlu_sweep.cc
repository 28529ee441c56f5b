#include "workloads/mlu_sweep.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <random>

#include "baton/admission/admission.h"
#include "baton/engine/engine.h"
#include "baton/engine/harness.h"
#include "workloads/payloads.h"
#include "workloads/ucx_rig.h"

namespace baton::workloads {

using engine::Engine;
using engine::Harness;
using engine::HarnessConfig;

namespace {

struct Arrival {
  TimeNs at_ns;
  int stream;
};

std::vector<Arrival> arrivals(const MluSweepConfig& c, TimeNs interval_ns) {
  std::mt19937_64 rng(c.seed);
  std::exponential_distribution<double> gap(1.0 / static_cast<double>(interval_ns));
  std::vector<Arrival> out;
  for (int s = 0; s < c.streams; ++s) {
    for (double t = gap(rng); t < static_cast<double>(c.duration_ns); t += gap(rng)) {
      for (int i = 0; i < c.batch; ++i) out.push_back({static_cast<TimeNs>(t), s});
    }
  }
  std::ranges::stable_sort(out, {}, &Arrival::at_ns);
  return out;
}

// Each part of admission on its own: the ordering (FIFO or EDF, with the
// scheduler that matches it) and the drop (infeasible requests end at once
// with the local-recompute signal, and, where the path can carry it,
// compression where it pays).
enum class Variant { kFifo, kFifoDrop, kEdf, kEdfDrop };
constexpr Variant kVariants[] = {Variant::kFifo, Variant::kFifoDrop, Variant::kEdf, Variant::kEdfDrop};

sched::SchedPolicy policy_of(const MluSweepConfig& c, Variant v) {
  sched::SchedPolicy p = sched::SchedPolicy::defaults();
  p.admission.max_owners = c.max_owners;
  const bool fifo = v == Variant::kFifo || v == Variant::kFifoDrop;
  p.kind = fifo ? sched::PolicyKind::kBaselineFifo : sched::PolicyKind::kDeadlineAware;
  p.admission.order = fifo ? sched::AdmissionOrder::kFifo : sched::AdmissionOrder::kEdf;
  p.admission.drop_infeasible = v == Variant::kFifoDrop || v == Variant::kEdfDrop;
  return p;
}

struct VariantResult {
  PolicyOutcome outcome;
  std::vector<double> mlus;
};

PolicyOutcome outcome_of(const std::vector<sched::RequestStatus>& statuses, std::uint64_t signalled) {
  std::uint64_t attained = 0;
  for (const sched::RequestStatus& s : statuses) {
    attained += s.state == sched::RequestState::kCompleted && s.completed_ns <= s.deadline_ns;
  }
  const double n = std::max<double>(1.0, static_cast<double>(statuses.size()));
  return {static_cast<double>(attained) / n, static_cast<double>(signalled) / n};
}

struct Codec {
  std::shared_ptr<const transport::Codec> codec;
  transport::CodecProfile profile;
};

Result<VariantResult> run_variant(const MluSweepConfig& c, const std::vector<Arrival>& all, TimeNs deadline,
                                  Variant v, const Codec& codec) {
  HarnessConfig config;
  config.topology_model = c.topology_model;
  config.sim.seed = c.seed;
  config.policy = policy_of(c, v);
  auto engine = Harness::create(config);
  if (!engine) return std::unexpected(engine.error());
  Harness& e = **engine;
  VariantResult result;
  std::uint64_t signalled = 0;
  if (config.policy.admission.drop_infeasible) {
    e.admission().set_local_recompute([&signalled](sched::RequestId, const sched::TransferRequest&) { ++signalled; });
    if (Status s = e.admission().set_codec(codec.codec, codec.profile); !s.is_ok()) return std::unexpected(s);
  }
  e.admission().set_mlu_observer([&result](double mlu, transport::Op) { result.mlus.push_back(mlu); });
  std::vector<sched::RequestId> ids;
  for (const Arrival& a : all) {
    if (Status s = e.run_until(a.at_ns); !s.is_ok()) return std::unexpected(s);
    auto id = e.submit({c.from, c.to, c.request_bytes, sched::QosClass::kHotKv, a.at_ns + deadline, true});
    if (!id) return std::unexpected(id.error());
    ids.push_back(*id);
  }
  if (Status s = e.run_until_idle(); !s.is_ok()) return std::unexpected(s);
  std::vector<sched::RequestStatus> statuses;
  for (sched::RequestId id : ids) {
    auto s = e.status(id);
    if (!s) return std::unexpected(s.error());
    statuses.push_back(*s);
  }
  result.outcome = outcome_of(statuses, signalled);
  return result;
}

// The same arrivals in real time over UCX: each stream's batch is one Batch
// of reads, due `deadline` after it was submitted.
Result<VariantResult> run_variant_ucx(const MluSweepConfig& c, const std::vector<Arrival>& all, TimeNs deadline,
                                      Variant v, const Codec& codec, const std::string& peer,
                                      const transport::UcxConfig& ucx) {
  const sched::SchedPolicy policy = policy_of(c, v);
  std::atomic<std::uint64_t> signalled{0};
  std::mutex mlus_mutex;  // the observer runs on the loop thread
  VariantResult result;
  Status refused;
  auto rig = connect_rig(policy, peer, ucx, c.request_bytes * static_cast<std::uint64_t>(c.batch), [&](Engine& e) {
    if (policy.admission.drop_infeasible) {
      e.admission().set_local_recompute(
          [&signalled](sched::RequestId, const sched::TransferRequest&) { signalled.fetch_add(1); });
      refused = e.admission().set_codec(codec.codec, codec.profile);
    }
    e.admission().set_mlu_observer([&](double mlu, transport::Op) {
      std::lock_guard lock(mlus_mutex);
      result.mlus.push_back(mlu);
    });
  });
  if (!rig) return std::unexpected(Status(rig.error().code(), "mlu sweep: " + rig.error().message()));
  if (!refused.is_ok()) return std::unexpected(refused);
  Engine& e = *(*rig)->engine;
  std::vector<engine::BatchHandle> handles;
  const TimeNs start = e.now_ns();
  for (std::size_t i = 0; i < all.size();) {
    const TimeNs due = start + all[i].at_ns;
    if (const TimeNs now = e.now_ns(); now < due) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
    engine::Batch batch;
    const TimeNs at = all[i].at_ns;
    const int stream = all[i].stream;
    const TimeNs deadline_ns = e.now_ns() + deadline;
    for (; i < all.size() && all[i].at_ns == at && all[i].stream == stream; ++i) {
      engine::Request r = (*rig)->read(c.request_bytes, batch.requests.size() * c.request_bytes);
      r.qos = sched::QosClass::kHotKv;
      r.deadline_ns = deadline_ns;
      batch.requests.push_back(r);
    }
    auto h = e.submit(batch);
    if (!h) return std::unexpected(h.error());
    handles.push_back(*h);
  }
  std::vector<sched::RequestStatus> statuses;
  for (engine::BatchHandle h : handles) {
    if (Status s = e.wait(h, 120'000'000'000); !s.is_ok()) return std::unexpected(s);
    auto st = e.poll(h);
    if (!st) return std::unexpected(st.error());
    statuses.insert(statuses.end(), st->requests.begin(), st->requests.end());
    (void)e.release(h);
  }
  (*rig)->engine.reset();  // the loop thread stops: the observer's writes are done
  result.outcome = outcome_of(statuses, signalled.load());
  return result;
}

void fill_row(MluSweepRow& row, Variant v, const VariantResult& r) {
  switch (v) {
    case Variant::kFifo: row.fifo = r.outcome; break;
    case Variant::kFifoDrop: row.fifo_drop = r.outcome; break;
    case Variant::kEdf: {
      // The MLU each request met on arrival, under the deadline-aware
      // scheduler that the EDF variants share.
      row.edf = r.outcome;
      row.count = r.mlus.size();
      double sum = 0;
      std::uint64_t feasible = 0;
      std::uint64_t unbounded = 0;
      for (double m : r.mlus) {
        sum += std::min(m, kMeanMluCap);
        feasible += m < 1.0;
        unbounded += m >= admission::kMluUnbounded;
      }
      const double n = std::max<double>(1.0, static_cast<double>(row.count));
      row.mean_mlu = sum / n;
      row.feasible_rate = static_cast<double>(feasible) / n;
      row.unbounded_rate = static_cast<double>(unbounded) / n;
      break;
    }
    case Variant::kEdfDrop: row.edf_drop = r.outcome; break;
  }
}

// lz4 profiled on KV-like data (fp16 values, what attention keys and values
// look like to a byte compressor), for the drop variants; its figures go in
// `result`.
Result<Codec> profiled_codec(const MluSweepConfig& c, MluSweepResult& result) {
  Codec codec{transport::make_lz4_codec(), {}};
  std::vector<std::byte> kv_sample(1 << 20);
  fill_payload(PayloadKind::kFp16Kv, kv_sample, c.seed);
  auto profile = transport::measure(*codec.codec, kv_sample);
  if (!profile) return std::unexpected(profile.error());
  codec.profile = *profile;
  result.codec_ratio = profile->ratio;
  result.codec_compress_gbps = profile->compress_gbps;
  result.codec_decompress_gbps = profile->decompress_gbps;
  return codec;
}

// One row per deadline, each variant run once: `run(deadline, variant)`.
template <typename RunVariant>
Status sweep(const MluSweepConfig& c, MluSweepResult& result, RunVariant&& run) {
  for (TimeNs deadline : c.deadlines_ns) {
    MluSweepRow row;
    row.deadline_ns = deadline;
    for (Variant v : kVariants) {
      auto r = run(deadline, v);
      if (!r) return r.error();
      fill_row(row, v, *r);
    }
    result.rows.push_back(row);
  }
  return Status::ok();
}

TimeNs interval_of(const MluSweepConfig& c, double link_gbps) {
  if (c.load <= 0) return c.mean_batch_interval_ns;
  const double bytes_per_batch = static_cast<double>(c.request_bytes) * c.batch;
  return std::max<TimeNs>(1, static_cast<TimeNs>(c.streams * bytes_per_batch / (c.load * link_gbps)));
}

}  // namespace

Status MluSweepConfig::validate() const {
  if (deadlines_ns.empty()) return Status::invalid_argument("mlu sweep: no deadlines");
  for (TimeNs d : deadlines_ns) {
    if (d <= 0) return Status::invalid_argument("mlu sweep: deadline {} ns must be > 0", d);
  }
  if (request_bytes == 0 || batch < 1 || streams < 1 || mean_batch_interval_ns <= 0 || duration_ns <= 0 ||
      max_owners < 0) {
    return Status::invalid_argument(
        "mlu sweep: request_bytes, batch, streams, interval and duration must be > 0 and max_owners >= 0");
  }
  if (!(load >= 0) || !std::isfinite(load) || !(link_gbps >= 0) || !std::isfinite(link_gbps)) {
    return Status::invalid_argument("mlu sweep: load {} and link_gbps {} must be >= 0", load, link_gbps);
  }
  return Status::ok();
}

Result<MluSweepResult> run_mlu_sweep(const MluSweepConfig& c) {
  if (Status s = c.validate(); !s.is_ok()) return std::unexpected(s);
  MluSweepResult result;
  auto codec = profiled_codec(c, result);
  if (!codec) return std::unexpected(codec.error());
  if (c.load > 0 && c.link_gbps == 0) {
    return std::unexpected(Status::invalid_argument("mlu sweep: a load needs the link's bandwidth on the simulator"));
  }
  result.link_gbps = c.link_gbps;
  result.mean_batch_interval_ns = interval_of(c, c.link_gbps);
  const std::vector<Arrival> all = arrivals(c, result.mean_batch_interval_ns);
  if (Status s = sweep(c, result, [&](TimeNs deadline, Variant v) { return run_variant(c, all, deadline, v, *codec); });
      !s.is_ok()) {
    return std::unexpected(s);
  }
  return result;
}

Result<MluSweepResult> run_mlu_sweep_ucx(const MluSweepConfig& c, const std::string& peer,
                                         const transport::UcxConfig& ucx) {
  if (Status s = c.validate(); !s.is_ok()) return std::unexpected(s);
  MluSweepResult result;
  auto codec = profiled_codec(c, result);
  if (!codec) return std::unexpected(codec.error());
  result.link_gbps = c.link_gbps;
  if (result.link_gbps == 0) {
    auto rig = connect_rig(sched::SchedPolicy::defaults(), peer, ucx, c.request_bytes);
    if (!rig) return std::unexpected(Status(rig.error().code(), "mlu sweep: " + rig.error().message()));
    auto gbps = measure_link(**rig, c.request_bytes);
    if (!gbps) return std::unexpected(gbps.error());
    result.link_gbps = *gbps;
  }
  result.mean_batch_interval_ns = interval_of(c, result.link_gbps);
  const std::vector<Arrival> all = arrivals(c, result.mean_batch_interval_ns);
  if (Status s = sweep(c, result,
                      [&](TimeNs deadline, Variant v) { return run_variant_ucx(c, all, deadline, v, *codec, peer, ucx); });
      !s.is_ok()) {
    return std::unexpected(s);
  }
  return result;
}

}  // namespace baton::workloads
