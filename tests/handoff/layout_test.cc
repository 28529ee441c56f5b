// The reshape plan between parallel layouts: every consumer byte comes from
// exactly the producer byte holding the same logical KV, checked by moving
// pages in memory with the plan and verifying the KV pattern.
#include "baton/handoff/layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "baton/handoff/kv_pattern.h"

namespace baton::handoff {
namespace {

KvLayout layout(std::uint32_t tp, std::uint32_t sp = 1, KvOrder order = KvOrder::kHnd, std::uint32_t cfg = 1) {
  return KvLayout{.layers = 3, .kv_heads = 4, .head_bytes = 16, .page_tokens = 4, .order = order, .tp = tp, .sp = sp,
                  .cfg = cfg};
}

// Each rank's pages of every row, as separate buffers.
struct Stage {
  KvLayout layout;
  std::uint32_t tokens;
  std::vector<std::vector<std::vector<std::byte>>> pages;  // [row * ranks + rank][page]

  Stage(KvLayout l, std::uint32_t t) : layout(l), tokens(t) {
    for (std::uint32_t w = 0; w < l.cfg; ++w) {
      for (std::uint32_t r = 0; r < l.ranks(); ++r) {
        pages.emplace_back(l.rank_pages(r, l.pages_for(t)), std::vector<std::byte>(l.page_bytes()));
      }
    }
  }
  std::vector<std::span<std::byte>> spans(std::uint32_t row, std::uint32_t rank) {
    std::vector<std::span<std::byte>> out;
    for (auto& p : pages[row * layout.ranks() + rank]) out.emplace_back(p);
    return out;
  }
  Status fill_or_check(bool fill, std::uint64_t salt) {
    for (std::uint32_t w = 0; w < layout.cfg; ++w) {
      for (std::uint32_t r = 0; r < layout.ranks(); ++r) {
        auto s = spans(w, r);
        RankPages rp{layout, r, tokens, w, s};
        if (auto st = fill ? fill_kv(rp, salt) : check_kv(rp, salt); !st.is_ok()) return st;
      }
    }
    return Status::ok();
  }
};

// Moves every page from `from` to `to` with the plan, as ConsumerWorker does.
void reshape(const ReshapePlan& plan, Stage& from, Stage& to) {
  const KvLayout& pl = from.layout;
  const KvLayout& cl = to.layout;
  const std::uint32_t total = cl.pages_for(to.tokens);
  for (std::uint32_t w = 0; w < cl.cfg; ++w) {
    for (std::uint32_t rank = 0; rank < cl.ranks(); ++rank) {
      const std::uint32_t first = cl.first_page(rank / cl.tp, total);
      for (std::uint32_t i = 0; i < cl.rank_pages(rank, total); ++i) {
        const std::uint32_t page = first + i;
        std::uint32_t ps = 0;
        while (pl.first_page(ps + 1, total) <= page) ++ps;
        for (const PageRun& run : plan.runs(rank % cl.tp)) {
          auto& src = from.pages[w * pl.ranks() + ps * pl.tp + run.producer_tp][page - pl.first_page(ps, total)];
          auto& dst = to.pages[w * cl.ranks() + rank][i];
          std::memcpy(dst.data() + run.dst_offset, src.data() + run.src_offset, run.length);
        }
      }
    }
  }
}

struct Pair {
  KvLayout producer, consumer;
};

class ReshapeTest : public ::testing::TestWithParam<Pair> {};

TEST_P(ReshapeTest, EveryConsumerByteHoldsTheSameLogicalKv) {
  const auto [pl, cl] = GetParam();
  auto plan = ReshapePlan::compute(pl, cl);
  ASSERT_TRUE(plan.has_value()) << plan.error().to_string();
  for (std::uint32_t tokens : {1u, 7u, 8u, 13u}) {
    Stage from(pl, tokens), to(cl, tokens);
    ASSERT_TRUE(from.fill_or_check(true, 42).is_ok());
    reshape(*plan, from, to);
    EXPECT_TRUE(to.fill_or_check(false, 42).is_ok()) << tokens << " tokens: " << to.fill_or_check(false, 42).to_string();
  }
  // The runs of each consumer tp rank cover its page exactly once.
  for (std::uint32_t ct = 0; ct < cl.tp; ++ct) {
    std::uint64_t covered = 0, end = 0;
    for (const PageRun& r : plan->runs(ct)) {
      EXPECT_EQ(r.dst_offset, end) << "runs come in destination order, without gaps";
      end = r.dst_offset + r.length;
      covered += r.length;
    }
    EXPECT_EQ(covered, cl.page_bytes());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ReshapeTest,
    ::testing::Values(Pair{layout(2), layout(2)}, Pair{layout(2), layout(1)}, Pair{layout(1), layout(4)},
                      Pair{layout(4), layout(2)}, Pair{layout(1), layout(1, 2)}, Pair{layout(2), layout(1, 2)},
                      Pair{layout(2, 2), layout(1, 3)}, Pair{layout(2, 1, KvOrder::kNhd), layout(1)},
                      Pair{layout(1), layout(2, 1, KvOrder::kNhd)},
                      Pair{layout(2, 1, KvOrder::kHnd, 2), layout(1, 2, KvOrder::kHnd, 2)}));

TEST(ReshapePlan, SameLayoutIsOneRunPerPageAndHeadMergeOneRunPerLayerSide) {
  auto same = ReshapePlan::compute(layout(2), layout(2));
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->runs(0).size(), 1u);
  auto merge = ReshapePlan::compute(layout(2), layout(1));
  ASSERT_TRUE(merge.has_value());
  // HND: each producer rank's heads of one layer's K or V are contiguous on
  // both sides: 3 layers × K,V × 2 producer ranks.
  EXPECT_EQ(merge->runs(0).size(), 3u * 2 * 2);
}

TEST(ReshapePlan, MismatchedKvAndInvalidLayoutsAreRefused) {
  KvLayout other = layout(1);
  other.layers = 4;
  EXPECT_EQ(ReshapePlan::compute(layout(2), other).error().code(), StatusCode::kInvalidArgument);
  other = layout(1);
  other.page_tokens = 8;
  EXPECT_EQ(ReshapePlan::compute(layout(2), other).error().code(), StatusCode::kInvalidArgument);
  other = layout(1, 1, KvOrder::kHnd, 2);
  EXPECT_EQ(ReshapePlan::compute(layout(2), other).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReshapePlan::compute(layout(3), layout(1)).error().code(), StatusCode::kInvalidArgument)
      << "tp 3 does not divide 4 heads";
  EXPECT_EQ(ReshapePlan::compute(layout(0), layout(1)).error().code(), StatusCode::kInvalidArgument);
  KvLayout zero = layout(1);
  zero.head_bytes = 0;
  EXPECT_EQ(zero.validate().code(), StatusCode::kInvalidArgument);
  // Bounds: tp·sp must not wrap (sp 2^31 made ranks() 0), and a plan's
  // cells stay few (1024 layers x 1024 heads x 2048 tokens was a plan of GBs).
  KvLayout wide = layout(2);
  wide.sp = 1u << 31;
  EXPECT_NE(wide.validate().message().find("each at most 1024"), std::string::npos) << wide.validate().message();
  wide = layout(1);
  wide.cfg = KvLayout::kMaxParallel + 1;
  EXPECT_EQ(wide.validate().code(), StatusCode::kInvalidArgument);
  wide = layout(1);
  wide.layers = 1024;
  wide.kv_heads = 1024;
  wide.page_tokens = 2048;
  wide.head_bytes = 1;
  EXPECT_NE(wide.validate().message().find("cells a page"), std::string::npos) << wide.validate().message();
  EXPECT_EQ(layout(1).pages_for(0xffffffffu), 0xffffffffu / layout(1).page_tokens + 1) << "no 32-bit wrap";
  KvLayout unordered = layout(1);
  unordered.order = static_cast<KvOrder>(7);
  EXPECT_NE(unordered.validate().message().find("order 7"), std::string::npos) << unordered.validate().message();
  EXPECT_EQ(ReshapePlan::compute(unordered, layout(1)).error().code(), StatusCode::kInvalidArgument);
}

TEST(ReshapePlan, RunsOfARankTheConsumerDoesNotHaveAreEmpty) {
  const auto plan = ReshapePlan::compute(layout(2), layout(1)).value();
  EXPECT_FALSE(plan.runs(0).empty());
  EXPECT_TRUE(plan.runs(1).empty());
  EXPECT_TRUE(plan.runs(0xffffffffu).empty());
}

TEST(PlanCache, ComputesOncePerLayoutPair) {
  PlanCache cache;
  auto a = cache.get(layout(2), layout(1));
  auto b = cache.get(layout(2), layout(1));
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->get(), b->get());
  ASSERT_TRUE(cache.get(layout(2), layout(1, 2)).has_value());
  EXPECT_EQ(cache.size(), 2u);
  KvLayout other = layout(1);
  other.layers = 9;
  EXPECT_FALSE(cache.get(layout(2), other).has_value());
  EXPECT_EQ(cache.size(), 2u);
}

// A pair that cuts a page into more pieces than kMaxRuns is refused while
// the plan is made: 1-byte heads in HND against NHD made one piece per byte
// (a 4 MiB page was 4 M engine requests, 1.4 GB and 8 s to load).
TEST(ReshapePlan, APairThatCutsAPageTooFineIsRefused) {
  KvLayout hnd{.layers = 64, .kv_heads = 64, .head_bytes = 1, .page_tokens = 256, .order = KvOrder::kHnd};
  KvLayout nhd = hnd;
  nhd.order = KvOrder::kNhd;
  ASSERT_TRUE(hnd.validate().is_ok());  // 2 M cells: within a page's bound
  const auto refused = ReshapePlan::compute(hnd, nhd);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message().find("more than 1048576 pieces"), std::string::npos) << refused.error().message();
  // The same shape in one order is one piece a page.
  EXPECT_EQ(ReshapePlan::compute(hnd, hnd)->runs(0).size(), 1u);
  // A real pair of orders (8 heads of 256 bytes, 80 layers, 16 tokens) fits:
  // a piece a cell, but where one K|V block ends the next begins (159 merge).
  KvLayout real{.layers = 80, .kv_heads = 8, .head_bytes = 256, .page_tokens = 16, .order = KvOrder::kHnd};
  KvLayout real_nhd = real;
  real_nhd.order = KvOrder::kNhd;
  EXPECT_EQ(ReshapePlan::compute(real, real_nhd)->runs(0).size(), 80u * 2 * 8 * 16 - (80 * 2 - 1));
}

