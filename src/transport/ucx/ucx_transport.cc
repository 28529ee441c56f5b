// UCP underneath the Transport interface.
//
// Peers meet over Baton's own TCP socket (control_channel.h): the listener
// challenges, the initiator proves the deployment secret, the listener proves
// it back and sends its UCP worker addresses (one per rail) and the regions
// exported to that peer; the initiator creates its lanes from the worker
// addresses and binds each to its session with a token. The control connection then carries region
// updates, revocations and notifications, and its closing is the peer's
// death. UCX's sockaddr listener is never used (UCX 1.13 aborts on a
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
#include "transport/ucx/same_host.h"
#include "transport/ucx/socket_address.h"
#include "transport/ucx/wire.h"

namespace baton::transport {
namespace {

using ucx::ControlConnection;
using ucx::ControlKind;
using ucx::Frame;
using ucx::MessageHeader;
using ucx::MessageKind;
using ucx::RegionDescriptor;
using ucx::SliceDescriptor;
using ucx::WireCodec;

// Progress rounds per poll: enough to drain a burst of completions, bounded
// so that one poll cannot starve the loop that called it.
constexpr int kProgressRoundsPerPoll = 64;
// Teardown waits this many progress rounds for endpoint closes; a forced
// close needs no peer, so this only bounds a flushing close to a silent peer.
constexpr int kTeardownRounds = 20'000;
// Compressed-read replies a holder keeps queued for the wire, at most: a
// legitimate initiator has a few MiB in flight per path.
constexpr std::uint64_t kMaxQueuedReplyBytes = 256ULL << 20;
// Payload buffers kept for reuse (ucx::BufferPool): a few batches of slices.
constexpr std::size_t kPooledBufferBytes = 64 << 20;
// Raw message slices up to this size travel in a lane's bundle (wire.h);
// a bundle goes once it carries this many bytes, or at the loop's next
// poll or sleep (flush_lanes). Both within one TCP segment.
constexpr std::uint64_t kMaxBundledSliceBytes = 16 << 10;
constexpr std::size_t kBundleBytes = 64 << 10;
// Same-host copies shorter than this stay on the loop even with copy
// threads: handing one over costs about as much as copying it.
constexpr std::uint64_t kMinThreadCopyBytes = 32 << 10;

constexpr int kMaxCopyThreads = 64;

// UcxConfig::copy_threads resolved: -1 is one per 8 cores, at most 4.
int copy_threads_for(const UcxConfig& c) {
  if (c.copy_threads >= 0) return c.copy_threads;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::min(4, cores / 8);
}

Status ucx_failure(std::string_view call, std::string_view what, ucs_status_t status) {
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
  std::uint64_t inflight = 0;  // slices whose local range is here
  // Who may see it: every authenticated peer, or the peers of these names.
  bool exported_all = false;
  std::set<std::string> exported_to;
  // unregister() under way: the sessions that must acknowledge first.
  bool revoking = false;
  std::uint64_t revoke_seq = 0;
  std::set<std::uint64_t> awaiting;
  TimeNs revoke_deadline_ns = 0;  // 0 until the next poll saw it
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

// Whether UCX may open TCP with these transports on this NIC: its default
// and "all" include it, an RDMA device and port ("mlx5_0:1") does not.
bool may_use_tcp(std::string_view tls, std::string_view nic) {
  if (nic.find(':') != std::string_view::npos) return false;
  if (tls.empty() || tls == "all") return true;
  return tls.find("tcp") != std::string_view::npos && !tls.starts_with('^');
}

// A payload UCX lent us (UCP_AM_RECV_ATTR_FLAG_DATA): kept without a copy
// until the message was acted on, then handed back to its worker.
struct ReleaseAmData {
  ucp_worker_h worker = nullptr;
  void operator()(void* data) const { ucp_am_data_release(worker, data); }
};
using HeldAmData = std::unique_ptr<void, ReleaseAmData>;

}  // namespace

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
    std::uint64_t next_seq = 1;
    std::uint64_t hello_seq = 0;
    std::uint64_t refresh_seq = 0;  // 0: no refresh pending
    TimeNs deadline_ns = 0;         // handshake
    int inflight = 0;               // slices posted and not handed out
    std::vector<RailLoad> rails;    // per rail of ours
    // A peer of this host (its cookie read back): slices are copied here
    // (same_host.h), not posted to UCX. 0: another host, or not proved.
    pid_t same_host_pid = 0;
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
  // Read out of our memory by a same-host peer to prove where it is (Welcome).
  ucx::Cookie cookie{};
  std::optional<ucx::ControlListener> listener;
  std::optional<ucx::Poller> poller;  // its fd is event_fd()
  bool shut_down = false;

  std::map<std::uintptr_t, LocalRegion> regions;  // by base address
  std::map<RegionHandle, std::uintptr_t> region_base;
  RegionHandle next_region = 1;  // 0 is never a region: a default remote_key fails

