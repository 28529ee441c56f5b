// Admission: before a request takes bandwidth, will it make its deadline?
// The feasibility ratio MLU = remaining bytes / (time left × available
// bandwidth) puts it in a band: below theta_compress send as is; up to
// theta_local send, compressing slices not yet posted when a codec pays; at
// or above theta_local do not transfer — end with deadline_infeasible and
// signal the caller to recompute locally. Running requests are re-evaluated
// (bands only rise). Owners wait for capacity (max owners, max bytes) in FIFO
// or EDF order. Lives on the engine loop, in front of the scheduler.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "baton/admission/bandwidth_estimator.h"
#include "baton/transport/codec.h"
#include "baton/sched/scheduler.h"

namespace baton::admission {

enum class Band : std::uint8_t { kPlain, kCompress, kLocal };
[[nodiscard]] std::string_view to_string(Band band);

struct AdmissionStats {
  std::uint64_t admitted = 0;       // handed to the scheduler
  std::uint64_t compressed = 0;     // switched to compressed slices
  std::uint64_t dropped = 0;        // dropped while waiting (drop_infeasible)
  std::uint64_t infeasible = 0;     // ended deadline_infeasible, for any reason
  std::uint64_t signalled = 0;      // local-recompute callbacks fired
  std::uint64_t promotions = 0;     // band raised during a transfer
  std::uint64_t reevaluations = 0;
};

// MLU is reported as this when no bandwidth is left before the deadline
// (or the deadline has passed): "infinitely" infeasible, and still a number.
inline constexpr double kMluUnbounded = 1e6;

using LocalRecompute = std::function<void(sched::RequestId, const sched::TransferRequest&)>;
using MluObserver = std::function<void(double mlu, transport::Op op)>;

class AdmissionController {
 public:
  // The scheduler and transport must outlive the controller. The caller
  // routes the scheduler's finish hook to on_finish().
  [[nodiscard]] static Result<std::unique_ptr<AdmissionController>> create(const sched::SchedPolicy& policy,
                                                                           sched::Scheduler& scheduler,
                                                                           transport::Transport& transport);
  ~AdmissionController();

  // Without a callback the local band degrades to best-effort transfer.
  void set_local_recompute(LocalRecompute callback);
  // Without a codec the compress band sends raw bytes. The codec is handed
  // to the transport too, which runs it on compressed slices (UCX: on both
  // ends). failed_precondition when the transport cannot carry compressed
  // slices; invalid_argument for a null codec, one the transport cannot name
  // on the wire, or a profile with a ratio below 1 or a rate that is not > 0.
  [[nodiscard]] Status set_codec(std::shared_ptr<const transport::Codec> codec, transport::CodecProfile profile);
  void set_mlu_observer(MluObserver observer);

  // Decides and queues. Errors as Scheduler::submit, at once.
  [[nodiscard]] Status submit(sched::RequestId id, const sched::TransferRequest& request, TimeNs now_ns);
  [[nodiscard]] Status cancel(sched::RequestId id, TimeNs now_ns);
  [[nodiscard]] Result<sched::RequestStatus> status(sched::RequestId id) const;

  // After Scheduler::on_completion, with the request it returned.
  void on_completion(const transport::Completion& completion, sched::RequestId request, TimeNs now_ns);
  // From the scheduler's finish hook (must not call back into the scheduler).
  void on_finish(sched::RequestId id);
  // Called with every request as it ends, admitted or not (a request
  // cancelled or found infeasible while waiting never reaches the
  // scheduler). The hook must not call back into admission or the scheduler.
  void set_end_hook(std::function<void(sched::RequestId)> hook);
  // Drops an ended request's record (status() then answers not_found).
  // invalid_argument while it is live; not_found when unknown.
  [[nodiscard]] Status forget(sched::RequestId id);
  // Frees capacity of finished owners, admits, drops, re-evaluates on timers.
  void tick(TimeNs now_ns);
  [[nodiscard]] std::optional<TimeNs> next_timer_ns() const;

  // The MLU of `remaining_bytes` of `request` at `now_ns`, counting the bytes
  // that would go before it on its path. 0 without a deadline.
  [[nodiscard]] double mlu(const sched::TransferRequest& request, std::uint64_t remaining_bytes, TimeNs now_ns,
                           sched::RequestId self = 0);
  [[nodiscard]] Band band_of(double mlu) const;
  [[nodiscard]] const AdmissionStats& stats() const;
  [[nodiscard]] std::size_t waiting() const;  // owners waiting for capacity
  [[nodiscard]] double estimate_gbps(transport::PathId path) const;

 private:
  struct State;
  explicit AdmissionController(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::admission
