// The store over gRPC on loopback, with real engines on both sides: a
// producer allocates pages by RPC, writes them with its engine and seals
// them; a requester queries, reads the plan's chunks with its engine, checks
// every byte and releases. Bad input through every RPC gets its Status back.
#include "baton/store/service.h"

#include <gtest/gtest.h>

#include "baton/engine/pattern.h"
#include "baton/plan/wire.h"
#include "engine/metric_value.h"

namespace baton::store {
namespace {

constexpr TimeNs kSecond = 1'000'000'000;
const BlockLayout kLayout{.slots = 8, .segments = 2, .segment_bytes = 4096};

std::unique_ptr<engine::Engine> make_engine() {
  auto e = engine::Engine::create({});
  EXPECT_TRUE(e.has_value()) << e.error().to_string();
  return e ? std::move(*e) : nullptr;
}

struct Served {
  std::unique_ptr<engine::Engine> engine = make_engine();
  std::unique_ptr<BlockStore> store;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<StoreClient> client;

  Served() {
    store = std::move(*BlockStore::create(*engine));
    EXPECT_TRUE(store->add_namespace({"llama", kLayout, 32, {0}}).is_ok());
    auto s = StoreServer::start(*store, *engine);
    EXPECT_TRUE(s.has_value()) << s.error().to_string();
    server = std::move(*s);
    client = std::move(*StoreClient::connect(server->address()));
  }
};

// Reads every chunk of `plan` from the store into `local` (its bytes in
// chunk order), with `engine` connected to the store's engine.
Status read_chunks(engine::Engine& engine, const engine::Peer& peer, const plan::Plan& plan, engine::Region local) {
  auto regions = engine.remote_regions(peer);
  if (!regions) return regions.error();
  engine::Batch batch;
  std::uint64_t at = 0;
  for (const plan::Chunk& c : plan.chunks) {
    auto in = locate(*regions, c.base, c.length);
    if (!in) return in.error();
    batch.requests.push_back({.op = engine::Op::kRead, .local_region = local.handle, .local_offset = at,
                              .peer = peer.address, .remote_region = in->region, .remote_offset = in->offset,
                              .length = c.length});
    at += c.length;
  }
  auto h = engine.submit(batch);
  if (!h) return h.error();
  Status s = engine.wait(*h, 10 * kSecond);
  (void)engine.release(*h);
  return s;
}

// `count` blocks of kLayout, block b filled with pattern salt `salt + b`.
std::vector<std::byte> kv_blocks(std::uint64_t count, std::uint64_t salt) {
  std::vector<std::byte> kv(count * kLayout.block_bytes());
  for (std::uint64_t b = 0; b < count; ++b) {
    engine::fill_pattern(std::span(kv).subspan(b * kLayout.block_bytes(), kLayout.block_bytes()), salt + b);
  }
  return kv;
}

// Every (block, slot, segment) view of `fetched` holds what kv_blocks(count, salt) wrote there.
void expect_blocks(const FetchedBlocks& fetched, std::uint32_t count, std::uint64_t salt) {
  ASSERT_TRUE(fetched.blocks.has_value());
  for (std::uint32_t b = 0; b < count; ++b) {
    for (std::uint32_t s = 0; s < kLayout.slots; ++s) {
      for (std::uint32_t g = 0; g < kLayout.segments; ++g) {
        const std::uint64_t at = (std::uint64_t{s} * kLayout.segments + g) * kLayout.segment_bytes;
        const std::span<const std::byte> view(fetched.blocks->view(b, s, g), kLayout.segment_bytes);
        EXPECT_FALSE(engine::pattern_mismatch(view, salt + b, at).has_value()) << b << " " << s << " " << g;
      }
    }
  }
}

TEST(StoreService, PutOverRpcAndTheEngineThenFetchThroughThePlanByteExact) {
  Served served;
  auto hello = served.client->hello();
  ASSERT_TRUE(hello.has_value()) << hello.error().to_string();
  EXPECT_EQ(hello->first, served.engine->address());
  ASSERT_EQ(hello->second.size(), 1u);
  EXPECT_EQ(hello->second[0].name, "llama");
  EXPECT_EQ(hello->second[0].layout, kLayout);

  // The producer: 6 blocks, each filled with its own pattern.
  auto producer = make_engine();
  std::vector<std::byte> kv = kv_blocks(6, 100);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  auto store_peer = producer->connect(hello->first);
  ASSERT_TRUE(store_peer.has_value()) << store_peer.error().to_string();
  auto pages = served.client->allocate_blocks("llama", 6, "prefill-0");
  ASSERT_TRUE(pages.has_value()) << pages.error().to_string();
  engine::Batch writes;
  std::vector<std::uint64_t> ids, hashes;
  for (std::uint64_t b = 0; b < 6; ++b) {
    const BlockPage& p = (*pages)[b];
    writes.requests.push_back({.op = engine::Op::kWrite, .local_region = mine->handle,
                               .local_offset = b * kLayout.block_bytes(), .peer = store_peer->address,
                               .remote_region = p.region, .remote_offset = p.offset,
                               .length = kLayout.block_bytes()});
    ids.push_back(p.page);
    hashes.push_back(0xabc000 + b);
  }
  ASSERT_TRUE(producer->refresh(*store_peer).is_ok());
  auto h = producer->submit(writes);
  ASSERT_TRUE(h.has_value()) << h.error().to_string();
  ASSERT_TRUE(producer->wait(*h, 10 * kSecond).is_ok());
  ASSERT_TRUE(served.client->seal("llama", "prefill-0", ids, hashes, kLayout).is_ok());

  // The requester: blocks 0..3 of the 6 and one the store never saw.
  auto requester = make_engine();
  const std::vector<std::uint64_t> asked{0xabc000, 0xabc001, 0xabc002, 0xabc003, 0xdead};
  auto answer = served.client->query("llama", asked, "decode-0");
  ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  EXPECT_EQ(answer->found, 4u);
  auto plan = plan::parse_plan(answer->plan);
  ASSERT_TRUE(plan.has_value()) << plan.error().to_string();
  std::vector<std::byte> fetched(4 * kLayout.block_bytes());
  auto local = requester->register_memory(fetched.data(), fetched.size());
  ASSERT_TRUE(local.has_value());
  auto peer = requester->connect(hello->first);
  ASSERT_TRUE(peer.has_value());
  ASSERT_TRUE(read_chunks(*requester, *peer, *plan, *local).is_ok());
  ASSERT_TRUE(served.client->release(answer->session).is_ok());
  // The pages were allocated lowest first, so the chunk is the 4 blocks in order.
  ASSERT_EQ(plan->chunks.size(), 1u);
  for (std::uint64_t b = 0; b < 4; ++b) {
    EXPECT_FALSE(engine::pattern_mismatch(
                     std::span(fetched).subspan(b * kLayout.block_bytes(), kLayout.block_bytes()), 100 + b)
                     .has_value())
        << "block " << b;
  }
  EXPECT_EQ(served.store->stats().sessions, 0u);
}

// The requester path in one call: query, materialize, read, rebuild,
// release — every view byte-exact, and the lock released on every path.
TEST(StoreService, FetchBringsTheFoundPrefixRebuiltAndReleasesTheLock) {
  Served served;
  auto producer = make_engine();
  std::vector<std::byte> kv = kv_blocks(5, 200);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  auto hello = served.client->hello();
  ASSERT_TRUE(hello.has_value());
  auto store_peer = producer->connect(hello->first);
  ASSERT_TRUE(store_peer.has_value());
  // Two puts, so the blocks are not one run: pages 0..2, then 3..4 after a
  // page another producer holds.
  std::vector<std::uint64_t> ids;
  for (auto [first, count] : {std::pair{0u, 3u}, std::pair{3u, 2u}}) {
    if (first == 3) {
      ASSERT_TRUE(served.client->allocate_blocks("llama", 1, "other").has_value());
    }
    auto pages = served.client->allocate_blocks("llama", count, "prefill-0");
    ASSERT_TRUE(pages.has_value());
    engine::Batch writes;
    for (std::uint32_t i = 0; i < count; ++i) {
      writes.requests.push_back({.op = engine::Op::kWrite, .local_region = mine->handle,
                                 .local_offset = (first + i) * kLayout.block_bytes(), .peer = store_peer->address,
                                 .remote_region = (*pages)[i].region, .remote_offset = (*pages)[i].offset,
                                 .length = kLayout.block_bytes()});
      ids.push_back((*pages)[i].page);
    }
    ASSERT_TRUE(producer->refresh(*store_peer).is_ok());
    auto h = producer->submit(writes);
    ASSERT_TRUE(h.has_value()) << h.error().to_string();
    ASSERT_TRUE(producer->wait(*h, 10 * kSecond).is_ok());
  }
  const std::vector<std::uint64_t> hashes{50, 51, 52, 53, 54};
  ASSERT_TRUE(served.client->seal("llama", "prefill-0", ids, hashes, kLayout).is_ok());

  auto requester = make_engine();
  const std::vector<std::uint64_t> asked{50, 51, 52, 53, 54, 77};
  auto fetched = served.client->fetch(*requester, "llama", asked, "decode-0");
  ASSERT_TRUE(fetched.has_value()) << fetched.error().to_string();
  EXPECT_EQ(fetched->found, 5u);
  EXPECT_EQ(fetched->bytes, 5 * kLayout.block_bytes());
  expect_blocks(*fetched, 5, 200);
  EXPECT_EQ(served.store->stats().sessions, 0u) << "released after the reads";
  auto remote = served.client->stats();
  ASSERT_TRUE(remote.has_value());
  EXPECT_EQ(remote->blocks, 5u);
  EXPECT_EQ(remote->sessions, 0u);
  EXPECT_EQ(remote->hashes_found, 5u);

  // Nothing found: no lock taken, nothing read.
  auto none = served.client->fetch(*requester, "llama", std::vector<std::uint64_t>{99}, "decode-0");
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->found, 0u);
  EXPECT_FALSE(none->blocks.has_value());
  // An error after the query (options materialize refuses) still releases.
  FetchOptions bad;
  bad.materialize.max_op_bytes = 0;
  auto failed = served.client->fetch(*requester, "llama", hashes, "decode-0", bad);
  ASSERT_FALSE(failed.has_value());
  EXPECT_EQ(failed.error().code(), StatusCode::kInvalidArgument) << failed.error().to_string();
  EXPECT_EQ(served.store->stats().sessions, 0u) << "the lock went back on the error path";
  EXPECT_EQ(served.client->fetch(*requester, "nope", hashes, "d").error().code(), StatusCode::kNotFound);

