// The Engine: what an inference server (a KV connector) holds to move real
// bytes. It registers memory, connects to peers by host:port with a P2P
// handshake, and moves Batches of read/write Requests between local regions
// and peers' regions over UCX, through admission (deadline feasibility,
// degradation) and the slice scheduler (QoS, deadlines, credits), on a loop
// thread against the wall clock. The simulation harness (harness.h) runs the
// same loop, scheduler and admission over a simulated transport.
//
// Threads: a loop thread owns the state; every call posts to it and waits for
// the answer, so any thread may call them. admission() is the exception: use
// it before any traffic (to register a recompute callback or a codec).
// docs/engine.md has the picture.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "baton/admission/admission.h"
#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/metrics.h"
#include "baton/sched/policy.h"
#include "baton/sched/scheduler.h"
#include "baton/topology/graph.h"
#include "baton/transport/cuda_runtime.h"
#include "baton/transport/ucx_transport.h"

namespace baton::engine {

struct EngineConfig {
  // Listen address (default 127.0.0.1:0, an ephemeral port), the deployment
  // secret (needed to listen beyond loopback), lanes (UCP endpoints) per
  // peer, UCX_TLS, peer-failure detection, handshake and revoke timeouts.
  // ucx.nics {"auto"}: the rails' NICs come from the topology below (its
  // RDMA NICs with port 1, else its Ethernet ones, those of the creating
  // thread's NUMA node first; fewer than two: UCX's own choice), with a
  // lane for each.
  transport::UcxConfig ucx{};
  // "host:port" to serve GET /metrics (Prometheus text) on; port 0 picks a
  // free one (metrics_address()). Empty: no HTTP server.
  std::string metrics_address{};
  sched::SchedPolicy policy = sched::SchedPolicy::defaults();
  // A YAML policy file (configs/sched_policy.yaml); when set it replaces
  // `policy`. Its errors (with line numbers) come back from create().
  std::string policy_file{};
  // The local topology (Engine::topology(): what a transfer plan stripes
  // over, the scheduler's view of this host's devices): a saved `nvidia-smi
  // topo -m` file (when set it replaces the model; its errors come back from
  // create()), else a synthetic model name, else — the default — this
  // machine's probe (hwloc, sysfs, NVML). Peers route on the transport's own
  // paths to them.
  std::string topology_model{};
  std::string topology_file{};
  // The CUDA runtime VRAM regions use (register_memory with kVram); null:
  // the process's own (cuda_runtime()), looked up at the first one.
  std::shared_ptr<transport::CudaRuntime> cuda{};
  // This host's GPU paths for requests between the engine's own regions
  // (Request::peer empty): the CUDA transport over the topology above. Off
  // by default: it makes a CUDA context on every GPU of the topology and
  // enables peer access between them, which a worker that uses one GPU may
  // not want. On, create() fails when the topology has no GPU
  // (failed_precondition), no CUDA device is there (unavailable), or the
  // topology's GPUs are not the ones the runtime sees (invalid_argument).
  bool gpu_paths = false;
};

using transport::MemoryKind;
using transport::Op;
using transport::RegionHandle;

// A registered memory range. `handle` is what peers name in
// Request::remote_region (they learn it once it is exported to them).
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
  // What carries its bytes: "shm" (a peer of this host, copied directly or
  // by UCX's shared memory), "tcp", "rdma".
  std::string transport;
};

// One transfer between a local region range and a peer's region range: a
// read brings the peer's bytes here, a write sends ours there.
struct Request {
  Op op = Op::kRead;
  RegionHandle local_region = 0;
  std::uint64_t local_offset = 0;
  // Peer::address. Empty: remote_region is another of this engine's own
  // regions, and the bytes move over this host's GPU paths (the CUDA
  // transport, ranked by the topology; one side must be GPU memory;
  // failed_precondition unless EngineConfig::gpu_paths: docs/engine.md).
  std::string peer;
  RegionHandle remote_region = 0;   // the peer's Region::handle (remote_regions())
  std::uint64_t remote_offset = 0;
  std::uint64_t length = 0;
  sched::QosClass qos = sched::QosClass::kPrefillBulk;  // one of the four (others are refused)
  TimeNs deadline_ns = 0;  // absolute, on now_ns(); 0: none (negative is refused)
  // Relative to submit; past it the request ends `timeout` (0: the
  // policy's transfer_timeout, 60 s by default; negative is refused;
  // INT64_MAX: never).
  TimeNs timeout_ns = 0;
};

