// UCP underneath the Transport interface: the state of a UcxTransport,
// private to transport/ucx/. Its methods live by job in rails.cc,
// slices.cc, regions.cc, listener.cc and initiator.cc; ucx_transport.cc is
// the Transport interface over it.
//
// Peers meet over Baton's own TCP socket (control_channel.h): the listener
// challenges, the initiator proves the deployment secret, the listener proves
// it back and sends its UCP worker addresses (one per rail) and the regions
// exported to that peer; the initiator creates its lanes from the worker
// addresses and binds each to its session with a token. The control
// connection then carries region updates, revocations and notifications, and
// its closing is the peer's death. UCX's sockaddr listener is never used (UCX 1.13 aborts on a
// malformed connection request).
//
// Ownership of UCX callbacks: every callback (request completion, endpoint
// error, active message) only records what happened in
// State; poll() acts on it after ucp_worker_progress returns. So no UCX call
// is made from inside UCX, and one place (poll) changes the transport's
// state. A request's callback runs exactly once when the post returned a
// request; a slice finishes when its last request did, and only then is its
// record (which UCX holds as user_data) released.
//
// Rails: one UCP context and worker per NIC (UcxConfig::nics), because UCP
// binds devices per context (UCX_NET_DEVICES), not per endpoint. Lane i of a
// path runs on our rail i mod (our rails) to the peer's rail i mod (its
// rails); every region is mapped on every rail. A rail that fails under a
// path (an endpoint error, or a stall) takes only its own lanes while another
// rail of the path still works: their slices fail and are sent again on
// the lanes left.
#pragma once

#include "baton/transport/ucx_transport.h"

#include <net/if.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "baton/common/address_ranges.h"
#include "baton/common/memory_budget.h"
#include "baton/topology/cost_model.h"
#include "baton/transport/codec.h"
#include "baton/transport/secret.h"
#include "transport/ucx/auth.h"
#include "transport/ucx/buffer_pool.h"
#include "transport/ucx/control_channel.h"
#include "transport/ucx/control_wire.h"
#include "transport/ucx/copy_workers.h"
#include "transport/ucx/progress_threads.h"
#include "transport/ucx/readers.h"
#include "transport/ucx/same_host.h"
#include "transport/ucx/tls_list.h"
#include "baton/common/socket_address.h"
#include "transport/ucx/wire.h"