  std::vector<Peer> peers;  // by PathId
  std::vector<PathInfo> infos;
  std::map<std::uint64_t, Session> sessions;  // by id
  std::uint64_t next_session = 1;
  std::uint64_t next_revoke = 1;
  std::unordered_map<std::uint64_t, std::uint64_t> session_by_token;
  std::unordered_map<ucp_ep_h, std::uint64_t> session_by_ep;
  std::uint64_t refused_connections = 0;  // over max_unauthenticated
  int unauthenticated = 0;                // sessions that have not proved the secret yet
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
  std::uint64_t outgoing_bytes = 0;  // payloads of messages UCX has not sent yet
  ucx::BufferPool buffers{kPooledBufferBytes};  // payloads' memory, reused
  std::vector<void*> closing;  // ucp_ep_close_nbx requests
  std::deque<Notification> notifications;  // received, not yet taken

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
    };
    std::unordered_map<RegionHandle, Local> locals;
    std::map<std::string, Peer, std::less<>> peers;  // by the address connect() named
  };
  mutable std::mutex direct_mutex;
  std::shared_ptr<const DirectTable> direct;  // guarded by direct_mutex; null: no direct copies
  // Tables replaced while a copy may still hold them: revocations wait for these to go.
  std::vector<std::weak_ptr<const DirectTable>> retired;
  bool direct_dirty = true;
  std::atomic<bool> codec_set{false};  // set_codec may run on any thread before traffic

  // Recorded by callbacks, acted on by poll().
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

  ~State() { teardown(); }

  // A UCP context and worker on one NIC (`nic` empty: UCX's choice), with
  // our active-message handlers. Destroyed by teardown() once in `rails`;
  // on failure here, released here.
  static Result<Rail> make_rail(const UcxConfig& cfg, const std::string& nic, State* state) {
    Rail rail;
    rail.nic = nic;
    auto fail = [&rail](Status why) {
      if (rail.worker != nullptr) ucp_worker_destroy(rail.worker);
      if (rail.context != nullptr) ucp_cleanup(rail.context);
      return std::unexpected(std::move(why));
    };
    ucp_config_t* ucp_config = nullptr;
    if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &ucp_config); s != UCS_OK) {
      return fail(ucx_failure("UcxTransport::create", "ucp_config_read", s));
    }
    if (!cfg.tls.empty()) {
      if (ucs_status_t s = ucp_config_modify(ucp_config, "TLS", cfg.tls.c_str()); s != UCS_OK) {
        ucp_config_release(ucp_config);
        return fail(Status::invalid_argument("UcxTransport::create: tls \"{}\" refused by UCX: {}", cfg.tls,
                                             ucs_status_string(s)));
      }
    }
    if (!nic.empty()) {
      if (ucs_status_t s = ucp_config_modify(ucp_config, "NET_DEVICES", nic.c_str()); s != UCS_OK) {
        ucp_config_release(ucp_config);
        return fail(Status::invalid_argument("UcxTransport::create: NIC \"{}\" refused by UCX: {}", nic,
                                             ucs_status_string(s)));
      }
    }
    // One segment per slice message (UcxConfig::tcp_segment_bytes); what the
    // environment sets wins. Only where TCP may open: UCX warns about a
    // setting no transport took.
    if (cfg.tcp_segment_bytes != 0 && may_use_tcp(cfg.tls, nic)) {
      const std::string bytes = std::to_string(cfg.tcp_segment_bytes);
      for (const char* key : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
        if (std::getenv(fmt::format("UCX_TCP_{}", key).c_str()) != nullptr) continue;
        if (ucs_status_t s = ucp_config_modify(ucp_config, key, bytes.c_str()); s != UCS_OK) {
          ucp_config_release(ucp_config);
          return fail(Status::invalid_argument("UcxTransport::create: {}={} refused by UCX: {}", key, bytes,
                                               ucs_status_string(s)));
        }
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "baton";
    const ucs_status_t init = ucp_init(&params, ucp_config, &rail.context);
    ucp_config_release(ucp_config);
    if (init != UCS_OK) {
      rail.context = nullptr;
      if (init == UCS_ERR_NO_DEVICE && !cfg.tls.empty()) {  // the caller's list, not the machine
        return fail(Status::invalid_argument(
            "UcxTransport::create: tls \"{}\" leaves UCX no transport {} (UCX's warning names those it has)",
            cfg.tls, nic.empty() ? std::string("on this machine") : "on NIC " + nic));
      }
      return fail(ucx_failure("UcxTransport::create",
                              fmt::format("ucp_init (tls \"{}\"{})", cfg.tls, nic.empty() ? "" : ", NIC " + nic), init));
    }
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // the engine loop owns it
    if (ucs_status_t s = ucp_worker_create(rail.context, &worker_params, &rail.worker); s != UCS_OK) {
      rail.worker = nullptr;
      return fail(ucx_failure("UcxTransport::create", "ucp_worker_create", s));
    }
    if (ucs_status_t s = ucp_worker_get_efd(rail.worker, &rail.worker_fd); s != UCS_OK) {
      return fail(ucx_failure("UcxTransport::create", "ucp_worker_get_efd", s));
    }
    ucp_address_t* address = nullptr;
    std::size_t address_length = 0;
    if (ucs_status_t s = ucp_worker_get_address(rail.worker, &address, &address_length); s != UCS_OK) {
      return fail(ucx_failure("UcxTransport::create", "ucp_worker_get_address", s));
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(address);
    rail.worker_address.assign(bytes, bytes + address_length);
    rail.handler_arg = std::make_unique<HandlerArg>(HandlerArg{state, rail.worker});
    ucp_worker_release_address(rail.worker, address);
    if (rail.worker_address.size() > ucx::kMaxWorkerAddressBytes) {
      return fail(Status::unavailable("UcxTransport::create: UCX's worker address has {} bytes (at most {} travel)",
                                      rail.worker_address.size(), ucx::kMaxWorkerAddressBytes));
    }
    for (auto [kind, cb] : {std::pair{MessageKind::kQuery, &State::on_message<MessageKind::kQuery>},
                            std::pair{MessageKind::kWriteData, &State::on_message<MessageKind::kWriteData>},
                            std::pair{MessageKind::kWriteDone, &State::on_message<MessageKind::kWriteDone>},
                            std::pair{MessageKind::kReadAsk, &State::on_message<MessageKind::kReadAsk>},
                            std::pair{MessageKind::kReadData, &State::on_message<MessageKind::kReadData>},
                            std::pair{MessageKind::kSliceBundle, &State::on_message<MessageKind::kSliceBundle>},
                            std::pair{MessageKind::kReplyBundle, &State::on_message<MessageKind::kReplyBundle>}}) {
      ucp_am_handler_param_t p{};
      p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                     UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      p.id = static_cast<unsigned>(kind);
      p.flags = UCP_AM_FLAG_WHOLE_MSG;
      p.cb = cb;
      p.arg = rail.handler_arg.get();
      if (ucs_status_t s = ucp_worker_set_am_recv_handler(rail.worker, &p); s != UCS_OK) {
        return fail(ucx_failure("UcxTransport::create", "ucp_worker_set_am_recv_handler", s));
      }
    }
    return rail;
  }

  // --- the direct-copy table -------------------------------------------------

  void publish_direct() {
    direct_dirty = false;
    std::shared_ptr<DirectTable> t;
    if (config.same_host_copy && !shut_down) {
      t = std::make_shared<DirectTable>();
      for (const auto& [base, r] : regions) {
        if (r.kind != MemoryKind::kDram || r.revoking) continue;
        t->locals.emplace(r.handle, DirectTable::Local{reinterpret_cast<std::byte*>(r.base), r.length,
                                                       r.shared ? r.shared->mapping : nullptr});
      }
      for (PathId id = 0; id < peers.size(); ++id) {  // a later connect to the same address wins
        const Peer& peer = peers[id];
        if (peer.state != PathState::kReady || peer.same_host_pid == 0) continue;
        DirectTable::Peer& p = t->peers[infos[id].to];
        p = DirectTable::Peer{peer.same_host_pid, {}};
        for (const auto& [key, keys] : peer.regions) {
          p.regions.emplace(key, DirectTable::Remote{keys->info.base, keys->info.length, keys->mapping});
        }
      }
    }
    std::shared_ptr<const DirectTable> old;
    {
      std::lock_guard lock(direct_mutex);
      old = std::exchange(direct, std::move(t));
    }
    // Pruned here too: an engine whose regions are never revoked must not
    // keep one entry per table it ever published.
    if (old) {
      std::erase_if(retired, [](const std::weak_ptr<const DirectTable>& w) { return w.expired(); });
      retired.push_back(old);
    }
  }

  // Whether a copy may still read a table that is no longer published.
  bool retired_in_use() {
    std::erase_if(retired, [](const std::weak_ptr<const DirectTable>& w) { return w.expired(); });
    return !retired.empty();
  }

  // --- callbacks (record only) ----------------------------------------------

  static void on_back_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* back = static_cast<BackLane*>(arg);
    back->state->back_errors.push_back({back->session, back->rail, status});
  }

  static void on_lane_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* lane = static_cast<Lane*>(arg);
    lane->state->lane_errors.emplace_back(lane, status);
  }

  static void on_slice_request(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SliceOp*>(user_data);
    op->request = nullptr;
    ucp_request_free(request);
    op->state->settle(*op, status);
  }

  static void on_flush(void* request, ucs_status_t status, void* user_data) {
    auto* group = static_cast<FlushGroup*>(user_data);
    ucp_request_free(request);
    group->request = nullptr;
    State* state = group->state;
    for (SliceOp* op : group->ops) state->settle(*op, status);
    state->flushes.erase(group);
  }

  // One of a slice's requests (its RMA, or the flush that covers its write)
  // ended; the slice finishes with the last.
  void settle(SliceOp& op, ucs_status_t status) {
    if (status != UCS_OK && op.status == UCS_OK) op.status = status;
    if (--op.pending == 0) finished.push_back(&op);
  }

  // Posts one flush per lane that has writes posted since its last: a put
  // completes when its source may be reused, and its bytes are at the peer
  // only once a flush after it completed. One flush for a lane's whole burst
  // of writes (a batch, a scheduler tick) instead of one per slice.
  void flush_lanes() {
    for (Lane* lane : std::exchange(to_flush, {})) {
      if (!lane->bundled.empty()) send_bundle(*lane);
      if (lane->unflushed.empty()) continue;  // it closed since
      auto group = std::make_unique<FlushGroup>();
      group->state = this;
      group->ops = std::exchange(lane->unflushed, {});
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = &State::on_flush;
      param.user_data = group.get();
      void* f = ucp_ep_flush_nbx(lane->ep, &param);
      ++flushes_posted;
      if (f == nullptr || UCS_PTR_IS_ERR(f)) {
        const ucs_status_t st = f == nullptr ? UCS_OK : UCS_PTR_STATUS(f);
        for (SliceOp* op : group->ops) settle(*op, st);
        continue;
      }
      group->request = f;
      FlushGroup* key = group.get();
      flushes.emplace(key, std::move(group));
    }
  }

  // A lane closes with writes that no flush covers yet: they fail (a forced
  // close cancels their puts too). Its unsent bundle goes unsent: its slices
  // await a reply, and the caller fails those.
  void drop_unflushed(Lane& lane) {
    for (SliceOp* op : std::exchange(lane.unflushed, {})) settle(*op, UCS_ERR_CONNECTION_RESET);
    buffers.give(std::exchange(lane.bundle, {}));
    lane.bundled.clear();
    lane.bundled_bytes = 0;
  }

  // Adds a small raw slice to its lane's bundle; the bundle goes when full,
  // else with the lane's flush.
  void add_to_bundle(Lane& lane, MessageKind kind, const SliceOp& op, const SliceDescriptor& d,
                     std::span<const std::uint8_t> data) {
    if (lane.bundled.empty()) {
      lane.bundle = ucx::begin_bundle(buffers.take(kBundleBytes + ucx::kBundleEntryBytes));
      if (lane.unflushed.empty()) to_flush.push_back(&lane);
    }
    ucx::add_to_bundle(lane.bundle, kind, op.submit.id, d, data);
    lane.bundled.push_back(op.submit.id);
    lane.bundled_bytes += op.submit.bytes;
    if (lane.bundled_bytes >= kBundleBytes || lane.bundled.size() == ucx::kMaxBundleEntries) send_bundle(lane);
  }

  void send_bundle(Lane& lane) {
    const std::vector<SliceId> ids = std::exchange(lane.bundled, {});
    lane.bundled_bytes = 0;
    if (ids.empty() || lane.ep == nullptr) return;
    MessageHeader header;
    header.path = lane.path;
    header.lane = static_cast<std::uint32_t>(lane.index);
    Status sent = send_message(lane.ep, MessageKind::kSliceBundle, header, std::exchange(lane.bundle, {}));
    if (sent.is_ok()) {
      ++bundles_sent;
      return;
    }
    for (SliceId id : ids) {
      const auto it = slices.find(id);
      if (it != slices.end() && it->second->awaiting_reply) {
        finish_compressed(*it->second, UCS_ERR_IO_ERROR, "its bundle was not sent: " + sent.message());
      }
    }
  }

  static void on_message_sent(void* request, ucs_status_t status, void* user_data) {
    auto* msg = static_cast<Outgoing*>(user_data);
    ucp_request_free(request);
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
      spdlog::debug("ucx: handshake message not delivered: {}", ucs_status_string(status));
    }
    msg->state->outgoing_bytes -= msg->payload.size();
    msg->state->buffers.give(std::move(msg->payload));
    msg->state->outgoing.erase(msg);
  }

  template <MessageKind kKind>
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
    const auto& handler = *static_cast<const HandlerArg*>(arg);
    State* state = handler.state;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      // We send every handshake message eager; a rendezvous one is not ours.
      spdlog::warn("ucx: dropped a rendezvous handshake message of {} bytes", length);
      return UCS_OK;
    }
    Inbound in;
    in.kind = kKind;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) in.reply_ep = param->reply_ep;
    const auto* h = static_cast<const std::uint8_t*>(header);
    const auto* d = static_cast<const std::uint8_t*>(data);
    if (header_length > 0) in.header.assign(h, h + header_length);
    // A slice's bytes are kept where UCX assembled them, not copied again
    // (over TCP this copy, into fresh memory, cost more than the socket).
    const bool lend = length > 0 && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    if (lend) {
      in.held = HeldAmData(data, ReleaseAmData{handler.worker});
      in.payload = std::span(d, length);
    } else if (length > 0) {
      in.copy = state->buffers.take(length);
      in.copy.assign(d, d + length);
      in.payload = in.copy;
    }
    state->inbox.push_back(std::move(in));
    return lend ? UCS_INPROGRESS : UCS_OK;
  }

  // --- helpers ----------------------------------------------------------------

  void progress() {
    for (Rail& rail : rails) {
      for (int i = 0; i < kProgressRoundsPerPoll; ++i) {
        if (ucp_worker_progress(rail.worker) == 0) break;
      }
    }
  }

  // Whether every worker is idle: one progress round each, all of them.
  bool progress_once() {
    unsigned done = 0;
    for (Rail& rail : rails) done += ucp_worker_progress(rail.worker);
    return done != 0;
  }

  void unmap(LocalRegion& r) {
    for (std::size_t i = 0; i < r.memh.size(); ++i) ucp_mem_unmap(rails[i].context, r.memh[i]);
    r.memh.clear();
  }

  // A slice was posted on `rail` of `peer`: an idle stretch ends there.
  static void note_posted(Peer& peer, std::size_t rail, TimeNs now_ns) {
    ++peer.inflight;
    if (peer.rails[rail].inflight++ == 0) peer.rails[rail].last_progress_ns = now_ns;
  }

  void close_endpoint(ucp_ep_h ep) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // A forced close needs no answer from the peer and completes everything
    // still posted with UCS_ERR_CANCELED; UCX allows it only under
    // peer-failure handling.
    param.flags = config.peer_failure_detection ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
  }

  void reap_closing() {
    std::erase_if(closing, [](void* request) {
      if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
      ucp_request_free(request);
      return true;
    });
  }

  Status send_message(ucp_ep_h ep, MessageKind kind, const MessageHeader& header,
                      std::vector<std::uint8_t> payload) {
    auto msg = std::make_unique<Outgoing>();
    msg->state = this;
    msg->header = ucx::encode_header(header);
    msg->payload = std::move(payload);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &State::on_message_sent;
    param.user_data = msg.get();
    void* request = ucp_am_send_nbx(ep, static_cast<unsigned>(kind), msg->header.data(), msg->header.size(),
                                    msg->payload.empty() ? nullptr : msg->payload.data(), msg->payload.size(),
                                    &param);
    if (UCS_PTR_IS_ERR(request)) {
      return ucx_failure("ucx handshake", "ucp_am_send_nbx", UCS_PTR_STATUS(request));
    }
    if (request == nullptr) {  // sent already
      buffers.give(std::move(msg->payload));
      return Status::ok();
    }
    msg->request = request;
    outgoing_bytes += msg->payload.size();
    Outgoing* key = msg.get();
    outgoing.emplace(key, std::move(msg));
    return Status::ok();
  }

  static bool visible(const LocalRegion& r, const Session& session) {
    return session.authenticated && !r.revoking && (r.exported_all || r.exported_to.contains(session.name));
  }

  // The regions `session` may use now; remembered as what it was told.
  std::vector<RegionDescriptor> tell_regions(Session& session) {
    std::vector<RegionDescriptor> out;
    session.sent.clear();
    for (const auto& [base, r] : regions) {
      if (!visible(r, session)) continue;
      RegionDescriptor d{r.handle, static_cast<std::uint64_t>(r.base), r.length, r.packed_rkeys};
      if (r.shared) {
        d.memfd = r.shared->fd.get();
        d.memfd_inode = r.shared->inode;
      }
      out.push_back(std::move(d));
      session.sent.insert(r.handle);
    }
    return out;
  }

  // ucp_mem_map of a caller's range, or (addr null) of memory UCX
  // allocates, then the rkey peers get. The caller checked the range.
  Result<RegionHandle> map_region(void* addr, std::size_t length, MemoryKind kind, int numa_node = -1) {
    ucp_mem_map_params_t params{};
    params.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    const char* call = addr == nullptr ? "UcxTransport::allocate_memory" : "UcxTransport::register_memory";
    // Allocated memory is a memfd, so that same-host peers can map it.
    std::optional<ucx::SharedAllocation> shared;
    if (addr == nullptr) {
      auto created = ucx::SharedAllocation::create(length, numa_node);
      if (!created) return std::unexpected(Status(created.error().code(), fmt::format("{}: {}", call, created.error().message())));
      shared = std::move(*created);
      addr = shared->mapping->address();
    }
    params.address = addr;
    params.length = length;
    // Said, not detected: a UCX without CUDA support must refuse VRAM rather
    // than map a device pointer as host memory.
    params.memory_type = kind == MemoryKind::kVram ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    LocalRegion region;
    // Mapped on every rail (each is a UCP context of its own), with the rkey
    // of each for peers.
    for (Rail& rail : rails) {
      ucp_mem_h memh = nullptr;
      if (ucs_status_t st = ucp_mem_map(rail.context, &params, &memh); st != UCS_OK) {
        unmap(region);
        return std::unexpected(
            ucx_failure(call, kind == MemoryKind::kVram ? "ucp_mem_map (VRAM)" : "ucp_mem_map", st));
      }
      region.memh.push_back(memh);
      void* packed = nullptr;
      std::size_t packed_size = 0;
      if (ucs_status_t st = ucp_rkey_pack(rail.context, memh, &packed, &packed_size); st != UCS_OK) {
        unmap(region);
        return std::unexpected(ucx_failure(call, "ucp_rkey_pack", st));
      }
      const auto* bytes = static_cast<const std::uint8_t*>(packed);
      region.packed_rkeys.emplace_back(bytes, bytes + packed_size);
      ucp_rkey_buffer_release(packed);
    }
    region.handle = next_region++;
    region.base = reinterpret_cast<std::uintptr_t>(addr);
    region.length = length;
    region.kind = kind;
    region.shared = std::move(shared);
    region_base.emplace(region.handle, region.base);
    const RegionHandle handle = region.handle;
    regions.emplace(region.base, std::move(region));
    publish_direct();  // the next copy_direct may use it
    return handle;
  }

  void fail_path(PathId id, Status reason) {
    Peer& peer = peers[id];
    if (peer.state == PathState::kFailed) return;
    if (shut_down) {
      spdlog::debug("ucx: path {} to {} closed", id, peer.address);
    } else {
      spdlog::info("ucx: path {} to {} failed: {}", id, peer.address, reason.message());
    }
    peer.state = PathState::kFailed;
    peer.error = std::move(reason);
    direct_dirty = true;
    peer.refresh_seq = 0;
    peer.revokes.clear();
    if (peer.control) {
      poller->forget(peer.control->fd());
      peer.control.reset();  // the listener sees us go
    }
    for (auto& lane : peer.lanes) {
      drop_unflushed(*lane);
      if (lane->ep != nullptr) {
        close_endpoint(lane->ep);
        lane->ep = nullptr;
      }
    }
    // Slices still posted hold their regions' rkeys until they finish.
    peer.regions.clear();
    // A compressed slice waits for a reply that will not come now.
    for (auto& [sid, op] : slices) {
      if (op->awaiting_reply && op->submit.path == id) finish_compressed(*op, UCS_ERR_CONNECTION_RESET, {});
    }
  }

  // " on rail 1 (eth1)" where there is more than one rail, else nothing.
  std::string rail_name(std::size_t rail) const {
    return rails.size() == 1 ? std::string() : fmt::format(" on rail {} ({})", rail, rails[rail].nic);
  }

  // Rail `rail` of path `id` failed. While another rail of the path works
  // (and a forced close can complete what is posted: peer-failure
  // detection), only its lanes close: their RMA completes with an error,
  // their slices awaiting a reply fail, and the scheduler sends them again,
  // which lands them on the lanes left (submit). The last rail fails the path.
  void fail_rail(PathId id, std::size_t rail, Status reason) {
    Peer& peer = peers[id];
    if (peer.state == PathState::kFailed || peer.rails[rail].failed) return;
    bool others = false;
    for (std::size_t r = 0; r < peer.rails.size(); ++r) others = others || (r != rail && !peer.rails[r].failed);
    if (!others || !config.peer_failure_detection || peer.same_host_pid != 0) {
      fail_path(id, std::move(reason));
      return;
    }
    spdlog::warn("ucx: {}; its lanes fail over to the path's other rails", reason.message());
    peer.rails[rail].failed = true;
    for (auto& lane : peer.lanes) {
      if (lane->rail != rail || lane->ep == nullptr) continue;
      drop_unflushed(*lane);
      close_endpoint(lane->ep);
      lane->ep = nullptr;
    }
    for (auto& [sid, op] : slices) {
      if (op->awaiting_reply && op->submit.path == id && op->rail == rail) {
        finish_compressed(*op, UCS_ERR_CONNECTION_RESET, {});
      }
    }
  }

  // A rail of a ready path that has had slices posted and none completed for
  // the stall timeout fails: a link that went down, or a peer that stopped.
  void fail_stalled(TimeNs now_ns) {
    if (config.stall_timeout_ms == 0) return;
    const TimeNs stall_ns = config.stall_timeout_ms * 1'000'000;
    bool failed = false;
    for (PathId id = 0; id < peers.size(); ++id) {
      Peer& p = peers[id];
      for (std::size_t r = 0; r < p.rails.size() && p.state == PathState::kReady; ++r) {
        const RailLoad& load = p.rails[r];
        if (load.failed || load.inflight == 0 || now_ns - load.last_progress_ns < stall_ns) continue;
        fail_rail(id, r,
                  Status::unavailable("path {} to {}{}: no slice completed for {} ms with {} posted (the link or the "
                                      "peer is gone)",
                                      id, p.address, rail_name(r), config.stall_timeout_ms, load.inflight));
        failed = true;
      }
    }
    if (failed) handle_recorded();  // the forced close completes what was posted
  }

  void finish_compressed(SliceOp& op, ucs_status_t status, std::string error) {
    op.awaiting_reply = false;
    if (status != UCS_OK && op.status == UCS_OK) op.status = status;
    if (!error.empty() && op.error.empty()) op.error = std::move(error);
    finished.push_back(&op);
  }

  // --- compressed slices ------------------------------------------------------

  const Codec* codec_for(WireCodec id) {
    if (id == WireCodec::kLz4) {
      if (!lz4) lz4 = make_lz4_codec();
      return lz4.get();
    }
    if (id == WireCodec::kZstd) {
      if (!zstd) zstd = std::move(*make_zstd_codec(1));
      return zstd.get();
    }
    return nullptr;
  }

  // The local region holding [addr, addr + length) of the region `key`, or why not.
  Result<std::byte*> local_range(std::uint32_t key, std::uint64_t addr, std::uint64_t length) const {
    const auto base = region_base.find(key);
    if (base == region_base.end()) return std::unexpected(Status::not_found("no region {} here", key));
    const LocalRegion& r = regions.at(base->second);
    if (addr < r.base || length > r.length || addr - r.base > r.length - length) {
      return std::unexpected(Status::out_of_range("[{:#x}, +{}) is not inside region {} [{:#x}, +{})", addr, length,
                                                  key, r.base, r.length));
    }
    return reinterpret_cast<std::byte*>(addr);
  }

  // Writes a slice's bytes (compressed or raw) to `out` (exactly its size).
  Status unpack(const SliceDescriptor& d, std::span<const std::uint8_t> data, std::byte* out) {
    const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data.data()), data.size());
    if (d.codec == WireCodec::kRaw) {
      if (data.size() != d.payload_len) {
        return Status::invalid_argument("raw slice of {} bytes, {} announced", data.size(), d.payload_len);
      }
      std::memcpy(out, in.data(), in.size());
      return Status::ok();
    }
    return codec_for(d.codec)->decompress(in, std::span(out, d.payload_len));
  }

  // `bytes` compressed with `id` when that shrinks them, else raw.
  std::pair<WireCodec, std::vector<std::uint8_t>> pack(WireCodec id, const Codec* with, const std::byte* bytes,
                                                       std::uint64_t length) {
    std::vector<std::byte> packed;
    const std::span<const std::byte> in(bytes, length);
    if (with != nullptr) {
      if (auto shrunk = with->compress(in, packed); shrunk && *shrunk) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(packed.data());
        return {id, std::vector<std::uint8_t>(p, p + packed.size())};
      }
    }
    const auto* p = reinterpret_cast<const std::uint8_t*>(bytes);
    return {WireCodec::kRaw, std::vector<std::uint8_t>(p, p + length)};
  }

  // Whether region `key` is being revoked and session `id` has not
  // acknowledged yet: what it posted before it learned of the revocation
  // is still served (the memory stays mapped until it acknowledges).
  bool revoking_for(std::uint32_t key, std::uint64_t id) const {
    const auto base = region_base.find(key);
    if (base == region_base.end()) return false;
    const LocalRegion& r = regions.at(base->second);
    return r.revoking && r.awaiting.contains(id);
  }

  // The session whose lane `ep` is, or null for a lane never bound.
  Session* session_of(ucp_ep_h ep) {
    const auto it = ep == nullptr ? session_by_ep.end() : session_by_ep.find(ep);
    return it == session_by_ep.end() ? nullptr : &sessions.at(it->second);
  }

  // What the holder answers one slice (kWriteData or kReadAsk): a write
  // lands now; a read's bytes are in `data` (into the region, or `packed`).
  // `queued`: reply bytes being gathered that are not in outgoing_bytes yet.
  struct Answer {
    MessageKind kind = MessageKind::kWriteDone;
    SliceDescriptor reply;
    std::vector<std::uint8_t> packed;     // compressed bytes, or why it failed
    std::span<const std::uint8_t> data;   // what follows the descriptor
  };
  Answer answer_slice(const Session& session, ucp_ep_h from, MessageKind kind, const Result<SliceDescriptor>& d,
                      std::span<const std::uint8_t> payload, std::uint64_t queued) {
    Answer a;
    a.kind = kind == MessageKind::kWriteData ? MessageKind::kWriteDone : MessageKind::kReadData;
    Status why;
    if (!d) {
      why = d.error();
    } else if (!session.sent.contains(d->key) && !revoking_for(d->key, session_by_ep.at(from))) {
      a.reply = *d;
      why = Status::permission_denied("region {} is not exported to {}", d->key, session.name);
    } else {
      a.reply = *d;
      auto range = local_range(d->key, d->addr, d->payload_len);
      if (!range) {
        why = range.error();
      } else if (kind == MessageKind::kWriteData) {
        why = unpack(*d, payload, *range);
      } else if (outgoing_bytes + queued + d->payload_len > kMaxQueuedReplyBytes) {
        // A peer asking faster than the wire drains would make us copy
        // without bound: refuse, it retries the slice.
        why = Status::resource_exhausted("{} bytes of replies are waiting to be sent (at most {})",
                                         outgoing_bytes + queued, kMaxQueuedReplyBytes);
      } else if (d->codec == WireCodec::kRaw) {
        a.data = std::span(reinterpret_cast<const std::uint8_t*>(*range), d->payload_len);  // no copy before the reply's
      } else {
        auto [id, bytes] = pack(d->codec, codec_for(d->codec), *range, d->payload_len);
        a.reply.codec = id;
        a.packed = std::move(bytes);
        a.data = a.packed;
      }
    }
    if (!why.is_ok()) {
      a.reply.failed = 1;
      a.reply.payload_len = std::max<std::uint64_t>(a.reply.payload_len, 1);
      const std::string text = why.message();
      a.packed.assign(text.begin(), text.end());
      a.data = a.packed;
    }
    return a;
  }

  // The back lane of the rail a slice came on; another when that one failed.
  static ucp_ep_h back_endpoint(const Session& session, std::uint32_t lane) {
    for (std::size_t i = 0; i < session.back.size(); ++i) {
      if (ucp_ep_h ep = session.back[(lane + i) % session.back.size()]->ep) return ep;
    }
    return nullptr;
  }

  // The holder's side: a bound lane asks to write or read one slice.
  void handle_slice_request(const Inbound& in, const MessageHeader& header) {
    Session* session = session_of(in.reply_ep);
    if (session == nullptr) {
      spdlog::warn("ucx: a compressed slice from an endpoint no authenticated peer bound; dropped");
      return;
    }
    std::size_t at = 0;
    auto d = ucx::decode_slice(in.payload, at);
    const Answer a = answer_slice(*session, in.reply_ep, in.kind, d, in.payload.subspan(d ? at : 0), 0);
    ucp_ep_h back = back_endpoint(*session, header.lane);
    if (back == nullptr) {
      spdlog::warn("ucx: reply to compressed slice {} not sent: no endpoint to {} left", header.seq, session->name);
      return;
    }
    auto payload = ucx::encode_slice(a.reply, a.data, buffers.take(ucx::kSliceDescriptorBytes + a.data.size()));
    if (Status s = send_message(back, a.kind, header, std::move(payload)); !s.is_ok()) {
      spdlog::warn("ucx: reply to compressed slice {} not sent: {}", header.seq, s.message());
    }
  }

  // The holder's side: a bundle of small slices, answered as one bundle
  // (more than one when the replies outgrow kBundleBytes).
  void handle_bundle(const Inbound& in, const MessageHeader& header) {
    Session* session = session_of(in.reply_ep);
    if (session == nullptr) {
      spdlog::warn("ucx: a bundle from an endpoint no authenticated peer bound; dropped");
      return;
    }
    auto entries = ucx::decode_bundle(in.payload);
    if (!entries) {
      // Its slices stall and fail on the initiator's stall timeout: only a
      // corrupt or hostile peer sends one.
      spdlog::warn("ucx: dropped a bundle from {}: {}", session->name, entries.error().message());
      return;
    }
    ucp_ep_h back = back_endpoint(*session, header.lane);
    if (back == nullptr) {
      spdlog::warn("ucx: replies to a bundle not sent: no endpoint to {} left", session->name);
      return;
    }
    std::vector<std::uint8_t> reply;
    auto send = [&] {
      if (Status s = send_message(back, MessageKind::kReplyBundle, header, std::move(reply)); !s.is_ok()) {
        spdlog::warn("ucx: replies to a bundle not sent: {}", s.message());
      }
      reply = {};
    };
    for (const ucx::BundleEntry& e : *entries) {
      if (e.kind != MessageKind::kWriteData && e.kind != MessageKind::kReadAsk) {
        spdlog::warn("ucx: a bundle from {} holds a reply (kind {}); skipped", session->name,
                     static_cast<unsigned>(e.kind));
        continue;
      }
      const Answer a = answer_slice(*session, in.reply_ep, e.kind, e.descriptor, e.data, reply.size());
      if (reply.empty()) reply = ucx::begin_bundle(buffers.take(kBundleBytes + ucx::kBundleEntryBytes));
      ucx::add_to_bundle(reply, a.kind, e.seq, a.reply, a.data);
      if (reply.size() >= kBundleBytes || ucx::bundle_entries(reply) == ucx::kMaxBundleEntries) send();
    }
    if (!reply.empty()) send();
  }

  // The initiator's side: the holder answered slice `seq` on `lane`.
  void take_answer(Lane* lane, std::uint64_t seq, MessageKind kind, const Result<SliceDescriptor>& d,
                   std::span<const std::uint8_t> data, std::size_t wire_bytes) {
    const auto it = slices.find(seq);
    if (lane == nullptr || it == slices.end() || !it->second->awaiting_reply || it->second->submit.path != lane->path ||
        (kind == MessageKind::kReadData) != (it->second->submit.memory.op == Op::kRead)) {
      spdlog::warn("ucx: a reply for slice {} that is not waiting for one; dropped", seq);
      return;
    }
    SliceOp& op = *it->second;
    if (!d) {
      finish_compressed(op, UCS_ERR_INVALID_PARAM, d.error().message());
      return;
    }
    if (d->failed != 0) {
      finish_compressed(op, UCS_ERR_REJECTED, "the holder refused: " + std::string(data.begin(), data.end()));
      return;
    }
    if (kind == MessageKind::kReadData) {
      op.wire_bytes += wire_bytes;
      if (d->payload_len != op.submit.bytes) {
        finish_compressed(op, UCS_ERR_INVALID_PARAM, fmt::format("{} bytes came back, {} asked", d->payload_len,
                                                                 op.submit.bytes));
        return;
      }
      if (Status s = unpack(*d, data, static_cast<std::byte*>(op.submit.memory.local)); !s.is_ok()) {
        finish_compressed(op, UCS_ERR_INVALID_PARAM, s.message());
        return;
      }
    }
    finish_compressed(op, UCS_OK, {});
  }

  void handle_slice_reply(const Inbound& in, const MessageHeader& header) {
    std::size_t at = 0;
    auto d = ucx::decode_slice(in.payload, at);
    take_answer(lane_of(header), header.seq, in.kind, d, in.payload.subspan(d ? at : 0), in.payload.size());
  }

  void handle_bundle_reply(const Inbound& in, const MessageHeader& header) {
    Lane* lane = lane_of(header);
    auto entries = ucx::decode_bundle(in.payload);
    if (!entries) {
      spdlog::warn("ucx: dropped a reply bundle: {}", entries.error().message());
      return;
    }
    for (const ucx::BundleEntry& e : *entries) {
      if (e.kind != MessageKind::kWriteDone && e.kind != MessageKind::kReadData) {
        spdlog::warn("ucx: a reply bundle holds a request (kind {}); skipped", static_cast<unsigned>(e.kind));
        continue;
      }
      take_answer(lane, e.seq, e.kind, e.descriptor, e.data, ucx::kBundleEntryBytes + e.data.size());
    }
  }

  // Replaces the peer's region table by `descriptors`, unpacking the rkeys
  // of new regions on every lane. Regions that did not change keep theirs.
  Status apply_regions(PathId id, const std::vector<RegionDescriptor>& descriptors) {
    Peer& peer = peers[id];
    std::map<RegionHandle, std::shared_ptr<RemoteRegionKeys>> table;
    for (const RegionDescriptor& d : descriptors) {
      if (table.contains(d.key)) {
        return Status::invalid_argument("ucx handshake: peer {} announced region key {} twice", peer.address,
                                        d.key);
      }
      auto old = peer.regions.find(d.key);
      if (old != peer.regions.end() && old->second->info.base == d.base && old->second->info.length == d.length &&
          old->second->memfd == d.memfd && old->second->memfd_inode == d.memfd_inode) {
        table.emplace(d.key, old->second);
        continue;
      }
      auto keys = std::make_shared<RemoteRegionKeys>();
      keys->info = {d.key, d.base, d.length};
      keys->rkeys.assign(peer.lanes.size(), nullptr);
      for (std::size_t i = 0; i < peer.lanes.size(); ++i) {
        const Lane& lane = *peer.lanes[i];
        if (lane.ep == nullptr) continue;  // its rail failed
        if (lane.remote_rail >= d.packed_rkeys.size()) {
          return Status::invalid_argument("ucx handshake: peer {} sent {} rkeys for region {}, fewer than its rails",
                                          peer.address, d.packed_rkeys.size(), d.key);
        }
        const ucs_status_t s = ucp_ep_rkey_unpack(lane.ep, d.packed_rkeys[lane.remote_rail].data(), &keys->rkeys[i]);
        if (s != UCS_OK) {
          return Status::unavailable("ucx handshake: cannot unpack the rkey of region {} of peer {} on lane {}: {}",
                                     d.key, peer.address, i, ucs_status_string(s));
        }
      }
      keys->memfd = d.memfd;
      keys->memfd_inode = d.memfd_inode;
      if (peer.same_host_pid != 0 && d.memfd >= 0) {
        auto mapped = ucx::map_peer_memfd(peer.same_host_pid, d.memfd, d.memfd_inode, d.length);
        if (mapped) {
          keys->mapping = std::make_shared<const ucx::Mapping>(std::move(*mapped));
        } else {
          spdlog::debug("ucx: region {} of {}: {}; copying with CMA", d.key, peer.address, mapped.error().message());
        }
      }
      table.emplace(d.key, std::move(keys));
    }
    peer.regions = std::move(table);
    direct_dirty = true;
    return Status::ok();
  }

  // What UCX chose for the path's RMA, from ucp_ep_print_info (UCX 1.13 has
  // no query for it): the transport of the first rma_bw lane.
  topology::PathType detect_path_type(ucp_ep_h ep) const {
    char* text = nullptr;
    std::size_t size = 0;
    FILE* stream = open_memstream(&text, &size);
    if (stream == nullptr) return topology::PathType::kTcp;
    ucp_ep_print_info(ep, stream);
    std::fclose(stream);
    const std::string info(text, size);
    std::free(text);
    std::string_view transport;
    std::string_view rest(info);
    while (!rest.empty()) {
      const auto eol = rest.find('\n');
      const std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view{} : rest.substr(eol + 1);
      if (line.find("rma_bw#0") == std::string_view::npos) continue;
      // "#  lane[1]:  1:tcp/lo.0 md[0] -> md[0]/tcp/sysdev[255] rma_bw#0 am …"
      const auto lane = line.find("]:");
      if (lane == std::string_view::npos) continue;
      std::string_view tail = line.substr(lane + 2);
      const auto colon = tail.find(':');
      const auto slash = tail.find('/');
      if (colon != std::string_view::npos && slash != std::string_view::npos && colon < slash) {
        transport = tail.substr(colon + 1, slash - colon - 1);
        break;
      }
    }
    if (transport.empty() || transport == "tcp") return topology::PathType::kTcp;
    for (std::string_view shm : {"cma", "posix", "sysv", "knem", "xpmem", "self"}) {
      if (transport == shm) return topology::PathType::kShm;
    }
    return topology::PathType::kRdma;  // rc_verbs, rc_mlx5, dc_mlx5, ud_…
  }

  void set_path_type(PathId id, topology::PathType type) {
    PathInfo& info = infos[id];
    info.type = type;
    if (const auto cost = topology::CostModel().cost(type, topology::Proximity::kLocal)) {
      info.bandwidth_gbps = cost->bandwidth_gbps;
      info.latency_us = cost->latency_us;
    }
  }

  // --- acting on what callbacks recorded ------------------------------------

  // A lane's first message: the session token its welcome carried. Notes
  // the endpoint it arrives on here as that session's; once every lane is
  // bound, the control connection says the path is ready.
  void handle_bind(const Inbound& in) {
    if (in.reply_ep == nullptr || in.payload.size() != sizeof(std::uint64_t)) {
      spdlog::warn("ucx: a lane binding without a reply endpoint or a token; dropped");
      return;
    }
    std::uint64_t token = 0;
    std::memcpy(&token, in.payload.data(), sizeof token);
    const auto it = session_by_token.find(token);
    if (it == session_by_token.end()) {
      spdlog::warn("ucx: a lane binding with an unknown session token; dropped");
      return;
    }
    const std::uint64_t id = it->second;
    Session& session = sessions.at(id);
    // UCX may have reused the address of a departed peer's endpoint.
    if (auto old = session_by_ep.find(in.reply_ep); old != session_by_ep.end() && old->second != id) {
      sessions.at(old->second).bound.erase(in.reply_ep);
    }
    if (!session.bound.contains(in.reply_ep) && session.bound.size() >= session.lanes) {
      spdlog::warn("ucx: {} bound more than the {} lanes it announced; dropped", session.name, session.lanes);
      return;
    }
    session.bound.insert(in.reply_ep);
    session_by_ep[in.reply_ep] = id;
    if (session.bound.size() == session.lanes && !session.ready_sent) {
      session.ready_sent = true;
      tell(id, ControlKind::kReady, {});
    }
  }

  // Our endpoints to an initiator on one rail failed: those close, and the
  // session goes on over the others; the last rail ends the session.
  void fail_back_rail(const BackError& e) {
    const auto it = sessions.find(e.session);
    if (it == sessions.end()) return;
    Session& session = it->second;
    const bool others = std::any_of(session.back.begin(), session.back.end(), [&](const auto& b) {
      return b->rail != e.rail && b->ep != nullptr;
    });
    const std::string why = fmt::format("our endpoint to it{} failed: {}", rail_name(e.rail), ucs_status_string(e.status));
    if (!others || !config.peer_failure_detection) {
      close_session(e.session, why);
      return;
    }
    spdlog::warn("ucx: peer {}: {}; answering over the other rails", session.name, why);
    for (auto& back : session.back) {
      if (back->rail != e.rail || back->ep == nullptr) continue;
      close_endpoint(back->ep);
      back->ep = nullptr;
    }
  }

  // The lane a listener's message is for, or null when it is stale or forged.
  Lane* lane_of(const MessageHeader& header) {
    if (header.path >= peers.size()) return nullptr;
    Peer& peer = peers[header.path];
    if (peer.state == PathState::kFailed || header.lane >= peer.lanes.size()) return nullptr;
    Lane* lane = peer.lanes[header.lane].get();
    return lane->ep == nullptr ? nullptr : lane;
  }

  void handle_recorded() {
    // Acting may record more (a forced close completes requests at once), so
    // go round until nothing is left.
    while (!lane_errors.empty() || !back_errors.empty() || !inbox.empty()) {
      for (const BackError& e : std::exchange(back_errors, {})) fail_back_rail(e);
      for (auto [lane, status] : std::exchange(lane_errors, {})) {
        if (lane->ep == nullptr) continue;
        fail_rail(lane->path, lane->rail,
                  Status::unavailable("path {} to {}: lane {}{} failed: {}", lane->path, peers[lane->path].address,
                                      lane->index, rail_name(lane->rail), ucs_status_string(status)));
      }
      for (Inbound& in : std::exchange(inbox, {})) {
        auto header = ucx::decode_header(in.header);
        if (!header) {
          spdlog::warn("ucx: dropped a message: {}", header.error().message());
          continue;
        }
        switch (in.kind) {
          case MessageKind::kQuery: handle_bind(in); break;
          case MessageKind::kWriteData:
          case MessageKind::kReadAsk: handle_slice_request(in, *header); break;
          case MessageKind::kWriteDone:
          case MessageKind::kReadData: handle_slice_reply(in, *header); break;
          case MessageKind::kSliceBundle: handle_bundle(in, *header); break;
          case MessageKind::kReplyBundle: handle_bundle_reply(in, *header); break;
        }
        buffers.give(std::move(in.copy));
      }
    }
  }

  // --- the listener's control connections -----------------------------------

  void watch(ControlConnection& conn, bool& write_watched) {
    if (conn.wants_write() != write_watched) {
      write_watched = conn.wants_write();
      poller->change(conn.fd(), write_watched);
    }
  }

  void close_session(std::uint64_t id, std::string_view why) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    Session& session = it->second;
    if (!session.authenticated) --unauthenticated;
    if (session.authenticated && !shut_down) {
      spdlog::info("ucx: peer {} ({}) left: {}", session.name, session.conn->remote(), why);
    } else {
      spdlog::debug("ucx: unauthenticated connection from {} closed: {}", session.conn->remote(), why);
    }
    poller->forget(session.conn->fd());
    // Our endpoints to it close; what still arrives on its lanes finds no
    // session and is dropped.
    for (auto& back : session.back) {
      if (back->ep != nullptr) close_endpoint(back->ep);
    }
    for (ucp_ep_h ep : session.bound) {
      if (auto it = session_by_ep.find(ep); it != session_by_ep.end() && it->second == id) session_by_ep.erase(it);
    }
    session_by_token.erase(session.token);
    for (auto& [base, r] : regions) r.awaiting.erase(id);
    sessions.erase(it);
  }

  // Sends a frame to a session; a peer that does not read loses its session.
  bool tell(std::uint64_t id, ControlKind kind, std::span<const std::uint8_t> body) {
    Session& session = sessions.at(id);
    if (Status s = session.conn->send(kind, body); !s.is_ok()) {
      close_session(id, s.message());
      return false;
    }
    return true;
  }

  void accept_connections(TimeNs now_ns) {
    if (!listener) return;
    if (!is_ready(listener->fd())) return;
    while (auto conn = listener->accept()) {
      if (unauthenticated >= config.max_unauthenticated) {
        ++refused_connections;
        spdlog::debug("ucx: {} handshakes under way; connection from {} closed", unauthenticated, conn->remote());
        continue;  // closes it
      }
      auto nonce = ucx::random_nonce();
      if (!nonce) {
        spdlog::error("ucx: {}", nonce.error().message());
        continue;
      }
      const std::uint64_t id = next_session++;
      ++unauthenticated;
      Session& session = sessions[id];
      session.conn = std::move(conn);
      session.nonce = *nonce;
      session.deadline_ns = now_ns + config.handshake_timeout_ms * 1'000'000;
      poller->watch(session.conn->fd(), false);
      tell(id, ControlKind::kChallenge, ucx::encode(ucx::Challenge{session.nonce}));
    }
  }

  // What an initiator's proof covers beside the nonces: its name and its
  // worker addresses, so none can be swapped on the way.
  static std::string self_description(const ucx::Hello& hello) {
    std::string out = hello.name;
    for (const auto& a : hello.worker_addresses) {
      out += fmt::format("|{}:", a.size());
      out.append(a.begin(), a.end());
    }
    return out;
  }

  // Our endpoints to an authenticated initiator's workers, carrying our
  // answers to its slices: one per lane, lane i's from the rail it arrives
  // on here to the rail it leaves from there.
  Status open_back_lanes(std::uint64_t id, const std::vector<std::vector<std::uint8_t>>& addresses) {
    Session& session = sessions.at(id);
    for (std::size_t i = 0; i < session.lanes; ++i) {
      auto back = std::make_unique<BackLane>();
      back->state = this;
      back->session = id;
      back->rail = i % rails.size();
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.address = reinterpret_cast<const ucp_address_t*>(addresses[i % addresses.size()].data());
      params.err_mode = config.peer_failure_detection ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      params.err_handler.cb = &State::on_back_error;
      params.err_handler.arg = back.get();
      if (!config.peer_failure_detection) params.field_mask &= ~UCP_EP_PARAM_FIELD_ERR_HANDLER;
      if (ucs_status_t st = ucp_ep_create(rails[back->rail].worker, &params, &back->ep); st != UCS_OK) {
        return Status::unavailable("cannot reach the worker of {}{}: {}", session.name, rail_name(back->rail),
                                   ucs_status_string(st));
      }
      session.back.push_back(std::move(back));
    }
    return Status::ok();
  }

  Status authenticate(std::uint64_t id, const Frame& frame) {
    Session& session = sessions.at(id);
    if (frame.kind != ControlKind::kHello) {
      return Status::invalid_argument("expected a hello, got frame kind {}", static_cast<int>(frame.kind));
    }
    auto hello = ucx::decode_hello(frame.body);
    if (!hello) return hello.error();
    if (!ucx::same_proof(hello->proof,
                         ucx::initiator_proof(secret, session.nonce, hello->nonce, self_description(*hello)))) {
      const std::string why = secret.empty() ? "authentication failed: this engine has no secret and the peer has one"
                                             : "authentication failed: the peer does not hold this engine's secret";
      (void)session.conn->send(ControlKind::kRefusal, ucx::encode_text(why));
      (void)session.conn->flush();
      return Status::permission_denied("{}", why);
    }
    auto token = ucx::random_token();
    if (!token) return token.error();
    session.authenticated = true;
    --unauthenticated;
    session.name = hello->name;
    session.token = *token;
    session.lanes = hello->lanes;
    session_by_token.emplace(session.token, id);
    if (Status s = open_back_lanes(id, hello->worker_addresses); !s.is_ok()) return s;
    ucx::Welcome welcome;
    welcome.proof = ucx::listener_proof(secret, session.nonce, hello->nonce);
    welcome.session = session.token;
    for (const Rail& rail : rails) welcome.worker_addresses.push_back(rail.worker_address);
    welcome.pid = static_cast<std::uint32_t>(getpid());
    welcome.cookie_address = reinterpret_cast<std::uintptr_t>(cookie.data());
    welcome.cookie = cookie;
    welcome.regions = tell_regions(session);
    spdlog::debug("ucx: peer {} ({}) authenticated", session.name, session.conn->remote());
    tell(id, ControlKind::kWelcome, ucx::encode(welcome));
    return Status::ok();
  }

  Status serve_frame(std::uint64_t id, const Frame& frame) {
    Session& session = sessions.at(id);
    switch (frame.kind) {
      case ControlKind::kRefresh: {
        auto seq = ucx::decode_seq(frame.body);
        if (!seq) return seq.error();
        tell(id, ControlKind::kRegions, ucx::encode(ucx::Regions{*seq, tell_regions(session)}));
        return Status::ok();
      }
      case ControlKind::kRevokeAck: {
        auto seq = ucx::decode_seq(frame.body);
        if (!seq) return seq.error();
        for (auto& [base, r] : regions) {
          if (r.revoking && r.revoke_seq == *seq) r.awaiting.erase(id);
        }
        return Status::ok();
      }
      case ControlKind::kNotify: {
        auto text = ucx::decode_text(frame.body, kMaxNotificationBytes);
        if (!text) return text.error();
        if (notifications.size() == ucx::kMaxPendingNotifications) {
          spdlog::warn("ucx: {} notifications not taken; dropping the oldest", notifications.size());
          notifications.pop_front();
        }
        notifications.push_back({session.name, std::move(*text)});
        return Status::ok();
      }
      default:
        return Status::invalid_argument("frame kind {} is not for a listener", static_cast<int>(frame.kind));
    }
  }

  // Session ids now: handling a frame may close a session (telling a peer
  // that does not read), so no loop walks the map itself while it acts.
  std::vector<std::uint64_t> session_ids() const {
    std::vector<std::uint64_t> ids;
    ids.reserve(sessions.size());
    for (const auto& [id, session] : sessions) ids.push_back(id);
    return ids;
  }

  void serve_sessions(TimeNs now_ns) {
    for (std::uint64_t id : session_ids()) {
      auto it = sessions.find(id);
      if (it == sessions.end()) continue;
      Session& session = it->second;
      const bool expired = !session.authenticated && now_ns >= session.deadline_ns;
      if (!is_ready(session.conn->fd()) && !session.conn->wants_write() && !expired) continue;
      const std::uint32_t bound = session.authenticated ? ucx::kMaxFrameBytes : ucx::kMaxHandshakeFrameBytes;
      Status status = session.conn->receive(bound + ucx::kFrameHeaderBytes);
      // Frames that arrived before a close still count (a notification, an ack).
      for (;;) {
        auto frame = session.conn->next(session.authenticated ? ucx::kMaxFrameBytes : ucx::kMaxHandshakeFrameBytes);
        if (!frame) {
          status = frame.error();
          break;
        }
        if (!*frame) break;
        Status handled = session.authenticated ? serve_frame(id, **frame) : authenticate(id, **frame);
        if (!handled.is_ok()) {
          status = handled;
          break;
        }
        if (!sessions.contains(id)) break;  // closed while telling it something
      }
      if (!sessions.contains(id)) continue;
      if (status.is_ok() && !session.authenticated && now_ns >= session.deadline_ns) {
        status = Status::timeout("no valid hello within {} ms", config.handshake_timeout_ms);
      }
      if (status.is_ok()) status = session.conn->flush();
      if (!status.is_ok()) {
        close_session(id, status.message());
        continue;
      }
      watch(*session.conn, session.write_watched);
    }
  }

  // Writes what control connections have queued since the last poll (a
  // notification, a revocation) and watches for writability where the
  // socket did not take it all, so a sleeping loop wakes to finish.
  void flush_control() {
    for (std::uint64_t id : session_ids()) {
      Session& session = sessions.at(id);
      if (!session.conn->wants_write()) continue;
      if (Status st = session.conn->flush(); !st.is_ok()) {
        close_session(id, st.message());
        continue;
      }
      watch(*session.conn, session.write_watched);
    }
    for (PathId id = 0; id < peers.size(); ++id) {
      Peer& peer = peers[id];
      if (peer.state == PathState::kFailed || !peer.control || !peer.control->wants_write()) continue;
      if (Status st = peer.control->flush(); !st.is_ok()) {
        fail_path(id, Status::unavailable("path {} to {}: {}", id, peer.address, st.message()));
        continue;
      }
      watch(*peer.control, peer.write_watched);
    }
  }

  void collect_ready() { all_ready = !poller->ready(ready_fds); }

  bool is_ready(int fd) const {
    return all_ready || std::find(ready_fds.begin(), ready_fds.end(), fd) != ready_fds.end();
  }

  // --- the initiator's control connections ----------------------------------

  static std::string_view stage_text(Stage stage) {
    switch (stage) {
      case Stage::kAwaitChallenge: return "waiting for the listener's challenge";
      case Stage::kAwaitWelcome: return "waiting for the listener's welcome";
      case Stage::kBinding: return "waiting for the listener to bind the lanes";
      case Stage::kDone: return "done";
    }
    return "?";
  }

  Status create_lanes(PathId id, const std::vector<std::vector<std::uint8_t>>& addresses) {
    Peer& peer = peers[id];
    for (auto& lane : peer.lanes) {
      lane->remote_rail = static_cast<std::size_t>(lane->index) % addresses.size();
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      params.address = reinterpret_cast<const ucp_address_t*>(addresses[lane->remote_rail].data());
      if (config.peer_failure_detection) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler.cb = &State::on_lane_error;
        params.err_handler.arg = lane.get();
      }
      if (ucs_status_t st = ucp_ep_create(rails[lane->rail].worker, &params, &lane->ep); st != UCS_OK) {
        lane->ep = nullptr;
        return Status::unavailable("cannot create endpoint {} to {}{}: {}", lane->index, peer.address,
                                   rail_name(lane->rail), ucs_status_string(st));
      }
    }
    return Status::ok();
  }

  Status welcome(PathId id, const Frame& frame, std::uint64_t& token) {
    Peer& peer = peers[id];
    if (frame.kind == ControlKind::kRefusal) {
      auto text = ucx::decode_text(frame.body, ucx::kMaxReasonBytes);
      return Status::permission_denied("{} refused us: {}", peer.address, text ? *text : "(unreadable reason)");
    }
    if (frame.kind != ControlKind::kWelcome) {
      return Status::invalid_argument("expected a welcome, got frame kind {}", static_cast<int>(frame.kind));
    }
    auto w = ucx::decode_welcome(frame.body);
    if (!w) return w.error();
    if (!ucx::same_proof(w->proof, ucx::listener_proof(secret, peer.challenge, peer.nonce))) {
      return Status::permission_denied("{} does not hold our secret (its proof is wrong)", peer.address);
    }
    if (Status s = create_lanes(id, w->worker_addresses); !s.is_ok()) return s;
    const auto pid = static_cast<pid_t>(w->pid);
    if (config.same_host_copy && ucx::cookie_matches(pid, w->cookie_address, w->cookie)) {
      peer.same_host_pid = pid;
      spdlog::debug("ucx: {} is process {} of this host: copying directly", peer.address, pid);
    }
    if (Status s = apply_regions(id, w->regions); !s.is_ok()) return s;
    token = w->session;
    return Status::ok();
  }

  Status initiator_frame(PathId id, const Frame& frame) {
    Peer& peer = peers[id];
    switch (peer.stage) {
      case Stage::kAwaitChallenge: {
        if (frame.kind != ControlKind::kChallenge) {
          return Status::invalid_argument("expected a challenge, got frame kind {}", static_cast<int>(frame.kind));
        }
        auto challenge = ucx::decode_challenge(frame.body);
        if (!challenge) return challenge.error();
        auto nonce = ucx::random_nonce();
        if (!nonce) return nonce.error();
        peer.nonce = *nonce;
        peer.challenge = challenge->nonce;
        ucx::Hello hello{peer.nonce, {}, address, static_cast<std::uint16_t>(peer.lanes.size()), {}};
        for (const Rail& rail : rails) hello.worker_addresses.push_back(rail.worker_address);
        hello.proof = ucx::initiator_proof(secret, peer.challenge, peer.nonce, self_description(hello));
        peer.stage = Stage::kAwaitWelcome;
        return peer.control->send(ControlKind::kHello, ucx::encode(hello));
      }
      case Stage::kAwaitWelcome: {
        std::uint64_t token = 0;
        if (Status s = welcome(id, frame, token); !s.is_ok()) return s;
        peer.stage = Stage::kBinding;
        std::vector<std::uint8_t> payload(sizeof token);
        std::memcpy(payload.data(), &token, sizeof token);
        for (auto& lane : peer.lanes) {
          MessageHeader bind;
          bind.path = id;
          bind.lane = static_cast<std::uint32_t>(lane->index);
          bind.seq = peer.hello_seq;
          if (Status s = send_message(lane->ep, MessageKind::kQuery, bind, payload); !s.is_ok()) return s;
        }
        return Status::ok();
      }
      case Stage::kBinding:
        if (frame.kind == ControlKind::kReady) {
          peer.stage = Stage::kDone;
          peer.state = PathState::kReady;
          direct_dirty = true;
          set_path_type(id, peer.same_host_pid != 0 ? topology::PathType::kShm : detect_path_type(peer.lanes[0]->ep));
          spdlog::debug("ucx: path {} ready: {}", id, infos[id].name());
          return Status::ok();
        }
        break;
      case Stage::kDone:
        break;
    }
    switch (frame.kind) {
      case ControlKind::kRegions: {
        auto update = ucx::decode_regions_update(frame.body);
        if (!update) return update.error();
        if (update->seq != 0 && update->seq == peer.refresh_seq) peer.refresh_seq = 0;
        return apply_regions(id, update->regions);
      }
      case ControlKind::kRevoke: {
        auto revoke = ucx::decode_revoke(frame.body);
        if (!revoke) return revoke.error();
        for (std::uint32_t key : revoke->keys) peer.regions.erase(key);
        direct_dirty = true;
        peer.revokes.push_back(std::move(*revoke));
        return Status::ok();
      }
      case ControlKind::kRefusal: {
        auto text = ucx::decode_text(frame.body, ucx::kMaxReasonBytes);
        return Status::unavailable("{} closed the path: {}", peer.address, text ? *text : "(unreadable reason)");
      }
      default:
        return Status::invalid_argument("frame kind {} is not for an initiator", static_cast<int>(frame.kind));
    }
  }

  // Acknowledges revocations once no slice of ours on that path still uses
  // one of the revoked regions (a posted RMA may land until it completed).
  Status acknowledge_revokes(PathId id) {
    Peer& peer = peers[id];
    if (peer.revokes.empty()) return Status::ok();
    // A copy on another thread may still use a revoked region through a table published before.
    if (direct_dirty) publish_direct();
    if (retired_in_use()) return Status::ok();
    std::set<std::uint32_t> busy;
    if (peer.inflight > 0) {
      for (const auto& [sid, op] : slices) {
        if (op->submit.path == id) busy.insert(op->remote->info.key);
      }
    }
    for (auto it = peer.revokes.begin(); it != peer.revokes.end();) {
      const bool in_use = std::any_of(it->keys.begin(), it->keys.end(), [&](auto k) { return busy.contains(k); });
      if (in_use) {
        ++it;
        continue;
      }
      if (Status s = peer.control->send(ControlKind::kRevokeAck, ucx::encode_seq(it->seq)); !s.is_ok()) return s;
      it = peer.revokes.erase(it);
    }
    return Status::ok();
  }

  void drive_paths(TimeNs now_ns) {
    for (PathId id = 0; id < peers.size(); ++id) {
      Peer& peer = peers[id];
      if (peer.state == PathState::kFailed || !peer.control) continue;
      const bool expired = peer.state == PathState::kConnecting && now_ns >= peer.deadline_ns;
      if (!is_ready(peer.control->fd()) && !peer.control->wants_write() && peer.revokes.empty() && !expired) continue;
      Status status = peer.control->flush();
      if (status.is_ok()) status = peer.control->receive(ucx::kMaxFrameBytes + ucx::kFrameHeaderBytes);
      for (;;) {
        auto frame = peer.control->next(ucx::kMaxFrameBytes);
        if (!frame) {
          status = frame.error();
          break;
        }
        if (!*frame) break;
        if (Status s = initiator_frame(id, **frame); !s.is_ok()) {
          status = s;
          break;
        }
      }
      if (status.is_ok() && peer.state == PathState::kReady) status = acknowledge_revokes(id);
      if (status.is_ok()) status = peer.control->flush();
      if (!status.is_ok()) {
        fail_path(id, Status(status.code() == StatusCode::kPermissionDenied ? StatusCode::kPermissionDenied
                                                                            : StatusCode::kUnavailable,
                             fmt::format("path {} to {}: {}", id, peer.address, status.message())));
        continue;
      }
      watch(*peer.control, peer.write_watched);
      if (peer.state == PathState::kConnecting && now_ns >= peer.deadline_ns) {
        fail_path(id, Status::unavailable("path {} to {}: handshake did not finish within {} ms ({})", id,
                                          peer.address, config.handshake_timeout_ms, stage_text(peer.stage)));
      }
    }
  }

  // --- revocation -------------------------------------------------------------

  // Unmaps regions whose revocation every session acknowledged; dismisses
  // sessions that did not within the revoke timeout.
  void finish_revokes(TimeNs now_ns) {
    for (auto it = regions.begin(); it != regions.end();) {
      LocalRegion& r = it->second;
      if (!r.revoking) {
        ++it;
        continue;
      }
      if (r.revoke_deadline_ns == 0) r.revoke_deadline_ns = now_ns + config.revoke_timeout_ms * 1'000'000;
      if (!r.awaiting.empty() && now_ns >= r.revoke_deadline_ns) {
        for (std::uint64_t id : std::set(r.awaiting)) {
          close_session(id, fmt::format("did not acknowledge the revocation of region {} within {} ms", r.handle,
                                        config.revoke_timeout_ms));
        }
      }
      // A copy on another thread may still be in it (copy_direct).
      if (!r.awaiting.empty() || retired_in_use()) {
        ++it;
        continue;
      }
      unmap(r);
      region_base.erase(r.handle);
      it = regions.erase(it);
    }
  }

  // The copier, made and watched on first use; false (copy inline) when the
  // kernel refuses its eventfd.
  bool cma_copier() {
    if (copier) return true;
    auto made = ucx::CmaCopier::create();
    if (!made) {
      spdlog::warn("ucx: CMA copies stay on the loop: {}", made.error().message());
      return false;
    }
    copier = std::move(*made);
    poller->watch(copier->fd(), false);
    return true;
  }

  // CMA copies the copier finished become completions. A copy that failed
  // because its holder is exiting fails the holder's path at once: that
  // shows within a millisecond of a SIGKILL, while its control connection
  // closes only after the kernel tore down its memory.
  void collect_copies() {
    if (workers) {
      workers->take(worker_done);
      for (std::uint64_t tag : worker_done) {
        if (const auto it = slices.find(tag); it != slices.end()) finished.push_back(it->second.get());
      }
      worker_done.clear();
    }
    if (!copier) return;
    for (ucx::CmaCopier::Done& done : copier->take()) {
      const auto it = slices.find(done.tag);
      if (it == slices.end()) continue;
      SliceOp& op = *it->second;
      if (!done.status.is_ok()) op.error = done.status.message();
      finished.push_back(&op);
      const PathId path = op.submit.path;
      if (done.holder_exiting && peers[path].state != PathState::kFailed) {
        fail_path(path, Status::unavailable("path {} to {}: its process {} died", path, peers[path].address,
                                            peers[path].same_host_pid));
      }
    }
  }

  // A same-host holder with slices in flight that is exiting fails its path
  // at once: a SIGKILLed process shows PF_EXITING within a millisecond,
  // while its control connection closes only after the kernel tore down its
  // memory (~0.1 ms per MiB), and a CMA copy from it may block until then.
  // Only while slices are in flight, so an idle engine reads nothing.
  static constexpr TimeNs kHolderCheckNs = 500'000;
  void check_holders(TimeNs now_ns) {
    for (PathId id = 0; id < peers.size(); ++id) {
      Peer& peer = peers[id];
      if (peer.state != PathState::kReady || peer.same_host_pid == 0 || peer.inflight == 0) continue;
      if (now_ns < peer.next_holder_check_ns) continue;
      peer.next_holder_check_ns = now_ns + kHolderCheckNs;
      if (ucx::process_exiting(peer.same_host_pid)) {
        fail_path(id, Status::unavailable("path {} to {}: its process {} died", id, peer.address,
                                          peer.same_host_pid));
      }
    }
  }

  void hand_out(TimeNs now_ns, std::vector<Completion>& out) {
    for (SliceOp* op : std::exchange(finished, {})) {
      const SliceSubmit& s = op->submit;
      Completion c{s.id, s.path, s.lane, s.bytes, now_ns, Status::ok(), op->compressed ? op->wire_bytes : s.bytes};
      if (!op->error.empty()) {
        c.status = Status::unavailable("ucx: slice {} ({} bytes, path {} lane {}): {}", s.id, s.bytes, s.path, s.lane,
                                       op->error);
      } else if (op->status != UCS_OK) {
        c.status = Status::unavailable("ucx: slice {} ({} bytes, path {} lane {}) failed: {}", s.id, s.bytes,
                                       s.path, s.lane, ucs_status_string(op->status));
      }
      --op->local->inflight;
      Peer& peer = peers[s.path];
      --peer.inflight;
      --peer.rails[op->rail].inflight;
      peer.rails[op->rail].last_progress_ns = now_ns;
      out.push_back(std::move(c));
      slices.erase(s.id);
    }
  }


  void begin_shutdown() {
    if (shut_down) return;
    shut_down = true;
    if (listener) {
      poller->forget(listener->fd());
      listener.reset();
    }
    for (PathId id = 0; id < peers.size(); ++id) {
      fail_path(id, Status::unavailable("path {} to {}: the transport shut down", id, peers[id].address));
    }
    while (!sessions.empty()) close_session(sessions.begin()->first, "the transport shut down");
    publish_direct();
  }

  void teardown() {
    if (rails.empty() || rails.back().worker == nullptr) {  // create() failed part way
      for (Rail& rail : rails) {
        if (rail.worker != nullptr) ucp_worker_destroy(rail.worker);
        if (rail.context != nullptr) ucp_cleanup(rail.context);
      }
      rails.clear();
      return;
    }
    begin_shutdown();
    if (copier) {  // its copies finish first: they write into slices' memory
      poller->forget(copier->fd());
      copier.reset();
    }
    if (workers) {  // likewise
      poller->forget(workers->fd());
      workers.reset();
    }
    for (int i = 0; i < kTeardownRounds && !closing.empty(); ++i) {
      progress_once();
      reap_closing();
    }
    if (!closing.empty()) {
      spdlog::warn("ucx: {} endpoint closes did not finish at shutdown", closing.size());
      for (void* r : std::exchange(closing, {})) ucp_request_free(r);
    }
    // Whatever UCX still holds must not call back into freed records.
    for (auto& [id, op] : slices) {
      if (op->request != nullptr) ucp_request_free(op->request);
    }
    for (auto& [key, group] : flushes) {
      if (group->request != nullptr) ucp_request_free(group->request);
    }
    flushes.clear();
    for (auto& [msg, holder] : outgoing) {
      if (holder->request != nullptr) ucp_request_free(holder->request);
    }
    // rkeys live in the worker's memory pools: release them before it.
    finished.clear();
    slices.clear();
    to_flush.clear();
    peers.clear();
    for (auto& [base, r] : regions) unmap(r);
    regions.clear();
    inbox.clear();  // payloads UCX lent go back to their workers first
    for (Rail& rail : rails) ucp_worker_destroy(rail.worker);
    outgoing.clear();
    for (Rail& rail : rails) ucp_cleanup(rail.context);
    rails.clear();
  }
};

