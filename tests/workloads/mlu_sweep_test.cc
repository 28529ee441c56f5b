#include "workloads/mlu_sweep.h"

#include <gtest/gtest.h>

namespace baton::workloads {
namespace {

TEST(MluSweep, MluRisesAsDeadlinesTightenAndDropPaysInTheBand) {
  MluSweepConfig c;
  c.duration_ns = 20'000'000;
  c.deadlines_ns = {60'000, 200'000, 500'000, 5'000'000'000};
  const auto result = run_mlu_sweep(c).value();
  const auto& rows = result.rows;
  EXPECT_GE(result.codec_ratio, 1.0);
  ASSERT_EQ(rows.size(), 4u);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GT(rows[i - 1].mean_mlu, rows[i].mean_mlu);  // tighter deadline, higher MLU
    EXPECT_LE(rows[i - 1].feasible_rate, rows[i].feasible_rate);
    EXPECT_EQ(rows[i].count, rows[0].count);
  }
  EXPECT_EQ(rows.back().feasible_rate, 1.0);
  EXPECT_EQ(rows.back().fifo.attainment, 1.0);
  EXPECT_EQ(rows.back().edf_drop.signalled, 0.0);
  // The transition band: feasible and infeasible transfers coexist, and EDF
  // with drop delivers well over twice FIFO's on-time requests.
  for (const MluSweepRow& r : {rows[1], rows[2]}) {
    EXPECT_GT(r.feasible_rate, 0.0);
    EXPECT_LT(r.feasible_rate, 1.0);
    EXPECT_GE(r.edf_drop.attainment, 2.4 * r.fifo.attainment) << r.deadline_ns;
    EXPECT_GT(r.fifo_drop.attainment, r.fifo.attainment) << r.deadline_ns;  // the drop alone already pays
    EXPECT_GT(r.edf_drop.signalled, 0.0);
    EXPECT_EQ(r.fifo.signalled, 0.0);  // no callback under FIFO: nothing signalled
  }
}

TEST(MluSweep, RefusesBadConfigs) {
  MluSweepConfig c;
  c.deadlines_ns = {};
  EXPECT_EQ(run_mlu_sweep(c).error().code(), StatusCode::kInvalidArgument);
  c = {};
  c.deadlines_ns = {0};
  EXPECT_EQ(run_mlu_sweep(c).error().code(), StatusCode::kInvalidArgument);
  c = {};
  c.batch = 0;
  EXPECT_EQ(run_mlu_sweep(c).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::workloads
