// The loop-side state behind the Engine's real-memory API: registered
// regions, connected peers, batches of requests and their notifications,
// over a UcxTransport. Everything here runs on the engine loop (the Engine
// posts to it) and takes no locks, except the set of ended batches, which
// waiting threads read. Private to engine/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "baton/admission/admission.h"
#include "baton/engine/engine.h"
#include "baton/engine/metrics.h"
#include "baton/sched/scheduler.h"
#include "baton/transport/ucx_transport.h"
#include "engine/direct_copier.h"
#include "engine/engine_loop.h"
#include "engine/thread_counts.h"
#include "engine/vram_staging.h"

namespace baton::engine {

class Datapath {
 public:
  Datapath(VramStaging& staging, sched::Scheduler& scheduler, admission::AdmissionController& admission,
           MetricsRegistry& metrics, std::atomic<sched::RequestId>& next_id, EngineLoop& loop);
  ~Datapath();
  Datapath(const Datapath&) = delete;
  Datapath& operator=(const Datapath&) = delete;

  // --- on the loop ---
  [[nodiscard]] Result<Region> register_memory(void* ptr, std::size_t length, MemoryKind kind, int device);
  [[nodiscard]] Result<Region> allocate_memory(std::size_t length, int numa_node);
  // ok or an error at once; `done` runs (on the loop) once peers
  // acknowledged the revocation, or at once when none knew the region.
  [[nodiscard]] Status unregister(RegionHandle region, std::function<void(Status)> done);
  // The caller stopped waiting for that unregister (it answered timeout):
  // the next unregister of the region answers ok once the revocation ended,
  // not "no region".
  void answer_unregister_later(RegionHandle region) { late_unregisters_.insert(region); }
  [[nodiscard]] Status export_region(RegionHandle region, const std::vector<std::string>& peers);
  [[nodiscard]] Result<Region> region(RegionHandle region) const;
  // `done` runs on the loop once the handshake ended (ready or failed).
  void connect(std::string_view address, TimeNs now_ns, std::function<void(Result<Peer>)> done);
  void refresh(const Peer& peer, std::function<void(Status)> done);
  [[nodiscard]] Result<std::vector<transport::RemoteRegion>> remote_regions(const Peer& peer) const;
  // A batch's work per request (its checks, admission, cancel, end and
  // release) is done a part a loop turn, so that a huge batch does not hold
  // the loop: one of 2*10^5 requests held it for 0.2-0.6 s at submit and
  // 0.15 s at its end, and a decode read due in 5 ms waited behind it.
  static constexpr std::size_t kRequestsPerTurn = 512;
  static constexpr std::size_t kChecksPerTurn = 4096;  // a check alone is ~0.1 us

  // A submit under way: its requests checked, then admitted, a part a
  // turn. The caller's batch outlives it (its caller waits for the handle).
  struct Submission {
    explicit Submission(const Batch& b) : batch(&b) {}
    const Batch* batch;
    std::size_t next = 0;  // the first request not yet checked (then: admitted)
    bool checked = false;  // every request passed, before any was admitted
    std::uint64_t id = 0;  // its record, once admission began
  };
  // One turn's part of a submit: nullopt while more remains (call again on
  // a later turn), then the handle or what was refused. A batch that fits
  // one turn is checked and admitted in one call; a larger one is admitted
  // only once all its requests passed the checks.
  [[nodiscard]] std::optional<Result<BatchHandle>> submit_step(Submission& submission, TimeNs now_ns);
  // What submit would refuse of `batch`, without submitting it: one turn's
  // part, from request `next` on; nullopt while more remains.
  [[nodiscard]] std::optional<Status> check_step(const Batch& batch, std::size_t& next);
  // A running batch's statuses into `out`, reusing its storage (a poll
  // loop allocates nothing): one turn's part, from request `next` on
  // (0: start); nullopt while more remains. Each request's state is its
  // own at its part's turn.
  [[nodiscard]] std::optional<Status> poll_step(BatchHandle batch, std::size_t& next, BatchStatus& out) const;
  // A cancel under way, a part a turn as submit_step.
  struct Cancellation {
    std::uint64_t id = 0;
    std::size_t next = 0;
    bool cancelled_any = false;
    bool stopping_any = false;  // a request was cancelling already
  };
  [[nodiscard]] std::optional<Status> cancel_step(Cancellation& cancellation, TimeNs now_ns);
  // Forgets the batch's record at once; its requests' records go a part a
  // turn after.
  [[nodiscard]] Status release(BatchHandle batch);
  // The scheduler's finish hook, after admission's.
  void on_finish(sched::RequestId id);
  // End of each loop turn: resolves handshakes and refreshes, ends batches.
  // True when batches are left to end or forget (a part a turn).
  bool on_turn(TimeNs now_ns);
  // Adds what direct batches counted since the last call to the metrics
  // (each loop turn, and before a scrape).
  void flush_direct_metrics();
  // Before a scrape: the above, and the batches held (not yet released).
  void before_scrape();
  // Cancels every running batch and closes the transport.
  void shutdown(TimeNs now_ns);
  // After shutdown(): true once nothing can still touch the caller's memory
  // (the GPU paths' copies ended — then their pinned host memory is
  // unpinned — and UCX's endpoints closed). Keep polling the loop meanwhile.
  [[nodiscard]] bool shutdown_complete();
  [[nodiscard]] bool shut_down() const { return shut_down_; }

