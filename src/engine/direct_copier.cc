#include "engine/direct_copier.h"

#include <algorithm>
#include <span>
#include <utility>

#include "baton/common/units.h"

namespace baton::engine {

DirectCopier::DirectCopier(const transport::UcxTransport& ucx, Done done, std::function<TimeNs()> clock)
    : ucx_(ucx), done_(std::move(done)), clock_(std::move(clock)) {}

DirectCopier::~DirectCopier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    exiting_ = true;
    for (auto& job : jobs_) job->cancelled = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DirectCopier::push(std::unique_ptr<Job> job) {
  job->results.resize(job->copies.size());  // before a poll can look at it
  job->landed.resize(job->copies.size());
  job->completed_ns.resize(job->copies.size());
  {
    std::lock_guard lock(mutex_);
    for (const auto& c : job->copies) ++naming_[c.local];
    queued_bytes_ += job->bytes;
    by_id_.emplace(job->id, job.get());
    held_.fetch_add(1);
    if (stopping_) job->cancelled = true;  // a shutdown under way: it ends at once, cancelled
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

DirectCopier::Cancel DirectCopier::cancel(std::uint64_t id) {
  if (held_.load() == 0) return Cancel::kUnknown;
  std::lock_guard lock(mutex_);
  const auto it = by_id_.find(id);
  if (it == by_id_.end()) return Cancel::kUnknown;
  Job& job = *it->second;
  if (job.cancelled) return Cancel::kFinishing;  // a second cancel: already stopping, as on the loop
  if (job.started == job.copies.size() && job.parts_left == 0) return Cancel::kFinishing;
  job.cancelled = true;
  return Cancel::kCancelled;
}

void DirectCopier::cancel_all() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  for (auto& job : jobs_) job->cancelled = true;
}

bool DirectCopier::idle() const {
  std::lock_guard lock(mutex_);
  return jobs_.empty();
}

std::uint64_t DirectCopier::queued_bytes() const {
  std::lock_guard lock(mutex_);
  return queued_bytes_;
}

std::uint64_t DirectCopier::requests_naming(transport::RegionHandle local) const {
  std::lock_guard lock(mutex_);
  const auto it = naming_.find(local);
  return it == naming_.end() ? 0 : it->second;
}

bool DirectCopier::holds(std::uint64_t id) const {
  if (held_.load() == 0) return false;
  std::lock_guard lock(mutex_);
  return by_id_.contains(id);
}

sched::RequestState DirectCopier::state_of(const Status& result) {
  switch (result.code()) {
    case StatusCode::kOk: return sched::RequestState::kCompleted;
    case StatusCode::kCancelled: return sched::RequestState::kCancelled;
    case StatusCode::kTimeout: return sched::RequestState::kTimedOut;
    default: return sched::RequestState::kFailed;
  }
}

bool DirectCopier::status(std::uint64_t id, BatchStatus& out) const {
  if (held_.load() == 0) return false;
  std::lock_guard lock(mutex_);
  const auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  const Job& job = *it->second;
  out.done = false;
  out.status = Status::ok();
  out.bytes = job.bytes;
  out.bytes_done = 0;
  out.requests.resize(job.copies.size());
  for (std::size_t i = 0; i < job.copies.size(); ++i) {
    sched::RequestStatus& s = out.requests[i];
    const std::uint64_t length = job.copies[i].bytes;
    const bool final = i < job.finished;
    // After a cancel, a request no chunk took is as good as ended
    // cancelled, and one copied in parts stops after the part under way.
    const bool dropped = job.cancelled && i >= job.started;
    const bool stopping = job.cancelled && i + 1 == job.started && job.parts_left > 0;
    s.state = final      ? state_of(job.results[i])
              : dropped  ? sched::RequestState::kCancelled
              : stopping ? sched::RequestState::kCancelling
              : i < job.started ? sched::RequestState::kRunning
                                : sched::RequestState::kQueued;
    s.status = final ? job.results[i] : dropped ? Status::cancelled("request {} of the batch cancelled", i) : Status::ok();
    s.qos = job.meta[i].qos;
    s.bytes = length;
    const bool in_parts = !final && i + 1 == job.started && (job.parts_left > 0 || job.parts_landed > 0);
    s.bytes_done = final ? job.landed[i] : in_parts ? job.parts_landed : 0;
    // As on the loop, what no slice (here: no part) has taken yet.
    s.bytes_unsent = final ? length - s.bytes_done : in_parts ? job.parts_left : i < job.started ? 0 : length;
    s.deadline_ns = job.meta[i].deadline_ns;
    s.submitted_ns = job.submitted_ns;
    s.completed_ns = final ? job.completed_ns[i] : 0;
    s.slices_spilled = 0;
    s.slices_preempted = 0;
    out.bytes_done += s.bytes_done;
  }
  return true;
}

void DirectCopier::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    // Not on stopping_: a batch pushed during a shutdown still ends here.
    wake_.wait(lock, [&] { return !jobs_.empty() || exiting_; });
    if (jobs_.empty()) return;  // the destructor, nothing left
    Job& job = *jobs_.front();
    lock.unlock();
    copy(job);
    lock.lock();
    // Its regions are free again, and it ends (done_ publishes it) in the
    // same section: a poll or cancel sees it either here or ended.
    for (const auto& c : job.copies) {
      if (const auto it = naming_.find(c.local); it != naming_.end() && --it->second == 0) naming_.erase(it);
    }
    queued_bytes_ -= job.bytes;
    by_id_.erase(job.id);
    std::unique_ptr<Job> ended = std::move(jobs_.front());
    jobs_.pop_front();
    done_(*ended);
    held_.fetch_sub(1);  // after the publication (see held_)
  }
}

