// The store's client against a store that answers wrongly: a real gRPC
// server on loopback speaking store.proto, backed by a real engine whose
// region the client could write, that hands out more (or fewer) pages than
// the blocks asked for. The client must refuse before writing anything.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "baton/store/service.h"
#include "store.grpc.pb.h"

namespace baton::store {
namespace {

const BlockLayout kLayout{.slots = 2, .segments = 2, .segment_bytes = 4096};

// Hello and AllocateBlocks as a store would answer them, except that each
// allocation returns `count + extra` pages (extra may be negative); Seal is
// counted and refused.
class WrongPageCountStore final : public wire::Store::Service {
 public:
  WrongPageCountStore(std::string engine_address, engine::Region region, int extra)
      : engine_address_(std::move(engine_address)), region_(region), extra_(extra) {}

  grpc::Status Hello(grpc::ServerContext*, const wire::HelloRequest*, wire::HelloReply* reply) override {
    reply->set_engine_address(engine_address_);
    wire::Namespace* ns = reply->add_namespaces();
    ns->set_name("llama");
    ns->mutable_layout()->set_slots(kLayout.slots);
    ns->mutable_layout()->set_segments(kLayout.segments);
    ns->mutable_layout()->set_segment_bytes(kLayout.segment_bytes);
    return grpc::Status::OK;
  }
  grpc::Status AllocateBlocks(grpc::ServerContext*, const wire::AllocateBlocksRequest* request,
                              wire::AllocateBlocksReply* reply) override {
    const auto pages = static_cast<std::int64_t>(request->count()) + extra_;
    for (std::int64_t p = 0; p < pages; ++p) {
      wire::BlockPage* page = reply->add_pages();
      const std::uint64_t offset = static_cast<std::uint64_t>(p) * kLayout.block_bytes();
      page->set_page(static_cast<std::uint64_t>(p) + 1);
      page->set_region(static_cast<std::uint32_t>(region_.handle));
      page->set_offset(offset);
      page->set_address(region_.base + offset);
    }
    return grpc::Status::OK;
  }
  grpc::Status Seal(grpc::ServerContext*, const wire::SealRequest*, wire::SealReply*) override {
    ++seals;
    return {grpc::StatusCode::FAILED_PRECONDITION, "not this store"};
  }
  std::atomic<int> seals{0};

 private:
  std::string engine_address_;
  engine::Region region_;
  int extra_;
};

std::unique_ptr<engine::Engine> make_engine() {
  auto e = engine::Engine::create({});
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

TEST(HostileStore, APageCountOtherThanTheBlocksIsRefusedBeforeAnythingIsWritten) {
  for (const int extra : {1, -1}) {
    SCOPED_TRACE(extra);
    auto holder = make_engine();
    ASSERT_NE(holder, nullptr);
    constexpr std::uint64_t kPages = 8;
    auto pages = holder->allocate_memory(kPages * kLayout.block_bytes());
    ASSERT_TRUE(pages.has_value()) << pages.error().to_string();
    ASSERT_TRUE(holder->export_region(pages->handle).is_ok());
    std::memset(reinterpret_cast<void*>(pages->base), 0, pages->length);

    WrongPageCountStore service(holder->address(), *pages, extra);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    ASSERT_GT(port, 0);

    auto client = StoreClient::connect("127.0.0.1:" + std::to_string(port));
    ASSERT_TRUE(client.has_value()) << client.error().to_string();
    auto producer = make_engine();
    ASSERT_NE(producer, nullptr);
    std::vector<std::byte> kv(4 * kLayout.block_bytes());
    engine::fill_pattern(kv, 7);
    auto mine = producer->register_memory(kv.data(), kv.size());
    ASSERT_TRUE(mine.has_value()) << mine.error().to_string();

    const std::vector<std::uint64_t> hashes{0x10, 0x11, 0x12};
    const Status put = (*client)->put(*producer, "llama", "p", hashes, kLayout, mine->handle);
    EXPECT_EQ(put.code(), StatusCode::kUnavailable) << put.to_string();
    EXPECT_NE(put.message().find(fmt::format("answered {} pages for 3 blocks", 3 + extra)), std::string::npos)
        << put.message();
    EXPECT_EQ(service.seals.load(), 0);
    const std::span<const std::byte> held(reinterpret_cast<const std::byte*>(pages->base), pages->length);
    EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](std::byte b) { return b == std::byte{0}; }))
        << "a page was written";
    server->Shutdown();
  }
}

}  // namespace
}  // namespace baton::store
