#include "engine/datapath.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>

#include "baton/common/address_ranges.h"
#include "baton/common/log.h"
#include "baton/topology/cost_model.h"
#include "baton/topology/probe.h"

namespace baton::engine {
namespace {

// Entries a thread keeps of submit_direct's scratch between batches.
constexpr std::size_t kScratchKept = 4096;

// Batch ids are unique in the process, not per engine: another engine's
// handle is not_found here, where a per-engine count named (and could
// release) a batch of this one. Each thread takes them 256 at a time: a
// locked add per batch showed beside a 4 KiB copy (perf). Nothing orders
// batches by id.
std::uint64_t next_batch_id() {
  static constexpr std::uint64_t kBlock = 256;
  static std::atomic<std::uint64_t> next{1};
  thread_local std::uint64_t mine = 0, end = 0;
  if (mine == end) {
    mine = next.fetch_add(kBlock, std::memory_order_relaxed);
    end = mine + kBlock;
  }
  return mine++;
}

bool ended_state(sched::RequestState s) {
  return s != sched::RequestState::kQueued && s != sched::RequestState::kRunning;
}

std::string_view op_name(Op op) { return op == Op::kRead ? "read" : "write"; }

// Empties a status about to be filled request by request (its storage kept).
void restart(BatchStatus& out, bool done) {
  out.done = done;
  out.status = Status::ok();
  out.bytes = 0;
  out.bytes_done = 0;
  out.requests.clear();
}

}  // namespace

Datapath::Datapath(VramStaging& staging, sched::Scheduler& scheduler, admission::AdmissionController& admission,
                   MetricsRegistry& metrics, std::atomic<sched::RequestId>& next_id, EngineLoop& loop)
    : staging_(staging),
      ucx_(staging.ucx()),
      scheduler_(scheduler),
      admission_(admission),
      metrics_(metrics),
      next_id_(next_id),
      loop_(loop),
      ended_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (ended_fd_ < 0) baton::logger().warn("engine: eventfd failed; batch_event_fd() will not wake anyone");
  (void)metrics_.declare_counter("baton_engine_requests_total", "Requests ended, per op and final state");
  (void)metrics_.declare_counter("baton_engine_bytes_total", "Bytes delivered, per op");
  (void)metrics_.declare_counter("baton_engine_batches_total", "Batches submitted");
  (void)metrics_.declare_counter("baton_engine_deadlines_missed_total",
                                 "Requests with a deadline that completed after it or ended without completing, per QoS class");
  (void)metrics_.declare_counter("baton_engine_notifications_sent_total", "Batch notifications sent to peers");
  (void)metrics_.declare_counter("baton_engine_direct_batches_total",
                                 "Same-host batches copied without the loop (within submit, or on the copier's thread)");
  (void)metrics_.declare_gauge("baton_engine_batches_held",
                               "Batches submitted and not yet released, running or ended (each holds its statuses)");
  copier_ = std::make_unique<DirectCopier>(
      ucx_, [this](DirectCopier::Job& job) { end_copied(job); }, [this] { return clock_ ? clock_() : 0; });
}

Result<Region> Datapath::register_memory(void* ptr, std::size_t length, MemoryKind kind, int device) {
  if (kind != MemoryKind::kDram && kind != MemoryKind::kVram) {
    return std::unexpected(Status::invalid_argument("register_memory: unknown memory kind {}", static_cast<int>(kind)));
  }
  // DRAM: `device` is the NUMA node the caller says the memory is on.
  if (device < -1 || (kind == MemoryKind::kDram && device != -1 && !topology::has_numa_node(device))) {
    return std::unexpected(Status::invalid_argument("register_memory: device {} (expected -1 or {} of this machine)",
                                                    device, kind == MemoryKind::kDram ? "a NUMA node" : "a CUDA device"));
  }
  // UCX and the VRAM staging each refuse overlaps among their own regions;
  // this covers a range registered as both kinds.
  const auto base = reinterpret_cast<std::uint64_t>(ptr);
  for (const auto& [h, r] : regions_) {
    if (base < r.region.base + r.region.length && r.region.base < base + length) {
      return std::unexpected(Status::invalid_argument("register_memory: [{}, +{}) overlaps region {}", ptr, length, h));
    }
  }
  auto handle = kind == MemoryKind::kVram ? staging_.register_vram(ptr, length, device) : ucx_.register_memory(ptr, length, kind);
  if (!handle) return std::unexpected(handle.error());
  if (kind == MemoryKind::kVram) device = staging_.device_of(*handle);
  Region region{*handle, reinterpret_cast<std::uint64_t>(ptr), length, kind, device};
  regions_.emplace(*handle, RegionRecord{region, 0});
  return region;
}

Result<Region> Datapath::allocate_memory(std::size_t length, int numa_node) {
  auto allocated = ucx_.allocate_memory(length, numa_node);
  if (!allocated) return std::unexpected(allocated.error());
  Region region{allocated->handle, reinterpret_cast<std::uint64_t>(allocated->address), length, MemoryKind::kDram,
                numa_node};
  regions_.emplace(allocated->handle, RegionRecord{region, 0});
  return region;
}

// Said of a handle no longer registered whose revocation a peer has yet to
// acknowledge: its memory is still not the caller's.
std::string Datapath::unregistering(RegionHandle handle) const {
  return ucx_.unregister_pending(handle)
             ? "; it is being unregistered: a peer has not acknowledged its revocation yet (unregister again to wait)"
             : "";
}

Status Datapath::unregister(RegionHandle handle, std::function<void(Status)> done) {
  auto it = regions_.find(handle);
  if (it == regions_.end()) {
    // Its revocation still waits on a peer (an earlier unregister timed
    // out): waited for again. Or it ended since: that caller is told now.
    const bool timed_out = late_unregisters_.erase(handle) > 0;
    if (ucx_.unregister_pending(handle)) {
      unregisters_.push_back({handle, std::move(done)});
      return Status::ok();
    }
    if (timed_out) {
      done(Status::ok());
      return Status::ok();
    }
    return Status::not_found("unregister: no region {} (never registered, or already unregistered)", handle);
  }
  // The copier's batches count until they end, as the loop's do.
  if (const std::uint64_t live = it->second.live_requests + copier_->requests_naming(handle); live > 0) {
    // Counted per batch until the whole batch ends: a request that ended
    // early in a batch still running counts too, so the message says so.
    return Status::failed_precondition(
        "unregister: region {} is named by {} requests of batches that have not ended (wait for them, or cancel "
        "and wait)",
        handle, live);
  }
  if (auto key = local_keys_.find(handle); key != local_keys_.end()) {
    if (Status s = staging_.local()->unregister(key->second); !s.is_ok()) {
      return Status::failed_precondition("unregister: {}", s.message());
    }
    local_keys_.erase(key);
  }
  if (staging_.is_vram(handle)) {
    if (Status s = staging_.unregister_vram(handle); !s.is_ok()) return s;
  } else if (Status s = ucx_.unregister(handle); !s.is_ok()) {
    // Only slices of cancelled requests can be left: UCX cannot recall them.
    return Status::failed_precondition("unregister: {}", s.message());
  }
  regions_.erase(it);
  if (ucx_.unregister_pending(handle)) {
    unregisters_.push_back({handle, std::move(done)});
  } else {
    done(Status::ok());
  }
  return Status::ok();
}

