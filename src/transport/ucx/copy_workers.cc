#include "transport/ucx/copy_workers.h"

#include <chrono>

#include "baton/common/copy.h"

namespace baton::transport::ucx {
namespace {

// An idle worker looks for work this long before it sleeps: a slice's
// successor is usually posted within a few microseconds, and a futex wake-up
// costs tens of them on a VM.
constexpr auto kIdleSpin = std::chrono::microseconds(20);

}  // namespace

Result<std::unique_ptr<CopyWorkers>> CopyWorkers::create(int threads) {
  if (threads < 1) return std::unexpected(Status::invalid_argument("CopyWorkers: {} threads (expected >= 1)", threads));
  auto event = make_eventfd();
  if (!event) return std::unexpected(event.error());
  std::unique_ptr<CopyWorkers> made(new CopyWorkers(std::move(*event)));
  for (int i = 0; i < threads; ++i) made->workers_.push_back(std::make_unique<Worker>());
  for (auto& w : made->workers_) w->thread = std::thread([p = made.get(), w = w.get()] { p->run(*w); });
  return made;
}

CopyWorkers::CopyWorkers(UniqueFd event) : event_(std::move(event)) {}

CopyWorkers::~CopyWorkers() {
  stop_.store(true, std::memory_order_seq_cst);
  for (auto& w : workers_) {
    w->wake.fetch_add(1, std::memory_order_release);
    w->wake.notify_one();
  }
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
}

bool CopyWorkers::post(std::size_t worker, const Job& job) {
  Worker& w = *workers_[worker % workers_.size()];
  if (w.outstanding == kDepth || !w.jobs.push(job)) return false;
  ++w.outstanding;
  // An RMW on `wake` orders this post against a worker going to sleep (it
  // does one too between announcing sleep and its last look): one of the
  // two sees the other. Not a fence: ThreadSanitizer cannot follow those.
  w.wake.fetch_add(0, std::memory_order_acq_rel);
  if (w.sleeping.load(std::memory_order_relaxed)) {
    w.wake.fetch_add(1, std::memory_order_release);
    w.wake.notify_one();
  }
  return true;
}

void CopyWorkers::take(std::vector<std::uint64_t>& done) {
  if (signaled_.exchange(false, std::memory_order_acq_rel)) {
    reset_eventfd(event_.get());
  }
  for (auto& w : workers_) {
    while (auto tag = w->done.pop()) {
      done.push_back(*tag);
      --w->outstanding;
    }
  }
}

bool CopyWorkers::arm() {
  // An RMW, as the worker's after its push: either it sees armed_ or this
  // sees its completion.
  armed_.exchange(true, std::memory_order_acq_rel);
  for (auto& w : workers_) {
    if (!w->done.empty()) {
      armed_.store(false, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

void CopyWorkers::run(Worker& w) {
  while (true) {
    if (auto job = w.jobs.pop()) {
      copy_bytes(job->to, job->from, job->bytes);
      copies_.fetch_add(1, std::memory_order_relaxed);
      // Never full: the loop posts at most kDepth jobs not taken back.
      (void)w.done.push(job->tag);
      if (armed_.exchange(false, std::memory_order_acq_rel)) {
        // Written, then flagged: take() reads the eventfd only once flagged.
        notify_eventfd(event_.get());
        signaled_.store(true, std::memory_order_release);
      }
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) return;  // and every posted job is done
    const auto until = std::chrono::steady_clock::now() + kIdleSpin;
    bool found = false;
    while (!found && std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 64 && !(found = !w.jobs.empty()); ++i) __builtin_ia32_pause();
    }
    if (found) continue;
    const std::uint32_t seen = w.wake.load(std::memory_order_acquire);
    w.sleeping.store(true, std::memory_order_relaxed);
    w.wake.fetch_add(0, std::memory_order_acq_rel);  // see post()
    if (w.jobs.empty() && !stop_.load(std::memory_order_acquire)) w.wake.wait(seen, std::memory_order_acquire);
    w.sleeping.store(false, std::memory_order_relaxed);
  }
}

}  // namespace baton::transport::ucx