  // The clock submit_direct stamps completions with. Set before the loop starts.
  void set_clock(std::function<TimeNs()> clock) { clock_ = std::move(clock); }

  // --- any thread ---
  // The loop-free path: a batch whose every request goes to a same-host
  // peer, while the loop holds no request of its own. Of at most
  // `max_bytes` (or any size when the caller waits for it: kCallerWaits),
  // it is copied here (UcxTransport::copy_direct) and ends at once; its
  // notification is posted to the loop, its counts wait for
  // flush_direct_metrics. Larger, it is queued for the copier's thread
  // (DirectCopier) and ends there. nullopt: it takes the loop (which also
  // reports every invalid request).
  // With `resolved` (a PreparedBatch's), the copies are resolved once per
  // published table instead of per batch.
  [[nodiscard]] std::optional<Result<BatchHandle>> submit_direct(
      const Batch& batch, TimeNs now_ns, std::uint64_t max_bytes,
      transport::UcxTransport::ResolvedCopies* resolved = nullptr);
  // A batch on the copier's thread: its status so far (false when `id` is
  // not one), a cancel (nullopt when not one), and whether it holds `id`.
  [[nodiscard]] bool copying_status(std::uint64_t id, BatchStatus& out) const { return copier_->status(id, out); }
  [[nodiscard]] std::optional<Status> cancel_copying(std::uint64_t id);
  // Engine::run's loop-free path: a prepared batch that submit_direct
  // already resolved against the table still published (so every check
  // passed, and it has no deadline and no notification) is copied here and
  // leaves no record: no handle, no stamps, only the counts. Its status: ok,
  // or the first failed copy's. nullopt: it takes submit's way.
  [[nodiscard]] std::optional<Status> run_direct(const Batch& batch,
                                                 transport::UcxTransport::ResolvedCopies& resolved);
  // The same for a batch not prepared: checked and copied as submit_direct
  // would, up to `max_bytes`, with no record. nullopt (it takes submit's
  // way, a larger batch the copier's) for a request with a deadline, whose
  // miss only a record would show.
  [[nodiscard]] std::optional<Status> run_direct(const Batch& batch, std::uint64_t max_bytes);
  // An eventfd counting batches that ended (see Engine::batch_event_fd).
  // It is written only once somebody asked for it; a batch that ended
  // before (one copied within submit, say) makes it readable at that first
  // ask, so a caller who submits and then watches the fd is not left
  // waiting. Sequentially consistent with publish_ended: one of the two
  // sees the other.
  [[nodiscard]] int ended_fd() const;
  // Until batch `id` ended (released counts: only an ended batch can be),
  // close_waiters() was called, or `deadline` passed. Call it between
  // enter_wait() and leave_wait().
  enum class WaitEnd : std::uint8_t { kEnded, kClosed, kTimedOut };
  [[nodiscard]] WaitEnd wait_ended(std::uint64_t id, std::chrono::steady_clock::time_point deadline);
  // Brackets a caller's whole wait, so that close_waiters() knows when the
  // last one left; enter_wait() is false once it was called.
  [[nodiscard]] bool enter_wait();
  void leave_wait();
  // Ends every wait (kClosed) and returns once no caller is inside one:
  // the engine's destructor, before it frees what they read.
  void close_waiters();
  // Where batch `id` is, without waiting (a waiter's spin: no syscall):
  // ended, still running, or unknown (never submitted, or released).
  enum class Look { kUnknown, kRunning, kEnded };
  [[nodiscard]] Look look(std::uint64_t id);
  // How many batches ended so far: a waiter's spin reads this, not the mutex
  // the loop publishes under, and looks up its batch only when it moved.
  [[nodiscard]] std::uint64_t ended_count() const { return ended_count_.load(std::memory_order_acquire); }
  // The final status of an ended batch into `out` (its storage reused),
  // without the loop; false while it runs (or when unknown).
  [[nodiscard]] bool ended_status(std::uint64_t id, BatchStatus& out);
  // Drops an ended batch's final status when none of its slices is still on
  // the wire, so the loop's release() cannot refuse: kLoop when the loop
  // still holds its record, kDirect when it never had one.
  enum class Taken : std::uint8_t { kNo, kLoop, kDirect };
  [[nodiscard]] Taken take_ended_if_clean(std::uint64_t id);

