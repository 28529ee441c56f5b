// What every workload over UCX starts from: a wall-clock engine with one
// local buffer registered, connected to a peer (a `baton serve`), and the
// peer's largest region.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "baton/engine/engine.h"
#include "baton/sched/policy.h"
#include "baton/transport/ucx_transport.h"

namespace baton::workloads {

struct UcxRig {
  // Declared first so it outlives the engine: every request of a workload
  // lands on these same bytes (the workloads measure time; the throughput
  // bench and the demo check data).
  std::vector<std::byte> buffer;
  std::unique_ptr<engine::Engine> engine;
  engine::Region local;
  engine::Peer peer;
  transport::RemoteRegion remote;

  // `length` bytes between the buffer and the peer's region.
  [[nodiscard]] engine::Request request(transport::Op op, std::uint64_t length, std::uint64_t local_offset = 0,
                                        std::uint64_t remote_offset = 0) const;
  [[nodiscard]] engine::Request read(std::uint64_t length, std::uint64_t local_offset = 0,
                                     std::uint64_t remote_offset = 0) const {
    return request(transport::Op::kRead, length, local_offset, remote_offset);
  }
};

// `prepare` runs on the new engine before any traffic (admission callbacks
// belong there). out_of_range when the peer's largest region is smaller than
// `buffer_bytes`; the engine's errors otherwise.
[[nodiscard]] Result<std::unique_ptr<UcxRig>> connect_rig(const sched::SchedPolicy& policy, const std::string& peer,
                                                          const transport::UcxConfig& ucx, std::uint64_t buffer_bytes,
                                                          const std::function<void(engine::Engine&)>& prepare = {});

// Submits `batch`, waits for it (up to `timeout_ns`) and releases it: the
// time from submit to its end, or the batch's failure.
[[nodiscard]] Result<TimeNs> run_batch(engine::Engine& engine, const engine::Batch& batch,
                                       TimeNs timeout_ns = 600'000'000'000);

// The link's rate as bulk reads see it: 16 reads of `bytes` at once, the
// best of three rounds (GB/s). The figure a workload's --load refers to.
[[nodiscard]] Result<double> measure_link(UcxRig& rig, std::uint64_t bytes);

}  // namespace baton::workloads
