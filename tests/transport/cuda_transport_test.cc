// The CUDA transport's bookkeeping over a scripted runtime (no GPU needed):
// paths from the topology, lanes as streams, completion by polled events,
// the staging pipeline's order, validation and failure. The same transport
// over the real runtime is cuda_gpu_test.cc (skipped without a GPU).
#include "baton/transport/cuda_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "baton/sched/scheduler.h"
#include "transport/fake_cuda_runtime.h"

namespace baton::transport {
namespace {

using testing::FakeCudaRuntime;
using topology::PathType;

constexpr std::uint64_t kChunk = 4096;

// gpu0 ↔ gpu1 over NVLink (peer access), gpu2 with no peer: staging only.
topology::TopologyFacts three_gpus() {
  topology::TopologyFacts facts;
  facts.source = "test";
  for (int i = 0; i < 3; ++i) {
    topology::GpuInfo gpu;
    gpu.name = fmt::format("GPU{}", i);
    gpu.numa = 0;
    facts.gpus.push_back(gpu);
  }
  facts.numa_nodes.push_back({0, "0-1", 2, 0});
  topology::Relation r;
  r.a = {topology::DeviceRef::Kind::kGpu, 0};
  r.b = {topology::DeviceRef::Kind::kGpu, 1};
  r.nvlinks = 4;
  r.peer_access = true;
  facts.relations.push_back(r);
  return facts;
}

std::vector<std::vector<bool>> peers_01() { return {{false, true, false}, {true, false, false}, {false, false, false}}; }

topology::TopologyGraph graph_of(const topology::TopologyFacts& facts) {
  auto g = topology::TopologyGraph::build(facts);
  EXPECT_TRUE(g.has_value()) << g.error().message();
  return *g;
}

CudaConfig small_chunks() {
  CudaConfig c;
  c.staging_chunk_bytes = kChunk;
  c.staging_buffers = 2;
  return c;
}

std::optional<PathId> find_path(const CudaTransport& t, std::string_view from, std::string_view to, PathType type) {
  const auto& paths = t.paths();
  for (PathId i = 0; i < paths.size(); ++i) {
    if (paths[i].from == from && paths[i].to == to && paths[i].type == type) return i;
  }
  return std::nullopt;
}

// A buffer on one endpoint (device memory of a GPU, or pageable host
// memory) registered with the transport.
struct Buffer {
  std::byte* data = nullptr;
  RegionHandle handle = 0;
};

class CudaTransportTest : public ::testing::Test {
 protected:
  void make(std::uint64_t seed = 1, CudaConfig config = small_chunks(), std::vector<std::vector<bool>> peer = peers_01()) {
    runtime_ = std::make_shared<FakeCudaRuntime>(3, std::move(peer), seed);
    graph_ = graph_of(three_gpus());
    auto t = CudaTransport::create(graph_, runtime_, config);
    ASSERT_TRUE(t.has_value()) << t.error().message();
    transport_ = std::move(*t);
  }

  Buffer buffer_on(std::string_view node, std::size_t bytes) {
    Buffer b;
    if (node.starts_with("gpu")) {
      const int device = *transport_->device_of(node);
      b.data = static_cast<std::byte*>(*runtime_->alloc_device(device, bytes));
      auto h = transport_->register_memory(b.data, bytes, MemoryKind::kVram, device);
      EXPECT_TRUE(h.has_value()) << h.error().message();
      b.handle = h.value_or(0);
    } else {
      host_.emplace_back(bytes);
      b.data = host_.back().data();
      auto h = transport_->register_memory(b.data, bytes, MemoryKind::kDram, -1);
      EXPECT_TRUE(h.has_value()) << h.error().message();
      b.handle = h.value_or(0);
    }
    return b;
  }