 private:
  [[nodiscard]] std::string unregistering(RegionHandle region) const;  // for messages
  struct RegionRecord {
    Region region;
    std::uint64_t live_requests = 0;
  };
  struct BatchRecord {
    std::vector<sched::RequestId> requests;  // those admitted, in the batch's order
    std::vector<RegionHandle> local_regions;  // per request
    std::vector<RegionHandle> targets;        // per request with no peer: its other region (else kNoTarget)
    std::vector<Op> ops;                      // per request
    std::size_t open = 0;                     // requests not yet ended
    transport::PathId notify_path = 0;
    std::uint32_t notify_incarnation = 0;  // notify_path's when the batch was submitted
    std::string notification;
    // The requests after the admitted ones, when the tables changed between
    // a huge batch's checks and their admission (a region unregistered, the
    // peer failed): never admitted, failed with the reason.
    std::vector<sched::RequestStatus> refused;
    std::uint64_t refused_ops[2]{};  // of them, per op (read, write)
    bool ended = false;
    bool clean_at_end = false;  // no slice of it was on the wire when it ended
  };
  struct PendingConnect {
    transport::PathId path;
    std::function<void(Result<Peer>)> done;
  };
  struct PendingUnregister {
    RegionHandle region;
    std::function<void(Status)> done;
  };
  struct PendingRefresh {
    transport::PathId path;
    std::function<void(Status)> done;
  };

  // A request checked against the region and peer tables: what submit
  // needs of them, looked up once.
  static constexpr RegionHandle kNoTarget = ~RegionHandle{0};
  struct Checked {
    RegionRecord* local = nullptr;
    transport::PathId path = 0;
    std::uint64_t remote_addr = 0;  // the peer's address of byte 0
    // A request with no peer: its ends' topology nodes, its other region
    // and that region's handle with the local GPU paths.
    std::string from, to;
    RegionRecord* target = nullptr;
    transport::RegionHandle target_key = 0;
  };
  [[nodiscard]] Result<Checked> check(const Request& r, std::size_t index);
  // Requests [from, to) of a batch, and the batch as a whole: into
  // `checked`, those that passed, in order, up to the first that did not,
  // and why that one did not (ok when all passed). Nothing changes but the
  // regions' keys with the local GPU paths (made at their first use). The
  // pointers hold for this loop turn.
  [[nodiscard]] Status check_part(const Batch& batch, std::size_t from, std::size_t to, std::vector<Checked>& checked);
  // A request between two of this engine's regions, over the local GPU paths.
  [[nodiscard]] Result<Checked> check_local(const Request& r, RegionRecord& local);
  // The region's registration with the local GPU paths, made at its first use.
  [[nodiscard]] Result<transport::RegionHandle> local_key(const Region& region);
  // Cancels the requests of `batch` that are still running.
  void cancel_running(const BatchRecord& batch, TimeNs now_ns);
  [[nodiscard]] Result<transport::PathId> live_path(const std::string& peer) const;
  // Ends the connects and refreshes whose path is ready or failed.
  void settle_pending();
  struct Ending;
  // One turn's part of closing the batches that ended, at most `per_batch`
  // requests of each; a batch is published once all of its are done.
  void end_batches(std::size_t per_batch = kRequestsPerTurn);
  // Its notification, counts and publication, once every request is in.
  void finish_ending(Ending& ending, BatchRecord& batch);
  // Appends the status of the batch's admitted request `index` to `out`,
  // named by its place in the batch, with its bytes; once `out.done`, the
  // first request that did not complete gives the batch's status.
  [[nodiscard]] Status append_status(const BatchRecord& batch, std::size_t index, BatchStatus& out) const;
  // The same for the requests it never admitted.
  static void append_refused(const BatchRecord& batch, BatchStatus& out);
  // Forgets up to kRequestsPerTurn of the released batches' requests.
  void forget_released();
  // On the loop: a direct batch's notification.
  void notify_direct(const std::string& peer, const std::string& notification);
  // submit_direct's way for a batch above max_bytes: checked (nullopt: the
  // loop's way), then queued for the copier.
  [[nodiscard]] std::optional<Result<BatchHandle>> submit_copying(
      const Batch& batch, TimeNs now_ns, std::span<const transport::UcxTransport::DirectCopy> copies,
      std::uint64_t bytes, TimeNs earliest_deadline_ns);
  // On the copier's thread: a queued batch's end.
  void end_copied(DirectCopier::Job& job);
  // A direct batch's final status from its copies' results (moved out),
  // request i read through at(i); and its counts.
  struct DirectEnd {
    Op op;
    std::uint64_t length;
    sched::QosClass qos;
    TimeNs deadline_ns;
    std::uint64_t landed_if_not_ok = 0;  // a request the copier stopped between two of its parts
    TimeNs completed_ns = 0;             // when it ended, if not at the batch's end (the copier's chunks)
  };
  struct Ended;
  template <class At>
  void end_direct(Ended& ended, std::size_t n_requests, At at, Status* copy_results, TimeNs submitted_ns,
                  TimeNs done_ns);

