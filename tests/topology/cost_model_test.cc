#include "baton/topology/cost_model.h"

#include <gtest/gtest.h>

#include <limits>

namespace baton::topology {
namespace {

double score(const CostModel& m, PathType p, Proximity x, int nvlinks = 0) {
  const auto c = m.cost(p, x, nvlinks);
  EXPECT_TRUE(c.has_value()) << to_string(p) << " " << to_string(x);
  return c ? c->score : 0;
}

TEST(CostModel, FabricBeatsPcieBeatsHostStaging) {
  const CostModel m;
  const double nvswitch = score(m, PathType::kNvswitch, Proximity::kLocal, 18);
  const double nvlink = score(m, PathType::kNvlink, Proximity::kLocal, 4);
  const double p2p = score(m, PathType::kPcieP2p, Proximity::kPix);
  const double staging = score(m, PathType::kHostStaging, Proximity::kPix);
  EXPECT_GT(nvswitch, nvlink);
  EXPECT_GT(nvlink, p2p);
  EXPECT_GT(p2p, staging);
  EXPECT_GT(score(m, PathType::kHostStaging, Proximity::kNode), score(m, PathType::kHostStaging, Proximity::kSys));
}

TEST(CostModel, NvlinkBandwidthScalesWithLinks) {
  const CostModel m;
  EXPECT_DOUBLE_EQ(m.cost(PathType::kNvswitch, Proximity::kLocal, 18)->bandwidth_gbps, 450.0);
  EXPECT_DOUBLE_EQ(m.cost(PathType::kNvlink, Proximity::kLocal, 12)->bandwidth_gbps, 300.0);
  EXPECT_FALSE(m.cost(PathType::kNvlink, Proximity::kLocal, 0).has_value());
}

// GDR as NCCL's default has it (NCCL_NET_GDR_LEVEL=PXB): under PCIe
// switches only; through the host bridge and beyond, off until priced.
TEST(CostModel, GdrStopsAtTheSharedSwitchesAsNcclDoes) {
  CostModel m;
  const double pix = score(m, PathType::kGdr, Proximity::kPix);
  const double pxb = score(m, PathType::kGdr, Proximity::kPxb);
  EXPECT_GT(pix, pxb);
  for (Proximity x : {Proximity::kPhb, Proximity::kNode, Proximity::kSys}) {
    EXPECT_FALSE(m.cost(PathType::kGdr, x).has_value()) << to_string(x);
    EXPECT_TRUE(CostModel::priced(PathType::kGdr, x)) << to_string(x);  // a policy may turn it on
  }
  ASSERT_TRUE(m.set(PathType::kGdr, Proximity::kNode, 9.0, 3.5).is_ok());
  EXPECT_GT(pxb, score(m, PathType::kGdr, Proximity::kNode));
  // PCIe P2P is not offered between host bridges either.
  EXPECT_FALSE(m.cost(PathType::kPcieP2p, Proximity::kNode).has_value());
  EXPECT_FALSE(m.cost(PathType::kPcieP2p, Proximity::kSys).has_value());
}

TEST(CostModel, ScoreIsEffectiveBandwidthOfTheReferenceSlice) {
  EXPECT_DOUBLE_EQ(CostModel::score(25.0, 0.0), 25.0);
  const double bytes = static_cast<double>(kScoreReferenceBytes);
  const double expected = bytes / (10e-6 + bytes / 10e9) / 1e9;
  EXPECT_DOUBLE_EQ(CostModel::score(10.0, 10.0), expected);
  EXPECT_LT(CostModel::score(10.0, 10.0), 10.0);
}

TEST(CostModel, OverridesAndDisables) {
  CostModel m;
  ASSERT_TRUE(m.set(PathType::kTcp, Proximity::kLocal, 100.0, 1.0).is_ok());
  EXPECT_DOUBLE_EQ(m.cost(PathType::kTcp, Proximity::kLocal)->bandwidth_gbps, 100.0);
  ASSERT_TRUE(m.set(PathType::kGdr, Proximity::kSys, 5.0, 4.0).is_ok());  // an operator may allow it
  EXPECT_TRUE(m.cost(PathType::kGdr, Proximity::kSys).has_value());
  m.disable(PathType::kGdr, Proximity::kSys);
  EXPECT_FALSE(m.cost(PathType::kGdr, Proximity::kSys).has_value());
}

TEST(CostModel, RefusesNonsense) {
  CostModel m;
  EXPECT_EQ(m.set(PathType::kTcp, Proximity::kLocal, 0.0, 1.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kTcp, Proximity::kLocal, -3.0, 1.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kTcp, Proximity::kLocal, 3.0, -1.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kTcp, Proximity::kLocal, std::numeric_limits<double>::infinity(), 1.0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kTcp, Proximity::kLocal, 3.0, std::numeric_limits<double>::infinity()).code(),
            StatusCode::kInvalidArgument);
  // Finite, and still no link's: 1e308 GB/s scored inf.
  EXPECT_EQ(m.set(PathType::kRdma, Proximity::kLocal, 1e308, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kRdma, Proximity::kLocal, CostModel::kMaxBandwidthGbps * 2, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kRdma, Proximity::kLocal, CostModel::kMinBandwidthGbps / 2, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.set(PathType::kRdma, Proximity::kLocal, 3.0, CostModel::kMaxLatencyUs * 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.set(PathType::kRdma, Proximity::kLocal, CostModel::kMaxBandwidthGbps, CostModel::kMaxLatencyUs).is_ok());
  EXPECT_DOUBLE_EQ(m.cost(PathType::kTcp, Proximity::kLocal)->bandwidth_gbps, 3.0);  // unchanged
}

// An enumerator cast from a caller's integer indexed past the table: an
// engine built with such a cost override freed an invalid pointer.
TEST(CostModel, RefusesPathsAndProximitiesOutsideTheirEnums) {
  CostModel m;
  for (const auto& [path, proximity] : {std::pair{kPathTypeCount, 0}, std::pair{0, kProximityCount},
                                        std::pair{200, 0}, std::pair{255, 255}}) {
    const auto p = static_cast<PathType>(path);
    const auto x = static_cast<Proximity>(proximity);
    const Status s = m.set(p, x, 10.0, 1.0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << path << " " << proximity;
    EXPECT_NE(s.message().find("expected path < 8, proximity < 7"), std::string::npos) << s.message();
    EXPECT_FALSE(m.cost(p, x).has_value());
    m.disable(p, x);  // nothing there: no write
  }
  EXPECT_EQ(to_string(static_cast<PathType>(kPathTypeCount)), "unknown");
  EXPECT_EQ(to_string(static_cast<Proximity>(kProximityCount)), "unknown");
  EXPECT_DOUBLE_EQ(m.cost(PathType::kTcp, Proximity::kLocal)->bandwidth_gbps, 3.0);  // the table untouched
}

TEST(PathType, NamesRoundTrip) {
  for (int i = 0; i < kPathTypeCount; ++i) {
    const auto p = static_cast<PathType>(i);
    EXPECT_EQ(parse_path_type(to_string(p)).value(), p);
  }
  const auto bad = parse_path_type("infiniband");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("\"infiniband\""), std::string::npos);
}

}  // namespace
}  // namespace baton::topology
