#include "baton/transport/cuda_transport.h"

#include <spdlog/spdlog.h>

#include "baton/common/address_ranges.h"
#include "baton/common/log.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <unordered_map>

namespace baton::transport {
namespace {

// How a path's slices move.
enum class Mechanism : std::uint8_t {
  kPeer,     // cudaMemcpyPeerAsync between two GPUs
  kStaging,  // GPU → pinned bounce buffer → GPU, chunk by chunk
  kHost,     // host memory ↔ GPU in one cudaMemcpyAsync
};

// A topology node a path ends at: a GPU (its CUDA device) or a NUMA node.
struct Endpoint {
  bool gpu = false;
  int device = -1;  // CUDA device of a GPU
  int numa = -1;    // OS index of a NUMA node
};

struct Region {
  RegionHandle handle = 0;
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  int device = -1;  // CUDA device (kVram) or NUMA node (kDram, -1: any)
  bool pinned_here = false;
  std::uint64_t live_slices = 0;
};

// One bounce buffer of a staging lane, with the events that order its
// reuse: a chunk may fill it only after the previous chunk drained it.
// Events exist on both GPUs (an event is recorded on its own device's
// stream) since a read fills from the path's far end.
struct Bounce {
  void* buffer = nullptr;
  CudaEvent filled[2] = {0, 0};
  CudaEvent drained[2] = {0, 0};
  CudaEvent last_drain = 0;  // 0: never used
};

struct Lane {
  CudaStream streams[2] = {0, 0};  // on the path's `from` and `to` GPU (0 where that end is host memory)
  std::vector<Bounce> bounces;
  std::size_t next_bounce = 0;
  std::vector<SliceId> inflight;  // in submit order
  bool built = false;             // streams and buffers made (build_lane)
};

struct CudaPath {
  Mechanism mechanism = Mechanism::kHost;
  Endpoint ends[2];  // from, to
  std::vector<Lane> lanes;
  Status failure;  // not ok once the path failed
};

struct SliceRecord {
  SliceSubmit submit;
  CudaEvent event = 0;  // fires when the slice's last copy finished
  int event_device = -1;
  RegionHandle regions[2] = {0, 0};  // local, remote
  Status failure;  // set when posting failed part way: it completes with it
};

// A PCI address as numbers, so "00000000:17:00.0" (CUDA's) and
// "0000:17:00.0" (NVML's, sysfs's) compare equal; nullopt when unparsable.
std::optional<std::array<unsigned, 4>> pci_address(const std::string& id) {
  std::array<unsigned, 4> a{};
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x", &a[0], &a[1], &a[2], &a[3]) != 4) return std::nullopt;
  return a;
}

Result<int> gpu_index(std::string_view id) {
  int n = -1;
  if (!id.starts_with("gpu")) return std::unexpected(Status::not_found("\"{}\" is not a GPU node", id));
  const char* first = id.data() + 3;
  const char* last = id.data() + id.size();
  auto [ptr, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || ptr != last || first == last) {
    return std::unexpected(Status::not_found("\"{}\" is not a GPU node", id));
  }
  return n;
}

}  // namespace

Status check_device_memory(const CudaRuntime& runtime, const void* ptr, std::size_t length, int device) {
  if (ptr == nullptr || length == 0) {
    return Status::invalid_argument("GPU memory [{}, +{}): a null pointer or zero length", ptr, length);
  }
  for (const void* end : {ptr, static_cast<const void*>(static_cast<const std::byte*>(ptr) + (length - 1))}) {
    auto a = runtime.pointer(end);
    if (!a) return a.error();
    if (a->type == CudaMemoryType::kDevice && a->device == device) continue;
    return Status::invalid_argument(
        "[{}, +{}) is not all device memory of GPU {} (the runtime says {} memory{} at {})", ptr, length, device,
        a->type == CudaMemoryType::kDevice       ? "device"
        : a->type == CudaMemoryType::kPinnedHost ? "pinned host"
        : a->type == CudaMemoryType::kManaged    ? "managed"
                                                 : "pageable host",
        a->type == CudaMemoryType::kDevice ? fmt::format(" of GPU {}", a->device) : "", end);
  }
  return Status::ok();
}

struct CudaTransport::State {
  std::shared_ptr<CudaRuntime> runtime;
  CudaConfig config;
  std::unordered_map<std::string, Endpoint> endpoints;
  std::vector<PathInfo> infos;
  std::vector<CudaPath> paths;
  std::map<std::uint64_t, Region> regions;  // by base
  std::unordered_map<RegionHandle, std::uint64_t> region_base;
  RegionHandle next_region = 1;
  std::unordered_map<SliceId, SliceRecord> slices;
  std::unordered_map<int, std::vector<CudaEvent>> free_events;  // by device
  std::vector<std::pair<int, CudaEvent>> all_events;
  TimeNs last_poll_ns = 0;