  // A second fetch reuses the first one's registered slabs: same addresses.
  std::byte* first_view = fetched->blocks->view(0, 0, 0);
  fetched = std::unexpected(Status::cancelled("dropped"));  // its slabs go back to the client
  auto again = served.client->fetch(*requester, "llama", hashes, "decode-0");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->blocks->view(0, 0, 0), first_view);
  // The engine must outlive the client's registrations.
  served.client.reset();
}

TEST(StoreService, LocateFindsTheRegionHoldingAWholeRangeOrSaysNone) {
  const std::vector<transport::RemoteRegion> regions{{7, 0x1000, 0x1000}, {9, 0x4000, 0x100}};
  EXPECT_EQ(locate(regions, 0x1800, 0x800)->region, 7u);
  EXPECT_EQ(locate(regions, 0x1800, 0x800)->offset, 0x800u);
  EXPECT_EQ(locate(regions, 0x4000, 0x100)->region, 9u);
  EXPECT_EQ(locate(regions, 0x1800, 0x801).error().code(), StatusCode::kNotFound) << "runs past the region";
  EXPECT_EQ(locate(regions, 0x3000, 1).error().code(), StatusCode::kNotFound) << "between regions";
  EXPECT_EQ(locate(regions, ~0ull - 2, 16).error().code(), StatusCode::kNotFound) << "wraps around";
}