Status Datapath::export_region(RegionHandle handle, const std::vector<std::string>& peers) {
  if (!regions_.contains(handle)) {
    return Status::not_found("export_region: no region {} (never registered, or unregistered){}", handle,
                             unregistering(handle));
  }
  return ucx_.export_region(handle, peers);
}

void Datapath::connect(std::string_view address, TimeNs now_ns, std::function<void(Result<Peer>)> done) {
  // The transport may hand a failed path's id to this connect: what waits
  // on that path's failure hears it first, and the address it had no
  // longer names it.
  settle_pending();
  std::vector<std::pair<std::string, Status>> failed;  // what each failed peer's address answers now
  for (const auto& [name, id] : peers_) {
    if (ucx_.path_state(id) == transport::PathState::kFailed) failed.emplace_back(name, ucx_.path_status(id));
  }
  auto path = ucx_.connect(address, now_ns);
  if (!path) {
    done(std::unexpected(path.error()));
    return;
  }
  const std::string& to = ucx_.paths()[*path].to;
  departed_.forget(to);
  for (auto& [name, status] : failed) {
    const auto it = peers_.find(name);
    if (it->second != *path || name == to) continue;
    departed_.remember(name, std::move(status));
    peers_.erase(it);
  }
  connects_.push_back({*path, std::move(done)});
}

void Datapath::refresh(const Peer& peer, std::function<void(Status)> done) {
  auto path = live_path(peer.address);
  if (!path) {
    done(path.error());
    return;
  }
  if (Status s = ucx_.refresh_regions(*path); !s.is_ok()) {
    done(s);
    return;
  }
  refreshes_.push_back({*path, std::move(done)});
}

Result<Region> Datapath::region(RegionHandle region) const {
  auto it = regions_.find(region);
  if (it == regions_.end()) return std::unexpected(Status::not_found("no region {} registered here{}", region,
                                                                     unregistering(region)));
  return it->second.region;
}

Result<std::vector<transport::RemoteRegion>> Datapath::remote_regions(const Peer& peer) const {
  auto path = live_path(peer.address);
  if (!path) return std::unexpected(path.error());
  return ucx_.remote_regions(*path);
}

Result<transport::PathId> Datapath::live_path(const std::string& peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    if (const Status* gone = departed_.find(peer)) return std::unexpected(*gone);
    return std::unexpected(Status::not_found(
        "no peer \"{}\" (connect() to it first; a peer is named by the address connect() returned: "
        "\"localhost:7000\" is \"127.0.0.1:7000\")",
        shown(peer)));  // the caller's string, maybe huge or binary
  }
  if (Status s = ucx_.path_status(it->second); !s.is_ok()) return std::unexpected(s);
  return it->second;
}

Result<Datapath::Checked> Datapath::check(const Request& r, std::size_t i) {
  auto refuse = [i](Status s) {
    return std::unexpected(Status(s.code(), fmt::format("submit: request {} of the batch: {}", i, s.message())));
  };
  if (r.length == 0) return refuse(Status::invalid_argument("length 0"));
  if (r.timeout_ns < 0) {
    return refuse(Status::invalid_argument("timeout {} ns (expected > 0, or 0 for the policy's)", r.timeout_ns));
  }
  if (r.op != Op::kRead && r.op != Op::kWrite) {
    return refuse(Status::invalid_argument("unknown op {}", static_cast<int>(r.op)));
  }
  if (static_cast<int>(r.qos) >= sched::kQosClassCount) {
    return refuse(Status::invalid_argument("unknown qos class {} (expected 0..{})", static_cast<int>(r.qos),
                                           sched::kQosClassCount - 1));
  }
  if (r.deadline_ns < 0) {
    return refuse(Status::invalid_argument("deadline {} ns (expected an absolute time, or 0 for none)", r.deadline_ns));
  }
  const auto local = regions_.find(r.local_region);
  if (local == regions_.end()) return refuse(Status::not_found("no local region {}", r.local_region));
  const Region& lr = local->second.region;
  if (r.local_offset > lr.length || r.length > lr.length - r.local_offset) {
    return refuse(Status::out_of_range("local range [{}, +{}) is outside region {} ({} bytes)", r.local_offset,
                                       r.length, lr.handle, lr.length));
  }
  if (r.peer.empty()) {
    auto c = check_local(r, local->second);
    return c ? std::move(c) : refuse(c.error());
  }
  auto path = live_path(r.peer);
  if (!path) return refuse(path.error());
  auto rr = ucx_.remote_region(*path, r.remote_region);
  if (!rr) return refuse(rr.error());
  if (r.remote_offset > rr->length || r.length > rr->length - r.remote_offset) {
    return refuse(Status::out_of_range("remote range [{}, +{}) is outside region {} of peer {} ({} bytes)",
                                       r.remote_offset, r.length, rr->key, r.peer, rr->length));
  }
  // A peer that is this process (an engine beside this one, or this one)
  // may name the very bytes of the local range: a copy in slices would
  // read what it already wrote.
  if (ucx_.path_in_this_process(*path) && ranges_overlap(lr.base + r.local_offset, rr->base + r.remote_offset, r.length)) {
    return refuse(Status::invalid_argument(
        "local range [{:#x}, +{}) and the range of peer {} at {:#x} overlap (the peer is this process): copy "
        "between ranges that do not",
        lr.base + r.local_offset, r.length, r.peer, rr->base + r.remote_offset));
  }
  return Checked{&local->second, *path, rr->base + r.remote_offset, ucx_.address(), r.peer, nullptr, r.remote_region};
}

namespace {

// The topology node a region is on for the local GPU paths: its GPU; for
// host memory, a NUMA node with a path to `other`'s GPU (its own, when it
// named one that has).
Result<std::string> local_node(const transport::CudaTransport& cuda, const Region& r, const Region& other) {
  const auto& paths = cuda.paths();
  if (r.kind == MemoryKind::kVram) {
    for (const transport::PathInfo& p : paths) {
      if (auto d = cuda.device_of(p.from); d && *d == r.device) return p.from;
    }
    return std::unexpected(Status::not_found("GPU {} of region {} has no path here", r.device, r.handle));
  }
  const std::string named = r.device >= 0 ? fmt::format("numa{}", r.device) : std::string();
  for (const bool exact : {true, false}) {
    if (exact && named.empty()) continue;
    for (const transport::PathInfo& p : paths) {
      auto d = cuda.device_of(p.to);
      if (!d || *d != other.device || cuda.device_of(p.from)) continue;
      if (!exact && !named.empty()) {
        baton::logger().debug("region {}: {} has no path to GPU {}; its copies go as from {}", r.handle, named,
                              other.device, p.from);
      }
      if (!exact || p.from == named) return p.from;
    }
  }
  return std::unexpected(Status::not_found("no path between host memory and GPU {}", other.device));
}

}  // namespace