  ~State() {
    // Copies still running would write into bounce buffers freed below.
    for (CudaPath& p : paths) {
      for (Lane& lane : p.lanes) {
        for (CudaStream s : lane.streams) {
          if (s != 0) (void)runtime->synchronize(s);
        }
      }
    }
    for (CudaPath& p : paths) {
      for (Lane& lane : p.lanes) {
        for (Bounce& b : lane.bounces) {
          if (b.buffer != nullptr) runtime->free_pinned(b.buffer);
        }
        for (CudaStream s : lane.streams) {
          if (s != 0) runtime->destroy_stream(s);
        }
      }
    }
    for (auto [device, event] : all_events) runtime->destroy_event(event);
    for (auto& [base, r] : regions) {
      if (r.pinned_here) runtime->unregister_host(reinterpret_cast<void*>(base));
    }
  }

  Result<CudaEvent> new_event(int device) {
    auto e = runtime->create_event(device);
    if (!e) return std::unexpected(e.error());
    all_events.emplace_back(device, *e);
    return *e;
  }
  Result<CudaEvent> take_event(int device) {
    auto& pool = free_events[device];
    if (!pool.empty()) {
      const CudaEvent e = pool.back();
      pool.pop_back();
      return e;
    }
    return new_event(device);
  }

  Region* region_by_handle(RegionHandle h) {
    auto it = region_base.find(h);
    return it == region_base.end() ? nullptr : &regions.at(it->second);
  }

  static bool on(const Region& r, const Endpoint& e) {
    if (e.gpu) return r.kind == MemoryKind::kVram && r.device == e.device;
    return r.kind == MemoryKind::kDram && (r.device == -1 || r.device == e.numa);
  }

  // A lane's streams, bounce buffers and their events, made at its first
  // slice: an 8-GPU machine has 56 staging paths, mostly fallbacks that never
  // carry a byte, and each lane's buffers are pinned memory. Makes only what
  // is missing, so it can be called again after a failure.
  Status build_lane(CudaPath& p, Lane& lane) {
    for (int side = 0; side < 2; ++side) {
      if (!p.ends[side].gpu || lane.streams[side] != 0) continue;
      auto s = runtime->create_stream(p.ends[side].device);
      if (!s) return s.error();
      lane.streams[side] = *s;
    }
    if (p.mechanism != Mechanism::kStaging) return Status::ok();
    lane.bounces.resize(static_cast<std::size_t>(config.staging_buffers));
    for (Bounce& b : lane.bounces) {
      if (b.buffer == nullptr) {
        auto buffer = runtime->alloc_pinned(config.staging_chunk_bytes);
        if (!buffer) return buffer.error();
        b.buffer = *buffer;
      }
      for (int side = 0; side < 2; ++side) {
        for (CudaEvent* e : {&b.filled[side], &b.drained[side]}) {
          if (*e != 0) continue;
          auto made = new_event(p.ends[side].device);
          if (!made) return made.error();
          *e = *made;
        }
      }
    }
    lane.built = true;
    return Status::ok();
  }