// --- UcxTransport ------------------------------------------------------------

namespace {

// Each NIC names a device of this machine: a network interface ("eth1") or
// an RDMA device and port ("mlx5_0:1"); every rail needs a lane. A NIC named
// twice gets two rails (two workers, more sockets to each peer).
Status check_nics(const UcxConfig& config) {
  if (config.nics.size() > ucx::kMaxRails) {
    return Status::invalid_argument("UcxTransport::create: {} NICs (at most {})", config.nics.size(), ucx::kMaxRails);
  }
  if (!config.nics.empty() && static_cast<std::size_t>(config.lanes_per_peer) < config.nics.size()) {
    return Status::invalid_argument(
        "UcxTransport::create: {} lanes for {} NICs (every NIC needs a lane: lanes_per_peer >= NICs)",
        config.lanes_per_peer, config.nics.size());
  }
  for (const std::string& nic : config.nics) {
    if (nic.empty() || nic.size() > 64 || nic.find_first_of(", \t\n/") != std::string::npos) {
      return Status::invalid_argument("UcxTransport::create: NIC \"{}\" is not a device name", nic);
    }
    const auto colon = nic.find(':');
    if (colon != std::string::npos) {
      if (!std::filesystem::exists("/sys/class/infiniband/" + nic.substr(0, colon))) {
        return Status::invalid_argument("UcxTransport::create: NIC \"{}\": no such RDMA device here", nic);
      }
      continue;
    }
    if (::if_nametoindex(nic.c_str()) == 0) {
      return Status::invalid_argument("UcxTransport::create: NIC \"{}\": no such network interface here", nic);
    }
    // UCX leaves out an interface that is not up and running, and the rail
    // would then have no network device at all.
    std::string state;
    std::ifstream("/sys/class/net/" + nic + "/operstate") >> state;
    if (state == "down") {
      return Status::unavailable("UcxTransport::create: NIC \"{}\" is down", nic);
    }
  }
  return Status::ok();
}

}  // namespace

