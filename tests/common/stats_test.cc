#include "baton/common/stats.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(Percentile, InterpolatesBetweenRanks) {
  const std::vector<double> v{4, 1, 3, 2, 5};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 0).value(), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50).value(), 3);
  EXPECT_DOUBLE_EQ(percentile(v, 100).value(), 5);
  EXPECT_DOUBLE_EQ(percentile(v, 25).value(), 2);
  EXPECT_DOUBLE_EQ(percentile(v, 90).value(), 4.6);  // numpy.percentile([1..5], 90)
  const std::vector<double> one{7};
  EXPECT_DOUBLE_EQ(percentile(one, 99).value(), 7);
}

TEST(Percentile, RejectsBadInput) {
  const std::vector<double> empty;
  EXPECT_EQ(percentile(empty, 50).error().code(), StatusCode::kInvalidArgument);
  const std::vector<double> v{1, 2};
  EXPECT_EQ(percentile(v, -1).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(percentile(v, 100.5).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(percentile(v, std::nan("")).error().code(), StatusCode::kInvalidArgument);
  const std::vector<double> with_nan{1, std::nan("")};
  EXPECT_EQ(percentile(with_nan, 50).error().code(), StatusCode::kInvalidArgument);
}

TEST(Summarize, MatchesPercentile) {
  std::vector<double> v;
  for (int i = 1; i <= 1000; ++i) v.push_back(i);
  const Summary s = summarize(v).value();
  EXPECT_EQ(s.count, 1000u);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 1000);
  EXPECT_DOUBLE_EQ(s.mean, 500.5);
  EXPECT_DOUBLE_EQ(s.p50, percentile(v, 50).value());
  EXPECT_DOUBLE_EQ(s.p95, percentile(v, 95).value());
  EXPECT_DOUBLE_EQ(s.p99, percentile(v, 99).value());
  EXPECT_LT(s.p50, s.p95);
  EXPECT_LT(s.p95, s.p99);
  EXPECT_FALSE(summarize(std::vector<double>{}).has_value());
}

TEST(Ewma, FirstSampleThenWeightedAverage) {
  auto e = Ewma::create(0.25).value();
  EXPECT_FALSE(e.value().has_value());
  e.add(100);
  EXPECT_DOUBLE_EQ(*e.value(), 100);
  e.add(200);
  EXPECT_DOUBLE_EQ(*e.value(), 125);  // 0.25·200 + 0.75·100
  e.add(std::nan(""));                 // ignored
  EXPECT_DOUBLE_EQ(*e.value(), 125);
}

TEST(Ewma, SeedAndConvergence) {
  auto e = Ewma::create(0.5, 10.0).value();
  EXPECT_DOUBLE_EQ(*e.value(), 10);
  for (int i = 0; i < 60; ++i) e.add(50);
  EXPECT_NEAR(*e.value(), 50, 1e-9);
}

TEST(Ewma, RejectsBadAlphaAndSeed) {
  for (double alpha : {0.0, -0.1, 1.5, std::nan("")}) {
    EXPECT_EQ(Ewma::create(alpha).error().code(), StatusCode::kInvalidArgument) << alpha;
  }
  EXPECT_TRUE(Ewma::create(1.0).has_value());
  EXPECT_EQ(Ewma::create(0.5, INFINITY).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