// Orders naming many layout pairs (a confused or hostile sender) do not
// grow the cache without bound.
TEST(PlanCache, HoldsAtMostKMaxPlans) {
  PlanCache cache;
  for (std::uint32_t layers = 1; layers <= 3 * PlanCache::kMaxPlans; ++layers) {
    KvLayout l = layout(1);
    l.layers = layers;
    ASSERT_TRUE(cache.get(l, l).has_value());
    EXPECT_LE(cache.size(), PlanCache::kMaxPlans);
  }
  EXPECT_GE(cache.size(), 1u);
}

TEST(KvPattern, CatchesAMisplacedByteAndWrongShapes) {
  Stage s(layout(2), 8);
  ASSERT_TRUE(s.fill_or_check(true, 7).is_ok());
  EXPECT_TRUE(s.fill_or_check(false, 7).is_ok());
  EXPECT_FALSE(s.fill_or_check(false, 8).is_ok()) << "another request's KV";
  s.pages[1][1][100] ^= std::byte{1};
  auto bad = s.fill_or_check(false, 7);
  EXPECT_EQ(bad.code(), StatusCode::kInternal);
  EXPECT_NE(bad.message().find("rank 1"), std::string::npos) << bad.message();
  auto spans = s.spans(0, 0);
  spans.pop_back();
  KvLayout l = layout(2);
  EXPECT_EQ(check_kv(RankPages{l, 0, 8, 0, spans}, 7).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_kv(RankPages{l, 5, 8, 0, spans}, 7).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::handoff
