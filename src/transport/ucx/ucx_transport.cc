// UcxTransport: the Transport interface over its State (state.h, which
// describes the design), whose methods live by job in rails.cc,
// slices.cc, regions.cc, listener.cc and initiator.cc.
#include "baton/common/copy.h"
#include "baton/common/log.h"
#include "baton/transport/ucx_transport.h"

#include <arpa/inet.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <ranges>
#include <tuple>

#include "transport/ucx/state.h"

namespace baton::transport {

// --- UcxTransport ------------------------------------------------------------

namespace {

// Why copy_direct takes nothing at all.
constexpr std::string_view kNoDirectCopies = "no direct copies here (same_host_copy off, a codec set, or shut down)";

// A copy's peer against the one before it, without a memcmp call per copy
// (it was a fifth of copy_direct's checks, callgrind): a batch names one
// peer again and again, and an address of 8..16 characters ("127.0.0.1:7000")
// is two overlapping 8-byte words.
bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.size() < 8 || a.size() > 16) return a == b;
  std::uint64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  std::memcpy(&a0, a.data(), 8);
  std::memcpy(&a1, a.data() + a.size() - 8, 8);
  std::memcpy(&b0, b.data(), 8);
  std::memcpy(&b1, b.data() + b.size() - 8, 8);
  return a0 == b0 && a1 == b1;
}

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
    // A NUL too: if_nametoindex() would read "lo\0junk" as "lo".
    if (nic.empty() || nic.size() > 64 || nic.find_first_of(std::string_view(", \t\n/\0", 6)) != std::string::npos) {
      return Status::invalid_argument("UcxTransport::create: NIC \"{}\" is not a device name", shown(nic));
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

// UCX handles every worker's async events (a TCP listener's accepts among
// them) on one thread per process, started with the first worker and
// stopped with the last. A child of fork() inherits that thread's state and
// its epoll instance, which it shares with the parent, but not the thread:
// a worker made there while the parent had one missed its lanes'
// connections (6 of 8 such children failed their handshake), and its
// descriptors joined the parent's epoll set. Counted, to refuse that child.
std::atomic<int> live_transports{0};
std::atomic<bool> forked_with_live_transports{false};

void watch_forks() {
  static std::once_flag registered;
  std::call_once(registered, [] {
    (void)::pthread_atfork(nullptr, nullptr, [] {
      if (live_transports.load(std::memory_order_relaxed) > 0) forked_with_live_transports = true;
    });
  });
}

}  // namespace

UcxTransport::UcxTransport(std::unique_ptr<State> state) : state_(std::move(state)) {
  live_transports.fetch_add(1, std::memory_order_relaxed);
}
UcxTransport::~UcxTransport() { live_transports.fetch_sub(1, std::memory_order_relaxed); }