UcxTransport::UcxTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}
UcxTransport::~UcxTransport() = default;

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxConfig config) {
  if (config.lanes_per_peer < 1 || config.lanes_per_peer > ucx::kMaxLanes) {
    // A peer's handshake refuses more (control_wire.h).
    return std::unexpected(Status::invalid_argument("UcxTransport::create: lanes_per_peer is {} (expected 1..{})",
                                                    config.lanes_per_peer, ucx::kMaxLanes));
  }
  if (config.stall_timeout_ms < 0) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: stall_timeout_ms is {} (expected >= 0; 0: never)", config.stall_timeout_ms));
  }
  if (config.handshake_timeout_ms <= 0) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: handshake_timeout_ms is {} (expected > 0)", config.handshake_timeout_ms));
  }
  if (config.revoke_timeout_ms <= 0) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: revoke_timeout_ms is {} (expected > 0)", config.revoke_timeout_ms));
  }
  if (config.max_unauthenticated < 1) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: max_unauthenticated is {} (expected >= 1)", config.max_unauthenticated));
  }
  if (config.tcp_segment_bytes != 0 &&
      (config.tcp_segment_bytes < kMinTcpSegmentBytes || config.tcp_segment_bytes > kMaxTcpSegmentBytes)) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: tcp_segment_bytes is {} (expected 0 for UCX's default, or {} .. {})",
        config.tcp_segment_bytes, kMinTcpSegmentBytes, kMaxTcpSegmentBytes));
  }
  if (config.copy_threads < -1 || config.copy_threads > kMaxCopyThreads) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: copy_threads is {} (expected -1 for one per 8 cores, 0 for none, or up to {})",
        config.copy_threads, kMaxCopyThreads));
  }
  if (Status s = check_nics(config); !s.is_ok()) return std::unexpected(s);
  auto listen = ucx::parse_socket_address(config.listen_address);
  if (!listen) return std::unexpected(listen.error());

  auto state = std::make_unique<State>();
  // The secret: said, else its file, else $BATON_TOKEN_FILE.
  state->secret = config.secret;
  std::string secret_file = config.secret_file;
  if (state->secret.empty() && secret_file.empty()) {
    if (const char* env = std::getenv("BATON_TOKEN_FILE"); env != nullptr) secret_file = env;
  }
  if (state->secret.empty() && !secret_file.empty()) {
    auto read = read_secret_file(secret_file);
    if (!read) return std::unexpected(read.error());
    state->secret = std::move(*read);
  }
  if (!state->secret.empty() &&
      (state->secret.size() < kMinSecretBytes || state->secret.size() > kMaxSecretBytes)) {
    return std::unexpected(Status::invalid_argument("UcxTransport::create: the secret has {} bytes (expected {}..{})",
                                                    state->secret.size(), kMinSecretBytes, kMaxSecretBytes));
  }
  if (state->secret.empty()) {
    if (!ucx::is_loopback(listen->get()) && !config.allow_unauthenticated) {
      return std::unexpected(Status::invalid_argument(
          "UcxTransport::create: listening on {} without a secret would let any host that reaches it read and write "
          "the memory peers are given: set a secret (--token-file, BATON_TOKEN_FILE, UcxConfig::secret), listen on "
          "loopback, or say allow_unauthenticated",
          config.listen_address));
    }
    if (ucx::is_loopback(listen->get())) {
      spdlog::debug("ucx: no secret: listening on loopback {} only, for processes of this host",
                    config.listen_address);
    } else {
      spdlog::warn("ucx: no secret, and listening on {}: any host that reaches it is a peer (allow_unauthenticated)",
                   config.listen_address);
    }
  }
  state->config = std::move(config);
  state->config.secret.clear();  // kept once, in state->secret
  const UcxConfig& cfg = state->config;

  std::vector<std::string> nics = cfg.nics;
  if (nics.empty()) nics.emplace_back();  // one rail on whatever UCX picks
  for (const std::string& nic : nics) {
    auto rail = State::make_rail(cfg, nic, state.get());
    if (!rail) return std::unexpected(rail.error());
    state->rails.push_back(std::move(*rail));
  }

  auto cookie = ucx::random_nonce();
  if (!cookie) return std::unexpected(cookie.error());
  std::copy_n(cookie->begin(), ucx::kCookieBytes, state->cookie.begin());

  auto poller = ucx::Poller::create();
  if (!poller) return std::unexpected(poller.error());
  state->poller = std::move(*poller);
  for (const State::Rail& rail : state->rails) state->poller->watch(rail.worker_fd, false);
  auto listener = ucx::ControlListener::open(*listen);
  if (!listener) {
    return std::unexpected(Status::unavailable("UcxTransport::create: {}", listener.error().message()));
  }
  state->listener = std::move(*listener);
  state->poller->watch(state->listener->fd(), false);
  if (const int threads = copy_threads_for(cfg); threads > 0 && cfg.same_host_copy) {
    auto workers = ucx::CopyWorkers::create(threads);
    if (!workers) return std::unexpected(workers.error());
    state->workers = std::move(*workers);
    state->poller->watch(state->workers->fd(), false);
  }
  state->address = state->listener->address();
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(state)));
}

