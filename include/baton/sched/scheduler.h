// The slice scheduler: cuts requests into bounded slices and posts them on
// the transport in urgency order, within each path's credits. It routes a
// request on the best healthy path of its topology chain, spills a slice to
// a slower fallback only when waiting would miss the deadline and the
// fallback would not, and lets a critical slice preempt a lower-class one.
// Lives on the engine loop: no locks; time enters as `now_ns`.
// docs/scheduler.md explains the urgency order and why a heap can hold it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/sched/policy.h"
#include "baton/topology/graph.h"
#include "baton/transport/transport.h"

namespace baton::sched {

using RequestId = std::uint64_t;

// One logical transfer as the scheduler sees it: bytes from one topology
// endpoint to another.
struct TransferRequest {
  std::string from;  // "gpu0"
  std::string to;    // "gpu1"
  std::uint64_t bytes = 0;
  QosClass qos = QosClass::kPrefillBulk;
  TimeNs deadline_ns = 0;   // absolute, on the loop's clock; 0 = none
  bool preemptible = true;  // may its posted slices be cancelled for a higher class?
  transport::Op op = transport::Op::kWrite;
  // Where byte 0 lands at the destination; each slice carries `remote_addr +
  // its offset` in SliceMemory, so a request can carry part of a larger
  // transfer (dualpath's failover sends only the ranges still missing) and a
  // transport can address, or the simulator record, exactly which bytes moved.
  std::uint64_t remote_addr = 0;
  // For transports that move real memory: where byte 0 is here (inside a
  // registered region) and the peer's region key (SliceMemory). The
  // simulator ignores both.
  void* local = nullptr;
  std::uint32_t remote_key = 0;
  // From submit until the request ends `timeout`; 0: the policy's
  // transfer_timeout. Negative is refused at submit. Kept by admission
  // (AdmissionController, which the engine puts in front of the
  // scheduler); the bare Scheduler times nothing out.
  TimeNs timeout_ns = 0;