TEST(StoreService, EveryRpcAnswersBadInputWithItsStatus) {
  Served served;
  StoreClient& c = *served.client;
  const std::vector<std::uint64_t> one{1}, twice{1, 1};
  EXPECT_EQ(c.allocate_blocks("nope", 1, "p").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.allocate_blocks("llama", 0, "p").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.allocate_blocks("llama", 1, "").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.allocate_blocks("llama", 1000, "p").error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.query("nope", one, "d").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.query("llama", {}, "d").error().code(), StatusCode::kInvalidArgument);
  auto dup = c.query("llama", twice, "d");
  EXPECT_EQ(dup.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.error().message().find("twice"), std::string::npos) << dup.error().message();
  EXPECT_EQ(c.release(42).code(), StatusCode::kNotFound);
  auto pages = c.allocate_blocks("llama", 1, "p");
  ASSERT_TRUE(pages.has_value());
  const std::vector<std::uint64_t> page{(*pages)[0].page};
  BlockLayout other = kLayout;
  other.slots = 4;
  EXPECT_EQ(c.seal("llama", "p", page, one, other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.seal("llama", "q", page, one, kLayout).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.seal("llama", "p", page, twice, kLayout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.seal("llama", "p", page, one, BlockLayout{}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.seal("llama", "p", page, one, kLayout).is_ok());
  EXPECT_EQ(c.query("llama", one, "d")->found, 1u);
}

// The producer path in one call: allocate, write, seal; and what it refuses.
TEST(StoreService, PutWritesAndSealsInOneCallAndRefusesBadInput) {
  Served served;
  auto producer = make_engine();
  std::vector<std::byte> kv = kv_blocks(3, 300);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  StoreClient& c = *served.client;
  const std::vector<std::uint64_t> hashes{0x9000, 0x9001, 0x9002};
  BlockLayout other = kLayout;
  other.slots = 4;
  const auto fresh = c.stats();
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(c.put(*producer, "llama", "p", {}, kLayout, mine->handle).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, BlockLayout{}, mine->handle).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.put(*producer, "nope", "p", hashes, kLayout, mine->handle).code(), StatusCode::kNotFound);
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle + 1000).code(), StatusCode::kNotFound);
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle, kLayout.block_bytes()).code(),
            StatusCode::kOutOfRange)
      << "three blocks from the second one run past the buffer";
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, other, mine->handle).code(), StatusCode::kInvalidArgument);
  // One offset per hash, or nothing is written.
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle, std::vector<std::uint64_t>{0, 0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle,
                  std::vector<std::uint64_t>{0, kLayout.block_bytes(), 3 * kLayout.block_bytes()})
                .code(),
            StatusCode::kOutOfRange)
      << "the third block's offset is past the buffer";
  EXPECT_EQ(c.query("llama", hashes, "d")->found, 0u) << "nothing refused was sealed";
  // Nor allocated: a put that fails on our side (a local range, a region we
  // do not have) had the store evict good blocks to make room for it.
  EXPECT_EQ(c.stats()->unsealed, fresh->unsealed);
  EXPECT_EQ(c.stats()->free_pages, fresh->free_pages);

  ASSERT_TRUE(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle).is_ok());
  // A block larger than the namespace's would spill into the next pages
  // (another producer's sealed blocks): refused before a page is taken.
  BlockLayout larger = kLayout;
  larger.segment_bytes *= 2;
  std::vector<std::byte> big(2 * larger.block_bytes(), std::byte{0x5a});
  auto big_region = producer->register_memory(big.data(), big.size());
  ASSERT_TRUE(big_region.has_value());
  const auto before = c.stats();
  ASSERT_TRUE(before.has_value());
  const Status spilled = c.put(*producer, "llama", "q", std::vector<std::uint64_t>{0x9100, 0x9101}, larger,
                               big_region->handle);
  EXPECT_EQ(spilled.code(), StatusCode::kInvalidArgument) << spilled.to_string();
  EXPECT_NE(spilled.message().find("nothing written"), std::string::npos) << spilled.message();
  EXPECT_EQ(c.stats()->unsealed, before->unsealed);
  EXPECT_EQ(c.stats()->free_pages, before->free_pages);
  auto requester = make_engine();
  auto fetched = c.fetch(*requester, "llama", hashes, "d");
  ASSERT_TRUE(fetched.has_value()) << fetched.error().to_string();
  ASSERT_EQ(fetched->found, 3u);
  expect_blocks(*fetched, 3, 300);
  fetched = std::unexpected(Status::cancelled("dropped"));
  served.client.reset();  // the engine must outlive the client's slabs
}

