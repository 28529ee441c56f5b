// The initiator's side of the handshake (UcxTransport::State, state.h):
// its control connection, lanes to the listener's workers, the path's type,
// and a failing path.
#include "transport/ucx/state.h"

#include "baton/common/log.h"

namespace baton::transport {

void UcxTransport::State::fail_path(PathId id, Status reason) {
  Peer& peer = peers[id];
  if (peer.state == PathState::kFailed) return;
  if (shut_down) {
    baton::logger().debug("ucx: path {} to {} closed", id, peer.address);
  } else {
    baton::logger().info("ucx: path {} to {} failed: {}", id, peer.address, reason.message());
  }
  peer.state = PathState::kFailed;
  peer.error = std::move(reason);
  direct_dirty = true;
  peer.refresh_seq = 0;
  peer.revokes.clear();
  if (peer.control) {
    poller->forget(peer.control->fd());
    // The listener sees us go; a same-host one, once no copy of ours can
    // still reach its memory (close_lingering). At a shutdown, frames still
    // queued go first: a batch with a notification ended once it was
    // queued, and a caller that waited, then shut down, lost it.
    const bool unsent = shut_down && !peer.control->connecting() && peer.control->queued() > 0;
    if (peer.same_host_pid != 0 || unsent) {
      lingering.push_back({id, std::move(peer.control), last_poll_ns + kFarewellFlushNs});
    }
    peer.control.reset();
  }
  for (auto& lane : peer.lanes) {
    drop_unflushed(*lane);
    if (lane->ep != nullptr) {
      close_endpoint(lane->ep, id);
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

// Whether a failed path holds nothing any more, so that a connect may take
// its slot: no slice of it in flight here or held by the caller, no close of
// its lanes running (a lane is its endpoint's error-handler argument), no
// error of one waiting to be handled, no same-host holder kept waiting on
// its connection.
bool UcxTransport::State::reusable(PathId id) const {
  const Peer& p = peers[id];
  if (p.state != PathState::kFailed || p.inflight != 0 || p.held != 0) return false;
  return std::ranges::none_of(closing, [id](const Closing& c) { return c.path == id; }) &&
         std::ranges::none_of(lingering, [id](const Lingering& l) { return l.path == id; }) &&
         std::ranges::none_of(lane_errors, [id](const auto& e) { return e.first->path == id; });
}

// What UCX chose for the path's RMA, from ucp_ep_print_info (UCX 1.13 has
// no query for it): the transport of the first rma_bw lane.
topology::PathType UcxTransport::State::detect_path_type(ucp_ep_h ep) const {
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

void UcxTransport::State::set_path_type(PathId id, topology::PathType type) {
  PathInfo& info = infos[id];
  info.type = type;
  ++infos_version;
  if (const auto cost = topology::CostModel().cost(type, topology::Proximity::kLocal)) {
    info.bandwidth_gbps = cost->bandwidth_gbps;
    info.latency_us = cost->latency_us;
  }
}

std::string_view UcxTransport::State::stage_text(const Peer& peer) {
  switch (peer.stage) {
    case Stage::kAwaitChallenge: return "waiting for the listener's challenge";
    case Stage::kAwaitWelcome: return "waiting for the listener's welcome";
    case Stage::kBinding:
      return peer.ready_heard ? "waiting for the listener to answer that we are a process of its host"
                              : "waiting for the listener to bind the lanes";
    case Stage::kDone: return "done";
  }
  return "?";
}

Status UcxTransport::State::create_lanes(PathId id, const std::vector<std::vector<std::uint8_t>>& addresses) {
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

// A listener's refusal: permission_denied for a proof it did not take,
// unavailable when it is full (no room for another handshake or peer).
Status UcxTransport::State::refusal(const Peer& peer, const Frame& frame) {
  auto text = ucx::decode_text(frame.body, ucx::kMaxReasonBytes);
  // Quoted printable: the listener may be anyone, and the text reaches a
  // terminal or a log (an escape sequence, a forged line).
  const std::string why = text ? shown(*text, ucx::kMaxReasonBytes) : "(unreadable reason)";
  const StatusCode code = why.starts_with("authentication failed") ? StatusCode::kPermissionDenied
                                                                   : StatusCode::kUnavailable;
  return Status(code, fmt::format("{} refused us: {}", peer.address, why));
}

Status UcxTransport::State::welcome(PathId id, const Frame& frame, std::uint64_t& token) {
  Peer& peer = peers[id];
  if (frame.kind == ControlKind::kRefusal) return refusal(peer, frame);
  if (frame.kind != ControlKind::kWelcome) {
    return Status::invalid_argument("expected a welcome, got frame kind {}", static_cast<int>(frame.kind));
  }
  auto w = ucx::decode_welcome(frame.body);
  if (!w) return w.error();
  if (!ucx::same_proof(w->proof, ucx::listener_proof(secret, peer.challenge, peer.nonce))) {
    return Status::permission_denied("{} does not hold our secret (its proof is wrong)", peer.address);
  }
  if (Status s = check_worker_addresses(w->worker_addresses); !s.is_ok()) return s;
  if (Status s = create_lanes(id, w->worker_addresses); !s.is_ok()) return s;
  const auto pid = static_cast<pid_t>(w->pid);
  peer.same_process = pid == getpid() && ucx::own_cookie_matches(w->cookie_address, w->cookie);
  if (config.same_host_copy && ucx::cookie_matches(pid, w->cookie_address, w->cookie)) {
    // The listener cannot fence our copies by closing our connection, so it
    // must wait for us instead (finish_revokes): we copy directly only once
    // it confirmed our pid (it may not be allowed to read our memory: root
    // copying into another user's process), and the path is ready then.
    peer.direct_asked_pid = pid;
    const ucx::Direct direct{static_cast<std::uint64_t>(getpid()), reinterpret_cast<std::uintptr_t>(cookie.data()),
                             cookie};
    if (Status s = peer.control->send(ControlKind::kDirect, ucx::encode(direct)); !s.is_ok()) return s;
  }
  if (Status s = apply_regions(id, w->regions); !s.is_ok()) return s;
  token = w->session;
  return Status::ok();
}

void UcxTransport::State::become_ready(PathId id) {
  Peer& peer = peers[id];
  peer.stage = Stage::kDone;
  peer.state = PathState::kReady;
  direct_dirty = true;
  set_path_type(id, peer.same_host_pid != 0 ? topology::PathType::kShm : detect_path_type(peer.lanes[0]->ep));
  baton::logger().debug("ucx: path {} ready: {}", id, infos[id].name());
}

// The name a hello gives: the listen address, as the peer can name it
// (its exports name us so): a wildcard listener (0.0.0.0, [::]) names
// itself by the handshake's local address, with its port.
std::string UcxTransport::State::name_for(const ControlConnection& control) const {
  if (!listener) return address;  // shut down: no hello goes out any more
  const auto listen = bound_address(listener->fd());
  const auto local = bound_address(control.fd());
  if (!listen || !local) return address;
  return reachable_address(listen->get(), local->get());
}

Status UcxTransport::State::initiator_frame(PathId id, const Frame& frame) {
  Peer& peer = peers[id];
  switch (peer.stage) {
    case Stage::kAwaitChallenge: {
      if (frame.kind == ControlKind::kRefusal) return refusal(peer, frame);
      if (frame.kind != ControlKind::kChallenge) {
        return Status::invalid_argument("expected a challenge, got frame kind {}", static_cast<int>(frame.kind));
      }
      auto challenge = ucx::decode_challenge(frame.body);
      if (!challenge) return challenge.error();
      auto nonce = ucx::random_nonce();
      if (!nonce) return nonce.error();
      peer.nonce = *nonce;
      peer.challenge = challenge->nonce;
      ucx::Hello hello{peer.nonce, {}, name_for(*peer.control), static_cast<std::uint16_t>(peer.lanes.size()), {}};
      for (const Rail& rail : rails) hello.worker_addresses.push_back(rail.worker_address);
      hello.proof = ucx::initiator_proof(secret, peer.challenge, peer.nonce, ucx::hello_description(hello));
      peer.stage = Stage::kAwaitWelcome;
      return peer.control->send(ControlKind::kHello, ucx::encode(hello));
    }
    case Stage::kAwaitWelcome: {
      std::uint64_t token = 0;
      if (Status s = welcome(id, frame, token); !s.is_ok()) return s;
      peer.stage = Stage::kBinding;
      // Padded whenever UCX carries the lanes over TCP: a same-host peer
      // whose claim the listener cannot confirm goes through them too.
      const bool tcp = detect_path_type(peer.lanes[0]->ep) == topology::PathType::kTcp;
      for (auto& lane : peer.lanes) {
        std::vector<std::uint8_t> payload(ucx::kBindTokenBytes + (tcp ? ucx::kBindPaddingBytes : 0));
        std::memcpy(payload.data(), &token, sizeof token);
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
        peer.ready_heard = true;
        if (peer.direct_asked_pid == 0) become_ready(id);
        return Status::ok();
      }
      if (frame.kind == ControlKind::kDirectAnswer && peer.direct_asked_pid != 0) {
        auto confirmed = ucx::decode_flag(frame.body);
        if (!confirmed) return confirmed.error();
        const pid_t pid = std::exchange(peer.direct_asked_pid, 0);
        if (*confirmed) {
          peer.same_host_pid = pid;
          // Not ready yet: no slice nor published table uses these keys.
          for (auto& [key, keys] : peer.regions) map_memfd(peer, *keys);
          baton::logger().debug("ucx: {} is process {} of this host: copying directly", peer.address, pid);
        } else {
          baton::logger().info("ucx: {} is process {} of this host but cannot read ours to confirm it, so it "
                               "could not wait for our copies: going through UCX instead",
                               peer.address, pid);
        }
        if (peer.ready_heard) become_ready(id);
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
      return Status::unavailable("{} closed the path: {}", peer.address,
                                 text ? shown(*text, ucx::kMaxReasonBytes) : "(unreadable reason)");
    }
    default:
      return Status::invalid_argument("frame kind {} is not for an initiator", static_cast<int>(frame.kind));
  }
}

void UcxTransport::State::drive_paths(TimeNs now_ns) {
  for (PathId id = 0; id < peers.size(); ++id) {
    Peer& peer = peers[id];
    if (peer.state == PathState::kFailed || !peer.control) continue;
    const bool expired = (peer.state == PathState::kConnecting && now_ns >= peer.deadline_ns) ||
                         (peer.partial_since_ns != 0 &&
                          now_ns - peer.partial_since_ns >= config.handshake_timeout_ms * 1'000'000);
    if (!is_ready(peer.control->fd()) && !peer.control->wants_write() && !peer.control->frame_waiting() &&
        peer.revokes.empty() && !expired) {
      continue;
    }
    Status status = peer.control->flush();
    if (status.is_ok()) status = peer.control->receive(ucx::kMaxFrameBytes + ucx::kFrameHeaderBytes);
    for (int taken = 0; taken < kMaxFramesPerPoll; ++taken) {
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
    if (status.is_ok()) status = check_partial(peer.partial_since_ns, *peer.control, now_ns);
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
      const std::string_view stage =
          peer.control->connecting() ? "no TCP connection to its listener yet" : stage_text(peer);
      fail_path(id, Status::unavailable("path {} to {}: handshake did not finish within {} ms ({})", id,
                                        peer.address, config.handshake_timeout_ms, stage));
    }
  }
}

}  // namespace baton::transport
