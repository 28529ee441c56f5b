// UCP underneath the Transport interface.
//
// Ownership of UCX callbacks: every callback (request completion, endpoint
// error, connection request, active message) only records what happened in
// State; poll() acts on it after ucp_worker_progress returns. So no UCX call
// is made from inside UCX, and one place (poll) changes the transport's
// state. A request's callback runs exactly once when the post returned a
// request; a slice finishes when its last request did, and only then is its
// record (which UCX holds as user_data) released.
#include "baton/transport/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>

#include "baton/common/memory_budget.h"
#include "baton/topology/cost_model.h"
#include "baton/transport/codec.h"
#include "transport/ucx/socket_address.h"
#include "transport/ucx/wire.h"

namespace baton::transport {
namespace {

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

Status ucx_failure(std::string_view call, std::string_view what, ucs_status_t status) {
  return Status::unavailable("{}: {} failed: {}", call, what, ucs_status_string(status));
}

struct LocalRegion {
  RegionHandle handle = 0;
  std::uintptr_t base = 0;
  std::size_t length = 0;
  ucp_mem_h memh = nullptr;
  std::vector<std::uint8_t> packed_rkey;
  std::uint64_t inflight = 0;  // slices whose local range is here
};

// One region of a peer, with its rkey unpacked on each lane's endpoint.
// Shared by the peer's region table and the slices that use it, so a region
// the peer removes stays valid for the slices already posted on it.
struct RemoteRegionKeys {
  RemoteRegion info;
  std::vector<ucp_rkey_h> rkeys;  // per lane
  RemoteRegionKeys() = default;
  RemoteRegionKeys(const RemoteRegionKeys&) = delete;
  RemoteRegionKeys& operator=(const RemoteRegionKeys&) = delete;
  ~RemoteRegionKeys() {
    for (ucp_rkey_h k : rkeys) {
      if (k != nullptr) ucp_rkey_destroy(k);
    }
  }
};

}  // namespace

struct UcxTransport::State {
  struct Lane {
    State* state = nullptr;
    PathId path = 0;
    int index = 0;
    ucp_ep_h ep = nullptr;  // null once closed
    bool answered = false;  // the peer answered this lane's hello
  };

  struct Peer {
    std::string address;
    PathState state = PathState::kConnecting;
    Status error;
    std::vector<std::unique_ptr<Lane>> lanes;
    std::map<RegionHandle, std::shared_ptr<RemoteRegionKeys>> regions;
    std::optional<std::vector<RegionDescriptor>> hello_regions;  // until ready
    std::uint64_t next_seq = 1;
    std::uint64_t hello_seq = 0;
    std::uint64_t refresh_seq = 0;  // 0: no refresh pending
    TimeNs deadline_ns = 0;         // handshake
    int answered = 0;
    int inflight = 0;               // slices posted and not handed out
    TimeNs last_progress_ns = 0;    // the last completion, or the post that ended an idle stretch
  };

  // An endpoint our listener accepted: the serving side of someone's lane.
  struct Accepted {
    State* state = nullptr;
    ucp_ep_h ep = nullptr;
    bool identified = false;  // sent its hello: we know its path and lane
    std::uint32_t client_path = 0;
    std::uint32_t client_lane = 0;
    std::string client_address;
  };

  struct SliceOp {
    State* state = nullptr;
    SliceSubmit submit;
    LocalRegion* local = nullptr;
    std::shared_ptr<RemoteRegionKeys> remote;
    std::array<void*, 2> requests{};  // the RMA and, for writes, the flush
    int pending = 0;
    ucs_status_t status = UCS_OK;
    // A compressed slice travels as active messages (RMA moves exactly the
    // bytes it is given) and completes on the holder's reply.
    bool compressed = false;
    bool awaiting_reply = false;
    std::uint64_t wire_bytes = 0;
    std::string error;  // why the holder refused it
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
    std::vector<std::uint8_t> payload;
  };

  UcxConfig config;
  std::string address;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  int event_fd = -1;
  bool shut_down = false;

  std::map<std::uintptr_t, LocalRegion> regions;  // by base address
  std::map<RegionHandle, std::uintptr_t> region_base;
  RegionHandle next_region = 1;  // 0 is never a region: a default remote_key fails

  std::vector<Peer> peers;  // by PathId
  std::vector<PathInfo> infos;
  std::unordered_map<ucp_ep_h, std::unique_ptr<Accepted>> accepted;

  std::unordered_map<SliceId, std::unique_ptr<SliceOp>> slices;
  std::shared_ptr<const Codec> codec;  // for slices this side compresses (set_codec)
  WireCodec codec_id = WireCodec::kRaw;
  std::unique_ptr<Codec> lz4;   // what a peer's compressed slices name, made on first use
  std::unique_ptr<Codec> zstd;
  std::unordered_map<Outgoing*, std::unique_ptr<Outgoing>> outgoing;
  std::uint64_t outgoing_bytes = 0;  // payloads of messages UCX has not sent yet
  std::vector<void*> closing;  // ucp_ep_close_nbx requests
  std::deque<Notification> notifications;  // received, not yet taken