struct Batch {
  std::vector<Request> requests;
  // Delivered to the peer (take_notifications() there) once every request
  // completed, after their bytes; not sent when one failed or was cancelled.
  // At most 4 KiB; needs every request to name the same peer.
  std::string notification;
};

// A batch to submit many times, the same requests each time (a connector's
// fixed staging buffers, a benchmark's loop; NIXL's prepared transfers).
// submit(PreparedBatch&) does what submit(batch()) does, with the same
// checks and answers; a same-host batch on the loop-free path also skips
// looking its peer, regions and ranges up again while no region or peer of
// this engine came or went since the last time (docs/engine.md). One
// thread submits it at a time.
class PreparedBatch {
 public:
  PreparedBatch() = default;
  explicit PreparedBatch(Batch batch) : batch_(std::move(batch)) {}
  [[nodiscard]] const Batch& batch() const { return batch_; }

 private:
  friend class Engine;
  Batch batch_;
  transport::UcxTransport::ResolvedCopies resolved_;
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
  // Starts the loop thread and the listener. Errors: the policy file's (with
  // line numbers), the topology's, UCX's (unavailable), an address already
  // taken for metrics.
  [[nodiscard]] static Result<std::unique_ptr<Engine>> create(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // An engine belongs to the process that created it: in a child of fork()
  // (which copies no thread) those calls answer failed_precondition, poll,
  // wait and release too, and destroying it there frees nothing.
  // After shutdown(), the calls that take work or change state
  // (register_memory, allocate_memory, unregister, export_region, region,
  // connect, refresh, remote_regions, submit, cancel) answer unavailable;
  // poll, wait and release still answer for the batches it ended, address()
  // keeps its value, metrics_address() is empty.

  // The handshake address peers connect() to: "127.0.0.1:41234".
  [[nodiscard]] std::string address() const;
  // Where GET /metrics is served, or empty.
  [[nodiscard]] std::string metrics_address() const;
  // The UCX settings the engine chose for itself, as environment variables
  // ({"UCX_TCP_RX_SEG_SIZE", "524288"}, ...; those the environment set are
  // not listed): give them to `ucx_perftest` to compare like with like.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> ucx_settings() const;

  // Registers [ptr, ptr + length) for transfers; peers reach it only once
  // export_region() made it visible to them. invalid_argument for a null
  // pointer, zero length, an overlap with a region, or memory that is not
  // all mapped readable and writable (a peer's write into a read-only page
  // would fault the copying thread); unavailable when UCX refuses. The
  // memory must stay valid until unregister() or the engine is gone.
  // kDram: `device` is the NUMA node the memory is on, where the caller
  // knows it (-1: unknown; invalid_argument for a node this machine does
  // not have): it picks the NIC near it (Region::device says it).
  // kVram: GPU memory of CUDA device `device` (-1: the one the pointer
  // belongs to, as Region::device then says), checked against the CUDA
  // runtime's pointer attributes (invalid_argument when the range is not
  // all device memory of `device`; unavailable without a CUDA device). Its
  // transfers are staged through pinned host memory (a CUDA copy on this
  // side of each slice), so any peer's region can be read into it or
  // written from it. Exported, peers reach it too: their slices on it
  // travel as messages this engine answers with a CUDA copy between the
  // GPU and the message (docs/engine.md, "GPU memory").
  [[nodiscard]] Result<Region> register_memory(void* ptr, std::size_t length, MemoryKind kind = MemoryKind::kDram,
                                               int device = -1);
  // Memory the engine allocates and registers (freed by unregister()). On
  // one host a peer then reads and writes it through shared memory
  // directly, without this engine's CPU (it maps the region's memfd); a
  // caller's buffer from register_memory() is reached with CMA. Its pages
  // come from NUMA node `numa_node` where that node has memory (-1: the
  // kernel's default); Region::device says the node asked for.
  // invalid_argument for zero length or a node this machine does not have;
  // resource_exhausted when the kernel cannot give that much.
  [[nodiscard]] Result<Region> allocate_memory(std::size_t length, int numa_node = -1);
  // Makes a region visible to peers that proved the deployment secret: all
  // of them (`peers` empty), or those named (their listen addresses, as
  // they connect from: "10.0.0.2:7000"). Connected peers learn it at once.
  // not_found for an unknown region; invalid_argument for an empty name.
  [[nodiscard]] Status export_region(RegionHandle region, const std::vector<std::string>& peers = {});
  // A region registered here, as register_memory() or allocate_memory()
  // answered it; not_found for a handle this engine does not have.
  [[nodiscard]] Result<Region> region(RegionHandle region) const;
  // Revokes the region from every peer that knew it and unmaps it: returns
  // once each acknowledged (none of its transfers on it can still land) or
  // was disconnected (UcxConfig::revoke_timeout_ms), so the caller may free
  // the memory then. A peer process of this host that copies into the
  // caller's memory itself (CMA) is not stopped by a disconnect, so while it
  // lives it is waited for: past revoke_timeout_ms + 5 s, timeout, and the
  // memory must be kept; calling unregister again waits again, and answers
  // ok once that process acknowledged or exited (also when it did in
  // between). Meanwhile region() and an overlapping register_memory() say
  // the region is being unregistered. not_found for an unknown region; failed_precondition while requests on it are queued or in
  // flight (including posted slices of a cancelled request, which UCX
  // cannot recall: they finish first).
  [[nodiscard]] Status unregister(RegionHandle region);

  // Handshake with a peer's listener (no metadata server): both prove the
  // deployment secret (UcxConfig::secret), then endpoints per lane and the
  // regions the peer exports to us, with their keys. Blocks until ready, or
  // until the handshake timeout (unavailable); permission_denied when the
  // secrets differ. invalid_argument for a malformed address. Connecting again to a live peer returns at once; to
  // a failed one starts afresh.
  [[nodiscard]] Result<Peer> connect(std::string_view address);
  // Learns the peer's current regions (exports reach us unasked; this waits
  // for the current list, up to timeout_ns: timeout past it, the refresh
  // going on). invalid_argument for a timeout of 0 or below (the answer is
  // a round trip).
  [[nodiscard]] Status refresh(const Peer& peer, TimeNs timeout_ns = 5'000'000'000);
  [[nodiscard]] Result<std::vector<transport::RemoteRegion>> remote_regions(const Peer& peer);

  // Validates every request before any is queued (all or nothing):
  // invalid_argument for an empty batch, zero length, a negative timeout or
  // deadline, an unknown op or qos class, an oversized or multi-peer
  // notification; not_found for an unknown peer,
  // local region or remote region (refresh() may help); out_of_range for a
  // range outside its region; unavailable for a failed peer. Then admits the
  // requests, 512 a loop turn (the first move while the rest go in); should
  // a peer fail or a region go meanwhile, the requests not yet admitted end
  // failed with the reason. A same-host batch, while the loop holds no
  // request, skips the loop: up to UcxConfig::direct_copy_max_bytes it is
  // copied here, on the calling thread, and has ended when submit returns;
  // larger, it is copied on the engine's copier thread (docs/engine.md,
  // "The loop-free path").
  [[nodiscard]] Result<BatchHandle> submit(const Batch& batch);
  [[nodiscard]] Result<BatchHandle> submit(PreparedBatch& batch);
  // What submit() would refuse of `batch`, with the same Status, without
  // submitting it (ok when submit would take it as things stand): a batch
  // prepared once is checked once, where it is made.
  [[nodiscard]] Status check(const Batch& batch);
  // submit(), wait() and release() in one call, for a caller that waits
  // anyway (a decode step's one block): ok once every request completed,
  // else the first failed request's status. Each request's timeout ends it;
  // one whose peer stopped answering stays `cancelling` (nothing it posted
  // may land in the caller's memory after run returns) until
  // UcxConfig::stall_timeout_ms fails the path, so that bounds run too, and
  // with a stall timeout of 0 nothing does: submit and wait() give a bound
  // of the caller's own. A same-host batch on the loop-free path with no
  // deadline leaves no record at all: only its copies and its counts; a
  // prepared one resolved by an earlier call skips the resolution too
  // (docs/engine.md, "The loop-free path").
  [[nodiscard]] Status run(const Batch& batch);
  [[nodiscard]] Status run(PreparedBatch& batch);
  // A snapshot of every request's state and bytes (of a running batch, taken
  // 512 requests a loop turn: each request as it was at its part's turn).
  // not_found for an unknown or released handle.
  [[nodiscard]] Result<BatchStatus> poll(BatchHandle batch);
  // The same snapshot into `out`, reusing its storage: a loop that polls
  // many batches allocates nothing (a poll's copy was a tenth of a 4 KiB
  // same-host request). On an error `out` is unspecified.
  [[nodiscard]] Status poll(BatchHandle batch, BatchStatus& out);
  // Until every request of the batch ended (ok; see poll() for how) or the
  // timeout passed (timeout). Wakes at once when the batch ends, also when
  // another thread released it meanwhile (ok). A timeout of 0 (or below)
  // only looks: it neither yields nor sleeps; INT64_MAX waits as long as it
  // takes. ok says the batch ended, not that it succeeded: its status is in
  // poll(). A wait under way when the engine is destroyed returns before the
  // destructor does: ok when the batch ended (the destructor's shutdown()
  // cancels what runs, so usually ok, its requests cancelled), `unavailable`
  // when it could not end first.
  [[nodiscard]] Status wait(BatchHandle batch, TimeNs timeout_ns);
  // Cancels the requests still running and returns once the loop has
  // (512 requests a loop turn, so other callers' work goes on meanwhile;
  // submit and a batch's end are split the same way). A request
  // reports `cancelled` only once nothing it posted can still land in the
  // caller's memory (UCX cannot recall a posted slice); until then it is
  // `cancelling` and the batch is not done, so wait() before reusing the
  // memory. invalid_argument when no request of the batch is still running
  // (it ended, or a second cancel); not_found for an unknown one.
  [[nodiscard]] Status cancel(BatchHandle batch);
  // Forgets an ended batch (its handle turns unknown), so a long-running
  // engine does not grow. invalid_argument while it runs.
  [[nodiscard]] Status release(BatchHandle batch);
  // An eventfd that turns readable whenever a batch ends (read 8 bytes to
  // reset it), so an event loop (asyncio, epoll) can wait for batches
  // without a thread: on readable, poll() the batches it waits for. The fd
  // belongs to the engine; -1 if the kernel refused one.
  [[nodiscard]] int batch_event_fd() const;
  // Notifications peers sent us since the last call, in arrival order. At
  // most 65 536 (and 16 MiB) wait untaken; beyond that the oldest of the
  // peer holding the most are dropped (docs/engine.md, "Notifications").
  [[nodiscard]] std::vector<transport::Notification> take_notifications();

  // Prometheus text of the engine's metrics: admission (MLU histogram per
  // op, admitted / compressed / dropped / infeasible / signalled), the
  // scheduler's counters and the engine's own (requests, bytes, batches).
  [[nodiscard]] std::string metrics_text();
  // The scheduler's counters (a copy, taken on the loop); batches of the
  // loop-free path never reach the scheduler and are not in them.
  [[nodiscard]] sched::SchedStats stats();
  // The engine's clock (steady), on which Request::deadline_ns is absolute.
  [[nodiscard]] TimeNs now_ns() const;
  // How many times the loop thread has turned (a measure of idle spinning).
  [[nodiscard]] std::uint64_t loop_turns() const;
  // The local topology (EngineConfig): GPUs, NICs and their paths, for a
  // transfer plan's NIC striping (plan::materialize). Immutable.
  [[nodiscard]] const topology::TopologyGraph& topology() const;
  // Register the local-recompute callback and a codec here, before any
  // traffic. Callbacks run on the loop: they must not call back into the
  // Engine and wait (that would wait on the loop itself).
  [[nodiscard]] admission::AdmissionController& admission();
  // The registry metrics_text() exports, for layers on top that add their
  // own counters.
  [[nodiscard]] MetricsRegistry& metrics();

  // Stops taking work: cancels what runs, closes every peer (they see
  // unavailable) and the listener, and stops the HTTP server. A peer process
  // of this host that writes registered caller memory itself is waited for
  // until its copies ended (it closes its connection then), up to
  // UcxConfig::revoke_timeout_ms (one stopped longer is closed with an error
  // logged: it may still write there when continued). Later calls answer unavailable; the destructor calls it.
  void shutdown();

 private:
  struct State;
  explicit Engine(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::engine
