#include "transport/fake_cuda_runtime.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace baton::transport::testing {

FakeCudaRuntime::FakeCudaRuntime(int devices, std::vector<std::vector<bool>> peer, std::uint64_t seed)
    : devices_(devices), peer_(std::move(peer)), rng_(seed), device_used_(static_cast<std::size_t>(devices), 0) {}

FakeCudaRuntime::~FakeCudaRuntime() {
  for (auto& [base, range] : memory_) std::free(reinterpret_cast<void*>(base));
}

std::string FakeCudaRuntime::pci_bus_id(int device) const {
  return device >= 0 && static_cast<std::size_t>(device) < pci_ids.size() ? pci_ids[static_cast<std::size_t>(device)] : "";
}

bool FakeCudaRuntime::can_access_peer(int device, int peer) const {
  return device >= 0 && peer >= 0 && static_cast<std::size_t>(device) < peer_.size() &&
         static_cast<std::size_t>(peer) < peer_[static_cast<std::size_t>(device)].size() &&
         peer_[static_cast<std::size_t>(device)][static_cast<std::size_t>(peer)];
}

Status FakeCudaRuntime::enable_peer_access(int device, int peer) {
  if (!can_access_peer(device, peer)) return Status::unavailable("fake: no peer access {} -> {}", device, peer);
  enabled_.insert({device, peer});
  return Status::ok();
}

Result<CudaStream> FakeCudaRuntime::create_stream(int device) {
  if (device < 0 || device >= devices_) return std::unexpected(Status::invalid_argument("fake: device {}", device));
  if (stream_limit >= 0 && static_cast<int>(streams_.size()) >= stream_limit) {
    return std::unexpected(Status::unavailable("fake: out of streams"));
  }
  const CudaStream h = next_handle_++;
  streams_[h] = Stream{device, {}, false};
  return h;
}

void FakeCudaRuntime::destroy_stream(CudaStream stream) { streams_.erase(stream); }

Result<CudaEvent> FakeCudaRuntime::create_event(int device) {
  if (device < 0 || device >= devices_) return std::unexpected(Status::invalid_argument("fake: device {}", device));
  const CudaEvent h = next_handle_++;
  events_[h] = Event{device, 0, 0, false};
  return h;
}

void FakeCudaRuntime::destroy_event(CudaEvent event) { events_.erase(event); }

Status FakeCudaRuntime::enqueue(CudaStream stream, Op op) {
  if (!streams_.contains(stream)) return Status::invalid_argument("fake: unknown stream {}", stream);
  streams_[stream].ops.push_back(op);
  return Status::ok();
}

Status FakeCudaRuntime::copy_async(void* dst, const void* src, std::size_t bytes, CudaStream stream) {
  Op op{Op::kCopy, dst, src, bytes};
  op.fails = ++copies_enqueued_ == fail_copy_number;
  return enqueue(stream, op);
}

Status FakeCudaRuntime::copy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                                        CudaStream stream) {
  if (!enabled_.contains({src_device, dst_device}) && !enabled_.contains({dst_device, src_device})) {
    return Status::unavailable("fake: peer copy {} -> {} without peer access", src_device, dst_device);
  }
  return copy_async(dst, src, bytes, stream);
}

Status FakeCudaRuntime::record(CudaEvent event, CudaStream stream) {
  auto e = events_.find(event);
  auto s = streams_.find(stream);
  if (e == events_.end() || s == streams_.end()) return Status::invalid_argument("fake: unknown event or stream");
  if (e->second.device != s->second.device) {
    return Status::invalid_argument("fake: event of device {} recorded on a stream of device {}", e->second.device,
                                    s->second.device);
  }
  Op op{Op::kMark};
  op.event = event;
  op.generation = ++e->second.recorded;
  return enqueue(stream, op);
}

Status FakeCudaRuntime::wait(CudaStream stream, CudaEvent event) {
  auto e = events_.find(event);
  if (e == events_.end()) return Status::invalid_argument("fake: unknown event {}", event);
  Op op{Op::kWait};
  op.event = event;
  op.generation = e->second.recorded;  // the latest record at the time of the call
  return enqueue(stream, op);
}

bool FakeCudaRuntime::runnable(const Stream& s) const {
  if (s.ops.empty()) return false;
  const Op& op = s.ops.front();
  if (op.kind != Op::kWait) return true;
  const auto e = events_.find(op.event);
  return e == events_.end() || e->second.completed >= op.generation;
}

