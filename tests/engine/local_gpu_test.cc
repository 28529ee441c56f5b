// Requests with no peer: bytes between this engine's own regions over the
// host's GPU paths (the CUDA transport over the topology, under the same
// admission and scheduler as UCX's paths). The topology is the `pcie4`
// model and the CUDA runtime the scripted one (its "device memory" is host
// memory it tracks), so this runs without a GPU; the bytes land only if
// every CUDA copy ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "engine/run_batch.h"
#include "transport/fake_cuda_runtime.h"

namespace baton::engine {
namespace {

using transport::testing::FakeCudaRuntime;

constexpr TimeNs kSecond = 1'000'000'000;
constexpr std::size_t kBytes = 3 << 20;

using testing::run_batch;

Request between(Op op, const Region& local, const Region& other, std::uint64_t length = kBytes) {
  Request r;
  r.op = op;
  r.local_region = local.handle;
  r.remote_region = other.handle;  // no peer: one of this engine's regions
  r.length = length;
  return r;
}

// The scripted runtime with four GPUs, each pair with peer access.
std::shared_ptr<FakeCudaRuntime> four_gpus() {
  return std::make_shared<FakeCudaRuntime>(4, std::vector<std::vector<bool>>(4, std::vector<bool>(4, true)));
}

// An engine with GPU paths over `cuda` on the `pcie4` model.
EngineConfig with_gpu_paths(std::shared_ptr<transport::CudaRuntime> cuda) {
  EngineConfig config;
  config.cuda = std::move(cuda);
  config.topology_model = "pcie4";
  config.gpu_paths = true;
  return config;
}

// One engine over four_gpus().
struct LocalGpus {
  std::shared_ptr<FakeCudaRuntime> gpu = four_gpus();
  std::unique_ptr<Engine> engine;
  std::vector<void*> vram;

