// The UCX transport: moves real bytes between engines with UCP RMA (put/get)
// over whatever UCX selects (TCP here; RDMA verbs on a cluster). A path is one
// connected peer and its lanes are UCP endpoints to that peer. Peers meet on
// Baton's own TCP socket: a challenge–response over a shared deployment
// secret, then the listener's UCP worker address and the region descriptors
// (base, length, packed rkey) it exports to that peer, so no metadata server
// is needed. The same connection carries region updates, revocations and
// notifications; its closing is the peer's death. docs/transport.md and
// docs/security.md have the whole picture.
//
// Lives on the engine loop: one UCP worker in single-thread mode, progressed
// only by poll() (and the destructor); no locks, no threads of its own. Both
// sides must be polled: over TCP the target's worker carries out the RMA.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "baton/transport/transport.h"

namespace baton::transport {

inline constexpr std::uint64_t kMinTcpSegmentBytes = 8 << 10;   // UCX's own default
inline constexpr std::uint64_t kMaxTcpSegmentBytes = 64 << 20;  // a receive buffer per connection at most
inline constexpr std::uint64_t kMinTcpReceiveBufferBytes = 64 << 10;
inline constexpr std::uint64_t kMaxTcpReceiveBufferBytes = 1ULL << 30;
// The handshake, revoke and stall timeouts: a year at most, so that one in
// ns added to the clock stays far from wrapping (1e13 ms fired at once).
inline constexpr std::int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;

struct UcxConfig {
  // Where peers reach us: "host:port"; port 0 picks a free one (see address()).
  std::string listen_address = "127.0.0.1:0";
  // UCP endpoints per peer: the lanes of each path (1..64).
  int lanes_per_peer = 2;
  // The NICs to carry slices, one rail each (a UCP context and worker bound
  // to that device, since UCP binds devices per context): a network
  // interface ("eth1") or an RDMA device and port ("mlx5_0:1"), at most 8.
  // Lane i of a path runs on our rail i mod (our NICs) to the peer's rail
  // i mod (its NICs), so two engines that list their NICs in the same order
  // (each NIC's subnet) pair them; every region is mapped on each. A NIC that
  // fails under a path (an endpoint error or the stall timeout) takes only
  // its own lanes while another NIC of the path works: their slices go again
  // over the others. Needs lanes_per_peer >= NICs; a NIC named twice gets
  // two rails (two workers and more sockets to each peer). Empty: one rail
  // on the devices UCX picks.
  std::vector<std::string> nics;
  // UCX_TLS for this transport only (e.g. "tcp", "rc,tcp"); empty: UCX's own
  // default, or the UCX_TLS environment variable.
  std::string tls;
  // The deployment secret (16..4096 bytes) that peers prove to each other
  // before any region or key is sent; every engine of a deployment holds the
  // same. Empty: read from secret_file, else from the file named by
  // $BATON_TOKEN_FILE, else none: then only a loopback listen address is
  // allowed (any local process is a peer), unless allow_unauthenticated.
  std::string secret;
  std::string secret_file;
  bool allow_unauthenticated = false;
  // Connections that have not proved the secret yet, at most, and at most
  // max_unauthenticated_per_address from one address (each has
  // handshake_timeout_ms to prove it). When all are taken, a newcomer
  // replaces the oldest of the address holding the most, if that address
  // holds more than the newcomer's; otherwise it is refused, told why. One
  // host holding every slot locked out every peer, without the secret.
  int max_unauthenticated = 64;
  int max_unauthenticated_per_address = 8;
  // Peers that proved the secret, at most; more are refused, told why. Each
  // holds sockets (a control connection and endpoints per lane) and up to a
  // frame of buffered bytes; a hello is also refused when this process has
  // too few file descriptors left for its lanes (UCX aborts on running out).
  int max_sessions = 256;
  // unregister() waits this long for peers to acknowledge a revocation;
  // one that did not is disconnected (its endpoints here closed). Each of
  // the three timeouts in ms here is at most kMaxTimeoutMs (a year).
  std::int64_t revoke_timeout_ms = 5000;
  // Peer-failure reporting (UCP_ERR_HANDLING_MODE_PEER): a dead peer fails
  // its slices with `unavailable` instead of leaving them in flight. UCX 1.13
  // then uses only transports that can report a dead peer (tcp, RDMA, cma),
  // never sysv/posix shared memory. Turning it off lets UCX pick shared
  // memory between processes of one host, but a peer that dies without
  // closing leaves slices in flight, and endpoints close by flushing.
  bool peer_failure_detection = true;
  // Peers on this host (proved by reading a cookie out of the peer's memory,
  // which the OS allows a process of the same user) get Baton's own copy
  // instead of UCX: memcpy through the peer's memfd for regions it allocated
  // (allocate_memory), CMA (process_vm_readv/writev) for other DRAM regions.
  // No copy needs the peer's CPU, none can stay in flight when it dies, and
  // UCX keeps peer-failure detection for everything else. Off: UCX carries
  // same-host slices too (TCP under peer_failure_detection).
  bool same_host_copy = true;
  // The engine copies a batch whose every request goes to a same-host peer
  // without the loop while the loop has no request of its own in flight
  // (so no scheduling decision is skipped): on the submitting thread when
  // it holds at most this many bytes, else on the engine's copier thread.
  // 0: every batch takes the loop.
  std::uint64_t direct_copy_max_bytes = 16ULL << 20;
  // Datapath threads for the same-host copies the loop posts (batches that
  // take the loop while it holds requests): each lane of a same-host path copies on one of them,
  // in order, so the loop schedules while they copy. Slices under 32 KiB,
  // and CMA copies, stay where they were. -1: one per 8 cores, at most 4,
  // none below 8 cores — on this 2-core VM a thread lifted bulk copies
  // through the loop 1.4-1.6x but took the core that decode requests
  // needed (deadline-aware p99 3x worse; docs/results.md); 0: none; at most 64.
  int copy_threads = -1;
  // A datapath thread per rail (per NIC) that progresses its UCP worker:
  // socket reads and writes, UCX's shared-memory copies and RDMA
  // completions run there, in parallel across rails, pinned to the CPUs
  // near the rail's NIC (hwloc) where that is a subset; the loop keeps
  // every scheduling decision and posting, and takes completions when a
  // thread signals it. -1: on from 8 cores (on a 2-core VM the thread
  // competes with the loop and the peer for the same cores); 0: off; 1: on.
  int progress_threads = -1;
  // On TCP paths, slices travel as Baton's active messages (the holder's
  // engine copies them in or out and answers) instead of UCX's software
  // RMA, which UCX 1.13 turns into an abort of the holder when an initiator
  // dies mid-transfer. Off: UCX's RMA everywhere (slightly less copying).
  bool tcp_slices_as_messages = true;
  // UCX's TCP segment (UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE, unless
  // the environment sets either): a slice message that fits in one crosses as
  // one send and is taken from UCX's receive buffer. UCX's own 8 KiB cut a
  // 256 KiB slice into 32 fragments reassembled in freshly allocated memory,
  // which made TCP paths 8x slower on a VM (docs/results.md). 0: UCX's
  // default; else kMinTcpSegmentBytes .. kMaxTcpSegmentBytes.
  std::uint64_t tcp_segment_bytes = 512 << 10;
  // SO_RCVBUF of UCX's TCP sockets (UCX_TCP_RCVBUF, unless the environment
  // sets it; the kernel doubles the value for its bookkeeping). The
  // kernel's autotuning grew a busy loopback connection's receive buffer to
  // 5-7 MiB, and 1 MiB reads ran about 20% slower than with this fixed 2 MiB
  // (docs/results.md). A fixed buffer above net.core.rmem_max would be cut
  // to that maximum and lose the autotuning, so where the kernel's maximum
  // is lower the autotuning stays. The send buffer stays autotuned: fixed
  // at 2 MiB, a connection reset while UCX had a zero-copy send half in the
  // socket made UCX 1.13 complete it twice and abort (docs/transport.md).
  // Set only where TCP may open, as the segment. 0: the kernel's
  // autotuning; else kMinTcpReceiveBufferBytes .. kMaxTcpReceiveBufferBytes.
  std::uint64_t tcp_receive_buffer_bytes = 1 << 20;
  // A connect whose handshake has not finished by then fails (unavailable);
  // a connection to our listener that has not proved the secret by then is closed.
  std::int64_t handshake_timeout_ms = 5000;
  // A path with slices posted and none completed for this long fails
  // (unavailable), its endpoints closed: a link that went down or a peer
  // that stopped answering, which UCX does not always report. The forced
  // close completes what was posted, so nothing lands afterwards (under
  // peer_failure_detection). 0: never.
  std::int64_t stall_timeout_ms = 10'000;
};

// Whether a transport made with `config` runs progress threads
// (UcxConfig::progress_threads, with -1 resolved for this machine).
[[nodiscard]] bool runs_progress_threads(const UcxConfig& config);

// A peer's region as the handshake made it known here.
struct RemoteRegion {
  RegionHandle key = 0;  // the peer's handle: SliceMemory::remote_key
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  // Memory the peer's UCX cannot map (its GPU memory, register_staged):
  // slices on it travel as messages the peer answers by copying.
  bool staged = false;
};

inline constexpr std::size_t kMaxNotificationBytes = 4096;

// A small message a peer sent with notify(), tagged with the sender's name
// (its own listen address, as it said in the handshake).
struct Notification {
  std::string from;
  std::string message;
  friend bool operator==(const Notification&, const Notification&) = default;
};

// Notifications since creation, and how many wait untaken now: an engine
// whose owner never takes them shows it here (and in its metrics) before
// they are dropped.
struct NotificationCounts {
  std::uint64_t received = 0;
  std::uint64_t dropped = 0;  // given up when 65536, or 16 MiB, waited untaken (take_notifications)
  std::uint64_t untaken = 0;
};

enum class PathState : std::uint8_t {
  kConnecting,  // endpoints created, handshake under way
  kReady,       // slices may be submitted
  kFailed,      // for good: connect failed, handshake timed out, or the peer died
};

class UcxTransport final : public Transport {
 public:
  // UCP context (RMA, AM, wakeup), worker and Baton's listener.
  // invalid_argument for a bad listen address, a bad bound, a secret of the
  // wrong size, or a non-loopback address without a secret (and without
  // allow_unauthenticated); not_found / invalid_argument for an unreadable or
  // unsafe secret file; invalid_argument for a `tls` list that leaves UCX
  // no transport (an unknown name); unavailable when UCX cannot start
  // otherwise or the address cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<UcxTransport>> create(UcxConfig config = {});