bool runs_progress_threads(const UcxConfig& config) {
  if (config.progress_threads >= 0) return config.progress_threads > 0;
  return std::thread::hardware_concurrency() >= 8;
}

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxConfig config) {
  watch_forks();
  if (forked_with_live_transports) {
    return std::unexpected(Status::failed_precondition(
        "UcxTransport::create: this process is a child of fork() made while an engine (a UCX worker) was open in "
        "its parent; UCX's event thread does not survive fork, so an engine here would miss its peers' "
        "connections. Start the process fresh (multiprocessing's 'spawn' or 'forkserver', posix_spawn, exec), or "
        "fork before the parent opens its engine"));
  }
  if (config.lanes_per_peer < 1 || config.lanes_per_peer > ucx::kMaxLanes) {
    // A peer's handshake refuses more (control_wire.h).
    return std::unexpected(Status::invalid_argument("UcxTransport::create: lanes_per_peer is {} (expected 1..{})",
                                                    config.lanes_per_peer, ucx::kMaxLanes));
  }
  for (auto [name, value, zero_ok] : {std::tuple{"stall_timeout_ms", config.stall_timeout_ms, true},
                                      std::tuple{"handshake_timeout_ms", config.handshake_timeout_ms, false},
                                      std::tuple{"revoke_timeout_ms", config.revoke_timeout_ms, false}}) {
    if (value < (zero_ok ? 0 : 1) || value > kMaxTimeoutMs) {
      return std::unexpected(Status::invalid_argument("UcxTransport::create: {} is {} (expected {}..{}{})", name,
                                                      value, zero_ok ? 0 : 1, kMaxTimeoutMs,
                                                      zero_ok ? "; 0: never" : ""));
    }
  }
  // UCX reads the list as a C string: a NUL would cut it silently.
  if (config.tls.find('\0') != std::string::npos) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::create: tls \"{}\" has a NUL byte", shown(config.tls)));
  }
  // UCX reads "a,,b" or "," as naming a transport "" (and then reports
  // "no such element"): the caller's list, so said as such.
  if (!config.tls.empty() && std::ranges::any_of(std::views::split(config.tls, ','),
                                                 [](auto name) { return std::ranges::empty(name); })) {
    return std::unexpected(Status::invalid_argument("UcxTransport::create: tls \"{}\" has an empty transport name",
                                                    shown(config.tls)));
  }
  for (const auto& [name, value] : {std::pair{"max_unauthenticated", config.max_unauthenticated},
                                    std::pair{"max_unauthenticated_per_address", config.max_unauthenticated_per_address},
                                    std::pair{"max_sessions", config.max_sessions}}) {
    if (value < 1) {
      return std::unexpected(Status::invalid_argument("UcxTransport::create: {} is {} (expected >= 1)", name, value));
    }
  }
  if (config.tcp_segment_bytes != 0 &&
      (config.tcp_segment_bytes < kMinTcpSegmentBytes || config.tcp_segment_bytes > kMaxTcpSegmentBytes)) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: tcp_segment_bytes is {} (expected 0 for UCX's default, or {} .. {})",
        config.tcp_segment_bytes, kMinTcpSegmentBytes, kMaxTcpSegmentBytes));
  }
  if (config.tcp_receive_buffer_bytes != 0 && (config.tcp_receive_buffer_bytes < kMinTcpReceiveBufferBytes ||
                                               config.tcp_receive_buffer_bytes > kMaxTcpReceiveBufferBytes)) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: tcp_receive_buffer_bytes is {} (expected 0 for the kernel's autotuning, or {} .. {})",
        config.tcp_receive_buffer_bytes, kMinTcpReceiveBufferBytes, kMaxTcpReceiveBufferBytes));
  }
  if (config.copy_threads < -1 || config.copy_threads > kMaxCopyThreads) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: copy_threads is {} (expected -1 for one per 8 cores, 0 for none, or up to {})",
        config.copy_threads, kMaxCopyThreads));
  }
  if (config.progress_threads < -1 || config.progress_threads > 1) {
    return std::unexpected(Status::invalid_argument(
        "UcxTransport::create: progress_threads is {} (expected -1 for on from 8 cores, 0 for off, 1 for on)",
        config.progress_threads));
  }
  if (Status s = check_nics(config); !s.is_ok()) return std::unexpected(s);
  auto listen = parse_socket_address(config.listen_address);
  if (!listen) return std::unexpected(listen.error());

  auto state = std::make_unique<State>();
  // The secret: said, else its file, else $BATON_TOKEN_FILE.
  state->secret = config.secret;
  std::string secret_file = config.secret_file;
  if (state->secret.empty() && secret_file.empty()) {
    if (const char* env = std::getenv("BATON_TOKEN_FILE"); env != nullptr) {
      // Set but empty is a deployment's unset variable, not a wish for no secret.
      if (*env == '\0') {
        return std::unexpected(Status::invalid_argument(
            "UcxTransport::create: BATON_TOKEN_FILE is set but empty (unset it for no secret, or name the file)"));
      }
      secret_file = env;
    }
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
    if (!is_loopback(listen->get()) && !config.allow_unauthenticated) {
      return std::unexpected(Status::invalid_argument(
          "UcxTransport::create: listening on {} without a secret would let any host that reaches it read and write "
          "the memory peers are given: set a secret (--token-file, BATON_TOKEN_FILE, UcxConfig::secret), listen on "
          "loopback, or say allow_unauthenticated",
          shown(config.listen_address)));
    }
    if (is_loopback(listen->get())) {
      baton::logger().debug("ucx: no secret: listening on loopback {} only, for processes of this host",
                            config.listen_address);
    } else {
      baton::logger().warn("ucx: no secret, and listening on {}: any host that reaches it is a peer (allow_unauthenticated)",
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
  if (runs_progress_threads(cfg)) {
    if (Status st = state->start_progress_threads(); !st.is_ok()) return std::unexpected(st);
  }
  state->address = state->listener->address();
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(state)));
}

