// Same-host batches too large to copy within submit (above
// UcxConfig::direct_copy_max_bytes): copied on a datapath thread instead of
// through the loop, a chunk at a time, so that submit returns at once, the
// loop's per-request work is skipped, and a cancel, a timeout or a
// shutdown stops a batch between two chunks. Private to engine/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "baton/sched/scheduler.h"
#include "baton/transport/ucx_transport.h"

namespace baton::engine {

class DirectCopier {
 public:
  // One batch, owned by the copier until it ended.
  struct Job {
    struct Meta {
      sched::QosClass qos = sched::QosClass::kPrefillBulk;
      TimeNs deadline_ns = 0;
      TimeNs expires_ns = 0;  // when it ends `timeout` if not yet copied; 0: never
    };
    std::uint64_t id = 0;
    TimeNs submitted_ns = 0;
    std::deque<std::string> peers;  // what copies[i].peer views (a deque: they never move)
    std::vector<transport::UcxTransport::DirectCopy> copies;  // one per request, in the batch's order
    std::vector<Meta> meta;                                   // per request
    std::vector<Status> results;                              // per request, once copied (or not)
    std::vector<std::uint64_t> landed;                        // per request, once final: its bytes copied
    std::vector<TimeNs> completed_ns;                         // per request, once final: when it ended
    std::string notification;
    std::uint64_t bytes = 0;
    // Requests whose result is final: results[0, finished) may be read
    // under the copier's mutex while it runs (a poll).
    std::size_t finished = 0;  // guarded by the copier's mutex
    std::size_t started = 0;   // requests a chunk took; guarded
    bool cancelled = false;    // guarded
    // A request larger than a chunk is copied a chunk-sized part at a time
    // (copy_in_parts): its bytes copied so far and those no part took yet.
    std::uint64_t parts_landed = 0;  // guarded
    std::uint64_t parts_left = 0;    // guarded
  };
  // Runs on the copier's thread once a job's every result is in: publishes it.
  using Done = std::function<void(Job&)>;

  DirectCopier(const transport::UcxTransport& ucx, Done done, std::function<TimeNs()> clock);
  // Ends every job (cancelled where not yet copied) and joins the thread.
  ~DirectCopier();
  DirectCopier(const DirectCopier&) = delete;
  DirectCopier& operator=(const DirectCopier&) = delete;

  // Any thread. Queues the job (its copies checked by the caller); the
  // thread starts with the first.
  void push(std::unique_ptr<Job> job);
  // Any thread: what it did to batch `id` — kCancelled (its requests not
  // yet in a chunk end cancelled, and a request copied in parts stops after
  // the part under way), kFinishing (every request is in a chunk already
  // and no part is left), or kUnknown (not the copier's, or no longer).
  enum class Cancel : std::uint8_t { kCancelled, kFinishing, kUnknown };
  [[nodiscard]] Cancel cancel(std::uint64_t id);
  // Cancels every job (the engine's shutdown).
  void cancel_all();
  // No job queued or copying: nothing more touches a caller's memory.
  [[nodiscard]] bool idle() const;
  // Bytes queued or being copied (the wait a new batch would see).
  [[nodiscard]] std::uint64_t queued_bytes() const;
  // How many requests of unfinished jobs name `local` as their region.
  [[nodiscard]] std::uint64_t requests_naming(transport::RegionHandle local) const;
  // Whether batch `id` is a job here (queued or copying).
  [[nodiscard]] bool holds(std::uint64_t id) const;
  // A running job's status so far into `out` (its storage reused): its
  // finished requests' results, the rest running or queued. False when
  // `id` is not a job here.
  [[nodiscard]] bool status(std::uint64_t id, BatchStatus& out) const;
  // The batch's final statuses: the state each result stands for.
  [[nodiscard]] static sched::RequestState state_of(const Status& result);

  // A chunk's bytes: small enough that a cancel, a timeout or a revocation
  // waits for one of them (about 0.5 ms at memcpy's speed), large enough
  // that the checks between them cost nothing measurable. A larger request
  // is copied in parts of this size.
  static constexpr std::uint64_t kChunkBytes = 4ULL << 20;

 private:
  void run();
  // Copies the job a chunk at a time; its results all set on return.
  void copy(Job& job);
  // Copies requests [from, to), which need a copy each (the chunk failed as
  // a whole, or some of it timed out): each gets its own result.
  void copy_each(Job& job, std::size_t from, std::size_t to, TimeNs now_ns);
  // Copies request `i`, larger than a chunk, a chunk-sized part at a time;
  // false when a cancel stopped it (what landed stays counted).
  [[nodiscard]] bool copy_in_parts(Job& job, std::size_t i);

  const transport::UcxTransport& ucx_;
  Done done_;
  std::function<TimeNs()> clock_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> jobs_;            // front: the one copying
  std::unordered_map<std::uint64_t, Job*> by_id_;   // jobs_, by batch id
  std::unordered_map<transport::RegionHandle, std::uint64_t> naming_;  // requests_naming
  std::uint64_t queued_bytes_ = 0;
  // by_id_.size(), read without the mutex: a poll or cancel of a batch that
  // never came here (nearly all) takes no lock. Lowered only after the
  // batch was published, so a reader that sees 0 finds it ended.
  std::atomic<std::size_t> held_{0};
  bool stopping_ = false;  // cancel_all: jobs pushed from now on end cancelled
  bool exiting_ = false;   // the destructor: the thread ends once the queue is empty
  std::thread thread_;  // started by the first push
};

}  // namespace baton::engine