  // shutdown(), then progresses until the endpoint closes finish (a bounded
  // number of rounds), unmaps every region and releases UCX. A peer sees us
  // go away: its slices to us fail with unavailable.
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // The listener's bound address, "127.0.0.1:41234" (the real port when the
  // config asked for port 0).
  [[nodiscard]] const std::string& address() const;

  // The UCX settings this transport chose for itself, as environment
  // variables and values ({"UCX_TCP_RX_SEG_SIZE", "524288"}, ...): what to
  // give ucx_perftest to compare like with like. Those the environment set
  // are not listed (UCX took them from there, for both).
  [[nodiscard]] const std::vector<std::pair<std::string, std::string>>& ucx_settings() const;

  // --- Registered memory ---------------------------------------------------

  // ucp_mem_map of [addr, addr + length): usable for local slices at once,
  // seen by peers only once exported (export_region). invalid_argument for a null
  // address, zero length, a range that wraps, or one that overlaps a region
  // already registered; unavailable when UCX refuses the mapping (VRAM
  // without CUDA support in UCX, for one).
  [[nodiscard]] Result<RegionHandle> register_memory(void* addr, std::size_t length,
                                                     MemoryKind kind = MemoryKind::kDram);
  // Memory this transport allocates (a memfd) and registers: on one host,
  // peers then map it and copy directly, where a caller's buffer is reached
  // with CMA. Its pages come from NUMA node `numa_node` where that node has
  // memory (MPOL_PREFERRED; -1: the kernel's default policy). Freed by
  // unregister(). invalid_argument for zero length or a node this machine
  // does not have.
  struct AllocatedRegion {
    RegionHandle handle = 0;
    void* address = nullptr;
  };
  [[nodiscard]] Result<AllocatedRegion> allocate_memory(std::size_t length, int numa_node = -1);
  // How this side reaches a staged region (register_staged), called on the
  // thread that polls, while the transport holds its rails: it must not
  // call this UcxTransport (that would deadlock with progress threads).
  class StagedAccess {
   public:
    virtual ~StagedAccess() = default;
    // Starts copying a peer's write, [src, src + bytes), into the region at
    // `dst`; `src` lives in a message and is valid during this call only.
    // Answers a ticket.
    [[nodiscard]] virtual Result<std::uint64_t> start_write(void* dst, const void* src, std::size_t bytes) = 0;
    // Starts copying [src, src + bytes) of the region out into host memory
    // of its own, for a peer's read; answers a ticket.
    [[nodiscard]] virtual Result<std::uint64_t> start_read(const void* src, std::size_t bytes) = 0;
    // nullopt while that copy runs; then a read's bytes (valid until
    // release()), an empty span for a write, or why it failed.
    [[nodiscard]] virtual std::optional<Result<std::span<const std::byte>>> done(std::uint64_t ticket) = 0;
    virtual void release(std::uint64_t ticket) = 0;
  };
  // Memory UCX cannot map (GPU memory: Debian's UCX has no CUDA support)
  // that peers still reach. It has no rkey, so a peer's slices on it travel
  // as Baton's messages (never as RMA or a same-host copy), and this side
  // answers each through `access` once the copy it started has ended
  // (polled; meanwhile this side serves everything else, and
  // next_event_ns() asks for the next poll soon): a write is acknowledged
  // only then, so the bytes are in place when the peer learns it. It
  // cannot be the local side of a slice of this transport. Exported,
  // revoked and unregistered like any region; unregistering and shutting
  // down wait for its copies too (at most 64 run at once; up to 1024 more
  // wait their turn, and beyond are refused). invalid_argument as register_memory, for a null `access` and an
  // unknown kind.
  [[nodiscard]] Result<RegionHandle> register_staged(void* addr, std::size_t length, MemoryKind kind,
                                                     std::shared_ptr<StagedAccess> access);
  // Makes a region visible to peers: to every authenticated peer (`peers`
  // empty) or to those that named themselves so in the handshake (their
  // listen address, e.g. "10.0.0.2:7000"; a claim made by a holder of the
  // secret). Connected peers learn it at once, others when they connect.
  // Exports add up. not_found for an unknown region; failed_precondition
  // while it is being unregistered; invalid_argument for an empty name.
  Status export_region(RegionHandle region, const std::vector<std::string>& peers = {});
  // Revokes and frees a region. Peers that were told of it are told to
  // forget it; each acknowledges once none of its slices on it can still
  // land, or is disconnected after revoke_timeout_ms — except a live peer
  // process of this host that copies into a caller's DRAM region itself
  // (kDirect), which a disconnect would not stop: it is waited for until it
  // acknowledges, its connection closes, or it exits. Until then the region
  // stays mapped and unregister_pending() is true (keep polling); then it is
  // unmapped and the caller may free the memory. Returns at once.
  // not_found for an unknown (or unregistered) handle; invalid_argument
  // while local slices on it are in flight; failed_precondition while it is
  // already being unregistered.
  Status unregister(RegionHandle region);
  [[nodiscard]] bool unregister_pending(RegionHandle region) const;
  // The packed rkey of a local region on the first rail (the handshake sends
  // peers one per rail); failed_precondition for a staged region (none).
  [[nodiscard]] Result<std::vector<std::uint8_t>> packed_rkey(RegionHandle region) const;