Result<Datapath::Checked> Datapath::check_local(const Request& r, RegionRecord& local) {
  transport::CudaTransport* cuda = staging_.local();
  if (cuda == nullptr) {
    return std::unexpected(Status::failed_precondition(
        "no peer named, and this engine has no GPU paths of its own (EngineConfig::gpu_paths is off)"));
  }
  const auto target = regions_.find(r.remote_region);
  if (target == regions_.end()) {
    return std::unexpected(Status::not_found(
        "no local region {} (a request with no peer names two of this engine's regions)", r.remote_region));
  }
  const Region& lr = local.region;
  const Region& tr = target->second.region;
  if (r.remote_offset > tr.length || r.length > tr.length - r.remote_offset) {
    return std::unexpected(Status::out_of_range("range [{}, +{}) is outside region {} ({} bytes)", r.remote_offset,
                                                r.length, tr.handle, tr.length));
  }
  if (lr.kind != MemoryKind::kVram && tr.kind != MemoryKind::kVram) {
    return std::unexpected(Status::invalid_argument(
        "regions {} and {} are both host memory: a request with no peer needs GPU memory on one side", lr.handle,
        tr.handle));
  }
  auto from = local_node(*cuda, lr, tr);
  if (!from) return std::unexpected(from.error());
  auto to = local_node(*cuda, tr, lr);
  if (!to) return std::unexpected(to.error());
  if (*from == *to) {
    return std::unexpected(
        Status::invalid_argument("regions {} and {} are both on {}: a copy within one GPU is no path here", lr.handle,
                                 tr.handle, *from));
  }
  // Its keys (and host memory's pinning) come once the whole batch passed.
  return Checked{&local, 0, tr.base + r.remote_offset, *from, *to, &target->second, 0};
}

Result<transport::RegionHandle> Datapath::local_key(const Region& region) {
  if (auto it = local_keys_.find(region.handle); it != local_keys_.end()) return it->second;
  // Host memory is pinned here (cudaHostRegister), once, for the GPUs' DMA.
  auto key = staging_.local()->register_memory(reinterpret_cast<void*>(region.base), region.length, region.kind,
                                               region.kind == MemoryKind::kVram ? region.device : -1);
  if (!key) return std::unexpected(key.error());
  local_keys_.emplace(region.handle, *key);
  return *key;
}

Status Datapath::check_part(const Batch& batch, std::size_t from, std::size_t to, std::vector<Checked>& checked) {
  checked.clear();
  if (batch.requests.empty()) return Status::invalid_argument("submit: the batch is empty");
  if (batch.notification.size() > transport::kMaxNotificationBytes) {
    return Status::invalid_argument("submit: the notification has {} bytes (at most {})", batch.notification.size(),
                                    transport::kMaxNotificationBytes);
  }
  checked.reserve(to - from);
  Status refused;
  for (std::size_t i = from; i < to; ++i) {
    auto c = check(batch.requests[i], i);
    if (!c) {
      refused = c.error();
    } else if (!batch.notification.empty() && batch.requests[i].peer.empty()) {
      refused = Status::invalid_argument(
          "submit: request {} names no peer: a batch with a notification needs one to tell", i);
    } else if (!batch.notification.empty() && batch.requests[i].peer != batch.requests[0].peer) {
      refused = Status::invalid_argument(
          "submit: a batch with a notification must name one peer (request 0: {}, request {}: {})",
          batch.requests[0].peer, i, batch.requests[i].peer);
    }
    if (!refused.is_ok()) break;
    checked.push_back(*c);
  }
  // Requests with no peer: both regions' keys with the GPU paths, for
  // those that passed.
  for (std::size_t i = 0; i < checked.size(); ++i) {
    if (checked[i].target == nullptr) continue;
    auto mine = local_key(checked[i].local->region);
    auto theirs = mine ? local_key(checked[i].target->region) : mine;
    if (!theirs) {
      checked.resize(i);
      return Status(theirs.error().code(),
                    fmt::format("submit: request {} of the batch: {}", from + i, theirs.error().message()));
    }
    checked[i].target_key = *theirs;
  }
  return refused;
}

std::optional<Status> Datapath::check_step(const Batch& batch, std::size_t& next) {
  if (shut_down_) return Status::unavailable("submit: the engine shut down");
  const std::size_t to = std::min(batch.requests.size(), next + kChecksPerTurn);
  thread_local std::vector<Checked> scratch;  // the loop's
  if (Status s = check_part(batch, next, to, scratch); !s.is_ok()) return s;
  next = to;
  if (next < batch.requests.size()) return std::nullopt;
  return Status::ok();
}