  // Polls until `n` completions came (bounded), returning them.
  std::vector<Completion> run(std::size_t n) {
    std::vector<Completion> out;
    for (int i = 0; i < 100'000 && out.size() < n; ++i) transport_->poll(now_ += 1000, out);
    EXPECT_EQ(out.size(), n);
    return out;
  }

  std::shared_ptr<FakeCudaRuntime> runtime_;
  topology::TopologyGraph graph_;
  std::unique_ptr<CudaTransport> transport_;
  std::vector<std::vector<std::byte>> host_;
  TimeNs now_ = 1'000'000;
};

void fill(std::byte* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}

TEST_F(CudaTransportTest, PathsFollowTheTopologyWherePeerAccessIsGranted) {
  make();
  // NVLink both ways, staging for the three GPU pairs, host ↔ each GPU.
  EXPECT_EQ(transport_->paths().size(), 2u * (1 + 3 + 3));
  EXPECT_TRUE(find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink));
  EXPECT_TRUE(find_path(*transport_, "gpu1", "gpu0", PathType::kNvlink));
  EXPECT_TRUE(find_path(*transport_, "gpu0", "gpu1", PathType::kHostStaging));
  EXPECT_TRUE(find_path(*transport_, "gpu2", "gpu0", PathType::kHostStaging));
  EXPECT_TRUE(find_path(*transport_, "numa0", "gpu2", PathType::kHostStaging));
  EXPECT_TRUE(find_path(*transport_, "gpu2", "numa0", PathType::kHostStaging));
  EXPECT_EQ(runtime_->enabled_peer_pairs(), 2u);
  for (const PathInfo& p : transport_->paths()) EXPECT_EQ(p.lanes, 2);

  // The driver refusing peer access drops the NVLink paths; staging stays.
  make(1, small_chunks(), {});
  EXPECT_EQ(transport_->paths().size(), 2u * (3 + 3));
  EXPECT_FALSE(find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink));
  EXPECT_TRUE(find_path(*transport_, "gpu0", "gpu1", PathType::kHostStaging));
  EXPECT_EQ(runtime_->enabled_peer_pairs(), 0u);
}

TEST_F(CudaTransportTest, GpusAreMatchedToDevicesByPciBusId) {
  runtime_ = std::make_shared<FakeCudaRuntime>(3, peers_01());
  // CUDA writes an 8-digit domain, NVML and sysfs 4: the same devices.
  runtime_->pci_ids = {"00000000:10:00.0", "00000000:11:00.0", "00000000:12:00.0"};
  auto facts = three_gpus();
  // The topology lists the GPUs in another order than CUDA numbers them.
  facts.gpus[0].pci_bus_id = "0000:12:00.0";
  facts.gpus[1].pci_bus_id = "0000:10:00.0";
  facts.gpus[2].pci_bus_id = "0000:11:00.0";
  facts.relations.clear();
  graph_ = graph_of(facts);
  auto t = CudaTransport::create(graph_, runtime_);
  ASSERT_TRUE(t.has_value()) << t.error().message();
  EXPECT_EQ(*(*t)->device_of("gpu0"), 2);
  EXPECT_EQ(*(*t)->device_of("gpu1"), 0);
  EXPECT_EQ(*(*t)->device_of("gpu2"), 1);
  EXPECT_EQ((*t)->device_of("numa0").error().code(), StatusCode::kNotFound);

  facts.gpus[0].pci_bus_id = "0000:ee:00.0";  // no such device
  graph_ = graph_of(facts);
  auto bad = CudaTransport::create(graph_, runtime_);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("0000:ee:00.0"), std::string::npos) << bad.error().message();
}

// Every path, both ops, sizes that leave a partial chunk, three stream
// interleavings: the bytes land exactly.
TEST_F(CudaTransportTest, CopiesAreByteExactOnEveryPathBothWays) {
  for (std::uint64_t seed : {1, 2, 3}) {
    make(seed);
    const std::size_t bytes = 5 * kChunk + 123;
    SliceId id = 1;
    for (PathId p = 0; p < transport_->paths().size(); ++p) {
      const PathInfo& info = transport_->paths()[p];
      for (Op op : {Op::kWrite, Op::kRead}) {
        Buffer local = buffer_on(info.from, bytes + 64);
        Buffer remote = buffer_on(info.to, bytes + 64);
        std::byte* src = (op == Op::kWrite ? local.data : remote.data) + 7;
        std::byte* dst = (op == Op::kWrite ? remote.data : local.data) + 7;
        fill(src, bytes, static_cast<unsigned>(id));
        std::memset(dst, 0, bytes + 1);
        SliceSubmit s{id++, p, static_cast<int>(id % 2), bytes,
                      {op, local.data + 7, reinterpret_cast<std::uint64_t>(remote.data + 7), remote.handle}};
        ASSERT_TRUE(transport_->submit(s, now_).is_ok()) << info.name();
        auto done = run(1);
        ASSERT_EQ(done.size(), 1u);
        EXPECT_TRUE(done[0].status.is_ok()) << done[0].status.message();
        EXPECT_EQ(done[0].id, s.id);
        EXPECT_EQ(done[0].bytes, bytes);
        EXPECT_EQ(std::memcmp(src, dst, bytes), 0) << info.name() << (op == Op::kWrite ? " write" : " read");
        EXPECT_EQ(std::to_integer<int>(dst[bytes]), 0) << "a byte past the slice was written";
      }
    }
    EXPECT_EQ(transport_->slices_in_flight(), 0u);
  }
}