  // --- Peers ---------------------------------------------------------------

  // Starts connecting to a peer's listener: the control connection, the
  // challenge–response, then lanes_per_peer endpoints from the peer's worker
  // address, each bound to the session; the path is kConnecting until every
  // lane is bound (learned through poll()), then kReady. Returns the path at
  // once; a live path to the same address is returned again instead of a
  // second one. A failed path that holds nothing any more (no slice in
  // flight, its endpoints closed) is taken again, one to the same address
  // first, whatever address it had: kConnecting anew, its PathInfo's
  // incarnation moved, paths() not grown. So neither retrying a dead peer
  // nor peers that come and go on new addresses grow paths() without
  // bound. invalid_argument for a malformed or unresolvable address or
  // port 0; unavailable when no socket can be made.
  // A refused connection or a silent peer shows up later as kFailed with an
  // unavailable path_status(); secrets that differ as permission_denied.
  [[nodiscard]] Result<PathId> connect(std::string_view peer_address, TimeNs now_ns);

  // kFailed for an unknown path.
  [[nodiscard]] PathState path_state(PathId path) const;
  // Whether the path's peer is this process (an engine beside ours, or
  // ours): its addresses are ours. False for an unknown path.
  [[nodiscard]] bool path_in_this_process(PathId path) const;
  // Whether connect() may take this failed path's slot now: nothing of it
  // is left (no slice in flight or held, its endpoints closed). False for
  // a live or unknown path.
  [[nodiscard]] bool path_reusable(PathId path) const;
  // ok when ready; unavailable saying why otherwise (still connecting, or the
  // failure); invalid_argument for an unknown path.
  [[nodiscard]] Status path_status(PathId path) const override;

