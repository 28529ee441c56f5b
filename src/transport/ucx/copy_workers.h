// Same-host copies on datapath threads instead of the engine loop. The loop
// keeps every scheduling decision: it hands each posted slice to the worker
// of its lane (a lane's slices stay in order, as on a network lane, and the
// scheduler's credits bound how many wait there) through a single-producer
// ring, and takes completions back through another; neither side locks. An
// idle worker spins briefly, then sleeps on a futex; the loop is woken by an
// eventfd only when it armed itself to sleep. Private to transport/ucx.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "baton/common/status.h"
#include "transport/ucx/control_channel.h"  // UniqueFd

namespace baton::transport::ucx {

// A bounded queue for one producer thread and one consumer thread.
template <typename T, std::size_t kCapacity>
class SpscRing {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "a power of two");

 public:
  bool push(const T& value) {
    const std::size_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_.load(std::memory_order_acquire) == kCapacity) return false;
    slots_[tail & (kCapacity - 1)] = value;
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }
  std::optional<T> pop() {
    const std::size_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_.load(std::memory_order_acquire)) return std::nullopt;
    T value = slots_[head & (kCapacity - 1)];
    head_.store(head + 1, std::memory_order_release);
    return value;
  }
  [[nodiscard]] bool empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

 private:
  std::array<T, kCapacity> slots_{};
  alignas(64) std::atomic<std::size_t> head_{0};  // the consumer's
  alignas(64) std::atomic<std::size_t> tail_{0};  // the producer's
};

class CopyWorkers {
 public:
  struct Job {
    std::uint64_t tag = 0;  // the caller's name for it (a slice id)
    std::byte* to = nullptr;
    const std::byte* from = nullptr;
    std::size_t bytes = 0;
  };
  // Jobs posted to one worker and not yet taken back, at most.
  static constexpr std::size_t kDepth = 256;

  // `threads` >= 1. unavailable when the kernel refuses an eventfd.
  [[nodiscard]] static Result<std::unique_ptr<CopyWorkers>> create(int threads);
  ~CopyWorkers();  // finishes every posted job, then joins
  CopyWorkers(const CopyWorkers&) = delete;
  CopyWorkers& operator=(const CopyWorkers&) = delete;

  [[nodiscard]] std::size_t size() const { return workers_.size(); }
  // Readable when a job finished while the loop was armed (arm()).
  [[nodiscard]] int fd() const { return event_.get(); }
  // On the loop thread only. False when `worker` holds kDepth jobs not yet
  // taken back: the caller copies this one itself.
  [[nodiscard]] bool post(std::size_t worker, const Job& job);
  // On the loop thread only: appends the tags of finished jobs.
  void take(std::vector<std::uint64_t>& done);
  // Before the loop sleeps: false when a job finished already (take it);
  // else a job finishing from now on makes fd() readable.
  [[nodiscard]] bool arm();
  // Jobs the workers copied since creation.
  [[nodiscard]] std::uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }

 private:
  struct Worker {
    SpscRing<Job, kDepth> jobs;
    SpscRing<std::uint64_t, kDepth> done;
    std::size_t outstanding = 0;  // the loop's: posted, not taken back
    std::atomic<std::uint32_t> wake{0};
    std::atomic<bool> sleeping{false};
    std::thread thread;
  };
  explicit CopyWorkers(UniqueFd event);
  void run(Worker& w);

  UniqueFd event_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> signaled_{false};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> copies_{0};
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace baton::transport::ucx
