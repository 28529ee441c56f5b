// Rails and endpoints (UcxTransport::State, state.h): each rail's UCP
// context and worker, its active-message handlers and error callbacks,
// progress, handshake messages, endpoint closes, a failing rail, teardown.
#include "transport/ucx/state.h"
#include "transport/ucx/ucx_log.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "baton/common/log.h"

namespace baton::transport {
namespace {

// The kernel's largest receive buffer a process may set (net.core.rmem_max);
// none when it cannot be read. A larger SO_RCVBUF is silently cut to it,
// and a set one turns the kernel's autotuning off.
std::optional<std::uint64_t> kernel_receive_buffer_max() {
  std::uint64_t bytes = 0;
  if (!(std::ifstream("/proc/sys/net/core/rmem_max") >> bytes)) return std::nullopt;
  return bytes;
}

}  // namespace

// A UCP context and worker on one NIC (`nic` empty: UCX's choice), with
// our active-message handlers. Destroyed by teardown() once in `rails`;
// on failure here, released here.
auto UcxTransport::State::make_rail(const UcxConfig& cfg, const std::string& nic, State* state) -> Result<Rail> {
  Rail rail;
  rail.nic = nic;
  auto fail = [&rail](Status why) {
    if (rail.worker != nullptr) ucp_worker_destroy(rail.worker);
    if (rail.context != nullptr) ucp_cleanup(rail.context);
    return std::unexpected(std::move(why));
  };
  ucx::log_to_stderr();  // before UCX reads its settings, which it may warn about
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
  // One segment per slice message (UcxConfig::tcp_segment_bytes) and a fixed
  // receive buffer (tcp_receive_buffer_bytes); what the environment sets
  // wins. Only where TCP may open: UCX warns about a setting no transport took.
  const char* env_tls = std::getenv("UCX_TLS");  // what UCX reads when the config names none
  if (may_use_tcp(!cfg.tls.empty() ? std::string_view(cfg.tls) : env_tls != nullptr ? env_tls : "", nic)) {
    std::vector<std::pair<const char*, std::uint64_t>> wanted;
    // The two segments go together: UCX refuses a receive segment below the
    // send one, so one set in the environment leaves both to it.
    if (cfg.tcp_segment_bytes != 0 && std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr &&
        std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) {
      wanted.insert(wanted.end(), {{"TX_SEG_SIZE", cfg.tcp_segment_bytes}, {"RX_SEG_SIZE", cfg.tcp_segment_bytes}});
    }
    if (cfg.tcp_receive_buffer_bytes != 0) {
      if (const auto max = kernel_receive_buffer_max(); max && *max >= cfg.tcp_receive_buffer_bytes) {
        wanted.emplace_back("RCVBUF", cfg.tcp_receive_buffer_bytes);
      } else {
        baton::logger().debug("UcxTransport: TCP receive buffer left to the kernel's autotuning: net.core.rmem_max {} "
                              "(below {})",
                              max ? fmt::format("is {}", *max) : std::string("could not be read"),
                              cfg.tcp_receive_buffer_bytes);
      }
    }
    for (auto [key, value] : wanted) {
      const std::string name = fmt::format("UCX_TCP_{}", key);
      if (std::getenv(name.c_str()) != nullptr) continue;
      const std::string bytes = std::to_string(value);
      if (ucs_status_t s = ucp_config_modify(ucp_config, key, bytes.c_str()); s != UCS_OK) {
        ucp_config_release(ucp_config);
        return fail(Status::invalid_argument("UcxTransport::create: {}={} refused by UCX: {}", name, bytes,
                                             ucs_status_string(s)));
      }
      auto& set = state->ucx_settings;
      if (std::ranges::find(set, name, &std::pair<std::string, std::string>::first) == set.end()) {
        set.emplace_back(name, bytes);
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
  // The engine loop owns it, or the loop and its progress thread take turns
  // under the rail's mutex (progress_threads.h).
  worker_params.thread_mode = runs_progress_threads(cfg) ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE;
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

void UcxTransport::State::on_back_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* back = static_cast<BackLane*>(arg);
  const auto recording = back->state->record();
  back->state->back_errors.push_back({back->session, back->rail, status});
}

void UcxTransport::State::on_lane_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* lane = static_cast<Lane*>(arg);
  const auto recording = lane->state->record();
  lane->state->lane_errors.emplace_back(lane, status);
}

void UcxTransport::State::on_message_sent(void* request, ucs_status_t status, void* user_data) {
  auto* msg = static_cast<Outgoing*>(user_data);
  ucp_request_free(request);
  const auto recording = msg->state->record();
  if (status != UCS_OK && status != UCS_ERR_CANCELED) {
    baton::logger().debug("ucx: handshake message not delivered: {}", ucs_status_string(status));
  }
  msg->state->outgoing_bytes -= msg->held;
  if (auto it = msg->state->sessions.find(msg->session); it != msg->state->sessions.end()) {
    it->second.queued_bytes -= msg->held;
    msg->state->session_queued_bytes -= msg->held;
  }
  msg->state->buffers.give(std::move(msg->payload));
  msg->state->outgoing.erase(msg);
}

template <MessageKind kKind>
ucs_status_t UcxTransport::State::on_message(void* arg, const void* header, std::size_t header_length, void* data,
                                             std::size_t length, const ucp_am_recv_param_t* param) {
  const auto& handler = *static_cast<const HandlerArg*>(arg);
  State* state = handler.state;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    // We send every handshake message eager; a rendezvous one is not ours.
    state->warn_about_peer(fmt::format("ucx: dropped a rendezvous handshake message of {} bytes", length));
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
  // A message UCX does not lend (TCP's single-segment ones) is copied into
  // a pooled buffer: copying a read's answer straight into place here
  // instead saved that copy and measured no faster (docs/results.md).
  const bool lend = length > 0 && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  const auto recording = state->record();
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

// One thread per rail, each near its NIC; the poller then watches their
// signal instead of the workers.
Status UcxTransport::State::start_progress_threads() {
  std::vector<ucx::ProgressThreads::Rail> threads;
  for (const Rail& rail : rails) threads.push_back({rail.worker, rail.worker_fd, ucx::cpus_near_nic(rail.nic)});
  threaded = true;  // before any thread can call back
  auto made = ucx::ProgressThreads::create(std::move(threads), &recorded);
  if (!made) {
    threaded = false;
    return made.error();
  }
  for (const Rail& rail : rails) poller->forget(rail.worker_fd);
  poller->watch((*made)->fd(), false);
  progress_threads = std::move(*made);
  return Status::ok();
}

void UcxTransport::State::stop_progress_threads() {
  if (!progress_threads) return;
  poller->forget(progress_threads->fd());
  progress_threads.reset();
  threaded = false;  // joined: callbacks run on this thread only
  for (const Rail& rail : rails) poller->watch(rail.worker_fd, false);
}

void UcxTransport::State::progress() {
  for (Rail& rail : rails) {
    for (int i = 0; i < kProgressRoundsPerPoll; ++i) {
      if (ucp_worker_progress(rail.worker) == 0) break;
    }
  }
}

// Whether every worker is idle: one progress round each, all of them.
bool UcxTransport::State::progress_once() {
  unsigned done = 0;
  for (Rail& rail : rails) done += ucp_worker_progress(rail.worker);
  return done != 0;
}

void UcxTransport::State::unmap(LocalRegion& r) {
  for (std::size_t i = 0; i < r.memh.size(); ++i) ucp_mem_unmap(rails[i].context, r.memh[i]);
  r.memh.clear();
}

// A slice was posted on `rail` of `peer`: an idle stretch ends there.
void UcxTransport::State::note_posted(Peer& peer, std::size_t rail, TimeNs now_ns) {
  ++peer.inflight;
  if (peer.rails[rail].inflight++ == 0) peer.rails[rail].last_progress_ns = now_ns;
}

void UcxTransport::State::close_endpoint(ucp_ep_h ep, std::optional<PathId> path) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // A forced close needs no answer from the peer and completes everything
  // still posted with UCS_ERR_CANCELED; UCX allows it only under
  // peer-failure handling.
  param.flags = config.peer_failure_detection ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing.push_back({request, path});
}

// A warning about what a peer sent, or a stranger that reached UCX's ports:
// at most kPeerWarningsPerSecond a second, so that no one fills a disk with
// them; the first of the next second says how many were left out.
void UcxTransport::State::warn_about_peer(const std::string& text) {
  const TimeNs now = SteadyClock().now_ns();
  std::uint64_t left_out = 0;
  {
    std::lock_guard lock(peer_warnings_mutex);
    if (now - peer_warnings_since_ns >= 1'000'000'000) {
      peer_warnings_since_ns = now;
      peer_warnings = 0;
      left_out = std::exchange(peer_warnings_left_out, 0);
    }
    if (peer_warnings == kPeerWarningsPerSecond) {
      ++peer_warnings_left_out;
      return;
    }
    ++peer_warnings;
  }
  if (left_out > 0) {
    baton::logger().warn("ucx: {} more warnings about peers' messages left out (at most {} a second)", left_out,
                         kPeerWarningsPerSecond);
  }
  baton::logger().warn("{}", text);
}

void UcxTransport::State::reap_closing() {
  std::erase_if(closing, [](const Closing& c) {
    if (ucp_request_check_status(c.request) == UCS_INPROGRESS) return false;
    ucp_request_free(c.request);
    return true;
  });
}

Status UcxTransport::State::send_message(ucp_ep_h ep, MessageKind kind, const MessageHeader& header,
                                         std::vector<std::uint8_t> payload, std::uint64_t session) {
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
  // What it holds until sent: a bundle's buffer is 64 KiB however few
  // refusals it carries.
  msg->held = msg->payload.capacity() + msg->header.capacity() + kOutgoingOverheadBytes;
  outgoing_bytes += msg->held;
  if (auto it = sessions.find(session); it != sessions.end()) {
    msg->session = session;
    it->second.queued_bytes += msg->held;
    session_queued_bytes += msg->held;
  }
  Outgoing* key = msg.get();
  outgoing.emplace(key, std::move(msg));
  return Status::ok();
}

// " on rail 1 (eth1)" where there is more than one rail, else nothing.
std::string UcxTransport::State::rail_name(std::size_t rail) const {
  return rails.size() == 1 ? std::string() : fmt::format(" on rail {} ({})", rail, rails[rail].nic);
}

// Rail `rail` of path `id` failed. While another rail of the path works
// (and a forced close can complete what is posted: peer-failure
// detection), only its lanes close: their RMA completes with an error,
// their slices awaiting a reply fail, and the scheduler sends them again,
// which lands them on the lanes left (submit). The last rail fails the path.
void UcxTransport::State::fail_rail(PathId id, std::size_t rail, Status reason) {
  Peer& peer = peers[id];
  if (peer.state == PathState::kFailed || peer.rails[rail].failed) return;
  bool others = false;
  for (std::size_t r = 0; r < peer.rails.size(); ++r) others = others || (r != rail && !peer.rails[r].failed);
  if (!others || !config.peer_failure_detection || peer.same_host_pid != 0) {
    fail_path(id, std::move(reason));
    return;
  }
  baton::logger().warn("ucx: {}; its lanes fail over to the path's other rails", reason.message());
  peer.rails[rail].failed = true;
  for (auto& lane : peer.lanes) {
    if (lane->rail != rail || lane->ep == nullptr) continue;
    drop_unflushed(*lane);
    close_endpoint(lane->ep, id);
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
void UcxTransport::State::fail_stalled(TimeNs now_ns) {
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

void UcxTransport::State::begin_shutdown() {
  if (shut_down) return;
  shut_down = true;
  if (listener) {
    poller->forget(listener->fd());
    listener.reset();
  }
  for (PathId id = 0; id < peers.size(); ++id) {
    fail_path(id, Status::unavailable("path {} to {}: the transport shut down", id, peers[id].address));
  }
  // A same-host peer that writes caller memory by address is not stopped by
  // a close: it is asked to forget that memory first, so that a copy it has
  // under way ends before shutdown answers (drain_sessions).
  // On the clock poll() is given (an engine's counts from its start).
  for (std::uint64_t id : session_ids()) {
    if (sessions.contains(id) && !drain(id, last_poll_ns)) close_session(id, "the transport shut down");
  }
  publish_direct();
  close_lingering();
}

void UcxTransport::State::teardown() {
  if (rails.empty() || rails.back().worker == nullptr) {  // create() failed part way
    for (Rail& rail : rails) {
      if (rail.worker != nullptr) ucp_worker_destroy(rail.worker);
      if (rail.context != nullptr) ucp_cleanup(rail.context);
    }
    rails.clear();
    return;
  }
  stop_progress_threads();  // from here the caller's thread alone drives UCX
  begin_shutdown();
  drain_sessions(kForeverNs);  // those still draining close now, saying so
  if (copier) {  // its copies finish first: they write into slices' memory
    poller->forget(copier->fd());
    copier.reset();
  }
  if (workers) {  // likewise
    poller->forget(workers->fd());
    workers.reset();
  }
  for (Lingering& l : lingering) (void)l.conn->flush();  // what the socket takes at once
  lingering.clear();  // their copies ended above (callers' threads are out by now)
  for (int i = 0; i < kTeardownRounds && !closing.empty(); ++i) {
    progress_once();
    reap_closing();
  }
  // Staged copies still running: their access has them back (it waits for
  // or abandons the copies; nothing answers them now).
  for (StagedCopy& copy : std::exchange(staged_copies, {})) copy.access->release(copy.ticket);
  staged_waiting.clear();  // not started: nothing to hand back
  if (!closing.empty()) {
    baton::logger().warn("ucx: {} endpoint closes did not finish at shutdown", closing.size());
    for (const Closing& c : std::exchange(closing, {})) ucp_request_free(c.request);
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

Status UcxTransport::State::check_worker_addresses(const std::vector<std::vector<std::uint8_t>>& addresses) const {
  // A packed UCP address starts with a header byte whose low 4 bits are the
  // format's version; ours (the same UCX on both ends) says which.
  constexpr std::uint8_t kVersionBits = 0x0f;
  const std::uint8_t version = rails.front().worker_address.front() & kVersionBits;
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    if ((addresses[i].front() & kVersionBits) != version) {
      return Status::invalid_argument("worker address {} is not a UCP address of this UCX (format version {}, ours {})",
                                      i, addresses[i].front() & kVersionBits, version);
    }
  }
  return Status::ok();
}

Status UcxTransport::State::check_partial(TimeNs& partial_since_ns, const ControlConnection& conn,
                                          TimeNs now_ns) const {
  if (conn.buffered() == 0 || conn.frame_waiting()) {
    partial_since_ns = 0;
    return Status::ok();
  }
  if (partial_since_ns == 0) partial_since_ns = now_ns;
  if (now_ns - partial_since_ns >= config.handshake_timeout_ms * 1'000'000) {
    return Status::timeout("a frame half-sent for {} ms ({} bytes of it here)", config.handshake_timeout_ms,
                           conn.buffered());
  }
  return Status::ok();
}

}  // namespace baton::transport