  // Asks the peer for its current regions (new ones become usable, removed
  // ones unusable) when its answer arrives, through poll().
  // invalid_argument for an unknown path; unavailable unless ready.
  Status refresh_regions(PathId path);
  // True from refresh_regions() until its answer was applied.
  [[nodiscard]] bool refresh_pending(PathId path) const;

  // The peer's regions known here, by key.
  [[nodiscard]] Result<std::vector<RemoteRegion>> remote_regions(PathId path) const;
  // The peer's region `key`: not_found when the peer has not announced it
  // (refresh_regions() may help); invalid_argument for an unknown path.
  [[nodiscard]] Result<RemoteRegion> remote_region(PathId path, RegionHandle key) const;
  // The peer's region that holds [remote_addr, remote_addr + length):
  // out_of_range when none does (refresh_regions() may help).
  [[nodiscard]] Result<RemoteRegion> find_remote_region(PathId path, std::uint64_t remote_addr,
                                                        std::uint64_t length) const;

  // --- Notifications ---------------------------------------------------------

  // Sends `message` to the peer on lane 0, after what that lane already
  // carries. For "the batch landed" once its slices completed (a write
  // completes only when its bytes are at the peer). invalid_argument for an
  // unknown path or a message over 4 KiB; unavailable unless ready.
  Status notify(PathId path, std::string_view message);
  // Notifications received since the last call, in arrival order. At most
  // 65536 wait here, and 16 MiB of them (text and senders' names); beyond
  // that the oldest of the peer holding the most is dropped (logged once a run of drops starts, and counted): a peer that
  // floods loses its own, not the others'.
  [[nodiscard]] std::vector<Notification> take_notifications();
  [[nodiscard]] NotificationCounts notification_counts() const;