namespace baton::transport::ucx {

// Progress rounds per poll: enough to drain a burst of completions, bounded
// so that one poll cannot starve the loop that called it.
inline constexpr int kProgressRoundsPerPoll = 64;
// Teardown waits this many progress rounds for endpoint closes; a forced
// close needs no peer, so this only bounds a flushing close to a silent peer.
inline constexpr int kTeardownRounds = 20'000;
// Compressed-read replies a holder keeps queued for the wire, at most: a
// legitimate initiator has a few MiB in flight per path.
inline constexpr std::uint64_t kMaxQueuedReplyBytes = 256ULL << 20;
// What the answers to peers may hold while they wait for the peers' back
// lanes (refusals and write acknowledgements included, which the bound
// above does not refuse), one peer's or all together: past it the peer
// holding the most is not draining, as one that gave a worker it never
// progresses, and its session is closed. Above the bound on reads, so that
// a peer only refused for that is never closed.
inline constexpr std::uint64_t kMaxSessionQueuedBytes = kMaxQueuedReplyBytes + (32ULL << 20);
// What a message waiting for the wire holds besides its buffers (ours and
// UCX's request), counted with them.
inline constexpr std::uint64_t kOutgoingOverheadBytes = 256;
// Copies into or out of staged regions running at once, at most (peers'
// writes and reads; more wait their turn): each holds host memory of the
// access's (a bounce buffer), counted with the bytes above.
inline constexpr std::size_t kMaxStagedCopies = 64;
// Copies waiting their turn, at most (a peer asking for many tiny reads
// would otherwise grow the queue within the byte bound by millions of
// entries); more are refused, and the initiator sends them again.
inline constexpr std::size_t kMaxStagedWaiting = 1024;
// Payload buffers kept for reuse (ucx::BufferPool): a few batches of slices.
inline constexpr std::size_t kPooledBufferBytes = 64 << 20;
// Raw message writes up to this size, and every raw read's ask, travel in
// a lane's bundle (wire.h); a holder answers reads above it alone. A
// bundle goes once its entries take kBundleBytes, or at the loop's next
// poll or sleep (flush_lanes). Both within one TCP segment.
inline constexpr std::uint64_t kMaxBundledSliceBytes = 16 << 10;
inline constexpr std::size_t kBundleBytes = 64 << 10;
// Same-host copies shorter than this stay on the loop even with copy
// threads: handing one over costs about as much as copying it.
inline constexpr std::uint64_t kMinThreadCopyBytes = 32 << 10;

inline constexpr int kMaxCopyThreads = 64;
// Warnings about what peers sent (or strangers that reached UCX's ports),
// at most, a second: one a message would let anyone fill a disk.
inline constexpr int kPeerWarningsPerSecond = 20;

// UcxConfig::copy_threads resolved: -1 is one per 8 cores, at most 4.
inline int copy_threads_for(const UcxConfig& c) {
  if (c.copy_threads >= 0) return c.copy_threads;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::min(4, cores / 8);
}

inline Status ucx_failure(std::string_view call, std::string_view what, ucs_status_t status) {
  return Status::unavailable("{}: {} failed: {}", call, what, ucs_status_string(status));
}

struct LocalRegion {
  RegionHandle handle = 0;
  std::uintptr_t base = 0;
  std::size_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  std::vector<ucp_mem_h> memh;  // per rail
  // allocate_memory's: a memfd that same-host peers map. Freed after ucp_mem_unmap.
  std::optional<ucx::SharedAllocation> shared;
  std::vector<std::vector<std::uint8_t>> packed_rkeys;  // per rail
  // register_staged's: no memh and no rkey; peers' slices on it are
  // answered through it. `serving`: its copies that run (the memory
  // stays until they ended).
  std::shared_ptr<UcxTransport::StagedAccess> staged;
  std::uint64_t serving = 0;
  std::uint64_t inflight = 0;  // slices whose local range is here
  // Who may see it: every authenticated peer, or the peers of these names.
  bool exported_all = false;
  std::set<std::string> exported_to;
  // unregister() under way: the sessions that must acknowledge first.
  bool revoking = false;
  std::uint64_t revoke_seq = 0;
  std::set<std::uint64_t> awaiting;
  TimeNs revoke_deadline_ns = 0;  // 0 until the next poll saw it
  bool overdue_logged = false;    // a same-host peer that copies into it is late (finish_revokes)
  // How often a late same-host peer is looked at again (whether it exited).
  static constexpr TimeNs kDirectPeerLookNs = 100'000'000;
};

// One region of a peer, with its rkey unpacked on each lane's endpoint.
// Shared by the peer's region table and the slices that use it, so a region
// the peer removes stays valid for the slices already posted on it.
struct RemoteRegionKeys {
  RemoteRegion info;
  std::vector<ucp_rkey_h> rkeys;  // per lane
  std::int32_t memfd = -1;        // as the peer described it
  std::uint64_t memfd_inode = 0;
  // A same-host peer's memfd, mapped here; shared with copy_direct's table.
  std::shared_ptr<const ucx::Mapping> mapping;
  RemoteRegionKeys() = default;
  RemoteRegionKeys(const RemoteRegionKeys&) = delete;
  RemoteRegionKeys& operator=(const RemoteRegionKeys&) = delete;
  ~RemoteRegionKeys() {
    for (ucp_rkey_h k : rkeys) {
      if (k != nullptr) ucp_rkey_destroy(k);
    }
  }
};

// A payload UCX lent us (UCP_AM_RECV_ATTR_FLAG_DATA): kept without a copy
// until the message was acted on, then handed back to its worker.
struct ReleaseAmData {
  ucp_worker_h worker = nullptr;
  void operator()(void* data) const { ucp_am_data_release(worker, data); }
};
using HeldAmData = std::unique_ptr<void, ReleaseAmData>;

}  // namespace baton::transport::ucx

namespace baton::transport {

using ucx::ControlConnection;
using ucx::ControlKind;
using ucx::Frame;
using ucx::MessageHeader;
using ucx::MessageKind;
using ucx::RegionDescriptor;
using ucx::SliceDescriptor;
using ucx::WireCodec;
// This folder's own, from above.
using ucx::copy_threads_for;
using ucx::HeldAmData;
using ucx::kBundleBytes;
using ucx::kMaxBundledSliceBytes;
using ucx::kMaxCopyThreads;
using ucx::kPeerWarningsPerSecond;
using ucx::kMaxQueuedReplyBytes;
using ucx::kMaxSessionQueuedBytes;
using ucx::kOutgoingOverheadBytes;
using ucx::kMaxStagedCopies;
using ucx::kMaxStagedWaiting;
using ucx::kMinThreadCopyBytes;
using ucx::kPooledBufferBytes;
using ucx::kProgressRoundsPerPoll;
using ucx::kTeardownRounds;
using ucx::LocalRegion;
using ucx::may_use_tcp;
using ucx::ReleaseAmData;
using ucx::RemoteRegionKeys;
using ucx::ucx_failure;

struct UcxTransport::State {
  // What an active-message handler of one rail needs.
  struct HandlerArg {
    State* state = nullptr;
    ucp_worker_h worker = nullptr;
  };