const std::string& UcxTransport::address() const { return state_->address; }

Result<RegionHandle> UcxTransport::register_memory(void* addr, std::size_t length, MemoryKind kind) {
  State& s = *state_;
  const auto base = reinterpret_cast<std::uintptr_t>(addr);
  if (addr == nullptr) {
    return std::unexpected(Status::invalid_argument("UcxTransport::register_memory: address is null (length {})",
                                                    length));
  }
  if (length == 0) {
    return std::unexpected(Status::invalid_argument("UcxTransport::register_memory: length is 0 (address {})",
                                                    addr));
  }
  if (base + length < base) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::register_memory: [{}, +{}) wraps around the address space", addr, length));
  }
  if (const LocalRegion* clash = find_overlapping(s.regions, base, length); clash != nullptr) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::register_memory: [{:#x}, +{}) overlaps region {} [{:#x}, +{})", base, length,
        clash->handle, clash->base, clash->length));
  }
  // UCX maps an unmapped range without complaint (nothing pins it here);
  // the first copy would then fail with EFAULT, blaming neither side.
  if (kind == MemoryKind::kDram && !ucx::all_mapped(addr, length)) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::register_memory: [{}, +{}) is not all mapped memory of this process", addr, length));
  }
  return s.map_region(addr, length, kind);
}

