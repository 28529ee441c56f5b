#include "baton/plan/materialize.h"

#include <gtest/gtest.h>

#include <set>

#include "plan_test_util.h"

namespace baton::plan {
namespace {

using testing::nic_graph;

// A valid plan whose chunks have the given lengths and nodes: one slot, one
// segment, one block per chunk.
Plan plan_of(const std::vector<std::pair<std::uint64_t, int>>& chunks) {
  Plan p;
  p.blocks = static_cast<std::uint32_t>(chunks.size());
  p.slots = 1;
  p.segments_per_slot = 1;
  std::uint64_t smallest = UINT64_MAX;
  for (const auto& c : chunks) smallest = std::min(smallest, c.first);
  p.schema = {{smallest, smallest}};
  std::uint64_t base = 1ull << 40;
  for (std::uint32_t i = 0; i < chunks.size(); ++i) {
    p.chunks.push_back({base, chunks[i].first, chunks[i].second});
    p.placements.push_back({0, 0, i, 0, i, 1});
    base += chunks[i].first + (1ull << 30);
  }
  return p;
}

constexpr std::uint64_t kMiB = 1ull << 20;

TEST(Materialize, OneOpPerSmallChunk) {
  const auto g = nic_graph({1});
  auto m = materialize(plan_of({{4 * kMiB, 0}, {kMiB, 0}}), g);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  ASSERT_EQ(m->ops.size(), 2u);
  EXPECT_EQ(m->ops[0], (TransferOp{0, 1ull << 40, 4 * kMiB, 0, 0, 0}));
  EXPECT_EQ(m->ops[1].slab_offset, 4 * kMiB);
  EXPECT_EQ(m->nics, std::vector<std::string>{"nic0"});
}

TEST(Materialize, SplitsAtTheCapWithOneNic) {
  // 300 MiB on a one-NIC node: no striping, three ops under 128 MiB.
  const auto g = nic_graph({1});
  auto m = materialize(plan_of({{300 * kMiB, 0}}), g).value();
  ASSERT_EQ(m.ops.size(), 3u);
  EXPECT_EQ(m.ops[0].length, 128 * kMiB);
  EXPECT_EQ(m.ops[1].length, 128 * kMiB);
  EXPECT_EQ(m.ops[2].length, 44 * kMiB);
  EXPECT_EQ(m.ops[2].remote_address, (1ull << 40) + 256 * kMiB);
  EXPECT_EQ(m.ops[2].slab_offset, 256 * kMiB);
  for (const auto& op : m.ops) EXPECT_EQ(op.nic, 0);
}

TEST(Materialize, CapAndStripeAreConfigurable) {
  const auto g = nic_graph({1});
  auto m = materialize(plan_of({{10 * kMiB, 0}}), g, {.max_op_bytes = 3 * kMiB, .stripe_bytes = kMiB}).value();
  EXPECT_EQ(m.ops.size(), 4u);  // 3 + 3 + 3 + 1
  for (const auto& op : m.ops) EXPECT_LE(op.length, 3 * kMiB);
}

TEST(Materialize, StripesLargeChunksOverEveryNicOfTheNode) {
  // Node 0 has three NICs, node 1 one: a 40 MiB chunk on node 0 becomes five
  // 8 MiB pieces round-robin over nic0..nic2; the node-1 chunk stays whole.
  const auto g = nic_graph({3, 1});
  auto m = materialize(plan_of({{40 * kMiB, 0}, {40 * kMiB, 1}}), g).value();
  ASSERT_EQ(m.ops.size(), 6u);
  std::vector<std::string> used;
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(m.ops[i].length, 8 * kMiB);
    EXPECT_EQ(m.ops[i].slab_offset, i * 8 * kMiB);
    used.push_back(m.nics[m.ops[i].nic]);
  }
  EXPECT_EQ(used, (std::vector<std::string>{"nic0", "nic1", "nic2", "nic0", "nic1"}));
  EXPECT_EQ(m.nics[m.ops[5].nic], "nic3");
  EXPECT_EQ(m.ops[5].length, 40 * kMiB);
  EXPECT_EQ(m.ops[5].slab, 1u);
}

TEST(Materialize, SmallChunksAlsoRotateOverTheNodesNics) {
  const auto g = nic_graph({2});
  auto m = materialize(plan_of({{kMiB, 0}, {kMiB, 0}, {kMiB, 0}}), g).value();
  ASSERT_EQ(m.ops.size(), 3u);
  EXPECT_EQ(std::set<std::int32_t>({m.ops[0].nic, m.ops[1].nic}).size(), 2u);
  EXPECT_EQ(m.ops[2].nic, m.ops[0].nic);
}

TEST(Materialize, NodeWithoutNicsUsesEveryNicAndNoNicMeansMinusOne) {
  auto m = materialize(plan_of({{20 * kMiB, 1}}), nic_graph({2, 0})).value();
  EXPECT_EQ(m.ops.size(), 3u);  // striped over node 0's two NICs
  EXPECT_EQ(m.nics.size(), 2u);
  auto none = materialize(plan_of({{20 * kMiB, 0}}), nic_graph({0})).value();
  ASSERT_EQ(none.ops.size(), 1u);
  EXPECT_EQ(none.ops[0].nic, -1);
  EXPECT_TRUE(none.nics.empty());
}

TEST(Materialize, RefusesBadOptionsAndPlans) {
  const auto g = nic_graph({1});
  const Plan p = plan_of({{kMiB, 0}});
  EXPECT_EQ(materialize(p, g, {.max_op_bytes = 0}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(materialize(p, g, {.stripe_bytes = 0}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(materialize(p, g, {.max_op_bytes = kMiB, .stripe_bytes = 2 * kMiB}).error().message(),
            "materialize: stripe_bytes 2097152 > max_op_bytes 1048576");
  Plan bad = p;
  bad.placements.clear();
  EXPECT_EQ(materialize(bad, g).error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(materialize(plan_of({{kMiB, kUnknownNuma}}), g).error().message().find("unknown NUMA"),
            std::string::npos);
}

// Sizes that would cut a plan into more ops than memory holds are refused
// before any op is made (a 1-byte stripe of 100 blocks ended in bad_alloc).
TEST(Materialize, RefusesMoreOpsThanItMayMake) {
  const Plan p = plan_of({{64 * kMiB, 0}, {64 * kMiB, 0}});
  for (const auto& [graph, options] :
       {std::pair{nic_graph({2}), MaterializeOptions{.stripe_bytes = 1}},
        std::pair{nic_graph({1}), MaterializeOptions{.max_op_bytes = 1, .stripe_bytes = 1}}}) {
    const auto m = materialize(p, graph, options);
    ASSERT_FALSE(m.has_value());
    EXPECT_EQ(m.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.error().message().find("more than 16777216 ops"), std::string::npos) << m.error().message();
  }
  // The same 1-byte stripe with one NIC cuts nothing: the cap applies there.
  const auto whole = materialize(p, nic_graph({1}), {.stripe_bytes = 1});
  ASSERT_TRUE(whole.has_value()) << whole.error().to_string();
  EXPECT_EQ(whole->ops.size(), 2u);
}

}  // namespace
}  // namespace baton::plan