  struct SliceOp;

  // One UCP context and worker bound to one NIC (or to UCX's choice).
  struct Rail {
    std::string nic;  // empty: every device UCX finds
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    std::vector<std::uint8_t> worker_address;
    int worker_fd = -1;
    std::unique_ptr<HandlerArg> handler_arg;  // a stable address for UCX
  };

  struct Lane {
    State* state = nullptr;
    PathId path = 0;
    int index = 0;
    std::size_t rail = 0;         // ours
    std::size_t remote_rail = 0;  // the peer's, whose rkeys it unpacks
    ucp_ep_h ep = nullptr;        // null once closed
    // RMA writes posted since the lane's last flush: one flush covers them
    // all (flush_lanes), posted before the loop next polls or sleeps.
    std::vector<SliceOp*> unflushed;
    // Small message slices posted since then: one bundle, sent by
    // flush_lanes too. Their ids, to fail them if it cannot be sent.
    std::vector<std::uint8_t> bundle;
    std::vector<SliceId> bundled;
    std::uint64_t bundled_bytes = 0;  // their payloads (a read's is what it asks for)
  };

  // A path's slices on one of our rails, for the stall timeout.
  struct RailLoad {
    int inflight = 0;
    TimeNs last_progress_ns = 0;  // the last completion, or the post that ended an idle stretch
    bool failed = false;          // its lanes closed; the path goes on over the others
  };

  // Where an initiator's handshake stands.
  enum class Stage : std::uint8_t { kAwaitChallenge, kAwaitWelcome, kBinding, kDone };

  struct Peer {
    std::string address;
    PathState state = PathState::kConnecting;
    Status error;
    std::unique_ptr<ControlConnection> control;
    bool write_watched = false;
    Stage stage = Stage::kAwaitChallenge;
    ucx::Nonce nonce{};      // ours
    ucx::Nonce challenge{};  // the listener's
    std::vector<std::unique_ptr<Lane>> lanes;
    std::map<RegionHandle, std::shared_ptr<RemoteRegionKeys>> regions;
    std::vector<ucx::Revoke> revokes;  // to acknowledge once no slice of ours uses them
    TimeNs partial_since_ns = 0;       // as Session's
    std::uint64_t next_seq = 1;
    std::uint64_t hello_seq = 0;
    std::uint64_t refresh_seq = 0;  // 0: no refresh pending
    TimeNs deadline_ns = 0;         // handshake
    int inflight = 0;               // slices posted and not handed out
    std::uint64_t held = 0;         // hold_path(): slices its caller keeps outside UCX
    std::vector<RailLoad> rails;    // per rail of ours
    // A peer of this host (its cookie read back) that confirmed our pid in
    // turn (kDirectAnswer), so that it waits for our copies when it revokes:
    // slices are copied here (same_host.h), not posted to UCX. 0: another
    // host, not proved, or not confirmed.
    pid_t same_host_pid = 0;
    // Asked to copy directly (kDirect sent): the pid waiting for the answer,
    // which the path needs before it is ready. 0: not asked, or answered.
    pid_t direct_asked_pid = 0;
    bool ready_heard = false;  // kReady came while the answer had not
    // This process (proved the same way, with or without same-host copies):
    // its addresses are ours (path_in_this_process).
    bool same_process = false;
    // While slices to a same-host holder are in flight, whether it is
    // exiting is checked at most this often (check_holders).
    TimeNs next_holder_check_ns = 0;
  };

  // One of our endpoints to an initiator's worker.
  struct BackLane {
    State* state = nullptr;
    std::uint64_t session = 0;
    std::size_t rail = 0;   // ours
    ucp_ep_h ep = nullptr;  // null once its rail failed
  };

