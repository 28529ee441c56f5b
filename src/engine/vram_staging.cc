#include "engine/vram_staging.h"

#include <spdlog/spdlog.h>

#include "baton/common/address_ranges.h"
#include "baton/common/copy.h"

#include <algorithm>
#include <cstring>
#include <bit>

namespace baton::engine {

using transport::CancelResult;
using transport::Completion;
using transport::Op;
using transport::RegionHandle;
using transport::SliceId;
using transport::SliceSubmit;

namespace {
// Bounce buffers come in powers of two from 64 KiB, so slices of one size
// (the policy's slice size per path type) reuse the same few.
constexpr std::uint64_t kMinBounce = 64 << 10;
}  // namespace

class VramStaging::Served final : public transport::UcxTransport::StagedAccess {
 public:
  Served(VramStaging& owner, int device) : owner_(owner), device_(device) {}
  Result<std::uint64_t> start_write(void* dst, const void* src, std::size_t bytes) override {
    return owner_.serve(device_, dst, src, bytes, true);
  }
  Result<std::uint64_t> start_read(const void* src, std::size_t bytes) override {
    return owner_.serve(device_, nullptr, src, bytes, false);
  }
  std::optional<Result<std::span<const std::byte>>> done(std::uint64_t ticket) override {
    return owner_.served(ticket);
  }
  void release(std::uint64_t ticket) override { owner_.release_served(ticket); }

