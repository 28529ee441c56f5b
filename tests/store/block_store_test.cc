// The block holder over a real engine's memory: put (allocate, write, seal),
// query → plan under a session lock, release, expiry, reclaim, LRU eviction
// that spares locked blocks, and bad input.
#include "baton/store/block_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "baton/plan/wire.h"

namespace baton::store {
namespace {

constexpr TimeNs kSecond = 1'000'000'000;
const BlockLayout kLayout{.slots = 4, .segments = 2, .segment_bytes = 256};

struct Rig {
  std::unique_ptr<engine::Engine> engine;
  engine::MetricsRegistry metrics;
  std::unique_ptr<BlockStore> store;

  explicit Rig(std::uint32_t blocks = 16, StoreConfig config = {}) {
    auto e = engine::Engine::create({});
    EXPECT_TRUE(e.has_value()) << e.error().to_string();
    engine = std::move(*e);
    config.metrics = &metrics;
    auto s = BlockStore::create(*engine, config);
    EXPECT_TRUE(s.has_value()) << s.error().to_string();
    store = std::move(*s);
    EXPECT_TRUE(store->add_namespace({"llama", kLayout, blocks, {-1}}).is_ok());
  }

  // Allocates, writes a byte pattern naming each hash, seals.
  std::vector<BlockPage> put(const std::vector<std::uint64_t>& hashes, const std::string& producer = "prefill-0") {
    auto pages = store->allocate_blocks("llama", static_cast<std::uint32_t>(hashes.size()), producer, 0);
    EXPECT_TRUE(pages.has_value()) << pages.error().to_string();
    if (!pages) return {};
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < pages->size(); ++i) {
      std::memset(reinterpret_cast<void*>((*pages)[i].address), static_cast<int>(hashes[i] & 0xff),
                  kLayout.block_bytes());
      ids.push_back((*pages)[i].page);
    }
    EXPECT_TRUE(store->seal("llama", producer, ids, hashes, kLayout).is_ok());
    return *pages;
  }
};

// Every (block, slot, segment) of the plan, where the plan says it lies.
std::vector<std::uint64_t> addresses(const plan::Plan& p) {
  std::vector<std::uint64_t> out(std::size_t{p.blocks} * p.slots * p.segments_per_slot);
  for (const plan::Placement& pl : p.placements) {
    const auto& schema = p.schema[pl.slot * p.segments_per_slot + pl.segment];
    for (std::uint32_t i = 0; i < pl.block_count; ++i) {
      const std::uint32_t block = pl.block_start + i * pl.block_step;
      out[(std::size_t{block} * p.slots + pl.slot) * p.segments_per_slot + pl.segment] =
          p.chunks[pl.chunk].base + pl.offset + i * schema.stride;
    }
  }
  return out;
}

TEST(BlockStore, AQueryAnswersTheFoundPrefixAsAPlanUnderALock) {
  Rig rig;
  const auto pages = rig.put({11, 12, 13, 14});
  auto answer = rig.store->query("llama", std::vector<std::uint64_t>{11, 12, 13, 99, 14}, "decode-0", 0);
  ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  EXPECT_EQ(answer->found, 3u) << "a prefix: 14 follows a miss";
  EXPECT_NE(answer->session, 0u);
  auto plan = plan::parse_plan(answer->plan);
  ASSERT_TRUE(plan.has_value()) << plan.error().to_string();
  EXPECT_EQ(plan->blocks, 3u);
  EXPECT_EQ(plan->block_hashes, (std::vector<std::uint64_t>{11, 12, 13}));
  const auto where = addresses(*plan);
  for (std::uint32_t b = 0; b < 3; ++b) {
    for (std::uint32_t s = 0; s < kLayout.slots; ++s) {
      for (std::uint32_t g = 0; g < kLayout.segments; ++g) {
        const std::uint64_t a = where[(std::size_t{b} * kLayout.slots + s) * kLayout.segments + g];
        EXPECT_EQ(a, pages[b].address + (s * kLayout.segments + g) * kLayout.segment_bytes);
        EXPECT_EQ(*reinterpret_cast<const std::uint8_t*>(a), 11 + b) << "the sealed bytes lie there";
      }
    }
  }
  // Neighbouring pages merge into one chunk.
  EXPECT_EQ(plan->chunks.size(), 1u);

  StoreStats s = rig.store->stats();
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.locked_blocks, 3u);
  EXPECT_EQ(s.hashes_asked, 5u);
  EXPECT_EQ(s.hashes_found, 3u);
  EXPECT_EQ(rig.metrics.counter("baton_store_locked_blocks"), 3u);
  EXPECT_TRUE(rig.store->release(answer->session).is_ok());
  EXPECT_EQ(rig.store->release(answer->session).code(), StatusCode::kNotFound);
  s = rig.store->stats();
  EXPECT_EQ(s.sessions, 0u);
  EXPECT_EQ(s.locked_blocks, 0u);