std::optional<Result<BatchHandle>> Datapath::submit_step(Submission& sub, TimeNs now_ns) {
  const Batch& batch = *sub.batch;
  const std::size_t n = batch.requests.size();
  if (!sub.checked && n > kRequestsPerTurn) {  // all checked before any is admitted
    auto checked = check_step(batch, sub.next);
    if (!checked) return std::nullopt;
    if (!checked->is_ok()) return std::unexpected(std::move(*checked));
    sub.checked = true;
    sub.next = 0;
    return std::nullopt;
  }
  const std::size_t from = sub.next;
  const std::size_t to = std::min(n, from + kRequestsPerTurn);
  // Checked again: the pointers are good for this turn only. Those that
  // pass before one that does not are admitted.
  std::vector<Checked> made;
  Status refused = shut_down_ ? Status::unavailable("submit: the engine shut down before request {} was admitted", from)
                              : check_part(batch, from, to, made);
  if (!refused.is_ok() && sub.id == 0) return std::unexpected(std::move(refused));  // nothing admitted
  if (sub.id == 0) {
    // The record exists before its requests are admitted: a request may end
    // during admission (infeasible at once, with a recompute callback) and
    // its finish must find its batch. `open` holds one extra count until
    // every request is in, so the batch cannot end half submitted.
    sub.id = next_batch_id();
    BatchRecord& record = batches_[sub.id];
    record.notification = batch.notification;
    if (!batch.notification.empty()) {  // so every request names one peer
      record.notify_path = made[0].path;
      record.notify_incarnation = ucx_.paths()[made[0].path].incarnation;
    }
    record.open = 1;
    std::lock_guard lock(ended_mutex_);
    running_.insert(sub.id);
  }
  const std::uint64_t id = sub.id;
  BatchRecord& record = batches_.at(id);
  for (std::size_t i = from; i < from + made.size(); ++i) {
    const Request& r = batch.requests[i];
    const Checked& c = made[i - from];
    RegionRecord& local = *c.local;
    sched::TransferRequest t;
    t.from = c.from;
    t.to = c.to;
    t.bytes = r.length;
    t.qos = r.qos;
    t.deadline_ns = r.deadline_ns;
    t.timeout_ns = r.timeout_ns;
    t.op = r.op;
    t.local = reinterpret_cast<std::byte*>(local.region.base) + r.local_offset;
    t.remote_key = c.target_key;
    t.remote_addr = c.remote_addr;
    const sched::RequestId rid = next_id_.fetch_add(1);
    ++local.live_requests;
    RegionRecord* target = c.target;
    if (target != nullptr) ++target->live_requests;
    record.targets.push_back(target != nullptr ? r.remote_region : kNoTarget);
    loop_requests_.fetch_add(1, std::memory_order_relaxed);
    ++record.open;
    record.requests.push_back(rid);
    record.local_regions.push_back(r.local_region);
    record.ops.push_back(r.op);
    batch_of_[rid] = id;
    if (Status s = admission_.submit(rid, t, now_ns); !s.is_ok()) {
      // Checked above against the same tables, so this is a routing refusal
      // (no path to the peer).
      --local.live_requests;
      if (target != nullptr) --target->live_requests;
      record.targets.pop_back();
      loop_requests_.fetch_sub(1, std::memory_order_relaxed);
      --record.open;
      record.requests.pop_back();
      record.local_regions.pop_back();
      record.ops.pop_back();
      batch_of_.erase(rid);
      refused = Status(s.code(), fmt::format("submit: request {} of the batch: {}", i, s.message()));
      break;
    }
  }
  sub.next = to;
  if (refused.is_ok() && sub.next < n) return std::nullopt;
  if (record.requests.empty()) {
    batches_.erase(id);
    std::lock_guard lock(ended_mutex_);
    running_.erase(id);
    return std::unexpected(refused.message().starts_with("submit: ") ? std::move(refused)
                                                                      : Status(refused.code(), "submit: " + refused.message()));
  }
  if (!refused.is_ok()) {
    // The requests already admitted go on; the others end failed, with the
    // reason (one turn for all of them: a rare path, ~50 ns a request), so
    // the batch still reports every request.
    baton::logger().warn("submit: batch {}: {} of its {} requests were not admitted: {}", id,
                         n - record.requests.size(), n, refused.message());
    for (std::size_t i = record.requests.size(); i < n; ++i) {
      const Request& r = batch.requests[i];
      sched::RequestStatus& s = record.refused.emplace_back();
      s.state = sched::RequestState::kFailed;
      s.status = refused;
      s.qos = r.qos;
      s.bytes = r.length;
      s.bytes_unsent = r.length;
      s.deadline_ns = r.deadline_ns;
      s.submitted_ns = now_ns;
      s.completed_ns = now_ns;
      ++record.refused_ops[r.op == Op::kRead ? 0 : 1];
    }
  }
  if (--record.open == 0) ending_.emplace_back().id = id;
  metrics_.add("baton_engine_batches_total", {}, 1);
  return BatchHandle{id};
}

namespace {

// The loop-free path's scratch, kept per thread: a batch of small requests
// paid an allocation for each of these (callgrind).
struct DirectScratch {
  std::vector<transport::UcxTransport::DirectCopy> copies;
  std::vector<Status> results;
};

DirectScratch& direct_scratch() {
  thread_local DirectScratch scratch;
  if (scratch.copies.capacity() > kScratchKept) scratch.copies = {};  // one huge batch does not pin its memory
  if (scratch.results.capacity() > kScratchKept) scratch.results = {};
  return scratch;
}

}  // namespace

bool Datapath::gather_direct(const Batch& batch, TimeNs now_ns, std::vector<transport::UcxTransport::DirectCopy>& copies,
                             std::uint64_t& bytes, TimeNs& earliest_deadline_ns) {
  bytes = 0;
  earliest_deadline_ns = 0;
  const bool one_peer = !batch.notification.empty();
  // Written through a pointer into storage sized once: push_back's
  // capacity check per request showed in callgrind.
  copies.resize(batch.requests.size());
  transport::UcxTransport::DirectCopy* copy = copies.data();
  for (const Request& r : batch.requests) {
    // What check() refuses goes the loop's way, which says why.
    if (r.length > UINT64_MAX - bytes || r.timeout_ns < 0 || r.deadline_ns < 0 ||
        static_cast<int>(r.qos) >= sched::kQosClassCount) {
      return false;
    }
    // A deadline closer than 1 ns per byte (1 GB/s, below any same-host
    // copy measured) goes to admission, which may end it infeasible at once.
    if (r.deadline_ns != 0 && (r.deadline_ns <= now_ns || static_cast<std::uint64_t>(r.deadline_ns - now_ns) < r.length)) {
      return false;
    }
    if (one_peer && r.peer != batch.requests[0].peer) return false;
    if (r.deadline_ns != 0 && (earliest_deadline_ns == 0 || r.deadline_ns < earliest_deadline_ns)) {
      earliest_deadline_ns = r.deadline_ns;
    }
    bytes += r.length;
    *copy++ = {r.peer, r.op, r.local_region, r.local_offset, r.remote_region, r.remote_offset, r.length};
  }
  return true;
}

std::optional<Result<BatchHandle>> Datapath::submit_direct(const Batch& batch, TimeNs now_ns, std::uint64_t max_bytes,
                                                          transport::UcxTransport::ResolvedCopies* resolved) {
  if (batch.requests.empty() || batch.notification.size() > transport::kMaxNotificationBytes) return std::nullopt;
  if (loop_requests_.load(std::memory_order_relaxed) != 0) return std::nullopt;  // the scheduler decides
  auto& [copies, results] = direct_scratch();
  // A prepared batch passed the checks below when it was resolved against
  // the table still published: only the copies are left.
  const bool checked = resolved != nullptr && resolved->generation != 0 &&
                       resolved->generation == ucx_.direct_generation();
  std::uint64_t bytes = 0;
  TimeNs earliest = 0;  // deadline
  if (checked) {
    copies.clear();
  } else if (!gather_direct(batch, now_ns, copies, bytes, earliest)) {
    return std::nullopt;
  }
  if (!checked && bytes > max_bytes) return submit_copying(batch, now_ns, copies, bytes, earliest);
  results.resize(batch.requests.size());  // copy_direct sets each, ok or not
  const Status copied = resolved != nullptr ? ucx_.copy_direct(copies, *resolved, results) : ucx_.copy_direct(copies, results);
  if (!copied.is_ok()) return std::nullopt;
  // A deadline that time brings closer is checked again on every submit.
  if (earliest != 0 && resolved != nullptr) resolved->generation = 0;
  const TimeNs done_ns = clock_ ? clock_() : now_ns;

  const std::uint64_t id = next_batch_id();
  EndedNode node = spare_ended_node();
  const Request* requests = batch.requests.data();
  end_direct(node.mapped(), batch.requests.size(),
             [requests](std::size_t i) {
               const Request& r = requests[i];
               return DirectEnd{r.op, r.length, r.qos, r.deadline_ns};
             },
             results.data(), now_ns, done_ns);
  publish_direct(id, std::move(node), batch.requests[0].peer, batch.notification);
  return BatchHandle{id};
}

