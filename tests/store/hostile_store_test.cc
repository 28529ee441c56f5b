// The store's client against a store that answers wrongly: a real gRPC
// server on loopback speaking store.proto, backed by a real engine, that
// hands out more (or fewer) pages than the blocks asked for, or answers a
// query with a plan for other blocks than those asked. The client must
// refuse: before writing anything, and without handing back wrong KV.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "baton/store/block_store.h"
#include "baton/store/service.h"
#include "baton/store.grpc.pb.h"

namespace baton::store {
namespace {

const BlockLayout kLayout{.slots = 2, .segments = 2, .segment_bytes = 4096};

void to_wire(const BlockLayout& layout, wire::BlockLayout* out) {
  out->set_slots(layout.slots);
  out->set_segments(layout.segments);
  out->set_segment_bytes(layout.segment_bytes);
}

// `service` on an ephemeral loopback port, and a client of it.
struct Serving {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<StoreClient> client;
  Serving() = default;
  Serving(Serving&&) = default;
  ~Serving() {
    if (server) server->Shutdown();
  }
};
Serving serve(grpc::Service& service) {
  Serving s;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  s.server = builder.BuildAndStart();
  EXPECT_NE(s.server, nullptr);
  EXPECT_GT(port, 0);
  if (!s.server || port <= 0) return s;
  auto client = StoreClient::connect("127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(client.has_value()) << client.error().to_string();
  if (client) s.client = std::move(*client);
  return s;
}

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
    to_wire(kLayout, ns->mutable_layout());
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
    Serving served = serve(service);
    ASSERT_NE(served.client, nullptr);
    auto producer = make_engine();
    ASSERT_NE(producer, nullptr);
    std::vector<std::byte> kv(4 * kLayout.block_bytes());
    engine::fill_pattern(kv, 7);
    auto mine = producer->register_memory(kv.data(), kv.size());
    ASSERT_TRUE(mine.has_value()) << mine.error().to_string();

    const std::vector<std::uint64_t> hashes{0x10, 0x11, 0x12};
    const Status put = served.client->put(*producer, "llama", "p", hashes, kLayout, mine->handle);
    EXPECT_EQ(put.code(), StatusCode::kUnavailable) << put.to_string();
    EXPECT_NE(put.message().find(fmt::format("answered {} pages for 3 blocks", 3 + extra)), std::string::npos)
        << put.message();
    EXPECT_EQ(service.seals.load(), 0);
    const std::span<const std::byte> held(reinterpret_cast<const std::byte*>(pages->base), pages->length);
    EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](std::byte b) { return b == std::byte{0}; }))
        << "a page was written";
  }
}

// A store in front of a real one that passes every call on, except that it
// asks the real store for the hashes in reverse order, or says it found one
// block more than it did: a confused store's answer to a query.
class LyingProxy final : public wire::Store::Service {
 public:
  enum class Lie { kReversed, kOneMore };
  LyingProxy(StoreClient& real, Lie lie) : real_(real), lie_(lie) {}

  grpc::Status Hello(grpc::ServerContext*, const wire::HelloRequest*, wire::HelloReply* reply) override {
    auto h = real_.hello();
    if (!h) return {grpc::StatusCode::UNAVAILABLE, h.error().message()};
    reply->set_engine_address(h->first);
    for (const NamespaceInfo& n : h->second) {
      wire::Namespace* ns = reply->add_namespaces();
      ns->set_name(n.name);
      to_wire(n.layout, ns->mutable_layout());
    }
    return grpc::Status::OK;
  }
  grpc::Status QueryBlocksForTransfer(grpc::ServerContext*, const wire::QueryBlocksForTransferRequest* request,
                                      wire::QueryBlocksForTransferReply* reply) override {
    std::vector<std::uint64_t> hashes(request->hashes().begin(), request->hashes().end());
    if (lie_ == Lie::kReversed) std::ranges::reverse(hashes);
    auto a = real_.query(request->namespace_(), hashes, request->requester());
    if (!a) return {grpc::StatusCode::UNAVAILABLE, a.error().message()};
    reply->set_found(a->found + (lie_ == Lie::kOneMore ? 1 : 0));
    reply->set_plan(a->plan);
    reply->set_session(a->session);
    return grpc::Status::OK;
  }
  grpc::Status ReleaseTransferLock(grpc::ServerContext*, const wire::ReleaseTransferLockRequest* request,
                                   wire::ReleaseTransferLockReply*) override {
    ++releases;
    const Status s = real_.release(request->session());
    return s.is_ok() ? grpc::Status::OK : grpc::Status{grpc::StatusCode::NOT_FOUND, s.message()};
  }
  std::atomic<int> releases{0};

 private:
  StoreClient& real_;
  Lie lie_;
};

