// A scripted CudaRuntime for the layers above it on machines without a GPU.
// "Device memory" is host memory it hands out and remembers by device;
// streams are queues of operations (copy, event mark, event wait) that run
// only when the test or a query() steps them, in an order a seed chooses
// among the streams that can go, so the transport's ordering (events that
// make a stream wait) is what keeps the bytes right, not luck. Every
// executed operation is logged for order checks. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "baton/transport/cuda_runtime.h"

namespace baton::transport::testing {

class FakeCudaRuntime final : public CudaRuntime {
 public:
  // `devices` GPUs; peer[i][j] says whether i may access j (all false when empty).
  explicit FakeCudaRuntime(int devices, std::vector<std::vector<bool>> peer = {}, std::uint64_t seed = 1);
  ~FakeCudaRuntime() override;

  // An executed copy (or the marks between them), in execution order.
  struct LoggedOp {
    CudaStream stream = 0;
    int device = -1;  // the stream's device
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
  };
  [[nodiscard]] const std::vector<LoggedOp>& copies() const { return log_; }
  // Copies enqueued so far, failed ones included (fail_copy_number counts these).
  [[nodiscard]] int copies_enqueued() const { return copies_enqueued_; }

  // Each device's PCI bus id (empty: unknown, so GPUs match by index).
  std::vector<std::string> pci_ids;
  // Operations each query() runs first (0: nothing moves unless step()).
  int steps_per_query = 1;
  // The next `n`-th copy enqueued fails (its stream's later events report
  // the error), counting from 1; 0: none.
  int fail_copy_number = 0;
  // create_stream fails after this many streams (-1: never).
  int stream_limit = -1;

  // Runs one runnable operation (seeded choice among streams); false when
  // none can run.
  bool step();
  void drain() {
    while (step()) {
    }
  }
  [[nodiscard]] std::size_t pending_ops() const;
  [[nodiscard]] std::size_t live_streams() const { return streams_.size(); }
  [[nodiscard]] std::size_t live_events() const { return events_.size(); }
  [[nodiscard]] std::size_t pinned_ranges() const { return pinned_.size(); }
  [[nodiscard]] std::size_t enabled_peer_pairs() const { return enabled_.size(); }

  // --- CudaRuntime ---
  int device_count() const override { return devices_; }
  std::string pci_bus_id(int device) const override;
  bool can_access_peer(int device, int peer) const override;
  Status enable_peer_access(int device, int peer) override;
  Result<CudaStream> create_stream(int device) override;
  void destroy_stream(CudaStream stream) override;
  Result<CudaEvent> create_event(int device) override;
  void destroy_event(CudaEvent event) override;
  Status copy_async(void* dst, const void* src, std::size_t bytes, CudaStream stream) override;
  Status copy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                         CudaStream stream) override;
  Status record(CudaEvent event, CudaStream stream) override;
  Status wait(CudaStream stream, CudaEvent event) override;
  Result<bool> query(CudaEvent event) override;
  Status synchronize(CudaStream stream) override;
  Result<void*> alloc_pinned(std::size_t bytes) override;
  void free_pinned(void* ptr) override;
  Result<void*> alloc_device(int device, std::size_t bytes) override;
  void free_device(void* ptr) override;
  Status register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr) override;
  Result<CudaPointer> pointer(const void* ptr) const override;
  Result<std::uint64_t> device_memory_used(int device) const override;

 private:
  struct Op {
    enum Kind { kCopy, kMark, kWait } kind = kCopy;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
    bool fails = false;
    CudaEvent event = 0;
    std::uint64_t generation = 0;
  };
  struct Stream {
    int device = 0;
    std::deque<Op> ops;
    bool failed = false;
  };
  struct Event {
    int device = 0;
    std::uint64_t recorded = 0;   // generation of the latest record
    std::uint64_t completed = 0;  // generation reached
    bool failed = false;
  };
  struct Range {
    std::uint64_t length = 0;
    int device = -1;  // -1: pinned host
  };
  [[nodiscard]] bool runnable(const Stream& s) const;
  Status enqueue(CudaStream stream, Op op);

  int devices_;
  std::vector<std::vector<bool>> peer_;
  std::mt19937_64 rng_;
  std::map<CudaStream, Stream> streams_;
  std::map<CudaEvent, Event> events_;
  std::uint64_t next_handle_ = 1;
  std::map<std::uint64_t, Range> memory_;  // device and pinned allocations, by base
  std::map<std::uint64_t, std::uint64_t> pinned_;  // registered host ranges
  std::set<std::pair<int, int>> enabled_;
  std::vector<LoggedOp> log_;
  int copies_enqueued_ = 0;
  std::vector<std::uint64_t> device_used_;
};

}  // namespace baton::transport::testing