  // Posts the copies of one slice from `src` (on end `src_side`) to `dst`.
  // Returns the stream its last copy is on, or why posting failed.
  Result<int> post(CudaPath& p, Lane& lane, int src_side, std::byte* dst, const std::byte* src,
                   std::uint64_t bytes) {
    const int dst_side = 1 - src_side;
    switch (p.mechanism) {
      case Mechanism::kPeer: {
        if (Status s = runtime->copy_peer_async(dst, p.ends[dst_side].device, src, p.ends[src_side].device, bytes,
                                                lane.streams[src_side]);
            !s.is_ok()) {
          return std::unexpected(s);
        }
        return src_side;
      }
      case Mechanism::kHost: {
        const int gpu_side = p.ends[0].gpu ? 0 : 1;
        if (Status s = runtime->copy_async(dst, src, bytes, lane.streams[gpu_side]); !s.is_ok()) {
          return std::unexpected(s);
        }
        return gpu_side;
      }
      case Mechanism::kStaging: break;
    }
    const std::uint64_t chunk = config.staging_chunk_bytes;
    for (std::uint64_t off = 0; off < bytes; off += chunk) {
      const std::uint64_t n = std::min(chunk, bytes - off);
      Bounce& b = lane.bounces[lane.next_bounce];
      lane.next_bounce = (lane.next_bounce + 1) % lane.bounces.size();
      const CudaStream fill = lane.streams[src_side];
      const CudaStream drain = lane.streams[dst_side];
      Status s;
      if (b.last_drain != 0) s = runtime->wait(fill, b.last_drain);
      if (s.is_ok()) s = runtime->copy_async(b.buffer, src + off, n, fill);
      if (s.is_ok()) s = runtime->record(b.filled[src_side], fill);
      if (s.is_ok()) s = runtime->wait(drain, b.filled[src_side]);
      if (s.is_ok()) s = runtime->copy_async(dst + off, b.buffer, n, drain);
      if (s.is_ok()) s = runtime->record(b.drained[dst_side], drain);
      if (!s.is_ok()) return std::unexpected(s);
      b.last_drain = b.drained[dst_side];
    }
    return dst_side;
  }