const std::string& UcxTransport::address() const { return state_->address; }

const std::vector<std::pair<std::string, std::string>>& UcxTransport::ucx_settings() const {
  return state_->ucx_settings;
}

Result<RegionHandle> UcxTransport::register_memory(void* addr, std::size_t length, MemoryKind kind) {
  const auto held = state_->hold();
  if (Status s = state_->check_new_range("UcxTransport::register_memory", addr, length); !s.is_ok()) {
    return std::unexpected(s);
  }
  // UCX maps an unmapped range without complaint (nothing pins it here);
  // the first copy would then fail with EFAULT, blaming neither side, and
  // a write into a read-only page would fault the thread that copies.
  if (kind == MemoryKind::kDram) {
    if (Status s = ucx::check_mapped_writable(addr, length); !s.is_ok()) {
      return std::unexpected(Status(s.code(), "UcxTransport::register_memory: " + s.message()));
    }
  }
  return state_->map_region(addr, length, kind);
}

Result<RegionHandle> UcxTransport::register_staged(void* addr, std::size_t length, MemoryKind kind,
                                                   std::shared_ptr<StagedAccess> access) {
  const auto held = state_->hold();
  if (Status s = state_->check_new_range("UcxTransport::register_staged", addr, length); !s.is_ok()) {
    return std::unexpected(s);
  }
  if (!access) {
    return std::unexpected(Status::invalid_argument("UcxTransport::register_staged: [{}, +{}) comes without access",
                                                    addr, length));
  }
  if (kind != MemoryKind::kDram && kind != MemoryKind::kVram) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::register_staged: unknown memory kind {}", static_cast<int>(kind)));
  }
  return state_->add_region(addr, length, kind, {}, std::move(access));
}

