// The scheduling policy: how urgency is weighed, how big a slice is on each
// path, how much each path may have in flight, and whether critical slices
// may preempt. Read from configs/sched_policy.yaml; every key is optional and
// falls back to the defaults below (docs/scheduler.md explains them).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>
#include <string_view>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/topology/cost_model.h"

namespace baton::sched {

// Highest first. The order of the enumerators is the order of importance.
enum class QosClass : std::uint8_t { kDecodeCritical, kHotKv, kPrefillBulk, kBackground };
inline constexpr int kQosClassCount = 4;
[[nodiscard]] std::string_view to_string(QosClass qos);
[[nodiscard]] Result<QosClass> parse_qos_class(std::string_view name);

// The orderings one scheduler can run, so that every bench compares Baton
// with the baselines a skeptic would pick on the same slices and credits.
enum class PolicyKind : std::uint8_t {
  kDeadlineAware,   // urgency (deadline pressure + class + aging), starvation bound, spill, preemption
  kBaselineFifo,    // arrival order across classes; no deadlines, no preemption
  kStrictPriority,  // QoS class, FIFO within a class (a priority-queue engine); preemption, no deadlines
  kEdf,             // earliest deadline first, no class (no deadline: last, FIFO); no preemption
};
[[nodiscard]] std::string_view to_string(PolicyKind kind);
[[nodiscard]] Result<PolicyKind> parse_policy_kind(std::string_view name);

// What one path may carry at once (backpressure).
struct PathCredits {
  static constexpr int kMaxLanes = 64;              // as many as a transport opens to a peer
  static constexpr int kMaxSlicesPerLane = 1 << 16;
  int lanes = 2;                           // parallel channels on the path
  int slices_per_lane = 2;                 // queued per lane: keeps the lane busy across completion latency
  std::uint64_t inflight_bytes = 4 << 20;  // bytes posted and not yet completed
  friend bool operator==(const PathCredits&, const PathCredits&) = default;
};

enum class AdmissionOrder : std::uint8_t { kFifo, kEdf };
[[nodiscard]] std::string_view to_string(AdmissionOrder order);

// Admission: will a request make its deadline, and if not, what instead.
// MLU = remaining bytes / (time left × available bandwidth); docs/admission.md.
struct AdmissionPolicy {
  double theta_compress = 0.3;  // at or above: compress not-yet-posted slices, if that pays
  double theta_local = 1.5;     // at or above: do not transfer, signal local recompute
  AdmissionOrder order = AdmissionOrder::kFifo;  // of owners waiting for capacity
  bool drop_infeasible = false;  // drop waiting owners whose MLU reaches theta_local
  int max_owners = 0;                   // admitted and not ended; 0 = no limit
  std::uint64_t max_inflight_bytes = 0; // admitted and not yet delivered; 0 = no limit
  int reevaluate_slices = 8;            // re-check a running request every N completed slices
  TimeNs reevaluate_interval_ns = 100'000;  // … and at least this often
  double estimator_alpha = 0.2;         // EWMA weight of a new bandwidth sample

  friend bool operator==(const AdmissionPolicy&, const AdmissionPolicy&) = default;
};

struct SchedPolicy {
  PolicyKind kind = PolicyKind::kDeadlineAware;
  AdmissionPolicy admission;

  // Urgency = w_deadline·max(0, horizon − laxity) + w_priority·class_priority
  //           + w_aging·min(µs waited, starvation_bound), times in µs
  // (docs/scheduler.md).
  double w_deadline = 1.0;
  double w_priority = 1.0;
  double w_aging = 0.05;
  // Indexed by QosClass; in urgency units (µs of laxity).
  std::array<double, kQosClassCount> class_priority{10000, 5000, 1000, 0};
  // Bounds that keep every urgency finite: a weight of 1e308 made class
  // terms and aging infinite, and their difference NaN, in the heap keys.
  static constexpr double kMaxWeight = 1e6;
  static constexpr double kMaxClassPriority = 1e9;  // µs: 1000 s of laxity
  // Deadline pressure starts when a request's laxity (time to its deadline
  // less the time to send what is left) falls below this; from then on it
  // outranks work without a deadline of its class and is ordered
  // least-laxity-first against other pressed requests.
  TimeNs deadline_horizon_ns = 10'000'000;
  // Hard anti-starvation bound: a request queued this long is served next,
  // before anything more urgent (oldest first among those overdue).
  TimeNs starvation_bound_ns = 50'000'000;
  // A request not done this long after submit ends `timeout` (a request's
  // own TransferRequest::timeout_ns overrides it). A stalled peer then
  // cannot hold a caller forever.
  TimeNs transfer_timeout_ns = 60'000'000'000;

  // Slice size per path type; indexed by topology::PathType. Zero until
  // defaults() or the loader fills it: build policies with defaults().
  // At least kMinSliceBytes: a 1-byte slice of a GiB is a billion heap
  // entries, and costs more to schedule than to send.
  std::array<std::uint64_t, topology::kPathTypeCount> slice_bytes{};
  static constexpr std::uint64_t kMinSliceBytes = 4096;
  // Credits per path type; indexed by topology::PathType.
  std::array<PathCredits, topology::kPathTypeCount> credits{};

  bool preemption = true;
  // Measured path costs that replace the cost model's (`cost_model:` in the
  // YAML; `baton bench matrix --update-model` writes them). Bandwidth is per
  // link for nvlink/nvswitch, as in topology::CostModel::set.
  struct CostOverride {
    // The cost model's own bounds (a figure beyond them is a typo).
    static constexpr double kMinBandwidthGbps = topology::CostModel::kMinBandwidthGbps;
    static constexpr double kMaxBandwidthGbps = topology::CostModel::kMaxBandwidthGbps;
    static constexpr double kMaxLatencyUs = topology::CostModel::kMaxLatencyUs;
    topology::PathType path = topology::PathType::kHostStaging;
    topology::Proximity proximity = topology::Proximity::kLocal;
    double bandwidth_gbps = 0;
    double latency_us = 0;
    friend bool operator==(const CostOverride&, const CostOverride&) = default;
  };
  std::vector<CostOverride> cost_model;
  // Classes at or above this one may preempt lower classes.
  QosClass preempt_min_class = QosClass::kDecodeCritical;

  // The documented defaults (docs/scheduler.md): 64 KiB slices on
  // rdma/gdr/shm, 256 KiB on tcp and PCIe, 512 KiB on nvlink/nvswitch, 1 MiB
  // on host staging; 4 lanes on fabric paths.
  [[nodiscard]] static SchedPolicy defaults();

  [[nodiscard]] std::uint64_t slice_for(topology::PathType path) const {
    return slice_bytes[static_cast<int>(path)];
  }
  [[nodiscard]] const PathCredits& credits_for(topology::PathType path) const {
    return credits[static_cast<int>(path)];
  }
  // Checks ranges (positive sizes, weights ≥ 0, …); invalid_argument naming the field.
  [[nodiscard]] Status validate() const;

  friend bool operator==(const SchedPolicy&, const SchedPolicy&) = default;
};

// Parses policy YAML. Unknown keys and bad values are refused with the key
// and the line ("sched_policy.yaml:7: slice_size.nvlink: \"12 parsecs\" …").
// `origin` names the text in messages (a file name, or "<string>").
[[nodiscard]] Result<SchedPolicy> parse_policy(std::string_view yaml_text,
                                               std::string_view origin = "<string>");
[[nodiscard]] Result<SchedPolicy> load_policy(const std::string& path);

}  // namespace baton::sched
