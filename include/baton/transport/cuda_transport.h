// The CUDA transport: moves bytes between GPUs of this host, and between a
// GPU and host memory, with asynchronous copies on CUDA streams, under the
// same scheduler as every other transport. Its paths are the topology's:
// GPU↔GPU over NVLink / NVSwitch / PCIe peer-to-peer (cudaMemcpyPeerAsync,
// only where the driver grants peer access), GPU↔GPU through pinned host
// bounce buffers (host staging, pipelined in chunks: the next chunk leaves
// the source while the previous one enters the destination), and NUMA node
// (host memory)↔GPU (cudaMemcpyAsync). Each lane of a path is its own
// stream (two for staging: one per GPU). A slice is posted at submit and
// completes when its CUDA event has fired, which poll() asks without waiting:
// the loop never blocks on a copy. docs/transport.md, "CUDA".
//
// Lives on the engine loop; no locks, no threads. Nothing here links the
// CUDA runtime: it comes in as a CudaRuntime (cuda_runtime() for the real one).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "baton/topology/graph.h"
#include "baton/transport/cuda_runtime.h"
#include "baton/transport/transport.h"

namespace baton::transport {

struct CudaConfig {
  // Streams per path (pairs of streams on staging paths).
  int lanes_per_path = 2;
  // Host staging moves a slice in chunks of this size through
  // `staging_buffers` pinned bounce buffers per lane.
  std::uint64_t staging_chunk_bytes = 4ULL << 20;
  int staging_buffers = 2;
  // While slices are in flight the loop polls again this soon
  // (next_event_ns): CUDA events have no file descriptor to sleep on.
  TimeNs poll_interval_ns = 5'000;
};

class CudaTransport final : public Transport {
 public:
  // Both directions of each link of `graph` that CUDA can carry, GPUs
  // matched to CUDA devices by PCI bus id (by index when the topology does
  // not know it). One peer path per GPU pair, on its best peer link (the
  // driver picks the wire, NVLink where there is one). A peer link whose devices the driver does not let reach
  // each other (or that fails to enable) is left out: its host-staging
  // link stays. invalid_argument for a bad config or a topology GPU with no
  // CUDA device. A lane's streams, events and bounce buffers are made at its
  // first slice (most staging paths are fallbacks that never carry one).
  [[nodiscard]] static Result<std::unique_ptr<CudaTransport>> create(const topology::TopologyGraph& graph,
                                                                     std::shared_ptr<CudaRuntime> runtime,
                                                                     CudaConfig config = {});
  // Waits for nothing: call it when no slice is in flight (slices_in_flight()),
  // or the copies still running write into memory the caller may free.
  ~CudaTransport() override;
  CudaTransport(const CudaTransport&) = delete;
  CudaTransport& operator=(const CudaTransport&) = delete;

  // Memory slices may name: device memory (kVram) of CUDA device `device`,
  // checked against the runtime's pointer attributes over the whole range,
  // or host memory (kDram) of NUMA node `device` (-1: any), pinned here
  // (cudaHostRegister) unless it already is, and unpinned by unregister().
  // invalid_argument for a null pointer, zero length, a range that wraps or
  // overlaps a region, a kVram range that is not all device memory of
  // `device`, or a kDram range that is device memory; unavailable when
  // pinning fails.
  [[nodiscard]] Result<RegionHandle> register_memory(void* ptr, std::size_t length, MemoryKind kind, int device);
  // not_found for an unknown handle; failed_precondition while slices on it run.
  [[nodiscard]] Status unregister(RegionHandle region);

  // The CUDA device of topology node "gpuN"; not_found for another node.
  [[nodiscard]] Result<int> device_of(std::string_view node) const;

  // --- Transport ---
  [[nodiscard]] const std::vector<PathInfo>& paths() const override;
  // A slice moves `bytes` between SliceMemory::local (inside a region on the
  // path's `from` end) and remote_addr (inside region remote_key, on its
  // `to` end): a write copies local → remote, a read remote → local.
  // Everything is checked before anything is posted: invalid_argument for
  // an unknown path or lane, zero bytes, a remote_key that names no region
  // or a region on the wrong end, a local range in no region on the `from`
  // end; out_of_range for a remote range outside its region;
  // already_exists for a slice id in flight; unavailable when the path failed
  // (also when the runtime refuses the lane's first streams or buffers: the
  // path then fails).
  [[nodiscard]] Status submit(const SliceSubmit& slice, TimeNs now_ns) override;
  // A posted copy cannot be recalled: stopped = false, its completion comes.
  CancelResult cancel(SliceId id, TimeNs now_ns) override;
  // Queries the oldest slice's event on each lane (streams complete in
  // order); a failed copy fails its path: its slices complete unavailable.
  void poll(TimeNs now_ns, std::vector<Completion>& out) override;
  // now + poll_interval_ns of the last poll while slices run; nullopt when idle.
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override;
  [[nodiscard]] bool path_healthy(PathId path, TimeNs now_ns) const override;

  [[nodiscard]] std::size_t slices_in_flight() const;

 private:
  struct State;
  explicit CudaTransport(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::transport