  LocalGpus() {
    auto e = Engine::create(with_gpu_paths(gpu));
    EXPECT_TRUE(e.has_value()) << e.error().to_string();
    if (e) engine = std::move(*e);
  }
  ~LocalGpus() {
    engine.reset();  // its streams go before the memory they copy
    for (void* p : vram) gpu->free_device(p);
  }
  Region on_gpu(int device) {
    vram.push_back(*gpu->alloc_device(device, kBytes));
    auto r = engine->register_memory(vram.back(), kBytes, MemoryKind::kVram, device);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : Region{};
  }
  Region on_host(std::vector<std::byte>& memory) {
    auto r = engine->register_memory(memory.data(), memory.size());
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : Region{};
  }
  std::span<std::byte> bytes(const Region& r) const { return {reinterpret_cast<std::byte*>(r.base), r.length}; }
};

TEST(LocalGpuPaths, HostToGpuGpuToGpuAndBackByteExact) {
  LocalGpus g;
  ASSERT_NE(g.engine, nullptr);
  std::vector<std::byte> source(kBytes), back(kBytes);
  fill_pattern(source, 21);
  const Region host = g.on_host(source);
  const Region host_back = g.on_host(back);
  const Region d0 = g.on_gpu(0);
  const Region d2 = g.on_gpu(2);

  ASSERT_TRUE(run_batch(*g.engine, Batch{{between(Op::kWrite, host, d0)}, {}}).is_ok()) << "host -> gpu0";
  EXPECT_EQ(std::memcmp(g.bytes(d0).data(), source.data(), kBytes), 0);
  const std::size_t after_h2d = g.gpu->copies().size();
  EXPECT_GT(after_h2d, 0u) << "the CUDA runtime copied it";

  // gpu0 -> gpu2 in two requests, the second a read from gpu2's side.
  Batch split;
  split.requests.push_back(between(Op::kWrite, d0, d2, kBytes / 2));
  Request rest = between(Op::kRead, d2, d0, kBytes - kBytes / 2);
  rest.local_offset = rest.remote_offset = kBytes / 2;
  split.requests.push_back(rest);
  ASSERT_TRUE(run_batch(*g.engine, split).is_ok()) << "gpu0 -> gpu2";
  EXPECT_EQ(std::memcmp(g.bytes(d2).data(), source.data(), kBytes), 0);

  // By the topology's ranking: gpu0 and gpu2 sit on different sockets
  // (host staging through pinned buffers), gpu0 and gpu1 share a PCIe
  // switch (one peer copy from one GPU's memory into the other's).
  auto direct_copies = [&](const Region& from, const Region& to) {
    int n = 0;
    for (const auto& c : g.gpu->copies()) {
      const auto src = reinterpret_cast<std::uint64_t>(c.src);
      const auto dst = reinterpret_cast<std::uint64_t>(c.dst);
      n += src >= from.base && src < from.base + from.length && dst >= to.base && dst < to.base + to.length;
    }
    return n;
  };
  EXPECT_EQ(direct_copies(d0, d2), 0) << "gpu0 -> gpu2 is staged";
  const Region d1 = g.on_gpu(1);
  ASSERT_TRUE(run_batch(*g.engine, Batch{{between(Op::kWrite, d0, d1)}, {}}).is_ok()) << "gpu0 -> gpu1";
  EXPECT_EQ(std::memcmp(g.bytes(d1).data(), source.data(), kBytes), 0);
  EXPECT_GT(direct_copies(d0, d1), 0) << "gpu0 -> gpu1 is a peer copy";
  EXPECT_TRUE(g.engine->unregister(d1.handle).is_ok());

  ASSERT_TRUE(run_batch(*g.engine, Batch{{between(Op::kRead, host_back, d2)}, {}}).is_ok()) << "gpu2 -> host";
  EXPECT_EQ(back, source);
  bool gpu2_copied = false;
  for (const auto& c : g.gpu->copies()) gpu2_copied = gpu2_copied || c.device == 2;
  EXPECT_TRUE(gpu2_copied) << "gpu2's copies carried its bytes";

  // The regions are free once their requests ended; unregistering unpins.
  for (const Region& r : {host, host_back, d0, d2}) EXPECT_TRUE(g.engine->unregister(r.handle).is_ok());
  EXPECT_EQ(g.gpu->pinned_ranges(), 0u) << "host memory pinned for the GPUs is unpinned with its region";
}

// The GPU paths come first among the engine's paths and UCX's after them:
// one batch mixes a peer's reads (into host and, staged, into GPU memory)
// with a request between the engine's own regions, and every byte lands.
TEST(LocalGpuPaths, PeersPathsAndTheGpuPathsShareOneBatch) {
  LocalGpus g;
  ASSERT_NE(g.engine, nullptr);
  auto holder = Engine::create(EngineConfig{});
  ASSERT_TRUE(holder.has_value()) << holder.error().to_string();
  auto held = (*holder)->allocate_memory(kBytes);
  ASSERT_TRUE(held.has_value());
  fill_pattern(std::span(reinterpret_cast<std::byte*>(held->base), kBytes), 33);
  ASSERT_TRUE((*holder)->export_region(held->handle).is_ok());
  auto peer = g.engine->connect((*holder)->address());
  ASSERT_TRUE(peer.has_value()) << peer.error().to_string();

  std::vector<std::byte> source(kBytes), from_peer(kBytes);
  fill_pattern(source, 34);
  const Region host = g.on_host(source);
  const Region host_peer = g.on_host(from_peer);
  const Region d0 = g.on_gpu(0);
  const Region d1 = g.on_gpu(1);
  auto from_holder = [&](const Region& into) {
    Request r;
    r.op = Op::kRead;
    r.local_region = into.handle;
    r.peer = peer->address;
    r.remote_region = held->handle;
    r.length = kBytes;
    return r;
  };
  Batch mixed{{from_holder(host_peer), from_holder(d0), between(Op::kWrite, host, d1)}, {}};
  const Status s = run_batch(*g.engine, mixed);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::vector<std::byte> expected(kBytes);
  fill_pattern(expected, 33);
  EXPECT_EQ(from_peer, expected) << "over UCX";
  EXPECT_EQ(std::memcmp(g.bytes(d0).data(), expected.data(), kBytes), 0) << "over UCX, staged into GPU memory";
  EXPECT_EQ(std::memcmp(g.bytes(d1).data(), source.data(), kBytes), 0) << "over the GPU paths";
  g.engine->shutdown();
  EXPECT_EQ(g.gpu->pinned_ranges(), 0u) << "shutdown unpinned what the GPU paths pinned";
}

// The scripted runtime behind a mutex, so the test may hold its copies
// back (steps_per_query 0) and let them go while the loop queries it.
class LockedCuda final : public transport::CudaRuntime {
 public:
  explicit LockedCuda(std::shared_ptr<FakeCudaRuntime> fake) : fake_(std::move(fake)) {}
  void set_steps_per_query(int n) {
    std::lock_guard lock(mutex_);
    fake_->steps_per_query = n;
  }
  template <typename F>
  auto locked(F f) const {
    std::lock_guard lock(mutex_);
    return f(*fake_);
  }
  int device_count() const override { return locked([](auto& f) { return f.device_count(); }); }
  std::string pci_bus_id(int d) const override { return locked([&](auto& f) { return f.pci_bus_id(d); }); }
  bool can_access_peer(int d, int p) const override { return locked([&](auto& f) { return f.can_access_peer(d, p); }); }
  Status enable_peer_access(int d, int p) override { return locked([&](auto& f) { return f.enable_peer_access(d, p); }); }
  Result<transport::CudaStream> create_stream(int d) override { return locked([&](auto& f) { return f.create_stream(d); }); }
  void destroy_stream(transport::CudaStream s) override { locked([&](auto& f) { f.destroy_stream(s); return 0; }); }
  Result<transport::CudaEvent> create_event(int d) override { return locked([&](auto& f) { return f.create_event(d); }); }
  void destroy_event(transport::CudaEvent e) override { locked([&](auto& f) { f.destroy_event(e); return 0; }); }
  Status copy_async(void* dst, const void* src, std::size_t n, transport::CudaStream s) override {
    return locked([&](auto& f) { return f.copy_async(dst, src, n, s); });
  }
  Status copy_peer_async(void* dst, int dd, const void* src, int sd, std::size_t n, transport::CudaStream s) override {
    return locked([&](auto& f) { return f.copy_peer_async(dst, dd, src, sd, n, s); });
  }
  Status record(transport::CudaEvent e, transport::CudaStream s) override { return locked([&](auto& f) { return f.record(e, s); }); }
  Status wait(transport::CudaStream s, transport::CudaEvent e) override { return locked([&](auto& f) { return f.wait(s, e); }); }
  Result<bool> query(transport::CudaEvent e) override { return locked([&](auto& f) { return f.query(e); }); }
  Status synchronize(transport::CudaStream s) override { return locked([&](auto& f) { return f.synchronize(s); }); }
  Result<void*> alloc_pinned(std::size_t n) override { return locked([&](auto& f) { return f.alloc_pinned(n); }); }
  void free_pinned(void* p) override { locked([&](auto& f) { f.free_pinned(p); return 0; }); }
  Result<void*> alloc_device(int d, std::size_t n) override { return locked([&](auto& f) { return f.alloc_device(d, n); }); }
  void free_device(void* p) override { locked([&](auto& f) { f.free_device(p); return 0; }); }
  Status register_host(void* p, std::size_t n) override { return locked([&](auto& f) { return f.register_host(p, n); }); }
  void unregister_host(void* p) override { locked([&](auto& f) { f.unregister_host(p); return 0; }); }
  Result<transport::CudaPointer> pointer(const void* p) const override { return locked([&](auto& f) { return f.pointer(p); }); }
  Result<std::uint64_t> device_memory_used(int d) const override {
    return locked([&](auto& f) { return f.device_memory_used(d); });
  }