Result<UcxTransport::AllocatedRegion> UcxTransport::allocate_memory(std::size_t length, int numa_node) {
  if (length == 0) {
    return std::unexpected(Status::invalid_argument("UcxTransport::allocate_memory: length is 0"));
  }
  if (numa_node < -1) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::allocate_memory: numa_node is {} (expected -1 or a node)", numa_node));
  }
  // UCX backs it with /dev/shm, which is RAM: too large a size would fill it
  // until the OOM killer picks a victim, and leave the segment behind.
  if (Status s = check_shared_allocation("UcxTransport::allocate_memory", length); !s.is_ok()) {
    return std::unexpected(s);
  }
  auto handle = state_->map_region(nullptr, length, MemoryKind::kDram, numa_node);
  if (!handle) return std::unexpected(handle.error());
  return AllocatedRegion{*handle, reinterpret_cast<void*>(state_->region_base.at(*handle))};
}

Status UcxTransport::unregister(RegionHandle handle) {
  State& s = *state_;
  auto it = s.region_base.find(handle);
  if (it == s.region_base.end()) {
    return Status::not_found("UcxTransport::unregister: no region {} (never registered, or already unregistered)",
                             handle);
  }
  LocalRegion& region = s.regions.at(it->second);
  if (region.revoking) {
    return Status::failed_precondition("UcxTransport::unregister: region {} is already being unregistered", handle);
  }
  if (region.inflight > 0) {
    return Status::invalid_argument(
        "UcxTransport::unregister: region {} has {} slices in flight; unregister after their completions",
        handle, region.inflight);
  }
  // Every peer that was told of it must forget it (and finish what it
  // posted there) before the memory goes; poll() unmaps it then.
  region.revoking = true;
  region.revoke_seq = s.next_revoke++;
  s.publish_direct();  // no new copy_direct starts in it; poll() unmaps it once running ones ended
  for (std::uint64_t id : s.session_ids()) {
    if (!s.sessions.at(id).sent.erase(handle)) continue;
    if (s.tell(id, ControlKind::kRevoke, ucx::encode(ucx::Revoke{region.revoke_seq, {handle}}))) {
      region.awaiting.insert(id);
    }
  }
  if (region.awaiting.empty() && !s.retired_in_use()) {
    s.unmap(region);
    s.regions.erase(it->second);
    s.region_base.erase(it);
  }
  return Status::ok();
}