  VramStaging& staging_;
  transport::UcxTransport& ucx_;
  sched::Scheduler& scheduler_;
  admission::AdmissionController& admission_;
  MetricsRegistry& metrics_;
  std::atomic<sched::RequestId>& next_id_;
  EngineLoop& loop_;
  std::function<TimeNs()> clock_;
  bool shut_down_ = false;

  std::unordered_map<RegionHandle, RegionRecord> regions_;
  std::unordered_map<RegionHandle, transport::RegionHandle> local_keys_;  // with staging_.local()
  std::unordered_map<std::string, transport::PathId> peers_;  // address → latest path
  // Peers whose failed path a later connect took: their address answers
  // what ended them (unavailable), as before, not "no peer", for the last
  // kMax of them (about 200 B each).
  class Departed {
   public:
    static constexpr std::size_t kMax = 1024;
    void remember(const std::string& address, Status why) {
      const std::uint64_t seq = next_++;
      by_address_.insert_or_assign(address, Entry{std::move(why), seq});
      order_.emplace_back(address, seq);
      if (order_.size() > kMax) {
        const auto& [oldest, at] = order_.front();
        if (auto it = by_address_.find(oldest); it != by_address_.end() && it->second.seq == at) by_address_.erase(it);
        order_.pop_front();
      }
    }
    void forget(const std::string& address) { by_address_.erase(address); }  // connected again
    [[nodiscard]] const Status* find(const std::string& address) const {
      const auto it = by_address_.find(address);
      return it == by_address_.end() ? nullptr : &it->second.why;
    }