// Refused before the store allocates a page: a hash named twice (it failed
// at seal, after the store had evicted good blocks to make room for each),
// bytes a proto string cannot carry (they came back as an empty INTERNAL,
// "unavailable", as if the store were dead), and more blocks than one call's
// messages hold (the store allocated 300 000 pages whose answer the client
// could not read).
TEST(StoreService, CallsItsMessagesCannotCarryAreRefusedBeforeTheStoreAllocates) {
  Served served;
  auto producer = make_engine();
  std::vector<std::byte> kv = kv_blocks(3, 400);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  StoreClient& c = *served.client;
  const auto before = c.stats();
  ASSERT_TRUE(before.has_value());
  const std::vector<std::uint64_t> twice{0xa000, 0xa001, 0xa000};
  const Status dup = c.put(*producer, "llama", "p", twice, kLayout, mine->handle);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument) << dup.to_string();
  EXPECT_NE(dup.message().find("named twice"), std::string::npos) << dup.message();
  const std::vector<std::uint64_t> hashes{0xa000, 0xa001, 0xa002};
  const Status bad_producer = c.put(*producer, "llama", "\xc3\x28", hashes, kLayout, mine->handle);
  EXPECT_EQ(bad_producer.code(), StatusCode::kInvalidArgument) << bad_producer.to_string();
  EXPECT_NE(bad_producer.message().find("not UTF-8"), std::string::npos) << bad_producer.message();
  std::vector<std::uint64_t> many(70'000);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = 0xb0000 + i;
  const Status too_many = c.put(*producer, "llama", "p", many, kLayout, mine->handle);
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument) << too_many.to_string();
  EXPECT_EQ(c.allocate_blocks("llama", 70'000, "p").error().code(), StatusCode::kInvalidArgument);
  const auto after = c.stats();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->unsealed, before->unsealed);
  EXPECT_EQ(after->free_pages, before->free_pages);
  EXPECT_EQ(after->evictions, before->evictions);

  ASSERT_TRUE(c.put(*producer, "llama", "p", hashes, kLayout, mine->handle).is_ok());
  auto requester = make_engine();
  EXPECT_EQ(c.query("llama", hashes, "\xff\xfe").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.fetch(*requester, "llama", hashes, "\xff").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.fetch(*requester, "llama", many, "d").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.query("llama\x80", hashes, "d").error().code(), StatusCode::kInvalidArgument);
  auto fetched = c.fetch(*requester, "llama", hashes, "d\u00e9");  // UTF-8 is fine
  ASSERT_TRUE(fetched.has_value()) << fetched.error().to_string();
  EXPECT_EQ(fetched->found, 3u);
  fetched = std::unexpected(Status::cancelled("dropped"));
  served.client.reset();
}

