#include "transport/ucx/progress_threads.h"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "baton/common/log.h"

namespace baton::transport::ucx {
namespace {

// Progress rounds per hold of a rail's mutex: enough to drain a burst, few
// enough that the loop's next call does not wait long behind them.
constexpr int kRoundsPerHold = 64;

// Runs the calling thread on `cpus` ("0-7,16-23"); false when it could not.
bool pin_to(const std::string& cpus) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set == nullptr) return false;
  bool ok = hwloc_bitmap_list_sscanf(set, cpus.c_str()) == 0 && !hwloc_bitmap_iszero(set);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (ok) {
    for (int cpu = hwloc_bitmap_first(set); cpu >= 0; cpu = hwloc_bitmap_next(set, cpu)) {
      if (cpu < CPU_SETSIZE) CPU_SET(cpu, &mask);
    }
    ok = CPU_COUNT(&mask) > 0 && pthread_setaffinity_np(pthread_self(), sizeof mask, &mask) == 0;
  }
  hwloc_bitmap_free(set);
  return ok;
}

}  // namespace

std::string cpus_near_nic(std::string_view nic) {
  const std::string device(nic.substr(0, nic.find(':')));  // "mlx5_0:1" -> its device
  if (device.empty()) return {};
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) return {};
  std::string cpus;
  if (hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) == 0 &&
      hwloc_topology_load(topology) == 0) {
    for (hwloc_obj_t dev = hwloc_get_next_osdev(topology, nullptr); dev != nullptr;
         dev = hwloc_get_next_osdev(topology, dev)) {
      if (dev->name == nullptr || device != dev->name) continue;
      hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(topology, dev);
      if (near == nullptr || near->cpuset == nullptr ||
          hwloc_bitmap_isequal(near->cpuset, hwloc_topology_get_topology_cpuset(topology))) {
        break;  // local to every CPU: nothing to choose
      }
      char* text = nullptr;
      if (hwloc_bitmap_list_asprintf(&text, near->cpuset) >= 0 && text != nullptr) cpus = text;
      std::free(text);  // NOLINT: hwloc allocates with malloc
      break;
    }
  }
  hwloc_topology_destroy(topology);
  return cpus;
}

ProgressThreads::Hold::Hold(ProgressThreads* threads) : threads_(threads) {
  if (threads_ == nullptr) return;
  threads_->waiting_.fetch_add(1, std::memory_order_acq_rel);
  for (auto& r : threads_->rails_) r->mutex.lock();  // always in rail order
  threads_->waiting_.fetch_sub(1, std::memory_order_acq_rel);
}

ProgressThreads::Hold::~Hold() {
  if (threads_ == nullptr) return;
  for (auto& r : threads_->rails_) {
    // Under its mutex, a thread announces its sleep only after its last
    // progress and arm; whatever this hold posted since needs it awake.
    const bool kick = r->sleeping.exchange(false, std::memory_order_acq_rel);
    r->mutex.unlock();
    if (kick) notify_eventfd(r->kick.get());
  }
}

Result<std::unique_ptr<ProgressThreads>> ProgressThreads::create(std::vector<Rail> rails,
                                                                 std::atomic<bool>* recorded) {
  if (rails.empty() || recorded == nullptr) {
    return std::unexpected(Status::invalid_argument("ProgressThreads: no rails, or nothing to record into"));
  }
  auto signal = make_eventfd();
  if (!signal) return std::unexpected(signal.error());
  std::unique_ptr<ProgressThreads> made(new ProgressThreads(std::move(*signal), recorded));
  for (Rail& rail : rails) {
    auto r = std::make_unique<PerRail>();
    r->rail = std::move(rail);
    auto kick = make_eventfd();
    if (!kick) return std::unexpected(kick.error());
    r->kick = std::move(*kick);
    made->rails_.push_back(std::move(r));
  }
  for (auto& r : made->rails_) r->thread = std::thread([p = made.get(), r = r.get()] { p->run(*r); });
  return made;
}

ProgressThreads::ProgressThreads(UniqueFd signal, std::atomic<bool>* recorded)
    : signal_(std::move(signal)), recorded_(recorded) {}

ProgressThreads::~ProgressThreads() {
  stop_.store(true, std::memory_order_release);
  for (auto& r : rails_) notify_eventfd(r->kick.get());
  for (auto& r : rails_) {
    if (r->thread.joinable()) r->thread.join();
  }
}

void ProgressThreads::drain() { reset_eventfd(signal_.get()); }

void ProgressThreads::signal_if_recorded() {
  if (recorded_->exchange(false, std::memory_order_acq_rel)) notify_eventfd(signal_.get());
}

void ProgressThreads::run(PerRail& r) {
  if (!r.rail.cpus.empty()) {
    if (pin_to(r.rail.cpus)) {
      pinned_.fetch_add(1, std::memory_order_relaxed);
    } else {
      baton::logger().warn("ucx: a progress thread could not be pinned to CPUs {}", r.rail.cpus);
    }
  }
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  for (int fd : {r.rail.worker_fd, r.kick.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll.get() < 0 || epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      // Without a way to sleep, it polls: correct, only costlier.
      baton::logger().warn("ucx: a progress thread cannot sleep ({}): it will poll", std::strerror(errno));
      epoll = UniqueFd(-1);
      break;
    }
  }
  while (!stop_.load(std::memory_order_acquire)) {
    unsigned done = 0;
    bool armed = false;
    {
      std::lock_guard lock(r.mutex);
      for (int i = 0; i < kRoundsPerHold; ++i) {
        const unsigned n = ucp_worker_progress(r.rail.worker);
        done += n;
        // Nothing left, or the loop waits to post: it goes first.
        if (n == 0 || waiting_.load(std::memory_order_acquire) > 0) break;
      }
      // UCX's rule for sleeping: progress until nothing was done, then arm
      // (BUSY: events came in since; progress again).
      if (done == 0 && epoll.get() >= 0) {
        const ucs_status_t st = ucp_worker_arm(r.rail.worker);
        if (st != UCS_OK && st != UCS_ERR_BUSY) baton::logger().warn("ucx: ucp_worker_arm: {}", ucs_status_string(st));
        armed = st == UCS_OK;
        if (armed) r.sleeping.store(true, std::memory_order_release);
      }
    }
    signal_if_recorded();
    if (!armed) {
      // The loop waits for every rail's mutex: let it have them first.
      while (waiting_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
      continue;
    }
    epoll_event events[2];
    while (epoll_wait(epoll.get(), events, 2, -1) < 0 && errno == EINTR) {
    }
    reset_eventfd(r.kick.get());
    r.sleeping.store(false, std::memory_order_release);
  }
}

}  // namespace baton::transport::ucx