 private:
  VramStaging& owner_;
  int device_;
};

VramStaging::VramStaging(std::unique_ptr<transport::UcxTransport> ucx, std::shared_ptr<transport::CudaRuntime> cuda)
    : ucx_(std::move(ucx)), cuda_(std::move(cuda)) {}

VramStaging::~VramStaging() {
  local_.reset();  // it unpins memory UCX may own (allocate_memory's): before UCX goes
  closing_ = true;
  if (cuda_) {
    // Copies still running would write into bounce buffers freed below.
    for (auto [device, stream] : streams_) (void)cuda_->synchronize(stream);
    for (auto [device, stream] : serve_streams_) (void)cuda_->synchronize(stream);
    for (transport::CudaStream stream : retired_streams_) (void)cuda_->synchronize(stream);
    for (const Bounce& b : all_bounces_) {
      (void)ucx_->unregister(b.ucx_region);
      cuda_->free_pinned(b.data);
    }
    for (auto& [ticket, c] : served_) cuda_->free_pinned(c.data);
    for (auto [capacity, data] : served_free_) cuda_->free_pinned(data);
    for (auto [device, stream] : streams_) cuda_->destroy_stream(stream);
    for (auto [device, stream] : serve_streams_) cuda_->destroy_stream(stream);
    for (transport::CudaStream stream : retired_streams_) cuda_->destroy_stream(stream);
    for (transport::CudaEvent e : all_events_) cuda_->destroy_event(e);
  }
  ucx_.reset();  // while closing_ still tells its staged copies to refuse
}

Result<RegionHandle> VramStaging::register_vram(void* ptr, std::size_t length, int device) {
  if (!cuda_) {
    auto rt = transport::cuda_runtime();
    if (!rt) return std::unexpected(Status::unavailable("register_memory: VRAM needs a CUDA device: {}", rt.error().message()));
    cuda_ = *rt;
  }
  if (device < 0) {  // the GPU the pointer belongs to
    if (auto a = cuda_->pointer(ptr); a && a->type == transport::CudaMemoryType::kDevice) device = a->device;
  }
  if (Status s = transport::check_device_memory(*cuda_, ptr, length, device); !s.is_ok()) {
    return std::unexpected(Status(s.code(), "register_memory: " + s.message()));
  }
  const auto base = reinterpret_cast<std::uint64_t>(ptr);
  if (find_overlapping(regions_, base, length) != nullptr) {
    return std::unexpected(Status::invalid_argument("register_memory: [{}, +{}) overlaps a VRAM region", ptr, length));
  }
  auto handle = ucx_->register_staged(ptr, length, transport::MemoryKind::kVram, std::make_shared<Served>(*this, device));
  if (!handle) return std::unexpected(Status(handle.error().code(), "register_memory: " + handle.error().message()));
  regions_.emplace(base, Region{*handle, base, length, device, 0});
  region_base_.emplace(*handle, base);
  return *handle;
}

int VramStaging::device_of(RegionHandle handle) const {
  const auto it = region_base_.find(handle);
  return it == region_base_.end() ? -1 : regions_.at(it->second).device;
}

Status VramStaging::unregister_vram(RegionHandle handle) {
  const auto it = region_base_.find(handle);
  if (it == region_base_.end()) return Status::not_found("unregister: no VRAM region {}", handle);
  Region& r = regions_.at(it->second);
  if (r.live_slices != 0) {
    return Status::failed_precondition("unregister: VRAM region {} has {} slices in flight", handle, r.live_slices);
  }
  // Peers' slices on it are answered until they acknowledged its
  // revocation, through Served, which needs no entry here.
  if (Status s = ucx_->unregister(handle); !s.is_ok()) return Status(s.code(), "unregister: " + s.message());
  regions_.erase(it->second);
  region_base_.erase(it);
  return Status::ok();
}

Result<VramStaging::Bounce> VramStaging::take_bounce(std::uint64_t bytes) {
  if (auto it = free_bounces_.lower_bound(bytes); it != free_bounces_.end()) {
    Bounce b = it->second;
    free_bounces_.erase(it);
    return b;
  }
  const std::uint64_t capacity = std::bit_ceil(std::max(bytes, kMinBounce));
  auto data = cuda_->alloc_pinned(capacity);
  if (!data) return std::unexpected(data.error());
  auto handle = ucx_->register_memory(*data, capacity);
  if (!handle) {
    cuda_->free_pinned(*data);
    return std::unexpected(handle.error());
  }
  const Bounce b{static_cast<std::byte*>(*data), capacity, *handle};
  all_bounces_.push_back(b);
  return b;
}

Result<transport::CudaStream> VramStaging::stream_of(int device, bool serving) {
  auto& streams = serving ? serve_streams_ : streams_;
  if (auto it = streams.find(device); it != streams.end()) return it->second;
  auto s = cuda_->create_stream(device);
  if (!s) return std::unexpected(s.error());
  streams[device] = *s;
  return *s;
}

// A write is copied from the message into a pinned buffer here (the
// message is not kept) and from there to the GPU; a read from the GPU into
// one. Either way the loop does not wait for the GPU.
Result<std::uint64_t> VramStaging::serve(int device, void* dst, const void* src, std::size_t bytes, bool write) {
  if (closing_) return std::unexpected(Status::unavailable("the engine is shutting down"));
  auto stream = stream_of(device, true);
  if (!stream) return std::unexpected(stream.error());
  auto buffer = served_buffer(bytes);
  if (!buffer) return std::unexpected(Status::unavailable("no staging buffer: {}", buffer.error().message()));
  ServedCopy c{device, *stream, buffer->first, buffer->second, bytes, write, 0};
  if (write) copy_bytes(c.data, src, bytes);
  if (Status s = write ? copy(device, dst, c.data, bytes, c.event, true) : copy(device, c.data, src, bytes, c.event, true);
      !s.is_ok()) {
    retire_serve_stream(device, *stream);
    give_back_served(c.data, c.capacity);
    return std::unexpected(Status::unavailable("{}: {}", write ? "host -> GPU copy" : "GPU -> host copy", s.message()));
  }
  const std::uint64_t ticket = next_ticket_++;
  served_.emplace(ticket, c);
  return ticket;
}

std::optional<Result<std::span<const std::byte>>> VramStaging::served(std::uint64_t ticket) {
  const ServedCopy& c = served_.at(ticket);
  auto done = cuda_->query(c.event);
  if (done && !*done) return std::nullopt;
  if (!done) {
    // Whatever still runs on that stream ends before the buffer is reused.
    (void)cuda_->synchronize(c.stream);
    retire_serve_stream(c.device, c.stream);
    return std::unexpected(
        Status::unavailable("{} copy failed: {}", c.write ? "host -> GPU" : "GPU -> host", done.error().message()));
  }
  if (c.write) return std::span<const std::byte>();
  return std::span<const std::byte>(c.data, c.bytes);
}

void VramStaging::release_served(std::uint64_t ticket) {
  if (closing_) return;  // the destructor frees what is left
  const auto it = served_.find(ticket);
  if (it == served_.end()) return;
  free_events_[it->second.device].push_back(it->second.event);
  give_back_served(it->second.data, it->second.capacity);
  served_.erase(it);
}

// A stream that reported a failure takes no more answers: the next goes
// on a fresh one (the old is destroyed with the engine: reads may still
// wait on it). Only the stream that failed, not the one made since.
void VramStaging::retire_serve_stream(int device, transport::CudaStream stream) {
  const auto it = serve_streams_.find(device);
  if (it == serve_streams_.end() || it->second != stream) return;
  retired_streams_.push_back(stream);
  serve_streams_.erase(it);
}

Result<std::pair<std::byte*, std::uint64_t>> VramStaging::served_buffer(std::uint64_t bytes) {
  if (auto it = served_free_.lower_bound(bytes); it != served_free_.end()) {
    const auto found = std::pair{it->second, it->first};
    served_kept_ -= it->first;
    served_free_.erase(it);
    return found;
  }
  const std::uint64_t capacity = std::bit_ceil(std::max(bytes, kMinBounce));
  auto data = cuda_->alloc_pinned(capacity);
  if (!data) return std::unexpected(data.error());
  return std::pair{static_cast<std::byte*>(*data), capacity};
}

void VramStaging::give_back_served(std::byte* data, std::uint64_t capacity) {
  if (served_kept_ + capacity > kServedPoolBytes) {
    cuda_->free_pinned(data);
    return;
  }
  served_kept_ += capacity;
  served_free_.emplace(capacity, data);
}

Status VramStaging::copy(int device, void* dst, const void* src, std::uint64_t bytes, transport::CudaEvent& event,
                         bool serving) {
  auto stream = stream_of(device, serving);
  if (!stream) return stream.error();
  auto& pool = free_events_[device];
  if (pool.empty()) {
    auto e = cuda_->create_event(device);
    if (!e) return e.error();
    all_events_.push_back(*e);
    pool.push_back(*e);
  }
  event = pool.back();
  pool.pop_back();
  Status s = cuda_->copy_async(dst, src, bytes, *stream);
  if (s.is_ok()) {
    s = cuda_->record(event, *stream);
    // The copy is queued but cannot be waited for: let it end now, so its
    // buffers may be reused and nothing of it lands after the error.
    if (!s.is_ok()) (void)cuda_->synchronize(*stream);
  }
  if (!s.is_ok()) {
    pool.push_back(event);
    event = 0;
  }
  return s;
}

Status VramStaging::submit_remote(const SliceSubmit& slice, TimeNs now_ns) {
  last_poll_ns_ = std::max(last_poll_ns_, now_ns);
  Region* region =
      regions_.empty() ? nullptr : find_containing(regions_, reinterpret_cast<std::uint64_t>(slice.memory.local), slice.bytes);
  if (region == nullptr) return ucx_->submit(slice, now_ns);
  if (slices_.contains(slice.id)) return Status::already_exists("submit: slice {} is in flight", slice.id);
  auto bounce = take_bounce(slice.bytes);
  if (!bounce) return Status::unavailable("submit: slice {}: no staging buffer: {}", slice.id, bounce.error().message());
  Staged s{slice, region, *bounce, Stage::kCopyOut, 0, false};
  if (slice.memory.op == Op::kWrite) {
    if (Status st = copy(region->device, bounce->data, slice.memory.local, slice.bytes, s.event); !st.is_ok()) {
      give_back(*bounce);
      return Status::unavailable("submit: slice {}: GPU -> host copy: {}", slice.id, st.message());
    }
  } else {
    SliceSubmit wire = slice;
    wire.memory.local = bounce->data;
    if (Status st = ucx_->submit(wire, now_ns); !st.is_ok()) {
      give_back(*bounce);
      return st;
    }
    s.stage = Stage::kOnWire;
  }
  ++region->live_slices;
  slices_.emplace(slice.id, s);
  ucx_->hold_path(slice.path);  // its id must not go to another peer before the slice ends
  return Status::ok();
}

CancelResult VramStaging::cancel_remote(SliceId id, TimeNs now_ns) {
  auto it = slices_.find(id);
  if (it == slices_.end()) return ucx_->cancel(id, now_ns);
  Staged& s = it->second;
  switch (s.stage) {
    case Stage::kCopyOut:
      // The copy reads the GPU into our bounce: nothing of the caller's
      // changes. It ends quietly once the copy did.
      if (s.cancelled) return {};
      s.cancelled = true;
      return {true, 0};
    case Stage::kOnWire: return ucx_->cancel(id, now_ns);
    case Stage::kCopyIn: return {};
  }
  return {};
}

void VramStaging::finish(SliceId id, Staged& s, Status status, TimeNs now_ns, std::vector<Completion>& out) {
  if (s.event != 0) free_events_[s.region->device].push_back(s.event);
  --s.region->live_slices;
  ucx_->release_path(s.slice.path);
  give_back(s.bounce);
  if (!s.cancelled) {
    out.push_back({id, s.slice.path, s.slice.lane, s.slice.bytes, now_ns, std::move(status),
                   s.wire_bytes != 0 ? s.wire_bytes : s.slice.on_wire()});
  }
  slices_.erase(id);
}

void VramStaging::poll_remote(TimeNs now_ns, std::vector<Completion>& out) {
  last_poll_ns_ = std::max(last_poll_ns_, now_ns);
  // Every slice of the engine comes through here: without staged ones,
  // UCX's completions go out as they are.
  if (slices_.empty()) {
    ucx_->poll(now_ns, out);
    return;
  }
  ucx_done_.clear();
  ucx_->poll(now_ns, ucx_done_);
  for (Completion& c : ucx_done_) {
    auto it = slices_.find(c.id);
    if (it == slices_.end()) {
      out.push_back(std::move(c));
      continue;
    }
    Staged& s = it->second;
    s.wire_bytes = c.wire_bytes;
    if (!c.status.is_ok() || s.slice.memory.op == Op::kWrite) {
      finish(c.id, s, std::move(c.status), now_ns, out);
      continue;
    }
    s.event = 0;
    if (Status st = copy(s.region->device, s.slice.memory.local, s.bounce.data, s.slice.bytes, s.event); !st.is_ok()) {
      finish(c.id, s, Status::unavailable("host -> GPU copy: {}", st.message()), now_ns, out);
      continue;
    }
    s.stage = Stage::kCopyIn;
  }
  // CUDA copies that finished since.
  std::vector<SliceId> ready;
  std::vector<std::pair<SliceId, Status>> failed;
  for (auto& [id, s] : slices_) {
    if (s.stage == Stage::kOnWire) continue;
    auto done = cuda_->query(s.event);
    if (done && !*done) continue;
    if (done) {
      ready.push_back(id);
    } else {
      failed.emplace_back(id, Status::unavailable("GPU copy failed: {}", done.error().message()));
    }
  }
  for (auto& [id, why] : failed) finish(id, slices_.at(id), std::move(why), now_ns, out);
  for (SliceId id : ready) {
    Staged& s = slices_.at(id);
    if (s.stage == Stage::kCopyIn || s.cancelled) {
      finish(id, s, Status::ok(), now_ns, out);
      continue;
    }
    // A write's bytes are in the bounce: now UCX sends them.
    free_events_[s.region->device].push_back(s.event);
    s.event = 0;
    SliceSubmit wire = s.slice;
    wire.memory.local = s.bounce.data;
    if (Status st = ucx_->submit(wire, now_ns); !st.is_ok()) {
      finish(id, s, std::move(st), now_ns, out);
      continue;
    }
    s.stage = Stage::kOnWire;
  }
}

std::optional<TimeNs> VramStaging::next_remote_event_ns() const {
  auto next = ucx_->next_event_ns();
  const bool copying = std::ranges::any_of(slices_, [](const auto& e) { return e.second.stage != Stage::kOnWire; });
  if (!copying) return next;
  const TimeNs soon = last_poll_ns_ + kCopyPollNs;
  return next ? std::min(*next, soon) : soon;
}

bool VramStaging::arm_remote() {
  if (std::ranges::any_of(slices_, [](const auto& e) { return e.second.stage != Stage::kOnWire; })) return false;
  return ucx_->arm();
}

void VramStaging::set_local(std::unique_ptr<transport::CudaTransport> local) {
  local_ = std::move(local);
  all_paths_.clear();
}

const std::vector<transport::PathInfo>& VramStaging::paths() const {
  if (!local_) return ucx_->paths();
  // The scheduler asks every loop turn. UCX's paths grow as peers connect
  // (appended here) and change in place in what UCX chose to carry them
  // (type and figures: updated, without copying the names again) or, when
  // a failed path's id went to a new peer, whole.
  const auto& mine = local_->paths();
  if (all_paths_.empty()) all_paths_.assign(mine.begin(), mine.end());
  const auto& theirs = ucx_->paths();
  const std::size_t known = all_paths_.size() - mine.size();
  for (std::size_t i = 0; i < known; ++i) {
    transport::PathInfo& p = all_paths_[mine.size() + i];
    if (p.incarnation != theirs[i].incarnation) {
      p = theirs[i];
      continue;
    }
    p.type = theirs[i].type;
    p.lanes = theirs[i].lanes;
    p.bandwidth_gbps = theirs[i].bandwidth_gbps;
    p.latency_us = theirs[i].latency_us;
  }
  all_paths_.insert(all_paths_.end(), theirs.begin() + static_cast<std::ptrdiff_t>(known), theirs.end());
  return all_paths_;
}

Status VramStaging::submit(const SliceSubmit& slice, TimeNs now_ns) {
  const transport::PathId n = local_paths();
  if (slice.path >= n) {
    SliceSubmit remote = slice;
    remote.path -= n;
    return submit_remote(remote, now_ns);
  }
  if (local_slices_.contains(slice.id)) return Status::already_exists("submit: slice {} is in flight", slice.id);
  if (Status s = local_->submit(slice, now_ns); !s.is_ok()) return s;
  local_slices_.insert(slice.id);
  return Status::ok();
}

CancelResult VramStaging::cancel(SliceId id, TimeNs now_ns) {
  if (local_slices_.contains(id)) return local_->cancel(id, now_ns);
  return cancel_remote(id, now_ns);
}

void VramStaging::poll(TimeNs now_ns, std::vector<Completion>& out) {
  const std::size_t first = out.size();
  if (local_ && !local_slices_.empty()) {
    local_->poll(now_ns, out);
    for (std::size_t i = first; i < out.size(); ++i) local_slices_.erase(out[i].id);
  }
  const std::size_t remote = out.size();
  poll_remote(now_ns, out);
  const transport::PathId n = local_paths();
  for (std::size_t i = remote; i < out.size(); ++i) out[i].path += n;
}

std::optional<TimeNs> VramStaging::next_event_ns() const {
  auto next = next_remote_event_ns();
  if (!local_ || local_slices_.empty()) return next;
  auto mine = local_->next_event_ns();
  if (!mine) return next;
  return next ? std::min(*next, *mine) : mine;
}

bool VramStaging::path_healthy(transport::PathId path, TimeNs now_ns) const {
  const transport::PathId n = local_paths();
  return path < n ? local_->path_healthy(path, now_ns) : ucx_->path_healthy(path - n, now_ns);
}

Status VramStaging::path_status(transport::PathId path) const {
  const transport::PathId n = local_paths();
  return path < n ? local_->path_status(path) : ucx_->path_status(path - n);
}

bool VramStaging::arm() {
  if (!local_slices_.empty()) return false;  // CUDA events have no fd to wake us
  return arm_remote();
}

}  // namespace baton::engine