Result<UcxTransport::AllocatedRegion> UcxTransport::allocate_memory(std::size_t length, int numa_node) {
  const auto held = state_->hold();
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
  const auto held = state_->hold();
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
  if (region.awaiting.empty() && region.serving == 0 && !s.retired_in_use()) {
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
  const auto held = state_->hold();
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
      return Status::invalid_argument("UcxTransport::export_region: peer name \"{}\" (expected 1..{} bytes)", shown(name),
                                      ucx::kMaxNameBytes);
    }
    // A peer is named by its listen address, which always has a port.
    auto split = split_host_port(name);
    if (!split || split->port == 0) {
      return Status::invalid_argument("UcxTransport::export_region: peer \"{}\" is not a listen address: {}", shown(name),
                                      split ? "port 0" : split.error().message());
    }
    // Peers say their listen address with a numeric host: a host name here
    // would match none of them, and the export would reach no one silently.
    in6_addr numeric{};
    const std::string host(split->host);
    if (::inet_pton(AF_INET, host.c_str(), &numeric) != 1 && ::inet_pton(AF_INET6, host.c_str(), &numeric) != 1) {
      return Status::invalid_argument(
          "UcxTransport::export_region: peer \"{}\": name a peer by its numeric listen address (as "
          "Peer::address says it), not a host name",
          shown(name));
    }
    // No peer says a wildcard: one listening on every interface names
    // itself by the interface it reaches us through (reachable_address).
    if (const auto at = parse_socket_address(name); at && is_wildcard(at->get())) {
      return Status::invalid_argument(
          "UcxTransport::export_region: peer \"{}\" names every interface, not a peer: one listening so names "
          "itself by the address of the interface it reaches this engine through ({}:{} over loopback)",
          shown(name), at->get()->sa_family == AF_INET ? "127.0.0.1" : "[::1]", split->port);
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
  const auto held = state_->hold();
  auto it = state_->region_base.find(handle);
  if (it == state_->region_base.end()) {
    return std::unexpected(Status::not_found("UcxTransport::packed_rkey: no region {}", handle));
  }
  const LocalRegion& r = state_->regions.at(it->second);
  if (r.staged) {
    return std::unexpected(
        Status::failed_precondition("UcxTransport::packed_rkey: region {} is staged: UCX has no key for it", handle));
  }
  return r.packed_rkeys.front();
}

Result<PathId> UcxTransport::connect(std::string_view peer_address, TimeNs now_ns) {
  const auto held = state_->hold();
  State& s = *state_;
  if (s.shut_down) {
    return std::unexpected(Status::unavailable("UcxTransport::connect: {}: the transport shut down", shown(peer_address)));
  }
  auto target = parse_socket_address(peer_address);
  if (!target) {
    return std::unexpected(Status::invalid_argument("UcxTransport::connect: {}", target.error().message()));
  }
  if (port_of(target->get()) == 0) {
    return std::unexpected(
        Status::invalid_argument("UcxTransport::connect: address \"{}\" has port 0", shown(peer_address)));
  }
  const std::string address = format_socket_address(target->get());
  // A failed path that holds nothing any more (a refused or timed-out
  // handshake; a peer that died, once its lanes closed) is taken again,
  // one to this address first: else a caller retrying a dead peer added a
  // path a try (1.4 KB each, walked by every connect and every loop turn),
  // each restart of a peer about 2 KB, and each peer that came back on
  // another address (a rescheduled pod) as much. Its incarnation moves.
  std::optional<PathId> reuse;
  bool same_address = false;
  for (PathId id = 0; id < s.peers.size(); ++id) {
    const State::Peer& p = s.peers[id];
    const bool here = p.address == address;
    if (here && p.state != PathState::kFailed) return id;
    if ((!reuse || (here && !same_address)) && s.reusable(id)) {
      reuse = id;
      same_address = here;
    }
  }

  // Out of descriptors, UCX aborts the process; short of them, the lanes
  // failed as "closed the connection", naming nothing (an audit).
  const std::int64_t lanes = std::int64_t{s.config.lanes_per_peer} * static_cast<std::int64_t>(s.rails.size());
  if (const std::int64_t left = ucx::free_fds(); left < 4 * lanes + 64) {
    return std::unexpected(Status::resource_exhausted(
        "UcxTransport::connect: {}: this process has {} file descriptors left, short of what {} lanes take (raise "
        "its limit: ulimit -n)",
        address, left, s.config.lanes_per_peer));
  }
  const auto id = reuse.value_or(static_cast<PathId>(s.peers.size()));
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
  PathInfo info{s.address, address, topology::PathType::kTcp, s.config.lanes_per_peer, 0, 0};
  if (reuse) {
    info.incarnation = s.infos[id].incarnation + 1;
    s.peers[id] = std::move(peer);
    s.infos[id] = std::move(info);
  } else {
    s.peers.push_back(std::move(peer));
    s.infos.push_back(std::move(info));
  }
  s.set_path_type(id, topology::PathType::kTcp);  // until UCX says what it chose
  return id;
}

void UcxTransport::hold_path(PathId path) {
  if (path < state_->peers.size()) ++state_->peers[path].held;
}

void UcxTransport::release_path(PathId path) {
  if (path < state_->peers.size() && state_->peers[path].held > 0) --state_->peers[path].held;
}

PathState UcxTransport::path_state(PathId path) const {
  return path < state_->peers.size() ? state_->peers[path].state : PathState::kFailed;
}

bool UcxTransport::path_in_this_process(PathId path) const {
  return path < state_->peers.size() && state_->peers[path].same_process;
}

bool UcxTransport::path_reusable(PathId path) const { return path < state_->peers.size() && state_->reusable(path); }

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
                                 State::stage_text(peer));
    case PathState::kFailed: return peer.error;
  }
  return peer.error;
}

Status UcxTransport::refresh_regions(PathId path) {
  const auto held = state_->hold();
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
  const auto held = state_->hold();
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
  std::vector<Notification> out;
  out.reserve(state_->notifications.size());
  for (State::Untaken& u : state_->notifications) out.push_back(std::move(u.notification));
  state_->notifications.clear();
  state_->notifications_of.clear();
  state_->notification_bytes = 0;
  state_->dropping_notifications = false;
  return out;
}

NotificationCounts UcxTransport::notification_counts() const {
  NotificationCounts counts = state_->notification_counts;
  counts.untaken = state_->notifications.size();
  return counts;
}

int UcxTransport::event_fd() const { return state_->poller->fd(); }