  auto miss = rig.store->query("llama", std::vector<std::uint64_t>{99, 11}, "decode-0", 0);
  ASSERT_TRUE(miss.has_value());
  EXPECT_EQ(miss->found, 0u);
  EXPECT_EQ(miss->session, 0u) << "nothing found, nothing locked";
  EXPECT_TRUE(miss->plan.empty());
}

// Every metric has a sample from the start: a counter still at 0 had its
// HELP and TYPE lines and no value, which a scrape reads as "absent".
TEST(BlockStore, EveryMetricHasASampleBeforeItFirstMoves) {
  Rig rig;
  const std::string text = rig.metrics.text();
  for (const char* name : {"baton_store_evictions_total", "baton_store_expired_locks_total",
                           "baton_store_reclaimed_pages_total", "baton_store_hashes_asked_total",
                           "baton_store_hashes_found_total", "baton_store_blocks", "baton_store_sessions",
                           "baton_store_locked_blocks", "baton_store_unsealed_pages"}) {
    EXPECT_NE(text.find(std::string("\n") + name + " 0\n"), std::string::npos) << name << "\n" << text;
  }
}

TEST(BlockStore, SealingAHashTwiceKeepsOneCopy) {
  Rig rig;
  rig.put({7});
  const auto second = rig.put({7});
  StoreStats s = rig.store->stats();
  EXPECT_EQ(s.blocks, 1u);
  EXPECT_EQ(s.free_pages, 15u) << "the second page went back";
  auto answer = rig.store->query("llama", std::vector<std::uint64_t>{7}, "d", 0);
  ASSERT_TRUE(answer.has_value());
  auto plan = plan::parse_plan(answer->plan);
  ASSERT_TRUE(plan.has_value());
  EXPECT_NE(plan->chunks[0].base, second[0].address) << "the first copy answers";
}

TEST(BlockStore, UnsealedPagesReturnWhenTheirProducerGoesOrTheirTimePasses) {
  Rig rig(16, StoreConfig{.unsealed_timeout_ns = 10 * kSecond});
  ASSERT_TRUE(rig.store->allocate_blocks("llama", 3, "p1", 0).has_value());
  ASSERT_TRUE(rig.store->allocate_blocks("llama", 2, "p2", 5 * kSecond).has_value());
  EXPECT_EQ(rig.store->stats().unsealed, 5u);
  rig.store->producer_gone("p1");
  EXPECT_EQ(rig.store->stats().unsealed, 2u);
  rig.store->tick(14 * kSecond);
  EXPECT_EQ(rig.store->stats().unsealed, 2u) << "p2's time is not up";
  rig.store->tick(15 * kSecond);
  const StoreStats s = rig.store->stats();
  EXPECT_EQ(s.unsealed, 0u);
  EXPECT_EQ(s.free_pages, 16u);
  EXPECT_EQ(s.reclaimed_pages, 5u);
  EXPECT_EQ(rig.metrics.counter("baton_store_reclaimed_pages_total"), 5u);
}