TEST(HostileStore, APlanForOtherBlocksThanAskedIsRefusedAndItsLockReleased) {
  auto holder = make_engine();
  ASSERT_NE(holder, nullptr);
  // Before the clients: their slab caches hold regions of its (it must outlive them).
  auto requester = make_engine();
  ASSERT_NE(requester, nullptr);
  auto store = BlockStore::create(*holder);
  ASSERT_TRUE(store.has_value()) << store.error().to_string();
  ASSERT_TRUE((*store)->add_namespace({"llama", kLayout, 16, {0}}).is_ok());
  auto served = StoreServer::start(**store, *holder);
  ASSERT_TRUE(served.has_value()) << served.error().to_string();
  auto real = StoreClient::connect((*served)->address());
  ASSERT_TRUE(real.has_value());

  // Three blocks, each its own pattern, put through the real store.
  auto producer = make_engine();
  ASSERT_NE(producer, nullptr);
  std::vector<std::byte> kv(3 * kLayout.block_bytes());
  for (std::uint64_t b = 0; b < 3; ++b) {
    engine::fill_pattern(std::span(kv).subspan(b * kLayout.block_bytes(), kLayout.block_bytes()), 40 + b);
  }
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  const std::vector<std::uint64_t> hashes{0x20, 0x21, 0x22};
  ASSERT_TRUE((*real)->put(*producer, "llama", "p", hashes, kLayout, mine->handle).is_ok());

  // Through the real store the blocks come back as asked.
  auto honest = (*real)->fetch(*requester, "llama", hashes, "d");
  ASSERT_TRUE(honest.has_value()) << honest.error().to_string();
  ASSERT_EQ(honest->found, 3u);
  for (std::uint32_t b = 0; b < 3; ++b) {
    const std::span<const std::byte> k(honest->blocks->view(b, 0, 0), kLayout.segment_bytes);
    EXPECT_FALSE(engine::pattern_mismatch(k, 40 + b).has_value()) << b;
  }
  honest = {};

  for (const auto& [lie, says] : {std::pair{LyingProxy::Lie::kReversed, "for other blocks"},
                                  std::pair{LyingProxy::Lie::kOneMore, "found 4 of 3"}}) {
    SCOPED_TRACE(says);
    LyingProxy proxy(**real, lie);
    Serving served = serve(proxy);
    ASSERT_NE(served.client, nullptr);
    auto fetched = served.client->fetch(*requester, "llama", hashes, "d");
    ASSERT_FALSE(fetched.has_value()) << "blocks handed back for the wrong hashes";
    EXPECT_EQ(fetched.error().code(), StatusCode::kUnavailable) << fetched.error().to_string();
    EXPECT_NE(fetched.error().message().find(says), std::string::npos) << fetched.error().message();
    EXPECT_EQ(proxy.releases.load(), 1) << "the lock it took is given back";
    auto stats = (*real)->stats();
    ASSERT_TRUE(stats.has_value());
    EXPECT_EQ(stats->sessions, 0u);
    EXPECT_EQ(stats->locked_blocks, 0u);
  }
}

// A client of the published proto that is not Baton's: a call over the
// block bound is refused by the server itself before the store allocates.
// Only StoreClient checked: one AllocateBlocks of a million pages from a raw
// client evicted every sealed block, held the pages unsealed for a minute,
// and its 25 MB answer could not be sent (an audit).
TEST(HostileClient, CallsOverTheBlockBoundAreRefusedByTheServer) {
  auto holder = make_engine();
  ASSERT_NE(holder, nullptr);
  auto store = BlockStore::create(*holder);
  ASSERT_TRUE(store.has_value()) << store.error().to_string();
  ASSERT_TRUE((*store)->add_namespace({"llama", kLayout, 16, {0}}).is_ok());
  auto served = StoreServer::start(**store, *holder);
  ASSERT_TRUE(served.has_value()) << served.error().to_string();
  auto stub = wire::Store::NewStub(grpc::CreateChannel((*served)->address(), grpc::InsecureChannelCredentials()));
  const StoreStats before = (*store)->stats();
  auto refused = [](const grpc::Status& st, const char* call) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << call << ": " << st.error_message();
    EXPECT_NE(st.error_message().find("at most 65536"), std::string::npos) << call << ": " << st.error_message();
  };
  {
    wire::AllocateBlocksRequest r;
    r.set_namespace_("llama");
    r.set_count(1'000'000);
    r.set_producer("p");
    grpc::ClientContext context;
    wire::AllocateBlocksReply reply;
    refused(stub->AllocateBlocks(&context, r, &reply), "AllocateBlocks");
    EXPECT_EQ(reply.pages_size(), 0);
  }
  {
    wire::SealRequest r;
    r.set_namespace_("llama");
    r.set_producer("p");
    to_wire(kLayout, r.mutable_layout());
    for (std::uint64_t i = 0; i < 70'000; ++i) r.add_hashes(i + 1);
    grpc::ClientContext context;
    wire::SealReply reply;
    refused(stub->Seal(&context, r, &reply), "Seal");
  }
  {
    wire::QueryBlocksForTransferRequest r;
    r.set_namespace_("llama");
    r.set_requester("d");
    for (std::uint64_t i = 0; i < 70'000; ++i) r.add_hashes(i + 1);
    grpc::ClientContext context;
    wire::QueryBlocksForTransferReply reply;
    refused(stub->QueryBlocksForTransfer(&context, r, &reply), "QueryBlocksForTransfer");
  }
  const StoreStats after = (*store)->stats();
  EXPECT_EQ(after.free_pages, before.free_pages);
  EXPECT_EQ(after.unsealed, before.unsealed);
  EXPECT_EQ(after.sessions, 0u);
  EXPECT_EQ(after.hashes_asked, before.hashes_asked);
}

}  // namespace
}  // namespace baton::store