  // The listener's side of one initiator: its control connection, and once
  // it proved the secret, the lanes it bound and the regions it was told of.
  struct Session {
    std::unique_ptr<ControlConnection> conn;
    bool write_watched = false;
    bool authenticated = false;
    ucx::Nonce nonce{};           // our challenge
    TimeNs deadline_ns = 0;       // to authenticate; 0 until the first poll saw it
    std::string name;             // what it calls itself (its listen address)
    std::uint64_t token = 0;      // binds its lanes
    std::set<RegionHandle> sent;  // regions it knows of, not revoked
    std::uint16_t lanes = 0;  // it said it opens
    // Our endpoints to its worker, which carry our answers to its slices:
    // ours, so their failure is reported to us and we close them.
    std::vector<std::unique_ptr<BackLane>> back;
    // The endpoints its lanes arrive on here (UCX's, created by its
    // connection): keys to tell which session a message is from, never
    // used to send or closed by us.
    std::set<ucp_ep_h> bound;
    bool ready_sent = false;
    std::uint64_t queued_bytes = 0;  // held by our answers not yet on the wire (Outgoing::held)
    std::string from;  // the connecting host, for the per-address handshake limit
    // Since when a frame has been half-received (0: none): a peer that
    // parks a partial frame is closed after handshake_timeout_ms.
    TimeNs partial_since_ns = 0;
    // It copies into our memory itself (kDirect): process `direct_pid` of
    // this host, which closing its connection does not stop.
    pid_t direct_pid = 0;
    bool direct_declared = false;  // a kDirect came (one a session)
    // At shutdown such a peer is told we are going (a refusal: its path
    // fails) and kept until it closes its connection, which it does once no
    // copy of its can reach us (close_lingering), or exits, or until
    // drain_deadline_ns (drain_sessions). 0: not draining.
    TimeNs drain_deadline_ns = 0;
  };

  struct SliceOp {
    State* state = nullptr;
    SliceSubmit submit;
    int lane = 0;           // where it went: submit.lane, or another when that lane's rail failed
    std::size_t rail = 0;   // ours, for the stall timeout
    LocalRegion* local = nullptr;
    std::shared_ptr<RemoteRegionKeys> remote;
    void* request = nullptr;  // the RMA, until its callback ran
    int pending = 0;
    ucs_status_t status = UCS_OK;
    // A compressed slice travels as active messages (RMA moves exactly the
    // bytes it is given) and completes on the holder's reply.
    bool compressed = false;
    bool awaiting_reply = false;
    std::uint64_t wire_bytes = 0;
    std::string error;  // why the holder refused it
    // A raw write sent from the caller's memory (send_from_region): UCX
    // reads these until the send's callback ran.
    std::vector<std::uint8_t> am_header, descriptor;
    ucp_dt_iov_t iov[2]{};
  };

  // One flush of a lane, for the writes posted on it since the last one.
  struct FlushGroup {
    State* state = nullptr;
    std::vector<SliceOp*> ops;
    void* request = nullptr;
  };

  struct Outgoing {
    State* state = nullptr;
    std::vector<std::uint8_t> header;
    std::vector<std::uint8_t> payload;
    void* request = nullptr;
    std::uint64_t held = 0;     // memory it holds: buffers' capacity and kOutgoingOverheadBytes
    std::uint64_t session = 0;  // the session an answer goes to; 0: none (ours to a holder)
  };

  struct Inbound {
    MessageKind kind = MessageKind::kQuery;
    ucp_ep_h reply_ep = nullptr;
    std::vector<std::uint8_t> header;
    std::span<const std::uint8_t> payload;  // into `held` or `copy`
    HeldAmData held;
    std::vector<std::uint8_t> copy;  // when UCX could not lend it
  };

  UcxConfig config;
  std::string secret;
  std::string address;
  std::vector<Rail> rails;  // at least one
  // What make_rail set for UCX, once each whatever the rails
  // (UcxTransport::ucx_settings): one NIC's rail may open TCP, another not.
  std::vector<std::pair<std::string, std::string>> ucx_settings;
  // Read out of our memory by a same-host peer to prove where it is (Welcome).
  ucx::Cookie cookie{};
  std::optional<ucx::ControlListener> listener;
  std::optional<ucx::Poller> poller;  // its fd is event_fd()
  bool shut_down = false;

  std::map<std::uintptr_t, LocalRegion> regions;  // by base address
  std::map<RegionHandle, std::uintptr_t> region_base;

