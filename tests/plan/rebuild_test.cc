#include "baton/plan/rebuild.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>

#include "baton/plan/encode.h"
#include "baton/plan/fixtures.h"
#include "baton/plan/materialize.h"
#include "baton/plan/wire.h"
#include "plan_test_util.h"

namespace baton::plan {
namespace {

// The holder's memory for a fixture: one real buffer per region, every byte
// a function of its position so that a misplaced copy shows.
struct Holder {
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  std::vector<std::uint64_t> bases;
  PlacementTable table;
};

Holder make_holder(const FixtureSpec& spec) {
  Holder h;
  const auto regions = fixture_regions(spec).value();
  std::uint32_t seed = 1;
  for (const FixtureRegion& r : regions) {
    auto buffer = std::make_unique<std::byte[]>(r.bytes);
    for (std::uint64_t i = 0; i < r.bytes; ++i) {
      seed = seed * 1664525u + 1013904223u;
      buffer[i] = static_cast<std::byte>(seed >> 24);
    }
    h.bases.push_back(reinterpret_cast<std::uintptr_t>(buffer.get()));
    h.buffers.push_back(std::move(buffer));
  }
  EXPECT_TRUE(fill_fixture(spec, h.table, h.bases).is_ok());
  return h;
}

// encode → wire → decode → materialize → rebuild → memcpy every op, then
// compare every (block, slot, segment) byte for byte and its NUMA node.
void round_trip(const FixtureSpec& spec, std::size_t expected_slabs) {
  const Holder h = make_holder(spec);
  const std::string wire = serialize_plan(encode_plan(h.table).value());
  const Plan plan = parse_plan(wire).value();
  // Tiny cap and stripe so that ops split and stripe even on small fixtures.
  const auto graph = testing::nic_graph({2, 2});
  const MaterializedPlan m = materialize(plan, graph, {.max_op_bytes = 1024, .stripe_bytes = 256}).value();
  Rebuilder rebuilder;
  auto rebuilt = rebuilder.rebuild(plan);
  ASSERT_TRUE(rebuilt.has_value()) << rebuilt.error().to_string();
  ASSERT_EQ(rebuilt->slabs().size(), expected_slabs);
  EXPECT_EQ(rebuilt->layout().slabs, m.layout.slabs);
  for (const TransferOp& op : m.ops) {
    std::memcpy(rebuilt->slabs()[op.slab].data() + op.slab_offset, reinterpret_cast<const void*>(op.remote_address),
                op.length);
  }
  std::size_t mismatches = 0;
  for (std::uint32_t s = 0; s < h.table.slots(); ++s) {
    for (std::uint32_t b = 0; b < h.table.blocks(); ++b) {
      EXPECT_EQ(rebuilt->numa(b, s), h.table.numa(b, s)) << "block " << b << " slot " << s;
      for (std::uint32_t g = 0; g < h.table.segments_per_slot(); ++g) {
        ASSERT_EQ(rebuilt->segment_bytes(s, g), h.table.length(b, s, g));
        const void* want = reinterpret_cast<const void*>(h.table.address(b, s, g));
        if (std::memcmp(rebuilt->view(b, s, g), want, h.table.length(b, s, g)) != 0) ++mismatches;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(rebuilder.metrics().plans_rebuilt, 1u);
}

constexpr FixtureSpec kSmall{.blocks = 37, .layers = 3, .tp = 4, .block_tokens = 2, .kv_heads = 4, .head_dim = 8};

TEST(Rebuild, RoundTripIsByteExactKvSplitAcrossSockets) {
  FixtureSpec spec = kSmall;
  spec.numa = NumaLayout::kSlotsAcrossSockets;
  spec.run_blocks = 5;
  round_trip(spec, 2);
}

TEST(Rebuild, RoundTripIsByteExactSingleNode) { round_trip(kSmall, 1); }

TEST(Rebuild, RoundTripIsByteExactMlaReplicaWithAlternatingBlocks) {
  FixtureSpec spec = kSmall;
  spec.mla = true;
  spec.head_dim = 24;
  spec.numa = NumaLayout::kBlocksAlternate;
  round_trip(spec, 2);
}

TEST(Rebuild, RoundTripIsByteExactKvSplitWithAlternatingBlocks) {
  FixtureSpec spec = kSmall;
  spec.numa = NumaLayout::kBlocksAlternate;
  round_trip(spec, 2);
  spec.run_blocks = 4;  // holes in the block table too: groups and runs mixed
  round_trip(spec, 2);
}

TEST(Rebuild, KeepsOneDescriptorPerRunNotPerView) {
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 4500, .numa = NumaLayout::kSlotsAcrossSockets}, t).is_ok());
  const Plan plan = encode_plan(t).value();
  Rebuilder r;
  const RebuiltPlan rebuilt = r.rebuild(plan).value();
  EXPECT_EQ(rebuilt.runs(), plan.placements.size());
  EXPECT_EQ(rebuilt.runs(), 288u * 2);  // 2.6 M views from 576 runs
}

// views() gives what view() gives, from any first block, for plain runs,
// runs broken by holes and groups of lanes.
TEST(Rebuild, BulkViewsMatchSingleViews) {
  for (const FixtureSpec& spec :
       {FixtureSpec{.blocks = 70, .layers = 2, .tp = 2, .numa = NumaLayout::kSlotsAcrossSockets},
        FixtureSpec{.blocks = 70, .layers = 2, .tp = 2, .numa = NumaLayout::kSlotsAcrossSockets, .run_blocks = 6},
        FixtureSpec{.blocks = 71, .layers = 2, .tp = 2, .numa = NumaLayout::kBlocksAlternate, .run_blocks = 9},
        FixtureSpec{.blocks = 71, .layers = 2, .tp = 1, .mla = true, .numa = NumaLayout::kBlocksAlternate}}) {
    PlacementTable t;
    ASSERT_TRUE(fill_fixture(spec, t).is_ok());
    Rebuilder r;
    const RebuiltPlan rebuilt = r.rebuild(encode_plan(t).value()).value();
    for (std::uint32_t s = 0; s < rebuilt.slots(); ++s) {
      for (std::uint32_t g = 0; g < rebuilt.segments_per_slot(); ++g) {
        for (std::uint32_t first : {0u, 1u, 5u, 33u, spec.blocks - 1}) {
          std::vector<std::byte*> out(spec.blocks - first);
          rebuilt.views(s, g, first, out);
          for (std::uint32_t i = 0; i < out.size(); ++i) {
            ASSERT_EQ(out[i], rebuilt.view(first + i, s, g)) << "slot " << s << " segment " << g << " block " << first + i;
          }
        }
        rebuilt.views(s, g, 3, {});  // nothing asked, nothing written
      }
    }
  }
}

TEST(Rebuild, RefusesASlotSplitInsideAGroup) {
  // K and V of blocks alternating two tensors: a group per segment. V's
  // lane 0 moved to node 1: block 0 has K on node 0, V on node 1.
  PlacementTable t;
  ASSERT_TRUE(fill_fixture({.blocks = 8, .layers = 1, .tp = 1, .numa = NumaLayout::kBlocksAlternate}, t).is_ok());
  Plan p = encode_plan(t).value();
  ASSERT_EQ(p.placements.size(), 4u);
  ASSERT_EQ(p.placements[2].block_step, 2u);
  ASSERT_TRUE(Rebuilder().rebuild(p).has_value());
  p.chunks[p.placements[2].chunk].numa = 1;
  Rebuilder r;
  EXPECT_EQ(r.rebuild(p).error().message(), "rebuild: block 0 slot 0 has K on NUMA node 0 and V on node 1");
  EXPECT_EQ(r.metrics().rejected_split_slot, 1u);
}

TEST(Rebuild, RefusesASplitBetweenARunAndAGroup) {
  // K one run on node 0; V alternating two tensors (a group), its lane 1
  // then moved to node 1: block 1 is split.
  auto t = PlacementTable::create(6, 1, 2).value();
  for (std::uint32_t b = 0; b < 6; ++b) {
    t.set(b, 0, 0, 0x10000 + b * 64, 64);
    t.set(b, 0, 1, (b % 2 == 0 ? 0x50000 : 0x90000) + b / 2 * 64, 64);
    t.set_numa(b, 0, 0);
  }
  Plan p = encode_plan(t).value();
  ASSERT_EQ(p.placements.size(), 3u);
  ASSERT_EQ(p.placements[2].block_step, 2u);
  Rebuilder r;
  const RebuiltPlan ok = r.rebuild(p).value();
  EXPECT_EQ(ok.view(3, 0, 1), ok.view(1, 0, 1) + 64);
  EXPECT_EQ(ok.numa(5, 0), 0);
  p.chunks[p.placements[2].chunk].numa = 1;
  EXPECT_EQ(r.rebuild(p).error().message(), "rebuild: block 1 slot 0 has K on NUMA node 0 and V on node 1");
}

TEST(Rebuild, OneSlabPerSourceNode) {
  Plan p = encode_plan(testing::contiguous_table(4, 3, 1, 64)).value();
  p.chunks[0].numa = 3;
  p.chunks[2].numa = 3;
  Rebuilder r;
  auto rebuilt = r.rebuild(p).value();
  ASSERT_EQ(rebuilt.slabs().size(), 2u);
  EXPECT_EQ(rebuilt.slabs()[0].numa(), 0);
  EXPECT_EQ(rebuilt.slabs()[1].numa(), 3);
  EXPECT_EQ(rebuilt.slabs()[1].bytes(), 256u + 256u);
  EXPECT_EQ(rebuilt.numa(2, 0), 3);
  EXPECT_EQ(rebuilt.numa(2, 1), 0);
  EXPECT_EQ(rebuilt.view(1, 2, 0) - rebuilt.view(0, 2, 0), 64);
}

TEST(Rebuild, RefusesUnknownNumaAndCountsIt) {
  Rebuilder r;
  const Plan p = encode_plan(testing::contiguous_table(4, 2, 2, 64, kUnknownNuma)).value();
  auto rebuilt = r.rebuild(p);
  ASSERT_FALSE(rebuilt.has_value());
  EXPECT_NE(rebuilt.error().message().find("unknown NUMA node"), std::string::npos);
  EXPECT_EQ(r.metrics().rejected_unknown_numa, 1u);
  EXPECT_EQ(r.metrics().plans_rebuilt, 0u);
}

TEST(Rebuild, RefusesASlotSplitAcrossNodesAndCountsIt) {
  // K of slot 1 on node 0, its V on node 1.
  Plan p = encode_plan(testing::contiguous_table(4, 2, 2, 64)).value();
  p.chunks[3].numa = 1;
  Rebuilder r;
  auto rebuilt = r.rebuild(p);
  ASSERT_FALSE(rebuilt.has_value());
  EXPECT_EQ(rebuilt.error().message(), "rebuild: block 0 slot 1 has K on NUMA node 0 and V on node 1");
  EXPECT_EQ(r.metrics().rejected_split_slot, 1u);
}

TEST(Rebuild, FindsASplitInsideRunsThatDoNotLineUp) {
  // K: blocks 0-5 in one run on node 0. V: blocks 0-2 on node 0, 3-5 on node 1.
  auto t = testing::contiguous_table(6, 1, 2, 64);
  for (std::uint32_t b = 3; b < 6; ++b) t.set(b, 0, 1, 0x800000 + b * 64, 64);
  Plan p = encode_plan(t).value();
  ASSERT_EQ(p.placements.size(), 3u);
  p.chunks[p.placements[2].chunk].numa = 1;
  Rebuilder r;
  EXPECT_EQ(r.rebuild(p).error().message(), "rebuild: block 3 slot 0 has K on NUMA node 0 and V on node 1");
}

TEST(Rebuild, RefusesAnInvalidPlanAndAllocatorFailures) {
  Rebuilder r;
  EXPECT_EQ(r.rebuild(Plan{}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.metrics().rejected_invalid, 1u);
  Rebuilder failing([](int, std::uint64_t) -> Result<SlabMemory> {
    return std::unexpected(Status::resource_exhausted("no memory"));
  });
  EXPECT_EQ(failing.rebuild(encode_plan(testing::contiguous_table(2, 1, 1, 8)).value()).error().message(), "no memory");
  EXPECT_EQ(failing.metrics().rejected_invalid, 1u);
}

TEST(Rebuild, UsesTheGivenAllocator) {
  std::vector<std::pair<int, std::uint64_t>> calls;
  Rebuilder r([&](int numa, std::uint64_t bytes) -> Result<SlabMemory> {
    calls.emplace_back(numa, bytes);
    return allocate_slab(numa, bytes);
  });
  ASSERT_TRUE(r.rebuild(encode_plan(testing::contiguous_table(2, 1, 1, 8, 0)).value()).has_value());
  EXPECT_EQ(calls, (std::vector<std::pair<int, std::uint64_t>>{{0, 16}}));
}

TEST(AllocateSlab, MapsLazilyAndRecordsTheNode) {
  auto slab = allocate_slab(0, 1ull << 30);  // 1 GiB of address space, no pages yet
  ASSERT_TRUE(slab.has_value());
  EXPECT_EQ(slab->numa(), 0);
  EXPECT_EQ(slab->bytes(), 1ull << 30);
  slab->data()[123] = std::byte{7};
  EXPECT_EQ(slab->data()[123], std::byte{7});
  // A node this machine lacks: still a slab, not bound.
  auto far = allocate_slab(kMaxNuma, 4096);
  ASSERT_TRUE(far.has_value());
  EXPECT_FALSE(far->bound());
  SlabMemory moved = std::move(*far);
  EXPECT_EQ(moved.bytes(), 4096u);
}

TEST(AllocateSlab, RefusesBadArguments) {
  EXPECT_EQ(allocate_slab(0, 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(allocate_slab(kUnknownNuma, 64).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(allocate_slab(kMaxNuma + 1, 64).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(allocate_slab(0, UINT64_MAX).error().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace baton::plan