// A store restarted on the same RPC address comes back with its engine on
// another port: the client asks it again, where every put and fetch failed
// for good against the engine address its first hello() gave.
TEST(StoreService, AClientFollowsAStoreRestartedOnItsAddressWithANewEngine) {
  auto producer = make_engine();
  std::vector<std::byte> kv = kv_blocks(2, 500);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  const std::vector<std::uint64_t> hashes{0xc000, 0xc001};
  std::string address;
  std::string first_engine;
  std::unique_ptr<StoreClient> client;
  {
    Served first;
    address = first.server->address();
    first_engine = first.engine->address();
    client = std::move(first.client);
    ASSERT_TRUE(client->put(*producer, "llama", "p", hashes, kLayout, mine->handle).is_ok());  // it said hello
  }
  // The same RPC address, a new engine (and so a new engine port).
  auto engine = make_engine();
  auto store = std::move(*BlockStore::create(*engine));
  ASSERT_TRUE(store->add_namespace({"llama", kLayout, 32, {0}}).is_ok());
  auto server = StoreServer::start(*store, *engine, ServerConfig{.listen = address});
  ASSERT_TRUE(server.has_value()) << server.error().to_string();
  ASSERT_NE(engine->address(), first_engine);
  const Status again = client->put(*producer, "llama", "p", hashes, kLayout, mine->handle);
  ASSERT_TRUE(again.is_ok()) << again.to_string();
  auto requester = make_engine();
  auto fetched = client->fetch(*requester, "llama", hashes, "d");
  ASSERT_TRUE(fetched.has_value()) << fetched.error().to_string();
  ASSERT_EQ(fetched->found, 2u);
  expect_blocks(*fetched, 2, 500);
  fetched = std::unexpected(Status::cancelled("dropped"));
  client.reset();
}

