// The Transport interface: what the scheduler needs from a datapath. A
// transport carries slices on the lanes of its paths and reports completions
// when the loop polls it with the current time. It never blocks and never
// reads a clock itself: time comes in as `now_ns`, so the same scheduler runs
// against the simulator under a virtual clock and against UCX under a wall
// clock. Implementations live on the engine loop and take no locks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/transport/codec.h"
#include "baton/topology/cost_model.h"

namespace baton::transport {

using SliceId = std::uint64_t;
// An index into Transport::paths(). A transport may give a failed path's
// index to a later connect once nothing of the old path is left (UCX: a
// peer gone for good, another connected); its PathInfo::incarnation then
// moves, and so does paths_version().
using PathId = std::uint32_t;

// One directed physical route between two endpoints, as the transport offers it.
struct PathInfo {
  std::string from;  // topology node ids: "gpu0"
  std::string to;
  topology::PathType type = topology::PathType::kHostStaging;
  int lanes = 1;
  double bandwidth_gbps = 0;  // the whole path; lanes share it
  double latency_us = 0;
  // How many times the index was given to a new path: what a scheduler or
  // estimator learned of the path before does not hold for this one.
  std::uint32_t incarnation = 0;
  [[nodiscard]] std::string name() const;  // "gpu0->gpu1/nvswitch"
  friend bool operator==(const PathInfo&, const PathInfo&) = default;
};

enum class Op : std::uint8_t { kWrite, kRead };

// Where a region's bytes live: host memory, or a GPU's (UCX needs CUDA
// support for VRAM; the CUDA transport carries it on one host).
enum class MemoryKind : std::uint8_t { kDram, kVram };

// A region registered with a transport; peers name it in
// SliceMemory::remote_key. Never reused by one transport.
using RegionHandle = std::uint32_t;

// Where a slice's bytes live, for transports that move real memory (the
// simulator moves only counts and ignores it). `remote_key` and `peer` are
// handles the transport gave out when the peer and its regions became known.
struct SliceMemory {
  Op op = Op::kWrite;
  void* local = nullptr;          // inside a region registered with this transport
  std::uint64_t remote_addr = 0;  // inside a region the peer registered
  std::uint32_t remote_key = 0;
};

// `bytes` is the payload: what lands at the destination. A compressed
// slice crosses the wire as `wire_bytes` (< bytes); 0 means uncompressed.
// Only a transport that carries_compressed_slices() takes one, so a
// shortened transfer can never pass for a whole one.
struct SliceSubmit {
  SliceId id = 0;
  PathId path = 0;
  int lane = 0;
  std::uint64_t bytes = 0;
  SliceMemory memory;
  std::uint64_t wire_bytes = 0;
  [[nodiscard]] std::uint64_t on_wire() const { return wire_bytes != 0 ? wire_bytes : bytes; }
};

// The end of a slice that was not cancelled. `status` is ok, or unavailable
// when the path failed under it (a fault, a dead peer).
struct Completion {
  SliceId id = 0;
  PathId path = 0;
  int lane = 0;
  std::uint64_t bytes = 0;  // payload
  TimeNs at_ns = 0;
  Status status;
  std::uint64_t wire_bytes = 0;  // what crossed the wire (the path's rate is measured on these)
};

struct CancelResult {
  // True when the slice was stopped before it completed; it then produces
  // no Completion. False when it had already delivered all its bytes (its
  // completion is on the way) or is unknown.
  bool stopped = false;
  // Bytes that had crossed the wire before the stop: moved, then thrown away.
  std::uint64_t bytes_wasted = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  [[nodiscard]] virtual const std::vector<PathInfo>& paths() const = 0;
  // Moves whenever a path already in paths() changes (UCX: its type, once
  // the handshake says what carries it; a failed path's index taken by a new
  // peer), so a scheduler that took the path on early re-reads it. Paths
  // that are only added leave it alone.
  [[nodiscard]] virtual std::uint64_t paths_version() const { return 0; }

  // Queues a slice on a lane (FIFO per lane). invalid_argument for an unknown
  // path, lane or a zero-byte slice; already_exists for a slice id in use;
  // unavailable when the path is down (nothing is queued then).
  [[nodiscard]] virtual Status submit(const SliceSubmit& slice, TimeNs now_ns) = 0;

  // Best effort. A queued slice is removed; a slice on the wire stops now and
  // its bytes so far are wasted.
  virtual CancelResult cancel(SliceId id, TimeNs now_ns) = 0;

  // Appends every completion due at or before `now_ns`, in time order.
  virtual void poll(TimeNs now_ns, std::vector<Completion>& out) = 0;

  // The next instant at which something will happen without new input (a
  // completion, a path going down or up); nullopt when idle. The virtual
  // driver jumps there.
  [[nodiscard]] virtual std::optional<TimeNs> next_event_ns() const = 0;

  [[nodiscard]] virtual bool path_healthy(PathId path, TimeNs now_ns) const = 0;
  // Why a path is not healthy, where the transport knows (UCX: the failure
  // that ended it); ok otherwise. What a request that lost its last path says.
  [[nodiscard]] virtual Status path_status(PathId /*path*/) const { return Status::ok(); }

  // For a wall-clock loop that sleeps when idle: a file descriptor that turns
  // readable when the transport has work (-1: none; the loop then sleeps
  // until next_event_ns()), and arm(), which readies it and answers false
  // when there is work already (poll again instead of sleeping).
  [[nodiscard]] virtual int event_fd() const { return -1; }
  [[nodiscard]] virtual bool arm() { return true; }

  // Whether a slice may cross the wire compressed (SliceSubmit::wire_bytes),
  // and the codec it then uses. A transport that cannot answers false, and
  // admission refuses a codec for it.
  [[nodiscard]] virtual bool carries_compressed_slices() const { return false; }
  [[nodiscard]] virtual Status set_codec(std::shared_ptr<const Codec> /*codec*/) {
    return Status::failed_precondition("set_codec: this transport carries no compressed slices");
  }
};

}  // namespace baton::transport