TEST(BlockStore, LocksExpireAndTheCollectorReclaimsThem) {
  Rig rig(16, StoreConfig{.lock_timeout_ns = 120 * kSecond});
  rig.put({1, 2});
  auto answer = rig.store->query("llama", std::vector<std::uint64_t>{1, 2}, "d", 10 * kSecond);
  ASSERT_TRUE(answer.has_value());
  rig.store->tick(129 * kSecond);
  EXPECT_EQ(rig.store->stats().sessions, 1u);
  rig.store->tick(130 * kSecond);
  const StoreStats s = rig.store->stats();
  EXPECT_EQ(s.sessions, 0u);
  EXPECT_EQ(s.locked_blocks, 0u);
  EXPECT_EQ(s.expired_locks, 1u);
  EXPECT_EQ(rig.store->release(answer->session).code(), StatusCode::kNotFound);
}

// INT64_MAX means never: it wrapped into the past and expired at once.
TEST(BlockStore, TimeoutsOfInt64MaxNeverExpire) {
  Rig rig(16, StoreConfig{.lock_timeout_ns = INT64_MAX, .unsealed_timeout_ns = INT64_MAX});
  rig.put({1, 2});
  auto answer = rig.store->query("llama", std::vector<std::uint64_t>{1, 2}, "d", 10 * kSecond);
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(rig.store->allocate_blocks("llama", 1, "p", 10 * kSecond).has_value());
  rig.store->tick(1000 * kSecond);
  const StoreStats s = rig.store->stats();
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.expired_locks, 0u);
  EXPECT_EQ(s.unsealed, 1u);
  EXPECT_TRUE(rig.store->release(answer->session).is_ok());
}

TEST(BlockStore, EvictionTakesTheLeastRecentlyUsedAndNeverALockedBlock) {
  Rig rig(4);
  rig.put({10, 11, 12, 13});
  auto locked = rig.store->query("llama", std::vector<std::uint64_t>{10}, "d", 0);
  ASSERT_TRUE(locked.has_value());
  auto used = rig.store->query("llama", std::vector<std::uint64_t>{11}, "d", 0);
  ASSERT_TRUE(used.has_value());
  ASSERT_TRUE(rig.store->release(used->session).is_ok());  // 11 is now the most recent
  // Room for 2: 12 and 13 (the least recent unlocked) go.
  ASSERT_TRUE(rig.store->allocate_blocks("llama", 2, "p", 0).has_value());
  auto after = rig.store->query("llama", std::vector<std::uint64_t>{10, 11}, "d", 0);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->found, 2u);
  ASSERT_TRUE(rig.store->release(after->session).is_ok());
  EXPECT_EQ(rig.store->query("llama", std::vector<std::uint64_t>{12}, "d", 0)->found, 0u);
  EXPECT_EQ(rig.store->stats().evictions, 2u);
  // 10 stays locked: asking for 3 more pages cannot be met (only 11 evictable).
  auto refused = rig.store->allocate_blocks("llama", 2, "p", 0);
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted) << "2 unsealed, 1 locked, 1 evictable";
  EXPECT_EQ(rig.store->stats().blocks, 2u) << "a refused allocation evicts nothing";
  ASSERT_TRUE(rig.store->release(locked->session).is_ok());
}

TEST(BlockStore, HundredsOfSessionsShareBlocksFromManyThreads) {
  Rig rig;
  rig.put({1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<std::uint64_t> all{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::vector<std::uint64_t>> sessions(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        auto a = rig.store->query("llama", all, "d" + std::to_string(t), 0);
        ASSERT_TRUE(a.has_value());
        ASSERT_EQ(a->found, 8u);
        sessions[t].push_back(a->session);
      }
    });
  }
  for (auto& t : threads) t.join();
  StoreStats s = rig.store->stats();
  EXPECT_EQ(s.sessions, 400u);
  EXPECT_EQ(s.locked_blocks, 8u);
  threads.clear();
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (auto id : sessions[t]) EXPECT_TRUE(rig.store->release(id).is_ok());
    });
  }
  for (auto& t : threads) t.join();
  s = rig.store->stats();
  EXPECT_EQ(s.sessions, 0u);
  EXPECT_EQ(s.locked_blocks, 0u);
}