// Fetches cut short by their own timeout (over TCP, 20 us: most end while
// their reads are on the wire). The cancel was waited for with the same
// 20 us, so reads still cancelling could not be released: their batches
// stayed held for good (0.38 a cut fetch), and their slabs went back for
// the next fetch while late reads could still land in them.
TEST(StoreService, AFetchCutShortByItsTimeoutLeavesNoBatchHeldAndLaterFetchesAreExact) {
  Served served;
  auto producer = make_engine();
  constexpr std::uint32_t kBlocks = 32;
  std::vector<std::byte> kv = kv_blocks(kBlocks, 500);
  auto mine = producer->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(mine.has_value());
  std::vector<std::uint64_t> hashes;
  for (std::uint32_t b = 0; b < kBlocks; ++b) hashes.push_back(0xA000 + b);
  ASSERT_TRUE(served.client->put(*producer, "llama", "p", hashes, kLayout, mine->handle).is_ok());

  engine::EngineConfig tcp;
  tcp.ucx.same_host_copy = false;
  tcp.ucx.tls = "tcp";
  auto requester = engine::Engine::create(tcp);
  ASSERT_TRUE(requester.has_value()) << requester.error().to_string();
  FetchOptions cut;
  cut.timeout_ns = 20'000;
  int timed_out = 0;
  for (int i = 0; i < 150; ++i) {
    auto fetched = served.client->fetch(**requester, "llama", hashes, "d", cut);
    if (!fetched) {
      EXPECT_EQ(fetched.error().code(), StatusCode::kTimeout) << fetched.error().to_string();
      ++timed_out;
    }
    if (i % 25 == 24) {  // a whole fetch between the cut ones, byte-exact in the slabs they used
      auto whole = served.client->fetch(**requester, "llama", hashes, "d");
      ASSERT_TRUE(whole.has_value()) << whole.error().to_string();
      expect_blocks(*whole, kBlocks, 500);
    }
  }
  EXPECT_GT(timed_out, 0) << "no fetch was cut short: the case under test did not happen";
  EXPECT_EQ(testing::metric_value((*requester)->metrics_text(), "baton_engine_batches_held"), 0.0);
  EXPECT_EQ(served.store->stats().sessions, 0u) << "every lock went back";
  served.client.reset();  // the engine must outlive the client's slabs
}

TEST(StoreService, AStoreThatIsNotThereIsUnavailableAndOnlyLoopbackIsServed) {
  Served served;
  const std::string address = served.server->address();
  served.server.reset();
  auto gone = StoreClient::connect(address, kSecond);
  ASSERT_TRUE(gone.has_value());
  auto h = (*gone)->hello();
  ASSERT_FALSE(h.has_value());
  EXPECT_TRUE(h.error().code() == StatusCode::kUnavailable || h.error().code() == StatusCode::kTimeout)
      << h.error().to_string();
  EXPECT_EQ(StoreServer::start(*served.store, *served.engine, {.listen = "0.0.0.0:0"}).error().code(),
            StatusCode::kInvalidArgument);
  // gRPC would bind 99999 as 99999 - 65536, and log its own error for the rest.
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:abc", "127.0.0.1:", "127.0.0.1:80 "}) {
    auto refused = StoreServer::start(*served.store, *served.engine, {.listen = bad});
    ASSERT_FALSE(refused.has_value()) << bad;
    EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.error().message().find("is not a number"), std::string::npos) << refused.error().message();
  }
  auto unresolved = StoreServer::start(*served.store, *served.engine, {.listen = "no-such-host.invalid:0"});
  ASSERT_FALSE(unresolved.has_value());
  EXPECT_EQ(unresolved.error().code(), StatusCode::kInvalidArgument) << unresolved.error().to_string();
  // Any loopback address is this host's, not only 127.0.0.1.
  auto other_loopback = StoreServer::start(*served.store, *served.engine, {.listen = "127.0.0.2:0"});
  ASSERT_TRUE(other_loopback.has_value()) << other_loopback.error().to_string();
  EXPECT_TRUE((*other_loopback)->address().starts_with("127.0.0.2:")) << (*other_loopback)->address();
  EXPECT_EQ(StoreClient::connect("").error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::store
