// bench matrix's measurement over a scripted runtime: one cell per path
// between the listed GPUs and host memory, plus each GPU's own copy, each
// with the cost model's figure where it has one; nothing left allocated.
#include "workloads/cuda_matrix.h"

#include <gtest/gtest.h>

#include <map>

#include "transport/fake_cuda_runtime.h"

namespace baton::workloads {
namespace {

using transport::testing::FakeCudaRuntime;

std::shared_ptr<FakeCudaRuntime> pairs_runtime() {
  std::vector<std::vector<bool>> peer(4, std::vector<bool>(4, false));
  peer[0][1] = peer[1][0] = true;
  auto rt = std::make_shared<FakeCudaRuntime>(4, peer);
  rt->steps_per_query = 1000;
  return rt;
}

TEST(CudaMatrix, MeasuresEveryPathBetweenTheListedGpusAndHostMemory) {
  auto rt = pairs_runtime();
  MatrixOptions o;
  o.gpus = {0, 1};
  o.block_bytes = 1 << 20;
  o.repeat = 3;
  o.topology_model = "nvlink-pairs";  // two NUMA nodes
  auto cells = measure_matrix(rt, o);
  ASSERT_TRUE(cells.has_value()) << cells.error().message();
  std::map<std::string, int> kinds;
  for (const MatrixCell& c : *cells) {
    ++kinds[c.kind];
    EXPECT_GT(c.measured_gbps, 0) << c.from << "->" << c.to;
    EXPECT_EQ(c.model_gbps.has_value(), c.kind != "d2d");
    EXPECT_NE(c.from, "gpu2");
    EXPECT_NE(c.to, "gpu3");
  }
  // gpu0 <-> gpu1: NVLink both ways and staging both ways; 2 NUMA nodes x 2 GPUs each way.
  EXPECT_EQ(kinds["peer"], 2);
  EXPECT_EQ(kinds["staging"], 2);
  EXPECT_EQ(kinds["h2d"], 4);
  EXPECT_EQ(kinds["d2h"], 4);
  EXPECT_EQ(kinds["d2d"], 2);
  for (const MatrixCell& c : *cells) {
    if (c.kind == "peer") {
      EXPECT_EQ(c.nvlinks, 4);
    }
  }
  for (int d = 0; d < 4; ++d) EXPECT_EQ(*rt->device_memory_used(d), 0u) << "device " << d;
  EXPECT_EQ(rt->live_streams(), 0u);
}

TEST(CudaMatrix, RefusesBadOptions) {
  MatrixOptions o;
  o.topology_model = "nvlink-pairs";
  EXPECT_EQ(measure_matrix(pairs_runtime(), o).error().code(), StatusCode::kInvalidArgument);  // no GPUs
  o.gpus = {9};
  auto r = measure_matrix(pairs_runtime(), o);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("GPU 9"), std::string::npos) << r.error().message();
  o.gpus = {0};
  o.repeat = 0;
  EXPECT_EQ(measure_matrix(pairs_runtime(), o).error().code(), StatusCode::kInvalidArgument);
  o.repeat = 1;
  o.block_bytes = 0;
  EXPECT_EQ(measure_matrix(pairs_runtime(), o).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(measure_matrix(nullptr, o).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::workloads