TEST(BlockStore, SessionsAreBoundedAndARefusedQueryLocksNothing) {
  Rig rig(16, StoreConfig{.max_sessions = 3});
  rig.put({1, 2});
  const std::vector<std::uint64_t> both{1, 2};
  std::vector<std::uint64_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(rig.store->query("llama", both, "d", 0)->session);
  auto refused = rig.store->query("llama", both, "d", 0);
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(rig.store->stats().sessions, 3u);
  for (auto id : held) ASSERT_TRUE(rig.store->release(id).is_ok());
  EXPECT_EQ(rig.store->stats().locked_blocks, 0u) << "the refused query locked nothing";
  EXPECT_TRUE(rig.store->query("llama", both, "d", 0).has_value());
  EXPECT_EQ(BlockStore::create(*rig.engine, StoreConfig{.max_sessions = 0}).error().code(),
            StatusCode::kInvalidArgument);
}

TEST(BlockStore, BadInputGetsAClearStatusAndChangesNothing) {
  Rig rig;
  rig.put({1});
  BlockStore& st = *rig.store;
  const std::vector<std::uint64_t> one{1};
  EXPECT_EQ(st.query("nope", one, "d", 0).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(st.query("llama", {}, "d", 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.query("llama", std::vector<std::uint64_t>{1, 1}, "d", 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.query("llama", one, "", 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.release(12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(st.allocate_blocks("nope", 1, "p", 0).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(st.allocate_blocks("llama", 0, "p", 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.allocate_blocks("llama", 1, "", 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.allocate_blocks("llama", 17, "p", 0).error().code(), StatusCode::kResourceExhausted);

  auto pages = st.allocate_blocks("llama", 2, "p", 0);
  ASSERT_TRUE(pages.has_value());
  const std::vector<std::uint64_t> ids{(*pages)[0].page, (*pages)[1].page};
  BlockLayout other = kLayout;
  other.segment_bytes = 128;
  EXPECT_EQ(st.seal("llama", "p", ids, std::vector<std::uint64_t>{5, 6}, other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.seal("llama", "p", ids, std::vector<std::uint64_t>{5}, kLayout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.seal("llama", "p", ids, std::vector<std::uint64_t>{5, 5}, kLayout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.seal("llama", "q", ids, std::vector<std::uint64_t>{5, 6}, kLayout).code(),
            StatusCode::kFailedPrecondition) << "another producer's pages";
  EXPECT_EQ(st.seal("llama", "p", std::vector<std::uint64_t>{ids[0], 999}, std::vector<std::uint64_t>{5, 6}, kLayout)
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.seal("nope", "p", ids, std::vector<std::uint64_t>{5, 6}, kLayout).code(), StatusCode::kNotFound);
  EXPECT_EQ(st.stats().blocks, 1u) << "no refused seal sealed anything";
  EXPECT_TRUE(st.seal("llama", "p", ids, std::vector<std::uint64_t>{5, 6}, kLayout).is_ok());

  EXPECT_EQ(st.add_namespace({"", kLayout, 4, {-1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.add_namespace({"llama", kLayout, 4, {-1}}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.add_namespace({"x", {.slots = 4, .segments = 3, .segment_bytes = 8}, 4, {-1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.add_namespace({"x", kLayout, 0, {-1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.add_namespace({"x", kLayout, 4, {}}).code(), StatusCode::kInvalidArgument);
  // A pool whose size wraps 64 bits (a 10 KB region handed out as 32 812 blocks).
  const Status wrapped = st.add_namespace({"x", {.slots = 65498, .segments = 2, .segment_bytes = 4291696333u}, 32812, {-1}});
  EXPECT_EQ(wrapped.code(), StatusCode::kInvalidArgument) << wrapped.to_string();
  EXPECT_EQ(st.layout("x").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(*st.layout("llama"), kLayout);
}

}  // namespace
}  // namespace baton::store
