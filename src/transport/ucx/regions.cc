// Regions (UcxTransport::State, state.h): local memory mapped on every
// rail, what each peer may see, a peer's region table, the direct-copy
// table, and revocation.
#include "transport/ucx/state.h"

#include <random>

#include "baton/common/log.h"

namespace baton::transport {

void UcxTransport::State::publish_direct() {
  direct_dirty = false;
  std::shared_ptr<DirectTable> t;
  if (config.same_host_copy && !shut_down) {
    t = std::make_shared<DirectTable>();
    // Unique in the process, not per transport: a resolution made against
    // another engine's table must never match this one's (a PreparedBatch
    // submitted to two engines copied into the first one's memory).
    static std::atomic<std::uint64_t> generations{0};
    t->generation = generations.fetch_add(1, std::memory_order_relaxed) + 1;
    for (const auto& [base, r] : regions) {
      if (r.kind != MemoryKind::kDram || r.staged || r.revoking) continue;
      t->locals.emplace(r.handle, DirectTable::Local{reinterpret_cast<std::byte*>(r.base), r.length,
                                                     r.shared ? r.shared->mapping : nullptr});
    }
    for (PathId id = 0; id < peers.size(); ++id) {  // a later connect to the same address wins
      const Peer& peer = peers[id];
      if (peer.state != PathState::kReady || peer.same_host_pid == 0) continue;
      DirectTable::Peer& p = t->peers[infos[id].to];
      p = DirectTable::Peer{peer.same_host_pid, {}, peer.same_process};
      for (const auto& [key, keys] : peer.regions) {
        if (keys->info.staged) continue;  // the holder's copy answers those
        p.regions.emplace(key, DirectTable::Remote{keys->info.base, keys->info.length, keys->mapping});
      }
    }
  }
  std::shared_ptr<const DirectTable> old = std::exchange(direct, std::move(t));
  direct_table.store(direct.get(), std::memory_order_seq_cst);  // before the snapshot below
  direct_generation.store(direct ? direct->generation : 0, std::memory_order_release);
  // poll() prunes them each turn: an engine whose regions are never
  // revoked does not keep one entry per table it ever published.
  if (old) retired.push_back({std::move(old), ucx::Readers::snapshot()});
}

// Whether a copy may still read a table that is no longer published; frees
// the retired tables no copy can read any more (their mappings with them).
bool UcxTransport::State::retired_in_use() {
  std::erase_if(retired, [](Retired& r) { return r.readers.left(); });
  return !retired.empty();
}

// Closes the control connections of failed same-host paths once no copy can
// still use the holder's memory: no table a copy may read names it, and no
// slice of the path is in flight (CMA and worker copies end as slices).
void UcxTransport::State::close_lingering() {
  if (lingering.empty()) return;
  // Their last frames are written first, for a while: a connection that
  // cannot take them is gone, and a peer that reads none is given up on.
  std::erase_if(lingering, [](const Lingering& l) { return l.conn->queued() > 0 && !l.conn->flush().is_ok(); });
  for (Lingering& l : lingering) {
    if (l.conn->queued() > 0 && last_poll_ns >= l.flush_until) {
      baton::logger().debug("ucx: path {} to {}: {} bytes of control frames not taken within {} ms of closing; dropped",
                            l.path, peers[l.path].address, l.conn->queued(), kFarewellFlushNs / 1'000'000);
      l.conn->drop_queued();
    }
  }
  if (direct_dirty) publish_direct();
  if (retired_in_use()) return;
  std::erase_if(lingering,
                [this](const Lingering& l) { return peers[l.path].inflight == 0 && l.conn->queued() == 0; });
}

// A revocation (ours, or a peer's we have yet to acknowledge), or the close
// of a failed same-host path, that a copy may be holding back: nothing wakes
// the loop when a caller's copy ends. Asked every loop turn: the
// retired tables (almost always none) go first; poll() prunes them. Staged
// copies that serve a region are polled anyway (kStagedPollNs).
bool UcxTransport::State::revocation_waits_on_copies() const {
  if (!lingering.empty()) return true;
  if (retired.empty()) return false;
  return std::ranges::any_of(peers, [](const Peer& p) { return !p.revokes.empty(); }) ||
         std::ranges::any_of(regions, [](const auto& r) { return r.second.revoking; });
}

bool UcxTransport::State::visible(const LocalRegion& r, const Session& session) {
  return session.authenticated && !r.revoking && (r.exported_all || r.exported_to.contains(session.name));
}

// The regions `session` may use now; remembered as what it was told.
std::vector<RegionDescriptor> UcxTransport::State::tell_regions(Session& session) {
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
Result<RegionHandle> UcxTransport::State::map_region(void* addr, std::size_t length, MemoryKind kind, int numa_node) {
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
  region.shared = std::move(shared);
  return add_region(addr, length, kind, std::move(region), {});
}

RegionHandle UcxTransport::State::add_region(void* addr, std::size_t length, MemoryKind kind, LocalRegion region,
                                             std::shared_ptr<UcxTransport::StagedAccess> staged) {
  // Unique in the process, not per engine: another engine's handle named
  // here is not_found, where a per-engine count named a region of this one
  // and moved bytes into the wrong buffer. Never 0 or ~0 (no target). From
  // a random start, so that a process restarted on the same address does
  // not hand out its predecessor's handles: a peer's remote region kept from
  // before the restart named the new process's region and read its bytes.
  static std::atomic<RegionHandle> next{[] {
    std::random_device device;
    return std::uniform_int_distribution<RegionHandle>(1, 1U << 31)(device);
  }()};
  do {
    region.handle = next.fetch_add(1, std::memory_order_relaxed);
  } while (region.handle == 0 || region.handle == ~RegionHandle{0} || region_base.contains(region.handle));
  region.base = reinterpret_cast<std::uintptr_t>(addr);
  region.length = length;
  region.kind = kind;
  region.staged = std::move(staged);
  region_base.emplace(region.handle, region.base);
  const RegionHandle handle = region.handle;
  regions.emplace(region.base, std::move(region));
  publish_direct();  // the next copy_direct may use it
  return handle;
}

Status UcxTransport::State::check_new_range(std::string_view call, void* addr, std::size_t length) const {
  const auto base = reinterpret_cast<std::uintptr_t>(addr);
  if (addr == nullptr) return Status::invalid_argument("{}: address is null (length {})", call, length);
  if (length == 0) return Status::invalid_argument("{}: length is 0 (address {})", call, addr);
  if (base + length < base) {
    return Status::invalid_argument("{}: [{}, +{}) wraps around the address space", call, addr, length);
  }
  if (const LocalRegion* clash = find_overlapping(regions, base, length); clash != nullptr) {
    return Status::invalid_argument("{}: [{:#x}, +{}) overlaps region {} [{:#x}, +{}){}", call, base, length,
                                    clash->handle, clash->base, clash->length,
                                    clash->revoking ? ", which is being unregistered: a peer has not acknowledged its "
                                                      "revocation yet (unregister it again to wait)"
                                                    : "");
  }
  return Status::ok();
}

// Whether region `key` is being revoked and session `id` has not
// acknowledged yet: what it posted before it learned of the revocation
// is still served (the memory stays mapped until it acknowledges).
bool UcxTransport::State::revoking_for(std::uint32_t key, std::uint64_t id) const {
  const auto base = region_base.find(key);
  if (base == region_base.end()) return false;
  const LocalRegion& r = regions.at(base->second);
  return r.revoking && r.awaiting.contains(id);
}

// A same-host peer's region that is a memfd is mapped here, and copied
// with plain stores (CMA, by address, where it cannot be).
void UcxTransport::State::map_memfd(const Peer& peer, RemoteRegionKeys& keys) {
  if (peer.same_host_pid == 0 || keys.memfd < 0 || keys.mapping) return;
  auto mapped = ucx::map_peer_memfd(peer.same_host_pid, keys.memfd, keys.memfd_inode, keys.info.length);
  if (mapped) {
    keys.mapping = std::make_shared<const ucx::Mapping>(std::move(*mapped));
  } else {
    baton::logger().debug("ucx: region {} of {}: {}; copying with CMA", keys.info.key, peer.address,
                          mapped.error().message());
  }
}

// Replaces the peer's region table by `descriptors`, unpacking the rkeys
// of new regions on every lane. Regions that did not change keep theirs.
Status UcxTransport::State::apply_regions(PathId id, const std::vector<RegionDescriptor>& descriptors) {
  Peer& peer = peers[id];
  std::map<RegionHandle, std::shared_ptr<RemoteRegionKeys>> table;
  for (const RegionDescriptor& d : descriptors) {
    if (table.contains(d.key)) {
      return Status::invalid_argument("ucx handshake: peer {} announced region key {} twice", peer.address,
                                      d.key);
    }
    auto old = peer.regions.find(d.key);
    if (old != peer.regions.end() && old->second->info.base == d.base && old->second->info.length == d.length &&
        old->second->memfd == d.memfd && old->second->memfd_inode == d.memfd_inode &&
        old->second->info.staged == d.packed_rkeys.empty()) {
      table.emplace(d.key, old->second);
      continue;
    }
    auto keys = std::make_shared<RemoteRegionKeys>();
    const bool staged = d.packed_rkeys.empty();  // reached by messages only
    keys->info = {d.key, d.base, d.length, staged};
    keys->rkeys.assign(peer.lanes.size(), nullptr);
    for (std::size_t i = 0; i < peer.lanes.size() && !staged; ++i) {
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
    map_memfd(peer, *keys);
    table.emplace(d.key, std::move(keys));
  }
  peer.regions = std::move(table);
  direct_dirty = true;
  return Status::ok();
}

// Acknowledges revocations once no slice of ours on that path still uses
// one of the revoked regions (a posted RMA may land until it completed).
Status UcxTransport::State::acknowledge_revokes(PathId id) {
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

bool UcxTransport::State::copies_into_us(std::uint64_t id) const {
  const Session& session = sessions.at(id);
  if (!session.authenticated || session.direct_pid == 0 || ucx::process_gone(session.direct_pid)) return false;
  // A memfd region too: an initiator that cannot map it (out of
  // descriptors, say) copies into it by address as well.
  auto dram = [](const LocalRegion& r) { return !r.staged && r.kind == MemoryKind::kDram; };
  const bool told = std::ranges::any_of(session.sent, [&](RegionHandle handle) {
    const auto base = region_base.find(handle);
    return base != region_base.end() && dram(regions.at(base->second));
  });
  return told || std::ranges::any_of(regions, [&](const auto& entry) {
           return entry.second.revoking && entry.second.awaiting.contains(id) && dram(entry.second);
         });
}

bool UcxTransport::State::drain(std::uint64_t id, TimeNs now_ns) {
  if (!copies_into_us(id)) return false;
  // Its path fails unavailable, as at a close; it closes the connection
  // once its copies into us ended.
  if (!tell(id, ControlKind::kRefusal, ucx::encode_text("the listener shut down"))) return true;  // closed by tell
  sessions.at(id).drain_deadline_ns = now_ns + config.revoke_timeout_ms * 1'000'000;
  return true;
}

void UcxTransport::State::drain_sessions(TimeNs now_ns) {
  for (std::uint64_t id : session_ids()) {
    const Session& session = sessions.at(id);
    if (session.drain_deadline_ns == 0) continue;
    if (ucx::process_gone(session.direct_pid)) {
      close_session(id, "the transport shut down");
    } else if (now_ns >= session.drain_deadline_ns) {
      baton::logger().error(
          "ucx: shut down while peer {} (process {} of this host, which copies into registered memory itself) had "
          "not ended its copies{}: it may still write into that memory until it runs again and sees the close, or "
          "exits",
          session.name, session.direct_pid,
          now_ns == kForeverNs ? std::string(" (closed without waiting)")
                               : fmt::format(" within {} ms", config.revoke_timeout_ms));
      close_session(id, "the transport shut down");
    }
  }
}

// Unmaps regions whose revocation every session acknowledged; dismisses
// sessions that did not within the revoke timeout.
void UcxTransport::State::finish_revokes(TimeNs now_ns) {
  if (shut_down) drain_sessions(now_ns);
  for (auto it = regions.begin(); it != regions.end();) {
    LocalRegion& r = it->second;
    if (!r.revoking) {
      ++it;
      continue;
    }
    if (r.revoke_deadline_ns == 0) r.revoke_deadline_ns = now_ns + config.revoke_timeout_ms * 1'000'000;
    if (!r.awaiting.empty() && now_ns >= r.revoke_deadline_ns) {
      // A peer of this host that writes our memory itself (CMA, by
      // address): closing its connection does not stop a copy it has queued
      // (a stopped process runs it when continued, into whatever the caller
      // put there since). So it is waited for while it lives: it
      // acknowledges, or its connection closes as its path fails or it exits
      // (it keeps it open until no copy of its can reach us).
      for (std::uint64_t id : std::set(r.awaiting)) {
        const pid_t pid = sessions.at(id).direct_pid;
        if (copies_into_us(id)) {
          if (!std::exchange(r.overdue_logged, true)) {
            baton::logger().warn("ucx: region {}: peer {} (process {} of this host, which copies into it directly) "
                                 "has not acknowledged its revocation within {} ms; waiting for it, or for it to exit",
                                 r.handle, sessions.at(id).name, pid, config.revoke_timeout_ms);
          }
          // Looked at again a little later (whether it exited), not at
          // every turn: a deadline in the past would keep the loop awake.
          r.revoke_deadline_ns = now_ns + LocalRegion::kDirectPeerLookNs;
          continue;
        }
        close_session(id, fmt::format("did not acknowledge the revocation of region {} within {} ms", r.handle,
                                      config.revoke_timeout_ms));
      }
    }
    // A copy on another thread may still be in it (copy_direct), or a
    // staged copy into or out of it.
    if (!r.awaiting.empty() || r.serving > 0 || retired_in_use()) {
      ++it;
      continue;
    }
    unmap(r);
    region_base.erase(r.handle);
    it = regions.erase(it);
  }
}

}  // namespace baton::transport