  std::vector<Peer> peers;  // by PathId
  std::vector<PathInfo> infos;
  std::uint64_t infos_version = 0;  // paths_version(): moves when an entry of infos changes
  // Every session's conn->queued(), summed (count_queued_in); declared
  // before the sessions, whose connections take theirs back as they go.
  std::size_t control_queued_bytes = 0;
  std::map<std::uint64_t, Session> sessions;  // by id
  std::uint64_t next_session = 1;
  std::uint64_t next_revoke = 1;
  std::unordered_map<std::uint64_t, std::uint64_t> session_by_token;
  std::unordered_map<ucp_ep_h, std::uint64_t> session_by_ep;
  std::uint64_t refused_connections = 0;  // over max_unauthenticated (per address) or max_sessions
  int unauthenticated = 0;                // sessions that have not proved the secret yet
  std::map<std::string, int> unauthenticated_from;  // by connecting host
  // Frames a control connection has taken from in one poll, at most: the
  // rest wait for the next turn (next_event_ns says now), so one peer's
  // burst of small frames cannot hold the loop.
  static constexpr int kMaxFramesPerPoll = 1024;
  // Control answers a peer made us queue (kRefresh) wait behind at most this
  // much of its own, and all sessions' behind this much together.
  static constexpr std::size_t kMaxRefreshBacklogBytes = 4U << 20;
  static constexpr std::size_t kMaxControlBacklogBytes = 64U << 20;
  // The control sockets with something to read or room to write, as the
  // poller said at the start of this poll: only those are read.
  std::vector<int> ready_fds;
  bool all_ready = true;

  std::unordered_map<SliceId, std::unique_ptr<SliceOp>> slices;
  std::unordered_map<FlushGroup*, std::unique_ptr<FlushGroup>> flushes;  // posted, not completed
  std::vector<Lane*> to_flush;  // lanes whose unflushed or bundled went from empty to not: flush_lanes walks these
  std::uint64_t flushes_posted = 0;
  std::uint64_t bundles_sent = 0;
  std::shared_ptr<const Codec> codec;  // for slices this side compresses (set_codec)
  WireCodec codec_id = WireCodec::kRaw;
  std::unique_ptr<Codec> lz4;   // what a peer's compressed slices name, made on first use
  std::unique_ptr<Codec> zstd;
  std::unordered_map<Outgoing*, std::unique_ptr<Outgoing>> outgoing;
  std::uint64_t outgoing_bytes = 0;  // held by messages UCX has not sent yet (Outgoing::held)
  std::uint64_t session_queued_bytes = 0;  // the sessions' queued_bytes, summed
  // Peers' writes and reads of staged regions whose copy runs: answered
  // when it ended.
  struct StagedCopy {
    MessageKind answer = MessageKind::kReadData;  // or kWriteDone
    std::uint64_t session = 0;
    MessageHeader header;  // its seq is the slice's
    SliceDescriptor reply;
    std::shared_ptr<UcxTransport::StagedAccess> access;
    std::uint64_t ticket = 0;
  };
  std::vector<StagedCopy> staged_copies;  // running, at most kMaxStagedCopies
  // Beyond those, in arrival order (a write with its bytes, pooled).
  struct StagedWaiting {
    StagedCopy copy;
    std::vector<std::uint8_t> bytes;
  };
  std::deque<StagedWaiting> staged_waiting;
  // Both lists' bytes, counted with outgoing_bytes against kMaxQueuedReplyBytes.
  std::uint64_t staged_bytes = 0;
  TimeNs last_poll_ns = 0;
  ucx::BufferPool buffers{kPooledBufferBytes};  // payloads' memory, reused
  // ucp_ep_close_nbx requests, with the path whose lane each closes (none:
  // a session's back lane): a failed path's slot is taken again only once
  // UCX is done with its lanes, whose records are its error handlers' args.
  struct Closing {
    void* request = nullptr;
    std::optional<PathId> path;
  };
  std::vector<Closing> closing;
  struct Untaken {
    Notification notification;
    std::uint64_t session = 0;  // that sent it
  };
  std::deque<Untaken> notifications;  // received, not yet taken
  std::unordered_map<std::uint64_t, std::size_t> notifications_of;  // per session, in `notifications`
  std::size_t notification_bytes = 0;  // their text and senders' names
  NotificationCounts notification_counts;   // its untaken: unused (notifications.size())
  bool dropping_notifications = false;       // since the last take: warned once