  // --- Copies without the loop (same-host peers) ----------------------------

  // One request for copy_direct: `bytes` between our region `local` and the
  // region `remote` of the peer that connect() named `peer`.
  struct DirectCopy {
    std::string_view peer;
    Op op = Op::kRead;
    RegionHandle local = 0;
    std::uint64_t local_offset = 0;
    RegionHandle remote = 0;
    std::uint64_t remote_offset = 0;
    std::uint64_t bytes = 0;
  };
  // Copies to and from peers of this host on the calling thread — any
  // thread, while the loop runs — for the engine's loop-free path. All or
  // nothing: failed_precondition, with nothing copied, unless every copy can
  // go this way (a ready same-host path this side connected to its peer,
  // DRAM ranges inside regions known here, same_host_copy on, no codec set);
  // the caller then submits them as slices, which say what was wrong.
  // Otherwise ok, and `results` (one per copy) holds each copy's status:
  // unavailable when a CMA copy finds the peer gone. What it reads is a
  // table the loop publishes; a revocation is acknowledged only after the
  // copies that could still see the region finished.
  [[nodiscard]] Status copy_direct(std::span<const DirectCopy> copies, std::span<Status> results) const;
  // copy_direct for copies that repeat (the engine's prepared batches):
  // `resolved` keeps what the checks found, and `copies` is checked again
  // only when the table the loop publishes changed since (a region or peer
  // came or went). A caller that sees direct_generation() equal to
  // resolved.generation may pass no copies; should the table change before
  // this call takes it, the answer is failed_precondition and nothing is
  // copied (resolve again, or take the loop).
  struct ResolvedCopies {
    struct Copy {
      std::byte* local = nullptr;
      std::byte* mapped = nullptr;   // the peer's bytes mapped here; null: CMA at `remote`
      std::uint64_t remote = 0;
      pid_t pid = 0;
      Op op = Op::kRead;
      std::uint64_t bytes = 0;
    };
    std::uint64_t generation = 0;  // the table's they were checked against (unique in the process); 0: none
    std::vector<Copy> copies;
  };
  [[nodiscard]] Status copy_direct(std::span<const DirectCopy> copies, ResolvedCopies& resolved,
                                   std::span<Status> results) const;
  // What copy_direct would answer before copying anything: ok when every
  // copy can go this way now, else failed_precondition saying why. Copies
  // nothing (a caller that copies later, on another thread, checks first).
  [[nodiscard]] Status check_direct(std::span<const DirectCopy> copies) const;
  // The published table's generation (0: none). Any thread.
  [[nodiscard]] std::uint64_t direct_generation() const;

  // --- Waiting without spinning ---------------------------------------------

  // An epoll fd over the worker's event fd (ucp_worker_get_efd) and the
  // control sockets: readable when arm() returned true and something
  // happened since.
  [[nodiscard]] int event_fd() const override;
  // Prepares event_fd() for sleeping (ucp_worker_arm). False when there is
  // work to do first (poll again, do not sleep).
  [[nodiscard]] bool arm() override;

