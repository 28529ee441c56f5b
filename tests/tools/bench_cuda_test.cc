// `baton bench matrix` and `bench mixed --real` as a user runs them: usage
// errors exit 2, and where no GPU is (this build's CUDA runtime finds no
// device) they exit 1 with one line that says why. On a GPU machine
// cuda_gpu_test and the benches themselves cover the runs.
#include <string>

#include <gtest/gtest.h>

#include "baton/transport/cuda_runtime.h"
#include "tools/baton_cli.h"

namespace {

using baton::testing::CommandRun;

CommandRun baton(const std::string& args) { return baton::testing::run_baton(args); }

TEST(BenchCuda, UsageErrorsExit2) {
  for (const char* args : {"bench matrix", "bench matrix --gpus 0 --repeat 0", "bench matrix --gpus x",
                           "bench mixed --real", "bench mixed --real --gpus 0,1,2"}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
  const CommandRun r = baton("bench matrix --gpus 0 --block-size 12parsecs");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--block-size"), std::string::npos) << r.err;
}

TEST(BenchCuda, WithoutAGpuTheySayWhy) {
  auto rt = baton::transport::cuda_runtime();
  if (rt.has_value()) GTEST_SKIP() << "a GPU is present";
  for (const char* args : {"bench matrix --gpus 0", "bench mixed --real --gpus 0 --duration-ms 10"}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(rt.error().message()), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
