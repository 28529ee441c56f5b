// GPU memory in the engine: VRAM regions checked against the CUDA runtime,
// and their transfers staged through pinned host memory onto the UCX
// datapath, between two wall-clock engines in one process. The CUDA runtime
// is the scripted one (its "device memory" is host memory it tracks), so
// this runs without a GPU; the bytes land only if every staging copy ran.
#include <gtest/gtest.h>

#include <cstring>
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

std::unique_ptr<Engine> make_engine(std::shared_ptr<transport::CudaRuntime> cuda = nullptr, int progress_threads = 0) {
  EngineConfig config;
  config.cuda = std::move(cuda);
  config.ucx.progress_threads = progress_threads;
  auto e = Engine::create(config);
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

using testing::run_batch;

struct VramPair {
  std::shared_ptr<FakeCudaRuntime> gpu = std::make_shared<FakeCudaRuntime>(2);
  std::unique_ptr<Engine> holder = make_engine();
  std::unique_ptr<Engine> initiator = make_engine(gpu);
  Region held;
  Peer peer;
  std::byte* vram = nullptr;  // "device memory" of GPU 1

  VramPair() {
    held = *holder->allocate_memory(kBytes);
    EXPECT_TRUE(holder->export_region(held.handle).is_ok());
    vram = static_cast<std::byte*>(*gpu->alloc_device(1, kBytes));
    auto p = initiator->connect(holder->address());
    EXPECT_TRUE(p.has_value()) << p.error().to_string();
    if (p) peer = *p;
  }
  ~VramPair() {
    initiator.reset();  // its staging streams go before the memory they copy
    gpu->free_device(vram);
  }
  std::span<std::byte> held_bytes() const { return {reinterpret_cast<std::byte*>(held.base), kBytes}; }
  Status run(Op op, RegionHandle local, std::uint64_t length) {
    Request r;
    r.op = op;
    r.local_region = local;
    r.peer = peer.address;
    r.remote_region = held.handle;
    r.length = length;
    return run_batch(*initiator, Batch{{r}, {}});
  }
};

TEST(VramStaging, ReadsIntoAndWritesFromGpuMemoryByteExact) {
  VramPair p;
  auto region = p.initiator->register_memory(p.vram, kBytes, MemoryKind::kVram, 1);
  ASSERT_TRUE(region.has_value()) << region.error().to_string();
  EXPECT_EQ(region->kind, MemoryKind::kVram);
  EXPECT_EQ(region->device, 1);

  fill_pattern(p.held_bytes(), 7);
  std::memset(p.vram, 0, kBytes);
  ASSERT_TRUE(p.run(Op::kRead, region->handle, kBytes).is_ok());
  std::vector<std::byte> expected(kBytes);
  fill_pattern(expected, 7);
  EXPECT_EQ(std::memcmp(p.vram, expected.data(), kBytes), 0) << "the read did not land in GPU memory";
  const std::size_t copies_after_read = p.gpu->copies().size();
  EXPECT_GT(copies_after_read, 0u) << "no host -> GPU copy ran";

  fill_pattern(std::span(p.vram, kBytes), 9);
  ASSERT_TRUE(p.run(Op::kWrite, region->handle, kBytes).is_ok());
  fill_pattern(expected, 9);
  EXPECT_EQ(std::memcmp(p.held_bytes().data(), expected.data(), kBytes), 0) << "the write did not reach the peer";
  EXPECT_GT(p.gpu->copies().size(), copies_after_read) << "no GPU -> host copy ran";
  // Every staging copy went through the runtime: GPU 1's stream, from or into the region.
  for (const auto& c : p.gpu->copies()) EXPECT_EQ(c.device, 1);

  EXPECT_TRUE(p.initiator->unregister(region->handle).is_ok());
  EXPECT_EQ(p.initiator->unregister(region->handle).code(), StatusCode::kNotFound);
}

TEST(VramStaging, RegistrationIsChecked) {
  VramPair p;
  std::vector<std::byte> host(1 << 20);
  auto code = [&](void* ptr, std::size_t n, int device) {
    auto r = p.initiator->register_memory(ptr, n, MemoryKind::kVram, device);
    return r ? StatusCode::kOk : r.error().code();
  };
  // Host memory is not GPU memory; GPU 1's memory is not GPU 0's; the
  // range must not run past the allocation.
  auto host_as_vram = p.initiator->register_memory(host.data(), host.size(), MemoryKind::kVram, 0);
  ASSERT_FALSE(host_as_vram.has_value());
  EXPECT_EQ(host_as_vram.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(host_as_vram.error().message().find("pageable host"), std::string::npos) << host_as_vram.error().message();
  EXPECT_EQ(code(p.vram, kBytes, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p.vram, kBytes + 1, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(nullptr, 10, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p.vram, 0, 1), StatusCode::kInvalidArgument);
  auto region = p.initiator->register_memory(p.vram, kBytes, MemoryKind::kVram, 1);
  ASSERT_TRUE(region.has_value()) << region.error().to_string();
  EXPECT_EQ(code(p.vram + 4096, 4096, 1), StatusCode::kInvalidArgument) << "overlap";
  EXPECT_EQ(p.initiator->register_memory(p.vram + 4096, 4096, MemoryKind::kDram).error().code(),
            StatusCode::kInvalidArgument)
      << "a VRAM range registered again as DRAM";
  EXPECT_EQ(p.initiator->register_memory(host.data(), 10, static_cast<MemoryKind>(5)).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p.vram, 4096, 7), StatusCode::kInvalidArgument) << "a GPU the runtime does not have";
  // A range outside the VRAM region is refused before anything moves.
  Request r;
  r.op = Op::kRead;
  r.local_region = region->handle;
  r.local_offset = kBytes - 10;
  r.peer = p.peer.address;
  r.remote_region = p.held.handle;
  r.length = 100;
  EXPECT_EQ(p.initiator->submit(Batch{{r}, {}}).error().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(p.gpu->copies().empty());
}

// A peer's GPU memory: the holder exports a VRAM region, and its engine
// answers each of the initiator's slices with a CUDA copy between the GPU
// and the message (staged on the holder's side). Both engines are in this
// process, so they are same-host peers: the bytes would land by a direct
// copy too (the scripted GPU memory is host memory), but only the
// holder's copies may carry them.
struct HeldVram {
  std::shared_ptr<FakeCudaRuntime> gpu = std::make_shared<FakeCudaRuntime>(1);
  std::unique_ptr<Engine> holder;
  std::unique_ptr<Engine> initiator;
  std::byte* vram = nullptr;
  Region held;
  Peer peer;

  explicit HeldVram(std::shared_ptr<transport::CudaRuntime> initiator_gpu = nullptr, int progress_threads = 0)
      : holder(make_engine(gpu, progress_threads)), initiator(make_engine(std::move(initiator_gpu), progress_threads)) {
    vram = static_cast<std::byte*>(*gpu->alloc_device(0, kBytes));
    auto r = holder->register_memory(vram, kBytes, MemoryKind::kVram, 0);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    if (r) held = *r;
    EXPECT_TRUE(holder->export_region(held.handle).is_ok());
    auto p = initiator->connect(holder->address());
    EXPECT_TRUE(p.has_value()) << p.error().to_string();
    if (p) peer = *p;
  }
  ~HeldVram() {
    initiator.reset();
    holder.reset();  // its serving streams go before the memory they copy
    gpu->free_device(vram);
  }
  // Requests of `length` bytes from `offset` on, read or written between
  // `local` and the held VRAM, in one batch.
  Status run(Op op, RegionHandle local, std::uint64_t offset, std::uint64_t length, std::uint64_t pieces = 1) {
    Batch batch;
    for (std::uint64_t i = 0; i < pieces; ++i) {
      Request r;
      r.op = op;
      r.local_region = local;
      r.local_offset = offset + i * (length / pieces);
      r.peer = peer.address;
      r.remote_region = held.handle;
      r.remote_offset = r.local_offset;
      r.length = i + 1 == pieces ? length - i * (length / pieces) : length / pieces;
      batch.requests.push_back(r);
    }
    return run_batch(*initiator, batch);
  }
  // Bytes the holder's GPU copies moved (they run only when it answers).
  std::uint64_t served_bytes() const {
    std::uint64_t n = 0;
    for (const auto& c : gpu->copies()) n += c.bytes;
    return n;
  }
};

TEST(VramStaging, APeersGpuMemoryIsReadAndWrittenThroughTheHoldersCopies) {
  HeldVram p;
  std::vector<std::byte> host(kBytes);
  auto local = p.initiator->register_memory(host.data(), kBytes);
  ASSERT_TRUE(local.has_value());
  auto seen = p.initiator->remote_regions(p.peer);
  ASSERT_TRUE(seen.has_value());
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ((*seen)[0].key, p.held.handle);
  EXPECT_TRUE((*seen)[0].staged);

  // Writes (the whole region in 5 requests, then a few bytes at an odd
  // offset), then reads back into zeroed host memory.
  std::vector<std::byte> expected(kBytes);
  fill_pattern(expected, 11);
  std::memcpy(host.data(), expected.data(), kBytes);
  std::memset(p.vram, 0, kBytes);
  ASSERT_TRUE(p.run(Op::kWrite, local->handle, 0, kBytes, 5).is_ok());
  EXPECT_EQ(p.served_bytes(), kBytes);
  EXPECT_EQ(std::memcmp(p.vram, expected.data(), kBytes), 0);
  host[1001] = std::byte{0x5a};
  expected[1001] = std::byte{0x5a};
  ASSERT_TRUE(p.run(Op::kWrite, local->handle, 1001, 3).is_ok());
  std::memset(host.data(), 0, kBytes);
  ASSERT_TRUE(p.run(Op::kRead, local->handle, 0, kBytes, 3).is_ok());
  EXPECT_EQ(std::memcmp(host.data(), expected.data(), kBytes), 0);
  EXPECT_EQ(p.served_bytes(), 2 * kBytes + 3);

  // Unregistered while the peer knows it: revoked, then gone for the peer.
  ASSERT_TRUE(p.holder->unregister(p.held.handle).is_ok());
  ASSERT_TRUE(p.initiator->refresh(p.peer).is_ok());
  EXPECT_TRUE(p.initiator->remote_regions(p.peer)->empty());
  EXPECT_EQ(p.run(Op::kRead, local->handle, 0, 64).code(), StatusCode::kNotFound);
}

// The same with a progress thread per rail on both engines (the default
// from 8 cores): the holder's answers run under the transport's hold, so
// serving must not call back into it (its first read once deadlocked).
TEST(VramStaging, APeersGpuMemoryIsServedWithProgressThreads) {
  HeldVram p(nullptr, 1);
  std::vector<std::byte> host(kBytes), expected(kBytes);
  auto local = p.initiator->register_memory(host.data(), kBytes);
  ASSERT_TRUE(local.has_value());
  fill_pattern(expected, 13);
  std::memcpy(p.vram, expected.data(), kBytes);
  ASSERT_TRUE(p.run(Op::kRead, local->handle, 0, kBytes, 4).is_ok());
  EXPECT_EQ(host, expected);
  fill_pattern(host, 14);
  ASSERT_TRUE(p.run(Op::kWrite, local->handle, 0, kBytes, 4).is_ok());
  EXPECT_EQ(std::memcmp(p.vram, host.data(), kBytes), 0);
  EXPECT_EQ(p.served_bytes(), 2 * kBytes);
}

// GPU to GPU across two engines: staged on both sides (a bounce here, a
// copy in the holder's answer).
TEST(VramStaging, GpuMemoryIsReadFromAndWrittenToAPeersGpuMemory) {
  auto mine = std::make_shared<FakeCudaRuntime>(1, std::vector<std::vector<bool>>{}, 7);
  HeldVram p(mine);
  auto* vram = static_cast<std::byte*>(*mine->alloc_device(0, kBytes));
  {
    auto local = p.initiator->register_memory(vram, kBytes, MemoryKind::kVram, 0);
    ASSERT_TRUE(local.has_value()) << local.error().to_string();
    std::vector<std::byte> expected(kBytes);
    fill_pattern(expected, 21);
    std::memcpy(p.vram, expected.data(), kBytes);
    std::memset(vram, 0, kBytes);
    ASSERT_TRUE(p.run(Op::kRead, local->handle, 0, kBytes, 2).is_ok());
    EXPECT_EQ(std::memcmp(vram, expected.data(), kBytes), 0);
    fill_pattern(expected, 22);
    std::memcpy(vram, expected.data(), kBytes);
    ASSERT_TRUE(p.run(Op::kWrite, local->handle, 0, kBytes, 2).is_ok());
    EXPECT_EQ(std::memcmp(p.vram, expected.data(), kBytes), 0);
    EXPECT_EQ(p.served_bytes(), 2 * kBytes);
    EXPECT_GE(mine->copies().size(), 2u) << "the initiator's bounce copies";
  }
  p.initiator.reset();
  mine->free_device(vram);
}

// A copy that fails on the holder fails that slice with its reason (it is
// answered as refused, not left waiting); the scheduler sends it again,
// and the answer to that comes from a fresh stream.
TEST(VramStaging, AHoldersFailedGpuCopyFailsItsSliceWhichIsSentAgain) {
  HeldVram p;
  std::vector<std::byte> host(kBytes);
  auto local = p.initiator->register_memory(host.data(), kBytes);
  ASSERT_TRUE(local.has_value());
  fill_pattern(host, 31);
  std::memset(p.vram, 0, kBytes);
  const auto retried = p.initiator->stats().slices_retried;
  p.gpu->fail_copy_number = 1;  // the first copy the holder enqueues fails
  ASSERT_TRUE(p.run(Op::kWrite, local->handle, 0, 4096).is_ok());
  EXPECT_EQ(p.initiator->stats().slices_retried, retried + 1);
  EXPECT_EQ(std::memcmp(p.vram, host.data(), 4096), 0);
  ASSERT_TRUE(p.run(Op::kWrite, local->handle, 0, kBytes).is_ok());
  EXPECT_EQ(std::memcmp(p.vram, host.data(), kBytes), 0);
  // The same for a read: its copy out of the GPU fails, and is sent again.
  p.gpu->fail_copy_number = p.gpu->copies_enqueued() + 1;  // the holder's loop is idle now
  std::vector<std::byte> back(kBytes);
  auto into = p.initiator->register_memory(back.data(), kBytes);
  ASSERT_TRUE(into.has_value());
  ASSERT_TRUE(p.run(Op::kRead, into->handle, 0, kBytes).is_ok());
  EXPECT_GT(p.initiator->stats().slices_retried, retried + 1);
  EXPECT_EQ(back, host);
}

// The same on a real GPU, where one is: the runtime's own memory and copies.
TEST(VramStaging, OnARealGpuReadsAndWritesByteExact) {
  auto rt = transport::cuda_runtime();
  if (!rt) GTEST_SKIP() << "no GPU here: " << rt.error().message();
  auto holder = make_engine();
  auto initiator = make_engine();
  Region held = *holder->allocate_memory(kBytes);
  ASSERT_TRUE(holder->export_region(held.handle).is_ok());
  auto peer = initiator->connect(holder->address());
  ASSERT_TRUE(peer.has_value()) << peer.error().to_string();
  auto* vram = static_cast<std::byte*>(*(*rt)->alloc_device(0, kBytes));
  auto stream = *(*rt)->create_stream(0);
  {
    auto region = initiator->register_memory(vram, kBytes, MemoryKind::kVram, -1);
    ASSERT_TRUE(region.has_value()) << region.error().to_string();
    EXPECT_EQ(region->device, 0);
    std::span<std::byte> held_bytes(reinterpret_cast<std::byte*>(held.base), kBytes);
    std::vector<std::byte> expected(kBytes), back(kBytes);
    for (Op op : {Op::kRead, Op::kWrite}) {
      fill_pattern(expected, op == Op::kRead ? 3 : 4);
      if (op == Op::kRead) {
        std::memcpy(held_bytes.data(), expected.data(), kBytes);
      } else {
        ASSERT_TRUE((*rt)->copy_async(vram, expected.data(), kBytes, stream).is_ok());
        ASSERT_TRUE((*rt)->synchronize(stream).is_ok());
      }
      Request r;
      r.op = op;
      r.local_region = region->handle;
      r.peer = peer->address;
      r.remote_region = held.handle;
      r.length = kBytes;
      auto h = initiator->submit(Batch{{r}, {}});
      ASSERT_TRUE(h.has_value()) << h.error().to_string();
      ASSERT_TRUE(initiator->wait(*h, 30 * kSecond).is_ok());
      EXPECT_TRUE(initiator->poll(*h)->status.is_ok()) << initiator->poll(*h)->status.to_string();
      if (op == Op::kRead) {
        ASSERT_TRUE((*rt)->copy_async(back.data(), vram, kBytes, stream).is_ok());
        ASSERT_TRUE((*rt)->synchronize(stream).is_ok());
      } else {
        std::memcpy(back.data(), held_bytes.data(), kBytes);
      }
      EXPECT_EQ(std::memcmp(back.data(), expected.data(), kBytes), 0) << (op == Op::kRead ? "read" : "write");
    }
    EXPECT_TRUE(initiator->unregister(region->handle).is_ok());
  }
  initiator.reset();
  (*rt)->destroy_stream(stream);
  (*rt)->free_device(vram);
}

// A peer's GPU memory on a real GPU, where one is: the holder's answers
// are real CUDA copies between its GPU and the messages.
TEST(VramStaging, OnARealGpuAPeersGpuMemoryIsServedByteExact) {
  auto rt = transport::cuda_runtime();
  if (!rt) GTEST_SKIP() << "no GPU here: " << rt.error().message();
  auto holder = make_engine();
  auto initiator = make_engine();
  auto* vram = static_cast<std::byte*>(*(*rt)->alloc_device(0, kBytes));
  auto stream = *(*rt)->create_stream(0);
  {
    auto held = holder->register_memory(vram, kBytes, MemoryKind::kVram, 0);
    ASSERT_TRUE(held.has_value()) << held.error().to_string();
    ASSERT_TRUE(holder->export_region(held->handle).is_ok());
    auto peer = initiator->connect(holder->address());
    ASSERT_TRUE(peer.has_value()) << peer.error().to_string();
    std::vector<std::byte> host(kBytes), expected(kBytes), back(kBytes);
    auto local = initiator->register_memory(host.data(), kBytes);
    ASSERT_TRUE(local.has_value());
    fill_pattern(expected, 41);
    host = expected;
    for (Op op : {Op::kWrite, Op::kRead}) {
      if (op == Op::kRead) std::fill(host.begin(), host.end(), std::byte{0});
      Request r;
      r.op = op;
      r.local_region = local->handle;
      r.peer = peer->address;
      r.remote_region = held->handle;
      r.length = kBytes;
      auto h = initiator->submit(Batch{{r}, {}});
      ASSERT_TRUE(h.has_value()) << h.error().to_string();
      ASSERT_TRUE(initiator->wait(*h, 30 * kSecond).is_ok());
      EXPECT_TRUE(initiator->poll(*h)->status.is_ok()) << initiator->poll(*h)->status.to_string();
      (void)initiator->release(*h);
    }
    EXPECT_EQ(host, expected) << "read back through the holder's GPU copies";
    ASSERT_TRUE((*rt)->copy_async(back.data(), vram, kBytes, stream).is_ok());
    ASSERT_TRUE((*rt)->synchronize(stream).is_ok());
    EXPECT_EQ(back, expected) << "the GPU holds what was written";
    EXPECT_TRUE(holder->unregister(held->handle).is_ok());
  }
  initiator.reset();
  holder.reset();
  (*rt)->destroy_stream(stream);
  (*rt)->free_device(vram);
}

TEST(VramStaging, WithoutACudaDeviceVramIsUnavailable) {
  if (transport::cuda_runtime().has_value()) GTEST_SKIP() << "a GPU is present";
  auto e = make_engine();
  std::vector<std::byte> buffer(4096);
  auto r = e->register_memory(buffer.data(), buffer.size(), MemoryKind::kVram, 0);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.error().message().find("CUDA"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace baton::engine