bool FakeCudaRuntime::step() {
  std::vector<CudaStream> ready;
  for (const auto& [h, s] : streams_) {
    if (runnable(s)) ready.push_back(h);
  }
  if (ready.empty()) return false;
  const CudaStream h = ready[std::uniform_int_distribution<std::size_t>(0, ready.size() - 1)(rng_)];
  Stream& s = streams_[h];
  Op op = s.ops.front();
  s.ops.pop_front();
  switch (op.kind) {
    case Op::kCopy:
      if (op.fails) {
        s.failed = true;
      } else if (!s.failed) {
        std::memmove(op.dst, op.src, op.bytes);
        log_.push_back({h, s.device, op.dst, op.src, op.bytes});
      }
      break;
    case Op::kMark: {
      Event& e = events_[op.event];
      e.completed = std::max(e.completed, op.generation);
      e.failed = s.failed;
      break;
    }
    case Op::kWait: break;
  }
  return true;
}

std::size_t FakeCudaRuntime::pending_ops() const {
  std::size_t n = 0;
  for (const auto& [h, s] : streams_) n += s.ops.size();
  return n;
}

Result<bool> FakeCudaRuntime::query(CudaEvent event) {
  for (int i = 0; i < steps_per_query; ++i) (void)step();
  const auto e = events_.find(event);
  if (e == events_.end()) return std::unexpected(Status::invalid_argument("fake: unknown event {}", event));
  if (e->second.completed < e->second.recorded) return false;
  if (e->second.failed) return std::unexpected(Status::unavailable("fake: a copy before event {} failed", event));
  return true;
}

Status FakeCudaRuntime::synchronize(CudaStream stream) {
  const auto s = streams_.find(stream);
  if (s == streams_.end()) return Status::invalid_argument("fake: unknown stream {}", stream);
  while (!s->second.ops.empty()) {
    if (!step()) return Status::unavailable("fake: stream {} waits for an event nothing will record", stream);
  }
  return s->second.failed ? Status::unavailable("fake: stream {} failed", stream) : Status::ok();
}

Result<void*> FakeCudaRuntime::alloc_pinned(std::size_t bytes) {
  void* p = std::malloc(bytes);
  if (p == nullptr) return std::unexpected(Status::unavailable("fake: out of memory"));
  memory_[reinterpret_cast<std::uint64_t>(p)] = Range{bytes, -1};
  return p;
}

void FakeCudaRuntime::free_pinned(void* ptr) {
  memory_.erase(reinterpret_cast<std::uint64_t>(ptr));
  std::free(ptr);
}

Result<void*> FakeCudaRuntime::alloc_device(int device, std::size_t bytes) {
  if (device < 0 || device >= devices_) return std::unexpected(Status::invalid_argument("fake: device {}", device));
  void* p = std::malloc(bytes);
  if (p == nullptr) return std::unexpected(Status::unavailable("fake: out of memory"));
  memory_[reinterpret_cast<std::uint64_t>(p)] = Range{bytes, device};
  device_used_[static_cast<std::size_t>(device)] += bytes;
  return p;
}

void FakeCudaRuntime::free_device(void* ptr) {
  const auto it = memory_.find(reinterpret_cast<std::uint64_t>(ptr));
  if (it == memory_.end()) return;
  device_used_[static_cast<std::size_t>(it->second.device)] -= it->second.length;
  memory_.erase(it);
  std::free(ptr);
}

Status FakeCudaRuntime::register_host(void* ptr, std::size_t bytes) {
  const auto base = reinterpret_cast<std::uint64_t>(ptr);
  if (pinned_.contains(base)) return Status::unavailable("fake: {} is already registered", ptr);
  pinned_[base] = bytes;
  return Status::ok();
}

void FakeCudaRuntime::unregister_host(void* ptr) { pinned_.erase(reinterpret_cast<std::uint64_t>(ptr)); }

Result<CudaPointer> FakeCudaRuntime::pointer(const void* ptr) const {
  const auto a = reinterpret_cast<std::uint64_t>(ptr);
  auto in = [a](const auto& map) -> const std::pair<const std::uint64_t, typename std::decay_t<decltype(map)>::mapped_type>* {
    auto it = map.upper_bound(a);
    if (it == map.begin()) return nullptr;
    --it;
    return &*it;
  };
  if (const auto* m = in(memory_); m != nullptr && a - m->first < m->second.length) {
    return m->second.device >= 0 ? CudaPointer{CudaMemoryType::kDevice, m->second.device}
                                 : CudaPointer{CudaMemoryType::kPinnedHost, -1};
  }
  if (const auto* p = in(pinned_); p != nullptr && a - p->first < p->second) {
    return CudaPointer{CudaMemoryType::kPinnedHost, -1};
  }
  return CudaPointer{CudaMemoryType::kUnregistered, -1};
}

Result<std::uint64_t> FakeCudaRuntime::device_memory_used(int device) const {
  if (device < 0 || device >= devices_) return std::unexpected(Status::invalid_argument("fake: device {}", device));
  return device_used_[static_cast<std::size_t>(device)];
}

}  // namespace baton::transport::testing