std::optional<Result<BatchHandle>> Datapath::submit_copying(const Batch& batch, TimeNs now_ns,
                                                           std::span<const transport::UcxTransport::DirectCopy> copies,
                                                           std::uint64_t bytes, TimeNs earliest_deadline_ns) {
  // It waits behind the copier's queue: a deadline that the queue and the
  // batch at 1 ns per byte would miss goes to admission.
  const std::uint64_t ahead = copier_->queued_bytes();
  if (earliest_deadline_ns != 0 && static_cast<std::uint64_t>(earliest_deadline_ns - now_ns) < ahead + bytes) {
    return std::nullopt;
  }
  if (!ucx_.check_direct(copies).is_ok()) return std::nullopt;  // the loop says what was wrong
  auto job = std::make_unique<DirectCopier::Job>();
  job->id = next_batch_id();
  job->submitted_ns = now_ns;
  job->bytes = bytes;
  job->notification = batch.notification;
  job->copies.assign(copies.begin(), copies.end());
  job->meta.resize(copies.size());
  const TimeNs default_timeout_ns = scheduler_.policy().transfer_timeout_ns;  // fixed once the engine runs
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const Request& r = batch.requests[i];
    if (job->peers.empty() || job->peers.back() != r.peer) job->peers.push_back(r.peer);
    job->copies[i].peer = job->peers.back();
    const TimeNs timeout_ns = r.timeout_ns != 0 ? r.timeout_ns : default_timeout_ns;
    const TimeNs expires_ns = timeout_ns >= INT64_MAX - now_ns ? 0 : now_ns + timeout_ns;
    job->meta[i] = {r.qos, r.deadline_ns, expires_ns};
  }
  const std::uint64_t id = job->id;
  {
    std::lock_guard lock(ended_mutex_);
    running_.insert(id);
  }
  copier_->push(std::move(job));
  return BatchHandle{id};
}

void Datapath::end_copied(DirectCopier::Job& job) {
  const TimeNs done_ns = clock_ ? clock_() : job.submitted_ns;
  EndedNode node = spare_ended_node();
  end_direct(node.mapped(), job.copies.size(),
             [&job](std::size_t i) {
               return DirectEnd{job.copies[i].op, job.copies[i].bytes, job.meta[i].qos, job.meta[i].deadline_ns,
                                job.landed[i], job.completed_ns[i]};
             },
             job.results.data(), job.submitted_ns, done_ns);
  publish_direct(job.id, std::move(node), job.peers.front(), job.notification);  // a batch names a peer at least once
}

template <class At>
void Datapath::end_direct(Ended& ended, std::size_t n_requests, At at, Status* copy_results, TimeNs submitted_ns,
                          TimeNs done_ns) {
  ended.clean = true;
  ended.direct = true;
  ended.status.done = true;
  ended.status.status = Status::ok();
  // Counted here, added to the shared counters once per batch: a locked add
  // per request was a third of this function (perf).
  std::uint64_t counts[2][kDirectStates]{}, bytes_done[2]{}, missed[sched::kQosClassCount]{};
  // A reused node keeps its statuses: overwritten in place, not rebuilt.
  // Through local pointers: indexing the vectors made the compiler reload
  // their bounds after every store (callgrind).
  ended.status.requests.resize(n_requests);
  sched::RequestStatus* statuses = ended.status.requests.data();
  std::uint64_t batch_bytes = 0, batch_done = 0;
  for (std::size_t i = 0; i < n_requests; ++i) {
    const DirectEnd r = at(i);
    const int op = r.op == Op::kRead ? 0 : 1;
    const bool ok = copy_results[i].is_ok();
    const std::uint64_t done = ok ? r.length : r.landed_if_not_ok;
    const sched::RequestState state = ok ? sched::RequestState::kCompleted : DirectCopier::state_of(copy_results[i]);
    const TimeNs completed_ns = r.completed_ns != 0 ? r.completed_ns : done_ns;
    ++counts[op][ok ? 0 : direct_state_index(state)];
    if (r.deadline_ns != 0 && (!ok || completed_ns > r.deadline_ns)) ++missed[static_cast<std::size_t>(r.qos)];
    bytes_done[op] += ok ? r.length : 0;  // delivered: completed requests, as on the loop
    batch_bytes += r.length;
    batch_done += done;
    sched::RequestStatus& s = statuses[i];
    s.state = state;
    s.qos = r.qos;
    s.bytes = r.length;
    s.bytes_done = done;
    s.bytes_unsent = r.length - done;
    s.deadline_ns = r.deadline_ns;
    s.submitted_ns = submitted_ns;
    s.completed_ns = completed_ns;
    s.slices_spilled = 0;
    s.slices_preempted = 0;
    if (ok) {
      if (!s.status.is_ok()) s.status = Status::ok();
    } else {
      if (ended.status.status.is_ok()) ended.status.status = copy_results[i];
      s.status = std::move(copy_results[i]);
      copy_results[i] = Status::ok();
    }
  }
  ended.status.bytes = batch_bytes;
  ended.status.bytes_done = batch_done;
  count_direct(counts, bytes_done, missed);
}

void Datapath::publish_direct(std::uint64_t id, EndedNode node, const std::string& peer,
                              const std::string& notification) {
  if (notification.empty() || !node.mapped().status.status.is_ok()) {
    publish_ended(id, std::move(node));
    return;
  }
  // As on the loop's path, the batch ends once its notification is on its
  // way: a caller that waits and then shuts down does not lose it.
  {
    std::lock_guard lock(ended_mutex_);
    running_.insert(id);
  }
  loop_.post([this, id, node = std::make_shared<EndedNode>(std::move(node)), peer,
              message = notification](admission::AdmissionController&, TimeNs) {
    notify_direct(peer, message);
    publish_ended(id, std::move(*node));
  });
}

std::optional<Status> Datapath::run_direct(const Batch& batch, transport::UcxTransport::ResolvedCopies& resolved) {
  if (resolved.generation == 0 || !batch.notification.empty() || batch.requests.size() != resolved.copies.size()) {
    return std::nullopt;
  }
  if (loop_requests_.load(std::memory_order_relaxed) != 0) return std::nullopt;  // the scheduler decides
  std::vector<Status>& results = direct_scratch().results;
  results.resize(batch.requests.size());
  if (!ucx_.copy_direct({}, resolved, results).is_ok()) return std::nullopt;  // the table changed: resolve again
  return count_ran(batch, results);
}

std::optional<Status> Datapath::run_direct(const Batch& batch, std::uint64_t max_bytes) {
  if (batch.requests.empty() || !batch.notification.empty()) return std::nullopt;
  if (loop_requests_.load(std::memory_order_relaxed) != 0) return std::nullopt;  // the scheduler decides
  auto& [copies, results] = direct_scratch();
  std::uint64_t bytes = 0;
  TimeNs earliest = 0;
  // No request has a deadline (the caller checked), so no clock is read.
  // A larger batch goes to the copier, whose parts a timeout or a
  // revocation waits for, not the whole copy.
  if (!gather_direct(batch, /*now_ns=*/0, copies, bytes, earliest) || earliest != 0 || bytes > max_bytes) {
    return std::nullopt;
  }
  results.resize(batch.requests.size());
  if (!ucx_.copy_direct(copies, results).is_ok()) return std::nullopt;  // the loop's way, which says why
  return count_ran(batch, results);
}