  // The most bytes one request may carry (256 TiB): far above any KV
  // transfer, and low enough that a queue's byte counts cannot wrap.
  static constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 48;
};

// What Scheduler::submit and AdmissionController::submit refuse in a request
// itself (invalid_argument naming the field): 0 bytes or more than
// kMaxBytes, a qos class or op outside its enum (cast from an integer), a
// negative timeout.
[[nodiscard]] Status check_request(RequestId id, const TransferRequest& request);

// A byte range of a request: [offset, offset + length).
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// Which bytes of a request the transport confirmed, for a caller that must
// move the rest elsewhere without sending anything twice (dualpath failover).
// `delivered`: ranges whose slices completed ok, merged and ascending,
// including slices a cancel could not stop that landed after the request
// ended. `posted`: ranges of slices still on a transport; they may yet land
// or fail, so they are neither delivered nor free to re-send.
struct RequestProgress {
  std::vector<ByteRange> delivered;
  std::vector<ByteRange> posted;
};

// kInfeasible: admission ended it with deadline_infeasible (and signalled
// local recompute) instead of letting it time out. kTimedOut: it ran past
// its transfer timeout. kCancelling: cancelled (or timed out, or failed)
// while slices it posted are still on a transport that cannot recall them;
// it takes its final state once none of them can still land in the
// caller's memory, never before.
enum class RequestState : std::uint8_t {
  kQueued,
  kRunning,
  kCompleted,
  kFailed,
  kCancelled,
  kInfeasible,
  kTimedOut,
  kCancelling,
};
[[nodiscard]] std::string_view to_string(RequestState state);

struct RequestStatus {
  RequestState state = RequestState::kQueued;
  Status status;  // why it failed or was cancelled
  QosClass qos = QosClass::kPrefillBulk;
  std::uint64_t bytes = 0;
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_unsent = 0;  // not yet posted (queued, or back from a failed or preempted slice)
  TimeNs deadline_ns = 0;
  TimeNs submitted_ns = 0;
  TimeNs completed_ns = 0;  // when it reached a final state
  std::uint32_t slices_spilled = 0;    // sent on a fallback path
  std::uint32_t slices_preempted = 0;  // of this request, cancelled and re-queued
  [[nodiscard]] bool deadline_missed() const {
    return deadline_ns != 0 && (state != RequestState::kCompleted || completed_ns > deadline_ns);
  }
};

struct SchedStats {
  std::uint64_t slices_posted = 0;
  std::uint64_t slices_completed = 0;
  std::uint64_t slices_spilled = 0;
  std::uint64_t slices_preempted = 0;
  std::uint64_t slices_retried = 0;  // failed on the wire and re-queued
  std::uint64_t bytes_wasted = 0;    // sent, then cancelled by preemption or request cancel
  std::uint64_t starvation_promotions = 0;  // served first because they waited past the bound
  std::uint64_t bytes_completed = 0;       // payload of slices that completed ok
  std::uint64_t wire_bytes_completed = 0;  // what carried them over the wire (fewer when compressed)
};

// What a path holds right now and the most it ever held, for credit checks.
struct PathLoad {
  int inflight_slices = 0;
  std::uint64_t inflight_bytes = 0;  // on the wire (compressed size when compressed)
  std::uint64_t queued_bytes = 0;    // waiting in this path's queue, not yet posted
  int max_inflight_slices = 0;
  std::uint64_t max_inflight_bytes = 0;
  std::uint64_t bytes_completed = 0;
};

class Scheduler {
 public:
  // The transport must offer the paths of `graph` (SimTransport::from_topology
  // does); it must outlive the scheduler. invalid_argument for an invalid policy.
  [[nodiscard]] static Result<std::unique_ptr<Scheduler>> create(const topology::TopologyGraph& graph,
                                                                 const SchedPolicy& policy,
                                                                 transport::Transport& transport);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Endpoints are topology nodes (routed on the topology's
  // chain) or names the transport's paths use, such as a peer's host:port
  // (routed on those paths, fastest first; paths the transport adds later
  // join the chain). invalid_argument for what check_request refuses or
  // identical endpoints;
  // not_found when neither way knows the endpoints; unavailable when the
  // transport offers no path of the topology's chain. A deadline already past is
  // accepted: the request is simply late, and most urgent.
  // `id` is the caller's (the engine hands ids out before the loop sees the
  // request); already_exists when it is in use.
  [[nodiscard]] Status submit(RequestId id, const TransferRequest& request, TimeNs now_ns);

  // Stops a request at once: queued bytes are dropped, posted slices are
  // cancelled (those already delivered are not undone). It ends cancelled
  // when no slice of it is left on the transport, else it is kCancelling
  // until the last one completes or fails. not_found for an unknown id,
  // invalid_argument when it already ended or is already cancelling.
  [[nodiscard]] Status cancel(RequestId id, TimeNs now_ns);

  // Ends a live request with `reason` (kInfeasible for deadline_infeasible,
  // kTimedOut for timeout, kFailed otherwise), like cancel. For admission's
  // "do not transfer" and its transfer timeout. invalid_argument for an ok
  // reason (a request cannot fail with one).
  [[nodiscard]] Status abandon(RequestId id, Status reason, TimeNs now_ns);

  // Bytes on the wire per payload byte for slices posted from now on (a
  // compressed request sends fewer; the simulator also charges codec time
  // here). invalid_argument unless 0 < ratio <= 1; not_found for unknown ids.
  [[nodiscard]] Status set_wire_ratio(RequestId id, double ratio);

  // The path a new request between these endpoints would wait on now.
  [[nodiscard]] Result<transport::PathId> route(const std::string& from, const std::string& to, TimeNs now_ns);

  // Feeds one transport completion back: credits return, bytes count, a
  // failed slice is re-queued (or the request fails after too many tries).
  // Returns the request the slice belonged to (0: a slice no longer tracked).
  RequestId on_completion(const transport::Completion& completion, TimeNs now_ns);

  // Posts as many slices as credits allow, most urgent first.
  void dispatch(TimeNs now_ns);

  [[nodiscard]] Result<RequestStatus> status(RequestId id) const;
  // not_found for an unknown (or forgotten) id.
  [[nodiscard]] Result<RequestProgress> progress(RequestId id) const;
  // Whether `id` is held here (live, or ended and not forgotten): status()
  // without building its answer or its not_found.
  [[nodiscard]] bool has(RequestId id) const;
  // How many of `id`'s slices are posted and not yet settled (0 for an id
  // not held): progress().posted's count, without building it.
  [[nodiscard]] std::size_t posted_slices(RequestId id) const;
  // Drops an ended request's record (status() then answers not_found), so a
  // long-running loop does not grow. invalid_argument while it is still live.
  [[nodiscard]] Status forget(RequestId id);
  // Called with each request id as it reaches a final state (completed,
  // failed, cancelled). The hook must not call back into the scheduler.
  void set_finish_hook(std::function<void(RequestId)> hook);
  [[nodiscard]] const SchedStats& stats() const;
  // Valid until the transport offers more paths (the table then grows). A
  // path the scheduler does not know has an empty load.
  [[nodiscard]] const PathLoad& load(transport::PathId path) const;
  // Unsent bytes of the requests queued on `path` whose deadline comes
  // before `deadline_ns` (equal deadlines: submitted before `self`, all of
  // them when `self` is not one of ours). Requests without a deadline never
  // count. O(log n): admission asks it for every feasibility check.
  [[nodiscard]] std::uint64_t unsent_due_before(transport::PathId path, TimeNs deadline_ns, RequestId self) const;
  [[nodiscard]] std::size_t queued_requests() const;  // not yet ended
  [[nodiscard]] const SchedPolicy& policy() const;

 private:
  struct State;
  explicit Scheduler(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::sched