bool UcxTransport::unregister_pending(RegionHandle handle) const {
  const auto it = state_->region_base.find(handle);
  return it != state_->region_base.end() && state_->regions.at(it->second).revoking;
}

Status UcxTransport::export_region(RegionHandle handle, const std::vector<std::string>& peers) {
  State& s = *state_;
  auto it = s.region_base.find(handle);
  if (it == s.region_base.end()) {
    return Status::not_found("UcxTransport::export_region: no region {}", handle);
  }
  LocalRegion& region = s.regions.at(it->second);
  if (region.revoking) {
    return Status::failed_precondition("UcxTransport::export_region: region {} is being unregistered", handle);
  }
  for (const std::string& name : peers) {
    if (name.empty() || name.size() > ucx::kMaxNameBytes) {
      return Status::invalid_argument("UcxTransport::export_region: peer name \"{}\" (expected 1..{} bytes)", name,
                                      ucx::kMaxNameBytes);
    }
    // A peer is named by its listen address, which always has a port.
    auto split = split_host_port(name);
    if (!split || split->port == 0) {
      return Status::invalid_argument("UcxTransport::export_region: peer \"{}\" is not a listen address: {}", name,
                                      split ? "port 0" : split.error().message());
    }
  }
  if (peers.empty()) {
    region.exported_all = true;
  } else {
    region.exported_to.insert(peers.begin(), peers.end());
  }
  // Peers connected now learn it at once; later ones in their welcome.
  std::vector<std::uint64_t> told;
  for (auto& [id, session] : s.sessions) {
    if (s.visible(region, session) && !session.sent.contains(handle)) told.push_back(id);
  }
  for (std::uint64_t id : told) {
    State::Session& session = s.sessions.at(id);
    s.tell(id, ControlKind::kRegions, ucx::encode(ucx::Regions{0, s.tell_regions(session)}));
  }
  return Status::ok();
}

Result<std::vector<std::uint8_t>> UcxTransport::packed_rkey(RegionHandle handle) const {
  auto it = state_->region_base.find(handle);
  if (it == state_->region_base.end()) {
    return std::unexpected(Status::not_found("UcxTransport::packed_rkey: no region {}", handle));
  }
  return state_->regions.at(it->second).packed_rkeys.front();
}

Result<PathId> UcxTransport::connect(std::string_view peer_address, TimeNs now_ns) {
  State& s = *state_;
  if (s.shut_down) {
    return std::unexpected(Status::unavailable("UcxTransport::connect: {}: the transport shut down", peer_address));
  }
  auto target = ucx::parse_socket_address(peer_address);
  if (!target) {
    return std::unexpected(Status::invalid_argument("UcxTransport::connect: {}", target.error().message()));
  }
  if (ucx::port_of(target->get()) == 0) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::connect: address \"{}\" has port 0", peer_address));
  }
  const std::string address = ucx::format_socket_address(target->get());
  for (PathId id = 0; id < s.peers.size(); ++id) {
    if (s.peers[id].address == address && s.peers[id].state != PathState::kFailed) return id;
  }

  const auto id = static_cast<PathId>(s.peers.size());
  auto control = ControlConnection::dial(*target);
  if (!control) return std::unexpected(control.error());
  State::Peer peer;
  peer.address = address;
  peer.deadline_ns = now_ns + s.config.handshake_timeout_ms * 1'000'000;
  peer.hello_seq = peer.next_seq++;
  peer.rails.assign(s.rails.size(), State::RailLoad{0, now_ns, false});
  peer.control = std::move(*control);
  for (int i = 0; i < s.config.lanes_per_peer; ++i) {
    auto lane = std::make_unique<State::Lane>();
    lane->state = &s;
    lane->path = id;
    lane->index = i;
    lane->rail = static_cast<std::size_t>(i) % s.rails.size();
    peer.lanes.push_back(std::move(lane));  // endpoints come with the welcome
  }
  s.poller->watch(peer.control->fd(), peer.control->wants_write());
  peer.write_watched = peer.control->wants_write();
  s.peers.push_back(std::move(peer));
  PathInfo info{s.address, address, topology::PathType::kTcp, s.config.lanes_per_peer, 0, 0};
  s.infos.push_back(std::move(info));
  s.set_path_type(id, topology::PathType::kTcp);  // until UCX says what it chose
  return id;
}

PathState UcxTransport::path_state(PathId path) const {
  return path < state_->peers.size() ? state_->peers[path].state : PathState::kFailed;
}

Status UcxTransport::path_status(PathId path) const {
  const State& s = *state_;
  if (path >= s.peers.size()) {
    return Status::invalid_argument("UcxTransport: unknown path {} ({} paths)", path, s.peers.size());
  }
  const State::Peer& peer = s.peers[path];
  switch (peer.state) {
    case PathState::kReady: return Status::ok();
    case PathState::kConnecting:
      return Status::unavailable("path {} to {}: handshake not finished ({})", path, peer.address,
                                 State::stage_text(peer.stage));
    case PathState::kFailed: return peer.error;
  }
  return peer.error;
}

Status UcxTransport::refresh_regions(PathId path) {
  State& s = *state_;
  if (Status st = path_status(path); !st.is_ok()) return st;
  State::Peer& peer = s.peers[path];
  if (peer.refresh_seq != 0) return Status::ok();  // the answer on its way will do
  const std::uint64_t seq = peer.next_seq++;
  if (Status st = peer.control->send(ControlKind::kRefresh, ucx::encode_seq(seq)); !st.is_ok()) return st;
  peer.refresh_seq = seq;
  return Status::ok();
}

bool UcxTransport::refresh_pending(PathId path) const {
  return path < state_->peers.size() && state_->peers[path].refresh_seq != 0;
}

Result<std::vector<RemoteRegion>> UcxTransport::remote_regions(PathId path) const {
  const State& s = *state_;
  if (path >= s.peers.size()) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::remote_regions: unknown path {} ({} paths)", path, s.peers.size()));
  }
  std::vector<RemoteRegion> out;
  for (const auto& [key, region] : s.peers[path].regions) out.push_back(region->info);
  return out;
}

Result<RemoteRegion> UcxTransport::remote_region(PathId path, RegionHandle key) const {
  const State& s = *state_;
  if (path >= s.peers.size()) {
    return std::unexpected(Status::invalid_argument("UcxTransport::remote_region: unknown path {} ({} paths)", path,
                                                    s.peers.size()));
  }
  const auto it = s.peers[path].regions.find(key);
  if (it == s.peers[path].regions.end()) {
    return std::unexpected(Status::not_found("peer {} has no region {} (a refresh of the peer learns new ones)",
                                             s.peers[path].address, key));
  }
  return it->second->info;
}

Result<RemoteRegion> UcxTransport::find_remote_region(PathId path, std::uint64_t remote_addr,
                                                      std::uint64_t length) const {
  const State& s = *state_;
  if (path >= s.peers.size()) {
    return std::unexpected(Status::invalid_argument("UcxTransport::find_remote_region: unknown path {} ({} paths)",
                                                    path, s.peers.size()));
  }
  for (const auto& [key, region] : s.peers[path].regions) {
    const RemoteRegion& r = region->info;
    if (remote_addr >= r.base && length <= r.length && remote_addr - r.base <= r.length - length) return r;
  }
  return std::unexpected(Status::out_of_range(
      "UcxTransport::find_remote_region: [{:#x}, +{}) is not inside a region of peer {} ({} known regions)",
      remote_addr, length, s.peers[path].address, s.peers[path].regions.size()));
}

Status UcxTransport::notify(PathId path, std::string_view message) {
  State& s = *state_;
  if (message.size() > kMaxNotificationBytes) {
    return Status::invalid_argument("UcxTransport::notify: the message has {} bytes (at most {})", message.size(),
                                    kMaxNotificationBytes);
  }
  if (Status st = path_status(path); !st.is_ok()) return st;
  // Over the control connection: the listener knows who sent it. A write's
  // bytes are at the peer when its slice completed, so they precede this.
  return s.peers[path].control->send(ControlKind::kNotify, ucx::encode_text(message));
}

std::vector<Notification> UcxTransport::take_notifications() {
  std::vector<Notification> out(std::make_move_iterator(state_->notifications.begin()),
                                std::make_move_iterator(state_->notifications.end()));
  state_->notifications.clear();
  return out;
}

int UcxTransport::event_fd() const { return state_->poller->fd(); }

bool UcxTransport::arm() {
  State& s = *state_;
  if (!s.finished.empty() || !s.inbox.empty() || !s.lane_errors.empty()) return false;
  if (s.workers && !s.workers->arm()) return false;
  s.flush_lanes();  // writes submitted since the last poll: their flush goes before we sleep
  // Revocations and handshakes have deadlines (next_event_ns); frames queued
  // since the last poll go now, or the poller watches for writability.
  s.flush_control();
  // UCX's rule for sleeping: progress until it reports nothing done, then
  // arm. Events it consumed but did not finish (a socket half read) would
  // not fire the fd again, and the loop would sleep on them.
  if (s.progress_once()) return false;
  for (State::Rail& rail : s.rails) {
    const ucs_status_t st = ucp_worker_arm(rail.worker);
    if (st != UCS_OK && st != UCS_ERR_BUSY) spdlog::warn("ucx: ucp_worker_arm: {}", ucs_status_string(st));
    if (st != UCS_OK) return false;
  }
  return true;
}

const std::vector<PathInfo>& UcxTransport::paths() const { return state_->infos; }

