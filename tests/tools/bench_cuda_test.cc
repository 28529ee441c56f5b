// `baton bench matrix` and `bench mixed --real` as a user runs them: usage
// errors exit 2, and where no GPU is (this build's CUDA runtime finds no
// device) they exit 1 with one line that says why. On a GPU machine
// cuda_gpu_test and the benches themselves cover the runs.
#include <algorithm>
#include <string>
#include <utility>

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

// A mistake in the flags is said as such before the runtime is asked for a
// device, so it reads the same on a machine without a GPU as with one.
TEST(BenchCuda, BadFlagsAreNamedBeforeAnyDeviceIsLookedFor) {
  for (const auto& [args, needle] :
       {std::pair<std::string, std::string>{"bench matrix --gpus 0,0", "GPU 0 is listed twice"},
        {"bench matrix --gpus 1,-1", "GPU -1 is below 0"},
        {"bench matrix --gpus 0 --block-size 0", "block size 0"},
        {"bench matrix --gpus 0 --update-model /nonexistent/model.yaml", "\"/nonexistent\" is not a writable directory"},
        {"bench matrix --gpus 0 --update-model /tmp", "a directory, not a file"},
        {"bench mixed --real --gpus 1,1", "the same GPU twice"},
        {"bench mixed --real --gpus -2", "GPU -2 is below 0"},
        {"bench mixed --gpus 0", "--gpus needs --real"}}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find(args.substr(0, args.find(" --"))), std::string::npos) << "names its command: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
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