  // What copy_direct reads on other threads: the local DRAM regions and the
  // ready same-host paths this side connected, with their peers' regions.
  // Rebuilt by the loop when any of it changed; the mappings are shared, so
  // a copy under way keeps what it copies from mapped.
  struct DirectTable {
    struct Local {
      std::byte* base = nullptr;
      std::uint64_t length = 0;
      std::shared_ptr<const ucx::Mapping> keep;  // allocate_memory's memfd
    };
    struct Remote {
      std::uint64_t base = 0;
      std::uint64_t length = 0;
      std::shared_ptr<const ucx::Mapping> mapping;  // null: CMA
    };
    struct Peer {
      pid_t pid = 0;
      std::unordered_map<RegionHandle, Remote> regions;
      bool self = false;  // this process: its ranges are ours, and may overlap the local ones
    };
    std::unordered_map<RegionHandle, Local> locals;
    std::map<std::string, Peer, std::less<>> peers;  // by the address connect() named
    std::uint64_t generation = 0;  // from 1, one per table published by any transport of the process
  };
  std::shared_ptr<const DirectTable> direct;  // the loop's; null: no direct copies
  // direct's, for copies on other threads: read inside a Readers::Section.
  std::atomic<const DirectTable*> direct_table{nullptr};
  std::atomic<std::uint64_t> direct_generation{0};  // direct's, 0 when null
  // Tables replaced while a copy may still read them, with the readers
  // that may: revocations wait for these to go.
  struct Retired {
    std::shared_ptr<const DirectTable> table;
    ucx::Readers::Snapshot readers;
  };
  std::vector<Retired> retired;
  // Control connections of failed same-host paths, held open while a copy
  // may still touch the holder's memory (a caller's thread inside a retired
  // direct table; a CMA or worker copy of a slice still in flight): the
  // holder takes the close as leave to unmap and reuse that memory. And
  // any path's, at a shutdown, until the frames it had queued are written
  // (a peer that reads none of them is given up on at `flush_until`).
  struct Lingering {
    PathId path = 0;
    std::unique_ptr<ControlConnection> conn;
    TimeNs flush_until = 0;
  };
  std::vector<Lingering> lingering;
  static constexpr TimeNs kFarewellFlushNs = 1'000'000'000;
  bool direct_dirty = true;
  std::atomic<bool> codec_set{false};  // set_codec may run on any thread before traffic

  // Recorded by callbacks, acted on by poll(). With progress threads the
  // callbacks of two rails may run at once: each records under
  // record_mutex and sets `recorded`. The loop reads these under hold(),
  // when no callback runs.
  std::mutex record_mutex;
  std::atomic<bool> recorded{false};
  // Set before the threads start and cleared after they joined: without
  // them every callback runs on the loop, and records without the mutex.
  bool threaded = false;
  std::unique_ptr<ucx::ProgressThreads> progress_threads;  // UcxConfig::progress_threads; none when off
  std::vector<SliceOp*> finished;
  std::unique_ptr<ucx::CmaCopier> copier;  // made on the first CMA copy
  std::unique_ptr<ucx::CopyWorkers> workers;  // UcxConfig::copy_threads; none when 0
  std::vector<std::uint64_t> worker_done;     // scratch for collect_copies
  std::vector<Inbound> inbox;
  std::vector<std::pair<Lane*, ucs_status_t>> lane_errors;
  struct BackError {
    std::uint64_t session = 0;
    std::size_t rail = 0;
    ucs_status_t status = UCS_OK;
  };
  std::vector<BackError> back_errors;
  // warn_about_peer's budget: any thread may warn (callbacks included).
  std::mutex peer_warnings_mutex;
  TimeNs peer_warnings_since_ns = 0;
  int peer_warnings = 0;
  std::uint64_t peer_warnings_left_out = 0;

  ~State() { teardown(); }

  // What the holder answers one slice (kWriteData or kReadAsk): a write
  // to host memory lands now (one to staged memory is deferred); a read's bytes are in `data` (into the region, or `packed`).
  // `queued`: reply bytes being gathered that are not in outgoing_bytes yet.
  struct Answer {
    bool deferred = false;  // staged: answered once its copy ended (answer_staged_copies)
    MessageKind kind = MessageKind::kWriteDone;
    SliceDescriptor reply;
    std::vector<std::uint8_t> packed;     // compressed bytes, or why it failed
    std::span<const std::uint8_t> data;   // what follows the descriptor
  };

  void collect_ready() { all_ready = !poller->ready(ready_fds); }

  // Every UcxTransport call that touches UCX or what callbacks record runs
  // under this: no progress thread is in UCX meanwhile (progress_threads.h).
  [[nodiscard]] ucx::ProgressThreads::Hold hold() const { return ucx::ProgressThreads::Hold(progress_threads.get()); }
  // A callback's record: under record_mutex, and the loop is told.
  [[nodiscard]] std::unique_lock<std::mutex> record() {
    if (!threaded) return {};
    recorded.store(true, std::memory_order_release);
    return std::unique_lock(record_mutex);
  }