bool UcxTransport::arm() {
  const auto held = state_->hold();
  State& s = *state_;
  if (!s.finished.empty() || !s.inbox.empty() || !s.lane_errors.empty() || !s.back_errors.empty()) return false;
  if (!s.staged_copies.empty()) return false;  // they have no fd to wake us
  if (s.workers && !s.workers->arm()) return false;
  s.flush_lanes();  // writes submitted since the last poll: their flush goes before we sleep
  // A flush with nothing outstanding (a put that completed at once, as a
  // same-host CMA put does) completes inline: no callback will wake us.
  if (!s.finished.empty()) return false;
  // Revocations and handshakes have deadlines (next_event_ns); frames queued
  // since the last poll go now, or the poller watches for writability.
  s.flush_control();
  // With progress threads they progress and arm the workers; what they
  // record makes the event fd readable.
  if (s.progress_threads) return true;
  // UCX's rule for sleeping: progress until it reports nothing done, then
  // arm. Events it consumed but did not finish (a socket half read) would
  // not fire the fd again, and the loop would sleep on them.
  if (s.progress_once()) return false;
  for (State::Rail& rail : s.rails) {
    const ucs_status_t st = ucp_worker_arm(rail.worker);
    if (st != UCS_OK && st != UCS_ERR_BUSY) baton::logger().warn("ucx: ucp_worker_arm: {}", ucs_status_string(st));
    if (st != UCS_OK) return false;
  }
  return true;
}

const std::vector<PathInfo>& UcxTransport::paths() const { return state_->infos; }
std::uint64_t UcxTransport::paths_version() const { return state_->infos_version; }

