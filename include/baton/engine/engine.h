// The Engine facade: what an inference server holds. It owns the topology,
// the transport, the scheduler and the loop that drives them. Two setups:
// the simulated transport under the VirtualClockDriver (tests, simulation,
// benchmarks: TransferRequests between topology nodes), and UCX under the
// WallClockDriver, which moves real bytes between registered memory and
// peers' regions (register_memory, connect, Batches of Requests).
//
// Threads: under the wall clock (EngineConfig::clock) a loop thread owns
// the state; every call that is not marked otherwise posts to it and waits
// for the answer (submit of a TransferRequest only posts), so any thread may
// call them. docs/engine.md has the picture. Under the virtual clock the
// loop runs when the caller advances it (run_until / run_until_idle), from
// one thread. The accessors sim_transport, scheduler, admission, progress
// and next_event_ns read loop state directly: virtual clock, or before
// traffic, only.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/admission/admission.h"
#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/metrics.h"
#include "baton/sched/policy.h"
#include "baton/sched/scheduler.h"
#include "baton/topology/graph.h"
#include "baton/transport/sim_transport.h"
#include "baton/transport/ucx_transport.h"

namespace baton::engine {

enum class ClockKind : std::uint8_t {
  kVirtual,  // the caller drives time (run_until): tests, simulation, benchmarks
  kWall,     // a loop thread runs against the steady clock and sleeps when idle
};

enum class TransportKind : std::uint8_t {
  kSim,  // simulated lanes on the topology's paths
  kUcx,  // real bytes to peers over UCX (needs ClockKind::kWall)
};

struct EngineConfig {
  ClockKind clock = ClockKind::kVirtual;
  TransportKind transport = TransportKind::kSim;
  // kUcx: listen address (default 127.0.0.1:0, an ephemeral port), lanes
  // (UCP endpoints) per peer, UCX_TLS, peer-failure detection.
  transport::UcxConfig ucx;
  // "host:port" to serve GET /metrics (Prometheus text) on; port 0 picks a
  // free one (metrics_address()). Empty: no HTTP server.
  std::string metrics_address;
  // Where the topology comes from: a synthetic model name, else a saved
  // `nvidia-smi topo -m` file, else this machine's probe.
  std::string topology_model = "nvswitch8";
  std::string topology_file;
  sched::SchedPolicy policy = sched::SchedPolicy::defaults();
  // A YAML policy file (configs/sched_policy.yaml); when set it replaces
  // `policy`. Its errors (with line numbers) come back from create().
  std::string policy_file;
  transport::SimConfig sim;
};

// A wall-clock engine over UCX with these transport settings: what every
// real-memory user (serve, the benches, the demo, tests) starts from.
[[nodiscard]] EngineConfig wall_ucx_config(transport::UcxConfig ucx = {});

using transport::MemoryKind;
using transport::Op;
using transport::RegionHandle;

// A registered memory range. `handle` is what peers name in
// Request::remote_region (they learn it in the handshake).
struct Region {
  RegionHandle handle = 0;
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  int device = -1;  // GPU index for VRAM, NUMA node for DRAM; -1: not said
};

// Another engine, by its handshake address.
struct Peer {
  std::string address;  // "127.0.0.1:41234"
};

// One transfer between a local region range and a peer's region range: a
// read brings the peer's bytes here, a write sends ours there.
struct Request {
  Op op = Op::kRead;
  RegionHandle local_region = 0;
  std::uint64_t local_offset = 0;
  std::string peer;                 // Peer::address
  RegionHandle remote_region = 0;   // the peer's Region::handle (remote_regions())
  std::uint64_t remote_offset = 0;
  std::uint64_t length = 0;
  sched::QosClass qos = sched::QosClass::kPrefillBulk;
  TimeNs deadline_ns = 0;  // absolute, on now_ns(); 0: none
  // Relative to submit; past it the request ends `timeout` (0: the
  // policy's transfer_timeout, 60 s by default; negative is refused).
  TimeNs timeout_ns = 0;
};

struct Batch {
  std::vector<Request> requests;
  // Delivered to the peer (take_notifications() there) once every request
  // completed, after their bytes; not sent when one failed or was cancelled.
  // At most 4 KiB; needs every request to name the same peer.
  std::string notification;
};

struct BatchHandle {
  std::uint64_t id = 0;
  friend bool operator==(const BatchHandle&, const BatchHandle&) = default;
};

struct BatchStatus {
  bool done = false;  // every request ended
  Status status;      // once done: ok, or the first request's failure
  std::uint64_t bytes = 0;
  std::uint64_t bytes_done = 0;
  std::vector<sched::RequestStatus> requests;  // in the batch's order
};

class Engine {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Engine>> create(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; the loop picks the request up at its next tick.
  // invalid_argument (zero bytes, same endpoints) or not_found (unknown
  // endpoint) at once, never later.
  [[nodiscard]] Result<sched::RequestId> submit(const sched::TransferRequest& request);
  // All or nothing: one bad request refuses the whole batch.
  [[nodiscard]] Result<std::vector<sched::RequestId>> submit(std::span<const sched::TransferRequest> batch);
  // not_found for an id never handed out; the loop answers invalid_argument
  // for a request that already ended (see status()).
  [[nodiscard]] Status cancel(sched::RequestId id);

  // Until the request ends (ok) or `timeout_ns` passes (timeout): virtual
  // time under the virtual clock (it runs the loop), real time under the
  // wall clock. not_found for an unknown id.
  [[nodiscard]] Status wait(sched::RequestId id, TimeNs timeout_ns);

  // Prometheus text of the engine's metrics: admission (MLU histogram per
  // op, admitted / compressed / dropped / infeasible / signalled) and the
  // scheduler's counters. Call from the driving thread.
  [[nodiscard]] std::string metrics_text();

  [[nodiscard]] Result<sched::RequestStatus> status(sched::RequestId id);
  // Which byte ranges of a request landed and which are still posted
  // (Scheduler::progress); empty while admission still holds it. For a layer
  // that moves the missing rest of a transfer elsewhere (dualpath).
  [[nodiscard]] Result<sched::RequestProgress> progress(sched::RequestId id);
  // The scheduler's counters (a copy, taken on the loop).
  [[nodiscard]] sched::SchedStats stats();

  // --- Real memory and peers (TransportKind::kUcx) ---------------------------
  // Each answers failed_precondition on a simulated engine, and unavailable
  // after shutdown().

  // The handshake address peers connect() to: "127.0.0.1:41234".
  [[nodiscard]] std::string address() const;
  // Where GET /metrics is served, or empty.
  [[nodiscard]] std::string metrics_address() const;

  // Registers [ptr, ptr + length) for transfers and for peers to reach
  // (they see it after their next handshake or refresh). invalid_argument
  // for a null pointer, zero length or an overlap with a region; unavailable
  // when UCX refuses (VRAM without CUDA support in UCX).
  [[nodiscard]] Result<Region> register_memory(void* ptr, std::size_t length, MemoryKind kind = MemoryKind::kDram,
                                               int device = -1);
  // Memory the engine allocates and registers (freed by unregister()). On
  // one host a peer then reads and writes it through shared memory
  // directly, without this engine's CPU (UCX maps the segment); a caller's
  // buffer from register_memory() goes through the CPU of its owner.
  // invalid_argument for zero length.
  [[nodiscard]] Result<Region> allocate_memory(std::size_t length, int numa_node = -1);
  // not_found for an unknown region; failed_precondition while requests on
  // it are queued or in flight (including posted slices of a cancelled
  // request, which UCX cannot recall: they finish first).
  [[nodiscard]] Status unregister(RegionHandle region);

  // Handshake with a peer's listener (no metadata server): endpoints per
  // lane, and the peer's regions with their keys. Blocks until ready, or
  // until the handshake timeout (unavailable). invalid_argument for a
  // malformed address. Connecting again to a live peer returns at once; to
  // a failed one starts afresh.
  [[nodiscard]] Result<Peer> connect(std::string_view address);
  // Learns the peer's current regions (ones registered since the handshake).
  [[nodiscard]] Status refresh(const Peer& peer, TimeNs timeout_ns = 5'000'000'000);
  [[nodiscard]] Result<std::vector<transport::RemoteRegion>> remote_regions(const Peer& peer);

  // Validates every request before any is queued (all or nothing):
  // invalid_argument for an empty batch, zero length, an oversized or
  // multi-peer notification; not_found for an unknown peer, local region
  // or remote region (refresh() may help); out_of_range for a range outside
  // its region; unavailable for a failed peer. Then admits the requests.
  [[nodiscard]] Result<BatchHandle> submit(const Batch& batch);
  // A snapshot of every request's state and bytes. not_found for an unknown
  // or released handle.
  [[nodiscard]] Result<BatchStatus> poll(BatchHandle batch);
  // Until every request of the batch ended (ok; see poll() for how) or the
  // timeout passed (timeout). Wakes at once when the batch ends.
  [[nodiscard]] Status wait(BatchHandle batch, TimeNs timeout_ns);
  // Cancels the requests still running and returns at once. A request
  // reports `cancelled` only once nothing it posted can still land in the
  // caller's memory (UCX cannot recall a posted slice); until then it is
  // `cancelling` and the batch is not done, so wait() before reusing the
  // memory. invalid_argument when no request of the batch is still running
  // (it ended, or a second cancel); not_found for an unknown one.
  [[nodiscard]] Status cancel(BatchHandle batch);
  // Forgets an ended batch (its handle turns unknown), so a long-running
  // engine does not grow. invalid_argument while it runs.
  [[nodiscard]] Status release(BatchHandle batch);
  // Notifications peers sent us since the last call, in arrival order.
  [[nodiscard]] std::vector<transport::Notification> take_notifications();

  // Stops taking work: cancels what runs, closes every peer (they see
  // unavailable) and the listener, and stops the HTTP server. Later calls
  // answer unavailable; the destructor calls it.
  void shutdown();

  // Virtual clock: advance to `t_ns`, running everything due on the way.
  // out_of_range when `t_ns` is in the past.
  [[nodiscard]] Status run_until(TimeNs t_ns);
  // Until nothing is queued, posted or scheduled; timeout if that takes
  // longer than `limit_ns` of virtual time (a stuck workload, not a hang).
  [[nodiscard]] Status run_until_idle(TimeNs limit_ns = 3'600'000'000'000);
  [[nodiscard]] TimeNs now_ns() const;
  // Wall clock: how many times the loop thread has turned (a measure of
  // idle spinning); 0 under the virtual clock.
  [[nodiscard]] std::uint64_t loop_turns() const;
  // The next instant the loop has work without new input (now when commands
  // wait); nullopt when idle. Lets a layer on top (dualpath) interleave its
  // own timers with the engine's events, one instant at a time.
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const;

  [[nodiscard]] const topology::TopologyGraph& topology() const;
  // The simulated transport (TransportKind::kSim only).
  [[nodiscard]] transport::SimTransport& sim_transport();
  [[nodiscard]] const sched::Scheduler& scheduler() const;
  // Admission: register the local-recompute callback and a codec here.
  // Callbacks run on the loop: they must not call back into the Engine and
  // wait (under the wall clock that would wait on the loop itself).
  [[nodiscard]] admission::AdmissionController& admission();
  // The registry metrics_text() exports, for layers on top that add their
  // own counters (dualpath).
  [[nodiscard]] MetricsRegistry& metrics();

 private:
  struct State;
  explicit Engine(std::unique_ptr<State> state);
  template <typename F>
  auto on_loop(F f) -> decltype(f());
  std::unique_ptr<State> state_;
};

}  // namespace baton::engine