// Staging moves chunk i host-ward before it leaves for the destination,
// reuses a bounce buffer only after its previous chunk left it, and lets the
// next chunk fill while the previous one drains.
TEST_F(CudaTransportTest, StagingPipelinesChunksThroughBoundedBounceBuffers) {
  bool overlapped = false;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    make(seed);
    const PathId path = *find_path(*transport_, "gpu0", "gpu2", PathType::kHostStaging);
    const std::size_t chunks = 6;
    Buffer src = buffer_on("gpu0", chunks * kChunk);
    Buffer dst = buffer_on("gpu2", chunks * kChunk);
    fill(src.data, chunks * kChunk, 9);
    ASSERT_TRUE(transport_
                    ->submit({1, path, 0, chunks * kChunk,
                              {Op::kWrite, src.data, reinterpret_cast<std::uint64_t>(dst.data), dst.handle}},
                             now_)
                    .is_ok());
    runtime_->drain();
    ASSERT_EQ(run(1).size(), 1u);
    EXPECT_EQ(std::memcmp(src.data, dst.data, chunks * kChunk), 0);

    // Fills run on gpu0's stream, drains on gpu2's.
    std::vector<std::size_t> fill_at(chunks), drain_at(chunks);
    std::set<const void*> bounces;
    const auto& log = runtime_->copies();
    ASSERT_EQ(log.size(), 2 * chunks);
    for (std::size_t i = 0; i < log.size(); ++i) {
      if (log[i].device == 0) {
        const std::size_t c = static_cast<std::size_t>(static_cast<const std::byte*>(log[i].src) - src.data) / kChunk;
        fill_at[c] = i;
        bounces.insert(log[i].dst);
      } else {
        const std::size_t c = static_cast<std::size_t>(static_cast<std::byte*>(log[i].dst) - dst.data) / kChunk;
        drain_at[c] = i;
        EXPECT_TRUE(bounces.contains(log[i].src));
      }
    }
    EXPECT_EQ(bounces.size(), 2u) << "two bounce buffers per lane";
    for (std::size_t c = 0; c < chunks; ++c) {
      EXPECT_LT(fill_at[c], drain_at[c]) << "chunk " << c << " drained before it was filled";
      if (c >= 2) {
        EXPECT_LT(drain_at[c - 2], fill_at[c]) << "chunk " << c << " overwrote a bounce still in use";
      }
      if (c + 1 < chunks && fill_at[c + 1] < drain_at[c]) overlapped = true;
    }
  }
  EXPECT_TRUE(overlapped) << "no interleaving let a chunk fill while the previous one drained";
}