Status UcxTransport::submit(const SliceSubmit& slice, TimeNs now_ns) {
  const auto held = state_->hold();
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
  if (local->staged) {
    return Status::failed_precondition(
        "UcxTransport::submit: slice {}: local region {} is staged memory, which UCX cannot reach (copy it to host "
        "memory first)",
        slice.id, local->handle);
  }
  auto remote_it = peer.regions.find(m.remote_key);
  if (remote_it == peer.regions.end()) {
    // not_found, as the engine says at submit: most often the peer revoked
    // it while a batch ran, and the batch's later slices end here.
    return Status::not_found(
        "remote_key {} is not a region of peer {} ({} known): unregistered there, or registered since its "
        "regions were last learned (a refresh learns them); slice {}",
        m.remote_key, peer.address, peer.regions.size(), slice.id);
  }
  const RemoteRegion& remote = remote_it->second->info;
  if (m.remote_addr < remote.base || slice.bytes > remote.length ||
      m.remote_addr - remote.base > remote.length - slice.bytes) {
    return Status::out_of_range(
        "UcxTransport::submit: slice {}: remote range [{:#x}, +{}) is not inside region {} [{:#x}, +{}) of peer {}",
        slice.id, m.remote_addr, slice.bytes, remote.key, remote.base, remote.length, peer.address);
  }
  if (remote.staged && slice.bytes > ucx::kMaxCompressedSliceBytes) {
    return Status::invalid_argument(
        "UcxTransport::submit: slice {}: {} bytes of staged region {} of peer {} in one slice (at most {})", slice.id,
        slice.bytes, remote.key, peer.address, ucx::kMaxCompressedSliceBytes);
  }

  auto op = std::make_unique<State::SliceOp>();
  op->state = &s;
  op->submit = slice;
  op->local = local;
  op->remote = remote_it->second;
  if (peer.same_host_pid != 0 && !compress && local->kind == MemoryKind::kDram && !remote.staged) {
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
        copy_bytes(m.local, there, slice.bytes);
      } else {
        copy_bytes(there, m.local, slice.bytes);
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
  // A staged region has no rkey: messages are its only way.
  const bool as_messages = remote.staged || (s.config.tcp_slices_as_messages &&
                                             s.infos[slice.path].type == topology::PathType::kTcp &&
                                             slice.bytes <= ucx::kMaxCompressedSliceBytes);
  if (compress || as_messages) {
    // A write goes compressed when the codec shrinks it (else raw, as a
    // message or as plain RMA below); a read asks the holder to compress,
    // which it does if it shrinks.
    SliceDescriptor d{m.remote_key, compress ? s.codec_id : WireCodec::kRaw, 0, m.remote_addr, slice.bytes};
    std::vector<std::uint8_t> payload;
    const auto* bytes = static_cast<const std::byte*>(m.local);
    if (!compress && (m.op == Op::kRead || slice.bytes <= kMaxBundledSliceBytes)) {
      // A small raw write, or a raw read's ask of any size (it carries no
      // bytes), waits for the rest of this turn's in its lane's bundle.
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
    MessageHeader header;
    header.path = slice.path;
    header.lane = static_cast<std::uint32_t>(lane);
    header.seq = slice.id;
    if (!compress && m.op == Op::kWrite && s.config.peer_failure_detection) {
      // Raw: sent from the region itself. Only where a lane's close is
      // forced: it ends the send, so a failed path cannot leave UCX reading
      // memory the caller got back.
      op->awaiting_reply = true;
      op->wire_bytes = ucx::kSliceDescriptorBytes + slice.bytes;
      if (Status st = s.send_from_region(ep, header, d, bytes, *op); !st.is_ok()) {
        return Status::unavailable("UcxTransport::submit: slice {}: {}", slice.id, st.message());
      }
      ++local->inflight;
      State::note_posted(peer, op->rail, now_ns);
      s.slices.emplace(slice.id, std::move(op));
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
  const auto held = state_->hold();
  State& s = *state_;
  s.flush_lanes();
  if (s.progress_threads) {
    s.progress_threads->drain();  // what they recorded is read below
  } else {
    s.progress();
  }
  s.last_poll_ns = now_ns;
  s.handle_recorded();
  s.answer_staged_copies();
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
  if (!s.retired.empty()) (void)s.retired_in_use();  // frees what no copy reads any more
  s.close_lingering();
}

Status UcxTransport::copy_direct(std::span<const DirectCopy> copies, std::span<Status> results) const {
  thread_local ResolvedCopies resolved;  // per thread: no allocation per batch
  if (resolved.copies.capacity() > 4096) resolved.copies = {};  // ... nor does one huge batch stay pinned
  resolved.generation = 0;  // checked every time
  return copy_direct(copies, resolved, results);
}

std::uint64_t UcxTransport::direct_generation() const {
  return state_->direct_generation.load(std::memory_order_acquire);
}

Status UcxTransport::State::resolve_direct(const DirectTable& table, std::span<const DirectCopy> copies,
                                          ResolvedCopies& resolved) {
  auto refuse = [](std::size_t i, std::string_view why) {
    return Status::failed_precondition("copy_direct: copy {}: {}", i, why);
  };
  resolved.generation = 0;
  resolved.copies.resize(copies.size());
  // A batch mostly names one peer and the same two regions: each lookup
  // is redone only when its key changes from the copy before.
  const DirectTable::Peer* peer = nullptr;
  std::string_view peer_name;
  const DirectTable::Local* local = nullptr;
  const DirectTable::Remote* remote = nullptr;
  for (std::size_t i = 0; i < copies.size(); ++i) {  // everything checked before anything is copied
    const DirectCopy& c = copies[i];
    if (peer == nullptr || !same_name(c.peer, peer_name)) {
      const auto it = table.peers.find(c.peer);
      if (it == table.peers.end()) return refuse(i, "not a ready same-host peer");
      peer = &it->second;
      peer_name = it->first;
      remote = nullptr;
    }
    if (local == nullptr || i == 0 || c.local != copies[i - 1].local) {
      const auto it = table.locals.find(c.local);
      local = it == table.locals.end() ? nullptr : &it->second;
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
    if (peer->self && ranges_overlap(reinterpret_cast<std::uintptr_t>(local->base) + c.local_offset,
                                     remote->base + c.remote_offset, c.bytes)) {
      return refuse(i, "its two ranges overlap");  // the loop's check says so
    }
    resolved.copies[i] = {local->base + c.local_offset,
                          remote->mapping ? remote->mapping->address() + c.remote_offset : nullptr,
                          remote->base + c.remote_offset, peer->pid, c.op, c.bytes};
  }
  resolved.generation = table.generation;
  return Status::ok();
}

Status UcxTransport::check_direct(std::span<const DirectCopy> copies) const {
  thread_local ResolvedCopies resolved;  // per thread: no allocation per batch
  if (resolved.copies.capacity() > 4096) resolved.copies = {};  // ... nor does one huge batch stay pinned
  const ucx::Readers::Section reading;
  const State::DirectTable* const table = state_->direct_table.load(std::memory_order_seq_cst);
  if (!table || state_->codec_set) {
    return Status::failed_precondition("copy_direct: copy 0: {}", kNoDirectCopies);
  }
  return State::resolve_direct(*table, copies, resolved);
}

Status UcxTransport::copy_direct(std::span<const DirectCopy> copies, ResolvedCopies& resolved,
                                 std::span<Status> results) const {
  // A table the loop replaces meanwhile is freed only after this section
  // (a revocation waits for it).
  const ucx::Readers::Section reading;
  const State::DirectTable* const table = state_->direct_table.load(std::memory_order_seq_cst);
  if (!table || state_->codec_set) {
    return Status::failed_precondition("copy_direct: copy 0: {}", kNoDirectCopies);
  }
  if (resolved.generation != table->generation) {
    if (copies.empty()) {
      return Status::failed_precondition("copy_direct: copy 0: the table changed since these copies were resolved");
    }
    if (Status s = State::resolve_direct(*table, copies, resolved); !s.is_ok()) return s;
  }
  if (results.size() != resolved.copies.size()) {
    return Status::invalid_argument("copy_direct: {} results for {} copies", results.size(), resolved.copies.size());
  }
  // The addresses stay valid while `table` is the one they were found in:
  // it holds the mappings, and a region leaves only in a newer table.
  // Local bounds: memcpy may write anywhere as far as the compiler knows,
  // and reloading the vector's after each copy showed in callgrind.
  const ResolvedCopies::Copy* const begin = resolved.copies.data();
  const ResolvedCopies::Copy* const end = begin + resolved.copies.size();
  Status* result = results.data();
  for (const ResolvedCopies::Copy* c = begin; c != end; ++c, ++result) {
    if (c->mapped != nullptr) {
      if (c->op == Op::kRead) {
        copy_bytes(c->local, c->mapped, c->bytes);
      } else {
        copy_bytes(c->mapped, c->local, c->bytes);
      }
      if (!result->is_ok()) *result = Status::ok();  // a caller's reused span
    } else {
      *result = ucx::cma_copy(c->pid, c->op, c->local, c->remote, c->bytes);
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
  const TimeNs partial_ns = state_->config.handshake_timeout_ms * 1'000'000;
  for (const auto& [id, session] : state_->sessions) {
    if (!session.ready_sent && session.deadline_ns != 0) sooner(session.deadline_ns);
    if (session.drain_deadline_ns != 0) sooner(session.drain_deadline_ns);
    if (session.partial_since_ns != 0) sooner(session.partial_since_ns + partial_ns);
    if (session.conn->frame_waiting()) sooner(state_->last_poll_ns);  // left over from a capped turn
  }
  for (const State::Peer& peer : state_->peers) {
    if (!peer.control) continue;
    if (peer.partial_since_ns != 0) sooner(peer.partial_since_ns + partial_ns);
    if (peer.control->frame_waiting()) sooner(state_->last_poll_ns);
  }
  for (const auto& [base, r] : state_->regions) {
    if (r.revoking && r.revoke_deadline_ns != 0) sooner(r.revoke_deadline_ns);
  }
  if (!state_->staged_copies.empty()) sooner(state_->last_poll_ns + State::kStagedPollNs);
  // A revocation held back only by copies on callers' threads (a retired
  // direct table still in use): nothing wakes the loop when they end, so
  // look again soon rather than at the idle tick.
  if (state_->revocation_waits_on_copies()) sooner(state_->last_poll_ns + State::kStagedPollNs);
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
int UcxTransport::progress_threads() const {
  return state_->progress_threads ? static_cast<int>(state_->progress_threads->size()) : 0;
}
int UcxTransport::pinned_progress_threads() const {
  return state_->progress_threads ? state_->progress_threads->pinned() : 0;
}

void UcxTransport::shutdown() {
  const auto held = state_->hold();
  state_->begin_shutdown();
}

// Staged copies count: they may still use the caller's memory.
bool UcxTransport::shutdown_complete() const {
  return state_->shut_down && state_->closing.empty() && state_->staged_copies.empty() &&
         state_->staged_waiting.empty() && state_->lingering.empty() && state_->sessions.empty();
}

}  // namespace baton::transport