 private:
  std::shared_ptr<FakeCudaRuntime> fake_;
  mutable std::mutex mutex_;
};

// A CUDA copy cannot be recalled: a request past its timeout ends only once
// its copies did, and its regions stay registered until then.
TEST(LocalGpuPaths, ARequestPastItsTimeoutEndsOnceItsCopiesDid) {
  auto cuda = std::make_shared<LockedCuda>(four_gpus());
  auto e = Engine::create(with_gpu_paths(cuda));
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  Engine& engine = **e;
  std::vector<std::byte> source(kBytes);
  fill_pattern(source, 55);
  void* vram = *cuda->alloc_device(0, kBytes);
  {
    auto host = engine.register_memory(source.data(), kBytes);
    auto d0 = engine.register_memory(vram, kBytes, MemoryKind::kVram, 0);
    ASSERT_TRUE(host.has_value() && d0.has_value());
    cuda->set_steps_per_query(0);  // the copies do not run
    Request r = between(Op::kWrite, *host, *d0);
    r.timeout_ns = 50'000'000;
    auto h = engine.submit(Batch{{r}, {}});
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    EXPECT_EQ(engine.wait(*h, 300'000'000).code(), StatusCode::kTimeout) << "past its timeout, its copies still run";
    EXPECT_FALSE(engine.poll(*h)->done);
    EXPECT_EQ(engine.unregister(d0->handle).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(engine.unregister(host->handle).code(), StatusCode::kFailedPrecondition);
    cuda->set_steps_per_query(1);
    ASSERT_TRUE(engine.wait(*h, 5 * kSecond).is_ok());
    EXPECT_EQ(engine.poll(*h)->status.code(), StatusCode::kTimeout);
    EXPECT_TRUE(engine.release(*h).is_ok());
    EXPECT_TRUE(engine.unregister(d0->handle).is_ok());
    EXPECT_TRUE(engine.unregister(host->handle).is_ok());
  }
  e->reset();
  cuda->free_device(vram);
}

TEST(LocalGpuPaths, BadRequestsWithNoPeerAreRefused) {
  LocalGpus g;
  ASSERT_NE(g.engine, nullptr);
  std::vector<std::byte> a(kBytes), b(kBytes);
  auto ha = g.engine->register_memory(a.data(), kBytes);
  auto hb = g.engine->register_memory(b.data(), kBytes);
  ASSERT_TRUE(ha.has_value() && hb.has_value());
  const Region d1 = g.on_gpu(1);
  const Region d1b = g.on_gpu(1);
  auto code = [&](const Batch& batch) {
    auto h = g.engine->submit(batch);
    if (h) (void)g.engine->wait(*h, kSecond), (void)g.engine->release(*h);
    return h ? StatusCode::kOk : h.error().code();
  };
  Request unknown = between(Op::kWrite, *ha, d1);
  unknown.remote_region = 999'999;
  EXPECT_EQ(code(Batch{{unknown}, {}}), StatusCode::kNotFound);
  EXPECT_EQ(code(Batch{{between(Op::kWrite, *ha, *hb)}, {}}), StatusCode::kInvalidArgument) << "host to host";
  EXPECT_EQ(code(Batch{{between(Op::kWrite, d1, d1b)}, {}}), StatusCode::kInvalidArgument) << "within one GPU";
  Request beyond = between(Op::kWrite, *ha, d1, 4096);
  beyond.remote_offset = kBytes - 100;
  EXPECT_EQ(code(Batch{{beyond}, {}}), StatusCode::kOutOfRange);
  EXPECT_EQ(code(Batch{{between(Op::kWrite, *ha, d1)}, "done"}), StatusCode::kInvalidArgument)
      << "a notification with no peer to tell";
  EXPECT_TRUE(g.gpu->copies().empty()) << "nothing refused was copied";
}

// This machine's own GPUs and topology probe (skipped without a GPU): host
// -> GPU 0 -> (GPU 1 where there is one) -> host, byte-exact.
TEST(LocalGpuPaths, OnARealGpuHostToGpuAndBackByteExact) {
  auto rt = transport::cuda_runtime();
  if (!rt) GTEST_SKIP() << "no GPU here: " << rt.error().message();
  EngineConfig config;
  config.gpu_paths = true;
  auto e = Engine::create(config);
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  const int gpus = std::min((*rt)->device_count(), 2);
  std::vector<void*> vram;
  {
    std::vector<std::byte> source(kBytes), back(kBytes);
    fill_pattern(source, 5);
    auto host = (*e)->register_memory(source.data(), kBytes);
    auto host_back = (*e)->register_memory(back.data(), kBytes);
    ASSERT_TRUE(host.has_value() && host_back.has_value());
    std::vector<Region> on_gpu;
    for (int d = 0; d < gpus; ++d) {
      vram.push_back(*(*rt)->alloc_device(d, kBytes));
      auto r = (*e)->register_memory(vram.back(), kBytes, MemoryKind::kVram, d);
      ASSERT_TRUE(r.has_value()) << r.error().to_string();
      on_gpu.push_back(*r);
    }
    Status s = run_batch(**e, Batch{{between(Op::kWrite, *host, on_gpu[0])}, {}});
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    if (gpus == 2) {
      s = run_batch(**e, Batch{{between(Op::kWrite, on_gpu[0], on_gpu[1])}, {}});
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    s = run_batch(**e, Batch{{between(Op::kRead, *host_back, on_gpu.back())}, {}});
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(back, source);
    for (const Region& r : on_gpu) EXPECT_TRUE((*e)->unregister(r.handle).is_ok());
    EXPECT_TRUE((*e)->unregister(host->handle).is_ok());
    EXPECT_TRUE((*e)->unregister(host_back->handle).is_ok());
  }
  e->reset();
  for (void* p : vram) (*rt)->free_device(p);
}

// Asked for where they cannot be, GPU paths fail the engine's creation;
// not asked for, a request with no peer is refused.
TEST(LocalGpuPaths, WithoutGpuPathsARequestWithNoPeerIsRefused) {
  // Four GPUs in the topology, two that the runtime has.
  EngineConfig no_gpu = with_gpu_paths(std::make_shared<FakeCudaRuntime>(2));
  auto refused = Engine::create(no_gpu);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("gpu_paths"), std::string::npos) << refused.error().message();
  if (!transport::cuda_runtime().has_value()) {
    no_gpu.topology_model.clear();  // this machine's probe
    no_gpu.cuda = nullptr;
    auto none = Engine::create(no_gpu);
    ASSERT_FALSE(none.has_value());
    EXPECT_NE(none.error().message().find("gpu_paths"), std::string::npos) << none.error().message();
  }

  auto e = Engine::create(EngineConfig{});
  ASSERT_TRUE(e.has_value());
  std::vector<std::byte> a(4096), b(4096);
  auto ha = (*e)->register_memory(a.data(), a.size());
  auto hb = (*e)->register_memory(b.data(), b.size());
  ASSERT_TRUE(ha.has_value() && hb.has_value());
  auto h = (*e)->submit(Batch{{between(Op::kWrite, *ha, *hb, 4096)}, {}});
  ASSERT_FALSE(h.has_value());
  EXPECT_EQ(h.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(h.error().message().find("gpu_paths is off"), std::string::npos) << h.error().message();
}

}  // namespace
}  // namespace baton::engine
