// UCP progress on datapath threads, one per rail (UcxConfig::progress_threads).
// Each thread progresses its rail's worker: the socket reads and writes, the
// shared-memory copies and the callbacks of that rail run there, in parallel
// across rails, while the engine loop keeps every scheduling decision.
//
// One rule keeps UCX single-threaded per worker (UCS_THREAD_MODE_SERIALIZED):
// a rail's worker and endpoints are touched only under that rail's mutex. A
// thread holds its own rail's for a burst of progress rounds; the loop holds
// every rail's (hold()) for each call into the transport, so posting,
// flushes, handshake messages, closes and teardown stay on the loop as they
// were. Callbacks only record (state.h), under a mutex of their own since two
// rails may record at once; a thread that recorded something makes fd()
// readable, which wakes the loop. Private to transport/ucx.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "baton/common/status.h"
#include "transport/ucx/control_channel.h"  // UniqueFd

namespace baton::transport::ucx {

class ProgressThreads {
 public:
  struct Rail {
    ucp_worker_h worker = nullptr;
    int worker_fd = -1;  // ucp_worker_get_efd
    std::string cpus;    // "0-7,16-23": where its thread runs; empty: anywhere
  };

  // While alive, no thread progresses: the loop's hold on every worker.
  class Hold {
   public:
    explicit Hold(ProgressThreads* threads);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    ProgressThreads* threads_;
  };

  // One thread per rail. `recorded` is set by the transport's callbacks: a
  // thread that finds it set after progress clears it and signals fd().
  // unavailable when the kernel refuses an eventfd or epoll instance.
  [[nodiscard]] static Result<std::unique_ptr<ProgressThreads>> create(std::vector<Rail> rails,
                                                                      std::atomic<bool>* recorded);
  ~ProgressThreads();  // stops and joins; the workers stay as they are
  ProgressThreads(const ProgressThreads&) = delete;
  ProgressThreads& operator=(const ProgressThreads&) = delete;

  [[nodiscard]] std::size_t size() const { return rails_.size(); }
  // Readable once a thread recorded something for the loop; drain() resets it.
  [[nodiscard]] int fd() const { return signal_.get(); }
  void drain();
  // Threads whose rail's NIC is local to some CPUs and that run on them only.
  [[nodiscard]] int pinned() const { return pinned_.load(std::memory_order_relaxed); }

 private:
  struct PerRail {
    Rail rail;
    std::mutex mutex;
    UniqueFd kick;                    // wakes its thread from epoll
    std::atomic<bool> sleeping{false};  // armed and waiting: a hold's end kicks it
    std::thread thread;
  };
  explicit ProgressThreads(UniqueFd signal, std::atomic<bool>* recorded);
  void run(PerRail& r);
  void signal_if_recorded();

  UniqueFd signal_;
  std::atomic<bool>* recorded_;
  std::atomic<bool> stop_{false};
  std::atomic<int> waiting_{0};  // the loop wants the mutexes: threads step aside
  std::atomic<int> pinned_{0};
  std::vector<std::unique_ptr<PerRail>> rails_;
};

// The CPUs local to a NIC ("mlx5_0", "mlx5_0:1", "eth1"), as hwloc places it;
// empty when it cannot tell or the NIC is local to every CPU.
[[nodiscard]] std::string cpus_near_nic(std::string_view nic);

}  // namespace baton::transport::ucx