  // Recorded by callbacks, acted on by poll().
  std::vector<SliceOp*> finished;
  std::vector<Inbound> inbox;
  std::vector<ucp_conn_request_h> conn_requests;
  std::vector<std::pair<Lane*, ucs_status_t>> lane_errors;
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> accepted_errors;

  ~State() { teardown(); }

  // --- callbacks (record only) ----------------------------------------------

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    static_cast<State*>(arg)->conn_requests.push_back(request);
  }

  static void on_lane_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* lane = static_cast<Lane*>(arg);
    lane->state->lane_errors.emplace_back(lane, status);
  }

  static void on_accepted_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<State*>(arg)->accepted_errors.emplace_back(ep, status);
  }

  static void on_slice_request(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SliceOp*>(user_data);
    for (void*& r : op->requests) {
      if (r == request) r = nullptr;
    }
    ucp_request_free(request);
    if (status != UCS_OK && op->status == UCS_OK) op->status = status;
    if (--op->pending == 0) op->state->finished.push_back(op);
  }

  static void on_message_sent(void* request, ucs_status_t status, void* user_data) {
    auto* msg = static_cast<Outgoing*>(user_data);
    ucp_request_free(request);
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
      spdlog::debug("ucx: handshake message not delivered: {}", ucs_status_string(status));
    }
    msg->state->outgoing_bytes -= msg->payload.size();
    msg->state->outgoing.erase(msg);
  }

  template <MessageKind kKind>
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
    auto* state = static_cast<State*>(arg);
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
    if (length > 0) in.payload.assign(d, d + length);
    state->inbox.push_back(std::move(in));
    return UCS_OK;
  }

  // --- helpers ----------------------------------------------------------------

  void progress() {
    for (int i = 0; i < kProgressRoundsPerPoll; ++i) {
      if (ucp_worker_progress(worker) == 0) break;
    }
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
    if (request != nullptr) {
      msg->request = request;
      outgoing_bytes += msg->payload.size();
      Outgoing* key = msg.get();
      outgoing.emplace(key, std::move(msg));
    }
    return Status::ok();
  }

  std::vector<RegionDescriptor> local_descriptors() const {
    std::vector<RegionDescriptor> out;
    out.reserve(regions.size());
    for (const auto& [base, r] : regions) {
      out.push_back({r.handle, static_cast<std::uint64_t>(r.base), r.length, r.packed_rkey});
    }
    return out;
  }

  // ucp_mem_map of a caller's range, or (addr null) of memory UCX
  // allocates, then the rkey peers get. The caller checked the range.
  Result<RegionHandle> map_region(void* addr, std::size_t length, MemoryKind kind) {
    ucp_mem_map_params_t params{};
    params.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = addr;
    params.length = length;
    if (addr == nullptr) {
      params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      params.flags = UCP_MEM_MAP_ALLOCATE;
    }
    // Said, not detected: a UCX without CUDA support must refuse VRAM rather
    // than map a device pointer as host memory.
    params.memory_type = kind == MemoryKind::kVram ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    const char* call = addr == nullptr ? "UcxTransport::allocate_memory" : "UcxTransport::register_memory";
    ucp_mem_h memh = nullptr;
    if (ucs_status_t st = ucp_mem_map(context, &params, &memh); st != UCS_OK) {
      return std::unexpected(ucx_failure(call, kind == MemoryKind::kVram ? "ucp_mem_map (VRAM)" : "ucp_mem_map", st));
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucs_status_t st = ucp_mem_query(memh, &attr); st != UCS_OK) {
      ucp_mem_unmap(context, memh);
      return std::unexpected(ucx_failure(call, "ucp_mem_query", st));
    }
    void* packed = nullptr;
    std::size_t packed_size = 0;
    if (ucs_status_t st = ucp_rkey_pack(context, memh, &packed, &packed_size); st != UCS_OK) {
      ucp_mem_unmap(context, memh);
      return std::unexpected(ucx_failure(call, "ucp_rkey_pack", st));
    }
    LocalRegion region;
    region.handle = next_region++;
    // UCX may round an allocation up; the region is what was asked for.
    region.base = reinterpret_cast<std::uintptr_t>(addr == nullptr ? attr.address : addr);
    region.length = length;
    region.memh = memh;
    const auto* bytes = static_cast<const std::uint8_t*>(packed);
    region.packed_rkey.assign(bytes, bytes + packed_size);
    ucp_rkey_buffer_release(packed);
    region_base.emplace(region.handle, region.base);
    const RegionHandle handle = region.handle;
    regions.emplace(region.base, std::move(region));
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
    peer.refresh_seq = 0;
    peer.hello_regions.reset();
    for (auto& lane : peer.lanes) {
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

  // A ready path that has had slices posted and none completed for the
  // stall timeout fails: a link that went down, or a peer that stopped.
  void fail_stalled(TimeNs now_ns) {
    if (config.stall_timeout_ms == 0) return;
    const TimeNs stall_ns = config.stall_timeout_ms * 1'000'000;
    bool failed = false;
    for (PathId id = 0; id < peers.size(); ++id) {
      Peer& p = peers[id];
      if (p.state != PathState::kReady || p.inflight == 0 || now_ns - p.last_progress_ns < stall_ns) continue;
      fail_path(id, Status::unavailable("path {} to {}: no slice completed for {} ms with {} posted (the link or the "
                                        "peer is gone)",
                                        id, p.address, config.stall_timeout_ms, p.inflight));
      failed = true;
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

  // The holder's side: an accepted endpoint that said hello asks to write or read.
  void handle_slice_request(const Inbound& in, const MessageHeader& header) {
    auto it = in.reply_ep == nullptr ? accepted.end() : accepted.find(in.reply_ep);
    if (it == accepted.end() || !it->second->identified) {
      spdlog::warn("ucx: a compressed slice from an endpoint that never said hello; dropped");
      return;
    }
    std::size_t at = 0;
    auto d = ucx::decode_slice(in.payload, at);
    SliceDescriptor reply;
    Status why;
    std::vector<std::uint8_t> data;
    if (!d) {
      why = d.error();
    } else {
      reply = *d;
      auto range = local_range(d->key, d->addr, d->payload_len);
      if (!range) {
        why = range.error();
      } else if (in.kind == MessageKind::kWriteData) {
        why = unpack(*d, std::span(in.payload).subspan(at), *range);
      } else if (outgoing_bytes + d->payload_len > kMaxQueuedReplyBytes) {
        // A peer asking faster than the wire drains would make us copy
        // without bound: refuse, it retries the slice.
        why = Status::resource_exhausted("{} bytes of replies are waiting to be sent (at most {})", outgoing_bytes,
                                         kMaxQueuedReplyBytes);
      } else {
        auto [id, packed] = pack(d->codec, codec_for(d->codec), *range, d->payload_len);
        reply.codec = id;
        data = std::move(packed);
      }
    }
    if (!why.is_ok()) {
      reply.failed = 1;
      reply.payload_len = std::max<std::uint64_t>(reply.payload_len, 1);
      const std::string text = why.message();
      data.assign(text.begin(), text.end());
    }
    const MessageKind kind = in.kind == MessageKind::kWriteData ? MessageKind::kWriteDone : MessageKind::kReadData;
    if (Status s = send_message(in.reply_ep, kind, header, ucx::encode_slice(reply, data)); !s.is_ok()) {
      spdlog::warn("ucx: reply to compressed slice {} not sent: {}", header.seq, s.message());
    }
  }

  // The initiator's side: the holder answered a compressed slice.
  void handle_slice_reply(const Inbound& in, const MessageHeader& header) {
    Lane* lane = lane_of(in, header);
    const auto it = slices.find(header.seq);
    if (lane == nullptr || it == slices.end() || !it->second->awaiting_reply || it->second->submit.path != lane->path) {
      spdlog::warn("ucx: a reply for compressed slice {} that is not waiting for one; dropped", header.seq);
      return;
    }
    SliceOp& op = *it->second;
    std::size_t at = 0;
    auto d = ucx::decode_slice(in.payload, at);
    if (!d) {
      finish_compressed(op, UCS_ERR_INVALID_PARAM, d.error().message());
      return;
    }
    const auto data = std::span(in.payload).subspan(at);
    if (d->failed != 0) {
      finish_compressed(op, UCS_ERR_REJECTED, "the holder refused: " + std::string(data.begin(), data.end()));
      return;
    }
    if (in.kind == MessageKind::kReadData) {
      op.wire_bytes += in.payload.size();
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
      if (old != peer.regions.end() && old->second->info.base == d.base &&
          old->second->info.length == d.length) {
        table.emplace(d.key, old->second);
        continue;
      }
      auto keys = std::make_shared<RemoteRegionKeys>();
      keys->info = {d.key, d.base, d.length};
      keys->rkeys.assign(peer.lanes.size(), nullptr);
      for (std::size_t i = 0; i < peer.lanes.size(); ++i) {
        const ucs_status_t s = ucp_ep_rkey_unpack(peer.lanes[i]->ep, d.packed_rkey.data(), &keys->rkeys[i]);
        if (s != UCS_OK) {
          return Status::unavailable("ucx handshake: cannot unpack the rkey of region {} of peer {} on lane {}: {}",
                                     d.key, peer.address, i, ucs_status_string(s));
        }
      }
      table.emplace(d.key, std::move(keys));
    }
    peer.regions = std::move(table);
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

  void accept(ucp_conn_request_h request) {
    auto record = std::make_unique<Accepted>();
    record->state = this;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    if (config.peer_failure_detection) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &State::on_accepted_error;
      params.err_handler.arg = this;
    }
    ucp_ep_h ep = nullptr;
    if (const ucs_status_t s = ucp_ep_create(worker, &params, &ep); s != UCS_OK) {
      spdlog::warn("ucx: cannot accept a connection on {}: {}", address, ucs_status_string(s));
      return;
    }
    record->ep = ep;
    accepted.emplace(ep, std::move(record));
  }

  void on_accepted_failed(ucp_ep_h ep, ucs_status_t status) {
    auto it = accepted.find(ep);
    if (it == accepted.end()) return;
    spdlog::debug("ucx: client {} (path {}, lane {}) went away: {}", it->second->client_address,
                  it->second->client_path, it->second->client_lane, ucs_status_string(status));
    close_endpoint(ep);
    accepted.erase(it);
  }

  void handle_query(const Inbound& in, const MessageHeader& header) {
    auto it = in.reply_ep == nullptr ? accepted.end() : accepted.find(in.reply_ep);
    if (it == accepted.end()) {
      if (!shut_down) spdlog::warn("ucx: handshake query from an endpoint we did not accept; ignored");
      return;
    }
    Accepted& a = *it->second;
    auto client = ucx::decode_address(in.payload);
    a.identified = true;
    a.client_path = header.path;
    a.client_lane = header.lane;
    a.client_address = client ? *client : "?";
    MessageHeader answer = header;
    answer.flags = header.flags & ucx::kFlagWithRegions;
    std::vector<std::uint8_t> payload;
    if ((answer.flags & ucx::kFlagWithRegions) != 0) payload = ucx::encode_regions(local_descriptors());
    if (Status s = send_message(a.ep, MessageKind::kAnswer, answer, std::move(payload)); !s.is_ok()) {
      spdlog::warn("ucx: cannot answer {}: {}", a.client_address, s.message());
    }
  }

  // The lane a listener's message is for, or null when it is stale or forged.
  Lane* lane_of(const Inbound& in, const MessageHeader& header) {
    if (header.path >= peers.size()) return nullptr;
    Peer& peer = peers[header.path];
    if (peer.state == PathState::kFailed || header.lane >= peer.lanes.size()) return nullptr;
    Lane* lane = peer.lanes[header.lane].get();
    if (lane->ep == nullptr || (in.reply_ep != nullptr && in.reply_ep != lane->ep)) return nullptr;
    return lane;
  }

  void handle_answer(const Inbound& in, const MessageHeader& header) {
    Lane* lane = lane_of(in, header);
    if (lane == nullptr) return;
    Peer& peer = peers[lane->path];
    const bool with_regions = (header.flags & ucx::kFlagWithRegions) != 0;
    std::optional<std::vector<RegionDescriptor>> descriptors;
    if (with_regions) {
      auto decoded = ucx::decode_regions(in.payload);
      if (!decoded) {
        fail_path(lane->path, Status::unavailable("peer {} sent a malformed region list: {}", peer.address,
                                                  decoded.error().message()));
        return;
      }
      descriptors = std::move(*decoded);
    }
    if (peer.state == PathState::kConnecting && header.seq == peer.hello_seq && !lane->answered) {
      lane->answered = true;
      ++peer.answered;
      if (descriptors) peer.hello_regions = std::move(descriptors);
      if (peer.answered == static_cast<int>(peer.lanes.size()) && peer.hello_regions) {
        if (Status s = apply_regions(lane->path, *peer.hello_regions); !s.is_ok()) {
          fail_path(lane->path, std::move(s));
          return;
        }
        peer.hello_regions.reset();
        peer.state = PathState::kReady;
        set_path_type(lane->path, detect_path_type(peer.lanes[0]->ep));
        spdlog::debug("ucx: path {} ready: {}", lane->path, infos[lane->path].name());
      }
      return;
    }
    if (peer.state == PathState::kReady && header.seq == peer.refresh_seq && descriptors) {
      peer.refresh_seq = 0;
      if (Status s = apply_regions(lane->path, *descriptors); !s.is_ok()) fail_path(lane->path, std::move(s));
    }
  }

  void handle_notify(const Inbound& in) {
    auto it = in.reply_ep == nullptr ? accepted.end() : accepted.find(in.reply_ep);
    if (it == accepted.end() || !it->second->identified) {
      spdlog::warn("ucx: notification from an endpoint that never said hello; dropped");
      return;
    }
    if (in.payload.size() > kMaxNotificationBytes) {
      spdlog::warn("ucx: notification of {} bytes from {} is over the {} byte limit; dropped", in.payload.size(),
                   it->second->client_address, kMaxNotificationBytes);
      return;
    }
    if (notifications.size() == ucx::kMaxPendingNotifications) {
      spdlog::warn("ucx: {} notifications not taken; dropping the oldest", notifications.size());
      notifications.pop_front();
    }
    notifications.push_back({it->second->client_address, std::string(in.payload.begin(), in.payload.end())});
  }

  void handle_regions_removed(const Inbound& in, const MessageHeader& header) {
    Lane* lane = lane_of(in, header);
    if (lane == nullptr) return;
    auto keys = ucx::decode_keys(in.payload);
    if (!keys) {
      spdlog::warn("ucx: malformed region removal from {}: {}", peers[lane->path].address,
                   keys.error().message());
      return;
    }
    for (std::uint32_t key : *keys) peers[lane->path].regions.erase(key);
  }

  void handle_recorded() {
    // Acting may record more (a forced close completes requests at once), so
    // go round until nothing is left.
    while (!conn_requests.empty() || !accepted_errors.empty() || !lane_errors.empty() || !inbox.empty()) {
      for (ucp_conn_request_h r : std::exchange(conn_requests, {})) accept(r);
      for (auto [ep, status] : std::exchange(accepted_errors, {})) on_accepted_failed(ep, status);
      for (auto [lane, status] : std::exchange(lane_errors, {})) {
        if (lane->ep == nullptr) continue;
        fail_path(lane->path, Status::unavailable("path {} to {}: lane {} failed: {}", lane->path,
                                                  peers[lane->path].address, lane->index,
                                                  ucs_status_string(status)));
      }
      for (Inbound& in : std::exchange(inbox, {})) {
        auto header = ucx::decode_header(in.header);
        if (!header) {
          spdlog::warn("ucx: dropped a handshake message: {}", header.error().message());
          continue;
        }
        switch (in.kind) {
          case MessageKind::kQuery: handle_query(in, *header); break;
          case MessageKind::kAnswer: handle_answer(in, *header); break;
          case MessageKind::kRegionsRemoved: handle_regions_removed(in, *header); break;
          case MessageKind::kNotify: handle_notify(in); break;
          case MessageKind::kWriteData:
          case MessageKind::kReadAsk: handle_slice_request(in, *header); break;
          case MessageKind::kWriteDone:
          case MessageKind::kReadData: handle_slice_reply(in, *header); break;
        }
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
      peer.last_progress_ns = now_ns;
      out.push_back(std::move(c));
      slices.erase(s.id);
    }
  }

  void notify_regions_removed(RegionHandle handle) {
    for (auto& [ep, a] : accepted) {
      if (!a->identified || a->client_lane != 0) continue;  // one message per client path
      MessageHeader header;
      header.path = a->client_path;
      header.lane = a->client_lane;
      if (Status s = send_message(ep, MessageKind::kRegionsRemoved, header, ucx::encode_keys({handle}));
          !s.is_ok()) {
        spdlog::warn("ucx: cannot tell {} that region {} is gone: {}", a->client_address, handle, s.message());
      }
    }
  }

  void begin_shutdown() {
    if (shut_down) return;
    shut_down = true;
    if (listener != nullptr) {
      for (ucp_conn_request_h r : std::exchange(conn_requests, {})) ucp_listener_reject(listener, r);
      ucp_listener_destroy(listener);
      listener = nullptr;
    }
    for (PathId id = 0; id < peers.size(); ++id) {
      fail_path(id, Status::unavailable("path {} to {}: the transport shut down", id, peers[id].address));
    }
    for (auto& [ep, a] : accepted) close_endpoint(ep);
    accepted.clear();
  }

  void teardown() {
    if (worker == nullptr) {
      if (context != nullptr) ucp_cleanup(context);
      return;
    }
    begin_shutdown();
    for (int i = 0; i < kTeardownRounds && !closing.empty(); ++i) {
      ucp_worker_progress(worker);
      reap_closing();
    }
    if (!closing.empty()) {
      spdlog::warn("ucx: {} endpoint closes did not finish at shutdown", closing.size());
      for (void* r : std::exchange(closing, {})) ucp_request_free(r);
    }
    // Whatever UCX still holds must not call back into freed records.
    for (auto& [id, op] : slices) {
      for (void* r : op->requests) {
        if (r != nullptr) ucp_request_free(r);
      }
    }
    for (auto& [msg, holder] : outgoing) {
      if (holder->request != nullptr) ucp_request_free(holder->request);
    }
    // rkeys live in the worker's memory pools: release them before it.
    finished.clear();
    slices.clear();
    peers.clear();
    for (auto& [base, r] : regions) ucp_mem_unmap(context, r.memh);
    regions.clear();
    ucp_worker_destroy(worker);
    worker = nullptr;
    outgoing.clear();
    ucp_cleanup(context);
    context = nullptr;
  }
};

// --- UcxTransport ------------------------------------------------------------

UcxTransport::UcxTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}
UcxTransport::~UcxTransport() = default;

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxConfig config) {
  if (config.lanes_per_peer < 1) {
    return std::unexpected(Status::invalid_argument("UcxTransport::create: lanes_per_peer is {} (expected >= 1)",
                                                    config.lanes_per_peer));
  }
  if (config.stall_timeout_ms < 0) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: stall_timeout_ms is {} (expected >= 0; 0: never)", config.stall_timeout_ms));
  }
  if (config.handshake_timeout_ms <= 0) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: handshake_timeout_ms is {} (expected > 0)", config.handshake_timeout_ms));
  }
  auto listen = ucx::parse_socket_address(config.listen_address);
  if (!listen) return std::unexpected(listen.error());

  auto state = std::make_unique<State>();
  state->config = std::move(config);
  const UcxConfig& cfg = state->config;

  ucp_config_t* ucp_config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &ucp_config); s != UCS_OK) {
    return std::unexpected(ucx_failure("UcxTransport::create", "ucp_config_read", s));
  }
  if (!cfg.tls.empty()) {
    if (ucs_status_t s = ucp_config_modify(ucp_config, "TLS", cfg.tls.c_str()); s != UCS_OK) {
      ucp_config_release(ucp_config);
      return std::unexpected(Status::invalid_argument("UcxTransport::create: tls \"{}\" refused by UCX: {}",
                                                      cfg.tls, ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "baton";
  const ucs_status_t init = ucp_init(&params, ucp_config, &state->context);
  ucp_config_release(ucp_config);
  if (init != UCS_OK) {
    state->context = nullptr;
    return std::unexpected(ucx_failure("UcxTransport::create", fmt::format("ucp_init (tls \"{}\")", cfg.tls), init));
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // the engine loop owns it
  if (ucs_status_t s = ucp_worker_create(state->context, &worker_params, &state->worker); s != UCS_OK) {
    state->worker = nullptr;
    return std::unexpected(ucx_failure("UcxTransport::create", "ucp_worker_create", s));
  }
  if (ucs_status_t s = ucp_worker_get_efd(state->worker, &state->event_fd); s != UCS_OK) {
    return std::unexpected(ucx_failure("UcxTransport::create", "ucp_worker_get_efd", s));
  }

  auto set_handler = [&](MessageKind kind, ucp_am_recv_callback_t cb) {
    ucp_am_handler_param_t p{};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                   UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.id = static_cast<unsigned>(kind);
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    p.cb = cb;
    p.arg = state.get();
    return ucp_worker_set_am_recv_handler(state->worker, &p);
  };
  for (auto [kind, cb] : {std::pair{MessageKind::kQuery, &State::on_message<MessageKind::kQuery>},
                          std::pair{MessageKind::kAnswer, &State::on_message<MessageKind::kAnswer>},
                          std::pair{MessageKind::kRegionsRemoved, &State::on_message<MessageKind::kRegionsRemoved>},
                          std::pair{MessageKind::kNotify, &State::on_message<MessageKind::kNotify>},
                          std::pair{MessageKind::kWriteData, &State::on_message<MessageKind::kWriteData>},
                          std::pair{MessageKind::kWriteDone, &State::on_message<MessageKind::kWriteDone>},
                          std::pair{MessageKind::kReadAsk, &State::on_message<MessageKind::kReadAsk>},
                          std::pair{MessageKind::kReadData, &State::on_message<MessageKind::kReadData>}}) {
    if (ucs_status_t s = set_handler(kind, cb); s != UCS_OK) {
      return std::unexpected(ucx_failure("UcxTransport::create", "ucp_worker_set_am_recv_handler", s));
    }
  }

  ucp_listener_params_t listener_params{};
  listener_params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  listener_params.sockaddr.addr = listen->get();
  listener_params.sockaddr.addrlen = listen->length;
  listener_params.conn_handler.cb = &State::on_conn_request;
  listener_params.conn_handler.arg = state.get();
  if (ucs_status_t s = ucp_listener_create(state->worker, &listener_params, &state->listener); s != UCS_OK) {
    state->listener = nullptr;
    return std::unexpected(Status::unavailable("UcxTransport::create: cannot listen on {}: {}",
                                               cfg.listen_address, ucs_status_string(s)));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t s = ucp_listener_query(state->listener, &attr); s != UCS_OK) {
    return std::unexpected(ucx_failure("UcxTransport::create", "ucp_listener_query", s));
  }
  state->address = ucx::format_socket_address(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
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
  auto next = s.regions.lower_bound(base);
  const LocalRegion* clash = nullptr;
  if (next != s.regions.end() && next->first < base + length) clash = &next->second;
  if (next != s.regions.begin()) {
    const LocalRegion& prev = std::prev(next)->second;
    if (prev.base + prev.length > base) clash = &prev;
  }
  if (clash != nullptr) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::register_memory: [{:#x}, +{}) overlaps region {} [{:#x}, +{})", base, length,
        clash->handle, clash->base, clash->length));
  }
  return s.map_region(addr, length, kind);
}

Result<UcxTransport::AllocatedRegion> UcxTransport::allocate_memory(std::size_t length) {
  if (length == 0) {
    return std::unexpected(Status::invalid_argument("UcxTransport::allocate_memory: length is 0"));
  }
  // UCX backs it with /dev/shm, which is RAM: too large a size would fill it
  // until the OOM killer picks a victim, and leave the segment behind.
  if (Status s = check_shared_allocation("UcxTransport::allocate_memory", length); !s.is_ok()) {
    return std::unexpected(s);
  }
  auto handle = state_->map_region(nullptr, length, MemoryKind::kDram);
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
  if (region.inflight > 0) {
    return Status::invalid_argument(
        "UcxTransport::unregister: region {} has {} slices in flight; unregister after their completions",
        handle, region.inflight);
  }
  ucp_mem_unmap(s.context, region.memh);
  s.regions.erase(it->second);
  s.region_base.erase(it);
  s.notify_regions_removed(handle);
  return Status::ok();
}

Result<std::vector<std::uint8_t>> UcxTransport::packed_rkey(RegionHandle handle) const {
  auto it = state_->region_base.find(handle);
  if (it == state_->region_base.end()) {
    return std::unexpected(Status::not_found("UcxTransport::packed_rkey: no region {}", handle));
  }
  return state_->regions.at(it->second).packed_rkey;
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
  State::Peer peer;
  peer.address = address;
  peer.deadline_ns = now_ns + s.config.handshake_timeout_ms * 1'000'000;
  peer.hello_seq = peer.next_seq++;
  for (int i = 0; i < s.config.lanes_per_peer; ++i) {
    auto lane = std::make_unique<State::Lane>();
    lane->state = &s;
    lane->path = id;
    lane->index = i;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = target->get();
    params.sockaddr.addrlen = target->length;
    if (s.config.peer_failure_detection) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &State::on_lane_error;
      params.err_handler.arg = lane.get();
    }
    if (ucs_status_t st = ucp_ep_create(s.worker, &params, &lane->ep); st != UCS_OK) {
      for (auto& made : peer.lanes) s.close_endpoint(made->ep);
      return std::unexpected(Status::unavailable("UcxTransport::connect: cannot create endpoint {} to {}: {}", i,
                                                 address, ucs_status_string(st)));
    }
    peer.lanes.push_back(std::move(lane));
  }
  s.peers.push_back(std::move(peer));
  PathInfo info{s.address, address, topology::PathType::kTcp, s.config.lanes_per_peer, 0, 0};
  s.infos.push_back(std::move(info));
  s.set_path_type(id, topology::PathType::kTcp);  // until UCX says what it chose

  const std::vector<std::uint8_t> me(s.address.begin(), s.address.end());
  for (auto& lane : s.peers[id].lanes) {
    MessageHeader hello;
    hello.path = id;
    hello.lane = static_cast<std::uint32_t>(lane->index);
    hello.seq = s.peers[id].hello_seq;
    hello.flags = lane->index == 0 ? ucx::kFlagWithRegions : 0;
    if (Status st = s.send_message(lane->ep, MessageKind::kQuery, hello, me); !st.is_ok()) {
      s.fail_path(id, Status::unavailable("path {} to {}: {}", id, address, st.message()));
      break;
    }
  }
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
      return Status::unavailable("path {} to {}: handshake not finished ({} of {} lanes answered)", path,
                                 peer.address, peer.answered, peer.lanes.size());
    case PathState::kFailed: return peer.error;
  }
  return peer.error;
}

Status UcxTransport::refresh_regions(PathId path) {
  State& s = *state_;
  if (Status st = path_status(path); !st.is_ok()) return st;
  State::Peer& peer = s.peers[path];
  if (peer.refresh_seq != 0) return Status::ok();  // the answer on its way will do
  MessageHeader query;
  query.path = path;
  query.lane = 0;
  query.seq = peer.next_seq++;
  query.flags = ucx::kFlagWithRegions;
  const std::vector<std::uint8_t> me(s.address.begin(), s.address.end());
  if (Status st = s.send_message(peer.lanes[0]->ep, MessageKind::kQuery, query, me); !st.is_ok()) return st;
  peer.refresh_seq = query.seq;
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
    return std::unexpected(Status::not_found("peer {} has no region {} (refresh_regions() learns new ones)",
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
  MessageHeader header;
  header.path = path;
  return s.send_message(s.peers[path].lanes[0]->ep, MessageKind::kNotify, header,
                        std::vector<std::uint8_t>(message.begin(), message.end()));
}

std::vector<Notification> UcxTransport::take_notifications() {
  std::vector<Notification> out(std::make_move_iterator(state_->notifications.begin()),
                                std::make_move_iterator(state_->notifications.end()));
  state_->notifications.clear();
  return out;
}

int UcxTransport::event_fd() const { return state_->event_fd; }

bool UcxTransport::arm() {
  State& s = *state_;
  if (!s.finished.empty() || !s.inbox.empty() || !s.conn_requests.empty() || !s.lane_errors.empty() ||
      !s.accepted_errors.empty()) {
    return false;
  }
  // UCX's rule for sleeping: progress until it reports nothing done, then
  // arm. Events it consumed but did not finish (a socket half read) would
  // not fire the fd again, and the loop would sleep on them.
  if (ucp_worker_progress(s.worker) != 0) return false;
  const ucs_status_t st = ucp_worker_arm(s.worker);
  if (st != UCS_OK && st != UCS_ERR_BUSY) spdlog::warn("ucx: ucp_worker_arm: {}", ucs_status_string(st));
  return st == UCS_OK;
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
  ucp_ep_h ep = peer.lanes[static_cast<std::size_t>(slice.lane)]->ep;
  if (compress) {
    // A write goes compressed when the codec shrinks it (else as plain RMA
    // below); a read asks the holder to compress, which it does if it shrinks.
    SliceDescriptor d{m.remote_key, s.codec_id, 0, m.remote_addr, slice.bytes};
    std::vector<std::uint8_t> payload;
    if (m.op == Op::kRead) {
      payload = ucx::encode_slice(d, {});
    } else if (auto [id, packed] = s.pack(s.codec_id, s.codec.get(), static_cast<const std::byte*>(m.local), slice.bytes);
               id != WireCodec::kRaw) {
      d.codec = id;
      payload = ucx::encode_slice(d, packed);
    }
    if (!payload.empty()) {
      MessageHeader header;
      header.path = slice.path;
      header.lane = static_cast<std::uint32_t>(slice.lane);
      header.seq = slice.id;
      op->compressed = true;
      op->awaiting_reply = true;
      op->wire_bytes = payload.size();
      const MessageKind kind = m.op == Op::kRead ? MessageKind::kReadAsk : MessageKind::kWriteData;
      if (Status st = s.send_message(ep, kind, header, std::move(payload)); !st.is_ok()) {
        return Status::unavailable("UcxTransport::submit: slice {}: {}", slice.id, st.message());
      }
      ++local->inflight;
      if (peer.inflight++ == 0) peer.last_progress_ns = now_ns;
      s.slices.emplace(slice.id, std::move(op));
      return Status::ok();
    }
  }
  ucp_rkey_h rkey = op->remote->rkeys[static_cast<std::size_t>(slice.lane)];

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  param.cb.send = &State::on_slice_request;
  param.user_data = op.get();
  param.memh = local->memh;
  void* rma = m.op == Op::kWrite ? ucp_put_nbx(ep, m.local, slice.bytes, m.remote_addr, rkey, &param)
                                 : ucp_get_nbx(ep, m.local, slice.bytes, m.remote_addr, rkey, &param);
  if (UCS_PTR_IS_ERR(rma)) {
    return Status::unavailable("UcxTransport::submit: slice {} on path {} lane {}: {} failed: {}", slice.id,
                               slice.path, slice.lane, m.op == Op::kWrite ? "ucp_put_nbx" : "ucp_get_nbx",
                               ucs_status_string(UCS_PTR_STATUS(rma)));
  }
  if (rma != nullptr) {
    op->requests[0] = rma;
    ++op->pending;
  }
  if (m.op == Op::kWrite) {
    // A put completes when its source buffer may be reused; the bytes are at
    // the peer only after a flush. The flush covers this put (and earlier
    // ones on the endpoint), so the slice completes when both did.
    ucp_request_param_t flush{};
    flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    flush.cb.send = &State::on_slice_request;
    flush.user_data = op.get();
    void* f = ucp_ep_flush_nbx(ep, &flush);
    if (UCS_PTR_IS_ERR(f)) {
      op->status = UCS_PTR_STATUS(f);
    } else if (f != nullptr) {
      op->requests[1] = f;
      ++op->pending;
    }
  }
  ++local->inflight;
  if (peer.inflight++ == 0) peer.last_progress_ns = now_ns;
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
  return Status::ok();
}

void UcxTransport::poll(TimeNs now_ns, std::vector<Completion>& out) {
  State& s = *state_;
  s.progress();
  s.handle_recorded();
  s.reap_closing();
  for (PathId id = 0; id < s.peers.size(); ++id) {
    State::Peer& peer = s.peers[id];
    if (peer.state == PathState::kConnecting && now_ns >= peer.deadline_ns) {
      s.fail_path(id, Status::unavailable("path {} to {}: handshake did not finish within {} ms ({} of {} lanes "
                                          "answered)",
                                          id, peer.address, s.config.handshake_timeout_ms, peer.answered,
                                          peer.lanes.size()));
    }
  }
  s.handle_recorded();  // a failed handshake's forced close completes its requests
  s.fail_stalled(now_ns);
  s.hand_out(now_ns, out);
}

std::optional<TimeNs> UcxTransport::next_event_ns() const {
  std::optional<TimeNs> next;
  for (const State::Peer& peer : state_->peers) {
    if (peer.state == PathState::kConnecting && (!next || peer.deadline_ns < *next)) next = peer.deadline_ns;
  }
  return next;
}

bool UcxTransport::path_healthy(PathId path, TimeNs /*now_ns*/) const {
  return path_state(path) == PathState::kReady;
}

std::size_t UcxTransport::slices_in_flight() const { return state_->slices.size(); }

void UcxTransport::shutdown() { state_->begin_shutdown(); }

bool UcxTransport::shutdown_complete() const { return state_->shut_down && state_->closing.empty(); }

}  // namespace baton::transport