Status Datapath::count_ran(const Batch& batch, std::vector<Status>& results) {
  std::uint64_t counts[2][kDirectStates]{}, bytes_done[2]{};
  Status first = Status::ok();
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Request& r = batch.requests[i];
    const int op = r.op == Op::kRead ? 0 : 1;
    if (results[i].is_ok()) {
      ++counts[op][0];
      bytes_done[op] += r.length;
    } else {
      ++counts[op][direct_state_index(DirectCopier::state_of(results[i]))];
      if (first.is_ok()) first = std::move(results[i]);
      results[i] = Status::ok();
    }
  }
  count_direct(counts, bytes_done);
  return first;
}

Datapath::EndedNode& Datapath::thread_spare() {
  thread_local EndedNode spare;
  return spare;
}

Datapath::EndedNode Datapath::spare_ended_node() {
  if (EndedNode& mine = thread_spare(); !mine.empty()) return std::move(mine);
  {
    std::lock_guard lock(ended_mutex_);
    if (!spare_ended_.empty()) {
      EndedNode node = std::move(spare_ended_.back());
      spare_ended_.pop_back();
      return node;
    }
  }
  EndedMap one;
  one.emplace(0, Ended{});
  return one.extract(one.begin());
}

int Datapath::ended_fd() const {
  if (!ended_fd_used_.exchange(true) && ended_fd_ >= 0 && ended_count_.load() > 0) {
    const std::uint64_t one = 1;
    (void)!::write(ended_fd_, &one, sizeof one);
  }
  return ended_fd_;
}

void Datapath::publish_ended(std::uint64_t id, EndedNode node) {
  node.key() = id;
  {
    std::lock_guard lock(ended_mutex_);
    running_.erase(id);
    ended_.insert(std::move(node));
  }
  ended_count_.fetch_add(1);
  ended_cv_.notify_all();
  if (ended_fd_ >= 0 && ended_fd_used_.load()) {
    const std::uint64_t one = 1;
    (void)!::write(ended_fd_, &one, sizeof one);
  }
}

void Datapath::notify_direct(const std::string& peer, const std::string& notification) {
  auto path = live_path(peer);
  Status sent = path ? ucx_.notify(*path, notification) : path.error();
  if (sent.is_ok()) {
    metrics_.add("baton_engine_notifications_sent_total", {}, 1);
  } else {
    baton::logger().warn("direct batch: notification not sent: {}", sent.message());
  }
}

void Datapath::count_direct(const std::uint64_t (&counts)[2][kDirectStates], const std::uint64_t (&bytes)[2],
                            const std::uint64_t (&missed)[sched::kQosClassCount]) {
  ThreadCounts::Block& mine = direct_counts_.mine();
  mine.add(kDirectBatches, 1);
  for (std::size_t op = 0; op < 2; ++op) {
    for (std::size_t state = 0; state < kDirectStates; ++state) {
      if (counts[op][state] != 0) mine.add(kDirectRequests + state * 2 + op, counts[op][state]);
    }
    if (bytes[op] != 0) mine.add(kDirectBytes + op, bytes[op]);
  }
  for (std::size_t q = 0; q < sched::kQosClassCount; ++q) {
    if (missed[q] != 0) mine.add(kDirectMissed + q, missed[q]);
  }
}

void Datapath::count_missed(const std::uint64_t (&missed)[sched::kQosClassCount]) {
  for (std::size_t q = 0; q < sched::kQosClassCount; ++q) {
    if (missed[q] == 0) continue;
    metrics_.add("baton_engine_deadlines_missed_total",
                 {{"qos", std::string(sched::to_string(static_cast<sched::QosClass>(q)))}},
                 static_cast<double>(missed[q]));
  }
}

void Datapath::flush_direct_metrics() {
  const ThreadCounts::Totals now = direct_counts_.totals();
  // All of them: a batch's counts are separate stores, and a flush that saw
  // its batch but not yet its requests must not skip them at the next one.
  if (now == direct_flushed_) return;
  ThreadCounts::Totals added{};
  for (std::size_t i = 0; i < now.size(); ++i) added[i] = now[i] - direct_flushed_[i];
  direct_flushed_ = now;
  metrics_.add("baton_engine_batches_total", {}, static_cast<double>(added[kDirectBatches]));
  metrics_.add("baton_engine_direct_batches_total", {}, static_cast<double>(added[kDirectBatches]));
  for (std::size_t op = 0; op < 2; ++op) {
    const std::string name(op_name(op == 0 ? Op::kRead : Op::kWrite));
    for (std::size_t state = 0; state < kDirectStates; ++state) {
      if (const auto n = added[kDirectRequests + state * 2 + op]) {
        metrics_.add("baton_engine_requests_total", {{"op", name}, {"state", std::string(sched::to_string(kDirectStateOrder[state]))}},
                     static_cast<double>(n));
      }
    }
    if (const auto b = added[kDirectBytes + op]) metrics_.add("baton_engine_bytes_total", {{"op", name}}, static_cast<double>(b));
  }
  std::uint64_t missed[sched::kQosClassCount]{};
  for (std::size_t q = 0; q < sched::kQosClassCount; ++q) missed[q] = added[kDirectMissed + q];
  count_missed(missed);
}

void Datapath::before_scrape() {
  flush_direct_metrics();
  std::size_t held = 0;
  {
    std::lock_guard lock(ended_mutex_);
    held = running_.size() + ended_.size();
  }
  metrics_.set("baton_engine_batches_held", {}, held);
}

namespace {

// The scheduler names a request by its id, which a caller of the engine
// never sees ("request 625 cancelled"): in a batch's statuses it is named by
// its place in the batch, as submit's refusals name it.
Status named_in_batch(const Status& s, sched::RequestId id, std::size_t index) {
  const std::string internal = fmt::format("request {}", id);
  if (!s.message().starts_with(internal)) return s;
  const std::string_view rest = std::string_view(s.message()).substr(internal.size());
  if (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front()))) return s;  // "request 6250", not 625
  return Status(s.code(), fmt::format("request {} of the batch{}", index, rest));
}

}  // namespace

Status Datapath::append_status(const BatchRecord& b, std::size_t i, BatchStatus& out) const {
  auto s = admission_.status(b.requests[i]);
  if (!s) return s.error();
  out.bytes += s->bytes;
  out.bytes_done += s->bytes_done;
  if (!s->status.is_ok()) s->status = named_in_batch(s->status, b.requests[i], i);
  if (out.done && out.status.is_ok() && s->state != sched::RequestState::kCompleted) out.status = s->status;
  out.requests.push_back(std::move(*s));
  return Status::ok();
}