  // --- Transport -----------------------------------------------------------

  // One PathInfo per connect(), in PathId order: from = address(), to = the
  // peer's address, type = tcp / shm / rdma as UCX chose (known once ready),
  // cost-model bandwidth and latency for that type.
  [[nodiscard]] const std::vector<PathInfo>& paths() const override;
  [[nodiscard]] std::uint64_t paths_version() const override;
  // Validates everything before anything is posted, so a peer never sees an
  // access outside memory it registered: invalid_argument for an unknown
  // path or lane, zero bytes, or a remote_key the peer never announced;
  // already_exists for a slice id in flight; unavailable unless the path is
  // ready; out_of_range when the local range is not inside one registered
  // region or the remote range not inside the peer's region `remote_key`.
  // Then posts ucp_put_nbx or ucp_get_nbx; the writes of a lane since the
  // last poll share one ucp_ep_flush_nbx, posted by the next poll() or
  // arm(): a write completes once its bytes are at the peer.
  [[nodiscard]] Status submit(const SliceSubmit& slice, TimeNs now_ns) override;
  // UCX cannot recall a posted RMA and slices are posted at submit, so this
  // never stops one: stopped = false, and its completion still comes.
  CancelResult cancel(SliceId id, TimeNs now_ns) override;
  // Compressed slices (SliceSubmit::wire_bytes) travel as active messages:
  // a write is compressed here and decompressed by the holder into the
  // destination before it acknowledges; a read asks the holder to compress
  // and is decompressed here before it completes. A slice the codec cannot
  // shrink travels raw. The holder needs no codec set: the message names it.
  [[nodiscard]] bool carries_compressed_slices() const override { return true; }
  // lz4 or zstd (their wire ids); invalid_argument for another or null.
  [[nodiscard]] Status set_codec(std::shared_ptr<const Codec> codec) override;
  // Progresses the worker, answers handshakes, and hands out the slices that
  // completed since the last poll, stamped `now_ns`. A slice whose path
  // failed under it completes with unavailable.
  void poll(TimeNs now_ns, std::vector<Completion>& out) override;
  // The earliest handshake or revocation deadline; nullopt when none runs
  // (completions are not predictable: wait on event_fd()).
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override;
  [[nodiscard]] bool path_healthy(PathId path, TimeNs now_ns) const override;

  // Slices posted and not yet handed out by poll().
  [[nodiscard]] std::size_t slices_in_flight() const;
  // A slice of `path` its caller holds outside this transport (a GPU copy
  // before or after UCX carries it): until the hold is released, connect()
  // does not give the path's id to another path, whose peer the slice would
  // then reach. Unknown paths are ignored.
  void hold_path(PathId path);
  void release_path(PathId path);

  // Connections refused: on arrival over max_unauthenticated (in all or
  // from one address), handshakes that gave way to another address's, and
  // hellos over max_sessions or short of file descriptors.
  [[nodiscard]] std::uint64_t refused_connections() const;

  // Endpoint flushes posted since creation: one per lane per burst of RMA
  // writes submitted between two polls (or before the loop sleeps), not one
  // per write.
  [[nodiscard]] std::uint64_t flushes_posted() const;
  // Bundles sent since creation: one per lane per burst of small message
  // slices (TCP), not one message per slice.
  [[nodiscard]] std::uint64_t bundles_sent() const;
  // Same-host copies done on datapath threads (UcxConfig::copy_threads),
  // and how many threads there are.
  [[nodiscard]] std::uint64_t thread_copies() const;
  [[nodiscard]] int copy_threads() const;
  // Progress threads running (UcxConfig::progress_threads: one per rail, or
  // none), and how many of them are pinned near their NIC.
  [[nodiscard]] int progress_threads() const;
  [[nodiscard]] int pinned_progress_threads() const;

  // Starts a clean close: the listener stops, every path fails with
  // unavailable and its endpoints close (a forced close under peer-failure
  // detection; otherwise a flushing one, which lets what is posted finish and
  // needs the peer to keep polling). Keep polling until shutdown_complete()
  // (bounded by your own deadline), then destroy. The destructor does it all
  // if you did not, but a flushing close cannot finish inside it.
  void shutdown();
  [[nodiscard]] bool shutdown_complete() const;

 private:
  struct State;
  explicit UcxTransport(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::transport
