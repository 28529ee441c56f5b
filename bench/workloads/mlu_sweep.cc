#include "workloads/mlu_sweep.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "baton/engine/engine.h"

namespace baton::workloads {

using engine::Batch;
using engine::BatchHandle;
using engine::Engine;
using engine::EngineConfig;
using engine::Op;
using engine::Request;
using engine::wall_ucx_config;

namespace {

struct Arrival {
  TimeNs at_ns;
  int stream;
};

std::vector<Arrival> arrivals(const MluSweepConfig& c) {
  std::mt19937_64 rng(c.seed);
  std::exponential_distribution<double> gap(1.0 / static_cast<double>(c.mean_batch_interval_ns));
  std::vector<Arrival> out;
  for (int s = 0; s < c.streams; ++s) {
    for (double t = gap(rng); t < static_cast<double>(c.duration_ns); t += gap(rng)) {
      for (int i = 0; i < c.batch; ++i) out.push_back({static_cast<TimeNs>(t), s});
    }
  }
  std::ranges::stable_sort(out, {}, &Arrival::at_ns);
  return out;
}

enum class Variant { kFifo, kEdf, kEdfDrop };

// KV-like payload for profiling the codec: fp16 values of a unit normal,
// which is what attention keys and values look like to a byte compressor.
std::vector<std::byte> kv_sample(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> value(0.0F, 1.0F);
  std::vector<std::byte> out(1 << 20);
  for (std::size_t i = 0; i + 1 < out.size(); i += 2) {
    // float -> fp16 by truncation of the mantissa: enough for byte statistics.
    const float f = value(rng);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    const auto half = static_cast<std::uint16_t>(((bits >> 16) & 0x8000U) |
                                                 ((((bits >> 23) & 0xFFU) - 112U) << 10 & 0x7C00U) |
                                                 ((bits >> 13) & 0x3FFU));
    std::memcpy(&out[i], &half, sizeof half);
  }
  return out;
}

struct VariantResult {
  PolicyOutcome outcome;
  std::vector<double> mlus;
};

Result<VariantResult> run_variant(const MluSweepConfig& c, TimeNs deadline, Variant v,
                                  const std::shared_ptr<const admission::Codec>& codec,
                                  const admission::CodecProfile& profile) {
  EngineConfig config;
  config.topology_model = c.topology_model;
  config.sim.seed = c.seed;
  sched::SchedPolicy& p = config.policy;
  p.admission.max_owners = c.max_owners;
  if (v == Variant::kFifo) {
    p.kind = sched::PolicyKind::kBaselineFifo;
    p.admission.order = sched::AdmissionOrder::kFifo;
  } else {
    p.kind = sched::PolicyKind::kDeadlineAware;
    p.admission.order = sched::AdmissionOrder::kEdf;
    p.admission.drop_infeasible = v == Variant::kEdfDrop;
  }
  auto engine = Engine::create(config);
  if (!engine) return std::unexpected(engine.error());
  Engine& e = **engine;
  VariantResult result;
  std::uint64_t signalled = 0;
  if (v == Variant::kEdfDrop) {
    e.admission().set_local_recompute([&signalled](sched::RequestId, const sched::TransferRequest&) { ++signalled; });
    // degrade: used where compression pays
    if (Status s = e.admission().set_codec(codec, profile); !s.is_ok()) return std::unexpected(s);
  }
  e.admission().set_mlu_observer([&result](double mlu, transport::Op) { result.mlus.push_back(mlu); });

  std::vector<sched::RequestId> ids;
  for (const Arrival& a : arrivals(c)) {
    if (Status s = e.run_until(a.at_ns); !s.is_ok()) return std::unexpected(s);
    auto id = e.submit({c.from, c.to, c.request_bytes, sched::QosClass::kHotKv, a.at_ns + deadline, true});
    if (!id) return std::unexpected(id.error());
    ids.push_back(*id);
  }
  if (Status s = e.run_until_idle(); !s.is_ok()) return std::unexpected(s);
  std::uint64_t attained = 0;
  for (sched::RequestId id : ids) {
    const auto s = e.status(id);
    if (s && s->state == sched::RequestState::kCompleted && s->completed_ns <= s->deadline_ns) ++attained;
  }
  const double n = static_cast<double>(ids.size());
  result.outcome = {static_cast<double>(attained) / n, static_cast<double>(signalled) / n};
  return result;
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
  return Status::ok();
}

Result<MluSweepResult> run_mlu_sweep(const MluSweepConfig& c) {
  if (Status s = c.validate(); !s.is_ok()) return std::unexpected(s);
  std::shared_ptr<const admission::Codec> codec = admission::make_lz4_codec();
  auto profile = admission::measure(*codec, kv_sample(c.seed));
  if (!profile) return std::unexpected(profile.error());
  MluSweepResult result{{}, profile->ratio, profile->compress_gbps, profile->decompress_gbps};
  std::vector<MluSweepRow>& rows = result.rows;
  for (TimeNs deadline : c.deadlines_ns) {
    MluSweepRow row;
    row.deadline_ns = deadline;
    for (Variant v : {Variant::kFifo, Variant::kEdf, Variant::kEdfDrop}) {
      auto r = run_variant(c, deadline, v, codec, *profile);
      if (!r) return std::unexpected(r.error());
      if (v == Variant::kFifo) row.fifo = r->outcome;
      if (v == Variant::kEdf) {
        // The MLU each request met on arrival, under the deadline-aware
        // scheduler that the EDF variants share.
        row.edf = r->outcome;
        row.count = r->mlus.size();
        double sum = 0;
        std::uint64_t feasible = 0;
        for (double m : r->mlus) {
          sum += std::min(m, kMeanMluCap);
          feasible += m < 1.0;
        }
        row.mean_mlu = row.count ? sum / static_cast<double>(row.count) : 0;
        row.feasible_rate = row.count ? static_cast<double>(feasible) / static_cast<double>(row.count) : 0;
      }
      if (v == Variant::kEdfDrop) row.edf_drop = r->outcome;
    }
    rows.push_back(row);
  }
  return result;
}

}  // namespace baton::workloads