void Datapath::append_refused(const BatchRecord& b, BatchStatus& out) {
  for (const sched::RequestStatus& s : b.refused) {
    out.bytes += s.bytes;
    if (out.done && out.status.is_ok()) out.status = s.status;
    out.requests.push_back(s);
  }
}

std::optional<Status> Datapath::poll_step(BatchHandle handle, std::size_t& next, BatchStatus& out) const {
  auto it = batches_.find(handle.id);
  if (it == batches_.end()) return Status::not_found("poll: no batch {}", handle.id);
  const BatchRecord& b = it->second;
  if (next == 0) restart(out, b.ended);  // an ended batch is read from its final status, unless being released
  const std::size_t to = std::min(b.requests.size(), next + kRequestsPerTurn);
  for (std::size_t i = next; i < to; ++i) {
    if (Status s = append_status(b, i, out); !s.is_ok()) return s;
  }
  next = to;
  if (next < b.requests.size()) return std::nullopt;
  append_refused(b, out);
  return Status::ok();
}

std::optional<Status> Datapath::cancel_step(Cancellation& c, TimeNs now_ns) {
  auto it = batches_.find(c.id);
  if (c.next == 0 && it == batches_.end()) return Status::not_found("cancel: no batch {}", c.id);
  // Ended meanwhile (released, maybe), or stopped by a shutdown, which
  // cancels every request itself.
  const bool over = it == batches_.end() || it->second.ended || it->second.open == 0;
  if (c.cancelled_any && (over || shut_down_)) return Status::ok();
  if (over) return Status::invalid_argument("cancel: batch {} already ended", c.id);
  if (shut_down_) return Status::ok();
  const std::vector<sched::RequestId>& requests = it->second.requests;
  const std::size_t to = std::min(requests.size(), c.next + kRequestsPerTurn);
  for (std::size_t i = c.next; i < to; ++i) {
    auto s = admission_.status(requests[i]);
    if (!s) continue;
    if (!ended_state(s->state)) {
      (void)admission_.cancel(requests[i], now_ns);
      c.cancelled_any = true;
    } else {
      c.stopping_any = c.stopping_any || s->state == sched::RequestState::kCancelling;
    }
  }
  c.next = to;
  if (c.next < requests.size()) return std::nullopt;
  if (c.cancelled_any) return Status::ok();
  if (c.stopping_any) {
    return Status::invalid_argument(
        "cancel: batch {} is already stopping (its requests wait for slices UCX cannot recall)", c.id);
  }
  return Status::invalid_argument("cancel: batch {} already ended", c.id);
}

void Datapath::cancel_running(const BatchRecord& batch, TimeNs now_ns) {
  for (sched::RequestId id : batch.requests) {
    auto s = admission_.status(id);
    if (s && !ended_state(s->state)) (void)admission_.cancel(id, now_ns);
  }
}

Status Datapath::release(BatchHandle handle) {
  if (copier_->holds(handle.id)) return Status::invalid_argument("release: batch {} is still running", handle.id);
  auto it = batches_.find(handle.id);
  if (it == batches_.end()) return Status::not_found("release: no batch {}", handle.id);
  if (!it->second.ended) return Status::invalid_argument("release: batch {} is still running", handle.id);
  if (!it->second.clean_at_end) {  // a cancelled batch, maybe: look again
    for (sched::RequestId id : it->second.requests) {
      if (scheduler_.posted_slices(id) > 0) {
        return Status::invalid_argument(
            "release: batch {} still has slices on the wire (cancelled, and UCX cannot recall them); release after "
            "they land",
            handle.id);
      }
    }
  }
  released_.insert(released_.end(), it->second.requests.begin(), it->second.requests.end());
  batches_.erase(it);
  std::lock_guard lock(ended_mutex_);
  ended_.erase(handle.id);
  return Status::ok();
}

void Datapath::forget_released() {
  for (std::size_t n = 0; n < kRequestsPerTurn && !released_.empty(); ++n) {
    (void)admission_.forget(released_.front());
    batch_of_.erase(released_.front());
    released_.pop_front();
  }
}

void Datapath::on_finish(sched::RequestId id) {
  auto it = batch_of_.find(id);
  if (it == batch_of_.end()) return;  // not a batch's request (a TransferRequest submitted directly)
  auto b = batches_.find(it->second);
  if (b == batches_.end()) return;  // released, its requests not yet forgotten
  if (b->second.open > 0 && --b->second.open == 0) ending_.emplace_back().id = it->second;
}

void Datapath::end_batches(std::size_t per_batch) {
  // Each batch its part: a small one that ended behind a huge one is not
  // kept waiting for it.
  std::erase_if(ending_, [&](Ending& e) {
    BatchRecord& b = batches_.at(e.id);
    if (e.next == 0) {
      e.node = spare_ended_node();  // a released batch's, its storage reused
      restart(e.node.mapped().status, true);
      e.node.mapped().clean = true;
      e.node.mapped().direct = false;
      e.node.mapped().status.requests.reserve(b.requests.size() + b.refused.size());
    }
    Ended& snapshot = e.node.mapped();
    const std::size_t to = e.next + std::min(per_batch, b.requests.size() - e.next);
    for (std::size_t i = e.next; i < to; ++i) {
      RegionRecord& local = regions_.at(b.local_regions[i]);
      --local.live_requests;
      if (b.targets[i] != kNoTarget) --regions_.at(b.targets[i]).live_requests;
      loop_requests_.fetch_sub(1, std::memory_order_relaxed);
      const std::size_t before = snapshot.status.requests.size();
      if (Status lost = append_status(b, i, snapshot.status); !lost.is_ok()) {
        // Not expected (a request is forgotten only after its batch's
        // release): the request still has its place in the batch.
        sched::RequestStatus& placeholder = snapshot.status.requests.emplace_back();
        placeholder.state = sched::RequestState::kFailed;
        placeholder.status = std::move(lost);
        if (snapshot.status.status.is_ok()) snapshot.status.status = placeholder.status;
      }
      const sched::RequestStatus& s = snapshot.status.requests[before];
      const int op = b.ops[i] == Op::kRead ? 0 : 1;
      const bool ok = s.state == sched::RequestState::kCompleted;
      e.all_ok = e.all_ok && ok;
      ++e.ended[op][static_cast<std::size_t>(s.state) & 7];
      if (s.deadline_missed()) ++e.missed[static_cast<std::size_t>(s.qos)];
      if (ok) e.bytes[op] += s.bytes;
      if (scheduler_.posted_slices(b.requests[i]) > 0) snapshot.clean = false;
    }
    e.next = to;
    if (e.next < b.requests.size()) return false;
    finish_ending(e, b);
    return true;
  });
}

