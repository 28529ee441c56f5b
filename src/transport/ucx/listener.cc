// The listener's side of the handshake (UcxTransport::State, state.h):
// control connections from initiators, the challenge, sessions, back lanes
// and lane binding.
#include "transport/ucx/state.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "baton/common/host_port.h"
#include "baton/common/log.h"

namespace baton::transport {

// The session whose lane `ep` is, or null for a lane never bound.
auto UcxTransport::State::session_of(ucp_ep_h ep) -> Session* {
  const auto it = ep == nullptr ? session_by_ep.end() : session_by_ep.find(ep);
  return it == session_by_ep.end() ? nullptr : &sessions.at(it->second);
}

// A lane's first message: the session token its welcome carried. Notes
// the endpoint it arrives on here as that session's; once every lane is
// bound, the control connection says the path is ready.
void UcxTransport::State::handle_bind(const Inbound& in) {
  if (in.reply_ep == nullptr || (in.payload.size() != ucx::kBindTokenBytes &&
                                 in.payload.size() != ucx::kBindTokenBytes + ucx::kBindPaddingBytes)) {
    warn_about_peer("ucx: a lane binding without a reply endpoint or a token; dropped");
    return;
  }
  std::uint64_t token = 0;
  std::memcpy(&token, in.payload.data(), sizeof token);
  const auto it = session_by_token.find(token);
  if (it == session_by_token.end()) {
    warn_about_peer("ucx: a lane binding with an unknown session token; dropped");
    return;
  }
  const std::uint64_t id = it->second;
  Session& session = sessions.at(id);
  // UCX may have reused the address of a departed peer's endpoint.
  if (auto old = session_by_ep.find(in.reply_ep); old != session_by_ep.end() && old->second != id) {
    sessions.at(old->second).bound.erase(in.reply_ep);
  }
  if (!session.bound.contains(in.reply_ep) && session.bound.size() >= session.lanes) {
    warn_about_peer(
        fmt::format("ucx: {} bound more than the {} lanes it announced; dropped", session.name, session.lanes));
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
void UcxTransport::State::fail_back_rail(const BackError& e) {
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
  baton::logger().warn("ucx: peer {}: {}; answering over the other rails", session.name, why);
  for (auto& back : session.back) {
    if (back->rail != e.rail || back->ep == nullptr) continue;
    close_endpoint(back->ep);
    back->ep = nullptr;
  }
}

void UcxTransport::State::watch(ControlConnection& conn, bool& write_watched) {
  if (conn.wants_write() != write_watched) {
    write_watched = conn.wants_write();
    poller->change(conn.fd(), write_watched);
  }
}

void UcxTransport::State::close_session(std::uint64_t id, std::string_view why) {
  auto it = sessions.find(id);
  if (it == sessions.end()) return;
  Session& session = it->second;
  if (!session.authenticated) end_handshake(session);
  if (session.authenticated && !shut_down) {
    baton::logger().info("ucx: peer {} ({}) left: {}", session.name, session.conn->remote(), why);
  } else {
    baton::logger().debug("ucx: unauthenticated connection from {} closed: {}", session.conn->remote(), why);
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
  // Its answers still queued are UCX's to complete (cancelled by the close);
  // they no longer count against the peers left.
  session_queued_bytes -= session.queued_bytes;
  sessions.erase(it);
}

// Sends a frame to a session; a peer that does not read loses its session.
bool UcxTransport::State::tell(std::uint64_t id, ControlKind kind, std::span<const std::uint8_t> body) {
  Session& session = sessions.at(id);
  if (Status s = session.conn->send(kind, body); !s.is_ok()) {
    close_session(id, s.message());
    return false;
  }
  return true;
}

namespace {

// A refusal the other end can read, then the connection closes (the
// caller drops it): a silent close looked like a network fault.
// Refusals of a handshake's start are counted (refused_connections), not
// logged: a host holding every slot would make a line per connect.
void send_refusal(ControlConnection& conn, const std::string& why) {
  (void)conn.send(ControlKind::kRefusal, ucx::encode_text(why));
  (void)conn.flush();
}

// The host of "10.0.0.2:51234" or "[::1]:51234".
std::string host_of(const std::string& remote) {
  auto split = split_host_port(remote);
  return split ? std::string(split->host) : remote;
}

}  // namespace

void UcxTransport::State::end_handshake(const Session& session) {
  --unauthenticated;
  if (auto from = unauthenticated_from.find(session.from); from != unauthenticated_from.end() && --from->second == 0) {
    unauthenticated_from.erase(from);
  }
}

bool UcxTransport::State::admit_handshake(const std::string& from, ControlConnection& conn) {
  const int mine = unauthenticated_from.contains(from) ? unauthenticated_from.at(from) : 0;
  if (mine >= config.max_unauthenticated_per_address) {
    ++refused_connections;
    send_refusal(conn, fmt::format("refused: {} handshakes from {} are under way here already", mine, from));
    return false;
  }
  if (unauthenticated < config.max_unauthenticated) return true;
  // Full: the oldest handshake of the address holding the most gives way,
  // if it holds more than the newcomer's.
  const auto most = std::ranges::max_element(unauthenticated_from, {}, [](const auto& e) { return e.second; });
  if (most == unauthenticated_from.end() || most->second <= mine + 1) {
    ++refused_connections;
    send_refusal(conn, fmt::format("refused: {} handshakes are under way here; try again", unauthenticated));
    return false;
  }
  std::uint64_t oldest = 0;
  for (const auto& [id, session] : sessions) {  // ids grow with age
    if (!session.authenticated && session.from == most->first) {
      oldest = id;
      break;
    }
  }
  ++refused_connections;
  if (oldest == 0) {  // the counts say it has one; refuse rather than trust them
    send_refusal(conn, fmt::format("refused: {} handshakes are under way here; try again", unauthenticated));
    return false;
  }
  send_refusal(*sessions.at(oldest).conn, "refused: this address holds too many of the handshakes under way here");
  close_session(oldest, "made room for a handshake from another address");
  return true;
}

void UcxTransport::State::accept_connections(TimeNs now_ns) {
  if (!listener) return;
  if (!is_ready(listener->fd())) return;
  while (auto conn = listener->accept()) {
    std::string from = host_of(conn->remote());
    if (!admit_handshake(from, *conn)) {
      baton::logger().debug("ucx: connection from {} refused ({} handshakes under way)", conn->remote(), unauthenticated);
      continue;  // closes it
    }
    auto nonce = ucx::random_nonce();
    if (!nonce) {
      baton::logger().error("ucx: {}", nonce.error().message());
      continue;
    }
    const std::uint64_t id = next_session++;
    ++unauthenticated;
    ++unauthenticated_from[from];
    Session& session = sessions[id];
    session.from = std::move(from);
    session.conn = std::move(conn);
    session.conn->count_queued_in(&control_queued_bytes);
    session.nonce = *nonce;
    session.deadline_ns = now_ns + config.handshake_timeout_ms * 1'000'000;
    poller->watch(session.conn->fd(), false);
    tell(id, ControlKind::kChallenge, ucx::encode(ucx::Challenge{session.nonce}));
  }
}

// Our endpoints to an authenticated initiator's workers, carrying our
// answers to its slices: one per lane, lane i's from the rail it arrives
// on here to the rail it leaves from there.
Status UcxTransport::State::open_back_lanes(std::uint64_t id, const std::vector<std::vector<std::uint8_t>>& addresses) {
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

Status UcxTransport::State::authenticate(std::uint64_t id, const Frame& frame) {
  Session& session = sessions.at(id);
  if (frame.kind != ControlKind::kHello) {
    return Status::invalid_argument("expected a hello, got frame kind {}", static_cast<int>(frame.kind));
  }
  auto hello = ucx::decode_hello(frame.body);
  if (!hello) return hello.error();
  if (!ucx::same_proof(hello->proof,
                       ucx::initiator_proof(secret, session.nonce, hello->nonce, ucx::hello_description(*hello)))) {
    // Sent to the connecting engine, which shows it as "<us> refused us: …":
    // worded for either side to read.
    const std::string why = secret.empty()
                                ? "authentication failed: the listener has no secret and the connecting engine has one"
                                : "authentication failed: the connecting engine does not hold the listener's secret";
    (void)session.conn->send(ControlKind::kRefusal, ucx::encode_text(why));
    (void)session.conn->flush();
    // An operator sees it (a peer with the wrong secret file), bounded per
    // second like every warning a peer can cause.
    warn_about_peer(fmt::format("ucx: a connection from {} refused: {}", session.conn->remote(), why));
    return Status::permission_denied("{}", why);
  }
  if (Status s = check_worker_addresses(hello->worker_addresses); !s.is_ok()) return s;
  // Bounds on what a peer holding the secret may take: sessions, and file
  // descriptors for its lanes (UCX aborts when it runs out of them).
  const auto peers_now = static_cast<int>(sessions.size()) - unauthenticated;
  std::string full;
  if (peers_now >= config.max_sessions) {
    full = fmt::format("refused: this listener serves its maximum of {} peers", config.max_sessions);
  } else if (ucx::free_fds() < 4 * std::int64_t{hello->lanes} * static_cast<std::int64_t>(rails.size()) + 64) {
    full = fmt::format("refused: this listener is short of file descriptors for {} more lanes", hello->lanes);
  }
  if (!full.empty()) {
    ++refused_connections;
    warn_about_peer(fmt::format("ucx: a connection from {} {}", session.conn->remote(), full));
    send_refusal(*session.conn, full);
    return Status::resource_exhausted("{}", full);
  }
  auto token = ucx::random_token();
  if (!token) return token.error();
  session.authenticated = true;
  end_handshake(session);
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
  baton::logger().debug("ucx: peer {} ({}) authenticated", session.name, session.conn->remote());
  tell(id, ControlKind::kWelcome, ucx::encode(welcome));
  return Status::ok();
}

Status UcxTransport::State::serve_frame(std::uint64_t id, const Frame& frame) {
  Session& session = sessions.at(id);
  switch (frame.kind) {
    case ControlKind::kRefresh: {
      auto seq = ucx::decode_seq(frame.body);
      if (!seq) return seq.error();
      // A 13-byte ask for a longer answer: a peer that asks without reading
      // had every answer queued (64 MiB a session, 8 sessions took 630 MB).
      // An answer waits behind a bounded backlog, and all sessions' together.
      if (session.conn->queued() > kMaxRefreshBacklogBytes) {
        return Status::resource_exhausted("asks for its regions without reading the answers ({} bytes queued for it)",
                                          session.conn->queued());
      }
      // Past the bound for all sessions, the one holding the most goes (not
      // whoever asks next).
      if (control_queued_bytes > kMaxControlBacklogBytes) {
        std::uint64_t most = id;
        for (const auto& [other, s] : sessions) {
          if (s.conn->queued() > sessions.at(most).conn->queued()) most = other;
        }
        const std::string why = fmt::format(
            "does not read its control connection ({} bytes queued for it, {} for every peer)",
            sessions.at(most).conn->queued(), control_queued_bytes);
        if (most == id) return Status::resource_exhausted("{}", why);
        close_session(most, why);
      }
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
    case ControlKind::kDirect: {
      // Once a session: a later one could steer which process we wait for.
      if (std::exchange(session.direct_declared, true)) {
        return Status::invalid_argument("a second direct-copy declaration");
      }
      auto direct = ucx::decode_direct(frame.body);
      if (!direct) return direct.error();
      if (direct->pid == 0 || direct->pid > static_cast<std::uint64_t>(std::numeric_limits<pid_t>::max())) {
        return Status::invalid_argument("a direct-copy pid of {}", direct->pid);
      }
      // Believed only once its cookie is read back out of that process: a
      // peer naming another pid (1, ours) would otherwise be waited for
      // for good. One we cannot read (it runs as root, we do not) is told
      // so, and goes through UCX: we could not wait for its copies.
      const auto pid = static_cast<pid_t>(direct->pid);
      const bool confirmed = ucx::cookie_matches(pid, direct->cookie_address, direct->cookie);
      if (confirmed) {
        session.direct_pid = pid;
        baton::logger().debug("ucx: peer {} copies into our memory itself, from process {}", session.name, pid);
      } else {
        baton::logger().debug("ucx: peer {} says it is process {} of this host, which we cannot confirm", session.name,
                              pid);
      }
      tell(id, ControlKind::kDirectAnswer, ucx::encode_flag(confirmed));
      return Status::ok();
    }
    case ControlKind::kNotify: {
      auto text = ucx::decode_text(frame.body, kMaxNotificationBytes);
      if (!text) return text.error();
      ++notification_counts.received;
      const std::size_t bytes = text->size() + session.name.size();
      while (!notifications.empty() && (notifications.size() == ucx::kMaxPendingNotifications ||
                                        notification_bytes + bytes > ucx::kMaxPendingNotificationBytes)) {
        // Once per run of drops (a take ends it), not once per notification.
        ++notification_counts.dropped;
        if (!std::exchange(dropping_notifications, true)) {
          baton::logger().warn("ucx: {} notifications ({} bytes) not taken; dropping the oldest of the peer holding "
                               "the most until some are taken",
                               notifications.size(), notification_bytes);
        }
        drop_a_notification();
      }
      notification_bytes += bytes;
      notifications.push_back({{session.name, std::move(*text)}, id});
      ++notifications_of[id];
      return Status::ok();
    }
    default:
      return Status::invalid_argument("frame kind {} is not for a listener", static_cast<int>(frame.kind));
  }
}

// The oldest notification of the peer holding the most: one peer that
// floods pushes out its own, not everyone's. Its oldest is near the front
// when it floods.
void UcxTransport::State::drop_a_notification() {
  const auto most = std::ranges::max_element(notifications_of, {}, [](const auto& kv) { return kv.second; });
  const auto at = std::ranges::find(notifications, most->first, &Untaken::session);
  notification_bytes -= at->notification.message.size() + at->notification.from.size();
  notifications.erase(at);
  if (--most->second == 0) notifications_of.erase(most);
}

// Session ids now: handling a frame may close a session (telling a peer
// that does not read), so no loop walks the map itself while it acts.
std::vector<std::uint64_t> UcxTransport::State::session_ids() const {
  std::vector<std::uint64_t> ids;
  ids.reserve(sessions.size());
  for (const auto& [id, session] : sessions) ids.push_back(id);
  return ids;
}

void UcxTransport::State::serve_sessions(TimeNs now_ns) {
  for (std::uint64_t id : session_ids()) {
    auto it = sessions.find(id);
    if (it == sessions.end()) continue;
    Session& session = it->second;
    // The handshake ends with every lane bound: a peer that authenticated
    // and never bound held one of max_sessions for good.
    const bool expired = (!session.ready_sent && now_ns >= session.deadline_ns) ||
                         (session.partial_since_ns != 0 &&
                          now_ns - session.partial_since_ns >= config.handshake_timeout_ms * 1'000'000);
    if (!is_ready(session.conn->fd()) && !session.conn->wants_write() && !session.conn->frame_waiting() && !expired) {
      continue;
    }
    const std::uint32_t bound = session.authenticated ? ucx::kMaxFrameBytes : ucx::kMaxHandshakeFrameBytes;
    Status status = session.conn->receive(bound + ucx::kFrameHeaderBytes);
    // Frames that arrived before a close still count (a notification, an ack).
    for (int taken = 0; taken < kMaxFramesPerPoll; ++taken) {
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
    if (status.is_ok() && !session.ready_sent && now_ns >= session.deadline_ns) {
      status = session.authenticated
                   ? Status::timeout("its lanes not bound within {} ms of connecting", config.handshake_timeout_ms)
                   : Status::timeout("no valid hello within {} ms", config.handshake_timeout_ms);
    }
    if (status.is_ok()) status = check_partial(session.partial_since_ns, *session.conn, now_ns);
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
void UcxTransport::State::flush_control() {
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

bool UcxTransport::State::is_ready(int fd) const {
  return all_ready || std::find(ready_fds.begin(), ready_fds.end(), fd) != ready_fds.end();
}

}  // namespace baton::transport