TEST_F(CudaTransportTest, CompletionComesOnlyFromPolledEvents) {
  make();
  runtime_->steps_per_query = 0;  // nothing moves unless the test steps it
  const PathId path = *find_path(*transport_, "numa0", "gpu1", PathType::kHostStaging);
  Buffer host = buffer_on("numa0", 1 << 20);
  Buffer gpu = buffer_on("gpu1", 1 << 20);
  EXPECT_FALSE(transport_->next_event_ns().has_value());
  ASSERT_TRUE(
      transport_->submit({7, path, 1, 1 << 20, {Op::kWrite, host.data, reinterpret_cast<std::uint64_t>(gpu.data), gpu.handle}}, now_)
          .is_ok());
  std::vector<Completion> out;
  for (int i = 0; i < 10; ++i) transport_->poll(now_ += 1000, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(transport_->slices_in_flight(), 1u);
  ASSERT_TRUE(transport_->next_event_ns().has_value());
  EXPECT_EQ(*transport_->next_event_ns(), now_ + CudaConfig{}.poll_interval_ns);
  // A posted copy cannot be recalled.
  EXPECT_FALSE(transport_->cancel(7, now_).stopped);
  runtime_->drain();
  transport_->poll(now_ += 1000, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.is_ok());
  EXPECT_EQ(out[0].at_ns, now_);
  EXPECT_FALSE(transport_->next_event_ns().has_value());
}

TEST_F(CudaTransportTest, SubmitChecksEverythingBeforePostingAnything) {
  make();
  const PathId nvlink = *find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink);
  Buffer g0 = buffer_on("gpu0", 1 << 16);
  Buffer g1 = buffer_on("gpu1", 1 << 16);
  Buffer g2 = buffer_on("gpu2", 1 << 16);
  const auto at = [](const Buffer& b, std::uint64_t off = 0) { return reinterpret_cast<std::uint64_t>(b.data + off); };
  const SliceSubmit good{1, nvlink, 0, 4096, {Op::kWrite, g0.data, at(g1), g1.handle}};
  struct Case {
    std::string what;
    SliceSubmit slice;
    StatusCode code;
  };
  std::vector<Case> cases;
  auto with = [&](std::string what, StatusCode code, auto change) {
    SliceSubmit s = good;
    change(s);
    cases.push_back({std::move(what), s, code});
  };
  with("unknown path", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.path = 999; });
  with("lane past the path's", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.lane = 2; });
  with("negative lane", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.lane = -1; });
  with("zero bytes", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.bytes = 0; });
  with("compressed", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.wire_bytes = 100; });
  with("unknown op", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.memory.op = static_cast<Op>(9); });
  with("local outside any region", StatusCode::kInvalidArgument,
       [&](SliceSubmit& s) { s.memory.local = g0.data + (1 << 16) - 100; });
  with("local on the wrong GPU", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.memory.local = g2.data; });
  with("unknown remote key", StatusCode::kInvalidArgument, [&](SliceSubmit& s) { s.memory.remote_key = 4242; });
  with("remote key on the wrong GPU", StatusCode::kInvalidArgument, [&](SliceSubmit& s) {
    s.memory.remote_key = g2.handle;
    s.memory.remote_addr = at(g2);
  });
  with("remote range past its region", StatusCode::kOutOfRange,
       [&](SliceSubmit& s) { s.memory.remote_addr = at(g1, (1 << 16) - 100); });
  with("remote address before its region", StatusCode::kOutOfRange,
       [&](SliceSubmit& s) { s.memory.remote_addr = at(g1) - 8; });
  for (const Case& c : cases) {
    const Status s = transport_->submit(c.slice, now_);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.message();
    EXPECT_EQ(runtime_->pending_ops(), 0u) << c.what;
  }
  ASSERT_TRUE(transport_->submit(good, now_).is_ok());
  EXPECT_EQ(transport_->submit(good, now_).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(transport_->slices_in_flight(), 1u);
  // A region under a slice in flight stays.
  EXPECT_EQ(transport_->unregister(g1.handle).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(run(1).size(), 1u);
  EXPECT_TRUE(transport_->unregister(g1.handle).is_ok());
  EXPECT_EQ(transport_->unregister(g1.handle).code(), StatusCode::kNotFound);
}

TEST_F(CudaTransportTest, RegisterMemoryChecksThePointersRealAttributes) {
  make();
  auto* dev0 = static_cast<std::byte*>(*runtime_->alloc_device(0, 8192));
  std::vector<std::byte> host(8192);
  auto code = [&](void* p, std::size_t n, MemoryKind k, int d) {
    auto r = transport_->register_memory(p, n, k, d);
    return r ? StatusCode::kOk : r.error().code();
  };
  EXPECT_EQ(code(nullptr, 10, MemoryKind::kVram, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(dev0, 0, MemoryKind::kVram, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(reinterpret_cast<void*>(~0ULL - 10), 100, MemoryKind::kDram, -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(dev0, 8192, static_cast<MemoryKind>(7), 0), StatusCode::kInvalidArgument);
  // Host memory is not VRAM; GPU 0's memory is not GPU 1's; a range that
  // runs past the allocation is not all device memory.
  auto host_as_vram = transport_->register_memory(host.data(), 8192, MemoryKind::kVram, 0);
  ASSERT_FALSE(host_as_vram.has_value());
  EXPECT_NE(host_as_vram.error().message().find("pageable host"), std::string::npos) << host_as_vram.error().message();
  EXPECT_EQ(code(dev0, 8192, MemoryKind::kVram, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(dev0, 8193, MemoryKind::kVram, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(dev0, 8192, MemoryKind::kDram, -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(host.data(), 8192, MemoryKind::kDram, -2), StatusCode::kInvalidArgument) << "NUMA node -2";
  EXPECT_EQ(runtime_->pinned_ranges(), 0u);

  auto vram = transport_->register_memory(dev0, 8192, MemoryKind::kVram, 0);
  ASSERT_TRUE(vram.has_value()) << vram.error().message();
  EXPECT_EQ(code(dev0 + 100, 10, MemoryKind::kVram, 0), StatusCode::kInvalidArgument) << "overlap";
  // Pageable host memory is pinned for the region's life; pinned memory is left as it is.
  auto dram = transport_->register_memory(host.data(), 8192, MemoryKind::kDram, 0);
  ASSERT_TRUE(dram.has_value()) << dram.error().message();
  EXPECT_EQ(runtime_->pinned_ranges(), 1u);
  auto* pinned = *runtime_->alloc_pinned(4096);
  ASSERT_TRUE(transport_->register_memory(pinned, 4096, MemoryKind::kDram, -1).has_value());
  EXPECT_EQ(runtime_->pinned_ranges(), 1u);
  EXPECT_TRUE(transport_->unregister(*dram).is_ok());
  EXPECT_EQ(runtime_->pinned_ranges(), 0u);
  EXPECT_TRUE(transport_->unregister(*vram).is_ok());
  runtime_->free_pinned(pinned);
  runtime_->free_device(dev0);
}

TEST_F(CudaTransportTest, AFailedCopyFailsItsPathOnly) {
  make();
  runtime_->fail_copy_number = 1;
  const PathId nvlink = *find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink);
  const PathId staging = *find_path(*transport_, "gpu0", "gpu1", PathType::kHostStaging);
  Buffer g0 = buffer_on("gpu0", 1 << 16);
  Buffer g1 = buffer_on("gpu1", 1 << 16);
  const SliceSubmit s{1, nvlink, 0, 4096, {Op::kWrite, g0.data, reinterpret_cast<std::uint64_t>(g1.data), g1.handle}};
  ASSERT_TRUE(transport_->submit(s, now_).is_ok());
  auto done = run(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(transport_->path_healthy(nvlink, now_));
  EXPECT_TRUE(transport_->path_healthy(staging, now_));
  SliceSubmit again = s;
  again.id = 2;
  EXPECT_EQ(transport_->submit(again, now_).code(), StatusCode::kUnavailable);
  again.path = staging;
  ASSERT_TRUE(transport_->submit(again, now_).is_ok());
  done = run(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.is_ok());
}

TEST_F(CudaTransportTest, CreateRefusesBadConfigsAndLeavesNothingBehind) {
  runtime_ = std::make_shared<FakeCudaRuntime>(3, peers_01());
  graph_ = graph_of(three_gpus());
  for (auto change : std::vector<std::function<void(CudaConfig&)>>{
           [](CudaConfig& c) { c.lanes_per_path = 0; }, [](CudaConfig& c) { c.staging_chunk_bytes = 0; },
           [](CudaConfig& c) { c.staging_buffers = 0; }, [](CudaConfig& c) { c.poll_interval_ns = 0; }}) {
    CudaConfig c;
    change(c);
    auto t = CudaTransport::create(graph_, runtime_, c);
    ASSERT_FALSE(t.has_value());
    EXPECT_EQ(t.error().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(CudaTransport::create(graph_, nullptr).error().code(), StatusCode::kInvalidArgument);
  // Fewer CUDA devices than the topology's GPUs.
  auto two = std::make_shared<FakeCudaRuntime>(2);
  EXPECT_EQ(CudaTransport::create(graph_, two).error().code(), StatusCode::kInvalidArgument);
  // Nothing is made before a lane carries its first slice.
  auto t = CudaTransport::create(graph_, runtime_);
  ASSERT_TRUE(t.has_value()) << t.error().message();
  EXPECT_EQ(runtime_->live_streams(), 0u);
  EXPECT_EQ(runtime_->live_events(), 0u);
}

// A lane whose streams the runtime refuses fails its path at the first
// slice (nothing posted); other paths go on; what was made is released.
TEST_F(CudaTransportTest, ALaneTheRuntimeCannotMakeFailsItsPathOnly) {
  make();
  const PathId staging = *find_path(*transport_, "gpu0", "gpu2", PathType::kHostStaging);
  const PathId nvlink = *find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink);
  Buffer g0 = buffer_on("gpu0", 1 << 16);
  Buffer g1 = buffer_on("gpu1", 1 << 16);
  Buffer g2 = buffer_on("gpu2", 1 << 16);
  runtime_->stream_limit = 1;  // the staging lane needs two
  const Status s = transport_->submit(
      {1, staging, 0, 4096, {Op::kWrite, g0.data, reinterpret_cast<std::uint64_t>(g2.data), g2.handle}}, now_);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  EXPECT_FALSE(transport_->path_healthy(staging, now_));
  EXPECT_EQ(runtime_->pending_ops(), 0u);
  EXPECT_EQ(transport_->slices_in_flight(), 0u);
  runtime_->stream_limit = -1;
  ASSERT_TRUE(transport_
                  ->submit({2, nvlink, 0, 4096, {Op::kWrite, g0.data, reinterpret_cast<std::uint64_t>(g1.data), g1.handle}},
                           now_)
                  .is_ok());
  ASSERT_EQ(run(1).size(), 1u);
  transport_.reset();
  EXPECT_EQ(runtime_->live_streams(), 0u);
  EXPECT_EQ(runtime_->live_events(), 0u);
}

TEST_F(CudaTransportTest, DestroyingTheTransportReleasesStreamsEventsBuffersAndPins) {
  make();
  Buffer host = buffer_on("numa0", 1 << 16);
  Buffer g2 = buffer_on("gpu2", 1 << 16);
  const PathId path = *find_path(*transport_, "numa0", "gpu2", PathType::kHostStaging);
  ASSERT_TRUE(
      transport_->submit({1, path, 0, 1 << 16, {Op::kRead, host.data, reinterpret_cast<std::uint64_t>(g2.data), g2.handle}}, now_)
          .is_ok());
  ASSERT_EQ(run(1).size(), 1u);
  EXPECT_GT(runtime_->live_streams(), 0u);
  EXPECT_EQ(runtime_->pinned_ranges(), 1u);
  transport_.reset();
  EXPECT_EQ(runtime_->live_streams(), 0u);
  EXPECT_EQ(runtime_->live_events(), 0u);
  EXPECT_EQ(runtime_->pinned_ranges(), 0u);
}

// The scheduler drives the CUDA transport as any other: a request between
// two GPUs is sliced, posted on the topology's best path and lands whole.
TEST_F(CudaTransportTest, TheSchedulerMovesARequestBetweenGpus) {
  make(5);
  auto scheduler = sched::Scheduler::create(graph_, sched::SchedPolicy::defaults(), *transport_);
  ASSERT_TRUE(scheduler.has_value()) << scheduler.error().message();
  const std::size_t bytes = 3 << 20;
  Buffer g0 = buffer_on("gpu0", bytes);
  Buffer g1 = buffer_on("gpu1", bytes);
  fill(g0.data, bytes, 3);
  sched::TransferRequest r;
  r.from = "gpu0";
  r.to = "gpu1";
  r.bytes = bytes;
  r.op = Op::kWrite;
  r.local = g0.data;
  r.remote_key = g1.handle;
  r.remote_addr = reinterpret_cast<std::uint64_t>(g1.data);
  ASSERT_TRUE((*scheduler)->submit(1, r, now_).is_ok());
  std::vector<Completion> out;
  for (int i = 0; i < 100'000; ++i) {
    (*scheduler)->dispatch(now_);
    out.clear();
    transport_->poll(now_ += 1000, out);
    for (const Completion& c : out) (void)(*scheduler)->on_completion(c, now_);
    if ((*scheduler)->status(1)->state == sched::RequestState::kCompleted) break;
  }
  auto status = (*scheduler)->status(1);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->state, sched::RequestState::kCompleted) << status->status.message();
  EXPECT_EQ(status->bytes_done, bytes);
  EXPECT_EQ(std::memcmp(g0.data, g1.data, bytes), 0);
  EXPECT_GT((*scheduler)->load(*find_path(*transport_, "gpu0", "gpu1", PathType::kNvlink)).bytes_completed, 0u)
      << "the NVLink path carries it";
}

TEST(CudaRuntime, SaysWhyWhenThereIsNoGpu) {
  auto rt = cuda_runtime();
  if (rt.has_value()) GTEST_SKIP() << "a CUDA device is present: cuda_gpu_test covers it";
  EXPECT_EQ(rt.error().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(rt.error().message().empty());
}

}  // namespace
}  // namespace baton::transport