  // A same-host holder with slices in flight that is exiting fails its path
  // at once: a SIGKILLed process shows PF_EXITING within a millisecond,
  // while its control connection closes only after the kernel tore down its
  // memory (~0.1 ms per MiB), and a CMA copy from it may block until then.
  // Only while slices are in flight, so an idle engine reads nothing.
  static constexpr TimeNs kHolderCheckNs = 500'000;
  // While a staged copy runs (a GPU's DMA, which has no fd to sleep on),
  // the next poll comes this soon.
  static constexpr TimeNs kStagedPollNs = 5'000;

  // rails.cc
  static Result<Rail> make_rail(const UcxConfig& cfg, const std::string& nic, State* state);
  static void on_back_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status);
  static void on_lane_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status);
  static void on_message_sent(void* request, ucs_status_t status, void* user_data);
  template <MessageKind kKind>
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param);
  void progress();
  bool progress_once();
  Status start_progress_threads();
  void stop_progress_threads();
  void unmap(LocalRegion& r);
  static void note_posted(Peer& peer, std::size_t rail, TimeNs now_ns);
  void close_endpoint(ucp_ep_h ep, std::optional<PathId> path = std::nullopt);
  void reap_closing();
  void warn_about_peer(const std::string& text);
  // `session`: the peer an answer goes to, whose Session::queued_bytes it counts in.
  Status send_message(ucp_ep_h ep, MessageKind kind, const MessageHeader& header,
                      std::vector<std::uint8_t> payload, std::uint64_t session = 0);
  std::string rail_name(std::size_t rail) const;
  void fail_rail(PathId id, std::size_t rail, Status reason);
  void fail_stalled(TimeNs now_ns);
  void begin_shutdown();
  void teardown();

  // slices.cc
  static void on_slice_request(void* request, ucs_status_t status, void* user_data);
  static void on_flush(void* request, ucs_status_t status, void* user_data);
  void settle(SliceOp& op, ucs_status_t status);
  void flush_lanes();
  void drop_unflushed(Lane& lane);
  void add_to_bundle(Lane& lane, MessageKind kind, const SliceOp& op, const SliceDescriptor& d,
                     std::span<const std::uint8_t> data);
  void send_bundle(Lane& lane);
  void finish_compressed(SliceOp& op, ucs_status_t status, std::string error);
  Status send_from_region(ucp_ep_h ep, const MessageHeader& header, const SliceDescriptor& d, const void* data,
                          SliceOp& op);
  const Codec* codec_for(WireCodec id);
  Result<LocalRegion*> local_range(std::uint32_t key, std::uint64_t addr, std::uint64_t length);
  static void refuse(Answer& a, const Status& why);
  void reply_with(Answer& a, const std::byte* bytes);
  Status send_answer(ucp_ep_h back, std::uint64_t session, MessageKind kind, const MessageHeader& header,
                     Answer& a);
  bool answers_drain(std::uint64_t session);
  Status unpack(const SliceDescriptor& d, std::span<const std::uint8_t> data, std::byte* out);
  Status start_staged_copy(LocalRegion& r, MessageKind kind, std::uint64_t session, const MessageHeader& header,
                           const SliceDescriptor& d, std::span<const std::uint8_t> data);
  Result<std::uint64_t> begin_staged_copy(const StagedCopy& copy, std::span<const std::uint8_t> raw);
  void end_staged_copy(const StagedCopy& copy, const Result<std::span<const std::byte>>& done);
  void answer_staged_copies();
  std::pair<WireCodec, std::vector<std::uint8_t>> pack(WireCodec id, const Codec* with, const std::byte* bytes,
                                                       std::uint64_t length);
  Answer answer_slice(const Session& session, ucp_ep_h from, MessageKind kind, const Result<SliceDescriptor>& d,
                      std::span<const std::uint8_t> payload, std::uint64_t queued, const MessageHeader& header);
  static ucp_ep_h back_endpoint(const Session& session, std::uint32_t lane);
  void handle_slice_request(const Inbound& in, const MessageHeader& header);
  void handle_bundle(const Inbound& in, const MessageHeader& header);
  void take_answer(Lane* lane, std::uint64_t seq, MessageKind kind, const Result<SliceDescriptor>& d,
                   std::span<const std::uint8_t> data, std::size_t wire_bytes);
  void handle_slice_reply(const Inbound& in, const MessageHeader& header);
  void handle_bundle_reply(const Inbound& in, const MessageHeader& header);
  Lane* lane_of(const MessageHeader& header);
  void handle_recorded();
  bool cma_copier();
  void collect_copies();
  void check_holders(TimeNs now_ns);
  void hand_out(TimeNs now_ns, std::vector<Completion>& out);

  // ucx_transport.cc: copy_direct's checks of `copies` against `table`,
  // into `resolved` (generation set once every copy passed).
  static Status resolve_direct(const DirectTable& table, std::span<const UcxTransport::DirectCopy> copies,
                               UcxTransport::ResolvedCopies& resolved);

  // regions.cc
  void publish_direct();
  bool retired_in_use();
  void close_lingering();
  [[nodiscard]] bool reusable(PathId id) const;
  [[nodiscard]] bool revocation_waits_on_copies() const;
  static bool visible(const LocalRegion& r, const Session& session);
  std::vector<RegionDescriptor> tell_regions(Session& session);
  Result<RegionHandle> map_region(void* addr, std::size_t length, MemoryKind kind, int numa_node = -1);
  // register_memory's and register_staged's checks of a caller's range.
  Status check_new_range(std::string_view call, void* addr, std::size_t length) const;
  // Files a region mapped (memh, rkeys) or staged (`staged` set) under a new handle.
  RegionHandle add_region(void* addr, std::size_t length, MemoryKind kind, LocalRegion region,
                          std::shared_ptr<UcxTransport::StagedAccess> staged);
  bool revoking_for(std::uint32_t key, std::uint64_t id) const;
  void map_memfd(const Peer& peer, RemoteRegionKeys& keys);
  Status apply_regions(PathId id, const std::vector<RegionDescriptor>& descriptors);
  Status acknowledge_revokes(PathId id);
  void finish_revokes(TimeNs now_ns);
  // Shutdown's: whether session `id` is a same-host peer that writes caller
  // regions by address, told we are going and kept until it closed; and the
  // closing of those that exited or ran out of time.
  bool drain(std::uint64_t id, TimeNs now_ns);
  // Whether session `id` is a live process of this host that copies into our
  // DRAM regions itself (kDirect, its cookie read back) and was told one, or
  // owes the acknowledgement of one: a disconnect does not stop its copies,
  // so it is waited for, never dismissed (finish_revokes, drain).
  [[nodiscard]] bool copies_into_us(std::uint64_t id) const;
  void drain_sessions(TimeNs now_ns);  // kForeverNs: close every one now

  // listener.cc
  Session* session_of(ucp_ep_h ep);
  void handle_bind(const Inbound& in);
  void fail_back_rail(const BackError& e);
  void watch(ControlConnection& conn, bool& write_watched);
  void close_session(std::uint64_t id, std::string_view why);
  void drop_a_notification();
  bool tell(std::uint64_t id, ControlKind kind, std::span<const std::uint8_t> body);
  void accept_connections(TimeNs now_ns);
  Status open_back_lanes(std::uint64_t id, const std::vector<std::vector<std::uint8_t>>& addresses);
  [[nodiscard]] static Status refusal(const Peer& peer, const Frame& frame);
  // invalid_argument unless each address is a UCP worker address of this
  // UCX's format: ucp_ep_create asserts on another version (SIGABRT).
  Status check_worker_addresses(const std::vector<std::vector<std::uint8_t>>& addresses) const;
  // A session's handshake is over (proved, or closed): its counts drop.
  void end_handshake(const Session& session);
  // Refuses a newcomer from `from`, or makes room for it; true: accept it.
  bool admit_handshake(const std::string& from, ControlConnection& conn);
  // Closes a session whose frame has been half-sent for handshake_timeout_ms.
  [[nodiscard]] Status check_partial(TimeNs& partial_since_ns, const ControlConnection& conn, TimeNs now_ns) const;
  Status authenticate(std::uint64_t id, const Frame& frame);
  Status serve_frame(std::uint64_t id, const Frame& frame);
  std::vector<std::uint64_t> session_ids() const;
  void serve_sessions(TimeNs now_ns);
  void flush_control();
  bool is_ready(int fd) const;

  // initiator.cc
  void fail_path(PathId id, Status reason);
  topology::PathType detect_path_type(ucp_ep_h ep) const;
  void set_path_type(PathId id, topology::PathType type);
  static std::string_view stage_text(const Peer& peer);
  Status create_lanes(PathId id, const std::vector<std::vector<std::uint8_t>>& addresses);
  Status welcome(PathId id, const Frame& frame, std::uint64_t& token);
  Status initiator_frame(PathId id, const Frame& frame);
  std::string name_for(const ControlConnection& control) const;
  void become_ready(PathId id);
  void drive_paths(TimeNs now_ns);
};

}  // namespace baton::transport
