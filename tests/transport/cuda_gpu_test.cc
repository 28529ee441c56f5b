// The CUDA transport on real GPUs: every path of this machine's probed
// topology moves bytes exactly, registration checks real pointers, and the
// suite leaves device memory as it found it. Skipped, saying why, where the
// CUDA runtime finds no device (a build without CUDA, no driver, no GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "baton/topology/probe.h"
#include "baton/transport/cuda_transport.h"

namespace baton::transport {
namespace {

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto rt = cuda_runtime();
    if (!rt) GTEST_SKIP() << "no GPU here: " << rt.error().message();
    runtime_ = *rt;
    auto facts = topology::probe_machine();
    ASSERT_TRUE(facts.has_value()) << facts.error().message();
    auto graph = topology::TopologyGraph::build(*facts);
    ASSERT_TRUE(graph.has_value()) << graph.error().message();
    graph_ = *graph;
    // A first round warms the driver up: it keeps device memory taken at a
    // process's first copies (2 MiB on an H200) for the context's life. The
    // check in TearDown then holds every later transport to before = after.
    every_path_moves_bytes_exactly();
    if (HasFatalFailure()) return;
    for (int d = 0; d < runtime_->device_count(); ++d) used_before_.push_back(*runtime_->device_memory_used(d));
  }
  void TearDown() override {
    if (used_before_.empty()) return;  // skipped, or the warm-up failed
    for (int d = 0; d < runtime_->device_count(); ++d) {
      EXPECT_EQ(*runtime_->device_memory_used(d), used_before_[static_cast<std::size_t>(d)]) << "GPU " << d;
    }
  }
  // Every path of a fresh transport, both ways, byte-exact.
  void every_path_moves_bytes_exactly() {
    auto t = CudaTransport::create(graph_, runtime_);
    ASSERT_TRUE(t.has_value()) << t.error().message();
    CudaTransport& transport = **t;
    ASSERT_FALSE(transport.paths().empty()) << "the probe found no GPU path";
    const std::size_t bytes = (9 << 20) + 4097;  // staging chunks and a partial one
    std::vector<std::byte> pattern(bytes), back(bytes);
    for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<std::byte>((i * 2654435761u) >> 13);

    struct Side {
      std::byte* data = nullptr;
      RegionHandle handle = 0;
      bool device = false;
      std::vector<std::byte> host;
    };
    auto make_side = [&](const std::string& node) {
      Side s;
      if (auto device = transport.device_of(node)) {
        s.device = true;
        s.data = static_cast<std::byte*>(*runtime_->alloc_device(*device, bytes));
        s.handle = *transport.register_memory(s.data, bytes, MemoryKind::kVram, *device);
      } else {
        s.host.resize(bytes);
        s.data = s.host.data();
        s.handle = *transport.register_memory(s.data, bytes, MemoryKind::kDram, -1);
      }
      return s;
    };
    // Copies through a scratch stream-less path: the runtime's synchronous
    // view of a side (cudaMemcpy via copy_async + synchronize on a stream).
    auto stream = runtime_->create_stream(0);
    ASSERT_TRUE(stream.has_value());
    auto put = [&](Side& s, const std::vector<std::byte>& from) {
      ASSERT_TRUE(runtime_->copy_async(s.data, from.data(), bytes, *stream).is_ok());
      ASSERT_TRUE(runtime_->synchronize(*stream).is_ok());
    };
    auto get = [&](Side& s, std::vector<std::byte>& to) {
      ASSERT_TRUE(runtime_->copy_async(to.data(), s.data, bytes, *stream).is_ok());
      ASSERT_TRUE(runtime_->synchronize(*stream).is_ok());
    };

    SliceId id = 1;
    TimeNs now = 1;
    for (PathId p = 0; p < transport.paths().size(); ++p) {
      const PathInfo& info = transport.paths()[p];
      for (Op op : {Op::kWrite, Op::kRead}) {
        Side local = make_side(info.from);
        Side remote = make_side(info.to);
        Side& src = op == Op::kWrite ? local : remote;
        Side& dst = op == Op::kWrite ? remote : local;
        put(src, pattern);
        put(dst, std::vector<std::byte>(bytes));
        ASSERT_TRUE(transport
                        .submit({id++, p, 0, bytes,
                                 {op, local.data, reinterpret_cast<std::uint64_t>(remote.data), remote.handle}},
                                now)
                        .is_ok());
        std::vector<Completion> out;
        for (int i = 0; i < 10'000'000 && out.empty(); ++i) transport.poll(++now, out);
        ASSERT_EQ(out.size(), 1u) << info.name();
        EXPECT_TRUE(out[0].status.is_ok()) << info.name() << ": " << out[0].status.message();
        get(dst, back);
        EXPECT_EQ(std::memcmp(back.data(), pattern.data(), bytes), 0) << info.name();
        for (Side* s : {&local, &remote}) {
          EXPECT_TRUE(transport.unregister(s->handle).is_ok());
          if (s->device) runtime_->free_device(s->data);
        }
      }
    }
    runtime_->destroy_stream(*stream);
  }

  std::shared_ptr<CudaRuntime> runtime_;
  topology::TopologyGraph graph_;
  std::vector<std::uint64_t> used_before_;
};

TEST_F(CudaGpuTest, EveryPathMovesBytesExactlyBothWays) { every_path_moves_bytes_exactly(); }

TEST_F(CudaGpuTest, RegisterMemoryChecksRealPointers) {
  auto t = CudaTransport::create(graph_, runtime_);
  ASSERT_TRUE(t.has_value()) << t.error().message();
  auto* dev = *runtime_->alloc_device(0, 1 << 20);
  std::vector<std::byte> host(1 << 20);
  EXPECT_EQ((*t)->register_memory(host.data(), host.size(), MemoryKind::kVram, 0).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*t)->register_memory(dev, 1 << 20, MemoryKind::kDram, -1).error().code(), StatusCode::kInvalidArgument);
  if (runtime_->device_count() > 1) {
    EXPECT_EQ((*t)->register_memory(dev, 1 << 20, MemoryKind::kVram, 1).error().code(), StatusCode::kInvalidArgument);
  }
  auto ok = (*t)->register_memory(dev, 1 << 20, MemoryKind::kVram, 0);
  ASSERT_TRUE(ok.has_value()) << ok.error().message();
  auto pinned = (*t)->register_memory(host.data(), host.size(), MemoryKind::kDram, -1);
  ASSERT_TRUE(pinned.has_value()) << pinned.error().message();
  EXPECT_EQ(runtime_->pointer(host.data())->type, CudaMemoryType::kPinnedHost);
  EXPECT_TRUE((*t)->unregister(*pinned).is_ok());
  EXPECT_EQ(runtime_->pointer(host.data())->type, CudaMemoryType::kUnregistered);
  EXPECT_TRUE((*t)->unregister(*ok).is_ok());
  runtime_->free_device(dev);
}

}  // namespace
}  // namespace baton::transport