  void fail_path(CudaPath& p, const Status& why, std::string_view name) {
    if (!p.failure.is_ok()) return;
    p.failure = Status::unavailable("cuda path {} failed: {}", name, why.message());
    baton::logger().warn("{}", p.failure.message());
  }
};

CudaTransport::CudaTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaTransport::~CudaTransport() = default;

Result<std::unique_ptr<CudaTransport>> CudaTransport::create(const topology::TopologyGraph& graph,
                                                             std::shared_ptr<CudaRuntime> runtime,
                                                             CudaConfig config) {
  if (!runtime) return std::unexpected(Status::invalid_argument("cuda transport: no runtime (null)"));
  if (config.lanes_per_path < 1 || config.lanes_per_path > 64) {
    return std::unexpected(Status::invalid_argument("cuda transport: lanes_per_path {} (expected 1..64)",
                                                    config.lanes_per_path));
  }
  if (config.staging_chunk_bytes < 4096 || config.staging_chunk_bytes > (1ULL << 30)) {
    return std::unexpected(Status::invalid_argument(
        "cuda transport: staging_chunk_bytes {} (expected 4 KiB..1 GiB)", config.staging_chunk_bytes));
  }
  if (config.staging_buffers < 1 || config.staging_buffers > 16) {
    return std::unexpected(Status::invalid_argument("cuda transport: staging_buffers {} (expected 1..16)",
                                                    config.staging_buffers));
  }
  if (config.poll_interval_ns <= 0) {
    return std::unexpected(Status::invalid_argument("cuda transport: poll_interval_ns {} (expected > 0)",
                                                    config.poll_interval_ns));
  }
  auto state = std::make_unique<State>();
  state->runtime = std::move(runtime);
  state->config = config;
  CudaRuntime& rt = *state->runtime;
  const int devices = rt.device_count();

  for (const topology::Node* node : graph.nodes_of(topology::NodeKind::kGpu)) {
    int device = -1;
    if (const auto want = pci_address(node->pci_bus_id)) {
      for (int d = 0; d < devices && device < 0; ++d) {
        if (pci_address(rt.pci_bus_id(d)) == want) device = d;
      }
    }
    if (device < 0) {
      auto index = gpu_index(node->id);
      if (index && *index < devices && (node->pci_bus_id.empty() || rt.pci_bus_id(*index).empty())) device = *index;
    }
    if (device < 0) {
      return std::unexpected(Status::invalid_argument(
          "cuda transport: the topology's {} (PCI {}) is none of the {} CUDA devices this process sees", node->id,
          node->pci_bus_id.empty() ? "unknown" : node->pci_bus_id, devices));
    }
    state->endpoints[node->id] = Endpoint{true, device, -1};
  }
  for (const topology::Node* node : graph.nodes_of(topology::NodeKind::kNuma)) {
    state->endpoints[node->id] = Endpoint{false, -1, node->numa};
  }

  // A GPU pair's peer copies take whatever link the driver uses (NVLink
  // when there is one): one peer path per pair, on its best link.
  using topology::PathType;
  auto peer_link = [](const topology::Link& l) {
    return l.path == PathType::kNvlink || l.path == PathType::kNvswitch || l.path == PathType::kPcieP2p;
  };
  std::unordered_map<std::string, const topology::Link*> best_peer;
  for (const topology::Link& link : graph.links()) {
    if (!peer_link(link)) continue;
    const topology::Link*& best = best_peer[link.from + "|" + link.to];
    if (best == nullptr || link.cost.score > best->cost.score) best = &link;
  }
  for (const topology::Link& link : graph.links()) {
    if (peer_link(link) && best_peer[link.from + "|" + link.to] != &link) continue;
    const auto from = state->endpoints.find(link.from);
    const auto to = state->endpoints.find(link.to);
    if (from == state->endpoints.end() || to == state->endpoints.end()) continue;
    const Endpoint a = from->second;
    const Endpoint b = to->second;
    if (!a.gpu && !b.gpu) continue;  // host ↔ host is not CUDA's
    Mechanism mechanism = Mechanism::kHost;
    if (a.gpu && b.gpu) {
      if (link.path == PathType::kHostStaging) {
        mechanism = Mechanism::kStaging;
      } else if (peer_link(link)) {
        if (a.device == b.device || !rt.can_access_peer(a.device, b.device) ||
            !rt.can_access_peer(b.device, a.device)) {
          baton::logger().info("cuda transport: {} <-> {} over {}: no peer access; host staging only", link.from, link.to,
                               topology::to_string(link.path));
          continue;
        }
        Status s = rt.enable_peer_access(a.device, b.device);
        if (s.is_ok()) s = rt.enable_peer_access(b.device, a.device);
        if (!s.is_ok()) {
          baton::logger().warn("cuda transport: {} <-> {}: {}; host staging only", link.from, link.to, s.message());
          continue;
        }
        mechanism = Mechanism::kPeer;
      } else {
        continue;
      }
    } else if (link.path != topology::PathType::kHostStaging) {
      continue;
    }
    for (auto [x, y, ex, ey] : {std::tuple{link.from, link.to, a, b}, std::tuple{link.to, link.from, b, a}}) {
      CudaPath p;
      p.mechanism = mechanism;
      p.ends[0] = ex;
      p.ends[1] = ey;
      p.lanes.resize(static_cast<std::size_t>(config.lanes_per_path));
      state->paths.push_back(std::move(p));
      state->infos.push_back(
          {x, y, link.path, config.lanes_per_path, link.cost.bandwidth_gbps, link.cost.latency_us});
    }
  }
  return std::unique_ptr<CudaTransport>(new CudaTransport(std::move(state)));
}

Result<RegionHandle> CudaTransport::register_memory(void* ptr, std::size_t length, MemoryKind kind, int device) {
  State& st = *state_;
  const auto base = reinterpret_cast<std::uint64_t>(ptr);
  if (ptr == nullptr) return std::unexpected(Status::invalid_argument("cuda register_memory: null pointer"));
  if (length == 0) return std::unexpected(Status::invalid_argument("cuda register_memory: length 0 at {}", ptr));
  if (base + length < base) {
    return std::unexpected(Status::invalid_argument("cuda register_memory: [{}, +{}) wraps", ptr, length));
  }
  if (kind != MemoryKind::kDram && kind != MemoryKind::kVram) {
    return std::unexpected(Status::invalid_argument("cuda register_memory: unknown kind {}", static_cast<int>(kind)));
  }
  if (find_overlapping(st.regions, base, length) != nullptr) {
    return std::unexpected(
        Status::invalid_argument("cuda register_memory: [{}, +{}) overlaps a registered region", ptr, length));
  }
  const void* last = static_cast<const std::byte*>(ptr) + (length - 1);
  Region r{st.next_region, base, length, kind, device, false, 0};
  if (kind == MemoryKind::kVram) {
    if (Status s = check_device_memory(*st.runtime, ptr, length, device); !s.is_ok()) {
      return std::unexpected(Status(s.code(), "cuda register_memory: " + s.message()));
    }
  } else {
    if (device < -1) {
      return std::unexpected(Status::invalid_argument("cuda register_memory: NUMA node {} (expected >= 0, or -1)", device));
    }
    auto first_attr = st.runtime->pointer(ptr);
    auto last_attr = st.runtime->pointer(last);
    if (!first_attr) return std::unexpected(first_attr.error());
    if (!last_attr) return std::unexpected(last_attr.error());
    for (const CudaPointer& a : {*first_attr, *last_attr}) {
      if (a.type == CudaMemoryType::kDevice || a.type == CudaMemoryType::kManaged) {
        return std::unexpected(Status::invalid_argument(
            "cuda register_memory: [{}, +{}) is GPU memory, registered as DRAM (use MemoryKind::kVram)", ptr,
            length));
      }
    }
    if (first_attr->type == CudaMemoryType::kUnregistered) {
      if (Status s = st.runtime->register_host(ptr, length); !s.is_ok()) {
        return std::unexpected(
            Status::unavailable("cuda register_memory: pinning [{}, +{}): {}", ptr, length, s.message()));
      }
      r.pinned_here = true;
    }
  }
  st.regions.emplace(base, r);
  st.region_base.emplace(r.handle, base);
  return st.next_region++;
}

Status CudaTransport::unregister(RegionHandle handle) {
  State& st = *state_;
  Region* r = st.region_by_handle(handle);
  if (r == nullptr) return Status::not_found("cuda unregister: no region {}", handle);
  if (r->live_slices != 0) {
    return Status::failed_precondition("cuda unregister: region {} has {} slices in flight", handle, r->live_slices);
  }
  if (r->pinned_here) st.runtime->unregister_host(reinterpret_cast<void*>(r->base));
  const std::uint64_t base = r->base;
  st.region_base.erase(handle);
  st.regions.erase(base);
  return Status::ok();
}

Result<int> CudaTransport::device_of(std::string_view node) const {
  const auto it = state_->endpoints.find(std::string(node));
  if (it == state_->endpoints.end() || !it->second.gpu) {
    return std::unexpected(Status::not_found("cuda transport: \"{}\" is not a GPU of this transport", node));
  }
  return it->second.device;
}

const std::vector<PathInfo>& CudaTransport::paths() const { return state_->infos; }

Status CudaTransport::submit(const SliceSubmit& slice, TimeNs now_ns) {
  State& st = *state_;
  st.last_poll_ns = std::max(st.last_poll_ns, now_ns);
  if (slice.path >= st.paths.size()) {
    return Status::invalid_argument("cuda submit: slice {} names path {} but there are {}", slice.id, slice.path,
                                    st.paths.size());
  }
  CudaPath& p = st.paths[slice.path];
  const PathInfo& info = st.infos[slice.path];
  if (slice.lane < 0 || slice.lane >= static_cast<int>(p.lanes.size())) {
    return Status::invalid_argument("cuda submit: slice {} names lane {} of {} which has {}", slice.id, slice.lane,
                                    info.name(), p.lanes.size());
  }
  if (slice.bytes == 0) return Status::invalid_argument("cuda submit: slice {} has 0 bytes", slice.id);
  if (slice.wire_bytes != 0) {
    return Status::invalid_argument("cuda submit: slice {} is compressed; this transport carries none", slice.id);
  }
  if (slice.memory.op != Op::kRead && slice.memory.op != Op::kWrite) {
    return Status::invalid_argument("cuda submit: slice {} has unknown op {}", slice.id,
                                    static_cast<int>(slice.memory.op));
  }
  if (st.slices.contains(slice.id)) return Status::already_exists("cuda submit: slice {} is in flight", slice.id);
  if (!p.failure.is_ok()) return p.failure;
  const auto local_addr = reinterpret_cast<std::uint64_t>(slice.memory.local);
  Region* local = find_containing(st.regions, local_addr, slice.bytes);
  if (local == nullptr || !State::on(*local, p.ends[0])) {
    return Status::invalid_argument("cuda submit: slice {}: local [{:#x}, +{}) is in no region on {}", slice.id,
                                    local_addr, slice.bytes, info.from);
  }
  Region* remote = st.region_by_handle(slice.memory.remote_key);
  if (remote == nullptr || !State::on(*remote, p.ends[1])) {
    return Status::invalid_argument("cuda submit: slice {}: remote key {} names no region on {}", slice.id,
                                    slice.memory.remote_key, info.to);
  }
  const std::uint64_t ra = slice.memory.remote_addr;
  if (ra < remote->base || ra - remote->base > remote->length || slice.bytes > remote->length - (ra - remote->base)) {
    return Status::out_of_range("cuda submit: slice {}: remote [{:#x}, +{}) is outside region {} ([{:#x}, +{}))",
                                slice.id, ra, slice.bytes, remote->handle, remote->base, remote->length);
  }

  Lane& lane = p.lanes[static_cast<std::size_t>(slice.lane)];
  if (!lane.built) {
    if (Status s = st.build_lane(p, lane); !s.is_ok()) {
      // What was made stays with the lane (the destructor frees it).
      st.fail_path(p, Status::unavailable("making lane {}: {}", slice.lane, s.message()), info.name());
      return p.failure;
    }
  }
  auto* local_ptr = static_cast<std::byte*>(slice.memory.local);
  auto* remote_ptr = reinterpret_cast<std::byte*>(ra);
  const bool write = slice.memory.op == Op::kWrite;
  SliceRecord record{slice, 0, -1, {local->handle, remote->handle}, Status::ok()};
  auto last = write ? st.post(p, lane, 0, remote_ptr, local_ptr, slice.bytes)
                    : st.post(p, lane, 1, local_ptr, remote_ptr, slice.bytes);
  if (last) {
    const int device = p.ends[*last].device;
    auto event = st.take_event(device);
    Status s = event ? st.runtime->record(*event, lane.streams[*last]) : event.error();
    if (s.is_ok()) {
      record.event = *event;
      record.event_device = device;
    } else {
      if (event) st.free_events[device].push_back(*event);
      last = std::unexpected(s);
    }
  }
  if (!last) {
    // Some copies may be on their way: the slice completes unavailable at
    // the next poll, and the path takes no more.
    st.fail_path(p, last.error(), info.name());
    record.failure = p.failure;
  }
  ++local->live_slices;
  ++remote->live_slices;
  lane.inflight.push_back(slice.id);
  st.slices.emplace(slice.id, std::move(record));
  return Status::ok();
}

CancelResult CudaTransport::cancel(SliceId /*id*/, TimeNs /*now_ns*/) { return {}; }

void CudaTransport::poll(TimeNs now_ns, std::vector<Completion>& out) {
  State& st = *state_;
  st.last_poll_ns = std::max(st.last_poll_ns, now_ns);
  for (std::size_t pi = 0; pi < st.paths.size(); ++pi) {
    CudaPath& p = st.paths[pi];
    for (Lane& lane : p.lanes) {
      // Each slice's own event: on a staging lane a read ends on one
      // stream, a write on the other, so they may finish out of order.
      auto done = [&](SliceId id) {
        SliceRecord& s = st.slices.at(id);
        Status status = s.failure;
        if (s.event != 0) {
          auto ready = st.runtime->query(s.event);
          if (ready && !*ready) return false;
          if (!ready) {
            st.fail_path(p, ready.error(), st.infos[pi].name());
            status = p.failure;
          }
          st.free_events[s.event_device].push_back(s.event);
        }
        for (RegionHandle h : s.regions) {
          if (Region* r = st.region_by_handle(h)) --r->live_slices;
        }
        out.push_back({id, s.submit.path, s.submit.lane, s.submit.bytes, now_ns, status, s.submit.bytes});
        st.slices.erase(id);
        return true;
      };
      std::erase_if(lane.inflight, done);
    }
    if (!p.failure.is_ok()) {
      // What is left on a failed path: its events may never say ready.
      for (Lane& lane : p.lanes) {
        for (SliceId id : lane.inflight) {
          SliceRecord& s = st.slices.at(id);
          for (RegionHandle h : s.regions) {
            if (Region* r = st.region_by_handle(h)) --r->live_slices;
          }
          out.push_back({id, s.submit.path, s.submit.lane, s.submit.bytes, now_ns, p.failure, s.submit.bytes});
          st.slices.erase(id);
        }
        lane.inflight.clear();
      }
    }
  }
}

std::optional<TimeNs> CudaTransport::next_event_ns() const {
  if (state_->slices.empty()) return std::nullopt;
  return state_->last_poll_ns + state_->config.poll_interval_ns;
}

bool CudaTransport::path_healthy(PathId path, TimeNs /*now_ns*/) const {
  return path < state_->paths.size() && state_->paths[path].failure.is_ok();
}

std::size_t CudaTransport::slices_in_flight() const { return state_->slices.size(); }

}  // namespace baton::transport
