#include "baton/plan/slab_layout.h"

#include <gtest/gtest.h>

namespace baton::plan {
namespace {

Plan plan_with_chunks(std::vector<Chunk> chunks) {
  Plan p;
  p.chunks = std::move(chunks);
  return p;
}

TEST(SlabLayout, OneSlabPerNodeChunksAlignedInPlanOrder) {
  const Plan p = plan_with_chunks({{0x1000, 100, 1}, {0x9000, 64, 0}, {0x2000, 30, 1}, {0x5000, 8, 3}});
  auto layout = layout_slabs(p);
  ASSERT_TRUE(layout.has_value());
  ASSERT_EQ(layout->slabs.size(), 3u);
  EXPECT_EQ(layout->slabs[0], (SlabSpec{0, 64}));
  EXPECT_EQ(layout->slabs[1], (SlabSpec{1, 128 + 30}));
  EXPECT_EQ(layout->slabs[2], (SlabSpec{3, 8}));
  ASSERT_EQ(layout->chunks.size(), 4u);
  EXPECT_EQ(layout->chunks[0], (ChunkLocation{1, 0}));
  EXPECT_EQ(layout->chunks[1], (ChunkLocation{0, 0}));
  EXPECT_EQ(layout->chunks[2], (ChunkLocation{1, 128}));  // 100 rounded up to a cache line
  EXPECT_EQ(layout->chunks[3], (ChunkLocation{2, 0}));
}

TEST(SlabLayout, RefusesUnknownNuma) {
  const auto layout = layout_slabs(plan_with_chunks({{0x1000, 100, 0}, {0x2000, 64, kUnknownNuma}}));
  ASSERT_FALSE(layout.has_value());
  EXPECT_EQ(layout.error().message(),
            "layout_slabs: chunk 1 (64 bytes at 0x2000) is on an unknown NUMA node; refusing to guess one");
}

TEST(SlabLayout, RefusesASlabPast2To64) {
  const auto layout = layout_slabs(plan_with_chunks({{0, UINT64_MAX - 10, 0}, {0, 64, 0}}));
  ASSERT_FALSE(layout.has_value());
  EXPECT_EQ(layout.error().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace baton::plan