   private:
    struct Entry {
      Status why;
      std::uint64_t seq;
    };
    std::unordered_map<std::string, Entry> by_address_;
    std::deque<std::pair<std::string, std::uint64_t>> order_;  // oldest first; a forgotten one is skipped
    std::uint64_t next_ = 0;
  };
  Departed departed_;
  std::unordered_map<std::uint64_t, BatchRecord> batches_;
  std::unordered_map<sched::RequestId, std::uint64_t> batch_of_;
  std::atomic<std::uint64_t> loop_requests_{0};  // submitted through the loop, not yet ended
  // Direct batches' counts, per op (read, write), added on the submitting
  // threads (and the copier's); the loop adds what grew since
  // direct_flushed_ to the metrics. Requests per final state: completed,
  // failed, cancelled, timed out; per state, read then write.
  static constexpr std::size_t kDirectStates = 4;
  static constexpr sched::RequestState kDirectStateOrder[kDirectStates] = {
      sched::RequestState::kCompleted, sched::RequestState::kFailed, sched::RequestState::kCancelled,
      sched::RequestState::kTimedOut};
  static constexpr std::size_t direct_state_index(sched::RequestState state) {
    for (std::size_t i = 0; i < kDirectStates; ++i) {
      if (kDirectStateOrder[i] == state) return i;
    }
    return 1;  // any other end counts as failed
  }
  static constexpr std::size_t kDirectBatches = 0, kDirectRequests = 1, kDirectBytes = 1 + 2 * kDirectStates,
                               kDirectMissed = kDirectBytes + 2;  // per QoS class
  static_assert(kDirectMissed + sched::kQosClassCount <= ThreadCounts::kCounters);
  void count_direct(const std::uint64_t (&counts)[2][kDirectStates], const std::uint64_t (&bytes)[2],
                    const std::uint64_t (&missed)[sched::kQosClassCount] = {});
  // baton_engine_deadlines_missed_total, per QoS class.
  void count_missed(const std::uint64_t (&missed)[sched::kQosClassCount]);
  // run_direct's end: the counts, and ok or the first failed copy's status.
  [[nodiscard]] Status count_ran(const Batch& batch, std::vector<Status>& results);
  // submit_direct's checks of each request, gathering its copies: false
  // when one takes the loop's way (which says why).
  [[nodiscard]] static bool gather_direct(const Batch& batch, TimeNs now_ns,
                                          std::vector<transport::UcxTransport::DirectCopy>& copies,
                                          std::uint64_t& bytes, TimeNs& earliest_deadline_ns);
  ThreadCounts direct_counts_;
  ThreadCounts::Totals direct_flushed_{};  // on the loop
  // Whether anyone asked for ended_fd(): else a batch's end writes nothing
  // (a syscall per batch on the loop-free path).
  mutable std::atomic<bool> ended_fd_used_{false};
  std::deque<sched::RequestId> released_;  // requests of released batches, forgotten in on_turn
  std::vector<PendingConnect> connects_;
  std::vector<PendingRefresh> refreshes_;
  std::vector<PendingUnregister> unregisters_;
  std::unordered_set<RegionHandle> late_unregisters_;  // answer_unregister_later

  const int ended_fd_;
  std::mutex ended_mutex_;
  std::condition_variable ended_cv_;
  std::atomic<std::uint64_t> ended_count_{0};
  struct Ended {
    BatchStatus status;
    bool clean = false;   // no slice of it still on the wire
    bool direct = false;  // copied by submit_direct: the loop has no record
  };
  using EndedMap = std::unordered_map<std::uint64_t, Ended>;
  using EndedNode = EndedMap::node_type;
  // A batch whose requests all ended, being closed a part a turn: its final
  // status so far and the counts for the metrics.
  struct Ending {
    std::uint64_t id = 0;
    std::size_t next = 0;
    EndedNode node;
    bool all_ok = true;
    std::uint64_t ended[2][8]{};  // per op (read, write), per final state
    std::uint64_t bytes[2]{};     // delivered, per op
    std::uint64_t missed[sched::kQosClassCount]{};  // deadlines missed, per QoS class
  };
  std::deque<Ending> ending_;  // in the order they ended; on the loop
  // Makes an ended batch's final status visible to waiting threads.
  void publish_ended(std::uint64_t id, EndedNode node);
  // A direct batch's end: published now, or after its notification (posted
  // to the loop) when it has one and every request completed.
  void publish_direct(std::uint64_t id, EndedNode node, const std::string& peer, const std::string& notification);
  // A released batch's node, its statuses' memory kept, or a new one: a
  // small direct batch paid two allocations for them (callgrind).
  [[nodiscard]] EndedNode spare_ended_node();
  // One spare node per thread: a thread that submits and releases its own
  // batches recycles them without the mutex.
  static EndedNode& thread_spare();
  static constexpr std::size_t kSpareEnded = 64;
  EndedMap ended_;                          // guarded by ended_mutex_
  std::vector<EndedNode> spare_ended_;      // guarded by ended_mutex_
  std::unordered_set<std::uint64_t> running_;        // guarded by ended_mutex_
  int waiters_ = 0;                         // guarded by ended_mutex_
  bool waiters_closed_ = false;             // guarded by ended_mutex_
  // Last: it is destroyed (its thread ends every job through end_copied)
  // while everything above still exists.
  std::unique_ptr<DirectCopier> copier_;
};

}  // namespace baton::engine