Status UcxTransport::submit(const SliceSubmit& slice, TimeNs now_ns) {
  State& s = *state_;
  if (slice.path >= s.peers.size()) {
    return Status::invalid_argument("UcxTransport::submit: slice {} names unknown path {} ({} paths)", slice.id,
                                    slice.path, s.peers.size());
  }
  State::Peer& peer = s.peers[slice.path];
  if (slice.lane < 0 || slice.lane >= static_cast<int>(peer.lanes.size())) {
    return Status::invalid_argument("UcxTransport::submit: slice {} names lane {} of path {} (expected 0..{})",
                                    slice.id, slice.lane, slice.path, peer.lanes.size() - 1);
  }
  if (slice.bytes == 0) {
    return Status::invalid_argument("UcxTransport::submit: slice {} has 0 bytes", slice.id);
  }
  const bool compress = slice.on_wire() != slice.bytes;
  if (compress && s.codec == nullptr) {
    return Status::failed_precondition(
        "UcxTransport::submit: slice {} asks for compression ({} payload bytes as ~{}) and no codec is set",
        slice.id, slice.bytes, slice.wire_bytes);
  }
  if (s.slices.contains(slice.id)) {
    return Status::already_exists("UcxTransport::submit: slice {} is already in flight", slice.id);
  }
  if (peer.state != PathState::kReady) {
    return Status::unavailable("UcxTransport::submit: slice {}: {}", slice.id, path_status(slice.path).message());
  }
  const SliceMemory& m = slice.memory;
  const auto local_addr = reinterpret_cast<std::uintptr_t>(m.local);
  LocalRegion* local = nullptr;
  if (auto next = s.regions.upper_bound(local_addr); m.local != nullptr && next != s.regions.begin()) {
    LocalRegion& r = std::prev(next)->second;
    if (slice.bytes <= r.length && local_addr - r.base <= r.length - slice.bytes) local = &r;
  }
  if (local == nullptr) {
    return Status::out_of_range(
        "UcxTransport::submit: slice {}: local range [{}, +{}) is not inside one registered region", slice.id,
        m.local, slice.bytes);
  }
  if (local->revoking) {
    return Status::failed_precondition("UcxTransport::submit: slice {}: local region {} is being unregistered",
                                       slice.id, local->handle);
  }
  auto remote_it = peer.regions.find(m.remote_key);
  if (remote_it == peer.regions.end()) {
    return Status::invalid_argument(
        "UcxTransport::submit: slice {}: remote_key {} is not a region of peer {} ({} known; refresh_regions "
        "learns new ones)",
        slice.id, m.remote_key, peer.address, peer.regions.size());
  }
  const RemoteRegion& remote = remote_it->second->info;
  if (m.remote_addr < remote.base || slice.bytes > remote.length ||
      m.remote_addr - remote.base > remote.length - slice.bytes) {
    return Status::out_of_range(
        "UcxTransport::submit: slice {}: remote range [{:#x}, +{}) is not inside region {} [{:#x}, +{}) of peer {}",
        slice.id, m.remote_addr, slice.bytes, remote.key, remote.base, remote.length, peer.address);
  }

  auto op = std::make_unique<State::SliceOp>();
  op->state = &s;
  op->submit = slice;
  op->local = local;
  op->remote = remote_it->second;
  if (peer.same_host_pid != 0 && !compress && local->kind == MemoryKind::kDram) {
    // A peer of this host: the copy is ours, done now (same_host.h).
    if (const auto& mapping = op->remote->mapping) {
      std::byte* there = mapping->address() + (m.remote_addr - remote.base);
      auto* here = static_cast<std::byte*>(m.local);
      // On the lane's datapath thread: it completes in collect_copies().
      if (s.workers && slice.bytes >= kMinThreadCopyBytes &&
          s.workers->post(slice.path * peer.lanes.size() + static_cast<std::size_t>(slice.lane),
                          m.op == Op::kRead ? ucx::CopyWorkers::Job{slice.id, here, there, slice.bytes}
                                            : ucx::CopyWorkers::Job{slice.id, there, here, slice.bytes})) {
        ++local->inflight;
        State::note_posted(peer, 0, now_ns);
        s.slices.emplace(slice.id, std::move(op));
        return Status::ok();
      }
      if (m.op == Op::kRead) {
        std::memcpy(m.local, there, slice.bytes);
      } else {
        std::memcpy(there, m.local, slice.bytes);
      }
    } else if (s.cma_copier()) {
      // CMA on the copier's thread: it completes in collect_copies().
      s.copier->submit({peer.same_host_pid, m.op, m.local, m.remote_addr, slice.bytes, slice.id});
      ++local->inflight;
      State::note_posted(peer, 0, now_ns);
      s.slices.emplace(slice.id, std::move(op));
      return Status::ok();
    } else if (Status st = ucx::cma_copy(peer.same_host_pid, m.op, m.local, m.remote_addr, slice.bytes);
               !st.is_ok()) {
      op->error = st.message();
    }
    ++local->inflight;
    State::note_posted(peer, 0, now_ns);
    s.finished.push_back(op.get());
    s.slices.emplace(slice.id, std::move(op));
    return Status::ok();
  }
  // A lane whose rail failed hands its slice to the next lane still open.
  std::size_t lane = static_cast<std::size_t>(slice.lane);
  for (std::size_t i = 0; i < peer.lanes.size() && peer.lanes[lane]->ep == nullptr; ++i) {
    lane = (lane + 1) % peer.lanes.size();
  }
  if (peer.lanes[lane]->ep == nullptr) {
    return Status::unavailable("UcxTransport::submit: slice {}: path {} has no open lane", slice.id, slice.path);
  }
  op->lane = static_cast<int>(lane);
  op->rail = peer.lanes[lane]->rail;
  ucp_ep_h ep = peer.lanes[lane]->ep;
  // Over TCP, slices travel as Baton's own active messages by default: UCX
  // 1.13's software RMA aborts the target process when an initiator dies
  // with puts or gets still in its socket (the completion it then cannot
  // send is fatal inside UCX), and a holder must outlive its clients.
  const bool as_messages = s.config.tcp_slices_as_messages && s.infos[slice.path].type == topology::PathType::kTcp &&
                           slice.bytes <= ucx::kMaxCompressedSliceBytes;
  if (compress || as_messages) {
    // A write goes compressed when the codec shrinks it (else raw, as a
    // message or as plain RMA below); a read asks the holder to compress,
    // which it does if it shrinks.
    SliceDescriptor d{m.remote_key, compress ? s.codec_id : WireCodec::kRaw, 0, m.remote_addr, slice.bytes};
    std::vector<std::uint8_t> payload;
    const auto* bytes = static_cast<const std::byte*>(m.local);
    if (!compress && slice.bytes <= kMaxBundledSliceBytes) {
      // A small raw slice waits for the rest of this turn's in its lane's bundle.
      const auto data = m.op == Op::kRead ? std::span<const std::uint8_t>()
                                          : std::span(reinterpret_cast<const std::uint8_t*>(bytes), slice.bytes);
      op->awaiting_reply = true;
      op->wire_bytes = ucx::kBundleEntryBytes + data.size();
      State::SliceOp& posted = *op;
      ++local->inflight;
      State::note_posted(peer, op->rail, now_ns);
      s.slices.emplace(slice.id, std::move(op));
      s.add_to_bundle(*peer.lanes[lane], m.op == Op::kRead ? MessageKind::kReadAsk : MessageKind::kWriteData, posted,
                      d, data);
      return Status::ok();
    }
    if (m.op == Op::kRead) {
      payload = ucx::encode_slice(d, {});
    } else if (auto [id, packed] = compress ? s.pack(s.codec_id, s.codec.get(), bytes, slice.bytes)
                                            : std::pair{WireCodec::kRaw, std::vector<std::uint8_t>{}};
               id != WireCodec::kRaw) {
      d.codec = id;
      payload = ucx::encode_slice(d, packed);
    } else if (as_messages) {
      d.codec = WireCodec::kRaw;
      payload = ucx::encode_slice(d, std::span(reinterpret_cast<const std::uint8_t*>(bytes), slice.bytes),
                                  s.buffers.take(ucx::kSliceDescriptorBytes + slice.bytes));
    }
    if (!payload.empty()) {
      MessageHeader header;
      header.path = slice.path;
      header.lane = static_cast<std::uint32_t>(lane);
      header.seq = slice.id;
      op->compressed = compress;
      op->awaiting_reply = true;
      op->wire_bytes = payload.size();
      const MessageKind kind = m.op == Op::kRead ? MessageKind::kReadAsk : MessageKind::kWriteData;
      if (Status st = s.send_message(ep, kind, header, std::move(payload)); !st.is_ok()) {
        return Status::unavailable("UcxTransport::submit: slice {}: {}", slice.id, st.message());
      }
      ++local->inflight;
      State::note_posted(peer, op->rail, now_ns);
      s.slices.emplace(slice.id, std::move(op));
      return Status::ok();
    }
  }
  ucp_rkey_h rkey = op->remote->rkeys[lane];

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  param.cb.send = &State::on_slice_request;
  param.user_data = op.get();
  param.memh = local->memh[op->rail];
  void* rma = m.op == Op::kWrite ? ucp_put_nbx(ep, m.local, slice.bytes, m.remote_addr, rkey, &param)
                                 : ucp_get_nbx(ep, m.local, slice.bytes, m.remote_addr, rkey, &param);
  if (UCS_PTR_IS_ERR(rma)) {
    return Status::unavailable("UcxTransport::submit: slice {} on path {} lane {}: {} failed: {}", slice.id,
                               slice.path, slice.lane, m.op == Op::kWrite ? "ucp_put_nbx" : "ucp_get_nbx",
                               ucs_status_string(UCS_PTR_STATUS(rma)));
  }
  if (rma != nullptr) {
    op->request = rma;
    ++op->pending;
  }
  if (m.op == Op::kWrite) {
    // Its bytes are at the peer once a flush after the put completed: the
    // lane's next flush (flush_lanes, before the loop polls or sleeps).
    ++op->pending;
    State::Lane& l = *peer.lanes[lane];
    if (l.unflushed.empty()) s.to_flush.push_back(&l);
    l.unflushed.push_back(op.get());
  }
  ++local->inflight;
  State::note_posted(peer, op->rail, now_ns);
  if (op->pending == 0) s.finished.push_back(op.get());
  s.slices.emplace(slice.id, std::move(op));
  return Status::ok();
}

CancelResult UcxTransport::cancel(SliceId /*id*/, TimeNs /*now_ns*/) { return {}; }

Status UcxTransport::set_codec(std::shared_ptr<const Codec> codec) {
  if (codec == nullptr) return Status::invalid_argument("UcxTransport::set_codec: no codec (null)");
  WireCodec id = WireCodec::kRaw;
  if (codec->name() == "lz4") id = WireCodec::kLz4;
  if (codec->name() == "zstd") id = WireCodec::kZstd;
  if (id == WireCodec::kRaw) {
    return Status::invalid_argument("UcxTransport::set_codec: codec \"{}\" has no wire id (lz4 or zstd travel)",
                                    codec->name());
  }
  state_->codec = std::move(codec);
  state_->codec_id = id;
  state_->codec_set = true;  // compressed slices need the loop: copy_direct refuses from now on
  return Status::ok();
}

void UcxTransport::poll(TimeNs now_ns, std::vector<Completion>& out) {
  State& s = *state_;
  s.flush_lanes();
  s.progress();
  s.handle_recorded();
  s.reap_closing();
  s.collect_ready();
  s.accept_connections(now_ns);
  s.serve_sessions(now_ns);
  s.drive_paths(now_ns);
  s.finish_revokes(now_ns);
  s.handle_recorded();  // a failed handshake's forced close completes its requests
  s.fail_stalled(now_ns);
  s.check_holders(now_ns);
  s.collect_copies();
  s.hand_out(now_ns, out);
  if (s.direct_dirty) s.publish_direct();
}

Status UcxTransport::copy_direct(std::span<const DirectCopy> copies, std::span<Status> results) const {
  if (results.size() != copies.size()) {
    return Status::invalid_argument("copy_direct: {} results for {} copies", results.size(), copies.size());
  }
  std::shared_ptr<const State::DirectTable> table;
  {
    std::lock_guard lock(state_->direct_mutex);
    table = state_->direct;
  }
  auto refuse = [](std::size_t i, std::string_view why) {
    return Status::failed_precondition("copy_direct: copy {}: {}", i, why);
  };
  if (!table || state_->codec_set) {
    return refuse(0, "no direct copies here (same_host_copy off, a codec set, or shut down)");
  }
  struct Resolved {
    std::byte* local = nullptr;
    const State::DirectTable::Remote* remote = nullptr;
    pid_t pid = 0;
  };
  thread_local std::vector<Resolved> resolved;  // per thread: no allocation per batch
  if (resolved.capacity() > 4096) resolved = {};   // ... nor does one huge batch stay pinned
  resolved.resize(copies.size());
  // A batch mostly names one peer and the same two regions: each lookup is
  // redone only when its key changes from the copy before.
  const State::DirectTable::Peer* peer = nullptr;
  std::string_view peer_name;
  const State::DirectTable::Local* local = nullptr;
  const State::DirectTable::Remote* remote = nullptr;
  for (std::size_t i = 0; i < copies.size(); ++i) {  // everything checked before anything is copied
    const DirectCopy& c = copies[i];
    if (peer == nullptr || c.peer != peer_name) {
      const auto it = table->peers.find(c.peer);
      if (it == table->peers.end()) return refuse(i, "not a ready same-host peer");
      peer = &it->second;
      peer_name = it->first;
      remote = nullptr;
    }
    if (local == nullptr || i == 0 || c.local != copies[i - 1].local) {
      const auto it = table->locals.find(c.local);
      local = it == table->locals.end() ? nullptr : &it->second;
    }
    if (remote == nullptr || c.remote != copies[i - 1].remote) {
      const auto it = peer->regions.find(c.remote);
      remote = it == peer->regions.end() ? nullptr : &it->second;
    }
    if (local == nullptr || remote == nullptr) return refuse(i, "unknown region");
    const std::uint64_t local_room = local->length, remote_room = remote->length;
    if (c.bytes == 0 || c.local_offset > local_room || c.bytes > local_room - c.local_offset ||
        c.remote_offset > remote_room || c.bytes > remote_room - c.remote_offset) {
      return refuse(i, "a range outside its region");
    }
    if (c.op != Op::kRead && c.op != Op::kWrite) return refuse(i, "unknown op");
    resolved[i] = {local->base + c.local_offset, remote, peer->pid};
  }
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const DirectCopy& c = copies[i];
    const Resolved& r = resolved[i];
    if (r.remote->mapping) {
      std::byte* there = r.remote->mapping->address() + c.remote_offset;
      if (c.op == Op::kRead) {
        std::memcpy(r.local, there, c.bytes);
      } else {
        std::memcpy(there, r.local, c.bytes);
      }
      if (!results[i].is_ok()) results[i] = Status::ok();  // a caller's reused span
    } else {
      results[i] = ucx::cma_copy(r.pid, c.op, r.local, r.remote->base + c.remote_offset, c.bytes);
    }
  }
  return Status::ok();
}

std::optional<TimeNs> UcxTransport::next_event_ns() const {
  std::optional<TimeNs> next;
  auto sooner = [&next](TimeNs t) {
    if (!next || t < *next) next = t;
  };
  for (const State::Peer& peer : state_->peers) {
    if (peer.state == PathState::kConnecting) sooner(peer.deadline_ns);
  }
  for (const auto& [id, session] : state_->sessions) {
    if (!session.authenticated && session.deadline_ns != 0) sooner(session.deadline_ns);
  }
  for (const auto& [base, r] : state_->regions) {
    if (r.revoking && r.revoke_deadline_ns != 0) sooner(r.revoke_deadline_ns);
  }
  for (const State::Peer& peer : state_->peers) {
    if (peer.state == PathState::kReady && peer.same_host_pid != 0 && peer.inflight > 0) {
      sooner(peer.next_holder_check_ns);
    }
  }
  return next;
}

bool UcxTransport::path_healthy(PathId path, TimeNs /*now_ns*/) const {
  return path_state(path) == PathState::kReady;
}

std::size_t UcxTransport::slices_in_flight() const { return state_->slices.size(); }

std::uint64_t UcxTransport::refused_connections() const { return state_->refused_connections; }

std::uint64_t UcxTransport::flushes_posted() const { return state_->flushes_posted; }
std::uint64_t UcxTransport::bundles_sent() const { return state_->bundles_sent; }
std::uint64_t UcxTransport::thread_copies() const { return state_->workers ? state_->workers->copies() : 0; }
int UcxTransport::copy_threads() const { return state_->workers ? static_cast<int>(state_->workers->size()) : 0; }

void UcxTransport::shutdown() { state_->begin_shutdown(); }

bool UcxTransport::shutdown_complete() const { return state_->shut_down && state_->closing.empty(); }

}  // namespace baton::transport