void Datapath::finish_ending(Ending& e, BatchRecord& b) {
  append_refused(b, e.node.mapped().status);
  e.all_ok = e.all_ok && b.refused.empty();
  for (int op = 0; op < 2; ++op) e.ended[op][static_cast<std::size_t>(sched::RequestState::kFailed)] += b.refused_ops[op];
  for (const sched::RequestStatus& s : b.refused) {
    if (s.deadline_missed()) ++e.missed[static_cast<std::size_t>(s.qos)];
  }
  count_missed(e.missed);
  for (int op = 0; op < 2; ++op) {
    const std::string name(op_name(op == 0 ? Op::kRead : Op::kWrite));
    for (std::size_t state = 0; state < 8; ++state) {
      if (e.ended[op][state] == 0) continue;
      metrics_.add("baton_engine_requests_total",
                   {{"op", name}, {"state", std::string(sched::to_string(static_cast<sched::RequestState>(state)))}},
                   static_cast<double>(e.ended[op][state]));
    }
    if (e.bytes[op] > 0) metrics_.add("baton_engine_bytes_total", {{"op", name}}, static_cast<double>(e.bytes[op]));
  }
  if (e.all_ok && !b.notification.empty()) {
    // Only on the path the bytes went: it may have failed since, and its id
    // gone to another peer (or to the same address's next process).
    const Status s = ucx_.paths()[b.notify_path].incarnation == b.notify_incarnation
                         ? ucx_.notify(b.notify_path, b.notification)
                         : Status::unavailable("path {} went to another peer", b.notify_path);
    if (s.is_ok()) {
      metrics_.add("baton_engine_notifications_sent_total", {}, 1);
    } else {
      baton::logger().warn("batch {}: notification not sent: {}", e.id, s.message());
    }
  }
  b.ended = true;
  b.clean_at_end = e.node.mapped().clean;
  publish_ended(e.id, std::move(e.node));
}

Datapath::~Datapath() {
  copier_.reset();  // its thread publishes the batches it ends: before the fd goes
  if (ended_fd_ >= 0) ::close(ended_fd_);
}

bool Datapath::on_turn(TimeNs /*now_ns*/) {
  flush_direct_metrics();
  end_batches();
  if (!released_.empty()) forget_released();
  settle_pending();
  std::erase_if(unregisters_, [this](PendingUnregister& u) {
    if (ucx_.unregister_pending(u.region)) return false;
    u.done(Status::ok());
    return true;
  });
  return !ending_.empty() || !released_.empty();
}

void Datapath::settle_pending() {
  if (!connects_.empty()) {
    std::erase_if(connects_, [this](PendingConnect& c) {
      switch (ucx_.path_state(c.path)) {
        case transport::PathState::kConnecting: return false;
        case transport::PathState::kReady: {
          const transport::PathInfo& info = ucx_.paths()[c.path];
          peers_[info.to] = c.path;
          c.done(Peer{info.to, std::string(topology::to_string(info.type))});
          return true;
        }
        case transport::PathState::kFailed: c.done(std::unexpected(ucx_.path_status(c.path))); return true;
      }
      return false;
    });
  }
  if (!refreshes_.empty()) {
    std::erase_if(refreshes_, [this](PendingRefresh& r) {
      if (ucx_.path_state(r.path) == transport::PathState::kFailed) {
        r.done(ucx_.path_status(r.path));
        return true;
      }
      if (ucx_.refresh_pending(r.path)) return false;
      r.done(Status::ok());
      return true;
    });
  }
}

void Datapath::shutdown(TimeNs now_ns) {
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [id, b] : batches_) {
    if (!b.ended) cancel_running(b, now_ns);
  }
  copier_->cancel_all();  // its current chunk ends; shutdown_complete waits for it
  ucx_.shutdown();
  (void)on_turn(now_ns);  // fail pending connects
  end_batches(SIZE_MAX);  // the batches the cancels finished end now, whatever their size
}

bool Datapath::shutdown_complete() {
  if (transport::CudaTransport* local = staging_.local(); local != nullptr) {
    if (local->slices_in_flight() > 0) return false;  // a CUDA copy cannot be recalled
    for (const auto& [handle, key] : std::exchange(local_keys_, {})) (void)local->unregister(key);
  }
  if (!copier_->idle()) return false;  // its batches end (cancelled) before shutdown returns
  return ucx_.shutdown_complete();
}

std::optional<Status> Datapath::cancel_copying(std::uint64_t id) {
  switch (copier_->cancel(id)) {
    case DirectCopier::Cancel::kCancelled: return Status::ok();
    case DirectCopier::Cancel::kFinishing:
      return Status::invalid_argument("cancel: batch {} is already stopping (its last copies are under way)", id);
    case DirectCopier::Cancel::kUnknown: break;
  }
  return std::nullopt;
}

bool Datapath::ended_status(std::uint64_t id, BatchStatus& out) {
  std::lock_guard lock(ended_mutex_);
  auto it = ended_.find(id);
  if (it == ended_.end()) return false;
  out = it->second.status;  // copy-assigned: out's vector keeps its capacity
  return true;
}

Datapath::Taken Datapath::take_ended_if_clean(std::uint64_t id) {
  EndedNode node;
  Taken taken = Taken::kNo;
  {
    std::lock_guard lock(ended_mutex_);
    auto it = ended_.find(id);
    if (it == ended_.end() || !it->second.clean) return Taken::kNo;
    taken = it->second.direct ? Taken::kDirect : Taken::kLoop;
    node = ended_.extract(it);
    // Kept for a later batch unless it would pin a huge batch's statuses.
    if (node.mapped().status.requests.capacity() > kScratchKept) return taken;
    if (!thread_spare().empty()) {
      if (spare_ended_.size() < kSpareEnded) spare_ended_.push_back(std::move(node));
      return taken;
    }
  }
  thread_spare() = std::move(node);  // this thread's next batch takes it without the mutex
  return taken;
}

Datapath::Look Datapath::look(std::uint64_t id) {
  std::lock_guard lock(ended_mutex_);
  if (ended_.contains(id)) return Look::kEnded;
  return running_.contains(id) ? Look::kRunning : Look::kUnknown;
}

Datapath::WaitEnd Datapath::wait_ended(std::uint64_t id, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(ended_mutex_);
  // A batch released by another thread after it ended is in neither set.
  auto ended = [&] { return ended_.contains(id) || !running_.contains(id); };
  if (ended_cv_.wait_until(lock, deadline, [&] { return ended() || waiters_closed_; })) {
    return ended() ? WaitEnd::kEnded : WaitEnd::kClosed;
  }
  return WaitEnd::kTimedOut;
}

bool Datapath::enter_wait() {
  std::lock_guard lock(ended_mutex_);
  if (waiters_closed_) return false;
  ++waiters_;
  return true;
}

void Datapath::leave_wait() {
  std::lock_guard lock(ended_mutex_);
  if (--waiters_ == 0 && waiters_closed_) ended_cv_.notify_all();
}

void Datapath::close_waiters() {
  std::unique_lock lock(ended_mutex_);
  waiters_closed_ = true;
  ended_cv_.notify_all();
  ended_cv_.wait(lock, [&] { return waiters_ == 0; });
}

}  // namespace baton::engine