void DirectCopier::copy(Job& job) {
  const std::size_t n = job.copies.size();
  std::size_t from = 0;
  while (from < n) {
    if (job.copies[from].bytes > kChunkBytes) {
      if (!copy_in_parts(job, from)) break;
      ++from;
      continue;
    }
    std::size_t to = from;
    std::uint64_t bytes = 0;
    while (to < n && job.copies[to].bytes <= kChunkBytes && bytes + job.copies[to].bytes <= kChunkBytes) {
      bytes += job.copies[to++].bytes;
    }
    {
      std::lock_guard lock(mutex_);
      if (job.cancelled) break;
      job.started = to;
    }
    const TimeNs now_ns = clock_();
    bool expired = false;
    for (std::size_t i = from; i < to && !expired; ++i) {
      expired = job.meta[i].expires_ns != 0 && now_ns >= job.meta[i].expires_ns;
    }
    const std::span<const transport::UcxTransport::DirectCopy> chunk(job.copies.data() + from, to - from);
    const std::span<Status> results(job.results.data() + from, to - from);
    // The chunk is checked again: a region or peer may have gone since submit.
    if (expired || !ucx_.copy_direct(chunk, results).is_ok()) copy_each(job, from, to, now_ns);
    const TimeNs ended_ns = clock_();
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = from; i < to; ++i) {
        job.landed[i] = job.results[i].is_ok() ? job.copies[i].bytes : 0;
        job.completed_ns[i] = ended_ns;
      }
      job.finished = to;
    }
    from = to;
  }
  const TimeNs ended_ns = clock_();
  std::lock_guard lock(mutex_);
  for (std::size_t i = job.finished; i < n; ++i) {
    job.results[i] = Status::cancelled("request {} of the batch cancelled", i);  // as the loop says it
    job.completed_ns[i] = ended_ns;
  }
  job.finished = n;
}

bool DirectCopier::copy_in_parts(Job& job, std::size_t i) {
  const transport::UcxTransport::DirectCopy& whole = job.copies[i];
  const Job::Meta& meta = job.meta[i];
  std::uint64_t landed = 0;
  Status result = Status::ok();
  bool cancelled = false;
  while (landed < whole.bytes) {
    const std::uint64_t part = std::min(kChunkBytes, whole.bytes - landed);
    const bool expired = meta.expires_ns != 0 && clock_() >= meta.expires_ns;
    {
      // Decided with the cancel's view: a cancel answered ok stops this
      // request, and one that comes after this ends "already stopping".
      std::lock_guard lock(mutex_);
      cancelled = job.cancelled;
      if (cancelled || expired) {
        job.parts_left = 0;
        break;
      }
      job.started = i + 1;
      job.parts_left = whole.bytes - landed - part;
    }
    transport::UcxTransport::DirectCopy piece = whole;
    piece.local_offset += landed;
    piece.remote_offset += landed;
    piece.bytes = part;
    Status copied;
    if (Status s = ucx_.copy_direct(std::span(&piece, 1), std::span(&copied, 1)); !s.is_ok()) {
      // Its region was unregistered or revoked, or its peer failed, since submit.
      copied = Status::unavailable("request {} of the batch: not copied: {}", i, s.message());
    }
    std::lock_guard lock(mutex_);
    if (!copied.is_ok()) {
      job.parts_left = 0;
      result = std::move(copied);
      break;
    }
    landed += part;
    job.parts_landed = landed;
  }
  if (cancelled) {
    result = Status::cancelled("request {} of the batch cancelled", i);
  } else if (landed < whole.bytes && result.is_ok()) {
    result = Status::timeout("request {} of the batch: not done {} after submit (transfer timeout)", i,
                             format_duration(meta.expires_ns - job.submitted_ns));
  }
  const TimeNs ended_ns = clock_();
  std::lock_guard lock(mutex_);
  job.results[i] = std::move(result);
  job.landed[i] = landed;
  job.completed_ns[i] = ended_ns;
  job.parts_landed = 0;
  job.parts_left = 0;
  job.started = std::max(job.started, i + 1);
  job.finished = i + 1;
  return !cancelled;
}

void DirectCopier::copy_each(Job& job, std::size_t from, std::size_t to, TimeNs now_ns) {
  for (std::size_t i = from; i < to; ++i) {
    const Job::Meta& meta = job.meta[i];
    if (meta.expires_ns != 0 && now_ns >= meta.expires_ns) {
      job.results[i] = Status::timeout("request {} of the batch: not done {} after submit (transfer timeout)", i,
                                       format_duration(meta.expires_ns - job.submitted_ns));
      continue;
    }
    const std::span<const transport::UcxTransport::DirectCopy> one(&job.copies[i], 1);
    if (Status s = ucx_.copy_direct(one, std::span<Status>(&job.results[i], 1)); !s.is_ok()) {
      // Its region was unregistered or revoked, or its peer failed, after submit.
      job.results[i] = Status::unavailable("request {} of the batch: not copied: {}", i, s.message());
    }
  }
}

}  // namespace baton::engine
